"""Lesson 02 · bfloat16 conversion (``notebooks/02_bfloat16_conversion.ipynb``): ``experiments`` (what the notebook
measures, and ``measure(lab)`` and ``claims(results)`` for ``prove``) and ``exercises`` (its bank)."""

from .._parts import on_first_use

__getattr__ = on_first_use(__name__)  # experiments, exercises: imported on first use
