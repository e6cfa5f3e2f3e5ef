"""Strategy-safe gradient accumulation (course_utils.accumulation): equal weights to the big batch.

Acceptance (issue 5): weights after k micro-batches of B equal those after one batch of k·B (SGD, no
BatchNorm, same order) for k in {1, 4}, on 1 and 4 replicas, float32 and mixed_bfloat16, through
``fit`` (AccumulatingModel) and a custom loop (GradientAccumulator); the optimizer applies
steps / k updates.

Run once (CONTRIBUTING.md §8): the 4-replica scenarios (k·B equivalence under float32 and mixed_bfloat16, the
reduce_mean averaging bug, Keras' built-in crashing under MirroredStrategy, LossScaleOptimizer skipping an overflow
on every replica, ragged batches) and the accumulated step's peak memory are what lesson 05 measures on 4 CPU
replicas; its claims (experiments/accumulation.py ``claims``, as strict as these tests were) fail the README's
``pytest`` through the notebook, and ``prove`` checks them under XLA. This file tests the rest on one device.

Tolerances: float32 1e-5 (measured ~3e-8: only summation order differs). mixed_bfloat16 1e-3
(measured 5e-5 to 2e-4 after 2-3 updates): the gradient matmuls run in bfloat16 (8 significant bits,
relative rounding up to 2^-8 ≈ 0.4%); one k·B batch rounds its batch sum to bfloat16 once, k
micro-batches round k partial sums, so updates differ by ~0.4% of their size (the weights move
~0.03-0.05 here). A real averaging bug (missing /k, or reduce_mean per replica) is ~100x larger.
"""

from __future__ import annotations

import pytest

from course_utils import accumulation as acc
from course_utils.lessons.gradient_accumulation import experiments as exp

TOLERANCE = {"float32": 1e-5, "mixed_bfloat16": 1e-3}
CASES = [(k, policy) for policy in ("float32", "mixed_bfloat16") for k in (1, 4)]
UPDATES = 2


@pytest.fixture(scope="module")
def one_replica():
    import tensorflow as tf

    return tf.distribute.OneDeviceStrategy("/cpu:0")


def _check(result, k, policy):
    for path in ("fit", "loop"):
        assert result["max_abs_diff"][path] <= TOLERANCE[policy], (path, result)
        assert result["updates_acc"][path] == result["micro_steps"] // k == UPDATES, (path, result)
    assert result["updates_big"] == UPDATES
    assert result["moved"] > 20 * TOLERANCE[policy], "weights must really move, or equality proves nothing"
    if k == 1 or policy == "float32":
        assert max(result["max_abs_diff"].values()) <= 1e-6


@pytest.mark.parametrize("k, policy", CASES)
def test_equivalence_one_replica(one_replica, k, policy):
    result = exp.compare_with_big_batch(one_replica, k, updates=UPDATES, policy=policy)
    assert result["replicas"] == 1
    _check(result, k, policy)


def test_keras_builtin_matches_big_batch_on_one_device(one_replica):
    result = exp.builtin_accumulation(one_replica)
    assert result["max_abs_diff"] <= 1e-5
    assert result["iterations"] == result["updates_big"] == 2
    assert result["micro_step_counter"] == 8  # its LR schedule sees micro-steps


def test_batchnorm_statistics_update_per_micro_batch(one_replica):
    bn = exp.batchnorm_caveat(one_replica)
    assert bn["updates"] == 1
    assert bn["moving_mean_moved_acc"] > 2 * bn["moving_mean_moved_big"]  # k updates of the moving mean
    assert bn["trainable_diff"] > 1e-4  # micro-batch statistics: not the big-batch gradient


def test_schedule_sees_updates_not_micro_steps():
    units = exp.schedule_units(steps=4, updates=2, warmup=8)
    assert units["big batch"] == units["AccumulatingModel"]
    assert units["AccumulatingModel"]["schedule_step"] == 2 and units["AccumulatingModel"]["lr"] == pytest.approx(0.025)
    assert units["Keras built-in"]["iterations"] == 2 and units["Keras built-in"]["schedule_step"] == 8
    assert units["Keras built-in"]["lr"] == pytest.approx(0.1)


def test_float16_needs_loss_scaling(one_replica):
    demo = exp.loss_scaling_demo(one_replica, micro_batch=32)
    assert demo["mixed_float16, no loss scaling"]["vanished"] > 0.05
    assert demo["mixed_float16 + LossScaleOptimizer"]["vanished"] == 0.0
    assert demo["mixed_float16 + LossScaleOptimizer"]["rel_error"] < 0.05


def test_apply_refuses_an_incomplete_accumulation(one_replica):
    import keras
    import tensorflow as tf

    x, y = exp.toy_data(16)
    with one_replica.scope():
        model = exp.tiny_classifier()
        ga = acc.GradientAccumulator(
            model,
            keras.optimizers.SGD(0.1),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None),
            steps=4,
            global_micro_batch=8,
            strategy=one_replica,
        )
    batch = next(iter(one_replica.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(8))))
    ga.micro_step(batch)
    with pytest.raises(RuntimeError, match="after 1 micro-steps, expected 4"):
        ga.apply()
    # 2 full groups would need 8 micro-batches; 16 examples / 8 = 2 micro-batches -> dropped, no update
    ga.reset()
    assert (
        ga.train(one_replica.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(8))) == []
    )
    assert int(ga.optimizer.iterations.numpy()) == 0


def test_accumulating_model_rejects_a_batch_not_divisible_by_k(one_replica):
    import keras
    import numpy as np

    with one_replica.scope():
        wrapped = acc.AccumulatingModel(exp.tiny_classifier(), steps=4)
        wrapped.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match="batch_size=6 must be a multiple of replicas × steps = 4"):
        wrapped.fit(np.zeros((6, 8), "float32"), np.zeros(6, "int64"), batch_size=6, verbose=0)


def test_max_abs_diff():
    import numpy as np

    assert exp.max_abs_diff([np.zeros(3), np.ones((2, 2))], [np.zeros(3), np.ones((2, 2)) * 1.5]) == 0.5
    with pytest.raises(ValueError):
        exp.max_abs_diff([np.zeros(1)], [])


def test_fit_with_mixed_float16_uses_loss_scaling_and_matches_float32(one_replica):
    import keras

    x, y = exp.toy_data(64)
    weights = {}
    for policy in ("float32", "mixed_float16"):
        keras.mixed_precision.set_global_policy(policy)
        try:
            with one_replica.scope():
                wrapped = acc.AccumulatingModel(exp.tiny_classifier(), steps=4)
                wrapped.compile(
                    optimizer=keras.optimizers.SGD(0.1),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                )
            wrapped.fit(x, y, batch_size=32, shuffle=False, verbose=0)
        finally:
            keras.mixed_precision.set_global_policy("float32")
        weights[policy] = wrapped.get_weights()
        if policy == "mixed_float16":  # compile wrapped the optimizer; it applied both updates
            assert isinstance(wrapped.optimizer, keras.optimizers.LossScaleOptimizer)
            assert int(wrapped.optimizer.iterations.numpy()) == 2
    assert exp.max_abs_diff(weights["float32"], weights["mixed_float16"]) < 5e-3


# -- issue 8: accumulation under several replicas, with loss scaling, ragged data, sample weights ----


def test_gradient_accumulator_uses_sample_weights(one_replica):
    import keras
    import numpy as np
    import tensorflow as tf

    x, y = exp.toy_data(32)
    w = np.linspace(0.0, 2.0, 32).astype("float32")
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    with one_replica.scope():
        reference = exp.tiny_classifier()
        reference.compile(
            optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
        model = exp.tiny_classifier()
        ga = acc.GradientAccumulator(
            model, keras.optimizers.SGD(0.1), per_example, steps=4, global_micro_batch=8, strategy=one_replica
        )
    reference.fit(x, y, sample_weight=w, batch_size=32, shuffle=False, verbose=0)
    ds = tf.data.Dataset.from_tensor_slices((x, y, w)).batch(8, drop_remainder=True)
    ga.train(one_replica.experimental_distribute_dataset(ds))
    assert exp.max_abs_diff(reference.get_weights(), model.get_weights()) <= 1e-6
    unweighted = exp.tiny_classifier()
    unweighted.compile(
        optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    unweighted.fit(x, y, batch_size=32, shuffle=False, verbose=0)
    assert exp.max_abs_diff(unweighted.get_weights(), model.get_weights()) > 1e-4  # the weights mattered


def test_accumulating_model_refuses_a_dataset_without_a_fixed_batch(one_replica):
    import keras
    import tensorflow as tf

    x, y = exp.toy_data(20)
    with one_replica.scope():
        wrapped = acc.AccumulatingModel(exp.tiny_classifier(), steps=4)
        wrapped.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match="drop_remainder=True"):
        wrapped.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), verbose=0)
    assert int(wrapped.optimizer.iterations.numpy()) == 0  # refused before any update


def test_extra_share_reads_0_at_b_and_1_at_kb():
    from course_utils.memory import PeakMemory

    def peak(*mib):
        return PeakMemory(int(mib[0] * 2**20), "test", "CPU:0", samples=[int(m * 2**20) for m in mib])

    peaks = {"1·B": peak(10, 12), "4·B": peak(40, 42), "4 × B accumulated": peak(10, 42)}
    assert exp.extra_share_samples(peaks, 4) == [0.0, 1.0]
    assert exp.growth_samples(peaks, "4·B") == [4.0, 3.5]
