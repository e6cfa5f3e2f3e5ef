"""Lesson 05's experiments: gradient accumulation against the big batch, the averaging bugs, and the
caveats (BatchNorm, schedule units, float16 loss scaling). Each returns a small JSON-able dict, so it
can run in a fresh process with N CPU replicas (``runtime.run_with_replicas(4, strategy, fn, ...)``).
The tools themselves are in :mod:`course_utils.accumulation`."""

from __future__ import annotations

from ..accumulation import GradientAccumulator, distributed_train_step


def _accumulating_model():
    from .. import accumulation

    return accumulation.AccumulatingModel


# ----------------------------------------------------------------------------------------------
# Small helpers for comparisons
# ----------------------------------------------------------------------------------------------


def max_abs_diff(weights_a, weights_b) -> float:
    """Largest |a - b| over two lists of weight arrays (``model.get_weights()``)."""
    import numpy as np

    if len(weights_a) != len(weights_b):
        raise ValueError(f"different numbers of weights: {len(weights_a)} vs {len(weights_b)}")
    return max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))) if np.size(a) else 0.0
               for a, b in zip(weights_a, weights_b))


def tiny_classifier(features: int = 8, hidden: int = 16, classes: int = 3, seed: int = 0, batch_norm: bool = False):
    """A small MLP with float32 logits (build it in ``strategy.scope()``); deterministic weights."""
    import keras

    keras.utils.set_random_seed(seed)
    layers = [keras.Input((features,)), keras.layers.Dense(hidden, activation="relu")]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    layers += [keras.layers.Dense(classes), keras.layers.Activation("linear", dtype="float32")]
    return keras.Sequential(layers)


def toy_data(n: int, features: int = 8, classes: int = 3, seed: int = 0):
    """``n`` examples for :func:`tiny_classifier`: float32 features, int64 labels (learnable, noisy)."""
    import numpy as np

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
    import keras
    import tensorflow as tf

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
    result = {"max_abs_diff": {}, "updates_acc": {}, "replicas": replicas, "steps": steps, "policy": policy,
              "micro_steps": len(x) // global_micro}
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
                    acc = GradientAccumulator(model, optimizer, per_example, steps=steps,
                                              global_micro_batch=global_micro, strategy=strategy,
                                              element_spec=dist.element_spec)
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
    import keras
    import numpy as np
    import tensorflow as tf

    replicas = strategy.num_replicas_in_sync
    global_batch = per_replica_batch * replicas
    x, y = toy_data(global_batch, seed=seed)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch, drop_remainder=True)
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    with strategy.scope():
        reference = tiny_classifier(seed=seed)
        reference.compile(optimizer=keras.optimizers.SGD(learning_rate),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    initial = reference.get_weights()
    reference.fit(x, y, batch_size=global_batch, shuffle=False, verbose=0)
    out = {"replicas": replicas, "global_batch": global_batch}
    for label, wrong in (("right", False), ("wrong", True)):
        with strategy.scope():
            model = tiny_classifier(seed=seed)
            model.set_weights(initial)
            optimizer = keras.optimizers.SGD(learning_rate)
        dist = strategy.experimental_distribute_dataset(ds)
        step = distributed_train_step(strategy, model, optimizer, per_example, global_batch,
                                      element_spec=dist.element_spec, per_replica_mean=wrong)
        out[f"loss_{label}"] = float(step(next(iter(dist))))
        delta = np.concatenate([(a - b).ravel() for a, b in zip(model.get_weights(), initial)])
        out[f"update_{label}"] = float(np.abs(delta).max())
        out[f"diff_vs_fit_{label}"] = max_abs_diff(model.get_weights(), reference.get_weights())
    out["update_ratio"] = out["update_wrong"] / out["update_right"]
    return out


def builtin_accumulation(strategy=None, steps: int = 4, micro_batch: int = 8, updates: int = 2,
                         learning_rate: float = 0.1, seed: int = 0) -> dict:
    """Keras' own ``SGD(gradient_accumulation_steps=steps)`` against big batches, under ``strategy``
    (``None``: no strategy). Returns the weight difference and both iteration counters, or the error."""
    import keras

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
    import keras
    import numpy as np

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


def schedule_units(steps: int = 4, updates: int = 2, warmup: int = 8, micro_batch: int = 8,
                   peak_lr: float = 0.1, seed: int = 0) -> dict:
    """Where a linear warm-up schedule (``warmup`` steps to ``peak_lr``) stands after ``updates``
    updates of ``steps`` micro-batches: with big batches, with the course's AccumulatingModel, and
    with Keras' built-in accumulation (one device). Values: ``{"lr", "iterations", "schedule_step"}``."""
    import keras

    def schedule():
        return keras.optimizers.schedules.PolynomialDecay(
            0.0, warmup, end_learning_rate=peak_lr, power=1.0)  # 0 → peak_lr over `warmup` steps

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
        out[name] = {"iterations": int(optimizer.iterations.numpy()), "schedule_step": seen,
                     "lr": float(optimizer.learning_rate.numpy())}
    out["warmup"], out["updates"], out["steps"] = warmup, updates, steps
    return out


def loss_scaling_demo(strategy, steps: int = 4, micro_batch: int = 8, loss_weight: float = 1e-5,
                      learning_rate: float = 1.0, seed: int = 0) -> dict:
    """One accumulated update of a tiny model whose loss is multiplied by ``loss_weight`` (small
    gradients, as a small loss weight or a large effective batch gives), under float32, mixed_float16
    without and with ``LossScaleOptimizer``, and mixed_bfloat16. For each: the share of first-layer
    kernel gradients that vanished (0 where float32 is not) and the largest error relative to the
    float32 update."""
    import keras
    import numpy as np
    import tensorflow as tf

    replicas = strategy.num_replicas_in_sync
    global_micro = micro_batch * replicas
    x, y = toy_data(global_micro * steps, seed=seed)
    ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def per_example(y_true, y_pred):
        return loss_weight * ce(y_true, y_pred)

    previous = keras.mixed_precision.global_policy()
    deltas = {}
    try:
        for name, policy, scaled in (("float32", "float32", False),
                                     ("mixed_float16, no loss scaling", "mixed_float16", False),
                                     ("mixed_float16 + LossScaleOptimizer", "mixed_float16", True),
                                     ("mixed_bfloat16", "mixed_bfloat16", False)):
            keras.mixed_precision.set_global_policy(policy)
            with strategy.scope():
                model = tiny_classifier(seed=seed)
                initial = model.get_weights()
                optimizer = keras.optimizers.SGD(learning_rate)
                if scaled:
                    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
                acc = GradientAccumulator(model, optimizer, per_example, steps=steps,
                                          global_micro_batch=global_micro, strategy=strategy)
            dist = strategy.experimental_distribute_dataset(
                tf.data.Dataset.from_tensor_slices((x, y)).batch(global_micro, drop_remainder=True))
            acc.train(dist)
            deltas[name] = (np.asarray(model.get_weights()[0]) - initial[0]).astype(np.float64)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    ref = deltas["float32"]
    out = {"replicas": replicas, "loss_weight": loss_weight}
    for name, d in deltas.items():
        out[name] = {"vanished": float(np.mean((d == 0) & (ref != 0))),
                     "rel_error": float(np.abs(d - ref).max() / np.abs(ref).max())}
    return out


def accumulation_peaks(k: int = 4, micro_batch: int = 32, width: int = 16, jit: bool = False,
                       num_classes: int = 10, device: str = "CPU:0", seed: int = 0) -> dict:
    """Peak memory (MiB) of one training step of the course's small CNN on one device: a batch of
    ``micro_batch`` ("B"), of ``k × micro_batch`` ("kB"), and the k·B batch through
    :class:`AccumulatingModel` ("acc"), each a ``tf.function`` (``jit_compile=jit``) measured after a
    warm-up call. Measure in a fresh process for figures that do not depend on what ran before."""
    import keras
    import tensorflow as tf

    from .. import data, memory, models

    (x_img, y_img), _ = data.synthetic_cifar(k * micro_batch, 8, seed=seed, num_classes=num_classes)

    def make(accumulate: bool):
        model = models.small_cnn(num_classes=num_classes, width=width)
        if accumulate:
            model = _accumulating_model()(model, steps=k)
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
        return model

    out, method = {}, None
    for label, n, accumulate in (("B", 1, False), ("kB", k, False), ("acc", k, True)):
        model = make(accumulate)
        x, y = tf.constant(x_img[: n * micro_batch]), tf.constant(y_img[: n * micro_batch])
        step = tf.function(lambda m=model, x=x, y=y: m.train_step((x, y)), jit_compile=jit)
        step()  # warm-up: tracing and compiling are not part of the step's peak
        peak = memory.measure_peak(step, device=device)
        out[label], method = peak.peak_bytes / 2**20, peak.method
    return dict(out, method=method, jit=jit, k=k, micro_batch=micro_batch)


def four_replica_loss_scaling(strategy, steps: int = 4, micro_batch: int = 8, seed: int = 0) -> dict:
    """A ``LossScaleOptimizer`` in both custom-loop tools under ``strategy``: normal updates against
    the big batch (float32 policy, so equality is exact), then one group in which a single replica's
    micro-batch overflows (an inf input): the update must be skipped on every replica and the scale
    halved; the next clean group is applied."""
    import keras
    import numpy as np
    import tensorflow as tf

    from ..accumulation import GradientAccumulator, distributed_train_step

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
            tf.data.Dataset.from_tensor_slices((xs, ys)).batch(size, drop_remainder=True))

    with strategy.scope():
        model = tiny_classifier(seed=seed)
        model.set_weights(initial)
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
        accumulator = GradientAccumulator(model, optimizer, per_example, steps=steps,
                                          global_micro_batch=global_micro, strategy=strategy)
    accumulator.train(batches(x, y, global_micro))
    out["accumulator"] = {"updates": int(optimizer.iterations.numpy()),
                          "max_abs_diff": max_abs_diff(reference.get_weights(), model.get_weights()),
                          "moved": max_abs_diff(initial, model.get_weights())}

    with strategy.scope():
        model2 = tiny_classifier(seed=seed)
        model2.set_weights(initial)
        optimizer2 = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    dist = batches(x, y, global_micro * steps)
    step = distributed_train_step(strategy, model2, optimizer2, per_example, global_micro * steps,
                                  element_spec=dist.element_spec)
    for batch in dist:
        step(batch)
    out["train_step"] = {"updates": int(optimizer2.iterations.numpy()),
                         "max_abs_diff": max_abs_diff(reference.get_weights(), model2.get_weights())}

    # One replica overflows: an inf feature in the last replica's share of the second micro-batch.
    bad_x = x[: global_micro * steps].copy()
    bad_x[global_micro + global_micro - 1, 0] = np.inf
    with strategy.scope():
        model3 = tiny_classifier(seed=seed)
        model3.set_weights(initial)
        optimizer3 = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
        acc3 = GradientAccumulator(model3, optimizer3, per_example, steps=steps,
                                   global_micro_batch=global_micro, strategy=strategy)
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
    out["overflow"]["replicas_equal_after_next"] = all(np.array_equal(after[0], v) for v in after) and \
        not np.array_equal(after[0], initial[0])
    return out


def ragged_batches(strategy, steps: int = 4) -> dict:
    """What each tool does with data that does not split into equal micro-batches (404 examples,
    batch 128 on this strategy): the messages a learner sees, and how many updates ran."""
    import warnings

    import keras
    import tensorflow as tf

    from ..accumulation import GradientAccumulator

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
    out["arrays_dropped"] = {"updates": int(wrapped.optimizer.iterations.numpy()),
                             "warning": " ".join(str(w.message) for w in caught if "dropping" in str(w.message))}
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    global_micro = 8 * replicas
    with strategy.scope():
        accumulator = GradientAccumulator(tiny_classifier(), keras.optimizers.SGD(0.1), per_example,
                                          steps=steps, global_micro_batch=global_micro, strategy=strategy)
    ragged = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x[:global_micro + 3], y[:global_micro + 3])).batch(global_micro))
    try:
        accumulator.train(ragged)
        out["accumulator_ragged"] = "trained"
    except ValueError as e:
        out["accumulator_ragged"] = str(e)
    return out
