"""`course_utils.lessons.mixed_precision.exercises`: each exercise's reference answer and typical wrong
answers (each with words its message must contain). Only the tests read them, so they live here."""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def _step_reference(model, optimizer, loss_fn, x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
        scaled = optimizer.scale_loss(loss)
    optimizer.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
    return loss


def _step_unscaled(model, optimizer, loss_fn, x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return loss


def _step_double_unscale(model, optimizer, loss_fn, x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
        scaled = optimizer.scale_loss(loss)
    grads = [g / optimizer.dynamic_scale for g in tape.gradient(scaled, model.trainable_variables)]
    optimizer.apply(grads, model.trainable_variables)
    return loss


def _step_bias_only(model, optimizer, loss_fn, x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
        scaled = optimizer.scale_loss(loss)
    bias = model.layers[0].bias
    optimizer.apply([tape.gradient(scaled, bias)], [bias])
    return loss


def _step_returns_scaled(model, optimizer, loss_fn, x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
        scaled = optimizer.scale_loss(loss)
    optimizer.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
    return scaled


def _step_scale_outside_tape(model, optimizer, loss_fn, x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    scaled = optimizer.scale_loss(loss)  # outside the tape: the tape never saw it
    optimizer.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
    return loss


def _step_fixed_scale(model, optimizer, loss_fn, x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
        scaled = loss * 32768.0  # Keras' default initial scale, hard-coded
    optimizer.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
    return loss


def _step_unscale_then_inner(model, optimizer, loss_fn, x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
        scaled = optimizer.scale_loss(loss)
    grads = [g / optimizer.dynamic_scale for g in tape.gradient(scaled, model.trainable_variables)]
    optimizer.inner_optimizer.apply(grads, model.trainable_variables)  # no inf/NaN check, no scale update
    return loss


def _step_inner(model, optimizer, loss_fn, x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
        scaled = optimizer.scale_loss(loss)
    optimizer.inner_optimizer.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
    return loss


def _by_hand(model, optimizer, loss_fn, x, y, apply_unscaled):
    """Scales the loss, then unscales, skips an overflow and halves the scale by hand; a finite step goes to
    ``apply_unscaled(optimizer, grads, scale)``."""
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
        scaled = optimizer.scale_loss(loss)
    grads = tape.gradient(scaled, model.trainable_variables)
    scale = optimizer.dynamic_scale
    if all(np.all(np.isfinite(g.numpy())) for g in grads):
        apply_unscaled(optimizer, grads, scale, model.trainable_variables)
    else:
        scale.assign(scale / 2)
    return loss


def _step_by_hand(model, optimizer, loss_fn, x, y):
    """All by hand: the weights change by the right amount, but the optimizer never applies a step (no step count,
    no momentum, no growth of the scale)."""

    def assign(opt, grads, scale, variables):
        for variable, grad in zip(variables, grads):
            variable.assign_sub(opt.learning_rate * tf.cast(grad, variable.dtype) / scale)

    return _by_hand(model, optimizer, loss_fn, x, y, assign)


def _step_by_hand_inner(model, optimizer, loss_fn, x, y):
    """By hand, applied with the inner optimizer: the weights and ``optimizer.iterations`` (the inner optimizer's)
    move right, but the scale never grows."""

    def inner(opt, grads, scale, variables):
        opt.inner_optimizer.apply([tf.cast(g, tf.float32) / scale for g in grads], variables)

    return _by_hand(model, optimizer, loss_fn, x, y, inner)


ANSWERS = {
    "layer_dtypes": (
        lambda: ("bfloat16", "float32"),
        (
            ("swapped", lambda: ("float32", "bfloat16"), "swapped"),
            ("pure bf16", lambda: ("bfloat16", "bfloat16"), "pure 'bfloat16' policy"),
            ("float16", lambda: ("float16", "float32"), "mixed_float16"),
            ("one string", lambda: "bfloat16", "Expected a pair"),
            ("not dtypes", lambda: ("fast", "slow"), "Expected two dtype names"),
            ("DataType enum ints", lambda: (14, 1), "Expected two dtype names"),
        ),
    ),
    "loss_scaled_step": (
        lambda: _step_reference,
        (
            ("no scaling", lambda: _step_unscaled, "underflowed to zero"),
            ("unscaled twice", lambda: _step_double_unscale, "1/131072 of the right size"),
            ("inner optimizer", lambda: _step_inner, "131072× too large"),
            ("a hard-coded 32768", lambda: _step_fixed_scale, "multiplied by a fixed 32768"),
            (
                "unscaled by hand, inner optimizer",
                lambda: _step_unscale_then_inner,
                "changed the weights to inf/NaN",
            ),
            ("bias only", lambda: _step_bias_only, "The kernel's update does not match float32"),
            ("by hand, never `optimizer.apply`", lambda: _step_by_hand, "`optimizer.iterations` is still 0"),
            ("by hand, through `inner_optimizer`", lambda: _step_by_hand_inner, "only `optimizer.apply` does that"),
            ("returns the scaled loss", lambda: _step_returns_scaled, "returned the SCALED loss"),
            ("scale_loss outside the tape", lambda: _step_scale_outside_tape, "got no gradients (all None)"),
            ("result, not function", lambda: 0.5, "Pass the function itself"),
            ("wrong arity", lambda: lambda model, optimizer, x, y: None, "exactly 5 parameters"),
        ),
    ),
}
