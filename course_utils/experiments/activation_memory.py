"""Lesson 07's experiments: where training memory goes, and what each activation-memory technique saves and costs.

One model carries every technique as a switch, so the lesson compares them on the same network:
:func:`block_net`, a stack of pre-norm residual MLP blocks over tokens (LayerNorm → Dense(4·W) → GELU →
Dense(W) → + input: a transformer's feed-forward half, the part whose activations dominate). Each block
is a small functional ``keras.Model`` named ``block{i}``, so Keras' ``RematScope(mode="list_of_layers")``
can recompute whole blocks and the memory estimate can see inside them.

The step builders here are module-level, for :func:`course_utils.memory.measure_peaks_isolated`.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

#: the block net's technique switches, as the lesson names them
REMAT_MODES = ("none", "blocks", "activations", "keras_blocks", "full", "larger_than")
ACTIVATIONS = ("exact", "few_bit", "output_saving")
NORMS = ("keras", "output_saving")


def _gelu_exact(t):
    import keras

    return keras.activations.gelu(t, approximate=False)


def _activation_layer(activation: str, bits: int, name: str):
    import keras

    from .. import activation_memory as am

    if activation == "few_bit":
        return am.FewBitGELU(bits, name=name)
    if activation == "output_saving":
        return keras.layers.Activation(am.output_saving_gelu, name=name)
    return keras.layers.Activation(_gelu_exact, name=name)


def _norm_layer(norm: str, name: str):
    import keras

    from .. import activation_memory as am

    if norm == "output_saving":
        return am.OutputSavingLayerNormalization(name=name)
    return keras.layers.LayerNormalization(epsilon=1e-3, name=name)


def _mlp_block(i: int, tokens: int, width: int, expansion: int, activation: str, bits: int, norm: str):
    import keras

    x = keras.Input((tokens, width))
    h = _norm_layer(norm, f"norm{i}")(x)
    h = keras.layers.Dense(expansion * width, name=f"up{i}")(h)
    h = _activation_layer(activation, bits, f"gelu{i}")(h)
    h = keras.layers.Dense(width, name=f"down{i}")(h)
    return keras.Model(x, keras.layers.Add(name=f"residual{i}")([x, h]), name=f"block{i}")


def block_net(width: int = 64, depth: int = 4, tokens: int = 64, expansion: int = 4, classes: int = 10,
              remat: str = "none", activation: str = "exact", bits: int = 2, norm: str = "keras",
              seed: int = 0):
    """Tokens ``[tokens, width]`` → ``depth`` residual MLP blocks → mean over tokens → Dense(classes) logits.

    ``remat``: ``"none"``; ``"blocks"`` = every block wrapped in
    :class:`course_utils.activation_memory.Recompute` (``tf.recompute_grad``: each block keeps only its
    input; its inside is recomputed in the backward pass); ``"activations"`` = ``keras.RematScope("activations")``
    (each activation function recomputed); ``"keras_blocks"`` = ``keras.RematScope("list_of_layers")``
    naming every block, ``"full"`` and ``"larger_than"`` (threshold between the blocks' ``tokens·width``
    outputs and the ``tokens·expansion·width`` ones) = Keras' other modes — these three fail inside
    ``tf.function`` on the TensorFlow backend (keras-team/keras#21207).
    ``activation``: ``"exact"`` GELU, ``"few_bit"`` (:class:`course_utils.activation_memory.FewBitGELU` with
    ``bits``) or ``"output_saving"``. ``norm``: Keras' ``"keras"`` LayerNormalization or the
    ``"output_saving"`` one. Weights depend only on ``seed``, never on the switches.
    """
    import contextlib

    import keras

    from .. import activation_memory as am

    if remat not in REMAT_MODES:
        raise ValueError(f"remat must be one of {REMAT_MODES}, got {remat!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    scope = {
        "none": contextlib.nullcontext(),
        "blocks": contextlib.nullcontext(),
        "keras_blocks": keras.RematScope(mode="list_of_layers", layer_names=[f"block{i}" for i in range(depth)]),
        "full": keras.RematScope(mode="full"),
        "activations": keras.RematScope(mode="activations"),
        "larger_than": keras.RematScope(mode="larger_than", output_size_threshold=2 * tokens * width),
    }[remat]
    keras.utils.set_random_seed(seed)
    with scope:
        inputs = keras.Input((tokens, width))
        x = inputs
        for i in range(depth):
            block = _mlp_block(i, tokens, width, expansion, activation, bits, norm)
            x = (am.Recompute(block, name=f"recompute{i}") if remat == "blocks" else block)(x)
        x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
        outputs = keras.layers.Dense(classes, name="logits", dtype="float32")(x)
        return keras.Model(inputs, outputs, name=f"block_net_{remat}_{activation}_{norm}")


class _quiet_retracing:
    """Silences TensorFlow's "N out of the last N calls ... triggered tf.function retracing" warning while a
    helper builds one compiled step per variant on purpose (each is traced once, as intended)."""

    def __enter__(self):
        import tensorflow as tf

        self._logger = tf.get_logger()
        self._level = self._logger.level
        self._logger.setLevel("ERROR")
        return self

    def __exit__(self, *exc):
        self._logger.setLevel(self._level)
        return False


def _block_net_batch(batch: int, tokens: int, width: int, classes: int, seed: int):
    import tensorflow as tf

    g = tf.random.Generator.from_seed(seed + 1)
    return g.normal([batch, tokens, width]), g.uniform([batch], 0, classes, dtype=tf.int32)


XLA_KEYS = {False: "", True: "|xla"}  # label suffixes when one process measures a step without and with XLA


def make_block_net_step(batch: int = 128, jit: Any = False, optimizer: str = "adam", seed: int = 0,
                        **net_kwargs):
    """One training step of :func:`block_net` (forward, backward, and the optimizer's update) in a ``tf.function``.

    ``jit``: compile with XLA; ``"both"`` returns ``{"": step without XLA, "|xla": step with XLA}``, two
    steps on the same model, weights and batch. ``optimizer``: ``"adam"`` (two slots per weight) or
    ``"none"`` (forward + backward only; the step returns the gradients). ``net_kwargs`` go to
    :func:`block_net`. For :func:`course_utils.memory.measure_peaks_isolated`.
    """
    import keras
    import tensorflow as tf

    model = block_net(seed=seed, **net_kwargs)
    x, y = _block_net_batch(batch, model.input_shape[1], model.input_shape[2], model.output_shape[-1], seed)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = keras.optimizers.Adam(1e-3) if optimizer == "adam" else None
    if opt is not None:
        opt.build(model.trainable_variables)

    def make(jit_compile: bool):
        @tf.function(jit_compile=jit_compile)
        def step():
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            if opt is None:
                return loss, grads
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return step

    if jit == "both":
        return {XLA_KEYS[j]: make(j) for j in (False, True)}
    return make(bool(jit))


def _without_and_with_xla(step):
    """``{"": step, "|xla": the same Python function compiled with XLA}``: one model, one set of tensors."""
    import tensorflow as tf

    return {XLA_KEYS[False]: step, XLA_KEYS[True]: tf.function(step.python_function, jit_compile=True)}


def make_layer_norm_stack_steps(**kwargs):
    """:func:`course_utils.activation_memory.make_layer_norm_stack_step` without and with XLA on one model."""
    from .. import activation_memory as am

    return _without_and_with_xla(am.make_layer_norm_stack_step(jit=False, **kwargs))


def make_cross_entropy_steps(chunks: int = 0, **kwargs):
    """:func:`course_utils.activation_memory.make_cross_entropy_step` without and with XLA on the same tensors."""
    from .. import activation_memory as am

    return _without_and_with_xla(am.make_cross_entropy_step(chunks=chunks, jit=False, **kwargs))


def gradient_differences(variants: dict[str, dict], batch: int = 16, seed: int = 0, jit: bool = False,
                         **net_kwargs) -> dict[str, dict]:
    """Gradients of every variant against the plain block net's, same weights and batch.

    ``variants``: ``{label: block_net switches}``. Returns ``{label: {"max_abs": …, "cosine": …}}``
    (max |Δ| over all weights' gradients, and the cosine similarity of the whole flattened gradient).
    """
    def grads_of(**switches):  # the step of make_block_net_step without an optimizer returns the gradients
        _, grads = make_block_net_step(batch=batch, jit=bool(jit), optimizer="none", seed=seed, **net_kwargs,
                                       **switches)()
        return np.concatenate([t.numpy().ravel() for t in grads])

    with _quiet_retracing():
        ref = grads_of()
        got_all = {label: grads_of(**switches) for label, switches in variants.items()}
    out = {}
    for label, got in got_all.items():
        cosine = float(np.dot(ref, got) / (np.linalg.norm(ref) * np.linalg.norm(got)))
        out[label] = {"max_abs": float(np.max(np.abs(got - ref))), "cosine": cosine,
                      "max_ref": float(np.max(np.abs(ref)))}
    return out


def largest_batch(peak_small: float, peak_large: float, batch_small: int, batch_large: int,
                  budget_bytes: float) -> tuple[int, float, float]:
    """The largest batch whose peak fits ``budget_bytes``, from peaks measured at two batch sizes.

    Training memory is a fixed part (weights, gradients, optimizer state) plus a part proportional to the
    batch (activations): ``peak(B) = fixed + B · per_example``. Returns ``(batch, fixed, per_example)``;
    batch 0 when even the fixed part does not fit.
    """
    if batch_large <= batch_small:
        raise ValueError("batch_large must be larger than batch_small")
    per_example = (peak_large - peak_small) / (batch_large - batch_small)
    fixed = peak_small - batch_small * per_example
    if per_example <= 0:
        raise ValueError("the peak did not grow with the batch: cannot extrapolate")
    return max(0, int((budget_bytes - fixed) // per_example)), fixed, per_example


# ----------------------------------------------------------------------------------------------
# Few-bit GELU on images: a small CNN trained with exact and with few-bit GELU
# ----------------------------------------------------------------------------------------------


def gelu_cnn(width: int = 16, activation: str = "exact", bits: int = 2, classes: int = 10, seed: int = 0):
    """conv-BN-GELU ×2 (w) · pool · ×2 (2w) · pool · ×2 (4w) · global average · Dense — GELU exact or few-bit.

    Inputs are pixels 0-255 (rescaled in the model). Weights depend only on ``seed``.
    """
    import keras
    from keras import layers

    if activation not in ("exact", "few_bit"):
        raise ValueError(f"activation must be 'exact' or 'few_bit', got {activation!r}")
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((32, 32, 3))
    x = layers.Rescaling(1 / 127.5, offset=-1.0)(inputs)
    n = 0
    for stage, filters in enumerate((width, 2 * width, 4 * width)):
        if stage:
            x = layers.MaxPooling2D()(x)
        for _ in range(2):
            x = layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
            x = layers.BatchNormalization(momentum=0.9)(x)  # Keras' 0.99 lags with ~30 steps an epoch
            x = _activation_layer(activation, bits, f"gelu{n}")(x)
            n += 1
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(classes, dtype="float32")(x)
    return keras.Model(inputs, outputs, name=f"gelu_cnn_{activation}")


def train_gelu_cnn(train, test, activation: str = "exact", bits: int = 2, epochs: int = 10, batch: int = 128,
                   width: int = 16, lr: float = 0.01, seed: int = 0, verbose: bool = True) -> dict:
    """Train :func:`gelu_cnn` on ``train`` (an unbatched (image uint8, label) ``tf.data`` dataset) with flip + crop.

    AdamW with a cosine decay to zero over ``epochs``; the test split is evaluated after every epoch.
    Prints one line per epoch when ``verbose``. Returns ``{"epochs": [...], "test_accuracy": [...],
    "seconds": [...] (cumulative training time), "label": ...}``.
    """
    import keras
    import tensorflow as tf

    from .. import data

    n = data._count(train)
    steps = max(1, n // batch)
    model = gelu_cnn(width, activation, bits, seed=seed)
    schedule = keras.optimizers.schedules.CosineDecay(lr, decay_steps=epochs * steps)
    model.compile(optimizer=keras.optimizers.AdamW(schedule, weight_decay=5e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    train_ds = (train.cache().shuffle(n, seed=seed).map(data.augment, num_parallel_calls=tf.data.AUTOTUNE)
                .map(data.to_float).batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
    test_ds = test.map(data.to_float).batch(512).cache().prefetch(tf.data.AUTOTUNE)
    label = "exact GELU" if activation == "exact" else f"{bits}-bit GELU"
    out = {"label": label, "epochs": [], "test_accuracy": [], "seconds": []}
    spent = 0.0
    for epoch in range(1, epochs + 1):
        t0 = time.perf_counter()
        history = model.fit(train_ds, epochs=epoch, initial_epoch=epoch - 1, verbose=0)
        spent += time.perf_counter() - t0
        _, acc = model.evaluate(test_ds, verbose=0)
        out["epochs"].append(epoch)
        out["test_accuracy"].append(float(acc))
        out["seconds"].append(spent)
        if verbose:
            print(f"  {label:>11}  epoch {epoch:>2}/{epochs}  {spent:6.1f} s  "
                  f"train loss {history.history['loss'][-1]:.3f}  test accuracy {acc:.1%}", flush=True)
    return out


# ----------------------------------------------------------------------------------------------
# keras.RematScope on this Keras and TensorFlow
# ----------------------------------------------------------------------------------------------


def remat_scope_modes() -> list[dict]:
    """Each ``keras.RematScope`` mode on a tiny Dense model: does a gradient run eagerly, in ``tf.function``, in ``fit``?

    Returns one row per mode with "runs" or the exception's type and first line. (On Keras 3.15 / TF 2.20
    only ``"activations"`` runs compiled: keras-team/keras#21207.)
    """
    import keras
    import tensorflow as tf

    def first_line(exc: BaseException) -> str:
        import re

        text = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).split())
        for marker in ("The custom_gradient decorator", "object has no attribute"):
            if marker in text:
                text = text[text.index(marker):]
                break
        return f"{type(exc).__name__}: {text[:110]}"

    rows = []
    for mode, kw in (("activations", {}), ("full", {}), ("larger_than", {"output_size_threshold": 8}),
                     ("list_of_layers", {"layer_names": ["hidden"]})):
        keras.utils.set_random_seed(0)
        with keras.RematScope(mode=mode, **kw):
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="gelu", name="hidden"),
                                      keras.layers.Dense(4, name="out")])
        x = tf.random.normal([4, 8], seed=1)

        def grads():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(x, training=True))
            return tape.gradient(loss, model.trainable_variables)

        row = {"RematScope mode": mode}
        for where, fn in (("eager", grads), ("tf.function", tf.function(grads))):
            try:
                fn()
                row[where] = "runs"
            except Exception as exc:  # noqa: BLE001 - the point is to report it
                row[where] = first_line(exc)
        rows.append(row)
    return rows
