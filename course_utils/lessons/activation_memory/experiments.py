"""Lesson 07's experiments: where training memory goes, and what each activation-memory technique saves and costs.

One model carries every technique as a switch, so the lesson compares them on the same network:
:func:`block_net`, a stack of pre-norm residual MLP blocks over tokens (LayerNorm → Dense(4·W) → GELU →
Dense(W) → + input: a transformer's feed-forward half, the part whose activations dominate). Each block
is a small functional ``keras.Model`` named ``block{i}``, so Keras' ``RematScope(mode="list_of_layers")``
can recompute whole blocks and the memory estimate can see inside them.

The step builders here are module-level, for :func:`course_utils.memory.measure_peaks_isolated`.
"""

from __future__ import annotations

import os
import time
from typing import Any

import keras
from keras import layers
import numpy as np
import tensorflow as tf

from ... import activation_memory as am
from ... import data, memory, profiler, report

#: the block net's technique switches, as the lesson names them
REMAT_MODES = ("none", "blocks", "activations", "keras_blocks", "full", "larger_than")
ACTIVATIONS = ("exact", "few_bit", "output_saving")
NORMS = ("keras", "output_saving")


def _gelu_exact(t):
    return keras.activations.gelu(t, approximate=False)


def _activation_layer(activation: str, bits: int, name: str):
    if activation == "few_bit":
        return am.FewBitGELU(bits, name=name)
    if activation == "output_saving":
        return keras.layers.Activation(am.output_saving_gelu, name=name)
    return keras.layers.Activation(_gelu_exact, name=name)


def _norm_layer(norm: str, name: str):
    if norm == "output_saving":
        return am.OutputSavingLayerNormalization(name=name)
    return keras.layers.LayerNormalization(epsilon=1e-3, name=name)


def _mlp_block(i: int, tokens: int, width: int, expansion: int, activation: str, bits: int, norm: str):
    x = keras.Input((tokens, width))
    h = _norm_layer(norm, f"norm{i}")(x)
    h = keras.layers.Dense(expansion * width, name=f"up{i}")(h)
    h = _activation_layer(activation, bits, f"gelu{i}")(h)
    h = keras.layers.Dense(width, name=f"down{i}")(h)
    return keras.Model(x, keras.layers.Add(name=f"residual{i}")([x, h]), name=f"block{i}")


def block_net(
    width: int = 64,
    depth: int = 4,
    tokens: int = 64,
    expansion: int = 4,
    classes: int = 10,
    remat: str = "none",
    activation: str = "exact",
    bits: int = 2,
    norm: str = "keras",
    seed: int = 0,
):
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
        self._logger = tf.get_logger()
        self._level = self._logger.level
        self._logger.setLevel("ERROR")
        return self

    def __exit__(self, *exc):
        self._logger.setLevel(self._level)
        return False


def _block_net_batch(batch: int, tokens: int, width: int, classes: int, seed: int):
    g = tf.random.Generator.from_seed(seed + 1)
    return g.normal([batch, tokens, width]), g.uniform([batch], 0, classes, dtype=tf.int32)


XLA_KEYS = {False: "", True: "|xla"}  # label suffixes when one process measures a step without and with XLA


def make_block_net_step(batch: int = 128, jit: Any = False, optimizer: str = "adam", seed: int = 0, **net_kwargs):
    """One training step of :func:`block_net` (forward, backward, and the optimizer's update) in a ``tf.function``.

    ``jit``: compile with XLA; ``"both"`` returns ``{"": step without XLA, "|xla": step with XLA}``, two
    steps on the same model, weights and batch. ``optimizer``: ``"adam"`` (two slots per weight) or
    ``"none"`` (forward + backward only; the step returns the gradients). ``net_kwargs`` go to
    :func:`block_net`. For :func:`course_utils.memory.measure_peaks_isolated`.
    """
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
    return {XLA_KEYS[False]: step, XLA_KEYS[True]: tf.function(step.python_function, jit_compile=True)}


def make_layer_norm_stack_steps(**kwargs):
    """:func:`course_utils.activation_memory.make_layer_norm_stack_step` without and with XLA on one model."""
    return _without_and_with_xla(am.make_layer_norm_stack_step(jit=False, **kwargs))


def make_cross_entropy_steps(chunks: int = 0, **kwargs):
    """:func:`course_utils.activation_memory.make_cross_entropy_step` without and with XLA on the same tensors."""
    return _without_and_with_xla(am.make_cross_entropy_step(chunks=chunks, jit=False, **kwargs))


def gradient_differences(
    variants: dict[str, dict], batch: int = 16, seed: int = 0, jit: bool = False, **net_kwargs
) -> dict[str, dict]:
    """Gradients of every variant against the plain block net's, same weights and batch.

    ``variants``: ``{label: block_net switches}``. Returns ``{label: {"max_abs": …, "cosine": …}}``
    (max |Δ| over all weights' gradients, and the cosine similarity of the whole flattened gradient).
    """

    def grads_of(**switches):  # the step of make_block_net_step without an optimizer returns the gradients
        with tf.device(memory.default_device()):  # on the accelerator (a TPU VM never compiles XLA for its host)
            _, grads = make_block_net_step(
                batch=batch, jit=bool(jit), optimizer="none", seed=seed, **net_kwargs, **switches
            )()
        return np.concatenate([t.numpy().ravel() for t in grads])

    with _quiet_retracing():
        ref = grads_of()
        got_all = {label: grads_of(**switches) for label, switches in variants.items()}
    out = {}
    for label, got in got_all.items():
        cosine = float(np.dot(ref, got) / (np.linalg.norm(ref) * np.linalg.norm(got)))
        out[label] = {
            "max_abs": float(np.max(np.abs(got - ref))),
            "cosine": cosine,
            "max_ref": float(np.max(np.abs(ref))),
        }
    return out


def largest_batch(
    peak_small: float, peak_large: float, batch_small: int, batch_large: int, budget_bytes: float
) -> tuple[int, float, float]:
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


def gelu_cnn(
    width: int = 16, activation: str = "exact", bits: int = 2, classes: int = 10, seed: int = 0, stages: int = 3
):
    """conv-BN-GELU ×2 (w) · pool · ×2 (2w) · pool · ×2 (4w) · global average · Dense — GELU exact or few-bit.

    ``stages``: how many of the three conv-BN-GELU ×2 stages (smoke mode: 1; tracing the step is most of a short run's
    time, and it grows with the layers). Inputs are pixels 0-255 (rescaled in the model). Weights depend only on
    ``seed``.
    """
    if activation not in ("exact", "few_bit"):
        raise ValueError(f"activation must be 'exact' or 'few_bit', got {activation!r}")
    if isinstance(stages, bool) or stages not in (1, 2, 3):
        raise ValueError(f"stages must be 1, 2 or 3, got {stages!r}")
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((32, 32, 3))
    x = layers.Rescaling(1 / 127.5, offset=-1.0)(inputs)
    n = 0
    for stage, filters in enumerate((width, 2 * width, 4 * width)[:stages]):
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


def train_gelu_cnn(
    train,
    test,
    activation: str = "exact",
    bits: int = 2,
    epochs: int = 10,
    batch: int = 128,
    width: int = 16,
    lr: float = 0.01,
    seed: int = 0,
    verbose: bool = True,
    stages: int = 3,
) -> dict:
    """Train :func:`gelu_cnn` (``stages`` of it) on ``train`` (an unbatched (image uint8, label) ``tf.data``
    dataset) with flip + crop.

    AdamW with a cosine decay to zero over ``epochs``; the test split is evaluated after every epoch.
    Prints one line per epoch when ``verbose``. Returns ``{"epochs": [...], "test_accuracy": [...],
    "seconds": [...] (cumulative training time), "label": ...}``.
    """
    n = data._count(train)
    steps = max(1, n // batch)
    model = gelu_cnn(width, activation, bits, seed=seed, stages=stages)
    schedule = keras.optimizers.schedules.CosineDecay(lr, decay_steps=epochs * steps)
    model.compile(
        optimizer=keras.optimizers.AdamW(schedule, weight_decay=5e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    # autotuning off: each epoch's fit call ends by destroying its iterator, which otherwise waits for the autotuning
    # thread to wake (up to an epoch on one core: data.without_autotune), and that wait would count as training time
    train_ds = data.without_autotune(
        train.cache()
        .shuffle(n, seed=seed)
        .map(data.augment, num_parallel_calls=tf.data.AUTOTUNE)
        .map(data.to_float)
        .batch(batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    test_ds = data.without_autotune(test.map(data.to_float).batch(512).cache().prefetch(tf.data.AUTOTUNE))
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
            print(
                f"  {label:>11}  epoch {epoch:>2}/{epochs}  {spent:6.1f} s  "
                f"train loss {history.history['loss'][-1]:.3f}  test accuracy {acc:.1%}",
                flush=True,
            )
    return out


# ----------------------------------------------------------------------------------------------
# keras.RematScope on this Keras and TensorFlow
# ----------------------------------------------------------------------------------------------


def remat_scope_modes() -> list[dict]:
    """Each ``keras.RematScope`` mode on a tiny Dense model: does a gradient run eagerly, in ``tf.function``, in ``fit``?

    Returns one row per mode with "runs" or the exception's type and first line. (On Keras 3.15 / TF 2.20
    only ``"activations"`` runs compiled: keras-team/keras#21207.)
    """

    def first_line(exc: BaseException) -> str:
        import re

        text = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).split())
        for marker in ("The custom_gradient decorator", "object has no attribute"):
            if marker in text:
                text = text[text.index(marker) :]
                break
        return f"{type(exc).__name__}: {text[:110]}"

    rows = []
    for mode, kw in (
        ("activations", {}),
        ("full", {}),
        ("larger_than", {"output_size_threshold": 8}),
        ("list_of_layers", {"layer_names": ["hidden"]}),
    ):
        keras.utils.set_random_seed(0)
        with keras.RematScope(mode=mode, **kw):
            model = keras.Sequential(
                [
                    keras.Input((8,)),
                    keras.layers.Dense(16, activation="gelu", name="hidden"),
                    keras.layers.Dense(4, name="out"),
                ]
            )
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


# ----------------------------------------------------------------------------------------------
# The lesson's claims: claims() turns what the notebook measured into the table
# ----------------------------------------------------------------------------------------------

TECHNIQUES = {  # the block net's switches, one technique each (§1 measures them all, without and with XLA)
    "recompute blocks": {"remat": "blocks"},
    "recompute activations": {"remat": "activations"},
    "few-bit GELU (2 bits)": {"activation": "few_bit", "bits": 2},
    "output-saving LayerNorm": {"norm": "output_saving"},
    "output-saving GELU": {"activation": "output_saving"},
}
BUDGET_GIB = 16  # §6: a TPU v5e chip or a T4 GPU


def largest_batches(peaks: dict, batch: int, budget_gib: float = BUDGET_GIB) -> dict:
    """§6: ``{(technique or "plain", jit): largest batch}`` whose peak fits ``budget_gib`` GiB, from §1's peaks
    (``"plain"`` at B and 2·B fix the part that does not grow with the batch; each technique's own peak at B its
    part per example)."""
    budget = budget_gib * 2**30
    out = {}
    for jit, suffix in ((False, ""), (True, "|xla")):
        out[("plain", jit)], fixed, _ = largest_batch(
            peaks["plain" + suffix].peak_bytes, peaks["plain, 2·B" + suffix].peak_bytes, batch, 2 * batch, budget
        )
        for name in TECHNIQUES:
            per_example = (peaks[name + suffix].peak_bytes - fixed) / batch
            out[(name, jit)] = int((budget - fixed) // per_example) if per_example > 0 else 0
    return out


# §7: optimizers whose state the lesson counts, each with what it keeps per trainable variable
OPTIMIZERS = {
    "SGD": ("keras.optimizers.SGD(0.01)", "nothing"),
    "SGD + momentum": ("keras.optimizers.SGD(0.01, momentum=0.9)", "one momentum per weight"),
    "Lion": ("keras.optimizers.Lion()", "one momentum per weight (its update is a sign)"),
    "Adam": ("keras.optimizers.Adam()", "two moments per weight"),
    "Adafactor": ("keras.optimizers.Adafactor()", "row and column statistics per matrix, and a full-size velocity"),
}


def optimizer_state(**net) -> dict:
    """§7: the bytes of optimizer state Keras keeps for the block net (``block_net(**net)``), per optimizer in
    :data:`OPTIMIZERS`, built on the model's trainable variables (the state exists before the first step). Scalars —
    the step counter, the learning rate — are left out. Also ``factored_bytes``: what Adafactor as published keeps
    (Shazeer & Stern 2018: for an n×m matrix only n + m second-moment statistics, no first moment; a vector in full).

    Returns ``{"parameter_bytes", "factored_bytes", "optimizers": {name: {"bytes", "per_parameter", "keeps"}}}``."""
    model = block_net(**net)
    variables = model.trainable_variables
    parameter_bytes = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables)
    out = {}
    for name, (code, keeps) in OPTIMIZERS.items():
        optimizer = eval(code, {"keras": keras})  # noqa: S307 - the constructors above, shown as code in the table
        optimizer.build(variables)
        state = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in optimizer.variables if len(v.shape))
        out[name] = {"bytes": state, "per_parameter": state / parameter_bytes, "keeps": keeps, "code": code}
    factored = (
        sum(
            (int(np.prod(v.shape[:-1])) + int(np.prod(v.shape[:-2])) * int(v.shape[-1]))
            if len(v.shape) >= 2
            else int(np.prod(v.shape))
            for v in variables
        )
        * 4
    )
    return {"parameter_bytes": parameter_bytes, "factored_bytes": factored, "optimizers": out}


PROFILE_MIN_DEPTH = 4  # §7 profiles a block net this deep at least: at 2 blocks (smoke mode) recomputing saved too
# little to show above the allocator's noise on one core (20.8 vs 20.7 MiB in tensors; at 4 blocks 21-25 vs 40-45)


def profile_net(net: dict) -> dict:
    """§7's block net: ``net`` with at least :data:`PROFILE_MIN_DEPTH` blocks."""
    return dict(net, depth=max(int(net["depth"]), PROFILE_MIN_DEPTH))


def profile_step_memory(log_dir: str, **step_kwargs):
    """§7: TensorBoard's memory profile of one block-net training step (``make_block_net_step(**step_kwargs)``,
    traced and run once first), in this process; read with :func:`course_utils.profiler.read_memory_profile`. The
    profile's files stay in ``log_dir`` (emptied first) for TensorBoard's Profile tab."""
    import shutil

    step = make_block_net_step(**step_kwargs)
    step()  # trace (and compile): the profile shows a step as it runs from then on
    shutil.rmtree(log_dir, ignore_errors=True)
    tf.profiler.experimental.start(log_dir)
    try:
        step()
    finally:
        tf.profiler.experimental.stop()
    return profiler.read_memory_profile(log_dir)


def profiled_steps(folder: str, batch: int, net: dict) -> tuple[dict, str]:
    """§7: the memory profile of a plain and a block-recomputing step (:func:`profile_step_memory`, each in its own
    subfolder of ``folder``), or ``({}, why)`` where no profile can be read: without TensorBoard's profile plugin
    (``tensorboard_plugin_profile``, which Colab's images lack and whose converter needs protobuf >= 6.31) the rest of
    the lesson runs, and the claim says why it is not measured."""
    try:
        return {
            name: profile_step_memory(
                os.path.join(folder, name.replace(" ", "_")), batch=batch, **profile_net(net), **switches
            )
            for name, switches in (("plain", {}), ("recompute blocks", TECHNIQUES["recompute blocks"]))
        }, ""
    except profiler.ProfileError as exc:
        return {}, str(exc)


def _profile_claim(r: dict):
    if r["no_profile"]:
        return CLAIMS.judge("07.peak_is_block_insides", "no memory profile", None, r["no_profile"])
    peaks, wide = r["profile_peaks"], r["wide_share"]
    return CLAIMS.judge(
        "07.peak_is_block_insides",
        f"{wide['plain']:.0%} wide; peak {peaks['recompute blocks'] / 2**20:.1f} vs "
        f"{peaks['plain'] / 2**20:.1f} MiB in tensors",
        wide["plain"] > 0.5 and peaks["recompute blocks"] < peaks["plain"],
    )


def tensor_bytes_at_peak(profile) -> int:
    """The bytes in tensors at a memory profile's peak: the peak less what the allocator held in no tensor then. The
    reserved part moves with everything else the process did before (in a notebook, under one core it ate a 6 MiB
    saving: 34.8 vs 34.6 MiB in all), the tensors' part is the step's own."""
    return profile.peak_bytes - profile.reserved_bytes


def wide_share(profile, width: int, expansion: int = 4) -> float:
    """The share of the bytes alive at the profile's peak in the blocks' wide tensors: a last dimension of
    ``expansion × width`` (the Dense(4·W) output, GELU's output and temporaries, and their gradients)."""

    def wide(entry):
        dims = entry["shape"].strip("[]").split(",")
        return len(dims) > 1 and dims[-1].strip() == str(expansion * width)

    return profile.share(wide)


SYNTHETIC_GELU_EPOCHS = 5  # synthetic images are learned to ~99% within a few epochs: more shows nothing new


def gelu_plan(sizes, source: str, seed: int) -> tuple[list[int], int]:
    """§3's training runs: the seeds (one pair of runs, exact and 2-bit, per seed) and the epochs of each run. Real
    images: ``sizes.gelu_seeds`` seeds of ``sizes.gelu_epochs`` (one run's accuracy moves by a few points from seed to
    seed); synthetic ones are learned to ~99% with little noise, so one seed and at most
    :data:`SYNTHETIC_GELU_EPOCHS` epochs show it."""
    if source == "synthetic":
        return [seed], min(sizes.gelu_epochs, SYNTHETIC_GELU_EPOCHS)
    return [seed + i for i in range(sizes.gelu_seeds)], sizes.gelu_epochs


GELU_GAP_POINTS = 5.0  # 2-bit GELU's accuracy, per seed, at most this many points below exact GELU's


def gelu_claim(seeds, final: dict, last: int, acc_exact: float, acc_fewbit: float, learned: bool):
    """§3's training claim, from one sample per seed: few-bit minus exact accuracy (mean of the last ``last``
    epochs), in points. Holds when every seed is within :data:`GELU_GAP_POINTS`, does not hold when none is,
    inconclusive otherwise. Not "as well as exact": on the real-image dev file (4 seeds, 15 epochs) the course's
    runs measured mean gaps of −1.8 points (seeds from +0.3 to −3.7, exact GELU alone 4.5 points apart) and, on TF
    2.20, −0.9 (−0.3 to −2.6), so a yes/no on "≥ exact − 2" over 2 seeds fails often with nothing wrong."""
    gaps = [(final[("few_bit", s)] - final[("exact", s)]) * 100 for s in seeds]
    claim = CLAIMS.judge_samples(
        "07.few_bit_gelu_accuracy",
        gaps,
        note=f"{acc_fewbit:.1%} vs {acc_exact:.1%} over {len(seeds)} seed(s)",
        last=last,
    )
    if not learned:
        claim.holds, claim.note = None, "the exact runs did not learn here (smoke mode: 2 short epochs)"
    return claim


# Every claim of the lesson, declared once: its words, threshold and the function that measures it (claims.json's
# "where": a report card's row leads to the code). A "speed" or "memory" figure is judged on the accelerator's own
# speed or memory: under a GPU or TPU stand-in a CPU measures it, so one that does not hold there is marked, not failed.
# The least share of the plain step's peak each technique saves, without and with XLA
RECOMPUTE_SAVES, FEW_BIT_SAVES, LAYERNORM_SAVES, CHUNKS_SAVE = 0.15, 0.10, 0.05, 0.10
BATCH_GAIN = 1.1  # the largest batch that fits with a technique, against plain's: above this
CLAIMS = report.LessonClaims(
    "07",
    [
        report.Declared(
            "07.activations_dominate",
            "Activations are most of a training step's memory (estimate)",
            "§1",
            "> 50% of the estimate",
            where="course_utils.memory:estimate_training_memory",
        ),
        report.Declared(
            "07.peak_grows_with_batch",
            "The measured peak grows with the batch at least as fast as the estimated activations",
            "§1",
            "measured / estimated ≥ 1",
            where=make_block_net_step,
            figure="memory",
        ),
        report.Declared(
            "07.remat_scope_list_fails_compiled",
            "keras.RematScope('list_of_layers') fails in a compiled step on the TensorFlow backend",
            "§2; keras#21207",
            "ValueError",
            where=remat_scope_modes,
        ),
        report.Declared(
            "07.recompute_same_gradients",
            "Recomputation gives the same gradients",
            "§2",
            "max |Δ| ≤ 1e-6 × max |gradient|, with and without XLA",
            where=gradient_differences,
        ),
        report.Declared(
            "07.recompute_lowers_peak",
            "Recomputing blocks lowers the peak, without and with XLA",
            "§2",
            "> {threshold:.0%} saved in both",
            where=make_block_net_step,
            figure="memory",
            threshold=RECOMPUTE_SAVES,
        ),
        report.Declared(
            "07.recompute_costs_time",
            "Recomputing blocks costs time",
            "§2",
            "> {threshold}× without XLA",
            where=make_block_net_step,
            figure="speed",
            op=">",
            threshold=1.0,
        ),
        report.Declared(
            "07.few_bit_gelu_gradients",
            "2-bit GELU gradients point where the exact ones do",
            "§3; Novikov et al.",
            "cosine ≥ 0.95",
            where="notebook §3",
        ),
        report.Declared(
            "07.few_bit_gelu_lowers_peak",
            "Few-bit GELU lowers the peak, without and with XLA",
            "§3",
            "> {threshold:.0%} saved in both",
            where=make_block_net_step,
            figure="memory",
            threshold=FEW_BIT_SAVES,
        ),
        report.Declared(
            "07.few_bit_gelu_accuracy",
            f"2-bit GELU trains to within {GELU_GAP_POINTS:g} points of exact GELU (same epochs, each seed)",
            "§3",
            f"every seed > −{GELU_GAP_POINTS:g} points (mean of the last {{last}} epochs)",
            where=train_gelu_cnn,
            op=">",
            threshold=-GELU_GAP_POINTS,
            fmt="+.1f",
            unit=" points",
        ),
        report.Declared(
            "07.output_saving_layernorm_peak",
            "An output-saving LayerNorm lowers the peak where LayerNorm is a large share (Dense + LN stack)",
            "§4; Tempo",
            "> {threshold:.0%} saved without XLA",
            where=make_layer_norm_stack_steps,
            figure="memory",
            op=">",
            threshold=LAYERNORM_SAVES,
            fmt=".0%",
            unit="",
        ),
        report.Declared(
            "07.output_saving_gelu_no_gain",
            "Output-saving GELU does not pay in plain TensorFlow ops",
            "§4",
            "saves less than recomputing the activation (with and without XLA), at > 2× the step time",
            where=make_block_net_step,
            figure="memory",
        ),
        report.Declared(
            "07.chunked_logits_same_loss",
            "Chunked logits give the same loss and gradients",
            "§5",
            "max |Δ| < 1e-5",
            where="notebook §5",
        ),
        report.Declared(
            "07.chunked_logits_lower_peak",
            "Chunked logits lower the peak, without and with XLA",
            "§5",
            "> {threshold:.0%} saved in both",
            where=make_cross_entropy_steps,
            figure="memory",
            threshold=CHUNKS_SAVE,
        ),
        report.Declared(
            "07.larger_batch_fits",
            "Recomputing blocks and few-bit GELU each buy a larger batch, without and with XLA",
            "§6",
            "> {threshold}× plain's",
            where=largest_batches,
            figure="memory",
            threshold=BATCH_GAIN,
        ),
        report.Declared(
            "07.adafactor_state",
            "Keras' Adafactor keeps about as much state as SGD with momentum: half of "
            "Adam's, not the published few percent",
            "§7; keras/src/optimizers/adafactor.py",
            "Adafactor 0.95–1.1× the parameters, Adam 2×; published ≤ 0.1×",
            where=optimizer_state,
        ),
        report.Declared(
            "07.peak_is_block_insides",
            "At a plain step's peak most live bytes are the blocks' wide insides; "
            "recomputing blocks lowers the profiled peak",
            "§7; memory profile",
            "> 50% in 4·W-wide tensors; recompute < plain (bytes in tensors at the peak)",
            where=profile_step_memory,
            figure="memory",
        ),
    ],
)


def claims(r: dict) -> list:
    """Lesson 07's claims from the notebook's results."""
    peaks, estimates, batch = r["peaks"], r["estimates"], r["batch"]
    time_ratios = {
        jit: {name: r["time_ratios"][name + ("|xla" if jit else "")] for name in TECHNIQUES} for jit in (False, True)
    }

    def saved(name, suffix="", table=peaks, base="plain"):
        return 1 - table[name + suffix].peak_bytes / table[base + suffix].peak_bytes

    def both(name, **kwargs):
        return f"{saved(name, **kwargs):.0%} without XLA, {saved(name, '|xla', **kwargs):.0%} with"

    estimate_ratio = ((peaks["plain, 2·B"].peak_bytes - peaks["plain"].peak_bytes) / batch) / (
        estimates[batch].activations / batch
    )
    activation_share = estimates[batch].activations / estimates[batch].total
    compiled = next(m["tf.function"] for m in r["modes"] if m["RematScope mode"] == "list_of_layers")
    diffs, diffs_xla = r["diffs"], r["diffs_xla"]
    scale = diffs["recompute blocks"]["max_ref"]
    seeds, last, final = r["seeds"], r["last"], r["gelu_final"]
    acc_exact = float(np.mean([final[("exact", s)] for s in seeds]))
    acc_fewbit = float(np.mean([final[("few_bit", s)] for s in seeds]))
    learned = acc_exact > 0.3
    ln = dict(table=r["ln_peaks"], base="Keras LayerNorm")
    ln_saved = [
        1 - o / k
        for o, k in zip(
            r["ln_peaks"]["output-saving"].samples or [r["ln_peaks"]["output-saving"].peak_bytes],
            r["ln_peaks"]["Keras LayerNorm"].samples or [r["ln_peaks"]["Keras LayerNorm"].peak_bytes],
        )
    ]
    ce = dict(table=r["ce_peaks"], base="whole logits")
    largest = largest_batches(peaks, batch)
    bigger = ("recompute blocks", "few-bit GELU (2 bits)")
    state = r["optimizer_state"]["optimizers"]
    factored = r["optimizer_state"]["factored_bytes"] / r["optimizer_state"]["parameter_bytes"]
    return CLAIMS.all(
        [
            CLAIMS.judge("07.activations_dominate", f"{activation_share:.0%}", activation_share > 0.5),
            CLAIMS.judge("07.peak_grows_with_batch", f"{estimate_ratio:.2f}×", estimate_ratio >= 1.0),
            CLAIMS.judge(
                "07.remat_scope_list_fails_compiled",
                compiled[:40] + ("…" if len(compiled) > 40 else ""),
                compiled != "runs",
            ),
            CLAIMS.judge(
                "07.recompute_same_gradients",
                f"{diffs['recompute blocks']['max_abs'] / scale:.0e} / "
                f"{diffs_xla['recompute blocks']['max_abs'] / scale:.0e}",
                max(diffs["recompute blocks"]["max_abs"], diffs_xla["recompute blocks"]["max_abs"]) <= 1e-6 * scale,
            ),
            CLAIMS.judge(
                "07.recompute_lowers_peak",
                both("recompute blocks"),
                min(saved("recompute blocks"), saved("recompute blocks", "|xla")) > RECOMPUTE_SAVES,
            ),
            CLAIMS.judge_samples("07.recompute_costs_time", time_ratios[False]["recompute blocks"]),
            CLAIMS.judge("07.few_bit_gelu_gradients", f"{r['fidelity'][2]:.4f}", r["fidelity"][2] >= 0.95),
            CLAIMS.judge(
                "07.few_bit_gelu_lowers_peak",
                both("few-bit GELU (2 bits)"),
                min(saved("few-bit GELU (2 bits)"), saved("few-bit GELU (2 bits)", "|xla")) > FEW_BIT_SAVES,
            ),
            gelu_claim(seeds, final, last, acc_exact, acc_fewbit, learned),
            CLAIMS.judge_samples(
                "07.output_saving_layernorm_peak",
                ln_saved,
                note=f"{len(ln_saved)} readings from fresh processes; with XLA: "
                f"{saved('output-saving', '|xla', **ln):.0%}",
            ),
            CLAIMS.judge(
                "07.output_saving_gelu_no_gain",
                f"{both('output-saving GELU')} (recompute activation: {both('recompute activations')}); "
                f"{time_ratios[False]['output-saving GELU'].median:.1f}× the time",
                all(saved("output-saving GELU", s) < saved("recompute activations", s) for s in ("", "|xla"))
                and time_ratios[False]["output-saving GELU"].median > 2,
            ),
            CLAIMS.judge("07.chunked_logits_same_loss", f"{r['chunk_diff']:.1e}", r["chunk_diff"] < 1e-5),
            CLAIMS.judge(
                "07.chunked_logits_lower_peak",
                both("4 chunks", **ce),
                min(saved("4 chunks", **ce), saved("4 chunks", "|xla", **ce)) > CHUNKS_SAVE,
            ),
            CLAIMS.judge(
                "07.larger_batch_fits",
                "; ".join(
                    f"{n.split(' (')[0]}: {largest[(n, False)] / largest[('plain', False)]:.2f}× / "
                    f"{largest[(n, True)] / largest[('plain', True)]:.2f}×"
                    for n in bigger
                ),
                all(largest[(n, j)] > BATCH_GAIN * largest[("plain", j)] for n in bigger for j in (False, True)),
            ),
            CLAIMS.judge(
                "07.adafactor_state",
                f"Adafactor {state['Adafactor']['per_parameter']:.2f}×, Adam {state['Adam']['per_parameter']:.2f}×,"
                f" SGD + momentum {state['SGD + momentum']['per_parameter']:.2f}×; published {factored:.2f}×",
                0.95 <= state["Adafactor"]["per_parameter"] <= 1.1
                and abs(state["Adam"]["per_parameter"] - 2) < 0.01
                and factored <= 0.1,
            ),
            _profile_claim(r),
        ]
    )
