"""course_utils — the tested helpers behind the course notebooks.

A notebook's setup cell calls :func:`setup`, which detects the hardware (TPU → GPUs → GPU → CPU),
prints a short summary and returns a :class:`course_utils.runtime.Runtime` whose ``strategy`` every
lesson builds its models under.
"""

from __future__ import annotations

import os as _os
import sys as _sys

__version__ = "0.1.0"

# Quieter TensorFlow start-up (CUDA probing on CPU machines) unless the learner asked otherwise.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The course runs Keras 3 on TensorFlow. Colab may preset another backend (e.g. JAX on TPU
# runtimes); the backend is fixed when keras is first imported, so set it before that happens.
_PREVIOUS_KERAS_BACKEND = _os.environ.get("KERAS_BACKEND")
if "keras" not in _sys.modules:
    _os.environ["KERAS_BACKEND"] = "tensorflow"

from . import config  # noqa: E402
from ._repo import REF, REPO  # noqa: E402


def setup(cpu_replicas: int | None = None, device: str | None = None, verbose: bool = True):
    """Detect the hardware, print a short summary, return the Runtime (see ``runtime.detect``)."""
    from . import runtime

    rt = runtime.detect(cpu_replicas=cpu_replicas, device=device)
    if _PREVIOUS_KERAS_BACKEND not in (None, "tensorflow") and rt.keras_backend == "tensorflow":
        note = f"KERAS_BACKEND was {_PREVIOUS_KERAS_BACKEND!r}; set to 'tensorflow' for this course"
        if note not in rt.notes:
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
