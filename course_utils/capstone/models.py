"""The networks: the course's ResNet-9 (with its whitening layer) and the tutorial's CNN."""

from __future__ import annotations

from .options import COURSE, STEMS


def whitening_kernel(x, mean, variance, size: int = 2, eps: float = 5e-4, images: int = 512):
    """A ``(size, size, 3, 3·size²)`` convolution kernel that whitens ``size``×``size`` patches of the normalized
    images ``x`` (airbench's first layer): the eigenvectors of the patches' covariance, each scaled by one over the
    square root of its eigenvalue (+ ``eps``). From the first ``images`` images (a 12×12 covariance)."""
    import numpy as np

    # normalized as the Normalization layer before it does (a constant channel: its epsilon, not a division by zero)
    std = np.maximum(np.sqrt(np.asarray(variance, np.float64)), 1e-7)
    z = (np.asarray(x[:images], np.float64) - np.asarray(mean, np.float64)) / std
    patches = np.lib.stride_tricks.sliding_window_view(z, (size, size), axis=(1, 2))  # n, h', w', c, size, size
    flat = patches.transpose(0, 1, 2, 4, 5, 3).reshape(-1, size * size * z.shape[-1])  # (row, col, channel) order
    values, vectors = np.linalg.eigh(flat.T @ flat / len(flat))
    kernel = vectors / np.sqrt(values + eps)  # columns: one filter each
    return kernel.reshape(size, size, z.shape[-1], -1).astype(np.float32)


def resnet9(
    width: int = COURSE["width"],
    num_classes: int = 10,
    mean=None,
    variance=None,
    logit_scale: float = COURSE["logit_scale"],
    name: str = "resnet9",
    whiten=None,
    stem: str = "full",
):
    """A ResNet-9-style network for 32×32 images (Page's DAWNBench net), widths ``w, 2w, 4w, 8w``.

    prep: conv-BN-ReLU(w) · layer1: conv-BN-ReLU(2w), max-pool, residual(2 × conv-BN-ReLU) ·
    layer2: conv-BN-ReLU(4w), max-pool · layer3: conv-BN-ReLU(8w), max-pool, residual · global max pool ·
    dense · ×``logit_scale``. Inputs are pixels 0-255; the first layer normalizes per channel with the
    training split's ``mean``/``variance``. ``whiten``: a :func:`whitening_kernel`, the weights of a fixed
    (untrained) convolution before prep (airbench's first layer). Outputs float32 logits under any policy.

    ``stem="s2d"``: prep and layer1's first convolution run at 16×16 instead of 32×32 — the whitening convolution
    takes each 2×2 patch once (stride 2: its 12 filters are an invertible map of the patch's 12 values, so nothing is
    lost; without whitening, prep's convolution strides 2), and layer1 drops its max-pool, so layer1's residual and
    everything after it see the same sizes as with ``"full"``. The weights have the same shapes either way. It
    removes the only layers at 32×32, where the channels are fewest and TensorFlow's own CPU kernels slowest
    (where it pays, and where the trainer takes it: :data:`~course_utils.capstone.plan.AUTO_STEM`).
    """
    import keras
    from keras import layers

    if stem not in STEMS:
        raise ValueError(f"stem must be one of {', '.join(STEMS)}, got {stem!r}")
    s2d = stem == "s2d"

    def cbr(x, filters, strides=1):
        x = layers.Conv2D(filters, 3, strides=strides, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization(momentum=0.9)(x)
        return layers.ReLU()(x)

    def residual(x, filters):
        return layers.Add()([x, cbr(cbr(x, filters), filters)])

    w = int(width)
    inputs = keras.Input((32, 32, 3))
    if mean is not None:
        x = layers.Normalization(mean=mean, variance=variance)(inputs)
    else:
        x = layers.Rescaling(1 / 255)(inputs)
    if whiten is not None:
        white = layers.Conv2D(
            whiten.shape[-1],
            whiten.shape[0],
            strides=whiten.shape[0] if s2d else 1,
            padding="valid" if s2d else "same",
            use_bias=False,
            trainable=False,
            name="whiten",
        )
        x = white(x)
        white.set_weights([whiten])
    x = cbr(x, w, strides=2 if s2d and whiten is None else 1)
    x = cbr(x, 2 * w)
    x = residual(x if s2d else layers.MaxPooling2D()(x), 2 * w)
    x = layers.MaxPooling2D()(cbr(x, 4 * w))
    x = residual(layers.MaxPooling2D()(cbr(x, 8 * w)), 8 * w)
    x = layers.GlobalMaxPooling2D()(x)
    x = layers.Dense(num_classes, use_bias=False)(x)
    x = layers.Rescaling(logit_scale, dtype="float32")(x)  # float32 logits (lesson 03)
    return keras.Model(inputs, x, name=name)


def tutorial_cnn(num_classes: int = 10, name: str = "tutorial_cnn"):
    """The TensorFlow CNN tutorial's model (tensorflow.org/tutorials/images/cnn), with /255 in the model."""
    import keras
    from keras import layers

    return keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            layers.Rescaling(1 / 255),
            layers.Conv2D(32, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, activation="relu"),
            layers.Flatten(),
            layers.Dense(64, activation="relu"),
            layers.Dense(num_classes, dtype="float32"),
        ],
        name=name,
    )
