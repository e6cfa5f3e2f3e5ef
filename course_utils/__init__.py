"""course_utils — the tested helpers behind the course notebooks.

A notebook's setup cell calls :func:`setup`, which detects the hardware (TPU → GPUs → GPU → CPU),
prints a short summary and returns a :class:`course_utils.runtime.Runtime` whose ``strategy`` every
lesson builds its models under.
"""

from __future__ import annotations

import os as _os
import sys as _sys

__version__ = "2026.11.4"

# Quieter TensorFlow start-up unless the learner asked otherwise. Without an NVIDIA device, TF still
# probes CUDA and logs "failed call to cuInit" at ERROR level — alarming and meaningless there, so
# level 3 hides it; real failures still surface as Python exceptions.
_os.environ.setdefault(
    "TF_CPP_MIN_LOG_LEVEL", "2" if _os.path.exists("/dev/nvidia0") or _os.path.exists("/dev/nvidiactl") else "3"
)
# Peak memory on a CPU, measured like on a TPU/GPU: TensorFlow's default CPU allocator keeps no
# statistics (tf.config.experimental.get_memory_info("CPU:0") raises), its BFC allocator (the one GPUs
# use) does. It must be chosen before TensorFlow starts; set TF_CPU_ALLOCATOR_USE_BFC=false to opt out
# (memory.measure_peak then falls back to sampling the process's resident memory, and says so).
if "tensorflow" not in _sys.modules:
    _os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
# ONEDNN_MAX_CPU_ISA=AVX2 (a laptop's CPU, emulated on a server with AVX-512) would abort the process on the first
# bfloat16 op: TensorFlow sends it to oneDNN by the CPU's own flags, and the capped oneDNN has no kernel for it
# (hardware.onednn_bf16_aborts). A real AVX2 CPU runs bfloat16 on TensorFlow's own kernels; turning oneDNN's custom
# ops off does the same here. Also read when TensorFlow starts, so only before it is imported; an explicit
# TF_ENABLE_ONEDNN_OPTS is kept.
_ONEDNN_NOTE = None
_ONEDNN_OPTS_GIVEN = "TF_ENABLE_ONEDNN_OPTS" in _os.environ
if "tensorflow" not in _sys.modules and not _ONEDNN_OPTS_GIVEN:
    from .hardware import onednn_bf16_aborts as _onednn_bf16_aborts

    _cap = _onednn_bf16_aborts()
    if _cap:
        _os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
        _ONEDNN_NOTE = (
            f"ONEDNN_MAX_CPU_ISA={_cap} on a CPU with AVX-512: oneDNN's custom ops are off "
            "(TF_ENABLE_ONEDNN_OPTS=0), so bfloat16 runs on TensorFlow's own kernels as on an AVX2 CPU "
            "instead of aborting the process"
        )
# The course runs Keras 3 on TensorFlow. Colab may preset another backend (e.g. JAX on TPU
# runtimes); the backend is fixed when keras is first imported, so set it before that happens.
_PREVIOUS_KERAS_BACKEND = _os.environ.get("KERAS_BACKEND")
if "keras" not in _sys.modules:
    _os.environ["KERAS_BACKEND"] = "tensorflow"

import warnings as _warnings  # noqa: E402

# Keras 3.15 warns on every fit(tf.data.Dataset) that its default shuffle=True is ignored; the
# course's datasets are shuffled in the pipeline, so the warning is noise for learners.
_warnings.filterwarnings("ignore", message=r"`shuffle=True` was passed, but will be ignored")

from . import config  # noqa: E402
from ._repo import REF, REPO  # noqa: E402


def setup(cpu_replicas: int | None = None, device: str | None = None, verbose: bool = True):
    """Detect the hardware, print a short summary, return the Runtime (see ``runtime.detect``)."""
    from . import runtime

    rt = runtime.detect(cpu_replicas=cpu_replicas, device=device)
    import tensorflow as tf

    # Under Jupyter, MirroredStrategy logs every cross-replica reduction at INFO level: keep
    # warnings and errors, drop that noise (one place, not a line in every lesson).
    tf.get_logger().setLevel("WARNING")
    if _PREVIOUS_KERAS_BACKEND not in (None, "tensorflow") and rt.keras_backend == "tensorflow":
        note = f"KERAS_BACKEND was {_PREVIOUS_KERAS_BACKEND!r}; set to 'tensorflow' for this course"
        if note not in rt.notes:
            rt.notes.append(note)
    from .hardware import onednn_bf16_aborts

    note, cap = _ONEDNN_NOTE, onednn_bf16_aborts()
    if note is None and cap:  # oneDNN is on under the cap: asked for, or TensorFlow came first (too late to change)
        why = (
            "TF_ENABLE_ONEDNN_OPTS is set, and kept"
            if _ONEDNN_OPTS_GIVEN
            else "TensorFlow was imported before course_utils; restart, and import course_utils first"
        )
        note = (
            f"ONEDNN_MAX_CPU_ISA={cap} on a CPU with AVX-512: the first bfloat16 op will abort this process ({why}"
            "; TF_ENABLE_ONEDNN_OPTS=0 avoids it)"
        )
    if note and note not in rt.notes:
        rt.notes.append(note)
    if verbose:
        print(rt.summary())
        print(f"Config: {config.get().describe()}")
    return rt


def detect(cpu_replicas: int | None = None, device: str | None = None, **kwargs):
    """Same as :func:`course_utils.runtime.detect` (imported lazily: TensorFlow loads on first use)."""
    from . import runtime

    return runtime.detect(cpu_replicas=cpu_replicas, device=device, **kwargs)


__all__ = ["setup", "detect", "config", "REPO", "REF", "__version__"]
