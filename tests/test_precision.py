"""Lesson 03's experiments (course_utils.lessons.mixed_precision.experiments) and the Keras behaviour the lesson teaches."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from course_utils import memory
from course_utils.lessons.mixed_precision import experiments as precision


@pytest.fixture(scope="module")
def confident():
    return precision.confident_logits(2048, 10, seed=42)


def test_confident_logits_are_confident_and_labelled_zero(confident):
    logits, labels = confident
    assert logits.shape == (2048, 10) and logits.dtype == np.float32
    assert labels.dtype == np.int64 and not labels.any()
    assert np.mean(logits.argmax(axis=1) == 0) > 0.75  # class 0 carries the +8 (chance: 0.1)


def test_relative_error_per_row_and_elementwise():
    ref = np.array([[1.0, -1.0], [2.0, 2.0]])
    val = np.array([[1.0, -2.0], [2.0, 2.0]])
    np.testing.assert_allclose(precision.relative_error(val, ref, axis=1), [0.5, 0.0])
    np.testing.assert_allclose(precision.relative_error(val[0], ref[0]), [0.0, 1.0])


def test_float32_softmax_output_gives_the_from_logits_loss_exactly(confident):
    logits, labels = confident
    for logits_dtype in ("float32", "bfloat16"):
        via_softmax = precision.cross_entropy(logits, labels, logits_dtype, "float32")
        via_logits = precision.cross_entropy(logits, labels, logits_dtype, None)
        np.testing.assert_array_equal(via_softmax["loss"], via_logits["loss"])
        np.testing.assert_array_equal(via_softmax["grad"], via_logits["grad"])


def test_bfloat16_softmax_rounds_to_one_but_keeps_loss_and_almost_every_gradient(confident):
    logits, labels = confident
    ref = precision.cross_entropy(logits, labels)
    bf = precision.cross_entropy(logits, labels, "bfloat16", "bfloat16")
    at_one = bf["probs"][:, 0] == 1.0
    assert 0.1 < at_one.mean() < 0.5
    assert bf["loss"][at_one].min() > 0  # clip + renormalise: never exactly 0
    zero = np.all(bf["grad"] == 0, axis=1)
    assert zero[at_one].mean() < 0.01
    # a gradient vanishes only where every entry is clipped: an example whose float32 loss is already tiny
    assert np.all(ref["loss"][zero] < 1e-6)
    assert np.all(bf["probs"][zero][:, 1:] < 1e-7)
    # coarse probabilities: steps of 2^-8 below 1
    top = bf["probs"].max(axis=1)
    assert len(np.unique(top[top > 0.99])) <= 4
    assert np.abs(bf["probs"].sum(axis=1) - 1).max() > 1e-3
    # and the clip-and-log path errs far more on the most confident rows than the logits path
    f32_out = precision.cross_entropy(logits, labels, "bfloat16", "float32")
    assert (
        precision.relative_error(bf["loss"], ref["loss"]).max()
        > 5 * precision.relative_error(f32_out["loss"], ref["loss"]).max()
    )


def test_loss_scale_optimizer_apply_gradients_unscales_like_apply():
    updates = []
    for use_apply_gradients in (False, True):
        w = tf.Variable([1.0])
        opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(1.0))
        opt.build([w])
        grads = [tf.constant([0.5]) * opt.dynamic_scale]
        if use_apply_gradients:
            opt.apply_gradients(zip(grads, [w]))
        else:
            opt.apply(grads, [w])
        updates.append(float(1.0 - w.numpy()[0]))
    assert updates == [0.5, 0.5]


@pytest.mark.parametrize(
    "policy,jit", [("float32", False), ("mixed_bfloat16", False), ("mixed_bfloat16", True), ("mixed_float16", False)]
)
def test_training_step_trains_under_the_policy(policy, jit):
    step = precision.training_step(policy, width=4, batch=8, jit=jit)
    model = step.model
    before = [w.numpy().copy() for w in model.trainable_weights]
    loss = float(step())
    assert np.isfinite(loss)
    assert all(not np.array_equal(b, w.numpy()) for b, w in zip(before, model.trainable_weights))
    assert all(w.dtype == "float32" for w in model.trainable_weights)  # mixed: float32 variables
    assert (
        model.layers[1].compute_dtype
        == {"float32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}[policy]
    )


def test_training_step_peaks_measure_each_policy_in_a_fresh_process():
    peaks = precision.training_step_peaks(None, ("float32", "mixed_bfloat16"), repeats=1, width=8, batch=256)
    assert set(peaks) == {"float32", "mixed_bfloat16"}
    assert all(p.peak_bytes > 0 and "fresh process" in p.method for p in peaks.values())
    # activations dominate at this batch: the mixed step's peak is lower
    assert peaks["mixed_bfloat16"].peak_bytes < peaks["float32"].peak_bytes
    assert memory.default_device() == "CPU:0"


# The TPU-shaped run (COURSE_CPU_REPLICAS=4, COURSE_JIT=1) in a fresh 4-replica process: lesson 03's §4 step and
# §3's loss-scale reads, where they crashed (float() of a MirroredVariable; one XLA cluster over strategy.run).
SEVERAL_REPLICAS = r"""
import json
import numpy as np
import keras
import tensorflow as tf
import course_utils
from course_utils import models
from course_utils.lessons.mixed_precision import experiments as precision

strategy = course_utils.detect().strategy
out = {"replicas": strategy.num_replicas_in_sync, "steps": {}}
for policy in ("float32", "mixed_float16"):
    for jit in (False, True):
        one = precision.training_step(policy, width=4, batch=16, jit=jit,
                                      strategy=tf.distribute.OneDeviceStrategy("/cpu:0"))
        many = precision.training_step(policy, width=4, batch=16, jit=jit, strategy=strategy)
        many.model.set_weights(one.model.get_weights())
        losses = [float(one()), float(many())]
        firsts = [getattr(s.optimizer, "inner_optimizer", s.optimizer)._momentums for s in (one, many)]
        grad_rel = max(float(np.abs(a.numpy() - b.numpy()).max() / np.abs(a.numpy()).max()) for a, b in zip(*firsts))
        out["steps"][f"{policy} {jit}"] = dict(losses=losses, grad_rel=grad_rel, xla=many.xla)

model = models.build_under_policy("mixed_float16", lambda: keras.Sequential(
    [keras.Input((4,)), keras.layers.Dense(2, bias_initializer="zeros")]), strategy=strategy)
with strategy.scope():
    lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(1.0))
    lso.build(model.trainable_variables)
try:
    float(lso.dynamic_scale)
    out["float"] = "ran"
except TypeError as e:
    out["float"] = str(e)
out["numpy"] = float(lso.dynamic_scale.numpy())
grads = [tf.zeros((4, 2)), tf.fill((2,), 0.5) * lso.dynamic_scale.numpy()]  # scaled; unscaled bias gradient 0.5
lso.apply(grads, model.trainable_variables)
out["once"] = float(-model.trainable_variables[1].numpy()[0])
strategy.run(lambda: lso.apply(grads, model.trainable_variables))
out["per_replica"] = float(-model.trainable_variables[1].numpy()[0]) - out["once"]
print(json.dumps(out))
"""


@pytest.mark.extended  # a fresh-process scenario: .ci/run runs it after the README's pytest
def test_lesson_03_on_four_replicas_the_step_is_the_one_device_step_and_the_scale_reads():
    """On 4 CPU replicas (the TPU shape): training_step is a real data-parallel step — its loss and gradients (Adam's
    first moment) are those of one device on the same global batch, with XLA compiling each replica's forward and
    backward pass (one cluster over strategy.run cannot run: keras-team/keras#19005) and a LossScaleOptimizer's update
    decided across replicas. §3: float() of the loss scale raises there, .numpy() reads it, and apply outside
    strategy.run updates once where inside it the replicas' sum is 4 updates."""
    from course_utils import runtime

    got = json.loads(runtime.run_on_cpu_replicas(4, SEVERAL_REPLICAS, timeout=300).strip().splitlines()[-1])
    assert got["replicas"] == 4
    for name, step in got["steps"].items():
        one, many = step["losses"]
        assert abs(one - many) <= 1e-6 * abs(one), (name, step)
        assert step["grad_rel"] <= (1e-4 if name.startswith("float32") else 1e-2), (name, step)
        assert step["xla"] == (
            "each replica's forward and backward pass, the update outside" if name.endswith("True") else "none"
        ), (name, step)
    assert "MirroredVariable" in got["float"] and got["numpy"] == 2.0**15
    assert got["once"] == pytest.approx(0.5) and got["per_replica"] == pytest.approx(4 * 0.5)
