"""Gradient accumulation that works under any ``tf.distribute`` strategy, and the custom-loop pieces.

Gradient accumulation trades time for memory: it computes the gradient of an effective batch of
``k·B`` examples per replica as ``k`` micro-batches of ``B``, so the activations held for backprop
are those of ``B``. Keras 3's own ``SGD(..., gradient_accumulation_steps=k)`` works on one device but
crashes under ``MirroredStrategy`` (``merge_call`` inside a ``Cond``: keras-team/keras#20582),
because it decides "apply or accumulate?" with a ``cond`` in replica context, and the optimizer's
all-reduce cannot run inside one. Both tools here avoid that ``cond`` entirely:

:class:`AccumulatingModel` — for ``model.fit``. Wraps a built model. ``fit`` receives batches of the
    *effective* size (``k`` × micro-batch); each training step splits its per-replica share into
    ``k`` micro-batches, runs forward + backward on one at a time (serialized, so only one
    micro-batch's activations are alive), sums the gradients in local tensors and applies their mean
    once. One ``fit`` step = one optimizer update.

:class:`GradientAccumulator` — for custom loops over micro-batches streamed from a distributed
    dataset. ``micro_step(batch)`` (a ``tf.function`` running ``strategy.run``) adds one
    micro-batch's gradient to per-replica accumulators — ``tf.Variable``s with
    ``synchronization=ON_READ`` created in ``strategy.scope()``, so each replica keeps its own sum and
    no cross-replica traffic happens per micro-step; ``apply()`` (another ``tf.function``) hands the
    sums to ``optimizer.apply_gradients``, which all-reduces them with SUM across replicas, applies
    once and resets the accumulators. The Python caller decides when to apply: no ``cond``.

Averaging (global-batch semantics): each replica's loss is
``tf.nn.compute_average_loss(per_example_loss, global_batch_size=k * B * replicas)``; summing these
over micro-steps (accumulators) and replicas (SUM all-reduce) gives exactly the gradient of the mean
loss over the ``k·B·replicas`` examples — the same as one big batch. (A ``reduce_mean`` per replica
makes the update ``replicas`` times too large; forgetting ``/k`` makes it ``k`` times too large.)

Units: **``optimizer.iterations`` counts updates**, not micro-steps, with both tools, so learning-rate
schedules and warm-up lengths are written in updates (= big-batch steps). Keras' built-in option
differs: its ``optimizer.iterations`` reports updates but its learning-rate schedule is evaluated at
the micro-step counter (``optimizer._iterations``), so a 100-step warm-up ends after 100/k updates.

Mixed precision: ``mixed_bfloat16`` needs nothing (variables and accumulators stay float32). With
``mixed_float16`` wrap the optimizer in ``keras.optimizers.LossScaleOptimizer`` (``compile`` does it
for ``fit``; custom loops must do it themselves): each micro-step's loss is multiplied by the current
scale, the accumulated scaled gradients are unscaled once in ``apply_gradients``, and if any
micro-batch overflowed the whole update is skipped and the scale halved.

Caveat: layers that update state in the forward pass (BatchNormalization's moving statistics) do so
once per micro-batch, from micro-batch statistics — accumulation is exactly equivalent to the big
batch only for models without such layers.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = [
    "AccumulatingModel",
    "GradientAccumulator",
    "distributed_train_step",
    # measurements the lesson and the tests use
    "batchnorm_caveat",
    "builtin_accumulation",
    "compare_with_big_batch",
    "loss_averaging_effect",
    "loss_scaling_demo",
    "max_abs_diff",
    "run_with_replicas",
    "schedule_units",
    "tiny_classifier",
    "toy_data",
]


def _tf():
    import tensorflow as tf

    return tf


# ----------------------------------------------------------------------------------------------
# For model.fit
# ----------------------------------------------------------------------------------------------


def _build_accumulating_model_class():
    """The class is built on first use (``accumulation.AccumulatingModel``), so that importing this
    module does not import TensorFlow and Keras."""
    import keras
    import tensorflow as tf

    class AccumulatingModel(keras.Model):
        """Wraps ``model`` so that ``fit`` accumulates gradients over ``steps`` micro-batches.

        Create and ``compile`` it inside ``strategy.scope()``::

            with strategy.scope():
                model = make_model()
                acc = AccumulatingModel(model, steps=4)
                acc.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
            acc.fit(ds_batched_at_4_times_the_micro_batch, ...)

        ``fit``'s batch is the effective batch: each replica's share must be divisible by ``steps``.
        One fit step = one optimizer update (``optimizer.iterations`` counts updates). The wrapped
        model's weights are the wrapper's weights (``acc.get_weights() == model.get_weights()``).
        """

        def __init__(self, model, steps: int, **kwargs):
            super().__init__(**kwargs)
            if int(steps) < 1:
                raise ValueError(f"steps must be >= 1, got {steps}")
            self.model = model
            self.accumulation_steps = int(steps)

        def call(self, inputs, training=None):
            return self.model(inputs, training=training)

        @tf.autograph.experimental.do_not_convert  # plain Python loop over k on purpose: no AutoGraph
        def train_step(self, data):
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            k = self.accumulation_steps

            def split(structure):  # k structures like `structure`, each leaf cut into k equal parts
                if structure is None:
                    return [None] * k
                pieces = [tf.split(t, k, axis=0) for t in tf.nest.flatten(structure)]  # raises if not divisible
                return [tf.nest.pack_sequence_as(structure, [p[i] for p in pieces]) for i in range(k)]

            xs, ys, ws = split(x), split(y), split(sample_weight)

            variables = self.trainable_weights
            acc = None
            metrics = {}
            for i in range(k):  # unrolled: k copies of forward+backward, chained below
                xb, yb, wb = xs[i], ys[i], ws[i]
                if acc is not None:  # start micro-batch i only after micro-batch i-1's gradients exist,
                    with tf.control_dependencies(acc):  # so only one micro-batch's activations are alive
                        xb = tf.nest.map_structure(tf.identity, xb)
                with tf.GradientTape() as tape:
                    y_pred = self(xb, training=True)
                    loss = self.compute_loss(x=xb, y=yb, y_pred=y_pred, sample_weight=wb, training=True)
                    self._loss_tracker.update_state(
                        _unscale(loss), sample_weight=tf.shape(tf.nest.flatten(xb)[0])[0]
                    )
                    scaled = self.optimizer.scale_loss(loss) if self.optimizer is not None else loss
                grads = tape.gradient(scaled, variables)
                grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, variables)]
                acc = grads if acc is None else [a + g for a, g in zip(acc, grads)]
                metrics = self.compute_metrics(xb, yb, y_pred, sample_weight=wb)
            mean = [a / tf.cast(k, a.dtype) for a in acc]
            self.optimizer.apply_gradients(zip(mean, variables))  # all-reduces (SUM) across replicas
            return metrics

        def get_config(self):
            return {"model": keras.saving.serialize_keras_object(self.model),
                    "steps": self.accumulation_steps, "name": self.name}

        @classmethod
        def from_config(cls, config):
            config = dict(config)
            config["model"] = keras.saving.deserialize_keras_object(config["model"])
            return cls(**config)

    return AccumulatingModel


def _unscale(loss):
    """Keras scales each replica's loss by 1/replicas for the SUM all-reduce; undo it for logging."""
    from keras.src.losses import loss as loss_module

    return loss_module.unscale_loss_for_distribution(loss)


_CLASSES: dict[str, Any] = {}


def __getattr__(name: str):
    if name == "AccumulatingModel":
        if name not in _CLASSES:
            _CLASSES[name] = _build_accumulating_model_class()
        return _CLASSES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------------------------
# For custom loops
# ----------------------------------------------------------------------------------------------


class GradientAccumulator:
    """Accumulate ``steps`` micro-batches per replica, then apply once — under any strategy.

    Build it inside ``strategy.scope()`` (it creates the per-replica accumulators there)::

        with strategy.scope():
            model = make_model()
            optimizer = keras.optimizers.SGD(0.1)          # LossScaleOptimizer(...) for mixed_float16
            acc = GradientAccumulator(model, optimizer, per_example_loss, steps=4,
                                      global_micro_batch=B * strategy.num_replicas_in_sync)
        dist_ds = strategy.experimental_distribute_dataset(ds.batch(B * replicas, drop_remainder=True))
        for i, batch in enumerate(dist_ds):
            acc.micro_step(batch)               # returns this micro-batch's share of the mean loss
            if (i + 1) % acc.steps == 0:
                acc.apply()                     # one optimizer update

    ``per_example_loss(y_true, y_pred)`` returns one loss per example (e.g. a Keras loss built with
    ``reduction=None``). ``element_spec``: the distributed dataset's ``element_spec``, to trace
    ``micro_step`` once with a fixed input signature. ``metrics``: Keras metrics (created in the scope)
    updated as ``metric.update_state(y_true, y_pred)`` each micro-step; they aggregate across replicas.
    """

    def __init__(
        self,
        model,
        optimizer,
        per_example_loss: Callable,
        steps: int,
        global_micro_batch: int,
        strategy=None,
        element_spec=None,
        metrics=(),
    ):
        tf = _tf()
        if int(steps) < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        self.strategy = strategy or tf.distribute.get_strategy()
        if not self.strategy.extended.variable_created_in_scope(model.trainable_weights[0].value):
            raise ValueError("build the model (and this accumulator) inside strategy.scope()")
        self.model, self.optimizer, self.per_example_loss = model, optimizer, per_example_loss
        self.steps = int(steps)
        self.global_micro_batch = int(global_micro_batch)
        self.effective_global_batch = self.steps * self.global_micro_batch
        self.metrics = list(metrics)
        self.micro_steps_done = 0  # since the last apply (Python side)
        with self.strategy.scope():
            self.accumulators = [
                tf.Variable(
                    tf.zeros(v.shape, dtype=v.dtype),
                    trainable=False,
                    synchronization=tf.VariableSynchronization.ON_READ,  # one private copy per replica
                    aggregation=tf.VariableAggregation.SUM,  # read across replicas: the sum
                    name=f"accumulated_{v.name}".replace(":", "_"),
                )
                for v in model.trainable_weights
            ]
        signature = None if element_spec is None else [element_spec]
        # autograph=False: no data-dependent Python control flow here, so nothing to convert.
        self._micro_step_fn = tf.function(self._distributed_micro_step, input_signature=signature, autograph=False)
        self._apply_fn = tf.function(self._distributed_apply, autograph=False)

    # -- per replica -------------------------------------------------------------------------
    def _replica_micro_step(self, batch):
        tf = _tf()
        x, y = batch[0], batch[1]
        with tf.GradientTape() as tape:
            y_pred = self.model(x, training=True)
            per_example = self.per_example_loss(y, y_pred)
            loss = tf.nn.compute_average_loss(
                tf.cast(per_example, tf.float32), global_batch_size=self.effective_global_batch
            )
            if self.model.losses:  # regularization: counted once per update, split over replicas
                loss += tf.nn.scale_regularization_loss(tf.add_n(self.model.losses)) / self.steps
            scaled = self.optimizer.scale_loss(loss)  # × loss scale for a LossScaleOptimizer, else identity
        grads = tape.gradient(scaled, self.model.trainable_weights)
        for acc, g in zip(self.accumulators, grads):
            if g is not None:
                acc.assign_add(tf.cast(g, acc.dtype))
        for metric in self.metrics:
            metric.update_state(y, y_pred)
        return loss

    def _replica_apply(self):
        tf = _tf()
        grads = [tf.identity(acc) for acc in self.accumulators]  # this replica's sum (ON_READ: local copy)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_weights))  # SUM all-reduce, unscale
        with tf.control_dependencies(grads):
            for acc in self.accumulators:
                acc.assign(tf.zeros_like(acc))
        return tf.constant(0)

    # -- across replicas -----------------------------------------------------------------------
    def _distributed_micro_step(self, batch):
        tf = _tf()
        per_replica = self.strategy.run(self._replica_micro_step, args=(batch,))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def _distributed_apply(self):
        self.strategy.run(self._replica_apply)
        return self.optimizer.iterations

    def micro_step(self, batch):
        """Add one distributed micro-batch's gradient. Returns its share of the update's mean loss
        (the sum over ``steps`` micro-steps is the mean loss over the effective batch)."""
        self.micro_steps_done += 1
        return self._micro_step_fn(batch)

    def apply(self):
        """Apply the accumulated mean gradient once and reset. Returns ``optimizer.iterations``."""
        if self.micro_steps_done != self.steps:
            raise RuntimeError(
                f"apply() after {self.micro_steps_done} micro-steps, expected {self.steps}: the mean would be "
                "wrong (drop the incomplete remainder, e.g. with dataset.batch(..., drop_remainder=True))"
            )
        self.micro_steps_done = 0
        return self._apply_fn()

    def train(self, dist_dataset, updates: int | None = None) -> list[float]:
        """Run micro-steps over ``dist_dataset``, applying every ``steps``; returns each update's mean loss.
        An incomplete final group of micro-batches is dropped (never applied with the wrong mean)."""
        losses, total = [], 0.0
        for batch in dist_dataset:
            total += float(self.micro_step(batch))
            if self.micro_steps_done == self.steps:
                self.apply()
                losses.append(total)
                total = 0.0
                if updates is not None and len(losses) >= updates:
                    break
        if self.micro_steps_done:
            self.reset()
        return losses

    def reset(self):
        """Forget a partial accumulation."""
        tf = _tf()
        self.micro_steps_done = 0

        def zero():
            for acc in self.accumulators:
                acc.assign(tf.zeros_like(acc))

        self.strategy.run(tf.function(zero, autograph=False))


def distributed_train_step(strategy, model, optimizer, per_example_loss, global_batch: int,
                           element_spec=None, per_replica_mean: bool = False):
    """A plain (no accumulation) custom-loop step: ``strategy.run`` + ``compute_average_loss`` with the
    global batch + SUM reduce, traced once with ``element_spec`` as a fixed input signature.

    ``per_replica_mean=True`` reproduces the common mistake — ``tf.reduce_mean`` of each replica's
    loss — whose update is ``num_replicas_in_sync`` times too large (for teaching only).
    """
    tf = _tf()

    def replica_step(batch):
        x, y = batch[0], batch[1]
        with tf.GradientTape() as tape:
            per_example = tf.cast(per_example_loss(y, model(x, training=True)), tf.float32)
            if per_replica_mean:
                loss = tf.reduce_mean(per_example)  # WRONG under a strategy: ignores the other replicas
            else:
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_weights)
        optimizer.apply_gradients(zip(grads, model.trainable_weights))
        return loss

    def step(batch):
        per_replica = strategy.run(replica_step, args=(batch,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return tf.function(step, input_signature=None if element_spec is None else [element_spec], autograph=False)


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
                    wrapped = __getattr__("AccumulatingModel")(model, steps=steps)
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


def run_with_replicas(replicas: int, strategy, name: str, **kwargs) -> dict:
    """``<name>(strategy, **kwargs)`` from this module on a strategy with ``replicas`` replicas: here if
    ``strategy`` has that many, else in a fresh process whose CPU is split into ``replicas`` devices
    (``course_utils.runtime.run_on_cpu_replicas``). Returns the function's dict (plus ``"where"``)."""
    import json

    if strategy is not None and strategy.num_replicas_in_sync == replicas:
        return dict(globals()[name](strategy, **kwargs), where="this notebook's strategy")
    from . import runtime

    code = (
        "import json, course_utils\nfrom course_utils import accumulation as a\n"
        f"print(json.dumps(a.{name}(course_utils.detect().strategy, **json.loads({json.dumps(json.dumps(kwargs))}))))"
    )
    out = runtime.run_on_cpu_replicas(replicas, code)
    return dict(json.loads(out.strip().splitlines()[-1]), where=f"a fresh process with {replicas} CPU replicas")


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
        wrapped = __getattr__("AccumulatingModel")(model, steps=steps)
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
            trained = model if name == "big batch" else __getattr__("AccumulatingModel")(model, steps=steps)
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
