"""Lesson 06 · CIFAR-10 capstone (``notebooks/06_cifar10_capstone.ipynb``): ``experiments`` (what the notebook measures,
and ``measure(lab)`` and ``claims(results)`` for ``prove``) and ``exercises`` (its bank)."""

from . import experiments, exercises
