"""Exercise bank "bfloat16" (lesson 02: bfloat16 conversion)."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from ...exercises import (
    Exercise,
    Incorrect,
    call_learner,
    describe,
    ExerciseBank,
    require_callable,
    require_int,
    require_number,
)

# ----------------------------------------------------------------------------------------------
# 1. Parameter bytes of Dense(512) on 256 inputs under "bfloat16" and "mixed_bfloat16"
# ----------------------------------------------------------------------------------------------

_PARAMS = 256 * 512 + 512  # kernel + bias = 131,584 numbers
_BF16, _MIXED = 2 * _PARAMS, 4 * _PARAMS


def _check_param_bytes(answer: Any) -> str:
    if type(answer).__module__ == "numpy" and getattr(answer, "shape", None) == (2,):
        answer = list(answer)  # np.array([a, b]): its items are numpy ints, which require_int accepts
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        raise Incorrect(
            f"Expected a pair `(bytes_bfloat16, bytes_mixed)`, got {describe(answer)}; "
            "write two numbers in parentheses, e.g. `(1000, 2000)`."
        )
    bf16 = require_int(answer[0], "an int (bytes under 'bfloat16')")
    mixed = require_int(answer[1], "an int (bytes under 'mixed_bfloat16')")
    if (bf16, mixed) == (_BF16, _MIXED):
        return (
            f"{_PARAMS:,} numbers (256×512 kernel + 512 bias): 2 bytes each in bfloat16 = {_BF16:,} B; "
            f"mixed_bfloat16 keeps float32 variables, 4 bytes each = {_MIXED:,} B."
        )
    if bf16 == _BF16 and mixed == _BF16:
        raise Incorrect(
            "Your bfloat16 number is right, but mixed_bfloat16 does not halve the variables: it keeps them "
            "in float32 (only the computation runs in bfloat16). Check `layer.variable_dtype`."
        )
    if (bf16, mixed) == (_PARAMS, _PARAMS) or bf16 == _PARAMS:
        raise Incorrect(
            f"{_PARAMS:,} is the number of parameters, not bytes; multiply by the bytes per number "
            "(bfloat16: 2, float32: 4)."
        )
    if (bf16, mixed) == (2 * 256 * 512, 4 * 256 * 512):
        raise Incorrect("You counted the kernel only: a Dense layer also has a bias of `units` numbers.")
    if (bf16, mixed) == (_MIXED, _BF16):
        raise Incorrect("You swapped them: pure 'bfloat16' stores 2-byte variables, mixed_bfloat16 4-byte ones.")
    raise Incorrect(
        f"Got ({bf16:,}, {mixed:,}). Count kernel (inputs × units) plus bias (units) numbers, then multiply by "
        "the variable dtype's size under each policy."
    )


# ----------------------------------------------------------------------------------------------
# 2. Convert a float32 model to bfloat16 the right way
# ----------------------------------------------------------------------------------------------


def _make_model():
    """Builds a small model under the *current* global dtype policy (given to the learner's function)."""
    return keras.Sequential(
        [
            keras.Input((12,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(3),
            keras.layers.Activation("softmax", dtype="float32"),
        ]
    )


def _check_convert(answer: Any) -> str:
    if isinstance(answer, keras.Model):
        raise Incorrect("You passed a model, not the function. Pass the function itself: `check(to_bfloat16)`.")
    fn = require_callable(answer, "to_bfloat16(make_model, model)", arity=2)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32")
    try:
        keras.utils.set_random_seed(3)
        original = _make_model()
        original_values = [w.numpy().copy() for w in original.weights]
        result = call_learner(
            fn,
            _make_model,
            original,
            shown_as="to_bfloat16(make_model, model)",
            on_error="Construct the new model by calling `make_model()` while the 'bfloat16' policy is set.",
        )
        left_policy = keras.config.dtype_policy().name
    finally:
        keras.config.set_dtype_policy(previous)
    if not isinstance(result, keras.Model):
        raise Incorrect(f"Expected `to_bfloat16` to return a keras.Model, got {describe(result)}.")
    if result is original:
        raise Incorrect(
            "You returned the float32 model itself. Build a NEW model under the 'bfloat16' policy and copy "
            "the weights into it with `set_weights`."
        )
    if any(w.dtype != "float32" for w in original.weights) or not all(
        np.array_equal(a, w.numpy()) for a, w in zip(original_values, original.weights)
    ):
        raise Incorrect("Your function changed the float32 model; leave it as it is and return a new one.")
    if left_policy != "float32":
        raise Incorrect(
            f"The global dtype policy is still {left_policy!r} after your function: every model built later "
            "would silently be bfloat16. Restore it with `keras.config.set_dtype_policy('float32')` (in a `finally:`)."
        )
    dtypes = sorted({w.dtype for w in result.weights})
    if dtypes == ["float32"] and result.layers[0].compute_dtype == "bfloat16":
        raise Incorrect(
            "Your model's variables are float32: that is mixed_bfloat16 (bfloat16 compute, float32 variables). "
            "For half-size weights use the pure 'bfloat16' policy."
        )
    if dtypes != ["bfloat16"]:
        raise Incorrect(
            f"Expected all variables in bfloat16, got {dtypes}; construct the new model (call `make_model()`) while the "
            "'bfloat16' policy is set: a layer takes the policy active when it is constructed."
        )
    if len(result.weights) != len(original.weights):
        raise Incorrect(
            "The new model has a different architecture; construct it with the `make_model` you were given."
        )
    kinds = [type(layer).__name__ for layer in result.layers]
    if kinds != [type(layer).__name__ for layer in original.layers] or _output_dtype(result) != "float32":
        raise Incorrect(
            f"The new model's layers are {_layer_list(kinds)}, its output {_output_dtype(result) or 'unknown'}: it "
            "lacks make_model's float32 output layer (`Activation('softmax', dtype='float32')`, which keeps the "
            "softmax and the loss in float32). Construct the new model by calling `make_model()`, not by hand."
        )
    for a, w in zip(original_values, result.weights):
        expected = a.astype(w.numpy().dtype)
        if not np.array_equal(expected.astype(np.float32), w.numpy().astype(np.float32)):
            raise Incorrect(
                "The new model's weights are not the float32 model's weights (rounded to bfloat16): "
                "copy them with `new_model.set_weights(model.get_weights())`."
            )
    return (
        "A new model built under 'bfloat16', holding the float32 weights rounded to bfloat16 — half the bytes, "
        "and the global policy is back to float32."
    )


def _layer_list(kinds: list) -> str:
    shown = ", ".join(str(k)[:40] for k in kinds[:6])
    return f"[{shown}{', …' if len(kinds) > 6 else ''}]"


def _output_dtype(model: Any) -> str | None:
    """The dtype of ``model``'s output on a small float32 batch, or None if it cannot be run."""
    try:
        output = model(np.zeros((2, 12), np.float32))
        return keras.backend.standardize_dtype(output.dtype)
    except Exception:  # noqa: BLE001 - a broken model: the caller reports the layers instead
        return None


_CONVERT_SOLUTION = '''\
import keras

def to_bfloat16(make_model, model):
    """Return a bfloat16 copy of the float32 `model` (built by `make_model`)."""
    keras.config.set_dtype_policy("bfloat16")
    try:
        new_model = make_model()  # constructed under the policy: bfloat16 variables
    finally:
        keras.config.set_dtype_policy("float32")  # never leave the global policy changed
    new_model.set_weights(model.get_weights())  # float32 values are rounded to bfloat16
    return new_model
'''


# ----------------------------------------------------------------------------------------------
# 3. A small update to a bfloat16 weight
# ----------------------------------------------------------------------------------------------


def _as_float32(value: Any) -> Any:
    """A bfloat16/float16 tensor (`tf.cast(..., tf.bfloat16)`, what the hint suggests trying) or ml_dtypes
    scalar as float32.

    numpy cannot read a bfloat16 tensor directly (``np.asarray`` raises), so require_number would reject it;
    the cast is exact. Anything else is returned unchanged, without touching it.
    """
    module = type(value).__module__
    if module == "ml_dtypes" and type(value).__name__ in ("bfloat16", "float16"):  # `ml_dtypes.bfloat16(1.0)`
        try:
            return float(value)
        except Exception:  # noqa: BLE001
            return value
    if not module.startswith("tensorflow"):
        return value

    try:
        if isinstance(value, tf.Tensor) and value.dtype in (tf.bfloat16, tf.float16):
            return tf.cast(value, tf.float32)
    except Exception:  # noqa: BLE001 - left to require_number to reject
        pass
    return value


def _check_vanishing_update(answer: Any) -> str:
    value = require_number(_as_float32(answer), "a number")  # numpy scalars, 0-d tensors; not True, "1", b"1"
    if value == 1.0:
        return (
            "1.0: next to 1.0 bfloat16 can only store 0.99609375 (spacing 2⁻⁸ below 1). 0.999 is nearer to 1.0, "
            "so the update is rounded away — this is why pure-bfloat16 training stalls."
        )
    if abs(value - 0.999) < 1e-6:
        raise Incorrect(
            "0.999 is the float32 answer. bfloat16 keeps 8 significant bits: the nearest numbers to 0.999 "
            "it can store are 0.99609375 and 1.0. Which is nearer?"
        )
    if value == 0.99609375:
        raise Incorrect(
            "0.99609375 is the next bfloat16 below 1.0, but casting rounds to the NEAREST: 0.999 is 0.001 from 1.0 "
            "and 0.0029 from 0.99609375."
        )
    raise Incorrect(
        f"Got {describe(value)}. Try it: `tf.cast(tf.constant(1.0) - 0.001, tf.bfloat16)` — then explain the result."
    )


EXERCISES = ExerciseBank(
    "bfloat16_conversion",
    [
        Exercise(
            name="param_bytes",
            question=(
                "A `Dense(512)` layer on 256 inputs (with bias). How many bytes do its variables take under the "
                "'bfloat16' policy, and under 'mixed_bfloat16'? Answer `(bytes_bfloat16, bytes_mixed)`."
            ),
            checker=_check_param_bytes,
            answer_name="answer",
            hints=(
                "Numbers in the layer: a 256×512 kernel plus a bias of 512.",
                "Bytes per number = the VARIABLE dtype's size. Print `layer.variable_dtype` under each policy.",
            ),
            solution_code=(
                "params = 256 * 512 + 512  # kernel + bias\n"
                "answer = (params * 2, params * 4)  # bfloat16 variables; mixed_bfloat16 keeps float32 variables\n"
            ),
            stub="answer = ...  # a pair: (bytes under 'bfloat16', bytes under 'mixed_bfloat16')\n",
        ),
        Exercise(
            name="convert_model",
            question=(
                "Write `to_bfloat16(make_model, model)`: return a bfloat16 copy of the float32 `model` "
                "(`make_model()` builds its architecture under the current global policy)."
            ),
            checker=_check_convert,
            answer_name="to_bfloat16",
            hints=(
                "A layer takes its dtype policy when it is constructed: set the 'bfloat16' policy, then call "
                "`make_model()` (setting it after construction changes nothing).",
                "Copy the weights with `new_model.set_weights(model.get_weights())`, and put the policy back to "
                "'float32' in a `finally:`.",
            ),
            solution_code=_CONVERT_SOLUTION,
            stub='''\
def to_bfloat16(make_model, model):
    """Return a bfloat16 copy of the float32 `model` (built by `make_model`)."""
    ...  # your code here
''',
        ),
        Exercise(
            name="vanishing_update",
            question=(
                "A bfloat16 weight is 1.0. SGD subtracts an update of 0.001 and stores the result in bfloat16. "
                "What value does the weight hold afterwards?"
            ),
            checker=_check_vanishing_update,
            answer_name="answer",
            hints=(
                "bfloat16 has 7 stored mantissa bits: just below 1.0 its numbers are 2⁻⁸ = 0.0039 apart.",
                "Casting rounds to the nearest representable number. List the two candidates around 0.999.",
            ),
            solution_code="answer = 1.0  # 0.999 rounds to the nearest bfloat16, which is 1.0: the update vanished\n",
            stub="answer = ...  # a number\n",
        ),
    ],
)
