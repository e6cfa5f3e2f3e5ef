"""Data for the lessons. This module starts with the offline CIFAR-shaped generator; the real
CIFAR-10 loaders (tfds, npz) join it with the data-pipeline lesson.

Offline data is only ever used when chosen explicitly (argument, ``COURSE_DATA=synthetic``) or in
smoke mode, and the caller announces it (COURSE_DESIGN §5).
"""

from __future__ import annotations

import numpy as np

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def synthetic_cifar(
    n_train: int,
    n_test: int,
    num_classes: int = 10,
    image_size: int = 32,
    seed: int = 0,
    signal: float = 10.0,
    noise: float = 80.0,
):
    """CIFAR-shaped offline data with learnable class structure.

    Each class has a fixed, smooth colour pattern (a random 4×4×3 grid scaled up to the image size);
    an example is its class pattern plus strong per-pixel noise and a random brightness shift, as
    uint8 HWC images with int64 labels — the same layout as CIFAR-10. A small CNN gets well above
    chance (10%) in a few epochs, but not to 100% at once.

    Returns ``(x_train, y_train), (x_test, y_test)``.
    """
    if image_size % 4:
        raise ValueError(f"image_size must be a multiple of 4, got {image_size}")
    rng = np.random.default_rng(seed)
    block = image_size // 4
    templates = rng.normal(size=(num_classes, 4, 4, 3))
    templates = np.kron(templates, np.ones((1, block, block, 1)))

    def make(n: int):
        y = rng.integers(0, num_classes, size=n)
        shift = rng.normal(scale=20.0, size=(n, 1, 1, 1))
        x = 128.0 + signal * templates[y] + shift + rng.normal(scale=noise, size=(n, image_size, image_size, 3))
        return np.clip(x, 0, 255).astype(np.uint8), y.astype(np.int64)

    return make(n_train), make(n_test)
