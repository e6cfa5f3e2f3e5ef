"""Lesson 05's experiments: gradient accumulation against the big batch, the averaging bugs, and the
caveats (BatchNorm, schedule units, float16 loss scaling). Each returns a small JSON-able dict, so it
can run in a fresh process with N CPU replicas (``runtime.run_with_replicas(4, strategy, fn, ...)``).
The tools themselves are in :mod:`course_utils.accumulation`."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from ...accumulation import GradientAccumulator, distributed_train_step
from ... import accumulation, data, memory, models, report, standin_strategies
from ... import runtime as _runtime


def _accumulating_model():
    return accumulation.AccumulatingModel


# ----------------------------------------------------------------------------------------------
# Small helpers for comparisons
# ----------------------------------------------------------------------------------------------


def max_abs_diff(weights_a, weights_b) -> float:
    """Largest |a - b| over two lists of weight arrays (``model.get_weights()``)."""
    if len(weights_a) != len(weights_b):
        raise ValueError(f"different numbers of weights: {len(weights_a)} vs {len(weights_b)}")
    return max(
        float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))) if np.size(a) else 0.0
        for a, b in zip(weights_a, weights_b)
    )


def tiny_classifier(features: int = 8, hidden: int = 16, classes: int = 3, seed: int = 0, batch_norm: bool = False):
    """A small MLP with float32 logits (build it in ``strategy.scope()``); deterministic weights."""
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((features,)), keras.layers.Dense(hidden, activation="relu")]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    layers += [keras.layers.Dense(classes), keras.layers.Activation("linear", dtype="float32")]
    return keras.Sequential(layers)


def toy_data(n: int, features: int = 8, classes: int = 3, seed: int = 0):
    """``n`` examples for :func:`tiny_classifier`: float32 features, int64 labels (learnable, noisy)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype("float32")
    y = (np.argmax(x[:, :classes] + 0.5 * rng.normal(size=(n, classes)), axis=1)).astype("int64")
    return x, y


def compare_with_big_batch(
    strategy,
    steps: int,
    micro_batch: int = 8,
    updates: int = 3,
    paths: tuple[str, ...] = ("fit", "loop"),
    policy: str = "float32",
    learning_rate: float = 0.1,
    seed: int = 0,
) -> dict:
    """Train a tiny model with plain SGD on big batches of ``steps × micro_batch`` per replica, and
    copies of it (same initial weights, same examples in the same order) accumulating ``steps``
    micro-batches of ``micro_batch`` per replica through each of ``paths``: ``"fit"`` =
    :class:`AccumulatingModel` with ``fit``, ``"loop"`` = :class:`GradientAccumulator` in a custom loop.

    Returns ``{"max_abs_diff": {path: float}, "updates_acc": {path: int}, "updates_big", "micro_steps",
    "moved" (largest weight change of the big-batch run), "replicas", "steps", "policy"}``.
    """
    unknown = [p for p in paths if p not in ("fit", "loop")]
    if unknown:
        raise ValueError(f"paths must be 'fit' and/or 'loop', got {unknown}")
    replicas = strategy.num_replicas_in_sync
    global_micro = micro_batch * replicas
    big = steps * global_micro
    x, y = toy_data(big * updates, seed=seed)
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    result = {
        "max_abs_diff": {},
        "updates_acc": {},
        "replicas": replicas,
        "steps": steps,
        "policy": policy,
        "micro_steps": len(x) // global_micro,
    }
    try:
        with strategy.scope():
            reference = tiny_classifier(seed=seed)
            reference.compile(optimizer=keras.optimizers.SGD(learning_rate), loss=loss)
        initial = reference.get_weights()
        reference.fit(x, y, batch_size=big, shuffle=False, epochs=1, verbose=0)
        result["updates_big"] = int(reference.optimizer.iterations.numpy())
        result["moved"] = max_abs_diff(initial, reference.get_weights())
        for path in paths:
            with strategy.scope():
                model = tiny_classifier(seed=seed)
                model.set_weights(initial)
                optimizer = keras.optimizers.SGD(learning_rate)
                if path == "fit":
                    wrapped = _accumulating_model()(model, steps=steps)
                    wrapped.compile(optimizer=optimizer, loss=loss)
            if path == "fit":
                wrapped.fit(x, y, batch_size=big, shuffle=False, epochs=1, verbose=0)
            else:
                ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_micro, drop_remainder=True)
                dist = strategy.experimental_distribute_dataset(ds)
                with strategy.scope():
                    acc = GradientAccumulator(
                        model,
                        optimizer,
                        per_example,
                        steps=steps,
                        global_micro_batch=global_micro,
                        strategy=strategy,
                        element_spec=dist.element_spec,
                    )
                acc.train(dist)
            result["max_abs_diff"][path] = max_abs_diff(reference.get_weights(), model.get_weights())
            result["updates_acc"][path] = int(optimizer.iterations.numpy())
        return result
    finally:
        keras.mixed_precision.set_global_policy(previous)


# ----------------------------------------------------------------------------------------------
# Measurements the lesson shows (each returns a small JSON-able dict)
# ----------------------------------------------------------------------------------------------


def loss_averaging_effect(strategy, per_replica_batch: int = 8, learning_rate: float = 0.1, seed: int = 0) -> dict:
    """One custom-loop step with the right loss (``compute_average_loss`` over the global batch) and
    one with ``reduce_mean`` per replica, from the same weights; compares both with one step of
    ``fit`` (which averages correctly). ``update_ratio`` = |wrong update| / |right update|."""
    replicas = strategy.num_replicas_in_sync
    global_batch = per_replica_batch * replicas
    x, y = toy_data(global_batch, seed=seed)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch, drop_remainder=True)
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    with strategy.scope():
        reference = tiny_classifier(seed=seed)
        reference.compile(
            optimizer=keras.optimizers.SGD(learning_rate),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    initial = reference.get_weights()
    reference.fit(x, y, batch_size=global_batch, shuffle=False, verbose=0)
    out = {"replicas": replicas, "global_batch": global_batch}
    for label, wrong in (("right", False), ("wrong", True)):
        with strategy.scope():
            model = tiny_classifier(seed=seed)
            model.set_weights(initial)
            optimizer = keras.optimizers.SGD(learning_rate)
        dist = strategy.experimental_distribute_dataset(ds)
        step = distributed_train_step(
            strategy,
            model,
            optimizer,
            per_example,
            global_batch,
            element_spec=dist.element_spec,
            per_replica_mean=wrong,
        )
        out[f"loss_{label}"] = float(step(next(iter(dist))))
        delta = np.concatenate([(a - b).ravel() for a, b in zip(model.get_weights(), initial)])
        out[f"update_{label}"] = float(np.abs(delta).max())
        out[f"diff_vs_fit_{label}"] = max_abs_diff(model.get_weights(), reference.get_weights())
    out["update_ratio"] = out["update_wrong"] / out["update_right"]
    return out


def builtin_accumulation(
    strategy=None, steps: int = 4, micro_batch: int = 8, updates: int = 2, learning_rate: float = 0.1, seed: int = 0
) -> dict:
    """Keras' own ``SGD(gradient_accumulation_steps=steps)`` against big batches, under ``strategy``
    (``None``: no strategy). Returns the weight difference and both iteration counters, or the error."""
    strategy = strategy or __import__("tensorflow").distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    big = steps * micro_batch * replicas
    x, y = toy_data(big * updates, seed=seed)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with strategy.scope():
        reference = tiny_classifier(seed=seed)
        reference.compile(optimizer=keras.optimizers.SGD(learning_rate), loss=loss)
        model = tiny_classifier(seed=seed)
        model.set_weights(reference.get_weights())
        optimizer = keras.optimizers.SGD(learning_rate, gradient_accumulation_steps=steps)
        model.compile(optimizer=optimizer, loss=loss)
    model.fit(x, y, batch_size=micro_batch * replicas, shuffle=False, verbose=0)  # raises under a strategy
    reference.fit(x, y, batch_size=big, shuffle=False, verbose=0)
    return {
        "max_abs_diff": max_abs_diff(reference.get_weights(), model.get_weights()),
        "iterations": int(optimizer.iterations.numpy()),  # updates
        "micro_step_counter": int(optimizer._iterations.numpy()),  # what its LR schedule sees
        "updates_big": int(reference.optimizer.iterations.numpy()),
    }


def batchnorm_caveat(strategy, steps: int = 4, micro_batch: int = 8, updates: int = 1, seed: int = 0) -> dict:
    """The same comparison as :func:`compare_with_big_batch` with a BatchNormalization layer: the
    moving statistics are updated once per micro-batch (``steps`` times per update) from micro-batch
    statistics, and the normalization itself uses micro-batch statistics, so weights differ too."""
    replicas = strategy.num_replicas_in_sync
    big = steps * micro_batch * replicas
    x, y = toy_data(big * updates, seed=seed)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with strategy.scope():
        reference = tiny_classifier(seed=seed, batch_norm=True)
        reference.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
        model = tiny_classifier(seed=seed, batch_norm=True)
        model.set_weights(reference.get_weights())
        wrapped = _accumulating_model()(model, steps=steps)
        wrapped.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
    initial = reference.get_weights()
    reference.fit(x, y, batch_size=big, shuffle=False, verbose=0)
    wrapped.fit(x, y, batch_size=big, shuffle=False, verbose=0)
    bn = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)][0]
    bn_ref = [layer for layer in reference.layers if isinstance(layer, keras.layers.BatchNormalization)][0]
    trainable = [np.asarray(v) for v in model.trainable_weights]
    trainable_ref = [np.asarray(v) for v in reference.trainable_weights]
    start_mean = initial[[i for i, w in enumerate(reference.weights) if w is bn_ref.moving_mean][0]]
    return {
        "moving_mean_moved_big": float(np.abs(np.asarray(bn_ref.moving_mean) - start_mean).max()),
        "moving_mean_moved_acc": float(np.abs(np.asarray(bn.moving_mean) - start_mean).max()),
        "moving_mean_diff": float(np.abs(np.asarray(bn.moving_mean) - np.asarray(bn_ref.moving_mean)).max()),
        "trainable_diff": max_abs_diff(trainable, trainable_ref),
        "updates": int(wrapped.optimizer.iterations.numpy()),
        "replicas": replicas,
    }


def schedule_units(
    steps: int = 4, updates: int = 2, warmup: int = 8, micro_batch: int = 8, peak_lr: float = 0.1, seed: int = 0
) -> dict:
    """Where a linear warm-up schedule (``warmup`` steps to ``peak_lr``) stands after ``updates``
    updates of ``steps`` micro-batches: with big batches, with the course's AccumulatingModel, and
    with Keras' built-in accumulation (one device). Values: ``{"lr", "iterations", "schedule_step"}``."""

    def schedule():
        return keras.optimizers.schedules.PolynomialDecay(
            0.0, warmup, end_learning_rate=peak_lr, power=1.0
        )  # 0 → peak_lr over `warmup` steps

    big = steps * micro_batch
    x, y = toy_data(big * updates, seed=seed)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    out = {}
    for name in ("big batch", "AccumulatingModel", "Keras built-in"):
        model = tiny_classifier(seed=seed)
        if name == "Keras built-in":
            optimizer = keras.optimizers.SGD(schedule(), gradient_accumulation_steps=steps)
            model.compile(optimizer=optimizer, loss=loss)
            model.fit(x, y, batch_size=micro_batch, shuffle=False, verbose=0)
            seen = int(optimizer._iterations.numpy())
        else:
            optimizer = keras.optimizers.SGD(schedule())
            trained = model if name == "big batch" else _accumulating_model()(model, steps=steps)
            trained.compile(optimizer=optimizer, loss=loss)
            trained.fit(x, y, batch_size=big, shuffle=False, verbose=0)
            seen = int(optimizer.iterations.numpy())
        out[name] = {
            "iterations": int(optimizer.iterations.numpy()),
            "schedule_step": seen,
            "lr": float(optimizer.learning_rate.numpy()),
        }
    out["warmup"], out["updates"], out["steps"] = warmup, updates, steps
    return out


def loss_scaling_demo(
    strategy, steps: int = 4, micro_batch: int = 8, loss_weight: float = 1e-5, learning_rate: float = 1.0, seed: int = 0
) -> dict:
    """One accumulated update of a tiny model whose loss is multiplied by ``loss_weight`` (small
    gradients, as a small loss weight or a large effective batch gives), under float32, mixed_float16
    without and with ``LossScaleOptimizer``, and mixed_bfloat16. For each: the share of first-layer
    kernel gradients that vanished (0 where float32 is not) and the largest error relative to the
    float32 update."""
    replicas = strategy.num_replicas_in_sync
    global_micro = micro_batch * replicas
    x, y = toy_data(global_micro * steps, seed=seed)
    ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def per_example(y_true, y_pred):
        return loss_weight * ce(y_true, y_pred)

    previous = keras.mixed_precision.global_policy()
    deltas = {}
    try:
        for name, policy, scaled in (
            ("float32", "float32", False),
            ("mixed_float16, no loss scaling", "mixed_float16", False),
            ("mixed_float16 + LossScaleOptimizer", "mixed_float16", True),
            ("mixed_bfloat16", "mixed_bfloat16", False),
        ):
            keras.mixed_precision.set_global_policy(policy)
            with strategy.scope():
                model = tiny_classifier(seed=seed)
                initial = model.get_weights()
                optimizer = keras.optimizers.SGD(learning_rate)
                if scaled:
                    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
                acc = GradientAccumulator(
                    model, optimizer, per_example, steps=steps, global_micro_batch=global_micro, strategy=strategy
                )
            dist = strategy.experimental_distribute_dataset(
                tf.data.Dataset.from_tensor_slices((x, y)).batch(global_micro, drop_remainder=True)
            )
            acc.train(dist)
            deltas[name] = (np.asarray(model.get_weights()[0]) - initial[0]).astype(np.float64)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    ref = deltas["float32"]
    out = {"replicas": replicas, "loss_weight": loss_weight}
    for name, d in deltas.items():
        out[name] = {
            "vanished": float(np.mean((d == 0) & (ref != 0))),
            "rel_error": float(np.abs(d - ref).max() / np.abs(ref).max()),
        }
    return out


def training_step(
    batch: int,
    accumulate: int = 0,
    width: int = 16,
    num_classes: int = 10,
    jit: bool = False,
    seed: int = 0,
    device: str | None = None,
):
    """One training step of the course's small CNN on ``batch`` examples, as a step for
    :func:`course_utils.memory.measure_isolated`: a zero-argument callable running a ``tf.function``
    (``jit_compile=jit``) around ``model.train_step`` on a batch already in memory. ``accumulate=k`` wraps the model
    in :class:`AccumulatingModel` (k micro-batches of ``batch / k``); 0 = one plain step.

    Placed on ``device`` (default: :func:`course_utils.memory.default_device`, the device whose peak is read) like
    lesson 02's ``forward_step``: the batch, the weights, and every call (the optimizer's variables are created on the
    first one). Unplaced on a TPU VM, the step would run on the host while its peak is read from ``TPU:0``."""
    device = device or memory.default_device()
    (x, y), _ = data.synthetic_cifar(batch, 8, seed=seed, num_classes=num_classes)
    with tf.device(device):
        model = models.small_cnn(num_classes=num_classes, width=width)
        if accumulate:
            model = _accumulating_model()(model, steps=accumulate)
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
        x, y = tf.constant(x), tf.constant(y)
    train = tf.function(lambda: model.train_step((x, y)), jit_compile=jit)

    def step():
        with tf.device(device):
            return train()

    step.model = model
    return step


def step_peaks(
    micro_batch: int,
    ks=(1, 2, 4),
    accumulated: bool = False,
    width: int = 16,
    jit: bool = False,
    seed: int = 0,
    repeats: int = 5,
) -> dict:
    """Peak memory of one training step per k in ``ks``, each in a fresh process (``repeats`` readings each):
    one batch of k·B examples (labels ``"k·B"``), or with ``accumulated`` the k·B batch through
    ``AccumulatingModel``, B at a time (``"k × B accumulated"``). ``{label: PeakMemory}``, every reading in
    ``samples``. A fresh process per step: in a long-lived one, what ran before changes the allocator's figure."""
    from ... import memory

    def label(k: int) -> str:
        return f"{k} × B accumulated" if accumulated else f"{k}·B"

    variants = {
        label(k): dict(batch=k * micro_batch, accumulate=k if accumulated else 0, width=width, jit=jit, seed=seed)
        for k in ks
    }
    return memory.measure_peaks_isolated(training_step, variants, repeats=repeats)


def growth_samples(peaks: dict, label: str, base: str = "1·B") -> list[float]:
    """``peaks[label] / peaks[base]``, one ratio per repeat (repeat i of each, from separate processes)."""
    return [a / b for a, b in zip(_readings(peaks[label]), _readings(peaks[base]))]


def extra_share_samples(peaks: dict, k: int) -> list[float]:
    """How much of the memory a k·B batch adds over B the accumulated k × B step still adds, one value per repeat:
    (acc − B) / (k·B − B). 0 = exactly B's peak; 1 = the big batch's. The accumulated step still holds the k·B
    *input* batch and the gradient sums, so a little above 0 is expected."""
    acc, base, big = (_readings(peaks[label]) for label in (f"{k} × B accumulated", "1·B", f"{k}·B"))
    return [(a - b) / max(g - b, 1) for a, b, g in zip(acc, base, big)]


def _readings(peak) -> list[float]:
    return [float(v) for v in (peak.samples or [peak.peak_bytes])]


def popular_loop(model, optimizer, x, y, k: int, micro_batch: int, divide_by_k: bool):
    """The accumulation loop popular posts show (eager, one device), with the ``/ k`` fix as an option."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    accum = [tf.zeros_like(v) for v in model.trainable_variables]
    for step, (xb, yb) in enumerate(tf.data.Dataset.from_tensor_slices((x, y)).batch(micro_batch)):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))  # mean over the micro-batch
        grads = tape.gradient(loss, model.trainable_variables)
        accum = [a + g for a, g in zip(accum, grads)]
        if (step + 1) % k == 0:
            if divide_by_k:
                accum = [a / k for a in accum]  # the fix: the mean of k means is the big batch's mean
            optimizer.apply_gradients(zip(accum, model.trainable_variables))
            accum = [tf.zeros_like(v) for v in model.trainable_variables]
    return model


def mirrored_strategy(strategy):
    """§4: a ``MirroredStrategy`` to show keras-team/keras#20582 on: ``strategy`` when it is one (several GPUs or CPU
    replicas), else one over its first device — on a TPU over the host's CPU, since ``TPUStrategy`` merges in place,
    without MirroredStrategy's replica threads whose ``merge_call`` inside a ``cond`` is the failure."""
    if isinstance(strategy, tf.distribute.MirroredStrategy) and not standin_strategies.is_tpu_strategy(strategy):
        return strategy
    if standin_strategies.is_tpu_strategy(strategy):
        return tf.distribute.MirroredStrategy(["/cpu:0"])
    return tf.distribute.MirroredStrategy(strategy.extended.worker_devices[:1])


def builtin_on_mirrored(strategy, kind: str, steps: int = 4) -> str:
    """§4: what Keras' built-in accumulation does under :func:`mirrored_strategy` (``strategy``'s, or one over a
    single device): "ran", or the error in a few words."""
    try:
        builtin_accumulation(mirrored_strategy(strategy), steps=steps)
    except RuntimeError as e:
        return "RuntimeError (merge_call in Cond)" if "merge_call" in str(e) else f"RuntimeError: {e}"
    return "ran"


TOLERANCE = {"float32": 1e-5, "mixed_bfloat16": 1e-3}  # §5: max |Δw| accumulation vs big batch, per policy


def equivalence_runs(
    strategy, steps: int = 4, updates: int = 2, replicas: int = 4, bf16_replicas: int = 4
) -> list[dict]:
    """§5: :func:`compare_with_big_batch` in float32 on one device and on ``replicas`` (here, or in a fresh CPU process
    with that many when this strategy has fewer), and in mixed_bfloat16 on ``bf16_replicas`` (1, or ``replicas``).
    ``[{"where", "policy", "result", "within_tolerance"}]``."""
    if bf16_replicas not in (1, replicas):
        raise ValueError(f"bf16_replicas must be 1 or replicas ({replicas}), got {bf16_replicas!r}")
    one = tf.distribute.get_strategy()
    runs = [("1 replica", "float32", compare_with_big_batch(one, steps, updates=updates, policy="float32"))]
    for policy, n in (("float32", replicas), ("mixed_bfloat16", bf16_replicas)):
        if n == 1:
            runs.append(("1 replica", policy, compare_with_big_batch(one, steps, updates=updates, policy=policy)))
            continue
        result = _runtime.run_with_replicas(
            n, strategy, compare_with_big_batch, steps=steps, updates=updates, policy=policy
        )
        runs.append((f"{result['replicas']} replicas", policy, result))
    # within tolerance, and the weights really moved (by > 20× the tolerance), or equality would prove nothing
    return [
        {
            "where": where,
            "policy": policy,
            "result": r,
            "within_tolerance": max(r["max_abs_diff"].values()) <= TOLERANCE[policy]
            and r["moved"] > 20 * TOLERANCE[policy],
        }
        for where, policy, r in runs
    ]


def four_replica_loss_scaling(strategy, steps: int = 4, micro_batch: int = 8, seed: int = 0) -> dict:
    """A ``LossScaleOptimizer`` in both custom-loop tools under ``strategy``: normal updates against
    the big batch (float32 policy, so equality is exact), then one group in which a single replica's
    micro-batch overflows (an inf input): the update must be skipped on every replica and the scale
    halved; the next clean group is applied. ``"overflow_fit"``: that micro-batch through
    ``AccumulatingModel.fit`` under ``mixed_float16`` (None off ``MirroredStrategy``); ``"keras"``: through Keras' own
    ``LossScaleOptimizer`` (:func:`keras_loss_scaling_overflow`)."""
    replicas = strategy.num_replicas_in_sync
    global_micro = micro_batch * replicas
    x, y = toy_data(global_micro * steps * 2, seed=seed)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    with strategy.scope():
        reference = tiny_classifier(seed=seed)
        reference.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
    initial = reference.get_weights()
    reference.fit(x, y, batch_size=global_micro * steps, shuffle=False, verbose=0)
    out = {"replicas": replicas}

    def batches(xs, ys, size):
        return strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((xs, ys)).batch(size, drop_remainder=True)
        )

    with strategy.scope():
        model = tiny_classifier(seed=seed)
        model.set_weights(initial)
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
        accumulator = GradientAccumulator(
            model, optimizer, per_example, steps=steps, global_micro_batch=global_micro, strategy=strategy
        )
    accumulator.train(batches(x, y, global_micro))
    out["accumulator"] = {
        "updates": int(optimizer.iterations.numpy()),
        "max_abs_diff": max_abs_diff(reference.get_weights(), model.get_weights()),
        "moved": max_abs_diff(initial, model.get_weights()),
    }

    with strategy.scope():
        model2 = tiny_classifier(seed=seed)
        model2.set_weights(initial)
        optimizer2 = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    dist = batches(x, y, global_micro * steps)
    step = distributed_train_step(
        strategy, model2, optimizer2, per_example, global_micro * steps, element_spec=dist.element_spec
    )
    for batch in dist:
        step(batch)
    out["train_step"] = {
        "updates": int(optimizer2.iterations.numpy()),
        "max_abs_diff": max_abs_diff(reference.get_weights(), model2.get_weights()),
    }

    # One replica overflows: an inf feature in the last replica's share of the second micro-batch.
    bad_x = x[: global_micro * steps].copy()
    bad_x[global_micro + global_micro - 1, 0] = np.inf
    with strategy.scope():
        model3 = tiny_classifier(seed=seed)
        model3.set_weights(initial)
        optimizer3 = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
        acc3 = GradientAccumulator(
            model3, optimizer3, per_example, steps=steps, global_micro_batch=global_micro, strategy=strategy
        )
    scale_before = float(np.asarray(optimizer3.dynamic_scale.numpy()))
    for batch in batches(bad_x, y[: global_micro * steps], global_micro):
        acc3.micro_step(batch)
    applied = bool(acc3.apply())

    def local_values(model_):
        kernel = model_.trainable_weights[0]
        values = getattr(kernel, "value", kernel)
        per_replica = strategy.experimental_local_results(values)
        return [np.asarray(v) for v in per_replica]

    out["overflow"] = {
        "applied": applied,
        "iterations": int(optimizer3.iterations.numpy()),
        "scale_before": scale_before,
        "scale_after": float(np.asarray(optimizer3.dynamic_scale.numpy())),
        "replicas_unchanged": [bool(np.array_equal(v, initial[0])) for v in local_values(model3)],
    }
    for batch in batches(x[: global_micro * steps], y[: global_micro * steps], global_micro):
        acc3.micro_step(batch)
    out["overflow"]["next_applied"] = bool(acc3.apply())
    after = local_values(model3)
    out["overflow"]["replicas_equal_after_next"] = all(
        np.array_equal(after[0], v) for v in after
    ) and not np.array_equal(after[0], initial[0])
    # The same overflowing micro-batch (an inf in the last replica's share) through fit under mixed_float16: with
    # AccumulatingModel (course), and with Keras' own LossScaleOptimizer (custom loop and plain fit).
    bad_batch = bad_x[global_micro : 2 * global_micro], y[global_micro : 2 * global_micro]
    mirrored = isinstance(strategy, tf.distribute.MirroredStrategy)  # float16: not on a TPU
    out["overflow_fit"] = (
        fit_overflowing_batch(strategy, *bad_batch, initial, accumulate=2, seed=seed) if mirrored else None
    )
    out["keras"] = keras_loss_scaling_overflow(strategy, *bad_batch, initial, seed=seed)
    return out


def keras_loss_scaling_overflow(strategy, x, y, initial, seed: int = 0) -> dict | None:
    """Keras' own ``LossScaleOptimizer`` under a ``MirroredStrategy`` with several replicas, on one batch whose
    *last* replica's share holds an ``inf`` (``x``, ``y``: one global batch, split in order across the replicas):
    ``"custom_loop"`` — ``apply_gradients`` inside ``strategy.run``, the optimizer built before the step is traced;
    ``"fit"`` — a model constructed under ``mixed_float16`` (``compile`` wraps the optimizer). For each: whether every
    weight stayed finite, the scale before and after, and ``optimizer.iterations``. Keras decides in cross-replica
    context (``merge_call``) from the first replica's local gradients (``LossScaleOptimizer._tf_apply``), all-reduced
    only later by the inner optimizer. None on another strategy or on one replica (where the first replica is the
    last: nothing to miss)."""
    replicas = strategy.num_replicas_in_sync
    if replicas < 2 or not isinstance(strategy, tf.distribute.MirroredStrategy):
        return None
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    batch = len(x)
    dist = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors((x, y)))

    def summary(model, optimizer, scale_before):
        return {
            "finite": all(bool(np.isfinite(w).all()) for w in model.get_weights()),
            "scale_before": scale_before,
            "scale_after": float(np.asarray(optimizer.dynamic_scale.numpy())),
            "iterations": int(optimizer.iterations.numpy()),
        }

    with strategy.scope():
        model = tiny_classifier(seed=seed)
        model.set_weights(initial)
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
        optimizer.build(model.trainable_variables)  # before tracing: built inside the step, it fails (§6)
    scale_before = float(np.asarray(optimizer.dynamic_scale.numpy()))

    @tf.function
    def keras_step(batch_):
        def replica(xs, ys):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(per_example(ys, model(xs, training=True)), global_batch_size=batch)
                scaled = optimizer.scale_loss(loss)
            optimizer.apply_gradients(zip(tape.gradient(scaled, model.trainable_variables), model.trainable_variables))

        strategy.run(replica, args=batch_)

    keras_step(next(iter(dist)))
    return {
        "custom_loop": summary(model, optimizer, scale_before),
        "fit": fit_overflowing_batch(strategy, x, y, initial, seed=seed),
    }


def fit_overflowing_batch(strategy, x, y, initial, accumulate: int = 0, seed: int = 0) -> dict:
    """``fit`` on one batch (``x``, ``y``) of :func:`tiny_classifier` constructed under ``mixed_float16`` (so
    ``compile`` wraps its SGD in a ``LossScaleOptimizer``), from the weights ``initial``; ``accumulate=k`` wraps it in
    :class:`AccumulatingModel` (constructed under the same policy). Whether every weight stayed finite, the scale
    before and after, ``optimizer.iterations`` and the optimizer's class."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with strategy.scope():
            model = tiny_classifier(seed=seed)
            if accumulate:
                model = _accumulating_model()(model, steps=accumulate)
            model.compile(
                optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
            )
    finally:
        keras.mixed_precision.set_global_policy(previous)
    model.set_weights(initial)
    optimizer = model.optimizer
    scale_before = float(getattr(optimizer, "initial_scale", 1.0))
    model.fit(x, y, batch_size=len(x), shuffle=False, verbose=0)
    return {
        "finite": all(bool(np.isfinite(w).all()) for w in model.get_weights()),
        "scale_before": scale_before,
        "scale_after": float(np.asarray(optimizer.dynamic_scale.numpy())),
        "iterations": int(optimizer.iterations.numpy()),
        "optimizer": type(optimizer).__name__,
    }


def ragged_batches(strategy, steps: int = 4) -> dict:
    """What each tool does with data that does not split into equal micro-batches (404 examples,
    batch 128 on this strategy): the messages a learner sees, and how many updates ran."""
    import warnings

    from ...accumulation import GradientAccumulator

    replicas = strategy.num_replicas_in_sync
    x, y = toy_data(404)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    out = {"replicas": replicas}
    with strategy.scope():
        wrapped = _accumulating_model()(tiny_classifier(), steps=steps)
        wrapped.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
    try:
        wrapped.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(128), verbose=0)
        out["dataset_unbatched_size"] = "trained"
    except ValueError as e:
        out["dataset_unbatched_size"] = str(e)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapped.fit(x, y, batch_size=128, shuffle=False, verbose=0)
    out["arrays_dropped"] = {
        "updates": int(wrapped.optimizer.iterations.numpy()),
        "warning": " ".join(str(w.message) for w in caught if "dropping" in str(w.message)),
    }
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    global_micro = 8 * replicas
    with strategy.scope():
        accumulator = GradientAccumulator(
            tiny_classifier(),
            keras.optimizers.SGD(0.1),
            per_example,
            steps=steps,
            global_micro_batch=global_micro,
            strategy=strategy,
        )
    ragged = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x[: global_micro + 3], y[: global_micro + 3])).batch(global_micro)
    )
    try:
        accumulator.train(ragged)
        out["accumulator_ragged"] = "trained"
    except ValueError as e:
        out["accumulator_ragged"] = str(e)
    return out


# ----------------------------------------------------------------------------------------------
# The lesson's claims: claims() turns what the notebook measured into the table
# ----------------------------------------------------------------------------------------------

K = 4  # micro-batches per update, the lesson's k


# Every claim of the lesson, declared once: its words, threshold and the function that measures it (claims.json's
# "where": a report card's row leads to the code). A "memory" figure is judged on the accelerator's own memory: under
# a GPU or TPU stand-in a CPU measures it, so one that does not hold there is marked, not failed.
PEAK_GROWTH = 1.5  # k·B's step peak against B's: above this, it grows with the batch
ACCUMULATED_EXTRA = 0.25  # what an accumulated k × B step adds over B, as a share of what k·B adds: below this
CLAIMS = report.LessonClaims(
    "05",
    [
        report.Declared(
            "05.peak_grows_with_batch",
            "Peak memory grows with the batch (activations)",
            "§1",
            "{k}·B well above B (> {threshold}×)",
            where=step_peaks,
            figure="memory",
            op=">",
            threshold=PEAK_GROWTH,
        ),
        report.Declared(
            "05.missing_divide_by_k",
            "The popular loop without /k makes the update k× too large; /k fixes it",
            "§2",
            "{k}.00×; then ≤ 1e-5",
            where="notebook §2",
        ),
        report.Declared(
            "05.adam_hides_missing_k",
            "With Adam, forgetting /k barely changes the step (Adam normalizes the gradient's size)",
            "§2",
            "within 10% of the right step",
            where="notebook §2",
        ),
        report.Declared(
            "05.compute_average_loss",
            "compute_average_loss(global batch) + SUM gives the global mean loss and an update equal to fit",
            "tf.distribute guide; §3",
            "equal to fit",
            where=loss_averaging_effect,
        ),
        report.Declared(
            "05.reduce_mean_per_replica",
            "reduce_mean per replica makes the update replicas× too large",
            "§3",
            "{n}.00× on {n} replicas (and a loss {n}× the mean)",
            where=loss_averaging_effect,
        ),
        report.Declared(
            "05.builtin_equals_big_batch",
            "Keras' gradient_accumulation_steps equals the big batch under OneDeviceStrategy",
            "§4",
            "≤ 1e-5",
            where=builtin_accumulation,
        ),
        report.Declared(
            "05.builtin_crashes_mirrored",
            "…and crashes under MirroredStrategy (keras-team/keras#20582)",
            "§4",
            "RuntimeError (merge_call)",
            where=builtin_on_mirrored,
        ),
        report.Declared(
            "05.accumulation_equals_big_batch",
            "Strategy-safe accumulation (fit and custom loop) equals the big batch: float32 ≤ 1e-5, bf16 ≤ 1e-3",
            "§5",
            "all within tolerance",
            where=equivalence_runs,
        ),
        report.Declared(
            "05.iterations_count_updates",
            "optimizer.iterations counts updates = micro-steps / k",
            "§5",
            "micro-steps / k",
            where=equivalence_runs,
        ),
        report.Declared(
            "05.accumulated_peak",
            "An accumulated k×B step peaks near B's memory, not k·B's — with and without XLA",
            "§5",
            "adds < {threshold:.0%} of what {k}·B adds over B",
            where=step_peaks,
            figure="memory",
            op="<",
            threshold=ACCUMULATED_EXTRA,
            fmt=".0%",
            unit="",
        ),
        report.Declared(
            "05.ragged_batches_refused",
            "Batches that cannot split into k micro-batches are refused (or dropped with a warning) before training",
            "§5",
            "clear message; 3 updates from 404 examples",
            where=ragged_batches,
        ),
        report.Declared(
            "05.batchnorm_per_micro_batch",
            "BatchNorm moving statistics update per micro-batch (k× per update)",
            "§6",
            "moves more; weights differ",
            where=batchnorm_caveat,
        ),
        report.Declared(
            "05.schedule_units",
            "The built-in option's LR schedule sees micro-steps; the course tools' see updates",
            "§6",
            "built-in at step {two_k}, course at 2",
            where=schedule_units,
        ),
        report.Declared(
            "05.float16_needs_loss_scaling",
            "float16 loses small accumulated gradients without loss "
            "scaling; LossScaleOptimizer keeps them; bfloat16 needs no scaling",
            "§6",
            "lost > 0 without; 0 with; bf16 0",
            where=loss_scaling_demo,
        ),
        report.Declared(
            "05.loss_scale_optimizer_in_tools",
            "A LossScaleOptimizer in the course's tools (custom loops; AccumulatingModel under mixed_float16) "
            "works under MirroredStrategy: an overflow on one replica skips the update on all and halves "
            "the scale",
            "§6",
            "skipped everywhere; scale ÷ 2; then applied",
            where=four_replica_loss_scaling,
        ),
        report.Declared(
            "05.keras_loss_scale_first_replica",
            "Keras' own LossScaleOptimizer under MirroredStrategy checks only the first replica's gradients: "
            "an overflow on another replica reaches every replica's weights and the scale stays (custom loop "
            "and fit)",
            "keras/src/optimizers/loss_scale_optimizer.py _tf_apply; §6",
            "weights non-finite, scale unchanged, in both",
            where=keras_loss_scaling_overflow,
        ),
    ],
)


def claims(r: dict) -> list:
    """Lesson 05's claims from the notebook's results."""
    k, peaks = r["k"], r["peaks"]
    xla = "with XLA" if r["jit"] else "without XLA"
    averaging, builtin, ragged, bn, units, fp16 = (
        r[key] for key in ("averaging", "builtin", "ragged", "bn", "units", "fp16")
    )
    n = averaging["replicas"]  # the replicas the several-replica facts ran on (sizes.replicas: 4; 2 in smoke mode)
    four_note = (
        ""
        if r["replicas"] == n
        else f"measured in a fresh {n}-CPU process: this runtime has {r['replicas']} replica(s)"
    )
    sgd_without, sgd_with = r["sgd"]["without /k"], r["sgd"]["with /k"]
    fp16_plain, fp16_scaled = fp16["mixed_float16, no loss scaling"], fp16["mixed_float16 + LossScaleOptimizer"]
    scaling = r["scaling"]
    overflow, fit_overflow = scaling["overflow"], scaling.get("overflow_fit")
    runs = r["runs"]
    measurable = peaks["1·B"].peak_bytes > 0
    method = peaks["1·B"].method
    growth = growth_samples(peaks, f"{k}·B") if measurable else []
    share = extra_share_samples(peaks, k) if measurable else []
    acc_ratio = peaks[f"{k} × B accumulated"].peak_bytes / max(peaks["1·B"].peak_bytes, 1)
    no_peak = "" if measurable else "this runtime reports no peak memory"

    def memory_claim(claim_id, samples, note):
        if not samples:  # no peak to read here: not measurable, never a pass or a failure
            return CLAIMS.judge(claim_id, "—", None, note=note, k=k)
        return CLAIMS.judge_samples(claim_id, samples, note=note, k=k)

    return CLAIMS.all(
        [
            memory_claim(
                "05.peak_grows_with_batch", growth, no_peak or f"{xla}; each step in a fresh process ({method})"
            ),
            CLAIMS.judge(
                "05.missing_divide_by_k",
                f"{sgd_without['ratio']:.3f}×; fixed: {sgd_with['diff']:.1e}",
                abs(sgd_without["ratio"] - k) < 1e-3 and sgd_with["diff"] <= 1e-5,
                k=k,
            ),
            CLAIMS.judge("05.adam_hides_missing_k", f"{r['adam_ratio']:.3f}×", abs(r["adam_ratio"] - 1) < 0.1),
            CLAIMS.judge(
                "05.compute_average_loss",
                f"max |Δw| {averaging['diff_vs_fit_right']:.1e}",
                averaging["diff_vs_fit_right"] <= 1e-5,
                four_note,
            ),
            CLAIMS.judge(
                "05.reduce_mean_per_replica",
                f"{averaging['update_ratio']:.2f}× on {averaging['replicas']} "
                f"(loss {averaging['loss_wrong'] / averaging['loss_right']:.2f}×)",
                n > 1
                and abs(averaging["update_ratio"] - n) < 1e-2
                and abs(averaging["loss_wrong"] / averaging["loss_right"] - n) < 1e-3,
                four_note,
                n=n,
            ),
            CLAIMS.judge(
                "05.builtin_equals_big_batch", f"{builtin['max_abs_diff']:.1e}", builtin["max_abs_diff"] <= 1e-5
            ),
            CLAIMS.judge(
                "05.builtin_crashes_mirrored",
                r["builtin_on_mirrored"],
                r["builtin_on_mirrored"].startswith("RuntimeError (merge_call"),
                "" if r["kind"] != "TPU" else "on TPU measured under TPUStrategy",
            ),
            CLAIMS.judge(
                "05.accumulation_equals_big_batch",
                "; ".join(
                    f"{run['where']} {run['policy']}: {max(run['result']['max_abs_diff'].values()):.0e}" for run in runs
                ),
                all(run["within_tolerance"] for run in runs),
            ),
            CLAIMS.judge(
                "05.iterations_count_updates",
                "; ".join(f"{run['result']['micro_steps']}→{run['result']['updates_acc']['fit']}" for run in runs),
                all(
                    run["result"]["updates_acc"]["fit"]
                    == run["result"]["updates_acc"]["loop"]
                    == run["result"]["micro_steps"] // k
                    for run in runs
                ),
            ),
            memory_claim(
                "05.accumulated_peak",
                share,
                no_peak
                or (
                    f"{acc_ratio:.2f}× B's peak; what it adds is the {k}·B input batch and the gradient "
                    f"sums; {xla}, fresh processes"
                ),
            ),
            CLAIMS.judge(
                "05.ragged_batches_refused",
                f"{ragged['arrays_dropped']['updates']} updates; dataset: "
                f"{'drop_remainder' in ragged['dataset_unbatched_size']}",
                ragged["arrays_dropped"]["updates"] == 404 // 128
                and "dropping the last 20 of 404" in ragged["arrays_dropped"]["warning"]
                and "drop_remainder" in ragged["dataset_unbatched_size"]
                and "expected global_micro_batch=" in ragged["accumulator_ragged"],
            ),
            CLAIMS.judge(
                "05.batchnorm_per_micro_batch",
                f"{bn['moving_mean_moved_acc']:.4f} vs {bn['moving_mean_moved_big']:.4f}; "
                f"Δw {bn['trainable_diff']:.1e}",
                bn["moving_mean_moved_acc"] > 2 * bn["moving_mean_moved_big"] and bn["trainable_diff"] > 1e-4,
            ),
            CLAIMS.judge(
                "05.schedule_units",
                f"built-in {units['Keras built-in']['schedule_step']}, "
                f"course {units['AccumulatingModel']['schedule_step']}",
                units["Keras built-in"]["schedule_step"] == 2 * k and units["AccumulatingModel"]["schedule_step"] == 2,
                two_k=2 * k,
            ),
            CLAIMS.judge(
                "05.float16_needs_loss_scaling",
                f"{fp16_plain['vanished']:.1%} vs {fp16_scaled['vanished']:.1%}; "
                f"bf16 {fp16['mixed_bfloat16']['vanished']:.1%}",
                fp16_plain["vanished"] > 0 and fp16_scaled["vanished"] == 0 and fp16["mixed_bfloat16"]["vanished"] == 0,
            ),
            CLAIMS.judge(
                "05.loss_scale_optimizer_in_tools",
                f"applied={overflow['applied']}, unchanged {sum(overflow['replicas_unchanged'])}/"
                f"{scaling['replicas']}, scale {overflow['scale_before']:g}→{overflow['scale_after']:g}"
                + (
                    f"; AccumulatingModel: weights finite {fit_overflow['finite']}, scale "
                    f"{fit_overflow['scale_before']:g}→{fit_overflow['scale_after']:g}"
                    if fit_overflow
                    else ""
                ),
                (
                    fit_overflow is None
                    or (
                        fit_overflow["finite"]
                        and fit_overflow["iterations"] == 0
                        and fit_overflow["scale_after"] == fit_overflow["scale_before"] / 2
                    )
                )
                and (not overflow["applied"])
                and overflow["iterations"] == 0
                and all(overflow["replicas_unchanged"])
                and overflow["scale_after"] == overflow["scale_before"] / 2
                and overflow["next_applied"]
                and overflow["replicas_equal_after_next"]
                and scaling["accumulator"]["updates"] == scaling["train_step"]["updates"] == 2
                and scaling["accumulator"]["moved"] > 1e-3
                and max(scaling["accumulator"]["max_abs_diff"], scaling["train_step"]["max_abs_diff"]) <= 1e-5,
                four_note,
            ),
            _keras_scaling_claim(scaling, four_note),
        ]
    )


def _keras_scaling_claim(scaling: dict, four_note: str):
    """§6: Keras' own LossScaleOptimizer misses an overflow on a replica other than the first (custom loop and fit)."""
    keras_runs = scaling.get("keras")
    if not keras_runs:
        return CLAIMS.judge(
            "05.keras_loss_scale_first_replica", "—", None, note="needs MirroredStrategy with ≥ 2 replicas"
        )
    return CLAIMS.judge(
        "05.keras_loss_scale_first_replica",
        "; ".join(
            f"{how}: weights finite {r['finite']}, scale {r['scale_before']:g}→{r['scale_after']:g}"
            for how, r in keras_runs.items()
        ),
        all(not r["finite"] and r["scale_after"] == r["scale_before"] for r in keras_runs.values()),
        four_note,
    )
