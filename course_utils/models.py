"""Small models shared by the lessons; sizes come from the config object."""

from __future__ import annotations


def small_cnn(num_classes: int = 10, width: int = 32, image_size: int = 32, name: str = "small_cnn"):
    """A small CIFAR-style CNN. Build it inside ``strategy.scope()``.

    The last activation is float32 on purpose (``dtype="float32"``): under a mixed-precision policy
    a bf16/fp16 softmax loses precision (lesson 03); under float32 it changes nothing.
    """
    import keras
    from keras import layers

    return keras.Sequential(
        [
            keras.Input((image_size, image_size, 3)),
            layers.Rescaling(1 / 255),
            layers.Conv2D(width, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(2 * width, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(num_classes),
            layers.Activation("softmax", dtype="float32"),
        ],
        name=name,
    )


def build_under_policy(policy: str, make=None, strategy=None, **small_cnn_kwargs):
    """Build a model under a Keras dtype policy, then restore the global policy (even on error).

    ``make``: a zero-argument builder (default: ``small_cnn(**small_cnn_kwargs)``). With ``strategy``,
    the model is built inside ``strategy.scope()``. This is lesson 02's "set the policy, rebuild" step;
    copy the weights over with ``new_model.set_weights(old_model.get_weights())``.
    """
    import contextlib

    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            return make() if make is not None else small_cnn(**small_cnn_kwargs)
    finally:
        keras.config.set_dtype_policy(previous)
