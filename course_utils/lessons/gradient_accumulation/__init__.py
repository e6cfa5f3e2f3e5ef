"""Lesson 05 · Gradient accumulation (``notebooks/05_gradient_accumulation.ipynb``): ``experiments`` (what the notebook
measures, and ``measure(lab)`` and ``claims(results)`` for ``prove``) and ``exercises`` (its bank)."""

from . import experiments, exercises
