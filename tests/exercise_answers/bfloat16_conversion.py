"""`course_utils.lessons.bfloat16_conversion.exercises`: each exercise's reference answer and typical wrong
answers (each with words its message must contain). Only the tests read them, so they live here."""

from __future__ import annotations

import keras
import tensorflow as tf

from course_utils.lessons.bfloat16_conversion.exercises import _BF16, _MIXED, _PARAMS, _make_model


def _convert_reference(make_model, model):
    keras.config.set_dtype_policy("bfloat16")
    try:
        new_model = make_model()
    finally:
        keras.config.set_dtype_policy("float32")
    new_model.set_weights(model.get_weights())
    return new_model


def _convert_no_weights(make_model, model):
    keras.config.set_dtype_policy("bfloat16")
    try:
        return make_model()
    finally:
        keras.config.set_dtype_policy("float32")


def _convert_policy_left(make_model, model):
    keras.config.set_dtype_policy("bfloat16")
    new_model = make_model()
    new_model.set_weights(model.get_weights())
    return new_model


def _convert_mixed(make_model, model):
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        new_model = make_model()
    finally:
        keras.config.set_dtype_policy("float32")
    new_model.set_weights(model.get_weights())
    return new_model


def _convert_policy_after_construct(make_model, model):
    new_model = make_model()  # constructed under float32: setting the policy afterwards changes nothing
    keras.config.set_dtype_policy("bfloat16")
    try:
        new_model.set_weights(model.get_weights())
    finally:
        keras.config.set_dtype_policy("float32")
    return new_model


def _convert_by_hand(make_model, model):
    """Rebuilds the layers by hand under 'bfloat16' and forgets the float32 output layer."""
    keras.config.set_dtype_policy("bfloat16")
    try:
        new_model = keras.Sequential(
            [keras.Input((12,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3, activation="softmax")]
        )
    finally:
        keras.config.set_dtype_policy("float32")
    new_model.set_weights(model.get_weights())
    return new_model


def _convert_private_attr(make_model, model):
    for layer in model.layers:
        if hasattr(layer, "_kernel"):
            layer._kernel = tf.cast(layer._kernel, tf.bfloat16)
    return model


ANSWERS = {
    "param_bytes": (
        lambda: (_BF16, _MIXED),
        (
            ("mixed halves too", lambda: (_BF16, _BF16), "keeps them in float32"),
            ("parameter count", lambda: (_PARAMS, _PARAMS), "number of parameters, not bytes"),
            ("kernel only", lambda: (2 * 256 * 512, 4 * 256 * 512), "bias"),
            ("swapped", lambda: (_MIXED, _BF16), "swapped"),
            ("single number", lambda: _BF16, "Expected a pair"),
            ("strings", lambda: ("263168", "526336"), "remove the quotes"),
        ),
    ),
    "convert_model": (
        lambda: _convert_reference,
        (
            ("forgets set_weights", lambda: _convert_no_weights, "set_weights"),
            ("policy left changed", lambda: _convert_policy_left, "global dtype policy is still 'bfloat16'"),
            ("mixed policy", lambda: _convert_mixed, "that is mixed_bfloat16"),
            (
                "policy set after construction",
                lambda: _convert_policy_after_construct,
                "active when it is constructed",
            ),
            ("private attribute", lambda: _convert_private_attr, "returned the float32 model itself"),
            ("no float32 output layer", lambda: _convert_by_hand, "lacks make_model's float32 output layer"),
            ("result, not function", _make_model, "Pass the function itself"),
        ),
    ),
    "vanishing_update": (
        lambda: 1.0,
        (
            ("float32 answer", lambda: 0.999, "float32 answer"),
            ("rounded down", lambda: 0.99609375, "NEAREST"),
            ("other", lambda: 0.5, "Try it"),
            ("text", lambda: "one", "Expected a number"),
        ),
    ),
}
