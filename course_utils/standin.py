"""A GPU and a TPU stood in for by CPU devices, so that every branch the course takes on an accelerator runs in CI.

CI has no accelerator, and the GPU machines lent to the project have no TensorFlow: without these, the code a
learner on a Colab GPU or TPU runtime executes would be run first by that learner. ``COURSE_STANDIN=gpu|tpu``
(``prove --shape gpu|multi-gpu|tpu``) makes :func:`course_utils.detect` answer with that kind, over CPU devices.
Nothing gets faster: a stand-in executes the accelerator's code paths, it measures a CPU.

**GPU kind** — ``detect()`` answers ``"GPU"`` (one replica, ``OneDeviceStrategy``) or ``"multi-GPU"``
(``MirroredStrategy`` over N CPU devices, ``COURSE_CPU_REPLICAS``), and :func:`course_utils.memory.in_process`
is true: peaks are read in this process, from TensorFlow's allocator, as on a GPU (which belongs to the process
that uses it).

**TPU kind** — the CPU is split into 1 + N devices: ``CPU:0`` is the TPU VM's host, ``CPU:1`` … ``CPU:N`` its
TPU cores (``COURSE_CPU_REPLICAS`` = N). Its strategy refuses what ``TPUStrategy`` refuses in TensorFlow 2.20:

- ``run`` of a plain Python function in eager mode (``tpu_strategy.validate_run_function``: "does not support pure
  eager execution") — a TPU step is always traced;
- ``run`` inside a ``jit_compile=True`` function: TPUStrategy compiles the replicated step for the TPU itself;
- and the process refuses any ``jit_compile=True`` function placed on the host (no ``tf.device`` scope on a core):
  on a TPU VM TensorFlow runs unplaced ops on the CPU, and compiling XLA for the host fails there
  (tensorflow#58934). Place XLA work on a core (``with tf.device(runtime.device_names[0])``) or let the strategy
  compile it.

What the TPU stand-in does not reproduce, said where it matters: with one core its merge is in place, as
TPUStrategy's is (a ``OneDeviceStrategy``); with several it runs on ``MirroredStrategy``, whose replica threads fail a
``merge_call`` inside ``tf.cond`` (keras-team/keras#20582) where TPUStrategy's in-place merge may not. Keras' own TPU
branches (``isinstance(strategy, TPUStrategy)``), TPU compile errors (dynamic shapes, unsupported ops) and TPU speed
are out of its reach.
"""

from __future__ import annotations

import threading
from typing import Any

KINDS = ("gpu", "tpu")
HOST = "/device:CPU:0"  # the TPU stand-in's host; its cores are CPU:1 … CPU:N
HOST_XLA = (
    "XLA compiled for the host: on a TPU VM, TensorFlow places ops that no tf.device scope or strategy puts "
    "on a TPU core on the CPU, and compiling a jit_compile=True function there fails (tensorflow#58934). "
    "Place it on a core (with tf.device(runtime.device_names[0])) or call strategy.run from a plain "
    "tf.function: TPUStrategy compiles the step itself"
)
RUN_UNDER_XLA = (
    "TPUStrategy.run inside a jit_compile=True function: TPUStrategy compiles the replicated step for the "
    "TPU itself; wrap strategy.run in tf.function without jit_compile (Keras does: its fit leaves "
    "jit_compile off under TPUStrategy)"
)


class TPUStandInRefused(RuntimeError):
    """What the TPU stand-in refuses because ``TPUStrategy`` on a TPU VM would (its message says why)."""


def active() -> str:
    """``"gpu"``, ``"tpu"`` or ``""``: the stand-in this process runs (``COURSE_STANDIN``)."""
    from . import config

    return config.get().standin


def _validate_run_function(fn: Any) -> None:
    """TensorFlow's own check of what ``TPUStrategy.run`` accepts in eager mode (``tpu_strategy.py``), or a copy of
    it where that function is missing (its message, word for word)."""
    try:
        from tensorflow.python.distribute.tpu_strategy import validate_run_function
    except ImportError:  # pragma: no cover - present in TF 2.20 and 2.21
        import tensorflow as tf

        if (
            tf.executing_eagerly()
            and not isinstance(fn, tf.types.experimental.PolymorphicFunction)
            and not (
                callable(fn) and isinstance(getattr(fn, "__call__", None), tf.types.experimental.PolymorphicFunction)
            )
        ):
            raise NotImplementedError(
                "TPUStrategy.run(fn, ...) does not support pure eager execution. please make sure the function "
                "passed into `strategy.run` is a `tf.function` or `strategy.run` is called inside a `tf.function` "
                "if eager behavior is enabled."
            ) from None
        return
    validate_run_function(fn)


def _in_xla_context() -> bool:
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import control_flow_util

    return bool(control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()))


_guard_lock = threading.Lock()
_cores: tuple[str, ...] = ()


def _on_a_core() -> bool:
    from tensorflow.python.eager import context

    device = context.context().device_name or ""
    return any(device.endswith(core.split("device:")[-1]) for core in _cores)


def refuse_host_xla(cores: tuple[str, ...]) -> None:
    """From now on in this process, a ``jit_compile=True`` function called outside a ``tf.device`` scope on one of
    ``cores`` raises :class:`TPUStandInRefused` (:data:`HOST_XLA`) instead of compiling for the CPU. The check sits
    where TensorFlow enters a compiled function's XLA context (``OptionalXlaContext``, at every call of an outermost
    compiled function; a compiled function inside one is part of it)."""
    global _cores
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    with _guard_lock:
        _cores = tuple(cores)
        xla_context = polymorphic_function.OptionalXlaContext
        if getattr(xla_context, "_course_standin", False):
            return
        enter = xla_context.__enter__

        def __enter__(self):
            if self.xla_context is not None and not _on_a_core():
                raise TPUStandInRefused(HOST_XLA)
            return enter(self)

        xla_context.__enter__ = __enter__
        xla_context._course_standin = True
