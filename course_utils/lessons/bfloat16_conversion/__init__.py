"""Lesson 02 · bfloat16 conversion (``notebooks/02_bfloat16_conversion.ipynb``): ``experiments`` (what the notebook
measures, and ``measure(lab)`` and ``claims(results)`` for ``prove``) and ``exercises`` (its bank)."""

from . import experiments, exercises
