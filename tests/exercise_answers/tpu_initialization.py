"""`course_utils.lessons.tpu_initialization.exercises`: each exercise's reference answer and typical wrong
answers (each with words its message must contain). Only the tests read them, so they live here."""

from __future__ import annotations

import keras
import tensorflow as tf


def _global_batch_size_reference(per_replica_batch, strategy):
    return per_replica_batch * strategy.num_replicas_in_sync


def _small_model():
    return keras.Sequential([keras.Input(shape=(32, 32, 3)), keras.layers.Flatten(), keras.layers.Dense(10)])


def _compile(model, optimizer="adam"):
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _make_model_reference(strategy):
    with strategy.scope():
        return _compile(_small_model())


def _make_model_built_outside(strategy):
    model = _small_model()
    with strategy.scope():
        return _compile(model)


def _make_model_optimizer_outside(strategy):
    optimizer = keras.optimizers.Adam(1e-3)
    with strategy.scope():
        return _compile(_small_model(), optimizer)


def _make_model_compiled_after_scope(strategy):
    with strategy.scope():
        model = _small_model()
    return _compile(model)


def _make_model_not_compiled(strategy):
    with strategy.scope():
        return _small_model()


def _make_model_no_input_shape(strategy):
    with strategy.scope():
        return _compile(keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(10)]))


def _make_model_no_loss(strategy):
    with strategy.scope():
        model = _small_model()
        model.compile(optimizer="adam")
    return model


def _make_model_mnist_input(strategy):
    with strategy.scope():
        return _compile(
            keras.Sequential([keras.Input(shape=(28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
        )


def _make_model_one_output(strategy):
    with strategy.scope():
        return _compile(
            keras.Sequential([keras.Input(shape=(32, 32, 3)), keras.layers.Flatten(), keras.layers.Dense(1)])
        )


def _make_model_five_outputs(strategy):
    with strategy.scope():
        return _compile(
            keras.Sequential([keras.Input(shape=(32, 32, 3)), keras.layers.Flatten(), keras.layers.Dense(5)])
        )


def _make_model_loss(loss):
    def make_model(strategy):
        with strategy.scope():
            model = _small_model()
            model.compile(optimizer="adam", loss=loss)
        return model

    return make_model


def _model_in_default_strategy():
    return _make_model_reference(tf.distribute.get_strategy())


def _make_model_returns_layer(strategy):
    with strategy.scope():
        return keras.layers.Dense(10)


ANSWERS = {
    "replicas_on_v5e": (
        lambda: 1,
        (
            ("v2-8 count", lambda: 8, "v2-8"),
            ("string", lambda: "1", "Expected an int (a number of replicas), got str '1'"),
            ("bool", lambda: True, "got bool True"),
            ("float", lambda: 1.0, "got float 1.0"),
            ("other int", lambda: 4, "v5e-1 has a single chip"),
        ),
    ),
    "global_batch_size": (
        lambda: _global_batch_size_reference,
        (
            (
                "ignores replicas",
                lambda: lambda per, s: per,
                "ignores the number of replicas: for 4 replicas and per-replica batch 64 you returned 64, expected 256",
            ),
            ("hard-codes 8", lambda: lambda per, s: per * 8, "assumes 8 replicas (the retired v2-8)"),
            ("divides", lambda: lambda per, s: per // s.num_replicas_in_sync, "you divided"),
            ("true division", lambda: lambda per, s: per / s.num_replicas_in_sync, "you divided"),
            (
                "float result",
                lambda: lambda per, s: float(per * s.num_replicas_in_sync),
                "Expected an int (the global batch size), got float",
            ),
            ("string result", lambda: lambda per, s: str(per * 4), "got str '256'"),
            (
                "fixed factor",
                lambda: lambda per, s: per * 4,
                "always multiplies by 4: for 8 replicas and per-replica batch 128 you returned 512, expected 1024",
            ),
            ("adds", lambda: lambda per, s: per + s.num_replicas_in_sync, "expected 256"),
            ("result, not function", lambda: 256, "Pass the function itself"),
            ("wrong arity", lambda: lambda per: per, "define it with exactly 2 parameters"),
        ),
    ),
    "build_in_scope": (
        lambda: _make_model_reference,
        (
            ("outside scope", lambda: _make_model_built_outside, "built outside `strategy.scope()`"),
            (
                "optimizer object outside",
                lambda: _make_model_optimizer_outside,
                "Mixing different tf.distribute.Strategy objects",
            ),
            (
                "compiled after the scope",
                lambda: _make_model_compiled_after_scope,
                "optimizer was created outside the scope",
            ),
            ("not compiled", lambda: _make_model_not_compiled, "not compiled"),
            ("no input shape", lambda: _make_model_no_input_shape, "input shape"),
            ("no loss", lambda: _make_model_no_loss, "compiled without a loss"),
            ("28x28x1 input", lambda: _make_model_mnist_input, "inputs of shape (28, 28, 1)"),
            ("one output unit", lambda: _make_model_one_output, "one output per class"),
            ("five outputs for ten classes", lambda: _make_model_five_outputs, "Dense(10)"),
            (
                "categorical_crossentropy for integer labels",
                lambda: _make_model_loss("categorical_crossentropy"),
                "wants one-hot labels",
            ),
            ("mse for integer labels", lambda: _make_model_loss("mse"), "`mse` one number per output"),
            (
                "a loss blind to the class",
                lambda: _make_model_loss(lambda y, out: keras.ops.mean(out)),
                "not lower when the right class",
            ),
            (
                "returns a layer",
                lambda: _make_model_returns_layer,
                "Expected `make_model` to return a keras.Model, got an object of type Dense",
            ),
            ("model, not function", _model_in_default_strategy, "you passed a model, not the function"),
        ),
    ),
}
