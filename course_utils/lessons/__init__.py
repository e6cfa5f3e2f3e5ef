"""The course's lessons, one folder each, named after its notebook without the number.

``course_utils/lessons/<name>/`` holds what ``notebooks/NN_<name>.ipynb`` measures and claims (``experiments``), its
exercises (``exercises``), in lesson 08 the worker programs it launches, and its manifest, ``lesson.toml``: its id,
title, time, what it measures, and how it is run (replicas, cost, XLA, cores, CI's stand-in shapes). :data:`LESSONS`
is read from the manifests by :mod:`course_utils.manifests`, which imports no lesson; ``prove``, the tests, conftest,
``.ci/run``, the notebook lint and the README's curriculum table (which ``lint --fix`` writes) all read it. A new
lesson is a folder with a manifest, and its notebook.

``python -m course_utils.lessons [--ci-shape SHAPE]`` prints the lesson ids (those CI proves in SHAPE).
"""

from __future__ import annotations

import importlib
import types

from ..manifests import BY_ID, CI_SHAPES, LESSONS, MANIFEST, Lesson, ManifestError, discover, read_manifest

__all__ = ["BY_ID", "CI_SHAPES", "LESSONS", "MANIFEST", "Lesson", "ManifestError", "discover", "read_manifest"]


def __getattr__(name: str) -> types.ModuleType:
    """``course_utils.lessons.<name>``: a lesson's package, imported on first use (PEP 562)."""
    if name in {lesson.name for lesson in LESSONS}:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
