"""Exercise bank "mixed_precision" (lesson 03: mixed precision)."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from ...exercises import Exercise, Incorrect, call_learner, describe, ExerciseBank, require_callable, require_number

# ----------------------------------------------------------------------------------------------
# 1. Compute dtype and variable dtype of a Dense layer under mixed_bfloat16
# ----------------------------------------------------------------------------------------------


def _dtype_name(value: Any) -> str | None:
    """The dtype's name for a name (``"bfloat16"``), a ``tf.DType``/``np.dtype`` or a numpy scalar type
    (``np.float32``); None for anything else — numbers included: ``tf.as_dtype(1)`` would read the int as
    a DataType enum value (float32), and an answer of ``(14, 1)`` is no dtype name."""
    if isinstance(value, str):
        name = value
    elif isinstance(value, (tf.DType, np.dtype)):
        name = value.name
    elif isinstance(value, type) and issubclass(value, np.generic):
        name = np.dtype(value).name
    else:
        return None
    try:
        return tf.as_dtype(name).name
    except Exception:  # noqa: BLE001 - not a dtype name
        return None


def _check_layer_dtypes(answer: Any) -> str:
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        raise Incorrect(
            f"Expected a pair `(compute_dtype, variable_dtype)`, got {describe(answer)}; e.g. `('float16', 'float32')`."
        )
    names = tuple(_dtype_name(v) for v in answer)
    if None in names:
        raise Incorrect(f"Expected two dtype names such as 'float32' or 'bfloat16', got {describe(tuple(answer))}.")
    if names == ("bfloat16", "float32"):
        return (
            "Computation in bfloat16 (fast, half the activation memory), variables in float32 (updates do not vanish)."
        )
    if names == ("float32", "bfloat16"):
        raise Incorrect("You swapped them: the policy computes in bfloat16 and keeps the variables in float32.")
    if names == ("bfloat16", "bfloat16"):
        raise Incorrect("That is the pure 'bfloat16' policy. 'mixed_' means the variables stay float32.")
    if "float16" in names:
        raise Incorrect("float16 belongs to 'mixed_float16' (GPUs). 'mixed_bfloat16' uses bfloat16.")
    raise Incorrect(f"Got {names}. Build `keras.layers.Dense(4, dtype='mixed_bfloat16')` and print both attributes.")


# ----------------------------------------------------------------------------------------------
# 2. A custom training step with loss scaling (mixed_float16)
# ----------------------------------------------------------------------------------------------

_LR = 0.1  # not 1: a step that updates the weights by hand and leaves the learning rate out must show it
_SCALE = 2.0**17  # not Keras' default 2**15: a step that hard-codes 32768 instead of the optimizer's scale is wrong
_OVERFLOW_Y = 1e10  # targets this large make the scaled float16 gradients overflow (inf): the step must be skipped


def _loss_fn(y, pred):
    """A mean squared error weighted by 1e-6: its gradients underflow float16 without loss scaling."""
    return 1e-6 * tf.reduce_mean(tf.square(tf.cast(pred, tf.float32) - y))


def _setup():
    """A mixed_float16 Dense layer with zero weights, its LossScaleOptimizer and data, plus what one correct
    step gives in float32: each weight's update and the loss. Zero start weights make every update exactly
    measurable (a float32 kernel of ~0.3 could not hold a ~1e-7 change)."""
    rng = np.random.default_rng(7)
    x = tf.constant(rng.normal(size=(128, 32)).astype(np.float32))
    y = tf.constant(rng.normal(0, 0.1, size=(128, 16)).astype(np.float32))
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(16, kernel_initializer="zeros")])
    finally:
        keras.config.set_dtype_policy(previous)
    optimizer = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(_LR), initial_scale=_SCALE, dynamic_growth_steps=1
    )
    # dynamic loss scaling changes the scale during training: the checker's optimizer starts at 2**17, not 2**15,
    # and doubles it after every finite step (Keras' default: after 2000) — only LossScaleOptimizer.apply does that
    optimizer.build(model.trainable_variables)
    kernel, bias = model.layers[0].kernel, model.layers[0].bias
    with tf.GradientTape() as tape:  # the float32 reference step
        loss = _loss_fn(y, tf.matmul(x, kernel) + bias)
    grads = tape.gradient(loss, [kernel, bias])
    expected = {"kernel": -_LR * grads[0].numpy(), "bias": -_LR * grads[1].numpy()}
    return model, optimizer, x, y, expected, float(loss)


class _NoGradients:
    """Returned instead of the learner's result when ``optimizer.apply`` got only None gradients."""


def _guard_no_gradients(fn):
    def step(*args):
        try:
            return fn(*args)
        except ValueError as exc:
            if "No gradients provided" in str(exc):
                return _NoGradients()
            raise

    return step


def _check_scaled_step(answer: Any) -> str:
    fn = require_callable(answer, "train_step(model, optimizer, loss_fn, x, y)", arity=5)
    model, optimizer, x, y, expected, expected_loss = _setup()
    returned = call_learner(
        _guard_no_gradients(fn),
        model,
        optimizer,
        _loss_fn,
        x,
        y,
        shown_as="train_step(model, optimizer, loss_fn, x, y)",
        on_error="`optimizer` is a keras.optimizers.LossScaleOptimizer; use `optimizer.scale_loss(loss)` and `optimizer.apply(grads)`.",
    )
    grown = float(optimizer.dynamic_scale.numpy())  # 2 × _SCALE after a step through optimizer.apply
    if isinstance(returned, _NoGradients):
        raise Incorrect(
            "`optimizer.apply` got no gradients (all None): the tape only sees what runs inside "
            "`with tf.GradientTape() as tape:`. Compute the loss and `optimizer.scale_loss(loss)` inside the "
            "`with` block, then take `tape.gradient(scaled_loss, model.trainable_variables)`."
        )
    layer = model.layers[0]
    got = {"kernel": layer.kernel.numpy(), "bias": layer.bias.numpy()}  # they started at zero: the update
    if not any(np.any(v) for v in got.values()):
        raise Incorrect(
            "The weights did not change: the gradients underflowed to zero in float16. Take the gradient of "
            "`optimizer.scale_loss(loss)` inside the tape, not of `loss`."
        )
    if int(optimizer.iterations.numpy()) == 0:
        raise Incorrect(
            "The weights changed, but not through the optimizer: `optimizer.iterations` is still 0 after your step, so "
            "your code updated them itself. Hand the gradients of the scaled loss to `optimizer.apply(grads, "
            "model.trainable_variables)`: it unscales them, skips a step whose gradients overflowed, adjusts the "
            "scale, and applies the learning rate and the optimizer's state (momentum, Adam's moments), which a "
            "hand-written `assign_sub` leaves out."
        )
    everything = np.concatenate([got[k].ravel() for k in expected])
    reference = np.concatenate([expected[k].ravel() for k in expected])
    nonzero = reference != 0
    ratio = float(np.median(everything[nonzero] / reference[nonzero]))
    if abs(ratio * _SCALE - 1) < 0.05:
        raise Incorrect(
            f"The update is 1/{_SCALE:.0f} of the right size (1/the optimizer's scale): you unscaled the gradients "
            "yourself, and `LossScaleOptimizer.apply` unscales them again. Pass the scaled gradients straight to "
            "`optimizer.apply`."
        )
    if abs(ratio / _SCALE - 1) < 0.05:
        raise Incorrect(
            f"The update is {_SCALE:.0f}× too large (the optimizer's scale): the gradients were never unscaled. Apply "
            "them with the LossScaleOptimizer itself (`optimizer.apply`), not its `inner_optimizer`."
        )
    if abs(ratio * _LR - 1) < 0.05:
        raise Incorrect(
            f"The update is {1 / _LR:g}× the right size (1/the learning rate, {_LR:g}): the learning rate was never "
            "applied. `optimizer.apply(grads, model.trainable_variables)` applies it (and the optimizer's state)."
        )
    fixed = ratio * _SCALE  # the factor the loss was really multiplied by, if the update is off by a constant
    power = next((2.0**k for k in range(1, 31) if abs(fixed / 2.0**k - 1) < 0.05), None)
    if 0 < ratio < 0.95 and power is not None:
        raise Incorrect(
            f"The update is {ratio:.3g}× the right size: the loss was multiplied by a fixed {power:.0f}, but this "
            f"optimizer's scale is {_SCALE:.0f} (dynamic loss scaling halves and doubles it during training). Scale "
            "with `optimizer.scale_loss(loss)`, which always uses the current scale."
        )
    for name in expected:
        want, have = expected[name], got[name]
        if not np.allclose(have, want, rtol=0.05, atol=0.05 * float(np.abs(want).max())):
            size = float(np.abs(have).max() / np.abs(want).max())
            detail = "it did not change" if not np.any(have) else f"its largest change is {size:.3g}× the float32 one"
            raise Incorrect(
                f"The {name}'s update does not match float32 ({detail}): apply the gradients of the scaled loss "
                "to ALL of `model.trainable_variables` with `optimizer.apply(grads, model.trainable_variables)`."
            )
    loss = require_number(returned, "the loss your train_step returns (a scalar)")
    if np.isclose(loss, expected_loss * _SCALE, rtol=0.01):
        raise Incorrect(
            f"The update is right, but you returned the SCALED loss ({loss:.3g}, {_SCALE:.0f}× too large); return the "
            "loss itself (`loss`, not `optimizer.scale_loss(loss)`), so logs and metrics show the real value."
        )
    if not np.isclose(loss, expected_loss, rtol=0.01):
        raise Incorrect(
            f"The update is right, but you returned {describe(returned)}; expected the (unscaled) loss of the "
            f"batch, about {expected_loss:.3g}: `return loss`, the value of `loss_fn(y, model(x))`."
        )
    _check_overflow_is_skipped(fn, model, optimizer, x, y)
    if grown != 2 * _SCALE:
        raise Incorrect(
            f"The updates were right and the overflow was skipped, but after your finite step the loss scale was "
            f"{grown:.0f}, not {2 * _SCALE:.0f}: this optimizer doubles its scale after every finite step "
            "(`dynamic_growth_steps=1` here; Keras' default is 2000), and only `optimizer.apply` does that. A step "
            "that unscales by hand and applies with `inner_optimizer` keeps the scale from ever growing back: pass "
            "the scaled gradients to `optimizer.apply`."
        )
    return (
        "Scaled loss inside the tape (with the optimizer's current scale), gradients of the scaled loss, "
        "`optimizer.apply` unscales them: every weight's update matches float32 within 5%, and the loss you return is "
        "the real (unscaled) one. After a finite step the scale grew; on a batch whose scaled gradients overflow, your "
        "step left the weights alone and halved the scale, as dynamic loss scaling must."
    )


def _check_overflow_is_skipped(fn, model, optimizer, x, y) -> None:
    """A second step on targets so large that the scaled float16 gradients overflow: ``LossScaleOptimizer.apply``
    skips it (no weight changes) and halves the scale; a step that unscales by hand and calls the inner optimizer
    writes inf/NaN into the weights and keeps the scale."""
    before = [v.numpy().copy() for v in model.trainable_variables]
    scale = float(optimizer.dynamic_scale.numpy())
    call_learner(
        _guard_no_gradients(fn),
        model,
        optimizer,
        _loss_fn,
        x,
        y * _OVERFLOW_Y,
        shown_as="train_step(model, optimizer, loss_fn, x, y_huge)",
        on_error="on a batch whose scaled gradients overflow, `optimizer.apply` must still be what applies them.",
    )
    after = [v.numpy() for v in model.trainable_variables]
    changed = not all(np.array_equal(a, b) for a, b in zip(before, after))
    if changed:
        finite = all(np.all(np.isfinite(a)) for a in after)
        raise Incorrect(
            "Your first step was right, but on a batch whose scaled gradients overflow float16 (inf) your step "
            f"changed the weights{'' if finite else ' to inf/NaN'}: `LossScaleOptimizer.apply` skips such a step and "
            "halves the scale. Unscaling the gradients yourself and applying them with `inner_optimizer` skips that "
            "check: pass the scaled gradients to `optimizer.apply`."
        )
    now = float(optimizer.dynamic_scale.numpy())
    if now != scale / 2:
        raise Incorrect(
            f"On a batch whose scaled gradients overflow, the weights stayed, but the scale went from {scale:.0f} to "
            f"{now:.0f}, not to {scale / 2:.0f}: the step must go through `optimizer.apply(grads, ...)`, which halves "
            "the scale after an overflow so the next step fits."
        )


_STEP_SOLUTION = '''\
import tensorflow as tf

def train_step(model, optimizer, loss_fn, x, y):
    """One step for a mixed_float16 model; `optimizer` is a keras.optimizers.LossScaleOptimizer."""
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
        scaled_loss = optimizer.scale_loss(loss)  # × the current scale (2**15 at first, by default)
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)  # unscales (apply_gradients too); skips the step on inf/NaN
    return loss
'''


EXERCISES = ExerciseBank(
    "mixed_precision",
    [
        Exercise(
            name="layer_dtypes",
            question="Under the 'mixed_bfloat16' policy, what are a Dense layer's `(compute_dtype, variable_dtype)`?",
            checker=_check_layer_dtypes,
            answer_name="answer",
            hints=(
                "'mixed' means two dtypes: one for the math, one for the stored weights.",
                "Which of the two must stay float32 so that small updates do not vanish?",
            ),
            solution_code='answer = ("bfloat16", "float32")  # compute in bfloat16, keep variables in float32\n',
            stub="answer = ...  # a pair of dtype names: (compute_dtype, variable_dtype)\n",
        ),
        Exercise(
            name="loss_scaled_step",
            question=(
                "Write `train_step(model, optimizer, loss_fn, x, y)` for a mixed_float16 model in a custom loop; "
                "`optimizer` is a `keras.optimizers.LossScaleOptimizer`. Return the (unscaled) loss."
            ),
            checker=_check_scaled_step,
            answer_name="train_step",
            hints=(
                "Without scaling, float16 rounds gradients below ~3e-8 to 0. Multiply the loss before "
                "differentiating: `optimizer.scale_loss(loss)`, inside the tape.",
                "Differentiate the scaled loss and hand the gradients to `optimizer.apply(grads, model.trainable_variables)`: "
                "it divides by the scale itself.",
            ),
            solution_code=_STEP_SOLUTION,
            stub='''\
def train_step(model, optimizer, loss_fn, x, y):
    """One step for a mixed_float16 model; `optimizer` is a keras.optimizers.LossScaleOptimizer."""
    ...  # your code here; return the loss
''',
        ),
    ],
)
