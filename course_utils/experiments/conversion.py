"""Lesson 02's experiments: the forward pass whose peak memory is compared across dtype policies, and
what the XLA compiler actually computes for a bfloat16 model here.

The reusable tools (variable bytes, peak memory in a fresh process) are in :mod:`course_utils.memory`.
"""

from __future__ import annotations

import re


def forward_step(policy: str, width: int = 32, batch: int = 256, num_classes: int = 10, jit: bool = False,
                 seed: int = 0):
    """One forward pass (inference) of the course's ``small_cnn`` built under ``policy``, as a step for
    :func:`course_utils.memory.measure_peaks_isolated`: a zero-argument ``tf.function``
    (``jit_compile=jit``) over a fixed batch of ``batch`` CIFAR-shaped uint8 images."""
    import tensorflow as tf

    from .. import data, models

    images = tf.constant(data.synthetic_cifar(batch, 1, num_classes=num_classes, seed=seed)[0][0])
    model = models.build_under_policy(policy, width=width, num_classes=num_classes)
    return tf.function(lambda: model(images), jit_compile=jit)


_CONV = re.compile(r"=\s*([a-z]+[0-9]+)\[[^\]]*\][^=]*?\bconvolution\(")


def xla_convolution_dtypes(policy: str = "bfloat16", width: int = 8, batch: int = 8, num_classes: int = 10) -> list[str]:
    """The output dtypes of the convolutions XLA compiles for ``small_cnn`` under ``policy`` on this
    machine's default device, read from the optimized HLO (``['f32', 'f32']``: XLA computes the
    bfloat16 model's convolutions in float32 here; ``['bf16', 'bf16']``: natively in bfloat16)."""
    import tensorflow as tf

    from .. import data, models

    images = tf.constant(data.synthetic_cifar(batch, 1, num_classes=num_classes)[0][0])
    model = models.build_under_policy(policy, width=width, num_classes=num_classes)
    forward = tf.function(lambda x: model(x), jit_compile=True)
    hlo = forward.experimental_get_compiler_ir(images)(stage="optimized_hlo")
    return _CONV.findall(hlo)
