"""Gradient accumulation that works under any ``tf.distribute`` strategy, and the custom-loop pieces.

Gradient accumulation trades time for memory: it computes the gradient of an effective batch of
``k·B`` examples per replica as ``k`` micro-batches of ``B``, so the activations held for backprop
are those of ``B``. Keras 3's own ``SGD(..., gradient_accumulation_steps=k)`` works on one device but
crashes under ``MirroredStrategy`` (``merge_call`` inside a ``Cond``: keras-team/keras#20582),
because it decides "apply or accumulate?" with a ``cond`` in replica context, and the optimizer's
all-reduce cannot run inside one. Both tools here avoid that ``cond`` entirely:

:class:`AccumulatingModel` — for ``model.fit``. Wraps a built model. ``fit`` receives batches of the
    *effective* size (``k`` × micro-batch); each training step splits its per-replica share into
    ``k`` micro-batches and runs forward + backward on one at a time inside a ``tf.while_loop`` that
    carries only the gradient sums, so only one micro-batch's activations are alive — also under XLA
    (``jit_compile=True``, how every TPU step runs), which is free to reorder an unrolled Python loop
    into the big batch's peak. Then it applies the mean once. One ``fit`` step = one optimizer update.

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
``mixed_float16`` the optimizer must be a ``keras.optimizers.LossScaleOptimizer``. ``compile`` wraps it only when
the model it is called on — for :class:`AccumulatingModel`, the wrapper — was constructed under the *global*
``mixed_float16`` policy (``Trainer.compile`` reads the model's own ``dtype_policy``): per-layer policies, or a
wrapper created while the global policy is float32, get no loss scaling; custom loops wrap it themselves. Each
micro-step's loss is multiplied by the current scale, the accumulated scaled gradients are unscaled once when
applied, and if any micro-batch on any replica overflowed the whole update is skipped on every replica and the
scale halved. Keras alone does not do that last part under ``MirroredStrategy``: ``LossScaleOptimizer.apply``
decides "finite → apply, else skip" in cross-replica context (``merge_call``) from the *first* replica's
gradients, which the inner optimizer all-reduces only afterwards, so another replica's overflow is summed into
every replica's weights. :class:`AccumulatingModel` all-reduces a "not finite" flag first and makes every replica's
gradients NaN when one overflowed; :func:`apply_per_replica_gradients` (the custom-loop tools) decides once, across
replicas.

Caveat: layers that update state in the forward pass (BatchNormalization's moving statistics) do so
once per micro-batch, from micro-batch statistics — accumulation is exactly equivalent to the big
batch only for models without such layers.
"""

from __future__ import annotations

from typing import Callable

import keras
import tensorflow as tf

__all__ = [
    "AccumulatingModel",
    "GradientAccumulator",
    "distributed_train_step",
    "apply_per_replica_gradients",
]
# The lesson's measurements (equal weights to the big batch, the averaging bugs, the caveats) are in
# course_utils.lessons.gradient_accumulation.experiments.


# ----------------------------------------------------------------------------------------------
# For model.fit
# ----------------------------------------------------------------------------------------------


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

    def fit(self, x=None, y=None, batch_size=None, *args, **kwargs):
        """``keras.Model.fit``, after checking that every batch splits into ``steps`` micro-batches
        on every replica — before training, not after an epoch's worth of updates.

        Arrays: ``batch_size`` must be a multiple of replicas × steps; an incomplete last batch is
        dropped with a warning (its mean would be over a different number of examples). A
        ``tf.data.Dataset`` must be batched with ``drop_remainder=True`` (a static batch size) that is
        a multiple of replicas × steps."""
        replicas = self.distribute_strategy.num_replicas_in_sync
        k = self.accumulation_steps
        unit = replicas * k
        if isinstance(x, tf.data.Dataset):
            first = tf.nest.flatten(x.element_spec)[0]
            size = first.shape[0] if first.shape.rank else None
            if size is None:
                raise ValueError(
                    f"AccumulatingModel(steps={k}) needs a fixed batch size: batch the dataset with "
                    "drop_remainder=True (a ragged last batch cannot split into equal micro-batches)"
                )
            if size % unit:
                raise ValueError(
                    f"AccumulatingModel(steps={k}) on {replicas} replica(s): the batch size {size} must be a "
                    f"multiple of replicas × steps = {unit}"
                )
        elif x is not None and hasattr(x, "__len__") and not isinstance(x, (dict, list, tuple)):
            batch = 32 if batch_size is None else int(batch_size)
            if batch % unit:
                raise ValueError(
                    f"AccumulatingModel(steps={k}) on {replicas} replica(s): batch_size={batch} must be a "
                    f"multiple of replicas × steps = {unit}"
                )
            n = len(x)
            keep = n - n % batch
            if keep != n:
                import warnings

                warnings.warn(
                    f"AccumulatingModel: dropping the last {n - keep} of {n} examples (an incomplete batch "
                    f"of {batch} cannot split into {k} equal micro-batches per replica)",
                    stacklevel=2,
                )
                x = x[:keep]
                y = None if y is None else y[:keep]
                if kwargs.get("sample_weight") is not None:
                    kwargs["sample_weight"] = kwargs["sample_weight"][:keep]
        return super().fit(x, y, batch_size, *args, **kwargs)

    @tf.autograph.experimental.do_not_convert  # the loop below is an explicit tf.while_loop
    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        k = self.accumulation_steps
        leaves = [t for t in tf.nest.flatten((x, y, sample_weight)) if t is not None]
        n = tf.shape(leaves[0])[0]
        tf.debugging.assert_equal(
            n % k,
            0,
            message=f"AccumulatingModel(steps={k}): each replica's batch must be divisible "
            f"by {k}; drop the ragged last batch (dataset.batch(..., drop_remainder=True))",
        )
        micro = n // k

        def split(structure):  # leaf [k*m, ...] -> [k, m, ...]; micro-batch i is [i]
            if structure is None:
                return None
            return tf.nest.map_structure(
                lambda t: tf.reshape(t, tf.concat([[k, micro], tf.shape(t)[1:]], 0)), structure
            )

        xs, ys, ws = split(x), split(y), split(sample_weight)
        variables = self.trainable_weights

        def pick(structure, i):
            if structure is None:
                return None
            return tf.nest.map_structure(lambda t: tf.gather(t, i), structure)

        def body(i, acc):
            xb, yb, wb = pick(xs, i), pick(ys, i), pick(ws, i)
            with tf.GradientTape() as tape:
                y_pred = self(xb, training=True)
                loss = self.compute_loss(x=xb, y=yb, y_pred=y_pred, sample_weight=wb, training=True)
                self._loss_tracker.update_state(_unscale(loss), sample_weight=micro)
                scaled = self.optimizer.scale_loss(loss) if self.optimizer is not None else loss
            grads = tape.gradient(scaled, variables)
            grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, variables)]
            self.compute_metrics(xb, yb, y_pred, sample_weight=wb)
            return i + 1, [a + tf.cast(g, a.dtype) for a, g in zip(acc, grads)]

        # One micro-batch per iteration of a real loop: its forward and backward run, their
        # activations are freed, and only the gradient sums are carried to the next iteration.
        # A Python loop (unrolled) would rely on control dependencies that XLA is free to
        # reorder — under jit_compile (every TPU step) its peak grew to that of the big batch.
        zeros = [tf.zeros(v.shape, dtype=v.dtype) for v in variables]
        _, acc = tf.while_loop(
            lambda i, _: i < k, body, (tf.constant(0), zeros), parallel_iterations=1, maximum_iterations=k
        )
        mean = [a / tf.cast(k, a.dtype) for a in acc]
        mean = _overflow_everywhere(self.optimizer, mean)  # LossScaleOptimizer: skip on all replicas or none
        self.optimizer.apply_gradients(zip(mean, variables))  # all-reduces (SUM) across replicas
        return self.get_metrics_result()

    def get_config(self):
        return {
            "model": keras.saving.serialize_keras_object(self.model),
            "steps": self.accumulation_steps,
            "name": self.name,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["model"] = keras.saving.deserialize_keras_object(config["model"])
        return cls(**config)


def _overflow_everywhere(optimizer, grads):
    """In replica context, before a ``LossScaleOptimizer``'s ``apply_gradients`` on several replicas: if any replica's
    gradients are not finite, make every replica's NaN, so that Keras skips the update on all of them and halves the
    scale. Keras decides from the *first* replica's gradients only (``LossScaleOptimizer._tf_apply``, in cross-replica
    context via ``merge_call``; the gradients are all-reduced later, inside the inner optimizer), so an overflow on
    another replica would be summed into every replica's weights. One scalar all-reduce per update."""
    context = tf.distribute.get_replica_context()
    if not _is_loss_scale_optimizer(optimizer) or context is None or context.num_replicas_in_sync < 2:
        return grads
    local_bad = tf.logical_not(tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads]))
    bad = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(local_bad, tf.float32))
    poison = tf.where(bad > 0, tf.constant(float("nan")), tf.constant(0.0))
    return [g + tf.cast(poison, g.dtype) for g in grads]


def _unscale(loss):
    """Keras scales each replica's loss by 1/replicas for the SUM all-reduce (its
    ``unscale_loss_for_distribution`` undoes it the same way); undo it for logging."""
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    return loss * tf.cast(replicas, loss.dtype) if replicas > 1 else loss


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
        _build_optimizer(self.strategy, optimizer, model.trainable_weights)
        signature = None if element_spec is None else [element_spec]
        # autograph=False: no data-dependent Python control flow here, so nothing to convert.
        self._micro_step_fn = tf.function(self._distributed_micro_step, input_signature=signature, autograph=False)
        self._apply_fn = tf.function(self._distributed_apply, autograph=False)

    # -- per replica -------------------------------------------------------------------------
    def _replica_micro_step(self, batch):
        x, y = batch[0], batch[1]
        weight = batch[2] if len(batch) > 2 else None  # (x, y, sample_weight) batches
        with tf.GradientTape() as tape:
            y_pred = self.model(x, training=True)
            per_example = tf.cast(self.per_example_loss(y, y_pred), tf.float32)
            loss = tf.nn.compute_average_loss(
                per_example,
                sample_weight=None if weight is None else tf.cast(weight, tf.float32),
                global_batch_size=self.effective_global_batch,
            )
            if self.model.losses:  # regularization: counted once per update, split over replicas
                loss += tf.nn.scale_regularization_loss(tf.add_n(self.model.losses)) / self.steps
            scaled = self.optimizer.scale_loss(loss)  # × loss scale for a LossScaleOptimizer, else identity
        grads = tape.gradient(scaled, self.model.trainable_weights)
        for acc, g in zip(self.accumulators, grads):
            if g is not None:
                acc.assign_add(tf.cast(g, acc.dtype))
        for metric in self.metrics:
            metric.update_state(y, y_pred, sample_weight=weight)
        return loss

    def _replica_read(self):
        return [tf.identity(acc) for acc in self.accumulators]  # this replica's sum (ON_READ: local copy)

    def _replica_reset(self):
        for acc in self.accumulators:
            acc.assign(tf.zeros_like(acc))
        return tf.constant(0)

    # -- across replicas -----------------------------------------------------------------------
    def _distributed_micro_step(self, batch):
        per_replica = self.strategy.run(self._replica_micro_step, args=(batch,))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def _distributed_apply(self):
        grads = self.strategy.run(self._replica_read)
        applied = apply_per_replica_gradients(self.strategy, self.optimizer, grads, self.model.trainable_weights)
        with tf.control_dependencies([applied]):
            self.strategy.run(self._replica_reset)
            return tf.identity(applied)

    def micro_step(self, batch):
        """Add one distributed micro-batch's gradient. Returns its share of the update's mean loss
        (the sum over ``steps`` micro-steps is the mean loss over the effective batch)."""
        first = tf.nest.flatten(batch)[0]
        sizes = [t.shape[0] for t in self.strategy.experimental_local_results(first)]
        if all(isinstance(n, int) for n in sizes) and sum(sizes) != self.global_micro_batch:
            raise ValueError(
                f"GradientAccumulator: a micro-batch of {sum(sizes)} examples {sizes}, expected global_micro_batch="
                f"{self.global_micro_batch}: batch the dataset with drop_remainder=True (a ragged micro-batch would "
                "make the mean wrong)"
            )
        self.micro_steps_done += 1
        return self._micro_step_fn(batch)

    def apply(self):
        """Apply the accumulated mean gradient once and reset. Returns whether it was applied
        (``False``: a ``LossScaleOptimizer`` found an inf/NaN on some replica, skipped the update on
        every replica and halved its scale)."""
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
        self.micro_steps_done = 0

        def zero():
            for acc in self.accumulators:
                acc.assign(tf.zeros_like(acc))

        self.strategy.run(tf.function(zero, autograph=False))


def distributed_train_step(
    strategy, model, optimizer, per_example_loss, global_batch: int, element_spec=None, per_replica_mean: bool = False
):
    """A plain (no accumulation) custom-loop step: ``strategy.run`` + ``compute_average_loss`` with the
    global batch + SUM reduce, traced once with ``element_spec`` as a fixed input signature.

    ``per_replica_mean=True`` reproduces the common mistake — ``tf.reduce_mean`` of each replica's
    loss — whose update is ``num_replicas_in_sync`` times too large (for teaching only).
    """

    def replica_grads(batch):
        x, y = batch[0], batch[1]
        with tf.GradientTape() as tape:
            per_example = tf.cast(per_example_loss(y, model(x, training=True)), tf.float32)
            if per_replica_mean:
                loss = tf.reduce_mean(per_example)  # WRONG under a strategy: ignores the other replicas
            else:
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            scaled = optimizer.scale_loss(loss)
        return tape.gradient(scaled, model.trainable_weights), loss

    def step(batch):
        grads, per_replica = strategy.run(replica_grads, args=(batch,))
        applied = apply_per_replica_gradients(strategy, optimizer, grads, model.trainable_weights)
        with tf.control_dependencies([applied]):
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    _build_optimizer(strategy, optimizer, model.trainable_weights)
    return tf.function(step, input_signature=None if element_spec is None else [element_spec], autograph=False)


def _is_loss_scale_optimizer(optimizer) -> bool:
    return isinstance(optimizer, keras.optimizers.LossScaleOptimizer)


def _build_optimizer(strategy, optimizer, variables) -> None:
    """Create the optimizer's variables (slots, loss scale) in the strategy's scope, before tracing."""
    if not optimizer.built:
        with strategy.scope():
            optimizer.build(variables)


def apply_per_replica_gradients(strategy, optimizer, grads, variables):
    """Apply per-replica gradients (the result of ``strategy.run``) once: SUM all-reduce and update.
    Call it in cross-replica context, inside a ``tf.function``. Returns a bool tensor: applied.

    A plain optimizer applies in each replica (its ``apply_gradients`` all-reduces). A ``LossScaleOptimizer`` is
    not left to Keras: under ``MirroredStrategy`` its ``apply`` decides "finite → apply, else skip" in cross-replica
    context (``merge_call``) from the first replica's gradients only (``LossScaleOptimizer._tf_apply``; the
    all-reduce comes later, in the inner optimizer), so an overflow on another replica would reach every replica's
    weights. Here every replica first reports whether its gradients are finite, all-reduced, so all agree; then one
    ``tf.cond``, in cross-replica context, either runs ``strategy.run`` of the inner optimizer's
    ``apply_gradients`` on the unscaled gradients (one all-reduce, then the update; the scale grows after
    ``dynamic_growth_steps`` finite steps) or skips on every replica and halves the scale — Keras' rules. The
    all-reduce inside that branch is fine: the branch re-enters replica context through ``strategy.run`` (no
    ``merge_call`` from inside a replica's ``cond``, which is what fails in lesson 05 §4), and since the predicate is
    the same everywhere, every replica takes the branch and joins the collective.
    Build the optimizer first (:func:`_build_optimizer`): created inside a traced step on several mirrored
    replicas, its variables make the step fail (the placeholder error of lesson 04 §7).
    """
    if not _is_loss_scale_optimizer(optimizer):

        def replica_apply(g):
            optimizer.apply_gradients(zip(g, variables))
            return tf.constant(True)

        return strategy.experimental_local_results(strategy.run(replica_apply, args=(grads,)))[0]

    def replica_finite(g):
        local_ok = tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in g if t is not None])
        bad = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, tf.cast(tf.logical_not(local_ok), tf.float32)
        )
        return tf.equal(bad, 0.0)

    finite = strategy.experimental_local_results(strategy.run(replica_finite, args=(grads,)))[0]
    scale = optimizer.dynamic_scale

    def replica_apply_unscaled(g):
        unscaled = [None if t is None else t / tf.cast(scale, t.dtype) for t in g]
        optimizer.inner_optimizer.apply_gradients(zip(unscaled, variables))  # SUM all-reduce, update
        return tf.constant(True)

    def apply():
        strategy.run(replica_apply_unscaled, args=(grads,))
        grow = tf.equal(optimizer.step_counter, optimizer.dynamic_growth_steps - 1)
        new_scale = tf.where(grow, scale * 2.0, tf.identity(scale))
        new_counter = tf.where(grow, tf.zeros_like(optimizer.step_counter), optimizer.step_counter + 1)
        with tf.control_dependencies([new_scale, new_counter]):
            optimizer.dynamic_scale.assign(new_scale)
            optimizer.step_counter.assign(new_counter)
        return tf.constant(True)

    def skip():
        new_scale = scale * 0.5
        optimizer.dynamic_scale.assign(new_scale)
        optimizer.step_counter.assign(tf.zeros_like(optimizer.step_counter))
        return tf.constant(False)

    return tf.cond(finite, apply, skip)
