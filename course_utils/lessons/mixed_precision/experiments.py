"""Lesson 03's experiments (mixed precision): what a 16-bit softmax really does to Keras' cross-entropy,
and the training step whose time and peak memory are compared between float32 and a mixed policy.

The reusable tools they use (peak memory in a fresh process, the recommended policy, timing) are in
:mod:`course_utils.memory` and :mod:`course_utils.timing`.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from ... import accumulation, data, memory, models, report, runtime, standin_strategies


def confident_logits(rows: int = 4096, num_classes: int = 10, boost: float = 8.0, sigma: float = 3.0, seed: int = 0):
    """``(logits, labels)`` shaped like a confident classifier's output: normal logits (σ = ``sigma``) plus
    ``boost`` on class 0, which is the label of every row. float32 numpy arrays (labels int64)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, sigma, size=(rows, num_classes)).astype(np.float32)
    logits[:, 0] += boost
    return logits, np.zeros(rows, np.int64)


def cross_entropy(logits, labels, logits_dtype: str = "float32", softmax_dtype: str | None = "float32") -> dict:
    """Keras' ``SparseCategoricalCrossentropy`` per example, and its gradient w.r.t. the float32 logits.

    The logits are first rounded to ``logits_dtype`` (what a mixed model's last Dense layer outputs),
    then passed through ``keras.activations.softmax`` computed in ``softmax_dtype`` (a layer's compute
    dtype) and into the loss with ``from_logits=False`` — or, with ``softmax_dtype=None``, straight into
    the loss with ``from_logits=True``. Returns numpy arrays: ``loss`` (per example), ``grad`` (rows × classes,
    float32) and ``probs`` (the softmax output as float32; the softmax of the logits when ``from_logits``).
    """
    z = tf.Variable(tf.constant(logits, tf.float32))
    with tf.GradientTape() as tape:
        rounded = tf.cast(z, logits_dtype)
        if softmax_dtype is None:
            out = rounded
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)(labels, out)
            probs = tf.nn.softmax(tf.cast(rounded, tf.float32))
        else:
            out = keras.activations.softmax(tf.cast(rounded, softmax_dtype))
            loss = keras.losses.SparseCategoricalCrossentropy(reduction=None)(labels, out)
            probs = tf.cast(out, tf.float32)
    grad = tape.gradient(loss, z)
    return {"loss": loss.numpy(), "grad": grad.numpy(), "probs": probs.numpy()}


def relative_error(value, reference, axis=None):
    """|value − reference| / |reference|, per row when ``axis`` is given (L1 over that axis)."""
    value, reference = np.asarray(value, np.float64), np.asarray(reference, np.float64)
    if axis is None:
        return np.abs(value - reference) / np.abs(reference)
    return np.abs(value - reference).sum(axis) / np.abs(reference).sum(axis)


def training_step(
    policy: str,
    width: int = 32,
    batch: int = 256,
    num_classes: int = 10,
    jit: bool = False,
    seed: int = 0,
    strategy: Any = None,
):
    """One training step (forward, backward, Adam update) of the course's ``small_cnn`` built under ``policy``, on a
    fixed global batch of ``batch`` synthetic CIFAR-shaped images, as a zero-argument callable returning the loss.
    Under ``mixed_float16`` the optimizer is a ``LossScaleOptimizer``. A step for
    :func:`course_utils.memory.measure_peaks_isolated` and for timing.

    ``strategy`` (default: the current one) is a real data-parallel step: each replica gets its share of the batch,
    placed on its device, and divides its summed loss by the *global* batch (``tf.nn.compute_average_loss``), so the
    all-reduced gradients are those of the mean loss over ``batch`` examples. ``jit``: XLA, as the course compiles
    under a strategy (:func:`course_utils.runtime.whole_step_compiles`): the whole step on a TPU or one replica; under
    ``MirroredStrategy`` with several replicas each replica's forward and backward pass
    (:func:`course_utils.runtime.replica_gradients`), the all-reduce and update outside XLA (one XLA cluster over
    ``strategy.run`` cannot reach the other replicas' variables: keras-team/keras#19005). ``step.xla`` says which
    (``"none"`` without ``jit``); ``step.model`` and ``step.optimizer`` are the model and its optimizer."""
    import contextlib

    strategy = strategy or tf.distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    x, y = data.synthetic_cifar(batch, 1, num_classes=num_classes, seed=seed)[0]
    model = models.build_under_policy(policy, strategy=strategy, width=width, num_classes=num_classes)
    with strategy.scope():
        optimizer = keras.optimizers.Adam(1e-3)
        if policy == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)  # per example: averaged over the global batch
    try:
        devices = strategy.extended.worker_devices
    except RuntimeError:  # the default strategy (no scope entered): one device, TensorFlow's choice
        devices = None
    bounds = [round(i * batch / replicas) for i in range(replicas + 1)]  # each replica's share (as even as it gets)

    def shard(ctx):
        i = ctx.replica_id_in_sync_group
        with tf.device(devices[i]) if devices else contextlib.nullcontext():  # on its device: not copied every step
            share = slice(bounds[i], bounds[i + 1])
            return tf.identity(tf.constant(x[share])), tf.identity(tf.constant(y[share]))

    inputs = strategy.experimental_distribute_values_from_function(shard)

    def gradients(x, y):
        with tf.GradientTape() as tape:
            per_example = tf.cast(loss_fn(y, model(x, training=True)), tf.float32)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch)
            scaled = optimizer.scale_loss(loss)  # × the loss scale under mixed_float16, unchanged otherwise
        return tape.gradient(scaled, model.trainable_variables), loss

    tpu = standin_strategies.is_tpu_strategy(strategy)
    if runtime.whole_step_compiles("TPU" if tpu else "", replicas):

        def replica_step(x, y):
            grads, loss = gradients(x, y)
            optimizer.apply(grads, model.trainable_variables)  # all-reduces (SUM) across replicas, then updates
            return loss

        def whole_step(inputs):
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=inputs), axis=None)

        # on a TPU, TPUStrategy compiles the whole step for the TPU itself: jit_compile=True around strategy.run would
        # ask XLA to compile it for the TPU VM's host (course_utils.standin.RUN_UNDER_XLA)
        compiled = tf.function(whole_step, jit_compile=jit and not tpu)
        where = "the whole step" if jit or tpu else "none"
    else:
        replica_gradients = runtime.replica_gradients(gradients, jit)

        def replica_grads(x, y):  # a plain function around the compiled one: strategy.run would lift a tf.function
            return replica_gradients(x, y)  # passed to it over every replica (one XLA cluster again: mirrored_run.py)

        def split_step(inputs):
            grads, loss = strategy.run(replica_grads, args=inputs)
            # LossScaleOptimizer: the finite-or-skip decision taken once, across replicas (lesson 05 §6)
            applied = accumulation.apply_per_replica_gradients(strategy, optimizer, grads, model.trainable_variables)
            with tf.control_dependencies([applied]):
                return strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)

        compiled = tf.function(split_step)
        where = "each replica's forward and backward pass, the update outside" if jit else "none"

    def step():
        return compiled(inputs)

    step.model, step.optimizer, step.xla = model, optimizer, where
    return step


def training_step_peaks(strategy, policies, repeats: int = 3, batch: int = 256, **kwargs) -> dict:
    """Peak memory of :func:`training_step` per policy, each in isolation
    (:func:`course_utils.memory.measure_peaks_isolated`), with ``batch`` examples on the measured device: in a fresh
    process on one device on a CPU; in this process on a TPU or GPU (which belongs to this process), under
    ``strategy``, whose global batch is then ``batch`` × its replicas, so that replica 0's device, the one measured,
    holds ``batch``. ``kwargs``: the step's other sizes."""
    fresh = not memory.in_process()
    where = {} if fresh else {"strategy": strategy, "batch": batch * strategy.num_replicas_in_sync}
    variants = {p: {**kwargs, "policy": p, "batch": batch, **where} for p in policies}
    return memory.measure_peaks_isolated(training_step, variants, repeats=repeats, fresh_process=fresh)


# ----------------------------------------------------------------------------------------------
# The lesson's claims: claims() turns what the notebook measured into the table
# ----------------------------------------------------------------------------------------------


def variant_stats(result: dict, reference: dict) -> dict:
    """§2's figures for one :func:`cross_entropy` result against the float32 reference: the share of rows whose
    p₀ is exactly 1.0, rows with an all-zero gradient, the loss's median and largest relative error, the
    gradient's median error, distinct confidences above 0.99 (and how many rows are that confident), and the
    largest |row sum − 1|."""
    p = result["probs"]
    top = p.max(axis=1)
    return dict(
        ones=float(np.mean(p[:, 0] == 1.0)),
        zero_grad=int(np.sum(np.all(result["grad"] == 0, axis=1))),
        loss_med=float(np.median(relative_error(result["loss"], reference["loss"]))),
        loss_max=float(np.max(relative_error(result["loss"], reference["loss"]))),
        grad_med=float(np.median(relative_error(result["grad"], reference["grad"], axis=1))),
        distinct=len(np.unique(top[top > 0.99])),
        confident=int(np.sum(top > 0.99)),
        sum_err=float(np.max(np.abs(p.sum(axis=1) - 1))),
    )


def model_losses(mixed_model, num_classes: int, seed: int) -> tuple[dict, str]:
    """§2: ``small_cnn`` under mixed_bfloat16 on 64 fixed images — the loss of its float32 softmax output and the
    ``from_logits=True`` loss of its bfloat16 logits, in eager mode, in a ``tf.function`` and under XLA
    (``{how: (softmax-output loss, from-logits loss)}``), and the logits' dtype."""
    logits_model = keras.Model(mixed_model.inputs, mixed_model.layers[-2].output)  # up to the bfloat16 logits
    x_few = tf.constant(np.random.default_rng(seed).integers(0, 256, (64, 32, 32, 3)), tf.uint8)
    y_few = tf.constant(np.arange(64) % num_classes)
    probs_loss = keras.losses.SparseCategoricalCrossentropy()
    logits_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def both_losses():
        return probs_loss(y_few, mixed_model(x_few)), logits_loss(y_few, logits_model(x_few))

    with tf.device(memory.default_device()):  # XLA on the accelerator: on a TPU VM, never compiled for the host
        losses = {
            "eager": both_losses(),
            "tf.function": tf.function(both_losses)(),
            "XLA": tf.function(both_losses, jit_compile=True)(),
        }
    return losses, str(logits_model.output.dtype)


COMPILE_CASES = (
    "mixed_float16 per layer",
    "clone of a mixed_float16 model",
    "mixed_float16, given a LossScaleOptimizer",
)


def optimizer_name(optimizer) -> str:
    """``"Adam"``, or ``"LossScaleOptimizer(Adam)"`` for a wrapper (its inner optimizer in brackets)."""
    inner = getattr(optimizer, "inner_optimizer", None)
    return type(optimizer).__name__ + (f"({optimizer_name(inner)})" if inner is not None else "")


def tiny_dense(build, policy: str):
    """§3: a ``Dense(64)`` on 64 inputs under ``policy`` (``build(policy, make)``: in the strategy's scope), the same
    initial weights every time."""
    return build(
        policy,
        lambda: keras.Sequential(
            [keras.Input((64,)), keras.layers.Dense(64, kernel_initializer=keras.initializers.GlorotUniform(seed=1))]
        ),
    )


def small_gradient_data(seed: int):
    """§3: 256 fixed inputs and targets for :func:`small_loss`."""
    rng = np.random.default_rng(seed)
    return (
        tf.constant(rng.normal(size=(256, 64)).astype(np.float32)),
        tf.constant(rng.normal(0, 0.1, size=(256, 64)).astype(np.float32)),
    )


def small_loss(y, pred):
    """§3: a loss whose gradients are tiny (weighted by 10⁻⁵, standing in for what deep layers receive)."""
    return 1e-5 * tf.reduce_mean(tf.square(tf.cast(pred, tf.float32) - y))


def kernel_gradient(model, x, y, optimizer=None):
    """§3: the gradient of :func:`small_loss` w.r.t. the Dense kernel — of the loss scaled by ``optimizer`` (a
    ``LossScaleOptimizer``) when given, then unscaled — as float32 NumPy, and all the gradients as computed."""
    with tf.GradientTape() as tape:
        loss = small_loss(y, model(x))
        target = optimizer.scale_loss(loss) if optimizer else loss
    grads = tape.gradient(target, model.trainable_variables)
    scale = (
        float(optimizer.dynamic_scale.numpy()) if optimizer else 1.0
    )  # .numpy(): float() fails on a MirroredVariable
    return grads[0].numpy() / scale, grads


def output_gradient(model, x, y, scale: float = 1.0):
    """§3: the gradient of ``scale`` × :func:`small_loss` w.r.t. the layer's output tensor (float16 under
    mixed_float16): the first gradient the backward pass computes."""
    with tf.GradientTape() as tape:
        pred = model(x)
        tape.watch(pred)
        loss = scale * small_loss(y, pred)
    return tape.gradient(loss, pred)


# Every claim of the lesson, declared once: its words, threshold and the function that measures it (claims.json's
# "where": a report card's row leads to the code). A "speed" or "memory" figure is judged on the accelerator's own
# speed or memory: under a GPU or TPU stand-in a CPU measures it, so one that does not hold there is marked, not failed.
PEAK_RATIO = 0.95  # a mixed policy's step peak against float32's: below this, lower
CLAIMS = report.LessonClaims(
    "03",
    [
        report.Declared(
            "03.mixed_policy_dtypes",
            "Under a mixed policy layers compute in 16 bits and keep float32 variables",
            "Keras mixed precision guide; §1",
            "compute bfloat16, variables float32",
            where="course_utils.models:build_under_policy",
        ),  # the layers' dtypes, set as it builds
        report.Declared(
            "03.saturated_probability_harmless",
            "A bfloat16 probability of exactly 1.0 does not make Keras' loss or gradient 0 (it clips to "
            "[1e-7, 1 − 1e-7] and renormalises); a gradient vanishes only where the float32 loss is < 1e-6",
            "Keras 3 nn.py sparse_categorical_crossentropy; §2",
            "rows with p₀ = 1.0: loss > 0, < 1% with zero gradient; those rows' float32 loss < 1e-6",
            where="notebook §2",
        ),
        report.Declared(
            "03.bfloat16_softmax_coarse",
            "A bfloat16 softmax's probabilities are coarse: few distinct "
            "confidences above 0.99, rows off 1 by up to ~1%",
            "bfloat16 format (steps of 2⁻⁸ below 1); §2",
            "≤ 4 distinct values; |sum − 1| > 0.1%",
            where="notebook §2",
        ),
        report.Declared(
            "03.loss_uses_logits",
            "Keras' loss uses a float32 softmax output's logits (= from_logits=True); "
            "a cast bfloat16 output goes through clip-and-log",
            "Keras 3 nn.py _get_logits; §2",
            "equal losses (table and model, eager/graph/XLA); bfloat16 softmax's largest error > 5× the other's",
            where=model_losses,
        ),
        report.Declared(
            "03.loss_error_from_bfloat16_logits",
            "The typical loss error comes from the bfloat16 logits: a float32 softmax does not lower it much",
            "§2",
            "median error with float32 softmax ≥ 0.5 × with bfloat16 softmax",
            where="notebook §2",
        ),
        report.Declared(
            "03.compile_wraps_loss_scale_optimizer",
            "compile wraps the optimizer in a LossScaleOptimizer only for a model constructed under the "
            "global mixed_float16 policy — not for mixed_float16 set per layer or a clone made under "
            "float32 — and never wraps one twice",
            "Keras 3 Trainer.compile; §3",
            "mixed_float16: LossScaleOptimizer(Adam), given one: the same; every other case: Adam",
            where="notebook §3",
        ),
        report.Declared(
            "03.float16_gradients_underflow",
            "Small float16 gradients underflow to 0 without loss scaling; scaled, they match float32",
            "§3",
            "100% zeros → 0% zeros, error < 5%",
            where=kernel_gradient,
        ),
        report.Declared(
            "03.underflow_at_layer_output",
            "Without loss scaling the float16 gradient at the layer output underflows to 0",
            "§3",
            "100% zeros",
            where=output_gradient,
        ),
        report.Declared(
            "03.apply_gradients_in_keras3",
            "apply_gradients still exists in Keras 3, and on a LossScaleOptimizer it unscales like apply",
            "Keras 3 base_optimizer.py; §3",
            "both updates 0.5",
            where="notebook §3",
        ),
        report.Declared(
            "03.policy_halves_activations",
            "{policy} halves the activation bytes and leaves weights, gradients and Adam state unchanged",
            "Keras mixed precision guide; §4 (counted)",
            "activations ≈ 0.5× (< 0.6×); state equal",
            where="course_utils.memory:estimate_training_memory",
        ),
        report.Declared(
            "03.policy_lowers_step_peak",
            "{policy} lowers the peak memory of a training step (measured in isolation)",
            "§4",
            "< {threshold}× without XLA and on a TPU; ≈ 1× with XLA on a CPU",
            where=training_step_peaks,
            figure="memory",
            op="<",
            threshold=PEAK_RATIO,
        ),
        report.Declared(
            "03.policy_faster_on_accelerator",
            "{policy} trains faster than float32 on a GPU with 16-bit tensor cores (a TPU: from halved memory "
            "traffic); slower on a CPU without bf16 instructions",
            "Cloud TPU bfloat16 / NVIDIA mixed-precision docs; §4",
            "GPU (Ampere+): > 1×, often 1.5–3×; TPU: ≥ 1×; CPU without bf16: < 1×; CPU under XLA: "
            "about 1× (tested at > {threshold}×)",
            where=training_step,
            figure="speed",
            op=">",
            threshold=report.NOTICEABLE_GAIN,
            prose="more than {threshold}×",
        ),
        report.Declared(
            "03.mixed_float16_slow_on_cpu",
            "mixed_float16 on a CPU is much slower than float32",
            "TensorFlow CPU kernels (oneDNN): no fast float16 convolution gradients; §4",
            "many times slower",
            figure="speed",
        ),  # not run on purpose
    ],
)


def claims(r: dict) -> list:
    """Lesson 03's claims from the notebook's results."""
    mixed_policy, peaks = r["mixed_policy"], r["peaks"]
    bf, f32_out = r["stats"]["bfloat16 softmax"], r["stats"]["bfloat16 logits, float32 softmax"]
    xla = "with XLA" if r["jit"] else "without XLA"
    step_xla = r["step_xla"]  # what XLA compiled of the timed step ("none" without XLA)
    speed_xla = xla if step_xla == "none" else f"{xla}: {step_xla}"
    on_accelerator = r["kind"] in ("TPU", "GPU", "multi-GPU")
    cpu_why = (
        "XLA on this CPU computes the bfloat16 convolutions in float32, plus the casts: about 1×, not the "
        f"{report.NOTICEABLE_GAIN}× a gain needs"
        if r["xla_upcasts"]
        else "CPUs without bfloat16 units (no avx512_bf16/AMX flag) convert to and from bfloat16 in software"
        if r["cpu_bf16"] is False
        else "oneDNN's bfloat16 kernels on this CPU do not beat float32 for this small model"
    )
    speed_differs = (
        ""
        if on_accelerator
        else (
            f"{cpu_why}; expect > 1× on an Ampere+ GPU (16-bit tensor cores) and "
            "≥ 1× on a TPU (half the memory traffic)"
        )
    )
    hidden = r["hidden_dtypes"]
    updates, wrapped = r["updates"], r["wrapped"]
    equal_losses = r["same_as_logits"] and r["model_uses_logits"]

    if peaks["float32"].peak_bytes > 0:
        peak_ratio = [
            m / max(1, f)
            for m, f in zip(
                peaks[mixed_policy].samples or [peaks[mixed_policy].peak_bytes],
                peaks["float32"].samples or [peaks["float32"].peak_bytes],
            )
        ]
        peak_claim = CLAIMS.judge_samples(
            "03.policy_lowers_step_peak",
            peak_ratio,
            note=f"{xla}; batch {r['mem_batch']}; {peaks['float32'].method}",
            differs_here=(
                "XLA's CPU backend computes bfloat16 convolutions in float32 (lesson 02); expect < 1× on a "
                "TPU, which computes in bfloat16 in hardware"
            )
            if r["xla_upcasts"]
            else "",
            policy=mixed_policy,
        )
    else:  # no peak to read here: not measurable, never a pass
        peak_claim = CLAIMS.judge(
            "03.policy_lowers_step_peak", "—", None, note="this runtime reports no peak memory", policy=mixed_policy
        )

    return CLAIMS.all(
        [
            CLAIMS.judge(
                "03.mixed_policy_dtypes",
                f"hidden layers: compute {hidden[0][0]}, variables {hidden[0][1]}",
                all(c == "bfloat16" and v == "float32" for c, v in hidden),
            ),
            CLAIMS.judge(
                "03.saturated_probability_harmless",
                f"p₀ = 1.0 in {bf['ones']:.1%} of rows; smallest loss {r['loss_at_one_min']:.1e}; "
                f"zero gradient: {r['zero_rows']} rows ({r['zero_at_one']:.2%}), "
                f"float32 loss ≤ {r['zero_ref_loss']:.1e}",
                bool(
                    bf["ones"] > 0
                    and r["loss_at_one_min"] > 0
                    and r["zero_at_one"] < 0.01
                    and r["zero_ref_loss"] < 1e-6
                ),
            ),
            CLAIMS.judge(
                "03.bfloat16_softmax_coarse",
                f"{bf['distinct']} distinct (float32 softmax: {f32_out['distinct']}); |sum − 1| up to "
                f"{bf['sum_err']:.4f}",
                bf["distinct"] <= 4 < f32_out["distinct"] and bf["sum_err"] > 1e-3,
            ),
            CLAIMS.judge(
                "03.loss_uses_logits",
                f"equal: {equal_losses}; largest loss error {bf['loss_max']:.0%} vs {f32_out['loss_max']:.0%}",
                equal_losses and bf["loss_max"] > 5 * f32_out["loss_max"],
            ),
            CLAIMS.judge(
                "03.loss_error_from_bfloat16_logits",
                f"median {f32_out['loss_med']:.2%} vs {bf['loss_med']:.2%}",
                f32_out["loss_med"] >= 0.5 * bf["loss_med"],
            ),
            CLAIMS.judge(
                "03.compile_wraps_loss_scale_optimizer",
                ", ".join(f"{p}: {o}" for p, o in wrapped.items()),
                wrapped
                == {
                    "float32": "Adam",
                    "mixed_bfloat16": "Adam",
                    "mixed_float16": "LossScaleOptimizer(Adam)",
                    COMPILE_CASES[0]: "Adam",
                    COMPILE_CASES[1]: "Adam",
                    COMPILE_CASES[2]: "LossScaleOptimizer(Adam)",
                },
            ),
            CLAIMS.judge(
                "03.float16_gradients_underflow",
                f"{r['zero_unscaled']:.0%} zeros → {r['zero_scaled']:.0%} zeros, error {r['scaled_err']:.2%}",
                r["zero_unscaled"] == 1.0 and r["zero_scaled"] == 0.0 and r["scaled_err"] < 0.05,
            ),
            CLAIMS.judge(
                "03.underflow_at_layer_output",
                f"{r['upstream_zero']:.0%} zeros (float32 median |g| {r['up32_median']:.0e})",
                r["upstream_zero"] == 1.0,
            ),
            CLAIMS.judge(
                "03.apply_gradients_in_keras3",
                ", ".join(f"{k}: {v:g}" for k, v in updates.items()),
                updates["apply"] == updates["apply_gradients"] == 0.5,
            ),
            CLAIMS.judge(
                "03.policy_halves_activations",
                f"activations {r['act_ratio']:.2f}×; state {'equal' if r['state_equal'] else 'differs'}",
                r["act_ratio"] < 0.6 and r["state_equal"],
                policy=mixed_policy,
            ),
            peak_claim,
            CLAIMS.judge_samples(
                "03.policy_faster_on_accelerator",
                r["speedup"],
                note=f"{speed_xla}; batch {r['time_batch']}; bf16 instructions: {r['cpu_bf16']}",
                differs_here=speed_differs,
                threshold=report.NOTICEABLE_GAIN if r["xla_upcasts"] else 1.0,
                policy=mixed_policy,
            ),
            CLAIMS.judge(
                "03.mixed_float16_slow_on_cpu",
                "not run on purpose",
                None,
                "not measured here (authors' 2-core CPU: ~40×)",
            ),
        ]
    )
