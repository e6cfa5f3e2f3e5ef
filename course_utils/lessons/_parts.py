"""A lesson package's two parts, ``experiments`` and ``exercises``, load TensorFlow when imported: the package names
them and imports one on first use (``lesson.experiments``), so that the lesson list (:data:`course_utils.lessons.LESSONS`)
costs nothing to import — the notebook lint and ``prove``'s parent read it without TensorFlow."""

from __future__ import annotations

import importlib
import types
from typing import Callable

PARTS = ("experiments", "exercises")


def on_first_use(package: str) -> Callable[[str], types.ModuleType]:
    """The ``__getattr__`` of the lesson package named ``package`` (PEP 562): ``experiments`` and ``exercises`` are its
    submodules, imported on first use; any other name is an AttributeError as usual. An AttributeError raised while a
    part is imported (a TensorFlow without a name it uses) becomes an ImportError that names the part: as an
    AttributeError, ``getattr(lesson, "exercises", default)`` would take it for a missing part."""

    def __getattr__(name: str) -> types.ModuleType:
        if name not in PARTS:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            return importlib.import_module(f"{package}.{name}")
        except AttributeError as exc:  # raised while importing the part: not "no such attribute" (getattr's default)
            raise ImportError(f"importing {package}.{name} failed: {exc}") from exc

    return __getattr__
