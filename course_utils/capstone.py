"""Lesson 06: the CIFAR-10 capstone — a headless trainer that gets the best accuracy a time budget allows.

Command line (the notebook calls the same code through :func:`train`)::

    python -m course_utils.capstone --data npz:cifar10.npz --recipe course --time-budget 120 --out runs/c120

Two recipes:

``course``    everything lessons 01-05 teach, plus the field's fast-CIFAR tricks (David Page's ResNet-9 /
              DAWNBench; airbench): a ResNet-9-style network for 32×32 images, the hardware's precision
              policy, a tf.data pipeline that augments whole batches (random crop, pad 4, + flip per image with
              ``data.augment_batch`` after ``batch``: the order lesson 04 measured faster), per-channel
              normalization, SGD with Nesterov momentum and decoupled weight decay, label smoothing 0.2, a
              warm-up then a linear decay to zero shaped to end exactly at the budget, a batch of 128 *per
              replica* (the global batch grows with the replicas, as lesson 08's TPU table) with the peak
              learning rate scaled linearly with that global batch, ``steps_per_execution`` 32 on a TPU
              (lesson 04), test-time augmentation (mirror, one-pixel shifts), optional weight averaging (EMA)
              and gradient accumulation (lesson 05).
``baseline``  exactly the popular TensorFlow CNN tutorial: Conv32-pool-Conv64-pool-Conv64-Flatten-Dense64,
              Adam (1e-3), a global batch of 64 whatever the replicas (the tutorial's recipe, the comparison),
              pixels /255, no augmentation, float32 — under the same budget rules.

Budgeted training (``--time-budget S``): the wall time counts everything — start-up, data loading, building,
compiling, a short timed warm-up, every epoch's validation and the final (TTA) test evaluation. The warm-up
runs a few real training and evaluation steps (weights and optimizer state are restored afterwards),
measures the step time *without* the first call (which traces and compiles; its time is still counted
against the budget because it has already been spent), and chooses the number of epochs that fits in
what is left. The learning-rate schedule is stretched to end at that epoch. After every epoch the plan
is checked against the measured epoch time (:class:`BudgetPlan` owns that arithmetic and its margins).

Splits: a validation split is held out of the training images (:data:`VALIDATION_FRACTION`, at most
:data:`MAX_VALIDATION`, the same images for every run on the same data); each epoch is evaluated on it, the best
checkpoint is chosen on it, and ablations and exercises compare runs on it. The test split is evaluated once,
at the end, with the last epoch's weights: ``summary.json`` reports both.

Fault tolerance: ``keras.callbacks.BackupAndRestore`` saves the weights and optimizer state after every
epoch; a run killed mid-epoch and restarted with ``--resume`` continues after the last finished epoch
with the same plan (``plan.json``), counts the time already spent (``clock.json``, updated every few
seconds) against the budget and continues ``metrics.json``. State that is not what the trainer wrote is
refused with the reason; finished work is never discarded silently.

The output folder: a run writes only into a folder that is new, empty, or a capstone run already (its marker
file :data:`MARKER`); anything else is refused before anything is written, and starting again there deletes only
the trainer's own files, after the options and the data have been checked.

Import this module without TensorFlow loading: bad options are rejected before TensorFlow starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import statistics
import sys
import time
from typing import Any, Callable, ClassVar

from . import fileguard

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
POLICIES = ("auto", "float32", "mixed_bfloat16", "mixed_float16")
SCHEDULES = ("onecycle", "constant")
PROG = "capstone"

# The course recipe's constants, each traced to its source (also shown by the notebook's plan table).
COURSE = dict(
    batch_size=128,  # per replica per update: the global batch is 128 × replicas (1,024 on a v5e-8; lesson 08 §6)
    lr_per_256=0.2,  # peak LR for a global batch of 256; linear in the global batch (see peak_learning_rate)
    momentum=0.9,
    weight_decay=5e-3,  # decoupled (Keras SGD: w -= lr·wd·w per step) ≈ Page's 5e-4 L2 through momentum 0.9
    label_smoothing=0.2,
    warmup_fraction=0.2,  # of all steps: Page warms up for 5 of 24 epochs
    logit_scale=0.125,  # Page's final "Mul(0.125)": keeps early logits small
    width=16,  # base width w: widths w, 2w, 4w, 8w (ResNet-9 uses w=64; a 2-core CPU needs far less)
)
# Auto width (the course recipe with a time budget and no --width): the widest base width in `widths` that the
# budget still trains for `target_epochs` epochs. Measured on real CIFAR-10 images (3,661 training images), 60 s:
# one core, widths 4 / 6 / 8 / 12 / 16 trained 36 / 25 / 21 / 13 / 9 epochs to 64.0 / 69.1 / 68.6 / 67.3 / 61.6%;
# 2 cores, widths 8 / 12 / 16: 29 / 19 / 15 epochs, 71.9 / 69.4 / 69.9%. The warm-up times the `start` width only;
# another width's epoch is predicted (predicted_epoch_s): the convolutions' work grows as the width squared
# (resnet9_macs), and a share `fixed_share` of the start width's epoch does not grow with it (the input pipeline,
# each step's calls, the epoch's checkpoints; 0.5–0.7 fitted to the epoch times above).
# Longer budgets want more epochs as well as a wider net: the target grows as the square root of the budget beyond
# `target_budget_s` (target_epochs_for). 600 s, 2 cores, fixed widths: 32 / 48 / 64 trained 75 / 44 / 28 epochs to
# 79.0 / 78.6 / 77.4% (flip TTA); the target of 63 there chooses 32.
AUTO_WIDTH = dict(widths=(4, 6, 8, 12, 16, 24, 32, 48, 64), start=8, target_epochs=20, target_budget_s=60.0,
                  target_growth=0.5, fixed_share=0.6)
# When the chosen width is timed too and its epoch is off the prediction by more than this factor (either way), the
# width is chosen again from the two timed widths (epoch = a + b·MACs through them, width_model), and timed again if
# planning still has room. The one-width prediction can be far off: on the 2-core AMX CPU width 48 was predicted at
# 27.5 s/epoch and measured at 12.6 s; on an H200 (Keras on JAX, measurements/2026-11-26-h200-keras-jax) width 64's
# epoch took 0.81 s where width 8's took 0.68 s
RECHOOSE_OFF_BY = 1.25
# Test-time augmentation (the course recipe): the mean prediction over each test image and its mirror, each also
# shifted by one pixel in these directions: 10 views. On the dev images (real CIFAR-10, 1,017 test images) it beat the
# mirror alone by +0.2 to +2.9 points (median +1.0; five 60 s runs and one 600 s, 2 cores); shifts of 2 pixels scored
# within a point of one pixel's (+0.6 on average at 60 s, -0.5 at 600 s)
TTA_SHIFTS = ((1, 1), (1, -1), (-1, 1), (-1, -1))
TTA_VIEWS = 2 * (1 + len(TTA_SHIFTS))
# At most this share of a time budget goes to planning (compiling and timing warm-up steps) before the first epoch:
# the chosen width is warmed up too only when that fits in it (else its first epoch compiles it, and the plan is
# corrected after each epoch), and a budget the first warm-up already overran is told so up front
PLANNING_SHARE = 0.10
PLANNING_MARGIN = 1.25  # another width's warm-up, estimated from the last one's, must fit with this factor
# Steps the warm-up times after its compiling one (fewer on a TPU, whose calls run steps_per_execution each): 6 cost
# 0.4 s of a 60 s budget on one core at width 8; the plan is corrected after each epoch anyway
WARM_UP_STEPS = 6
# … and for at least this long, up to an epoch: 6 short steps (the baseline's 12.5 ms on 2 cores) timed 30% slower
# than its epochs then ran (53 epochs planned, 77 trained at 60 s)
WARM_UP_MIN_S = 0.5
BASELINE = dict(batch_size=64, learning_rate=1e-3)  # a global batch: the tutorial's, whatever the replicas
# steps_per_execution on a TPU (lesson 04 §7: each call into the compiled function costs a host round trip, which a
# TPU's short steps feel most; 32 or more is common there), at most the steps of an epoch. Elsewhere 1: off a TPU a
# step of this ResNet is long next to the call, and under MirroredStrategy Keras refuses more (keras#19246).
TPU_STEPS_PER_EXECUTION = 32
# Goyal et al. 2017 scaled linearly to 8k on ImageNet with a 5-epoch warm-up; CIFAR-10 under a minutes budget has
# too few steps for that warm-up, so the course warns from ~1k examples per update
MAX_LR_SCALING_BATCH = 1024
# The validation split: held out of the training images, the same ones for every run on the same data (its own
# seed), the usual 45,000 / 5,000 on CIFAR-10's 50,000
VALIDATION_FRACTION = 0.1
MAX_VALIDATION = 5_000
VALIDATION_SEED = 20_240_101

# Bounds on the numeric options, each with its reason (checked before TensorFlow starts)
MAX_EPOCHS = 10_000  # the schedule counts steps in float32: exact only up to 2**24 steps (checked too)
MAX_SCHEDULE_STEPS = 2 ** 24
MAX_BUDGET_S = 7 * 86_400  # a week: no runtime the course targets lives longer (Colab: 12-24 hours)
MAX_BATCH = 65_536
MAX_WIDTH = 512  # 8w = 4,096 filters: beyond any memory the course targets
MAX_STEPS_PER_EXECUTION = 10_000
MAX_SEED = 2 ** 32 - 1  # NumPy's seeds (keras.utils.set_random_seed) are 32-bit

# The output folder: the marker a run leaves, and the names the trainer itself writes there
MARKER = "capstone_run.json"
RUN_FILES = ("metrics.json", "summary.json", "plan.json", "clock.json", "best.weights.h5")
RUN_FOLDERS = ("backup",)
BACKUP_FILES = ("latest.weights.h5", "training_metadata.json")  # BackupAndRestore's, each also as ".bkp"

RECIPE_TABLE = [
    {"choice": "ResNet-9-style network (conv-BN-ReLU prep, 2 residual blocks, global max pooling)", "lesson": "capstone",
     "source": "D. Page, 'How to train your ResNet' (DAWNBench 2018); airbench (K. Jordan 2024)"},
    {"choice": "with a time budget, the widest network width that still trains 20 epochs (more for budgets over a "
               "minute; timed at width 8, the others predicted, chosen again if the chosen width's timing is off)",
     "lesson": "capstone", "source": "capstone.choose_width; lesson 06 §2"},
    {"choice": "a fixed first convolution that whitens 2×2 patches (its filters computed once from the training "
               "images; learning starts faster)", "lesson": "capstone",
     "source": "airbench (K. Jordan 2024); capstone.whitening_kernel"},
    {"choice": "precision policy of the hardware (bf16 on TPU/Ampere+/AMX CPUs, fp16 + loss scaling on T4)",
     "lesson": "03", "source": "memory.recommended_policy"},
    {"choice": "tf.data pipeline: cache → shuffle → batch → augment whole batches → prefetch (one call per batch, "
               "not per image)", "lesson": "04", "source": "data.build_pipeline(batch_augment_fn=data.augment_batch)"},
    {"choice": "random crop (pad 4) + horizontal flip, each image its own; per-channel normalization", "lesson": "04",
     "source": "data.augment_batch; Page"},
    {"choice": "a batch of 128 per replica: the global batch is 128 × replicas", "lesson": "08",
     "source": "lesson 08 §6; capstone.Recipe.global_batch"},
    {"choice": "SGD, Nesterov momentum 0.9, decoupled weight decay", "lesson": "capstone",
     "source": "Page; Loshchilov & Hutter 2019 (decoupled weight decay)"},
    {"choice": "label smoothing 0.2", "lesson": "capstone", "source": "Szegedy et al. 2016; airbench"},
    {"choice": "warm-up then linear decay to zero, stretched to end at the budget", "lesson": "capstone",
     "source": "Page (one-cycle); budgeted training (Li et al. 2020)"},
    {"choice": "peak LR linear in the global batch (0.2 per 256; warned above ~1k)", "lesson": "capstone, 08",
     "source": "Goyal et al. 2017; capstone.peak_learning_rate"},
    {"choice": "test-time augmentation: the mean over each image and its mirror, each also shifted one pixel "
               "diagonally (10 views)", "lesson": "capstone", "source": "Page; airbench; capstone.tta_views"},
    {"choice": "optional EMA of the weights (SGD use_ema)", "lesson": "capstone", "source": "Page; Keras optimizers"},
    {"choice": "optional gradient accumulation (--accumulate K)", "lesson": "05", "source": "accumulation.AccumulatingModel"},
    {"choice": f"steps_per_execution: {TPU_STEPS_PER_EXECUTION} steps per call on a TPU, 1 elsewhere", "lesson": "04",
     "source": "Keras compile(); capstone.choose_steps_per_execution"},
    {"choice": "BackupAndRestore + best checkpoint; --resume", "lesson": "capstone", "source": "Keras callbacks"},
]


def tensorboard_installed() -> bool:
    """Whether TensorBoard is installed: ``tf.summary`` (the TensorBoard callback's scalars and profile) needs it,
    and TensorFlow 2.21 stopped depending on it."""
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


class OptionsError(ValueError):
    """An option the trainer cannot use; the message is one line that says which and what to do."""


class RunStateError(OptionsError):
    """``--resume`` found state in the run's folder that the trainer did not write (or another run's); the message
    says which file, why, and that nothing was changed."""


@dataclasses.dataclass
class Options:
    """Everything a capstone run needs; the CLI fills the same fields. ``None`` = the recipe's default."""

    data: str | None = None  # "tfds" | "synthetic" | "npz:PATH"; None = COURSE_DATA (course_utils.config)
    recipe: str = "course"  # "course" | "baseline"
    time_budget: float | None = None  # seconds of wall time; exclusive with epochs
    epochs: int | None = None
    out: str = "runs/capstone"
    resume: bool = False
    overwrite: bool = False  # replace an earlier run in ``out`` (else a run there is refused: --resume or --overwrite)
    batch_size: int | None = None  # global batch per update; None: course 128 per replica × replicas, baseline 64
    policy: str = "auto"  # auto = the hardware's (course) / float32 (baseline, as the tutorial)
    jit: bool | None = None  # XLA (jit_compile); None = per hardware (see choose_jit)
    accumulate: int = 1  # micro-batches per update (lesson 05)
    steps_per_execution: int | None = None  # None: per hardware (choose_steps_per_execution: 32 on a TPU, else 1)
    cpu_replicas: int | None = None  # None = COURSE_CPU_REPLICAS
    seed: int = 42
    tensorboard: str | None = None  # folder for TensorBoard scalars + a profile of a few steps
    train_examples: int | None = None  # None = whole split (synthetic: the config's sizes); validation comes out of it
    test_examples: int | None = None
    validation_examples: int | None = None  # None = VALIDATION_FRACTION of the training images, ≤ MAX_VALIDATION
    # ablation toggles (None = the recipe's default)
    width: int | None = None  # course: base width (None: 16, smoke 8; auto with a budget); baseline: ignored
    augment: bool | None = None
    label_smoothing: float | None = None
    schedule: str | None = None  # "onecycle" | "constant"
    tta: bool | None = None
    whiten: bool | None = None  # course: a fixed first convolution that whitens 2×2 patches (whitening_kernel)
    ema: bool | None = None
    verbose: int = 1  # 1: progress bar + a line per epoch; 0: the line per epoch; -1: silent

    def resolved(self) -> "Options":
        """A copy with every recipe default filled in that the hardware does not decide. Left None until
        :func:`train` knows the replicas and the data: the course recipe's ``batch_size`` (per replica: see
        :meth:`Recipe.global_batch`) and ``steps_per_execution`` (:func:`choose_steps_per_execution`)."""
        return RECIPES[self.recipe].fill_defaults(self)


# ----------------------------------------------------------------------------------------------
# Recipes: one object each
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One recipe: its defaults for the options left at None, its precision policy, model and optimizer."""

    name: str
    batch_size: int  # per replica when per_replica_batch, else global
    per_replica_batch: bool  # the global batch grows with the replicas (course) or stays as written (baseline)
    augment: bool
    label_smoothing: float
    schedule: str
    tta: bool
    whiten: bool  # a fixed 2×2 patch-whitening first convolution (course)
    sized_by_width: bool  # --width applies (and auto width with a budget)

    def fill_defaults(self, o: Options) -> Options:
        o = dataclasses.replace(o)
        for name in ("augment", "label_smoothing", "schedule", "tta", "whiten"):
            if getattr(o, name) is None:
                setattr(o, name, getattr(self, name))
        if o.batch_size is None and not self.per_replica_batch:
            o.batch_size = self.batch_size
        if o.ema is None:
            o.ema = False
        return o

    def global_batch(self, asked: int | None, replicas: int, accumulate: int = 1,
                     train_images: int | None = None) -> tuple[int, str]:
        """``(global batch per update, why)``. ``asked`` (``--batch-size``) is the global batch as given. Else the
        baseline keeps its global batch (the tutorial's, on any number of replicas), and the course recipe gives
        each replica :attr:`batch_size` (128) — so the global batch, and with it the peak learning rate
        (:func:`peak_learning_rate`), grows with the replicas: 128 on one, 1,024 on a v5e-8 (lesson 08 §6). Only
        where that global batch is larger than ``train_images`` (an epoch would have no whole step) is the
        per-replica batch halved until one step fits, and the reason says so."""
        if asked is not None:
            return asked, "--batch-size"
        if not self.per_replica_batch:
            return self.batch_size, f"the {self.name} recipe's, on any number of replicas"
        per = self.batch_size
        while (train_images is not None and per * replicas > train_images and per % 2 == 0
               and (per // 2) % accumulate == 0):
            per //= 2
        why = f"{per} per replica × {replicas} replica{'s' if replicas != 1 else ''}"
        if per != self.batch_size:
            why += (f" ({self.batch_size} per replica would make one step larger than the {train_images} training "
                    "images)")
        return per * replicas, why

    def choose_policy(self, rt) -> tuple[str, str]:  # pragma: no cover - each recipe says
        raise NotImplementedError

    def peak_learning_rate(self, global_batch: int) -> float:  # pragma: no cover
        raise NotImplementedError

    def learning_rate_rule(self) -> str:  # pragma: no cover - how peak_learning_rate scales, in words
        raise NotImplementedError

    def model(self, width: int, mean, variance, whiten=None):  # pragma: no cover - whiten: a whitening_kernel
        raise NotImplementedError

    def optimizer(self, schedule, ema: bool):  # pragma: no cover
        raise NotImplementedError


class _Course(Recipe):
    def choose_policy(self, rt) -> tuple[str, str]:
        from . import memory

        policy, why = memory.recommended_policy(rt)
        if rt.kind == "CPU" and policy == "mixed_bfloat16":
            if os.environ.get("TF_ENABLE_ONEDNN_OPTS", "").strip().lower() in ("0", "false"):
                # measured on a 2-core AVX512-BF16 CPU: 207 ms a step under mixed_bfloat16, 38 ms under float32
                return "float32", ("CPU with oneDNN off (TF_ENABLE_ONEDNN_OPTS=0): TensorFlow's own kernels run "
                                   "bfloat16 several times slower than float32")
            cap = memory.onednn_bf16_capped()
            if cap:
                return "float32", (f"CPU with oneDNN capped at {cap} (ONEDNN_MAX_CPU_ISA): no bfloat16 kernels there, "
                                   "as on a laptop's CPU")
            supported, flags = memory.cpu_bf16_support()
            if supported is False:
                return "float32", "CPU without native bfloat16 (no avx512_bf16/amx_bf16): float32 is faster here"
            if supported:
                why = f"CPU with native bfloat16 ({', '.join(flags)}): mixed_bfloat16"
        return policy, why

    def peak_learning_rate(self, global_batch: int) -> float:
        return peak_learning_rate(global_batch)

    def learning_rate_rule(self) -> str:
        return f"the linear rule: {COURSE['lr_per_256']:g} per 256 examples per update"

    def model(self, width, mean, variance, whiten=None):
        return resnet9(width, mean=mean, variance=variance, whiten=whiten)

    def optimizer(self, schedule, ema):
        import keras

        return keras.optimizers.SGD(schedule, momentum=COURSE["momentum"], nesterov=True,
                                    weight_decay=COURSE["weight_decay"], use_ema=ema)


class _Baseline(Recipe):
    def choose_policy(self, rt) -> tuple[str, str]:
        return "float32", "baseline: float32, as the tutorial"

    def peak_learning_rate(self, global_batch: int) -> float:
        return BASELINE["learning_rate"] * global_batch / BASELINE["batch_size"]

    def learning_rate_rule(self) -> str:
        return f"Adam's {BASELINE['learning_rate']:g} at the tutorial's {BASELINE['batch_size']}, linear in the batch"

    def model(self, width, mean, variance, whiten=None):
        return tutorial_cnn()

    def optimizer(self, schedule, ema):
        import keras

        return keras.optimizers.Adam(schedule, use_ema=ema)


RECIPES: dict[str, Recipe] = {
    "course": _Course("course", batch_size=COURSE["batch_size"], per_replica_batch=True, augment=True,
                      label_smoothing=COURSE["label_smoothing"], schedule="onecycle", tta=True, whiten=True,
                      sized_by_width=True),
    "baseline": _Baseline("baseline", batch_size=BASELINE["batch_size"], per_replica_batch=False, augment=False,
                          label_smoothing=0.0, schedule="constant", tta=False, whiten=False,
                          sized_by_width=False),
}


def choose_steps_per_execution(asked: int | None, kind: str, replicas: int, steps_per_epoch: int) -> tuple[int, str]:
    """``(steps_per_execution, why)``: ``asked`` (``--steps-per-execution``) as given; on a TPU
    :data:`TPU_STEPS_PER_EXECUTION`, at most an epoch's steps (lesson 04 §7: a call into the compiled function costs
    a host round trip, and a TPU's steps are short); elsewhere 1 — a CPU or GPU step of this ResNet is long next to
    the call, and under MirroredStrategy with several replicas Keras refuses more (keras-team/keras#19246)."""
    if asked is not None:
        return asked, "--steps-per-execution"
    if kind == "TPU":
        n = max(1, min(TPU_STEPS_PER_EXECUTION, steps_per_epoch))
        bound = f", bounded by the {steps_per_epoch} steps of an epoch" if n < TPU_STEPS_PER_EXECUTION else ""
        return n, f"TPU: {n} steps per call into the compiled function, one host round trip for them all{bound}"
    if replicas > 1:
        return 1, f"{replicas} replicas under MirroredStrategy: Keras refuses more than 1 there, keras-team/keras#19246"
    return 1, f"{kind}: a step of this ResNet is long next to a call, so several per call pay off only on a TPU"


def choose_jit(o: Options, kind: str, course_jit: bool = False, replicas: int = 1) -> tuple[bool, bool, str]:
    """``(jit_compile, compiled, why)``: what to pass Keras' ``compile(jit_compile=...)``, whether the step really
    runs under XLA, and why. Keras resolves ``jit_compile="auto"`` to False whenever the model was built under a
    tf.distribute strategy (keras/src/trainers/trainer.py, "Disable XLA with tf.distribute") — as the trainer's is on
    several replicas and a TPU, not on one device (:func:`_fit_strategy`) — and on a machine without an accelerator,
    so the choice is made here, explicitly, the same wherever the trainer runs:

    - ``--jit`` / ``--no-jit`` (``Options.jit``): as asked;
    - TPU: TPUStrategy compiles every step with XLA whatever Keras is told (nothing to choose);
    - ``COURSE_JIT=1``: on, as every lesson's measured steps;
    - GPU: on — XLA fuses the step's elementwise ops (BN, ReLU, casts) into the convolutions' neighbours;
    - CPU: off — a small ResNet on a CPU is bound by its convolutions, which XLA hands to the same kernels
      (lesson 06 §5 measures it)."""
    from .runtime import MULTI_REPLICA_XLA, fit_jit_compile, whole_step_compiles

    if o.jit and not whole_step_compiles(kind, replicas):
        raise OptionsError(f"--jit fails on {replicas} replicas: {MULTI_REPLICA_XLA}; leave --jit out (fit then runs "
                           "without XLA) or train on one replica (--cpu-replicas 1)")
    if o.jit is not None:
        return bool(o.jit), bool(o.jit) or kind == "TPU", "chosen with --jit" if o.jit else "chosen with --no-jit"
    jit, compiled, why = fit_jit_compile(kind, course_jit, replicas)  # the rule every lesson's fit follows
    if not compiled and replicas <= 1:  # a CPU: lesson 06 measured it for this model
        why = "CPU: XLA does not speed up this convolution-bound step (lesson 06 §5 measures it); --jit to try"
    return jit, compiled, why


# ----------------------------------------------------------------------------------------------
# Checking the options (no TensorFlow)
# ----------------------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _own_name(name: str) -> bool:
    """A file name the trainer writes in its output folder: its files and their temporary copies — a kill can leave
    one behind (:func:`fileguard.write_bytes`' ``.NAME.PID-RANDOM.tmp``, or ``NAME.tmpPID`` from runs before it)."""
    if name.startswith(".") and name.endswith(".tmp"):
        base = name[1:-len(".tmp")].rsplit(".", 1)[0]
    else:
        base = name.split(".tmp", 1)[0] if ".tmp" in name else name
    return base == MARKER or base in RUN_FILES


def _own_backup_name(name: str) -> bool:
    return name.removesuffix(".bkp") in BACKUP_FILES


def _foreign_entries(out: str) -> list[str]:
    """What in ``out`` the trainer did not write: names other than its files, its backup folder and the backup's
    files (one level down)."""
    foreign = []
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        if name in RUN_FOLDERS and os.path.isdir(path) and not os.path.islink(path):
            foreign += [f"{name}/{inner}" for inner in sorted(os.listdir(path)) if not _own_backup_name(inner)]
        elif not (_own_name(name) and os.path.isfile(path)):
            foreign.append(name)
    return foreign


def _nearest_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return path


def _folder_problem(flag: str, path: Any) -> str | None:
    """Why ``path`` cannot be (or become) a folder this process writes into; None when it can."""
    if not isinstance(path, str) or not path.strip():
        return f"{flag} must name a folder, got {path!r}"
    if os.path.lexists(path) and not os.path.isdir(path):
        return f"{flag} {path!r} is a file, not a folder"
    existing = _nearest_existing(path)
    if not os.path.isdir(existing):
        return f"{flag} {path!r} cannot be created: {existing!r} is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return (f"{flag} {path!r} is not writable" if existing == os.path.abspath(path) else
                f"{flag} {path!r} cannot be created: {existing!r} is not writable")
    return None


def out_problem(out: Any) -> str | None:
    """Why a run may not write into ``out``: it must be a new or empty folder, or a capstone run already (its
    :data:`MARKER`, or — runs from before the marker — only the trainer's own files). None when it may."""
    problem = _folder_problem("--out", out)
    if problem or not os.path.isdir(out):
        return problem
    try:
        foreign = _foreign_entries(out)
    except OSError as exc:
        return f"--out {out!r} cannot be read ({exc.strerror or exc})"
    if os.path.isfile(os.path.join(out, MARKER)):  # its own run: other files may stay, but not in backup/
        inside = [name for name in foreign if name.startswith(tuple(f"{f}/" for f in RUN_FOLDERS))]
        if inside:
            return (f"--out {out!r}: its backup folder holds files the trainer did not write ({', '.join(inside[:3])}),"
                    " and Keras removes that folder when a run finishes: move them, or choose another --out")
        return None
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        return (f"--out {out!r} holds files that are not a capstone run's ({shown}); the trainer writes only into a new "
                "or empty folder or one of its own runs: choose another --out")
    return None


def earlier_run(out: str) -> str | None:
    """Why a new run may not start in ``out`` unless told to (``--resume`` or ``--overwrite``): what an earlier run
    left there, finished or not. None when ``out`` holds no run's results (new, empty, or only a marker)."""
    run = RunFolder(out)
    if not os.path.isdir(out):
        return None
    summary = _read_json(run.summary)
    if os.path.exists(run.summary):
        what = "a finished run"
        if isinstance(summary, dict) and isinstance(summary.get("test_accuracy"), (int, float)):
            what += (f" (test accuracy {100 * summary['test_accuracy']:.1f}% after {summary.get('epochs', '?')} epochs"
                     f" on {summary.get('data', '?')} data)")
        return (f"--out {out!r} holds {what}; nothing was changed: add --overwrite to replace it, or choose another "
                "--out")
    history = _read_json(run.metrics, [])
    left = [name for name in RUN_FILES if name != "summary.json" and os.path.exists(os.path.join(out, name))]
    if os.path.isdir(run.backup) or left:
        epochs = len(history) if isinstance(history, list) else 0
        return (f"--out {out!r} holds an unfinished run ({epochs} epoch{'s' if epochs != 1 else ''} in metrics.json);"
                " nothing was changed: add --resume to continue it, --overwrite to start again, or choose another "
                "--out")
    return None


def _divisor_below(n: int, k: int) -> int:
    """The largest divisor of ``n`` below ``k`` (an --accumulate that divides the per-replica batch)."""
    return max(d for d in range(1, k) if n % d == 0)


def _bounded(name: str, value: Any, low: float, high: float, why: str, whole: bool = True) -> None:
    flag = "--" + name.replace("_", "-")
    if whole and not _is_int(value):
        raise OptionsError(f"{flag} must be a whole number, got {value!r}")
    if not whole and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise OptionsError(f"{flag} must be a number, got {value!r}")
    if not (low <= value <= high):  # NaN fails this too
        span = f"{low:,} to {high:,}" if whole else f"at most {high:,}"
        raise OptionsError(f"{flag} must be {span}{why}, got {value!r}")


def validate(o: Options) -> None:
    """Raise :class:`OptionsError` for anything the run cannot use (no TensorFlow needed, nothing written)."""
    if o.recipe not in RECIPES:
        raise OptionsError(f"unknown recipe {o.recipe!r}; use --recipe course or --recipe baseline")
    if (o.time_budget is None) == (o.epochs is None):
        raise OptionsError("give exactly one of --time-budget SECONDS or --epochs N")
    if o.time_budget is not None:
        if isinstance(o.time_budget, bool) or not isinstance(o.time_budget, (int, float)) or not (
                o.time_budget > 0 and math.isfinite(o.time_budget)):
            raise OptionsError(f"--time-budget must be a positive number of seconds, got {o.time_budget!r}")
        _bounded("time_budget", o.time_budget, 0, MAX_BUDGET_S,
                 " seconds (a week: no runtime lives longer; for more, use --epochs)", whole=False)
    if o.epochs is not None:
        if _is_int(o.epochs) and o.epochs < 1:
            raise OptionsError(f"--epochs must be at least 1, got {o.epochs}")
        _bounded("epochs", o.epochs, 1, MAX_EPOCHS, " (the learning-rate schedule counts steps in float32)")
    if o.batch_size is not None:
        if _is_int(o.batch_size) and o.batch_size < 1:
            raise OptionsError(f"--batch-size must be at least 1, got {o.batch_size}")
        _bounded("batch_size", o.batch_size, 1, MAX_BATCH, " (the linear LR rule breaks down long before)")
    if _is_int(o.accumulate) and o.accumulate < 1:
        raise OptionsError(f"--accumulate must be at least 1 (1 = no accumulation), got {o.accumulate}")
    _bounded("accumulate", o.accumulate, 1, MAX_BATCH, " (micro-batches per update)")
    if o.steps_per_execution is not None:
        if _is_int(o.steps_per_execution) and o.steps_per_execution < 1:
            raise OptionsError(f"--steps-per-execution must be at least 1, got {o.steps_per_execution}")
        _bounded("steps_per_execution", o.steps_per_execution, 1, MAX_STEPS_PER_EXECUTION, "")
    _bounded("seed", o.seed, 0, MAX_SEED, " (NumPy's seeds are 32-bit)")
    if o.policy not in POLICIES:
        raise OptionsError(f"unknown policy {o.policy!r}; use one of {', '.join(POLICIES)}")
    if o.jit not in (None, True, False):
        raise OptionsError(f"jit must be True, False or None (per hardware), got {o.jit!r}")
    if o.schedule is not None and o.schedule not in SCHEDULES:
        raise OptionsError(f"unknown schedule {o.schedule!r}; use one of {', '.join(SCHEDULES)}")
    if o.label_smoothing is not None and (isinstance(o.label_smoothing, bool) or not isinstance(
            o.label_smoothing, (int, float)) or not 0 <= o.label_smoothing < 1):
        raise OptionsError(f"--label-smoothing must be in [0, 1), got {o.label_smoothing!r}")
    if o.width is not None:
        if _is_int(o.width) and o.width < 1:
            raise OptionsError(f"--width must be at least 1, got {o.width}")
        _bounded("width", o.width, 1, MAX_WIDTH, " (widths w…8w: 8 × 512 filters is far beyond any memory here)")
    from .data import MAX_NPZ_IMAGES

    for name in ("train_examples", "test_examples"):
        n = getattr(o, name)
        if n is not None and (not _is_int(n) or (n < 1 and n != -1) or n > MAX_NPZ_IMAGES):
            raise OptionsError(f"--{name.replace('_', '-')} must be 1 to {MAX_NPZ_IMAGES:,} (or -1 = whole split), "
                               f"got {n!r}")
    if o.validation_examples is not None and (not _is_int(o.validation_examples) or not
                                              1 <= o.validation_examples <= MAX_NPZ_IMAGES):
        raise OptionsError(f"--validation-examples must be 1 to {MAX_NPZ_IMAGES:,} (held out of the training images),"
                           f" got {o.validation_examples!r}")
    from . import config as _config

    if o.cpu_replicas is not None and not _is_int(o.cpu_replicas):
        raise OptionsError(f"--cpu-replicas must be a whole number, got {o.cpu_replicas!r}")
    try:
        data = _config.parse_data(o.data) if o.data is not None else _config.get().data
        replicas = _config.get().cpu_replicas if o.cpu_replicas is None else o.cpu_replicas
    except _config.ConfigError as exc:
        raise OptionsError(str(exc).replace("COURSE_DATA=", "--data ")) from None
    if not 1 <= replicas <= _config.MAX_CPU_REPLICAS:
        raise OptionsError(f"--cpu-replicas must be 1 to {_config.MAX_CPU_REPLICAS}, got {replicas}")
    if data.startswith("npz:"):
        from .data import file_problem

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
        problem = _folder_problem("--tensorboard", o.tensorboard)
        if problem:
            raise OptionsError(problem)
        if not tensorboard_installed():
            raise OptionsError("--tensorboard needs the tensorboard package, which TensorFlow 2.21 no longer "
                               "installs: pip install tensorboard tensorboard-plugin-profile (or leave --tensorboard "
                               "out)")
    recipe = RECIPES[o.recipe]
    if o.batch_size is None and recipe.per_replica_batch and recipe.batch_size % o.accumulate:
        fits = _divisor_below(recipe.batch_size, o.accumulate)
        raise OptionsError(f"--accumulate {o.accumulate} does not divide the {o.recipe} recipe's batch of "
                           f"{recipe.batch_size} per replica; use --accumulate {fits}, or give --batch-size (the global "
                           "batch, a multiple of replicas × accumulate)")
    batch = recipe.global_batch(o.batch_size, replicas, o.accumulate)[0]
    # CPU replicas are known before TensorFlow starts; a GPU/TPU count is checked again after detection.
    unit = replicas * o.accumulate
    if batch % unit:
        raise OptionsError(
            f"--batch-size {batch} is not divisible by replicas × accumulate = {replicas} × {o.accumulate}; "
            f"use a multiple of {unit}")
    if o.resume and not os.path.isdir(o.out):
        raise OptionsError(f"--resume: {o.out!r} does not exist; run once without --resume first")


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse's default prints the whole usage first)
        raise OptionsError(message)


def _positive_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=f"python -m course_utils.{PROG}",
                description="Train CIFAR-10 with the course recipe or the tutorial baseline, for a number of "
                            "epochs or a time budget; resumable.")
    p.add_argument("--data", default=None, help="tfds | synthetic | npz:PATH (default: COURSE_DATA, else tfds)")
    p.add_argument("--recipe", default="course", help="course | baseline (default course)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--time-budget", type=_positive_float, default=None, metavar="SECONDS",
                   help="wall-clock budget, evaluation included; picks the epochs and shapes the LR schedule")
    g.add_argument("--epochs", type=int, default=None, metavar="N", help="train exactly N epochs (no budget)")
    p.add_argument("--out", default="runs/capstone", metavar="DIR",
                   help="output folder: new, empty, or an earlier capstone run (default runs/capstone)")
    r = p.add_mutually_exclusive_group()
    r.add_argument("--resume", action="store_true", help="continue the run in --out after the last finished epoch")
    r.add_argument("--overwrite", action="store_true",
                   help="replace the run already in --out (without it, a folder holding a run is refused)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="global batch per update (default: course 128 per replica × replicas, with the learning rate "
                        "scaled linearly; baseline 64)")
    p.add_argument("--policy", default="auto", help="auto | float32 | mixed_bfloat16 | mixed_float16")
    j = p.add_mutually_exclusive_group()
    j.add_argument("--jit", dest="jit", action="store_const", const=True, default=None,
                   help="compile the step with XLA (default: on one GPU; off on a CPU and on several replicas, "
                        "where fit cannot be compiled; a TPU always compiles)")
    j.add_argument("--no-jit", dest="jit", action="store_const", const=False, help="do not compile the step with XLA")
    p.add_argument("--accumulate", type=int, default=1, metavar="K", help="micro-batches per update (lesson 05)")
    p.add_argument("--steps-per-execution", type=int, default=None, metavar="N",
                   help=f"steps per call into the compiled function (default: {TPU_STEPS_PER_EXECUTION} on a TPU, at "
                        "most an epoch's steps; 1 elsewhere; lesson 04)")
    p.add_argument("--cpu-replicas", type=int, default=None, metavar="N", help="split the CPU into N replicas")
    p.add_argument("--seed", type=int, default=42, help="random seed of the weights and the data order (default 42)")
    p.add_argument("--tensorboard", default=None, metavar="DIR", help="TensorBoard scalars + a profile of a few steps")
    p.add_argument("--train-examples", type=int, default=None, metavar="N",
                   help="first N training images, validation included (-1: all)")
    p.add_argument("--test-examples", type=int, default=None, metavar="N", help="first N test images (-1: all)")
    p.add_argument("--validation-examples", type=int, default=None, metavar="N",
                   help=f"held out of the training images (default {VALIDATION_FRACTION:.0%}, at most {MAX_VALIDATION:,})"
                   .replace("%", "%%"))  # argparse %-formats help strings
    p.add_argument("--width", type=int, default=None, help=f"course: base width w (widths w,2w,4w,8w); default {COURSE['width']} (smoke 8), "
                        "chosen automatically with --time-budget")
    p.add_argument("--no-augment", dest="augment", action="store_const", const=False, default=None,
                   help="no flips and crops while training (an ablation)")
    p.add_argument("--label-smoothing", type=float, default=None, metavar="X",
                   help="label smoothing in [0, 1) (course 0.2, baseline 0)")
    p.add_argument("--schedule", default=None, help="onecycle | constant")
    p.add_argument("--no-tta", dest="tta", action="store_const", const=False, default=None,
                   help="no test-time augmentation (mirror and one-pixel shifts)")
    p.add_argument("--no-whiten", dest="whiten", action="store_const", const=False, default=None,
                   help="course: no fixed patch-whitening first convolution (an ablation)")
    p.add_argument("--ema", dest="ema", action="store_const", const=True, default=None, help="average the weights (EMA)")
    p.add_argument("--quiet", action="store_true", help="no progress bar, only the line per epoch (the bar is drawn only on a terminal or in "
                                                     "a notebook, never into a log or a pipe)")
    return p


def parse_args(argv: list[str]) -> Options:
    """Options from a command line; raises :class:`OptionsError` (one line) for anything wrong."""
    ns = build_parser().parse_args(argv)
    values = vars(ns)
    quiet = values.pop("quiet")
    opts = Options(**values, verbose=0 if quiet else 1)
    validate(opts)
    return opts


def main(argv: list[str] | None = None) -> int:
    """The command line: 0 done, 1 a data or file error, 2 a bad option, 130 interrupted (Ctrl-C; resumable).
    Every error is one ``capstone: ...`` line on stderr, never a traceback."""
    t0 = time.perf_counter()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        opts = parse_args(argv)
    except RunStateError as exc:  # the folder, not the options: its line says what to add
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except OptionsError as exc:
        print(f"{PROG}: error: {exc} (see --help)", file=sys.stderr)
        return 2
    from . import fileguard
    from .data import DataSourceError

    try:
        # A preempted VM (a Spot or preemptible one, Colab's runtimes when reclaimed) is told with SIGTERM, and killed
        # about 30 s later: stop at once, with every finished epoch already saved (BackupAndRestore writes each)
        with fileguard.stop_on_signals():
            result = train(opts, _t0=t0)
    except fileguard.Stopped as stop:
        done = _backup_epoch(os.path.join(opts.out, "backup"))
        saved = f"epochs 1–{done} are saved" if done else "no epoch had finished"
        print(f"\n{PROG}: stopped by {stop.name} (how a preempted VM is warned, about 30 s before it is killed): "
              f"{saved}; run the same command with --resume to continue", file=sys.stderr)
        return 128 + stop.signum
    except RunStateError as exc:  # the run's folder, not the options
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except OptionsError as exc:  # found only after TensorFlow started (e.g. GPU count)
        print(f"{PROG}: error: {exc} (see --help)", file=sys.stderr)
        return 2
    except DataSourceError as exc:
        print(f"{PROG}: data error: {in_cli_words(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        done = _backup_epoch(os.path.join(opts.out, "backup"))
        saved = f"epochs 1–{done} are saved" if done else "no epoch had finished"
        print(f"\n{PROG}: interrupted: {saved}; run the same command with --resume to continue", file=sys.stderr)
        return 130
    except OSError as exc:  # the disk, not the options: full, removed, or made read-only mid-run
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        print(f"{PROG}: error: {exc.strerror or exc}{where}; the finished epochs are saved: fix it and run the same "
              "command with --resume", file=sys.stderr)
        return 1
    s = result.summary
    print(f"Done: test accuracy {100 * s['test_accuracy']:.2f}% (validation {100 * s['validation_accuracy']:.2f}%) "
          f"after {s['epochs']} epochs in {s['wall_time_s']:.1f} s; summary in {os.path.join(opts.out, 'summary.json')}")
    return 0


def progress_bar_wanted(stream: Any = None) -> bool:
    """Whether a progress bar that redraws its line suits ``stream`` (default stdout): a terminal or a notebook."""
    stream = sys.stdout if stream is None else stream
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or not a file
        tty = False
    if tty:
        return True
    ipython = sys.modules.get("IPython")  # a notebook's kernel (Jupyter, Colab) draws the bar in the cell's output
    try:
        shell = ipython.get_ipython() if ipython is not None else None
    except Exception:  # noqa: BLE001 - an odd IPython: no bar
        return False
    return shell is not None and hasattr(shell, "kernel")


def in_cli_words(message: str) -> str:
    """A data error as the command line says it: ``--data synthetic``, not the notebooks' ``COURSE_DATA=synthetic``
    set before a setup cell the command line does not have."""
    from . import data as _data

    message = message.replace(_data.NO_INTERNET_FIX, (
        "Use --data npz:/path/cifar10.npz (a copy of CIFAR-10) or --data synthetic (generated CIFAR-shaped data, no "
        "download). To get CIFAR-10 for this machine: on a connected one run load_cifar10(\"tfds\", n_train=-1, "
        "n_test=-1) and write_npz(...) (see course_utils.data.write_npz), or copy its ~/tensorflow_datasets/cifar10 "
        "folder here."))
    for notebook, cli in (
            (" or COURSE_SMOKE=1 before the setup cell (restart the kernel if it already ran)", " or --data synthetic"),
            (" or COURSE_SMOKE=1 before the setup cell", " or --data synthetic"),
            (" (then restart the kernel)", ""),
            ("Fix the path in COURSE_DATA", "Fix the path in --data"),
            ("COURSE_DATA=npz:", "--data npz:"), ("COURSE_DATA=synthetic", "--data synthetic"),
            ("COURSE_DATA", "--data"), ("set --data", "use --data")):
        message = message.replace(notebook, cli)
    return message


SYNTHETIC_NOTE = ("These accuracies are on synthetic images (generated offline to be easy to learn), not CIFAR-10: "
                  "they show the trainer works, not how well it learns real images (--data tfds or npz:PATH).")


# ----------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------


def _read_json(path: str, default: Any = None) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def _readable_weights(path: str) -> bool:
    """Whether a ``.weights.h5`` file opens and every array in it reads (a kill mid-write leaves one that does not)."""
    import h5py

    if not os.path.isfile(path):
        return False
    try:
        with h5py.File(path, "r") as f:
            f.visititems(lambda _name, item: item[()] if isinstance(item, h5py.Dataset) else None)
    except Exception:  # noqa: BLE001 - any failure to read means: not a usable backup
        return False
    return True


def _readable_metadata(path: str) -> bool:
    meta = _read_json(path, None)
    return isinstance(meta, dict) and isinstance(meta.get("epoch"), int)


def repair_backup(backup: str) -> str:
    """Make ``BackupAndRestore``'s folder loadable after a kill that cut a save short; say what was done.

    Keras writes ``latest.weights.h5``, then ``training_metadata.json``, keeping the previous pair as ``.bkp``
    (``double_checkpoint=True``). Keras itself falls back to the ``.bkp`` weights only when loading raises an
    OSError and a ``.bkp`` exists: a kill during the *first* save (no ``.bkp`` yet) or during the metadata write
    crashes the resumed run. Here: a complete latest pair is kept; else a complete previous pair replaces it;
    else the backup is removed and training starts again from epoch 1. Returns "" when nothing was wrong.
    """
    weights, meta = os.path.join(backup, "latest.weights.h5"), os.path.join(backup, "training_metadata.json")
    if not os.path.isdir(backup) or (_readable_weights(weights) and _readable_metadata(meta)):
        return ""
    if _readable_weights(weights + ".bkp") and _readable_metadata(meta + ".bkp"):
        shutil.copyfile(weights + ".bkp", weights)
        shutil.copyfile(meta + ".bkp", meta)
        return ("The last backup was cut off mid-write (the run was stopped while saving it); resuming from the one "
                "before it.")
    shutil.rmtree(backup, ignore_errors=True)
    return ("The only backup was cut off mid-write (the run was stopped while saving it); training starts again "
            "from epoch 1 (the time already spent still counts).")


def peak_learning_rate(global_batch: int, lr_per_256: float = COURSE["lr_per_256"]) -> float:
    """The linear scaling rule: the peak LR grows in proportion to the global batch (per update).

    Twice the batch averages the gradient over twice the examples, halving its noise; taking twice the step
    keeps the distance travelled per epoch the same (Goyal et al. 2017). It holds while the step is small
    next to the curvature: beyond roughly 1k examples per update (and without warm-up) it breaks down,
    so the trainer warns above :data:`MAX_LR_SCALING_BATCH`. Accumulation counts: the batch here is the
    batch per *update* (micro-batch × K × replicas)."""
    return lr_per_256 * global_batch / 256


def resnet9_macs(width: int) -> int:
    """Multiply-accumulates of :func:`resnet9`'s convolutions per 32×32 image: 9·(3·1024·w + 10,240·w²) (width 8:
    6.1 M, 16: 24 M, 64: 380 M); the whitening convolution adds about 9·9·1024·w + 0.15 M (width 8: +0.8 M), left
    out: the width choice needs the growth, not the count."""
    return 9 * (3 * 1024 * width + 10_240 * width * width)


def predicted_epoch_s(epoch_s: float, width: int, at: int, fixed_share: float = AUTO_WIDTH["fixed_share"]) -> float:
    """An epoch's seconds at ``width``, from ``epoch_s`` measured at width ``at``: a ``fixed_share`` of it stays, the
    rest scales with :func:`resnet9_macs`."""
    return epoch_s * (fixed_share + (1 - fixed_share) * resnet9_macs(width) / resnet9_macs(at))


def width_model(timed: dict[int, float], fixed_share: float = AUTO_WIDTH["fixed_share"]) -> Callable[[int], float]:
    """Epoch seconds at any width, from the epochs timed at some widths (``{width: seconds}``): a timed width's own;
    with one timed width :func:`predicted_epoch_s`; with two or more the line ``a + b·resnet9_macs(width)`` through
    the narrowest and the widest of them, with ``a, b ≥ 0`` (on a GPU a wider net may take no longer: ``b = 0``; work
    growing faster than the MACs: the line through zero and the widest)."""
    timed = dict(timed)
    if len(timed) == 1:
        ((at, epoch_s),) = timed.items()
        return lambda width: timed.get(width, predicted_epoch_s(epoch_s, width, at, fixed_share))
    lo, hi = min(timed), max(timed)
    slope = max((timed[hi] - timed[lo]) / (resnet9_macs(hi) - resnet9_macs(lo)), 0.0)
    base = timed[lo] - slope * resnet9_macs(lo)
    if base < 0:
        base, slope = 0.0, timed[hi] / resnet9_macs(hi)
    return lambda width: timed.get(width, base + slope * resnet9_macs(width))


def target_epochs_for(budget_s: float | None, rule: dict = AUTO_WIDTH) -> int:
    """The epochs auto width aims at for a budget: ``rule["target_epochs"]`` up to ``rule["target_budget_s"]``, then
    growing as ``(budget / target_budget_s) ** target_growth`` (20, 28 at 120 s, 63 at 600 s, 155 at an hour)."""
    if budget_s is None:
        return rule["target_epochs"]
    return round(rule["target_epochs"] * max(1.0, budget_s / rule["target_budget_s"]) ** rule["target_growth"])


def choose_width(epoch_s: float, at: int, left_s: float, rule: dict = AUTO_WIDTH,
                 timed: dict[int, float] | None = None, budget_s: float | None = None) -> tuple[int, float, int]:
    """Auto width: ``(width, predicted epoch seconds, epochs)`` — the widest of ``rule["widths"]`` whose predicted
    epochs in ``left_s`` seconds reach the target (:func:`target_epochs_for` the whole ``budget_s``); the narrowest
    when none does. ``epoch_s`` is the epoch the warm-up measured at width ``at``; ``timed``: other widths' measured
    epochs (:func:`width_model`)."""
    widths = sorted(rule["widths"])
    predict = width_model({**(timed or {}), at: epoch_s}, rule["fixed_share"])
    target = target_epochs_for(budget_s, rule)
    best = None
    for width in widths:
        e = predict(width)
        n = BudgetPlan.epochs_in(left_s, e)
        if best is None or n >= target:
            best = (width, e, n)
    return best


def load_result(out: str) -> dict:
    """``{"summary": ..., "history": ...}`` of a finished (or interrupted) run in ``out``, read from disk."""
    return {"summary": _read_json(os.path.join(out, "summary.json")),
            "history": _read_json(os.path.join(out, "metrics.json"), [])}


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------


def whitening_kernel(x, mean, variance, size: int = 2, eps: float = 5e-4, images: int = 512):
    """A ``(size, size, 3, 3·size²)`` convolution kernel that whitens ``size``×``size`` patches of the normalized
    images ``x`` (airbench's first layer): the eigenvectors of the patches' covariance, each scaled by one over the
    square root of its eigenvalue (+ ``eps``). From the first ``images`` images (a 12×12 covariance)."""
    import numpy as np

    # normalized as the Normalization layer before it does (a constant channel: its epsilon, not a division by zero)
    std = np.maximum(np.sqrt(np.asarray(variance, np.float64)), 1e-7)
    z = (np.asarray(x[:images], np.float64) - np.asarray(mean, np.float64)) / std
    patches = np.lib.stride_tricks.sliding_window_view(z, (size, size), axis=(1, 2))  # n, h', w', c, size, size
    flat = patches.transpose(0, 1, 2, 4, 5, 3).reshape(-1, size * size * z.shape[-1])  # (row, col, channel) order
    values, vectors = np.linalg.eigh(flat.T @ flat / len(flat))
    kernel = vectors / np.sqrt(values + eps)  # columns: one filter each
    return kernel.reshape(size, size, z.shape[-1], -1).astype(np.float32)


def resnet9(width: int = COURSE["width"], num_classes: int = 10, mean=None, variance=None,
            logit_scale: float = COURSE["logit_scale"], name: str = "resnet9", whiten=None):
    """A ResNet-9-style network for 32×32 images (Page's DAWNBench net), widths ``w, 2w, 4w, 8w``.

    prep: conv-BN-ReLU(w) · layer1: conv-BN-ReLU(2w), max-pool, residual(2 × conv-BN-ReLU) ·
    layer2: conv-BN-ReLU(4w), max-pool · layer3: conv-BN-ReLU(8w), max-pool, residual · global max pool ·
    dense · ×``logit_scale``. Inputs are pixels 0-255; the first layer normalizes per channel with the
    training split's ``mean``/``variance``. ``whiten``: a :func:`whitening_kernel`, the weights of a fixed
    (untrained) convolution before prep (airbench's first layer). Outputs float32 logits under any policy.
    """
    import keras
    from keras import layers

    def cbr(x, filters):
        x = layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization(momentum=0.9)(x)
        return layers.ReLU()(x)

    def residual(x, filters):
        return layers.Add()([x, cbr(cbr(x, filters), filters)])

    w = int(width)
    inputs = keras.Input((32, 32, 3))
    if mean is not None:
        x = layers.Normalization(mean=mean, variance=variance)(inputs)
    else:
        x = layers.Rescaling(1 / 255)(inputs)
    if whiten is not None:
        white = layers.Conv2D(whiten.shape[-1], whiten.shape[0], padding="same", use_bias=False, trainable=False,
                              name="whiten")
        x = white(x)
        white.set_weights([whiten])
    x = cbr(x, w)
    x = residual(layers.MaxPooling2D()(cbr(x, 2 * w)), 2 * w)
    x = layers.MaxPooling2D()(cbr(x, 4 * w))
    x = residual(layers.MaxPooling2D()(cbr(x, 8 * w)), 8 * w)
    x = layers.GlobalMaxPooling2D()(x)
    x = layers.Dense(num_classes, use_bias=False)(x)
    x = layers.Rescaling(logit_scale, dtype="float32")(x)  # float32 logits (lesson 03)
    return keras.Model(inputs, x, name=name)


def tutorial_cnn(num_classes: int = 10, name: str = "tutorial_cnn"):
    """The TensorFlow CNN tutorial's model (tensorflow.org/tutorials/images/cnn), with /255 in the model."""
    import keras
    from keras import layers

    return keras.Sequential([
        keras.Input((32, 32, 3)),
        layers.Rescaling(1 / 255),
        layers.Conv2D(32, 3, activation="relu"),
        layers.MaxPooling2D(),
        layers.Conv2D(64, 3, activation="relu"),
        layers.MaxPooling2D(),
        layers.Conv2D(64, 3, activation="relu"),
        layers.Flatten(),
        layers.Dense(64, activation="relu"),
        layers.Dense(num_classes, dtype="float32"),
    ], name=name)


def _schedule_class():
    import keras
    import tensorflow as tf

    class BudgetSchedule(keras.optimizers.schedules.LearningRateSchedule):
        """Linear warm-up to ``peak``, then linear decay to zero at ``total_steps`` ("onecycle"), or ``peak``
        throughout ("constant"). The step counts are variables, so the plan can change after compiling."""

        def __init__(self, peak: float, kind: str = "onecycle"):
            self.kind = kind
            self.peak = tf.Variable(float(peak), trainable=False, dtype=tf.float32, name="peak_lr")
            self.warmup_steps = tf.Variable(1.0, trainable=False, dtype=tf.float32, name="warmup_steps")
            self.total_steps = tf.Variable(2.0, trainable=False, dtype=tf.float32, name="total_steps")

        def set_plan(self, warmup_steps: float, total_steps: float) -> None:
            self.total_steps.assign(max(float(total_steps), 1.0))
            self.warmup_steps.assign(min(max(float(warmup_steps), 1.0), max(float(total_steps) - 1, 1.0)))

        def __call__(self, step):
            if self.kind == "constant":
                return tf.identity(self.peak)
            step = tf.cast(step, tf.float32)
            up = self.peak * (step + 1.0) / self.warmup_steps
            down = self.peak * tf.maximum(self.total_steps - step, 0.0) / tf.maximum(
                self.total_steps - self.warmup_steps, 1.0)
            return tf.minimum(up, down)

        def value(self, step: int) -> float:
            return float(self(step))

        def get_config(self):
            return {"peak": float(self.peak.numpy()), "kind": self.kind}

    return BudgetSchedule


# ----------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Predictions:
    """Test-set predictions: ``images`` uint8 [N,32,32,3], ``labels`` and ``predicted`` int [N], ``probs`` [N,10]."""

    images: Any
    labels: Any
    predicted: Any
    probs: Any
    tta: bool

    @property
    def accuracy(self) -> float:
        return float((self.predicted == self.labels).mean()) if len(self.labels) else float("nan")


@dataclasses.dataclass
class Result:
    """What :func:`train` returns: ``summary`` (= summary.json), ``history`` (= metrics.json), ``model``."""

    summary: dict
    history: list
    model: Any
    options: Options
    _test: Any = dataclasses.field(default=None, repr=False)
    _predictions: Any = dataclasses.field(default=None, repr=False)

    def predict_test(self, tta: bool | None = None) -> Predictions:
        """The trained model's predictions on the test split (with TTA if the recipe used it, or as asked)."""
        tta = self.options.tta if tta is None else tta
        if self._predictions is not None and self._predictions.tta == tta:
            return self._predictions
        x, y = self._test
        probs = _predict_probs(self.model, x, tta, self.options.batch_size)
        return Predictions(x, y, probs.argmax(1), probs, tta)


def tta_views(x):
    """Test-time augmentation's views of images ``x`` [N,32,32,3]: each image and its mirror, each of the two also
    shifted by one pixel in the four diagonal directions (the gap filled with zeros, as the training crops pad):
    :data:`TTA_VIEWS` arrays, the unshifted image first."""
    import numpy as np

    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    h, w = x.shape[1:3]
    views = []
    for image, frame in ((x, padded), (x[:, :, ::-1], padded[:, :, ::-1])):
        views.append(image)
        views += [frame[:, 1 + dy:1 + dy + h, 1 + dx:1 + dx + w] for dy, dx in TTA_SHIFTS]
    return views


def _predict_probs(model, x, tta: bool, batch_size: int, plain=None):
    """Class probabilities; with tta, the mean over :func:`tta_views`. `plain`: the unshifted images' probabilities
    if already computed. The images are padded to whole batches: one batch shape, so one compiled predict function
    (under XLA a last, smaller batch would compile another)."""
    import numpy as np
    import tensorflow as tf

    batch = max(batch_size, 256)

    def probs_of(images):
        n = len(images)
        padded = np.concatenate([images, np.zeros((-n % batch, *images.shape[1:]), images.dtype)]) if n % batch else images
        logits = model.predict(padded, batch_size=batch, verbose=0)[:n]
        return tf.nn.softmax(tf.cast(logits, tf.float32)).numpy()

    xf = x.astype(np.float32)
    p = plain if plain is not None else probs_of(xf)
    if tta:
        p = (p + sum(probs_of(np.ascontiguousarray(view)) for view in tta_views(xf)[1:])) / TTA_VIEWS
    return p


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------


def _arrays(ds, batch: int = 4096):
    import numpy as np

    xs, ys = [], []
    for x, y in ds.batch(batch).as_numpy_iterator():
        xs.append(x)
        ys.append(y)
    if not xs:
        return np.zeros((0, 32, 32, 3), np.uint8), np.zeros(0, np.int64)
    return np.concatenate(xs).astype(np.uint8), np.concatenate(ys).astype(np.int64)


@dataclasses.dataclass
class Splits:
    """The three splits as uint8 images and int64 labels: ``train`` trains, ``validation`` (held out of the
    training images) is evaluated after every epoch and chooses the best checkpoint, ``test`` is evaluated once."""

    train: tuple
    validation: tuple
    test: tuple
    source: str


def validation_size(n_train_images: int, requested: int | None = None) -> int:
    """How many of ``n_train_images`` the validation split holds: as requested, else :data:`VALIDATION_FRACTION`
    (at least 1, at most :data:`MAX_VALIDATION`)."""
    if requested is not None:
        return int(requested)
    return max(1, min(MAX_VALIDATION, round(VALIDATION_FRACTION * n_train_images)))


def split_validation(x, y, size: int):
    """``(x_train, y_train), (x_val, y_val)``: ``size`` images held out, chosen with :data:`VALIDATION_SEED` (not the
    run's seed: runs on the same data are compared on the same validation images)."""
    import numpy as np

    order = np.random.default_rng(VALIDATION_SEED).permutation(len(x))
    held, kept = np.sort(order[:size]), np.sort(order[size:])
    return (x[kept], y[kept]), (x[held], y[held])


def _load_splits(o: Options, cfg, say) -> Splits:
    from . import data as _data

    source = o.data if o.data is not None else cfg.data
    synthetic = source == "synthetic"
    n_train = o.train_examples if o.train_examples is not None else (None if synthetic else -1)
    n_test = o.test_examples if o.test_examples is not None else (None if synthetic else -1)
    d = _data.load_cifar10(source, n_train=n_train, n_test=n_test, seed=o.seed, verbose=o.verbose >= 0)
    x, y = _arrays(d.train)
    size = validation_size(len(x), o.validation_examples)
    if size >= len(x):
        raise OptionsError(f"--validation-examples {size} leaves no training images of the {len(x)} loaded; use fewer")
    train, validation = split_validation(x, y, size)
    return Splits(train, validation, _arrays(d.test), d.source)


class _Clock:
    """Wall time of the whole run, across restarts: time before this process + time in it."""

    def __init__(self, t0: float, before: float = 0.0):
        self.t0, self.before = t0, before

    def __call__(self) -> float:
        return self.before + time.perf_counter() - self.t0


# ----------------------------------------------------------------------------------------------
# The budget plan: how many epochs, and the arithmetic that keeps a run within its budget
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class BudgetPlan:
    """How many epochs the run trains, the learning-rate schedule's length, and — with a time budget — every
    estimate and margin that chose them. Saved as ``plan.json`` (a resumed run keeps it).

    With a budget: the warm-up's step times give an epoch's time (training + validation + :attr:`EPOCH_MIN_S`) and
    the final evaluation's (the test split, :data:`TTA_VIEWS` times with TTA, each × :attr:`FINAL_EVAL_SAFETY` +
    :attr:`FINAL_EVAL_VIEW_S`, + :attr:`FINAL_EVAL_MIN_S`); the epochs are the whole ones that fit in what is left.
    After the first epoch the final evaluation's time is measured (:meth:`final_eval_from_view`), and after every
    epoch :meth:`replan` refits the rest at the epoch time measured since."""

    # Margins (seconds or epochs), each with its reason
    # The final evaluation predicts each view of the test split once, cold: per image it took 1.0-2.3× the warm-up's
    # evaluation step (median 1.5; widths 6, 8, 16 on one core, 2 cores and AVX2, dev images, 10 views)
    FINAL_EVAL_SAFETY: ClassVar[float] = 1.6
    FINAL_EVAL_MIN_S: ClassVar[float] = 0.5  # + fixed costs of predict (softmax, copying to NumPy; compiling it is
    # estimated on its own: predict_compile_estimate_s)
    FINAL_EVAL_VIEW_S: ClassVar[float] = 0.05  # + each view's own predict call (setting it up, shifting and padding)
    # After the first epoch the final evaluation's estimate is measured instead: predict is compiled (the final
    # evaluation reuses it) and a view of the test split timed twice, and once more half-way; the fastest counts
    # (:meth:`final_eval_from_view`)
    VIEW_SAFETY: ClassVar[float] = 1.25  # the final evaluation's views took 0.77-1.46× the fastest of two each
    # (median 1.0; 60, 120 and 600 s runs, 2 cores, one core, AVX2, dev images)
    VIEW_MIN_S: ClassVar[float] = 0.1  # + making the shifted views, averaging them
    EPOCH_MIN_S: ClassVar[float] = 0.3  # an epoch's costs beyond its timed steps (callbacks, saving the backup)
    # An epoch may start if it ends at most a quarter epoch past the budget: what is left of an epoch is the margin
    # for what no estimate foresees (a shared machine stalls for seconds now and then; measured: 2-core VMs, 2026).
    LATE_TOLERANCE: ClassVar[float] = 0.25
    ROUND_UP: ClassVar[float] = 0.25  # a quarter epoch over still counts as fitting ("within one epoch")
    # grow only when more than this many epochs' time would go unused (a run ends within one epoch of its budget, on
    # the early side too: lesson 06's budget claim) …
    GROW_AFTER: ClassVar[float] = 0.75  # (less than an epoch: the estimates' errors need room within it)
    GROW_FRACTION: ClassVar[float] = 0.1  # … and more than this share of the time left
    # … and shrink only when it would end more than this share of the time left late (and a quarter epoch): far from
    # the end the mean epoch jitters by a few per cent, which over 40 short epochs is more than one epoch (the
    # baseline, 0.7 s epochs on 2 cores: re-planned 79 → 77 → 74 → 72 → 77 → 76 … in one run)
    SHRINK_FRACTION: ClassVar[float] = 0.05
    NO_GROW_LAST: ClassVar[int] = 2  # never grow in the last epochs: the LR has (almost) decayed to zero
    RECENT_EPOCHS: ClassVar[int] = 5  # replan at the mean of the last few epochs (the first left out) …
    # … and of more while those took less than this: the baseline's 0.7-0.9 s epochs (2 cores) moved the mean of five
    # by ±10%, and its plan by 10 epochs each way, several times in a run
    RECENT_S: ClassVar[float] = 10.0

    options: dict
    steps_per_epoch: int
    policy: str
    width: int | None
    epochs: int
    initial_epochs: int
    warmup_steps: int
    budget_s: float | None = None
    epoch_estimate_s: float = 0.0
    final_eval_estimate_s: float = 0.0
    warm_up_epoch_s: float | None = None  # the warm-up's estimate: a vote in replan until 3 epochs are measured
    planning_elapsed_s: float | None = None
    warm_up: dict | None = None  # the warm-up's figures (train_step_s, eval_step_s, compile_s, …)
    width_trials: list | None = None  # [width, epoch_s, epochs] per width the warm-up tried
    final_view_s: float | None = None  # one view of the test split, timed after the first epoch (None: not yet)

    @staticmethod
    def warmup_for(epochs: int, steps_per_epoch: int) -> int:
        return round(COURSE["warmup_fraction"] * epochs * steps_per_epoch)

    @classmethod
    def no_time_to_time_steps(cls, budget_s: float, elapsed_s: float) -> bool:
        """After the first (compiling) step: less left than a final evaluation and two epochs at their least?
        Then the plan is one epoch, whatever the steps take."""
        return budget_s - elapsed_s < cls.FINAL_EVAL_MIN_S + 2 * cls.EPOCH_MIN_S

    @classmethod
    def estimates(cls, warm: dict, val_steps: int, test_steps: int, tta: bool) -> tuple[float, float]:
        """``(epoch_s, final_eval_s)`` from the warm-up's step times (the final evaluation's includes compiling
        predict, which the warm-up leaves to it: ``predict_compile_estimate_s``)."""
        epoch_s = warm["train_epoch_s"] + warm["eval_step_s"] * val_steps + cls.EPOCH_MIN_S
        views = TTA_VIEWS if tta else 1
        final_s = ((warm["eval_step_s"] * test_steps * cls.FINAL_EVAL_SAFETY + cls.FINAL_EVAL_VIEW_S) * views
                   + cls.FINAL_EVAL_MIN_S + warm.get("predict_compile_estimate_s", 0.0))
        return epoch_s, final_s

    @classmethod
    def final_eval_from_view(cls, view_s: float, tta: bool) -> float:
        """The final evaluation's seconds from one view of the test split timed with predict compiled: each of its
        views (:data:`TTA_VIEWS` with TTA) × :attr:`VIEW_SAFETY`, + :attr:`VIEW_MIN_S`."""
        return view_s * (TTA_VIEWS if tta else 1) * cls.VIEW_SAFETY + cls.VIEW_MIN_S

    def view_to_time(self, epochs_here: int, views_timed: int, done: int) -> str | None:
        """At the end of epoch ``done`` (the ``epochs_here``-th of this process), whether to time a view of the test
        split for the final evaluation's estimate: ``"first"`` (compile predict, time two) after this process's first
        epoch, ``"halfway"`` (one more) once half the plan is done — two timed right after compiling read 30% slow now
        and then (2 cores, 120 s: 0.33 s, the final evaluation's 0.26 s per view) — and None otherwise, without a
        budget, or when the plan ends before it could use the figure."""
        if self.budget_s is None:
            return None
        if epochs_here == 1 and done < self.epochs:
            return "first"
        if views_timed == 2 and 2 * done >= self.epochs and done < self.epochs - 1:
            return "halfway"
        return None

    @staticmethod
    def epochs_in(left_s: float, epoch_s: float) -> int:
        """Whole epochs in ``left_s`` seconds; at least one (a run always finishes an epoch)."""
        return max(1, int(left_s // epoch_s)) if epoch_s > 0 else 1

    def schedule_steps(self) -> tuple[int, int]:
        """``(warm-up steps, total steps)`` for the learning-rate schedule."""
        return self.warmup_steps, self.epochs * self.steps_per_epoch

    def fits_another(self, done: int, elapsed_s: float) -> bool:
        """Whether one more epoch (and the final evaluation) ends within the budget, up to :attr:`LATE_TOLERANCE`
        of an epoch late. The first epoch always fits."""
        if self.budget_s is None or done == 0:
            return True
        est = self.epoch_estimate_s
        return elapsed_s + est + self.final_eval_estimate_s <= self.budget_s + self.LATE_TOLERANCE * est

    def replan(self, done: int, elapsed_s: float, epoch_times: list[float], cap: int) -> tuple | None:
        """Fit the rest of the plan to the budget left at the epoch time measured in this process: the mean of the
        last :attr:`RECENT_EPOCHS`, more while they took less than :attr:`RECENT_S` together (``epoch_times``: wall
        time from one epoch's end to the next, so what happens between epochs counts too; the first epoch, which
        fills the cache and compiles the evaluation, only while it is all there is; the warm-up's estimate votes until
        3 are measured), leaving out the slowest of them (a stall is not yet a trend). The mean, not the median: what is left costs the *sum* of the epochs to come, and on a
        shared machine epochs do not scatter around one time — on a 2-core VM they alternated between 3.2 and 5.1 s
        (and now and then 10 s), and the median of three jumped from one to the other, re-planning 35 → 24 → 31 → 24
        → 30 → 25 epochs in one run and ending another 20 s early.
        Returns ``(old epochs, new epochs, seconds left, epoch seconds)`` when the plan changed, else None.

        Hysteresis: change only when the plan would end more than :attr:`LATE_TOLERANCE` of an epoch (and
        :attr:`SHRINK_FRACTION` of the time left) late, or leave
        more than :attr:`GROW_AFTER` epochs (and :attr:`GROW_FRACTION` of the time left) unused: short epochs
        jitter by ±30% on a shared machine, and re-planning for every jitter would only churn the schedule."""
        if self.budget_s is None or done >= cap or not epoch_times:
            return None
        measured = epoch_times[1:] or epoch_times
        recent = measured[-self.RECENT_EPOCHS:]
        while len(recent) < len(measured) and sum(recent) < self.RECENT_S:
            recent = measured[-len(recent) - 1:]
        if len(recent) < 3 and self.warm_up_epoch_s:
            recent = recent + [self.warm_up_epoch_s]
        recent = sorted(recent)[:-1] or recent  # the slowest left out: one stall is not yet a trend
        epoch_s = sum(recent) / len(recent)
        self.epoch_estimate_s = epoch_s
        left = self.budget_s - elapsed_s - self.final_eval_estimate_s
        fits = done + max(0, int(left / epoch_s + self.ROUND_UP))
        fits = max(done, min(fits, cap))
        slack = left - (self.epochs - done) * epoch_s
        if (-max(self.LATE_TOLERANCE * epoch_s, self.SHRINK_FRACTION * left) <= slack
                <= max(self.GROW_AFTER * epoch_s, self.GROW_FRACTION * left)):
            return None
        if fits > self.epochs and self.epochs - done < self.NO_GROW_LAST:
            return None
        if fits == self.epochs:
            return None
        old, self.epochs = self.epochs, fits
        step = done * self.steps_per_epoch
        if step < self.warmup_steps:  # still warming up: the warm-up keeps its share of the new plan
            self.warmup_steps = min(max(step, self.warmup_for(fits, self.steps_per_epoch)), fits * self.steps_per_epoch)
        return old, fits, left, epoch_s

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> "BudgetPlan":
        """The plan in ``d`` (plan.json); ValueError with the reason when it is not one this trainer wrote."""
        if not isinstance(d, dict):
            raise ValueError(f"it holds {type(d).__name__}, not a plan")
        names = {f.name for f in dataclasses.fields(cls)}
        missing = sorted(n for n in ("options", "steps_per_epoch", "epochs", "initial_epochs", "warmup_steps")
                         if n not in d)
        if missing:
            raise ValueError(f"it lacks {', '.join(missing)}")
        plan = cls(**{k: v for k, v in d.items() if k in names and k != "policy"}, policy=d.get("policy", ""))
        if not isinstance(plan.options, dict):
            raise ValueError("its options are not a mapping")
        for name in ("steps_per_epoch", "epochs", "initial_epochs"):
            value = getattr(plan, name)
            if not _is_int(value) or not 1 <= value <= MAX_SCHEDULE_STEPS:
                raise ValueError(f"{name} is {value!r}, not a whole number from 1")
        if not _is_int(plan.warmup_steps) or not 0 <= plan.warmup_steps <= plan.epochs * plan.steps_per_epoch:
            raise ValueError(f"warmup_steps is {plan.warmup_steps!r}, not within the plan's "
                             f"{plan.epochs * plan.steps_per_epoch} steps")
        for name in ("epoch_estimate_s", "final_eval_estimate_s"):
            value = getattr(plan, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ValueError(f"{name} is {value!r}, not a number of seconds")
        return plan


# ----------------------------------------------------------------------------------------------
# The output folder and what a resumed run reads from it
# ----------------------------------------------------------------------------------------------


class RunFolder:
    """The paths of a run's files in ``out``, and the only code that deletes there (the trainer's own names)."""

    def __init__(self, out: str):
        self.out = out
        self.metrics, self.summary, self.plan, self.clock, self.best = (os.path.join(out, n) for n in RUN_FILES)
        self.backup = os.path.join(out, "backup")
        self.marker = os.path.join(out, MARKER)

    def start_afresh(self) -> None:
        """Delete an earlier run's files (only the trainer's own names) and mark the folder as a capstone run's."""
        problem = out_problem(self.out)  # checked again: the folder may have changed since the options were
        if problem:
            raise OptionsError(problem)
        os.makedirs(self.out, exist_ok=True)
        for name in os.listdir(self.out):
            path = os.path.join(self.out, name)
            if name in RUN_FOLDERS and os.path.isdir(path) and not os.path.islink(path):
                for inner in os.listdir(path):
                    if _own_backup_name(inner) and os.path.isfile(os.path.join(path, inner)):
                        os.remove(os.path.join(path, inner))
                if not os.listdir(path):
                    os.rmdir(path)
            elif _own_name(name) and name != MARKER and os.path.isfile(path):
                os.remove(path)
        fileguard.write_json(self.marker, {"written_by": f"course_utils.{PROG}", "what": "a capstone run's folder: "
                                        "the trainer may delete its own files here when a new run starts"})


@dataclasses.dataclass
class ResumeState:
    """What ``--resume`` continues from, read and checked before anything changes: the plan, the finished epochs'
    records, the time already spent and the backup's epoch."""

    plan: BudgetPlan
    history: list
    spent_s: float
    backup_epoch: int


def _backup_epoch(backup: str) -> int:
    """The last epoch ``BackupAndRestore`` saved (0: none, or unreadable)."""
    meta = _read_json(os.path.join(backup, "training_metadata.json"), {})
    epoch = meta.get("epoch", 0) if isinstance(meta, dict) else 0
    return epoch if _is_int(epoch) and epoch > 0 else 0


def read_resume_state(run: RunFolder, o: Options) -> ResumeState:
    """The state ``--resume`` continues from; :class:`OptionsError` with the reason for anything the trainer did not
    write (nothing is changed, nothing discarded)."""
    where = repr(run.out)

    def fix(instead: str = "") -> str:
        return (f"nothing was changed: fix or remove it{instead}, or run with --overwrite instead of --resume to start "
                "again (that deletes the run)")

    if os.path.exists(run.summary):
        raise RunStateError(f"--resume: the run in {run.out} has finished (summary.json); nothing to resume — "
                           "use --overwrite instead of --resume to train again there, or use another --out")
    if not os.path.exists(run.plan):
        raise RunStateError(f"--resume: nothing to resume in {where}: it has no plan.json (the run stopped before it "
                           "had planned its epochs); run without --resume")
    try:
        with open(run.plan, encoding="utf-8") as f:
            plan = BudgetPlan.from_dict(json.load(f))
    except (OSError, ValueError) as exc:
        raise RunStateError(f"--resume: plan.json in {where} is not a plan this trainer wrote ({_one_line(exc)}); "
                           f"{fix()}") from None
    _check_same_run(plan.options, o)

    history: list = []
    if os.path.exists(run.metrics):
        try:
            with open(run.metrics, encoding="utf-8") as f:
                history = json.load(f)
            _check_history(history)
        except (OSError, ValueError) as exc:
            raise RunStateError(f"--resume: metrics.json in {where} is not what the trainer writes "
                               f"({_one_line(exc)}); {fix()}") from None
    spent = max([0.0] + [h["elapsed_s"] for h in history])
    if os.path.exists(run.clock):
        state = _read_json(run.clock, None)
        value = state.get("elapsed_s") if isinstance(state, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise RunStateError(f"--resume: clock.json in {where} is not what the trainer writes (elapsed_s is "
                               f"{value!r}); {fix(' (the time spent is then read from metrics.json)')}")
        spent = max(spent, float(value))

    meta_path = os.path.join(run.backup, "training_metadata.json")
    epoch = 0
    if os.path.exists(meta_path):
        meta = _read_json(meta_path, None)
        epoch = meta.get("epoch") if isinstance(meta, dict) else None
        if meta is not None and (not _is_int(epoch) or epoch < 0):
            raise RunStateError(f"--resume: the backup in {where} says epoch {epoch!r}, not a finished epoch; {fix()}")
        epoch = epoch if _is_int(epoch) else 0  # a metadata file cut off mid-write: repair_backup falls back
    if epoch > plan.epochs:
        raise RunStateError(f"--resume: the backup in {where} says epoch {epoch}, beyond the plan's {plan.epochs} "
                           f"epochs: it is not this run's backup; {fix()}")
    return ResumeState(plan, history, spent, epoch)


def _check_history(history: Any) -> None:
    if not isinstance(history, list):
        raise ValueError(f"it holds {type(history).__name__}, not a list of epochs")
    for i, row in enumerate(history, 1):
        if not isinstance(row, dict) or row.get("epoch") != i:
            raise ValueError(f"entry {i} is not epoch {i}'s record")
        elapsed = row.get("elapsed_s")
        if isinstance(elapsed, bool) or not isinstance(elapsed, (int, float)) or not 0 <= elapsed < math.inf:
            raise ValueError(f"epoch {i}'s elapsed_s is {elapsed!r}")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


def _check_same_run(stored: dict, o: Options) -> None:
    for key in ("recipe", "data", "batch_size", "width", "accumulate", "policy", "augment", "label_smoothing",
                "schedule", "ema", "whiten", "train_examples", "test_examples", "validation_examples", "time_budget",
                "epochs"):
        if key == "batch_size" and o.batch_size is None:  # the recipe's per-replica batch: checked once the
            continue  # replicas are known (train: _check_same_batch)
        if key not in stored:  # a plan from before the option existed: its model is not this trainer's
            raise OptionsError(f"--resume: {o.out} was started by an earlier version of the trainer (its plan has no "
                               f"{key!r}); nothing was changed: start it again with --overwrite, or use another --out")
        if stored.get(key) != getattr(o, key):
            flag = "--" + key.replace("_", "-")
            raise OptionsError(f"--resume: {o.out} was started with {flag} {stored.get(key)}, not {getattr(o, key)}; "
                               "resume with the same options or use another --out")


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------


def _check_same_batch(stored: dict, o: Options, why: str) -> None:
    """--resume: the global batch chosen here (the recipe's per replica × this machine's replicas) must be the one the
    run started with — its plan's steps per epoch and learning rate depend on it."""
    if stored.get("batch_size") != o.batch_size:
        raise OptionsError(f"--resume: {o.out} was started with a global batch of {stored.get('batch_size')}, and here "
                           f"it would be {o.batch_size} ({why}): resume with --batch-size {stored.get('batch_size')} "
                           "or use another --out")


def _fit_strategy(rt):
    """The strategy the trainer builds and fits under: the runtime's where it has several replicas or is a TPU; on one
    CPU or GPU device :meth:`runtime.Runtime.one_device_strategy` (TensorFlow's default strategy, same device), with
    :func:`_pipelines` built without autotuning — both are needed, each alone measured the same waits.

    Why: at every epoch's start Keras drops the iterator of the epoch before, and TensorFlow (2.20 and 2.21) destroys
    it by waiting for that iterator's tf.data autotuning thread. On one core the wait was an epoch's length: a small
    CNN on 20,000 images, ``taskset -c 0``: 5.5 s of training per epoch, 10–20 s per epoch in all; after the last
    epoch ``fit`` returned 4–15 s late, which made a budgeted run end past its budget."""
    if rt.strategy.num_replicas_in_sync == 1 and rt.kind in ("CPU", "GPU"):
        return rt.one_device_strategy()
    return rt.strategy


def _pipelines(o: Options, splits: Splits, replicas: int = 1, autotune: bool = True):
    """The trainer's pipelines (lesson 04's order, with its faster augmentation): training images uint8-cached,
    shuffled every epoch, batched with the global batch, then augmented a whole batch per call
    (:func:`data.augment_batch`: each image its own flip and crop; lesson 04 measured this order faster than
    :func:`data.augment` per image before ``batch``); validation in batches of at least 256, the last one partial.
    ``autotune=False``: tf.data's autotuning off (:func:`data.without_autotune`), so that no iterator waits for an
    autotuning thread when it is destroyed (:func:`_fit_strategy`)."""
    import tensorflow as tf

    from . import data as _data

    def one_hot(x, y):
        return x, tf.one_hot(y, 10)

    (x_train, y_train), (x_val, y_val) = splits.train, splits.validation
    train_ds = _data.build_pipeline(tf.data.Dataset.from_tensor_slices((x_train, y_train)), o.batch_size,
                                    training=True, augment_fn=None,
                                    batch_augment_fn=_data.augment_batch if o.augment else None,
                                    shuffle_buffer=len(x_train), seed=o.seed, prefetch=False)
    train_ds = train_ds.map(one_hot, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    val_ds = _data.build_pipeline(tf.data.Dataset.from_tensor_slices((x_val, y_val)), _eval_batch(o, len(x_val), replicas),
                                  training=False, drop_remainder=False, prefetch=False)
    val_ds = val_ds.map(one_hot).prefetch(tf.data.AUTOTUNE)
    if not autotune:
        train_ds, val_ds = _data.without_autotune(train_ds), _data.without_autotune(val_ds)
    return train_ds, val_ds


def _eval_batch(o: Options, n: int, replicas: int = 1) -> int:
    """The evaluation batch for ``n`` images: at least 256. Smaller splits are one batch of a multiple of the
    replicas: under a strategy Keras builds the model from the first evaluation batch averaged across replicas
    (keras/src/backend/tensorflow/trainer.py, ``_maybe_symbolic_build``: ``strategy.reduce("MEAN", batch)``), which
    fails when that batch splits unevenly (102 images on 4 replicas: 26, 26, 26, 24)."""
    batch = -(-max(o.batch_size, 256) // replicas) * replicas  # whole batches split evenly too
    if n < batch:
        batch = max(n - n % replicas, min(n, replicas))
    return batch


def _compiled_model(o: Options, recipe: Recipe, policy: str, jit_compile: bool, strategy, width: int, splits: Splits):
    """``(net, model, schedule, peak_lr)``: the recipe's network, the model fit trains (wrapped for --accumulate)
    compiled with its optimizer, loss and schedule, all under ``policy`` and in ``strategy.scope()``."""
    import keras
    import tensorflow as tf

    x_train = splits.train[0]
    mean, var = x_train.reshape(-1, 3).mean(0), x_train.reshape(-1, 3).var(0)
    previous_policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        with strategy.scope():
            net = recipe.model(width, mean, var, whiten=whitening_kernel(x_train, mean, var) if o.whiten else None)
            peak = recipe.peak_learning_rate(o.batch_size)
            schedule = _schedule_class()(peak, o.schedule)
            model = net
            # float16 on several replicas: Keras' LossScaleOptimizer decides to skip an overflowing step from the
            # first replica's gradients only (lesson 05 §6), so another replica's overflow would reach every
            # replica's weights; AccumulatingModel (even with one micro-batch) skips it on all of them
            if o.accumulate > 1 or (policy == "mixed_float16" and strategy.num_replicas_in_sync > 1):
                from . import accumulation

                model = accumulation.AccumulatingModel(net, steps=o.accumulate)
                model(tf.zeros((1, 32, 32, 3)))
            model.compile(optimizer=recipe.optimizer(schedule, o.ema),
                          loss=keras.losses.CategoricalCrossentropy(from_logits=True,
                                                                    label_smoothing=o.label_smoothing),
                          metrics=[keras.metrics.CategoricalAccuracy(name="accuracy")],
                          steps_per_execution=o.steps_per_execution, jit_compile=jit_compile)
            model.optimizer.build(model.trainable_variables)
    finally:
        keras.config.set_dtype_policy(previous_policy)
    return net, model, schedule, peak


def train(options: Options, *, _t0: float | None = None) -> Result:
    """Train one recipe (see :class:`Options`) and return a :class:`Result`. Writes ``options.out``.

    Raises :class:`OptionsError` for a bad option (or an output folder / resume state to refuse) and
    :class:`course_utils.data.DataSourceError` when the data cannot be loaded (never a silent switch to synthetic
    data). Nothing in ``out`` changes before the options, the resume state and the data have been checked."""
    t0 = time.perf_counter() if _t0 is None else _t0
    validate(options)
    o = options.resolved()
    recipe = RECIPES[o.recipe]
    say = print if o.verbose >= 0 else (lambda *a, **k: None)
    run = RunFolder(o.out)
    state = read_resume_state(run, o) if o.resume else None
    clock = _Clock(t0, state.spent_s if state else 0.0)

    from . import config as _config
    from . import memory as _memory
    from . import runtime as _runtime

    # The hardware first: splitting the CPU into replicas must happen before TensorFlow starts (loading data starts
    # it). Then the data: a source that cannot deliver fails before anything is built or deleted.
    rt = _runtime.detect(cpu_replicas=o.cpu_replicas)
    cfg = _config.get()
    splits = _load_splits(o, cfg, say)

    import keras
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    strategy, replicas = _fit_strategy(rt), rt.strategy.num_replicas_in_sync
    # The global batch: --batch-size, or the recipe's (course: 128 per replica × the replicas found here)
    o.batch_size, batch_why = recipe.global_batch(options.batch_size, replicas, o.accumulate,
                                                  len(splits.train[0]))
    if state is not None:
        _check_same_batch(state.plan.options, o, batch_why)
    if o.batch_size % (replicas * o.accumulate):
        raise OptionsError(f"--batch-size {o.batch_size} is not divisible by replicas × accumulate = "
                           f"{replicas} × {o.accumulate} on this {rt.kind}; use a multiple of {replicas * o.accumulate}")
    if o.steps_per_execution is not None and o.steps_per_execution > 1 and rt.strategy_name == "MirroredStrategy":
        raise OptionsError(
            f"--steps-per-execution {o.steps_per_execution} fails under MirroredStrategy ({replicas} replicas) in "
            f"Keras {keras.__version__} (keras-team/keras#19246: 'You must feed a value for placeholder tensor'); "
            "use --steps-per-execution 1 here (it pays on TPUs, which use TPUStrategy)")
    if len(splits.validation[0]) % replicas:
        # every evaluation batch must split evenly over the replicas (a replica left with no image fails in the
        # model, and Keras' first-batch build averages the replicas' images: _eval_batch): leave out the last
        # few (fewer than the replicas) validation images
        keep = len(splits.validation[0]) - len(splits.validation[0]) % replicas
        splits = dataclasses.replace(splits, validation=tuple(a[:keep] for a in splits.validation))
    (x_train, _), (x_val, _), (x_test, y_test) = splits.train, splits.validation, splits.test
    steps_per_epoch = len(x_train) // o.batch_size
    if steps_per_epoch < 1:
        raise OptionsError(f"--batch-size {o.batch_size} is larger than the {len(x_train)} training images")
    if o.epochs is not None and o.epochs * steps_per_epoch > MAX_SCHEDULE_STEPS:
        raise OptionsError(f"--epochs {o.epochs} × {steps_per_epoch} steps is beyond the {MAX_SCHEDULE_STEPS:,} steps "
                           "the float32 schedule counts exactly; use fewer epochs")
    policy, policy_why = (o.policy, "chosen with --policy") if o.policy != "auto" else recipe.choose_policy(rt)
    jit_compile, xla, jit_why = choose_jit(o, rt.kind, cfg.jit, replicas)
    o.steps_per_execution, spe_why = choose_steps_per_execution(o.steps_per_execution, rt.kind, replicas,
                                                                steps_per_epoch)
    peak_lr = recipe.peak_learning_rate(o.batch_size)
    lr_why = recipe.learning_rate_rule()
    if state is None:
        run.start_afresh()  # only now: every input has been checked
    keras.utils.set_random_seed(o.seed)
    runtime_line = rt.summary().splitlines()[0]
    if strategy is not rt.strategy:  # the runtime line names the runtime's strategy: say which one fit runs under
        runtime_line += ("; the trainer fits under TensorFlow's default strategy on this one device (lesson 06 §2: no "
                         "wait for the last epoch's iterator)")
    say(runtime_line)
    micro = o.batch_size // replicas // o.accumulate
    say(f"Recipe {o.recipe}: policy {policy} ({policy_why}); XLA {'on' if xla else 'off'} ({jit_why})")
    say(f"Global batch {o.batch_size} ({batch_why}; each replica {micro} × {o.accumulate} accumulated); peak learning "
        f"rate {peak_lr:.4g} ({lr_why}); {steps_per_epoch} steps/epoch; steps_per_execution {o.steps_per_execution} "
        f"({spe_why}); {len(x_train)} training, {len(x_val)} validation, {len(x_test)} test images")
    train_ds, val_ds = _pipelines(o, splits, replicas, autotune=strategy is rt.strategy)
    val_batch = _eval_batch(o, len(x_val), replicas)
    val_sizes = [min(val_batch, len(x_val) - i) for i in range(0, len(x_val), val_batch)]  # the last may be partial
    val_steps, test_steps = len(val_sizes), math.ceil(len(x_test) / _eval_batch(o, len(x_test), replicas))

    def build(width: int):
        return _compiled_model(o, recipe, policy, jit_compile, strategy, width, splits)

    # Width: --width, else the course default capped by the config's model width (smoke sizes: 8); with a time
    # budget, auto width: the warm-up times AUTO_WIDTH's start width and the plan chooses (_new_plan).
    auto_width = recipe.sized_by_width and o.width is None and o.time_budget is not None
    start = AUTO_WIDTH["start"] if auto_width else COURSE["width"]
    width = state.plan.width if state else (o.width or min(start, cfg.sizes.model_width))
    net, model, schedule, peak = build(width)
    if o.batch_size > MAX_LR_SCALING_BATCH and recipe.sized_by_width:
        say(f"Note: global batch {o.batch_size} > {MAX_LR_SCALING_BATCH}: the linear LR rule gets unreliable here")

    # Reset the allocator's peak so the figure is this run's (CPU with the BFC allocator, GPU, TPU).
    mem_device = _memory.default_device()
    try:
        tf.config.experimental.reset_memory_stats(mem_device)
        allocator_stats = True
    except Exception:  # noqa: BLE001 - this allocator keeps no statistics
        allocator_stats = False

    if state is None:
        plan, (net, model, schedule, peak) = _new_plan(
            o, steps_per_epoch, policy, width, clock, say, (train_ds, val_ds), val_sizes, test_steps, auto_width,
            build, (net, model, schedule, peak))
        width = plan.width
        fileguard.write_json(run.plan, plan.to_dict())
    else:
        plan = state.plan
    schedule.set_plan(*plan.schedule_steps())

    # Resume: BackupAndRestore reloads weights + optimizer state; metrics.json continues after that epoch.
    done, history = 0, []
    if state is not None:
        repaired = repair_backup(run.backup)
        if repaired:
            say(repaired)
        done = _backup_epoch(run.backup)
        _check_backup_fits(run, model)
        history = [h for h in state.history if h["epoch"] <= done]
        if done > len(history):
            say(f"metrics.json lists {len(history)} of the {done} epochs in the backup: the records of the others "
                "were lost with the kill (their training was not)")
        say(f"Resuming after epoch {done} of {plan.epochs}; {clock():.1f} s already spent"
            + (f" of the {o.time_budget:g} s budget" if o.time_budget else ""))
    fileguard.write_json(run.metrics, history)

    def time_view(compile: bool) -> list[float]:
        """Seconds of a view of the test split as the final evaluation predicts it. ``compile``: first compile
        predict on one (padded) batch, the final evaluation's shape, so that it reuses it, and time two views (one
        view's time doubled now and then: 2 cores, 0.34 s where others took 0.18)."""
        if compile:
            _predict_probs(net, x_test[:1], False, o.batch_size)
        times = []
        for _ in range(2 if compile else 1):
            started = time.perf_counter()
            _predict_probs(net, x_test, False, o.batch_size)
            times.append(time.perf_counter() - started)
        return times

    progress = _Progress(o, plan, run, clock, history, schedule, steps_per_epoch, say, time_view)
    # The progress callback comes after every callback that saves: an epoch's time includes its checkpoint and
    # backup, and metrics.json lists an epoch only once the backup holds it (a kill in between resumes after it).
    callbacks = [keras.callbacks.ModelCheckpoint(run.best, monitor="val_accuracy", save_best_only=True,
                                                 save_weights_only=True),
                 keras.callbacks.BackupAndRestore(run.backup, double_checkpoint=True)]
    if o.tensorboard:
        calls = math.ceil(steps_per_epoch / o.steps_per_execution)  # the callback counts calls, not steps
        first = min(3, calls)
        callbacks.append(keras.callbacks.TensorBoard(
            o.tensorboard, profile_batch=(first, min(first + 4, calls)), write_graph=False))
    callbacks.append(progress)
    if o.ema:
        # Evaluate with the averaged weights (swapped in for each evaluation and back), train and back up the raw
        # ones (+ the averages, which are optimizer variables); fit's end assigns the averages to the model.
        # (swap_on_epoch=True would leave the averages in the model across a kill/--resume, and with fit's
        # epoch cap above the plan its last-epoch fix-up would not run.)
        callbacks.insert(0, keras.callbacks.SwapEMAWeights(swap_on_epoch=False))
    # Keras' progress bar redraws its line with \r and \b (it assumes a terminal wherever "posix" is imported): in a
    # log file or a pipe that is noise, so there only the line per epoch is written
    bar = progress.bar = o.verbose >= 1 and progress_bar_wanted()
    if bar:
        callbacks.append(_plan_progbar(plan))

    if done < plan.epochs and plan.fits_another(done, clock()):
        # With a budget the plan may still grow (the warm-up over-estimated) or shrink (the machine got
        # slower): fit may run up to `cap` epochs and the progress callback stops it at the plan.
        cap = plan.epochs if o.time_budget is None else max(2 * plan.epochs, plan.epochs + 5)
        model.fit(train_ds, epochs=cap, validation_data=val_ds, callbacks=callbacks,
                  verbose=1 if bar else 0)
    else:  # nothing left to train: load the last backup
        if os.path.exists(os.path.join(run.backup, "latest.weights.h5")):
            model.load_weights(os.path.join(run.backup, "latest.weights.h5"))
        shutil.rmtree(run.backup, ignore_errors=True)

    # The test split, once, with the last epoch's weights (counted in the wall time): plain and with TTA.
    t_final = time.perf_counter()
    probs_plain = _predict_probs(net, x_test, False, o.batch_size)
    probs = _predict_probs(net, x_test, True, o.batch_size, plain=probs_plain) if o.tta else probs_plain
    acc_plain = float((probs_plain.argmax(1) == y_test).mean())
    acc = float((probs.argmax(1) == y_test).mean())
    final_eval_s = time.perf_counter() - t_final
    wall = clock()
    trained_s = wall - final_eval_s  # the clock when training (and fit's teardown) had ended
    peak_bytes, peak_method = _peak_memory(mem_device if allocator_stats else None)

    history = progress.history
    # Throughput: the median epoch's, leaving out the first (it traces, compiles and fills the cache).
    steady = [h["images_per_s"] for h in (history[1:] if len(history) > 1 else history) if h["images_per_s"]]
    ips = statistics.median(steady) if steady else None  # of two epochs their mean, not the faster one
    best = max(history, key=lambda h: h["val_accuracy"], default=None)
    summary = {
        "recipe": o.recipe,
        "test_accuracy": acc,
        "test_accuracy_no_tta": acc_plain,
        "tta": o.tta,
        "validation_accuracy": history[-1]["val_accuracy"] if history else None,
        "best_validation_epoch": best["epoch"] if best else None,
        "best_validation_accuracy": best["val_accuracy"] if best else None,
        "epochs": len(history),
        "planned_epochs": plan.epochs,
        "initially_planned_epochs": plan.initial_epochs,
        "wall_time_s": wall,
        "budget_s": o.time_budget,
        "budget_used_s": wall if o.time_budget else None,
        "budget_used_fraction": wall / o.time_budget if o.time_budget else None,
        "time_before_first_epoch_s": history[0]["elapsed_s"] - history[0]["epoch_time_s"] if history else None,
        "trained_s": trained_s,
        "final_eval_s": final_eval_s,
        "resumed": bool(o.resume and done > 0),
        "resumed_after_epoch": done if o.resume else None,  # the backup's last epoch: 0 = it started over
        "images_per_s": ips,
        "images_per_s_per_replica": ips / replicas if ips else None,
        "replicas": replicas,
        "global_batch": o.batch_size,
        "per_replica_batch": o.batch_size // replicas,
        "micro_batch_per_replica": o.batch_size // replicas // o.accumulate,
        "global_batch_why": batch_why,
        "steps_per_epoch": steps_per_epoch,
        "steps_per_execution": o.steps_per_execution,
        "steps_per_execution_why": spe_why,
        "peak_learning_rate": peak,
        "peak_learning_rate_why": lr_why,
        "policy": policy,
        "policy_why": policy_why,
        "jit_compile": jit_compile,
        "xla": xla,
        "xla_why": jit_why,
        "xla_chosen_by": "option" if o.jit is not None else ("COURSE_JIT" if cfg.jit and rt.kind != "TPU" else "trainer"),
        "width": width if recipe.sized_by_width else None,
        "width_trials": plan.width_trials,
        "parameters": int(net.count_params()),
        "peak_memory_bytes": peak_bytes,
        "peak_memory_method": peak_method,
        "data": splits.source,
        "train_examples": len(x_train),
        "validation_examples": len(x_val),
        "test_examples": len(x_test),
        "options": dataclasses.asdict(o),
        "hardware": dict(rt.as_dict(), cpu_count=os.cpu_count()),
        "tf_version": tf.__version__,
        "keras_version": keras.__version__,
        "python_version": sys.version.split()[0],
    }
    fileguard.write_json(run.summary, summary)
    fileguard.write_json(run.clock, {"elapsed_s": wall, "finished": True})
    say(f"Final test accuracy {100 * acc:.2f}%" + (f" with TTA ({100 * acc_plain:.2f}% without)" if o.tta else "")
        + f" (validation {100 * summary['validation_accuracy']:.2f}% after the last epoch)" * bool(history)
        + f"; {wall:.1f} s wall" + (f" of the {o.time_budget:g} s budget" if o.time_budget else "")
        + (f"\n{SYNTHETIC_NOTE}" if splits.source == "synthetic" else ""))
    if o.time_budget and wall > 1.1 * o.time_budget:
        say(f"Over the budget by {wall - o.time_budget:.1f} s ({wall / o.time_budget:.2f}×): planning took "
            f"{plan.planning_elapsed_s or 0:.1f} s, training {max(0.0, trained_s - (plan.planning_elapsed_s or 0)):.1f} s,"
            f" the test evaluation {final_eval_s:.1f} s")
    preds = Predictions(x_test, y_test, probs.argmax(1), probs, o.tta)
    return Result(summary, history, net, o, (x_test, y_test), preds)


def _peak_memory(device: str | None) -> tuple[int, str]:
    """``(bytes, method)``: the allocator's peak on ``device`` since its reset, or where it keeps no statistics
    (``device`` None, or a failed reading) the process's peak RSS — with the method that measured it."""
    import tensorflow as tf

    from . import memory as _memory

    if device is not None:
        try:
            peak = int(tf.config.experimental.get_memory_info(device)["peak"])
            if peak:
                return peak, f"{_memory.MEMORY_INFO}({device!r})['peak'] over this process's training"
        except Exception:  # noqa: BLE001 - no statistics after all
            pass
    return _memory.maxrss_bytes(), "process peak RSS (resource.getrusage ru_maxrss; whole process)"


def _new_plan(o: Options, steps_per_epoch: int, policy: str, width: int, clock: _Clock, say, datasets: tuple,
              val_sizes: list[int], test_steps: int, auto_width: bool, build: Callable, built: tuple
              ) -> tuple[BudgetPlan, tuple]:
    """A new run's plan and the model to train: ``--epochs``, or with a budget the epochs the warm-up says fit (auto
    width: the widths it tried, and the model of the one chosen)."""
    plan = BudgetPlan(options=dataclasses.asdict(o), steps_per_epoch=steps_per_epoch, policy=policy, width=width,
                      epochs=o.epochs or 1, initial_epochs=o.epochs or 1, warmup_steps=0, budget_s=o.time_budget)
    if o.time_budget is not None:
        budget = o.time_budget
        val_steps = len(val_sizes)
        warm_started = clock()

        def warm_up(model):
            return _warm_up(model, *datasets, o.steps_per_execution, steps_per_epoch, val_steps,
                            one_epoch_only=lambda: BudgetPlan.no_time_to_time_steps(budget, clock()),
                            eval_sizes=val_sizes)

        warm = warm_up(built[1])
        warm_took, warms = clock() - warm_started, {width: warm}
        if warm["train_step_s"] is None:  # compiling used the budget: nothing to measure, no width to choose
            epoch_s, final_s, epochs = 0.0, BudgetPlan.FINAL_EVAL_MIN_S, 1
            tried = [[width, None, epochs]]
        else:
            epoch_s, final_s = BudgetPlan.estimates(warm, val_steps, test_steps, o.tta)
            epochs = BudgetPlan.epochs_in(budget - clock() - final_s, epoch_s)
            tried = [[width, round(epoch_s, 2), epochs]]
            if auto_width and clock() > PLANNING_SHARE * budget:  # (a fixed network has no width to choose)
                say(f"Budget {budget:g} s is short for this machine: compiling and timing the first steps took "
                    f"{clock():.1f} s ({clock() / budget:.0%} of it) → no other width is tried")
            elif auto_width:
                timed, models = {width: epoch_s}, {width: built}
                while True:
                    # another width compiles again (about as long as this one did)
                    left = budget - clock() - final_s - warm["compile_s"]
                    new_width, new_epoch_s, new_epochs = choose_width(epoch_s, width, left, AUTO_WIDTH, timed=timed,
                                                                      budget_s=budget)
                    if new_width in timed:  # the current width (or one timed before, compiled already)
                        if new_width != width:
                            say(f"Budget {budget:g} s: back to width {new_width} (timed ~{new_epoch_s:.1f} s/epoch)")
                            built, width, warm = models[new_width], new_width, warms[new_width]
                            epoch_s, final_s = BudgetPlan.estimates(warm, val_steps, test_steps, o.tta)
                            epochs = BudgetPlan.epochs_in(budget - clock() - final_s, epoch_s)
                            tried.append([width, round(epoch_s, 2), epochs])
                        break
                    scale = new_epoch_s / epoch_s
                    how = (f"predicted ~{new_epoch_s:.1f} s/epoch" if len(timed) == 1 else
                           f"~{new_epoch_s:.1f} s/epoch on the line through widths {min(timed)} and {max(timed)}")
                    why = (f"Budget {budget:g} s: ~{epoch_s:.1f} s/epoch at width {width} → width {new_width} "
                           f"({how}, {new_epochs} epochs: the widest that trains "
                           f"{target_epochs_for(budget, AUTO_WIDTH)}; lesson 06 §2)")
                    built = models[new_width] = build(new_width)
                    timing = (warm_took - warm["compile_s"]) * scale  # the timed steps, at the new width
                    # a quarter more than the last width's compile and steps: estimated from another width, it ran
                    # over (one core, 60 s: width 6 timed after width 8, the first epoch started at 6.0–6.05 s)
                    if clock() + PLANNING_MARGIN * (warm["compile_s"] + timing) <= PLANNING_SHARE * budget:
                        say(why + "; timing it too")
                        warm_started = clock()
                        warm = warms[new_width] = warm_up(built[1])
                        warm_took = clock() - warm_started
                        epoch_s, final_s = BudgetPlan.estimates(warm, val_steps, test_steps, o.tta)
                        epochs = BudgetPlan.epochs_in(budget - clock() - final_s, epoch_s)
                        tried.append([new_width, round(epoch_s, 2), epochs])
                        width, timed[new_width] = new_width, epoch_s
                        off = epoch_s / new_epoch_s
                        if len(timed) < 3 and max(off, 1 / off) > RECHOOSE_OFF_BY:
                            say(f"Budget {budget:g} s: width {width} measured ~{epoch_s:.1f} s/epoch, not the "
                                f"~{new_epoch_s:.1f} s predicted → choosing again from the two widths timed")
                            continue
                    else:
                        # not timed: its first epoch compiles training and evaluation (the start width's times)
                        say(why + "; not timed (planning stays within "
                            f"{PLANNING_SHARE:.0%} of the budget): the plan is corrected after each epoch")
                        warm = dict(warm, predicted_from_width=width, train_step_s=warm["train_step_s"] * scale,
                                    eval_step_s=warm["eval_step_s"] * scale,
                                    train_epoch_s=warm["train_epoch_s"] * scale,
                                    eval_epoch_s=warm["eval_epoch_s"] * scale)
                        epoch_s, final_s = BudgetPlan.estimates(warm, val_steps, test_steps, o.tta)
                        epochs = BudgetPlan.epochs_in(budget - clock() - final_s - warm["compile_s"], epoch_s)
                        tried.append([new_width, round(epoch_s, 2), epochs])
                        width = new_width
                    break
        plan.width, plan.width_trials, plan.warm_up = width, tried, warm
        plan.epoch_estimate_s, plan.final_eval_estimate_s, plan.planning_elapsed_s = epoch_s, final_s, clock()
        plan.warm_up_epoch_s = epoch_s or None
        plan.epochs = plan.initial_epochs = epochs
        if warm["train_step_s"] is None:
            say(f"Budget {budget:g} s: the first step compiled in {warm['compile_s']:.1f} s; "
                f"{clock():.1f} s used so far → 1 epoch (no time left to time steps)")
        else:
            measured = "predicted" if "predicted_from_width" in warm else "warm-up measured"
            say(f"Budget {budget:g} s: {measured} {warm['train_step_s'] * 1e3:.1f} ms/step "
                f"(compile excluded: {warm['compile_s']:.1f} s, counted), ~{epoch_s:.1f} s/epoch with validation; "
                f"{clock():.1f} s used so far → {epochs} epoch{'s' if epochs != 1 else ''}")
    plan.warmup_steps = BudgetPlan.warmup_for(plan.epochs, steps_per_epoch)
    return plan, built


def _check_backup_fits(run: RunFolder, model) -> None:
    """A backup another run wrote (another recipe or width) fails inside fit with a shape error: refuse it first."""
    weights = os.path.join(run.backup, "latest.weights.h5")
    if not os.path.exists(weights):
        return
    import warnings

    snapshot = [v.numpy() for v in model.variables]
    try:
        with warnings.catch_warnings():  # Keras warns per layer before it raises
            warnings.simplefilter("ignore")
            model.load_weights(weights)
    except Exception:  # noqa: BLE001 - any failure to load means: not this run's backup
        raise RunStateError(f"--resume: the backup in {run.out!r} does not fit this run's model (its weights have "
                            "other shapes): it is another run's; nothing was changed: resume with that run's options, "
                            "or use another --out") from None
    for v, value in zip(model.variables, snapshot):  # BackupAndRestore loads it again, with the optimizer state
        v.assign(value)


def _warm_up(model, train_ds, test_ds, spe: int, steps_per_epoch: int, test_steps: int,
             one_epoch_only: Callable[[], bool] = lambda: False, eval_sizes: list[int] | None = None) -> dict:
    """Time a few real steps (:data:`WARM_UP_STEPS`, and :data:`WARM_UP_MIN_S` at least, up to an epoch; the first
    call, which traces and compiles, is timed separately), then put the weights and optimizer state back as they were. If ``one_epoch_only()`` says so after the first call (the
    budget is spent), stop there: only ``compile_s`` is measured, every other figure is None.
    ``eval_sizes``: the images in each of ``test_ds``'s batches. ``eval_step_s`` is a whole (the first) batch's time,
    from the time per image of the batches timed: a last, partial batch is quicker (on the dev images the 151 images
    after 256 made a step look 40% shorter).
    Predict is not compiled here (it ran 0.35 s of a 60 s budget's planning on one core, and only the final
    evaluation uses it): ``predict_compile_estimate_s``, the evaluation's first call less a compiled step (the same
    forward pass, traced and compiled), is reserved for it in the final evaluation's estimate."""
    import keras

    class Times(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.train, self.test = [], []
            self.stopped = False

        def on_train_batch_end(self, batch, logs=None):
            self.train.append((batch, time.perf_counter()))
            if len(self.train) == 1 and one_epoch_only():
                self.model.stop_training = self.stopped = True
            elif len(self.train) >= calls and self.train[-1][1] - self.train[0][1] >= WARM_UP_MIN_S:
                self.model.stop_training = True

        def on_test_batch_end(self, batch, logs=None):
            self.test.append((batch, time.perf_counter()))

    snapshot = [v.numpy() for v in model.variables] + [v.numpy() for v in model.optimizer.variables]
    calls = max(4, math.ceil(min(WARM_UP_STEPS, steps_per_epoch) / spe)) + 1
    most = max(calls, math.ceil(steps_per_epoch / spe) + 1)  # timing WARM_UP_MIN_S: at most an epoch's calls
    t = Times()
    start = time.perf_counter()
    model.fit(train_ds.repeat().take(most * spe), epochs=1, verbose=0, callbacks=[t])
    first_train = t.train[0][1] - start

    def restore():
        for v, value in zip(list(model.variables) + list(model.optimizer.variables), snapshot):
            v.assign(value)

    if t.stopped:
        restore()
        return {"train_step_s": None, "eval_step_s": None, "compile_s": first_train,
                "train_epoch_s": None, "eval_epoch_s": None}
    train_step = (t.train[-1][1] - t.train[0][1]) / (t.train[-1][0] - t.train[0][0])
    eval_calls = min(test_steps, 3)
    start = time.perf_counter()
    model.evaluate(test_ds.take(eval_calls), verbose=0, callbacks=[t])
    first_eval = t.test[0][1] - start
    if len(t.test) > 1:
        eval_step = _whole_batch_s(t.test, eval_sizes)
    else:  # one test batch: its first call traced and compiled; time a compiled one (fit's evaluations reuse it)
        start = time.perf_counter()
        model.evaluate(test_ds.take(1), verbose=0)
        eval_step = time.perf_counter() - start
    restore()
    return {"train_step_s": train_step, "eval_step_s": eval_step, "compile_s": first_train + first_eval,
            "timed_steps": t.train[-1][0] - t.train[0][0],
            "predict_compile_estimate_s": max(first_eval - eval_step, 0.0),
            "train_epoch_s": train_step * steps_per_epoch, "eval_epoch_s": eval_step * test_steps}


def _whole_batch_s(ends: list[tuple[int, float]], sizes: list[int] | None) -> float:
    """A whole (the first) batch's seconds from ``ends``, ``(last step index, time)`` at the end of each call: the
    time after the first call, per image of the batches it ran (``sizes``: each batch's images; None: all alike)."""
    (first, t_first), (last, t_last) = ends[0], ends[-1]
    sizes = list(sizes) if sizes else [1] * (last + 1)
    images = sum(sizes[first + 1:last + 1]) or (last - first) * sizes[0]
    return (t_last - t_first) / max(images, 1) * sizes[0]


def _plan_progbar(plan: BudgetPlan):
    """Keras' progress bar, showing the current plan's epoch count ("Epoch 3/17") rather than fit's cap."""
    import keras

    class PlanProgbar(keras.callbacks.ProgbarLogger):
        def on_epoch_begin(self, epoch, logs=None):
            self.epochs = plan.epochs
            super().on_epoch_begin(epoch, logs)

    return PlanProgbar()


class _Progress:  # replaced by a keras Callback subclass at construction (keras imported lazily)
    def __new__(cls, *args, **kwargs):
        import keras

        class Progress(keras.callbacks.Callback):
            """One line per epoch, metrics.json after every epoch, clock.json every few seconds, the plan refitted to
            the budget after every epoch (:meth:`BudgetPlan.replan`)."""

            def __init__(self, o: Options, plan: BudgetPlan, run: RunFolder, clock, history, schedule,
                         steps_per_epoch: int, say, time_view: Callable[..., list[float]] | None = None):
                super().__init__()
                self.o, self.plan, self.run, self.clock, self.history = o, plan, run, clock, list(history)
                self.schedule, self.steps_per_epoch, self.say = schedule, steps_per_epoch, say
                self.time_view, self.view_times = time_view, []
                self.last_tick = 0.0
                self.pending: list[str] = []
                self.epoch_times: list[float] = []

            def _flush(self):
                for line in self.pending:
                    self.say(line, flush=True)
                self.pending = []

            def on_train_end(self, logs=None):
                self._flush()

            def on_epoch_begin(self, epoch, logs=None):
                self._flush()
                self.t_epoch = time.perf_counter()
                self.t_test = None

            def on_test_begin(self, logs=None):
                self.t_test = time.perf_counter()

            def on_train_batch_end(self, batch, logs=None):
                now = time.perf_counter()
                if now - self.last_tick > 2.0:
                    self.last_tick = now
                    fileguard.write_json(self.run.clock, {"elapsed_s": self.clock()})

            def on_epoch_end(self, epoch, logs=None):
                logs = logs or {}
                view_line = None
                due = (self.plan.view_to_time(len(self.epoch_times) + 1, len(self.view_times), epoch + 1)
                       if self.time_view is not None else None)
                if due:
                    # measure the final evaluation rather than estimate it; counted in this epoch's time (the first
                    # compiles anyway; the plan leaves out the first epoch once others are measured, and the slowest)
                    self.view_times += self.time_view(compile=due == "first")
                    before = self.plan.final_eval_estimate_s
                    view_s = self.plan.final_view_s = min(self.view_times)
                    self.plan.final_eval_estimate_s = BudgetPlan.final_eval_from_view(view_s, self.o.tta)
                    view_line = (f"  (final evaluation: a view of the test split took {view_s:.2f} s "
                                 f"(the fastest of {len(self.view_times)}) → {self.plan.final_eval_estimate_s:.1f} s "
                                 f"kept for it, was {before:.1f} s)")
                now = time.perf_counter()
                train_s = (self.t_test or now) - self.t_epoch
                images = self.steps_per_epoch * self.o.batch_size
                step = int(self.model.optimizer.iterations.numpy())
                entry = {
                    "epoch": epoch + 1,
                    "elapsed_s": self.clock(),
                    "epoch_time_s": now - self.t_epoch,
                    "train_time_s": train_s,
                    "images": images,
                    "train_loss": float(logs.get("loss", float("nan"))),
                    "train_accuracy": float(logs.get("accuracy", float("nan"))),
                    "val_loss": float(logs.get("val_loss", float("nan"))),
                    "val_accuracy": float(logs.get("val_accuracy", float("nan"))),
                    "images_per_s": images / train_s if train_s > 0 else None,
                    "lr": self.schedule.value(max(step - 1, 0)),
                    "planned_epochs": self.plan.epochs,
                }
                # For the plan: wall time since the previous epoch's end in this process (what happens between
                # epochs costs budget too); an epoch's own time for the first one here.
                previous = self.history[-1]["elapsed_s"] if self.epoch_times else None
                self.history.append(entry)
                self.epoch_times.append(entry["elapsed_s"] - previous if previous is not None
                                        else entry["epoch_time_s"])
                fileguard.write_json(self.run.metrics, self.history)
                fileguard.write_json(self.run.clock, {"elapsed_s": entry["elapsed_s"]})
                # Printed at the next epoch's start / the end: Keras' progress bar finishes its line after us.
                self.pending.append(
                    f"epoch {epoch + 1}/{self.plan.epochs} · {entry['elapsed_s']:.1f} s · train loss "
                    f"{entry['train_loss']:.4f} · val acc {100 * entry['val_accuracy']:.2f}% · "
                    f"{entry['images_per_s']:.0f} images/s")
                if view_line:
                    self.pending.append(view_line)
                if self.o.verbose < 1 or not getattr(self, "bar", False):  # no bar to finish its line first
                    self._flush()
                cap = self.params.get("epochs") or self.plan.epochs
                changed = self.plan.replan(epoch + 1, self.clock(), self.epoch_times, cap)
                if changed:
                    old, new, left, epoch_s = changed
                    self.schedule.set_plan(*self.plan.schedule_steps())
                    fileguard.write_json(self.run.plan, self.plan.to_dict())
                    decay = "; the LR decay now ends there" if self.o.schedule == "onecycle" else ""
                    self.pending.append(f"  (budget: {left:.0f} s left at {epoch_s:.1f} s/epoch: plan {old} -> "
                                        f"{new} epochs{decay})")
                if epoch + 1 >= self.plan.epochs:
                    self.model.stop_training = True

        return Progress(*args, **kwargs)


if __name__ == "__main__":
    _code = main()
    if _code >= 128:  # interrupted mid-step: the backup is written; TensorFlow's threads may still be running, and
        sys.stdout.flush()  # its teardown at exit then can abort the process (seen once under load: "free():
        sys.stderr.flush()  # invalid next size", exit -6 instead of 130), so end without it
        os._exit(_code)
    sys.exit(_code)
