"""Lesson 03's experiments (mixed precision): what a 16-bit softmax really does to Keras' cross-entropy,
and the training step whose time and peak memory are compared between float32 and a mixed policy.

The reusable tools they use (peak memory in a fresh process, the recommended policy, timing) are in
:mod:`course_utils.memory` and :mod:`course_utils.timing`.
"""

from __future__ import annotations

from typing import Any


def confident_logits(rows: int = 4096, num_classes: int = 10, boost: float = 8.0, sigma: float = 3.0, seed: int = 0):
    """``(logits, labels)`` shaped like a confident classifier's output: normal logits (σ = ``sigma``) plus
    ``boost`` on class 0, which is the label of every row. float32 numpy arrays (labels int64)."""
    import numpy as np

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
    import keras
    import tensorflow as tf

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
    import numpy as np

    value, reference = np.asarray(value, np.float64), np.asarray(reference, np.float64)
    if axis is None:
        return np.abs(value - reference) / np.abs(reference)
    return np.abs(value - reference).sum(axis) / np.abs(reference).sum(axis)


def training_step(policy: str, width: int = 32, batch: int = 256, num_classes: int = 10, jit: bool = False,
                  seed: int = 0, strategy: Any = None):
    """One training step (forward, backward, Adam update) of the course's ``small_cnn`` built under
    ``policy``, on a fixed batch of ``batch`` synthetic CIFAR-shaped images, as a zero-argument
    ``tf.function`` (``jit_compile=jit``) returning the loss. Under ``mixed_float16`` the optimizer is a
    ``LossScaleOptimizer``. ``strategy``: build and run under it (default: the current one), the batch being
    the global batch. A step for :func:`course_utils.memory.measure_peaks_isolated` and for timing."""
    import keras
    import tensorflow as tf

    from .. import data, models

    strategy = strategy or tf.distribute.get_strategy()
    x, y = data.synthetic_cifar(batch, 1, num_classes=num_classes, seed=seed)[0]
    x, y = tf.constant(x), tf.constant(y)
    model = models.build_under_policy(policy, strategy=strategy, width=width, num_classes=num_classes)
    with strategy.scope():
        optimizer = keras.optimizers.Adam(1e-3)
        if policy == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            scaled = optimizer.scale_loss(loss)  # × the loss scale under mixed_float16, unchanged otherwise
        optimizer.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
        return loss

    step = tf.function(lambda: strategy.run(replica_step, args=(x, y)), jit_compile=jit)
    step.model = model
    return step


def training_step_peaks(strategy, policies, repeats: int = 3, **kwargs) -> dict:
    """Peak memory of :func:`training_step` per policy, each in isolation
    (:func:`course_utils.memory.measure_peaks_isolated`): in a fresh process on a CPU; in this process,
    under ``strategy``, on a TPU or GPU (which belongs to this process). ``kwargs``: the step's sizes."""
    from .. import memory

    fresh = memory.default_device() == "CPU:0"
    variants = {p: dict(kwargs, policy=p, **({} if fresh else {"strategy": strategy})) for p in policies}
    return memory.measure_peaks_isolated(training_step, variants, repeats=repeats, fresh_process=fresh)
