"""The course's lessons, one folder each, named after its notebook without the number.

``course_utils/lessons/<name>/`` holds what ``notebooks/NN_<name>.ipynb`` measures and claims (``experiments``), its
exercises (``exercises``) and, in lesson 08, the worker programs it launches. :data:`LESSONS` is the one list of them:
``prove``, the tests and the notebook lint read it.
"""

from __future__ import annotations

import dataclasses
import types

from . import (activation_memory, bfloat16_conversion, cifar10_capstone, data_pipeline_sharding, gradient_accumulation,
               mixed_precision, scaling_out, tpu_initialization)


@dataclasses.dataclass(frozen=True)
class Lesson:
    """One lesson: its number (``"05"``), title, package (``module.experiments`` has ``measure(lab)`` and
    ``claims(results)``, ``module.exercises`` its bank), and how ``prove`` runs it."""

    id: str
    title: str
    module: types.ModuleType
    cpu_replicas: int = 1  # on a CPU, split it into this many devices (lessons about replicas)
    # how long it takes, relative to the others, in full mode and in smoke mode (measured on one core each, smoke
    # in the TPU shape, where XLA compiles dominate): prove --jobs starts the longest first
    cost: int = 1
    smoke_cost: int = 1

    @property
    def name(self) -> str:
        """The folder's name, and the notebook's without its number: ``gradient_accumulation``."""
        return self.module.__name__.rpartition(".")[2]

    @property
    def notebook(self) -> str:
        """The notebook's path in a checkout: ``notebooks/05_gradient_accumulation.ipynb``."""
        return f"notebooks/{self.id}_{self.name}.ipynb"

    @property
    def experiments(self) -> types.ModuleType:
        return self.module.experiments


LESSONS: tuple[Lesson, ...] = (
    Lesson("01", "TPU initialization", tpu_initialization, cost=10, smoke_cost=2),
    Lesson("02", "bfloat16 conversion", bfloat16_conversion, cost=7, smoke_cost=4),
    Lesson("03", "Mixed precision", mixed_precision, cost=1, smoke_cost=1),
    Lesson("04", "Data pipelines and sharding", data_pipeline_sharding, cpu_replicas=4, cost=16, smoke_cost=7),
    Lesson("05", "Gradient accumulation", gradient_accumulation, cpu_replicas=4, cost=5, smoke_cost=10),
    Lesson("06", "CIFAR-10 capstone", cifar10_capstone, cost=58, smoke_cost=19),
    Lesson("07", "Activation memory", activation_memory, cost=31, smoke_cost=9),
    Lesson("08", "Scaling out", scaling_out, cost=17, smoke_cost=10),
)

BY_ID = {lesson.id: lesson for lesson in LESSONS}
