"""Checking a run's options before TensorFlow starts: :func:`validate` (one line per problem, the recipe's rules,
the output folder and an earlier run there)."""

from __future__ import annotations

import dataclasses
import math
import os

from .options import (
    MAX_BATCH,
    MAX_BUDGET_S,
    MAX_EPOCHS,
    MAX_SEED,
    MAX_STEPS_PER_EXECUTION,
    MAX_WIDTH,
    Options,
    OptionsError,
    POLICIES,
    RunStateError,
    SCHEDULES,
    STEMS,
    bounded,
    divisor_below,
    folder_problem,
    is_int,
    out_problem,
    tensorboard_installed,
)
from .recipes import RECIPES
from .run_folder import earlier_run
from .. import config as _config
from ..data import MAX_NPZ_IMAGES


@dataclasses.dataclass(frozen=True)
class CourseSettings:
    """What a run takes from the course's mode and settings where its options leave it open. :func:`course_settings`
    reads them from the course config (``COURSE_*``: what ``prove`` and the notebooks set) before the run starts, or
    takes a caller's (:func:`trainer.train`'s ``settings``); the trainer takes its data, replicas, XLA, width cap and
    synthetic sizes from here, not from the config. (The runtime's detection still reads ``COURSE_DEVICE``.)"""

    data: str  # --data, parsed: "tfds" | "synthetic" | "npz:PATH"
    cpu_replicas: int  # --cpu-replicas
    course_jit: bool  # COURSE_JIT: every lesson's steps under XLA (the TPU-shaped mode)
    max_width: int  # the mode's model width (smoke: 8): the default width's cap, when no --width is given
    synthetic_train: int  # the mode's synthetic images, when no --train-examples / --test-examples is given
    synthetic_test: int


def course_settings(o: Options, base: CourseSettings | None = None) -> CourseSettings:
    """The run's :class:`CourseSettings`: ``--data`` (parsed) and ``--cpu-replicas`` as given, the rest from
    ``base`` (a caller's), else from the course config (``COURSE_DATA``, ``COURSE_CPU_REPLICAS``, and its mode's XLA,
    width and synthetic sizes). The one place the capstone reads the config; a bad value is an
    :class:`OptionsError`, in the flag's words where a flag gave it."""
    if base is not None and not isinstance(base, CourseSettings):
        raise OptionsError(f"settings must be a capstone.CourseSettings (or None: the course config's), got {base!r}")
    if o.cpu_replicas is not None and not is_int(o.cpu_replicas):
        raise OptionsError(f"--cpu-replicas must be a whole number, got {o.cpu_replicas!r}")
    try:
        data = _config.parse_data(o.data) if o.data is not None else None
    except _config.ConfigError as exc:
        raise OptionsError(str(exc).replace("COURSE_DATA=", "--data ")) from None
    if base is None:
        try:
            cfg = _config.get()
        except _config.ConfigError as exc:
            raise OptionsError(str(exc)) from None
        base = CourseSettings(
            cfg.data,
            cfg.cpu_replicas,
            bool(cfg.jit),
            cfg.sizes.model_width,
            cfg.sizes.train_examples,
            cfg.sizes.test_examples,
        )
    replicas = base.cpu_replicas if o.cpu_replicas is None else o.cpu_replicas
    if not 1 <= replicas <= _config.MAX_CPU_REPLICAS:
        raise OptionsError(f"--cpu-replicas must be 1 to {_config.MAX_CPU_REPLICAS}, got {replicas}")
    return dataclasses.replace(base, data=data or base.data, cpu_replicas=replicas)


# the options that shape the course's network, as the command line spells them (Recipe.network_options)
NETWORK_FLAGS = {"width": "--width", "stem": "--stem", "whiten": "--no-whiten"}


def validate(o: Options, settings: CourseSettings | None = None) -> CourseSettings:
    """Raise :class:`OptionsError` for anything the run cannot use (no TensorFlow needed, nothing written); else
    return the run's :class:`CourseSettings` (:func:`course_settings`: the options over ``settings`` or the config's)."""
    if o.recipe not in RECIPES:
        raise OptionsError(f"unknown recipe {o.recipe!r}; use --recipe course or --recipe baseline")
    network = RECIPES[o.recipe].network_options
    given = [
        f"{NETWORK_FLAGS[name]} ({name}={getattr(o, name)!r})"
        for name in NETWORK_FLAGS
        if name not in network and getattr(o, name) is not None
    ]
    if given:
        raise OptionsError(
            f"{' and '.join(given)} shape{'s' if len(given) == 1 else ''} the course recipe's network, but the "
            f"{o.recipe} recipe trains the tutorial's fixed CNN, where {'it' if len(given) == 1 else 'they'} would "
            f"change nothing: leave {'it' if len(given) == 1 else 'them'} out, or use --recipe course"
        )
    if (o.time_budget is None) == (o.epochs is None):
        raise OptionsError("give exactly one of --time-budget SECONDS or --epochs N")
    if o.time_budget is not None:
        if (
            isinstance(o.time_budget, bool)
            or not isinstance(o.time_budget, (int, float))
            or not (o.time_budget > 0 and math.isfinite(o.time_budget))
        ):
            raise OptionsError(f"--time-budget must be a positive number of seconds, got {o.time_budget!r}")
        bounded(
            "time_budget",
            o.time_budget,
            0,
            MAX_BUDGET_S,
            " seconds (a week: no runtime lives longer; for more, use --epochs)",
            whole=False,
        )
    if o.epochs is not None:
        if is_int(o.epochs) and o.epochs < 1:
            raise OptionsError(f"--epochs must be at least 1, got {o.epochs}")
        bounded("epochs", o.epochs, 1, MAX_EPOCHS, " (the learning-rate schedule counts steps in float32)")
    if o.batch_size is not None:
        if is_int(o.batch_size) and o.batch_size < 1:
            raise OptionsError(f"--batch-size must be at least 1, got {o.batch_size}")
        bounded("batch_size", o.batch_size, 1, MAX_BATCH, " (the linear LR rule breaks down long before)")
    if is_int(o.accumulate) and o.accumulate < 1:
        raise OptionsError(f"--accumulate must be at least 1 (1 = no accumulation), got {o.accumulate}")
    bounded("accumulate", o.accumulate, 1, MAX_BATCH, " (micro-batches per update)")
    if o.steps_per_execution is not None:
        if is_int(o.steps_per_execution) and o.steps_per_execution < 1:
            raise OptionsError(f"--steps-per-execution must be at least 1, got {o.steps_per_execution}")
        bounded("steps_per_execution", o.steps_per_execution, 1, MAX_STEPS_PER_EXECUTION, "")
    bounded("seed", o.seed, 0, MAX_SEED, " (NumPy's seeds are 32-bit)")
    if o.policy not in POLICIES:
        raise OptionsError(f"unknown policy {o.policy!r}; use one of {', '.join(POLICIES)}")
    if o.jit not in (None, True, False):
        raise OptionsError(f"jit must be True, False or None (per hardware), got {o.jit!r}")
    if o.schedule is not None and o.schedule not in SCHEDULES:
        raise OptionsError(f"unknown schedule {o.schedule!r}; use one of {', '.join(SCHEDULES)}")
    if o.label_smoothing is not None and (
        isinstance(o.label_smoothing, bool)
        or not isinstance(o.label_smoothing, (int, float))
        or not 0 <= o.label_smoothing < 1
    ):
        raise OptionsError(f"--label-smoothing must be in [0, 1), got {o.label_smoothing!r}")
    if o.stem is not None and o.stem not in STEMS:
        raise OptionsError(
            f"unknown stem {o.stem!r}; use one of {', '.join(STEMS)} (or leave it out: full, the course's)"
        )
    if o.width is not None:
        if is_int(o.width) and o.width < 1:
            raise OptionsError(f"--width must be at least 1, got {o.width}")
        bounded("width", o.width, 1, MAX_WIDTH, " (widths w…8w: 8 × 512 filters is far beyond any memory here)")

    for name in ("train_examples", "test_examples"):
        n = getattr(o, name)
        if n is not None and (not is_int(n) or (n < 1 and n != -1) or n > MAX_NPZ_IMAGES):
            raise OptionsError(
                f"--{name.replace('_', '-')} must be 1 to {MAX_NPZ_IMAGES:,} (or -1 = whole split), got {n!r}"
            )
    if o.validation_examples is not None and (
        not is_int(o.validation_examples) or not 1 <= o.validation_examples <= MAX_NPZ_IMAGES
    ):
        raise OptionsError(
            f"--validation-examples must be 1 to {MAX_NPZ_IMAGES:,} (held out of the training images),"
            f" got {o.validation_examples!r}"
        )

    settings = course_settings(o, settings)
    data, replicas = settings.data, settings.cpu_replicas
    if data.startswith("npz:"):
        from ..data import file_problem

        problem = file_problem(data[4:])
        if problem is not None:
            raise OptionsError(f"--data {data}: {data[4:]!r} {problem}")
    problem = out_problem(o.out)
    if problem:
        raise OptionsError(problem)
    if o.resume and o.overwrite:
        raise OptionsError("--resume continues the run in --out and --overwrite replaces it: give one of them")
    if not o.resume and not o.overwrite:
        problem = earlier_run(o.out)
        if problem:
            raise RunStateError(problem)
    if o.tensorboard is not None:
        problem = folder_problem("--tensorboard", o.tensorboard)
        if problem:
            raise OptionsError(problem)
        if not tensorboard_installed():
            raise OptionsError(
                "--tensorboard needs the tensorboard package, which TensorFlow 2.21 no longer "
                "installs: pip install tensorboard tensorboard-plugin-profile (or leave --tensorboard "
                "out)"
            )
    recipe = RECIPES[o.recipe]
    if o.batch_size is None and recipe.per_replica_batch and recipe.batch_size % o.accumulate:
        fits = divisor_below(recipe.batch_size, o.accumulate)
        raise OptionsError(
            f"--accumulate {o.accumulate} does not divide the {o.recipe} recipe's batch of "
            f"{recipe.batch_size} per replica; use --accumulate {fits}, or give --batch-size (the global "
            "batch, a multiple of replicas × accumulate)"
        )
    batch = recipe.global_batch(o.batch_size, replicas, o.accumulate)[0]
    # CPU replicas are known before TensorFlow starts; a GPU/TPU count is checked again after detection.
    unit = replicas * o.accumulate
    if batch % unit:
        raise OptionsError(
            f"--batch-size {batch} is not divisible by replicas × accumulate = {replicas} × {o.accumulate}; "
            f"use a multiple of {unit}"
        )
    if o.resume and not os.path.isdir(o.out):
        raise OptionsError(f"--resume: {o.out!r} does not exist; run once without --resume first")
    return settings
