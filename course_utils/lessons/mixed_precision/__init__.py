"""Lesson 03 · Mixed precision (``notebooks/03_mixed_precision.ipynb``): ``experiments`` (what the notebook
measures, and ``claims(results)``, the table its last cell shows) and ``exercises`` (its bank)."""

from .._parts import on_first_use

__getattr__ = on_first_use(__name__)  # experiments, exercises: imported on first use
