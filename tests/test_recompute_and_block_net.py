"""Lesson 07's recomputation and block net: Recompute, RematScope on this Keras, the estimate, isolated peaks.

Every assertion here would be false if the code were wrong: recomputation must give the plain
gradients (it computes the same ops on the same inputs) yet keep less; the estimate must count the
layers inside nested blocks; a step measured without and with XLA in one process must be labelled apart.
"""

from __future__ import annotations

import numpy as np
import pytest

from course_utils import activation_memory as am
from course_utils import memory
from course_utils.lessons.activation_memory import experiments as exp

pytestmark = pytest.mark.usefixtures("float32_policy")  # conftest.py

NET = dict(width=16, depth=2, tokens=8)


def _grads(model, x, y, mode):
    import keras
    import tensorflow as tf

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def g():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    fn = {"eager": g, "function": tf.function(g), "jit": tf.function(g, jit_compile=True)}[mode]
    return [t.numpy() for t in fn()]


@pytest.mark.parametrize("mode", ["eager", "function", "jit"])
def test_recompute_blocks_gives_the_plain_gradients(mode):
    import tensorflow as tf

    plain = exp.block_net(**NET, seed=3)
    recomputed = exp.block_net(**NET, remat="blocks", seed=3)
    assert any(type(layer).__name__ == "Recompute" for layer in recomputed.layers)
    for a, b in zip(plain.get_weights(), recomputed.get_weights()):  # same weights: only the switch differs
        np.testing.assert_array_equal(a, b)
    x = tf.random.normal([4, NET["tokens"], NET["width"]], seed=1)
    y = tf.constant([0, 3, 5, 9])
    for a, b in zip(_grads(plain, x, y, mode), _grads(recomputed, x, y, mode)):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6 * max(1.0, float(np.abs(a).max())))


def test_recompute_mixed_bfloat16_and_fit():
    """Under mixed_bfloat16 the wrapped block computes in bfloat16 and fit() trains through it."""
    import keras
    import tensorflow as tf

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = exp.block_net(**NET, remat="blocks", seed=0)
        assert model.layers[1].compute_dtype == "bfloat16"
        model.compile(
            optimizer=keras.optimizers.Adam(1e-2),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=True,
        )
        x = np.random.default_rng(0).normal(size=(64, NET["tokens"], NET["width"])).astype("float32")
        y = (x[:, :, 0].mean(axis=1) > 0).astype("int32")  # learnable from the input
        history = model.fit(x, y, epochs=8, batch_size=16, verbose=0)
        assert history.history["loss"][-1] < history.history["loss"][0] * 0.8
        assert model(tf.constant(x[:2])).dtype == tf.float32  # float32 logits
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_remat_scope_modes_on_this_keras():
    """keras-team/keras#21207: on the TensorFlow backend only 'activations' runs inside tf.function.

    If this starts failing, Keras fixed the bug: update lesson 07 §2 (its claim row says the same)."""
    rows = {r["RematScope mode"]: r for r in exp.remat_scope_modes()}
    compiled = "tf.function"
    assert all(r["eager"] == "runs" for r in rows.values())
    assert rows["activations"][compiled] == "runs"
    for mode in ("full", "larger_than", "list_of_layers"):
        assert rows[mode][compiled].startswith("ValueError: The custom_gradient decorator"), rows[mode]
        assert "\x1b" not in rows[mode][compiled]


def test_block_net_switches_and_bad_values():
    m = exp.block_net(**NET, activation="few_bit", norm="output_saving")
    kinds = {type(layer).__name__ for block in m.layers if hasattr(block, "layers") for layer in block.layers}
    assert {"FewBitGELU", "OutputSavingLayerNormalization"} <= kinds
    for bad in (dict(remat="everything"), dict(activation="relu"), dict(norm="batch")):
        with pytest.raises(ValueError, match="must be one of"):
            exp.block_net(**NET, **bad)


def test_estimate_counts_layers_inside_nested_blocks():
    """Per token and block: LayerNorm W + Dense 4W + GELU 4W + Dense W + Add W = 11·W; plus input, pool, logits."""
    model = exp.block_net(width=16, depth=3, tokens=8, classes=10)
    batch = 5
    est = memory.estimate_training_memory(model, batch, optimizer="adam")
    per_example = 8 * 16 + 3 * 11 * 8 * 16 + 16 + 10
    assert est.activations == batch * per_example * 4
    assert est.parameters == sum(int(np.prod(w.shape)) for w in model.weights) * 4


def test_gradient_differences_reports_exact_and_approximate():
    d = exp.gradient_differences({"blocks": {"remat": "blocks"}, "few_bit": {"activation": "few_bit"}}, batch=4, **NET)
    assert d["blocks"]["max_abs"] <= 1e-6 * d["blocks"]["max_ref"] and d["blocks"]["cosine"] > 0.999999
    assert 0.9 < d["few_bit"]["cosine"] < 0.99999 and d["few_bit"]["max_abs"] > 1e-5  # approximate, by design


def test_largest_batch_extrapolation():
    assert exp.largest_batch(100.0, 164.0, 32, 64, 1000.0) == (482, 36.0, 2.0)  # (1000 - 36) // 2
    assert exp.largest_batch(100.0, 164.0, 32, 64, 30.0)[0] == 0  # not even the fixed part fits
    with pytest.raises(ValueError):
        exp.largest_batch(100.0, 100.0, 32, 64, 1000.0)
    with pytest.raises(ValueError):
        exp.largest_batch(100.0, 164.0, 64, 32, 1000.0)


def test_peaks_with_and_without_xla_in_one_process_and_recompute_saves():
    """make_step may return {key: step}: both measured, labelled label+key. Recomputed blocks keep less."""
    net = dict(width=32, depth=3, tokens=16)
    peaks = memory.measure_peaks_isolated(
        exp.make_block_net_step,
        {"plain": dict(batch=32, jit="both", **net), "blocks": dict(batch=32, jit="both", remat="blocks", **net)},
        repeats=2,
        parallel=2,
    )
    assert set(peaks) == {"plain", "plain|xla", "blocks", "blocks|xla"}
    for label, peak in peaks.items():
        print(f"{label:12s} {memory.format_bytes(peak.peak_bytes)} {peak.samples}")
    block_inside = 32 * 16 * 32 * 4 * 8  # batch × tokens × W floats × ~8 of the 11 W a block keeps, float32
    for suffix in ("", "|xla"):
        assert peaks["blocks" + suffix].peak_bytes < peaks["plain" + suffix].peak_bytes - block_inside


def test_cross_entropy_steps_share_tensors_and_chunking_saves():
    steps = exp.make_cross_entropy_steps(chunks=4, rows=256, classes=512)
    whole = exp.make_cross_entropy_steps(chunks=0, rows=256, classes=512)
    assert set(steps) == {"", "|xla"}
    for a, b in ((steps[""], steps["|xla"]), (steps[""], whole[""])):
        la, ga = a()
        lb, gb = b()
        assert abs(float(la) - float(lb)) < 1e-5
        for x, y in zip(ga, gb):
            np.testing.assert_allclose(x.numpy(), y.numpy(), atol=1e-5)


def test_recompute_refuses_what_is_not_a_layer():
    with pytest.raises(TypeError, match="wraps a Keras layer"):
        am.Recompute(lambda x: x)


def test_gelu_plan_repeats_seeds_on_real_images_and_shortens_synthetic_runs():
    """§3's runs: real images get every seed and epoch of the config; synthetic ones (learned to ~99% in a few
    epochs) one seed and at most SYNTHETIC_GELU_EPOCHS."""
    from course_utils import config
    from course_utils.lessons.activation_memory import experiments as exp

    full = config.FULL_SIZES
    assert exp.gelu_plan(full, "tfds", 7) == ([7 + i for i in range(full.gelu_seeds)], full.gelu_epochs)
    assert exp.gelu_plan(full, "npz:/x.npz", 0)[1] == full.gelu_epochs == 15
    assert exp.gelu_plan(full, "synthetic", 7) == ([7], exp.SYNTHETIC_GELU_EPOCHS) and exp.SYNTHETIC_GELU_EPOCHS < 15
    smoke = config.SMOKE_SIZES
    assert exp.gelu_plan(smoke, "synthetic", 0) == ([0], smoke.gelu_epochs)  # already fewer


def test_gelu_cnn_stages():
    """§3's CNN: two conv-BN-GELU per stage, the filters doubling per stage; full mode trains all three stages, smoke
    mode one (sizes.gelu_stages); another count is refused with the values it takes."""
    from course_utils import config

    def convs(model):
        return [layer.filters for layer in model.layers if type(layer).__name__ == "Conv2D"]

    assert convs(exp.gelu_cnn(8, stages=3)) == [8, 8, 16, 16, 32, 32] == convs(exp.gelu_cnn(8))
    one = exp.gelu_cnn(8, "few_bit", stages=1)
    assert convs(one) == [8, 8] and one.output_shape == (None, 10)
    assert (config.FULL_SIZES.gelu_stages, config.SMOKE_SIZES.gelu_stages) == (3, 1)
    for bad in (0, 4, "2", True, 2.5):
        with pytest.raises(ValueError, match="stages must be 1, 2 or 3"):
            exp.gelu_cnn(8, stages=bad)


def test_the_memory_profile_uses_at_least_four_blocks():
    """§7: at 2 blocks (smoke mode) recomputing saved too little to show on one core; the profile deepens the net."""
    from course_utils.lessons.activation_memory import experiments as exp

    assert exp.profile_net({"width": 64, "depth": 2, "tokens": 32}) == {"width": 64, "depth": 4, "tokens": 32}
    assert exp.profile_net({"width": 128, "depth": 6, "tokens": 64})["depth"] == 6
