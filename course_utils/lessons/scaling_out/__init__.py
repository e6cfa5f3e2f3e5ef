"""Lesson 08 · Scaling out (``notebooks/08_scaling_out.ipynb``): ``experiments`` (what the notebook measures, and
``claims(results)``, the table its last cell shows) and ``exercises`` (its bank).

Its worker programs, each run as ``python -m`` by :mod:`course_utils.cluster`: ``multiworker`` (one
MultiWorkerMirroredStrategy worker), ``parameter_server`` (a coordinator and its servers), ``model_parallel``
(one stage of a model split across processes)."""

from .._parts import on_first_use

__getattr__ = on_first_use(__name__)  # experiments, exercises: imported on first use
