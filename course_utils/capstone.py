"""Lesson 06: the CIFAR-10 capstone — a headless trainer that gets the best accuracy a time budget allows.

Command line (the notebook calls the same code through :func:`train`)::

    python -m course_utils.capstone --data npz:cifar10.npz --recipe course --time-budget 120 --out runs/c120

Two recipes:

``course``    everything lessons 01-05 teach, plus the field's fast-CIFAR tricks (David Page's ResNet-9 /
              DAWNBench; airbench): a ResNet-9-style network for 32×32 images, the hardware's precision
              policy, lesson 04's pipeline with random crop (pad 4) + flip, per-channel normalization, SGD
              with Nesterov momentum and decoupled weight decay, label smoothing 0.2, a warm-up then a
              linear decay to zero shaped to end exactly at the budget, the learning rate scaled linearly
              with the global batch, flip test-time augmentation, optional weight averaging (EMA) and
              gradient accumulation (lesson 05).
``baseline``  exactly the popular TensorFlow CNN tutorial: Conv32-pool-Conv64-pool-Conv64-Flatten-Dense64,
              Adam (1e-3), batch 64, pixels /255, no augmentation, float32 — under the same budget rules.

Budgeted training (``--time-budget S``): the wall time counts everything — start-up, data loading, building,
compiling, a short timed warm-up, every epoch's evaluation and the final (TTA) evaluation. The warm-up
runs a few real training and evaluation steps (weights and optimizer state are restored afterwards),
measures the step time *without* the first call (which traces and compiles; its time is still counted
against the budget because it has already been spent), and chooses the number of epochs that fits in
what is left. The learning-rate schedule is stretched to end at that epoch. After every epoch the plan
is checked against the measured epoch time: shrunk when the rest would end more than half an epoch late,
grown when more than 1.25 epochs and 10% of the time left would go unused (never in the last two epochs
of the decay), so the run ends within one epoch of the budget.

Fault tolerance: ``keras.callbacks.BackupAndRestore`` saves the weights and optimizer state after every
epoch; a run killed mid-epoch and restarted with ``--resume`` continues after the last finished epoch
with the same plan (``plan.json``), counts the time already spent (``clock.json``, updated every few
seconds) against the budget and continues ``metrics.json``.

Import this module without TensorFlow loading: bad options are rejected before TensorFlow starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
import time
from typing import Any, Callable

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
RECIPES = ("course", "baseline")
POLICIES = ("auto", "float32", "mixed_bfloat16", "mixed_float16")
SCHEDULES = ("onecycle", "constant")
PROG = "capstone"

# The course recipe's constants, each traced to its source (also shown by the notebook's plan table).
COURSE = dict(
    batch_size=128,  # global batch per update; small data sets want more updates per epoch
    lr_per_256=0.2,  # peak LR for a global batch of 256; linear in the global batch (see peak_learning_rate)
    momentum=0.9,
    weight_decay=5e-3,  # decoupled (Keras SGD: w -= lr·wd·w per step) ≈ Page's 5e-4 L2 through momentum 0.9
    label_smoothing=0.2,
    warmup_fraction=0.2,  # of all steps: Page warms up for 5 of 24 epochs
    logit_scale=0.125,  # Page's final "Mul(0.125)": keeps early logits small
    width=16,  # base width w: widths w, 2w, 4w, 8w (ResNet-9 uses w=64; a 2-core CPU needs far less)
)
# Auto width (course recipe with a time budget and no --width): start at COURSE["width"]; double the widths
# while the warm-up says the doubled net still gets `min_epochs` epochs (a doubled net costs about
# `cost_of_doubling` times as much per image); halve them below `narrow_below_epochs`. Tuning note: real images.
AUTO_WIDTH = dict(min=8, max=64, cost_of_doubling=2.5, min_epochs=30, narrow_below_epochs=8)
BASELINE = dict(batch_size=64, learning_rate=1e-3)
# Goyal et al. 2017 scaled linearly to 8k on ImageNet with a 5-epoch warm-up; CIFAR-10 under a minutes budget has
# too few steps for that warm-up, so the course warns from ~1k examples per update
MAX_LR_SCALING_BATCH = 1024
# The budget planner's fixed margins (seconds): the final evaluation's, and each epoch's beyond its timed steps
FINAL_EVAL_MIN_S = 1.0
EPOCH_MIN_S = 0.3

RECIPE_TABLE = [
    {"choice": "ResNet-9-style network (conv-BN-ReLU prep, 2 residual blocks, global max pooling)", "lesson": "capstone",
     "source": "D. Page, 'How to train your ResNet' (DAWNBench 2018); airbench (K. Jordan 2024)"},
    {"choice": "precision policy of the hardware (bf16 on TPU/Ampere+/AMX CPUs, fp16 + loss scaling on T4)",
     "lesson": "03", "source": "memory.recommended_policy"},
    {"choice": "tf.data pipeline: cache → shuffle → augment → batch → prefetch, global batch split over replicas",
     "lesson": "04", "source": "data.build_pipeline"},
    {"choice": "random crop (pad 4) + horizontal flip; per-channel normalization", "lesson": "04",
     "source": "data.augment; Page"},
    {"choice": "SGD, Nesterov momentum 0.9, decoupled weight decay", "lesson": "capstone",
     "source": "Page; Loshchilov & Hutter 2019 (decoupled weight decay)"},
    {"choice": "label smoothing 0.2", "lesson": "capstone", "source": "Szegedy et al. 2016; airbench"},
    {"choice": "warm-up then linear decay to zero, stretched to end at the budget", "lesson": "capstone",
     "source": "Page (one-cycle); budgeted training (Li et al. 2020)"},
    {"choice": "peak LR linear in the global batch (up to ~1k)", "lesson": "04/05",
     "source": "Goyal et al. 2017"},
    {"choice": "flip test-time augmentation", "lesson": "capstone", "source": "Page; airbench"},
    {"choice": "optional EMA of the weights (SGD use_ema)", "lesson": "capstone", "source": "Page; Keras optimizers"},
    {"choice": "optional gradient accumulation (--accumulate K)", "lesson": "05", "source": "accumulation.AccumulatingModel"},
    {"choice": "steps_per_execution (several steps per call)", "lesson": "04", "source": "Keras compile()"},
    {"choice": "BackupAndRestore + best checkpoint; --resume", "lesson": "capstone", "source": "Keras callbacks"},
]


def tensorboard_installed() -> bool:
    """Whether TensorBoard is installed: ``tf.summary`` (the TensorBoard callback's scalars and profile) needs it,
    and TensorFlow 2.21 stopped depending on it."""
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


class OptionsError(ValueError):
    """An option the trainer cannot use; the message is one line that says which and what to do."""


@dataclasses.dataclass
class Options:
    """Everything a capstone run needs; the CLI fills the same fields. ``None`` = the recipe's default."""

    data: str | None = None  # "tfds" | "synthetic" | "npz:PATH"; None = COURSE_DATA (course_utils.config)
    recipe: str = "course"  # "course" | "baseline"
    time_budget: float | None = None  # seconds of wall time; exclusive with epochs
    epochs: int | None = None
    out: str = "runs/capstone"
    resume: bool = False
    batch_size: int | None = None  # global batch per optimizer update (course 128, baseline 64)
    policy: str = "auto"  # auto = the hardware's (course) / float32 (baseline, as the tutorial)
    accumulate: int = 1  # micro-batches per update (lesson 05)
    steps_per_execution: int = 1
    cpu_replicas: int | None = None  # None = COURSE_CPU_REPLICAS
    seed: int = 42
    tensorboard: str | None = None  # folder for TensorBoard scalars + a profile of a few steps
    train_examples: int | None = None  # None = whole split (synthetic: the config's sizes)
    test_examples: int | None = None
    # ablation toggles (None = the recipe's default)
    width: int | None = None  # course: base width (None: 16, smoke 8; auto with a budget); baseline: ignored
    augment: bool | None = None
    label_smoothing: float | None = None
    schedule: str | None = None  # "onecycle" | "constant"
    tta: bool | None = None
    ema: bool | None = None
    verbose: int = 1  # 1: progress bar + a line per epoch; 0: the line per epoch; -1: silent

    def resolved(self) -> "Options":
        """A copy with every recipe default filled in (what the run really uses)."""
        o = dataclasses.replace(self)
        course = o.recipe == "course"
        if o.batch_size is None:
            o.batch_size = COURSE["batch_size"] if course else BASELINE["batch_size"]
        if o.augment is None:
            o.augment = course
        if o.label_smoothing is None:
            o.label_smoothing = COURSE["label_smoothing"] if course else 0.0
        if o.schedule is None:
            o.schedule = "onecycle" if course else "constant"
        if o.tta is None:
            o.tta = course
        if o.ema is None:
            o.ema = False
        return o


def validate(o: Options) -> None:
    """Raise :class:`OptionsError` for anything the run cannot use (no TensorFlow needed)."""
    if o.recipe not in RECIPES:
        raise OptionsError(f"unknown recipe {o.recipe!r}; use --recipe course or --recipe baseline")
    if (o.time_budget is None) == (o.epochs is None):
        raise OptionsError("give exactly one of --time-budget SECONDS or --epochs N")
    if o.time_budget is not None and not (o.time_budget > 0 and math.isfinite(o.time_budget)):
        raise OptionsError(f"--time-budget must be a positive number of seconds, got {o.time_budget:g}")
    if o.epochs is not None and o.epochs < 1:
        raise OptionsError(f"--epochs must be at least 1, got {o.epochs}")
    if o.batch_size is not None and o.batch_size < 1:
        raise OptionsError(f"--batch-size must be at least 1, got {o.batch_size}")
    if o.accumulate < 1:
        raise OptionsError(f"--accumulate must be at least 1 (1 = no accumulation), got {o.accumulate}")
    if o.steps_per_execution < 1:
        raise OptionsError(f"--steps-per-execution must be at least 1, got {o.steps_per_execution}")
    if o.policy not in POLICIES:
        raise OptionsError(f"unknown policy {o.policy!r}; use one of {', '.join(POLICIES)}")
    if o.schedule is not None and o.schedule not in SCHEDULES:
        raise OptionsError(f"unknown schedule {o.schedule!r}; use one of {', '.join(SCHEDULES)}")
    if o.label_smoothing is not None and not 0 <= o.label_smoothing < 1:
        raise OptionsError(f"--label-smoothing must be in [0, 1), got {o.label_smoothing:g}")
    if o.width is not None and o.width < 1:
        raise OptionsError(f"--width must be at least 1, got {o.width}")
    for name in ("train_examples", "test_examples"):
        n = getattr(o, name)
        if n is not None and n < 1 and n != -1:
            raise OptionsError(f"--{name.replace('_', '-')} must be at least 1 (or -1 = whole split), got {n}")
    from . import config as _config

    try:
        data = _config._parse_data(o.data) if o.data is not None else _config.get().data
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
    if o.tensorboard and not tensorboard_installed():
        raise OptionsError("--tensorboard needs the tensorboard package, which TensorFlow 2.21 no longer installs: "
                           "pip install tensorboard tensorboard-plugin-profile (or leave --tensorboard out)")
    r = o.resolved()
    # CPU replicas are known before TensorFlow starts; a GPU/TPU count is checked again after detection.
    unit = replicas * o.accumulate
    if r.batch_size % unit:
        raise OptionsError(
            f"--batch-size {r.batch_size} is not divisible by replicas × accumulate = {replicas} × {o.accumulate}; "
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
    g.add_argument("--epochs", type=int, default=None, metavar="N")
    p.add_argument("--out", default="runs/capstone", metavar="DIR", help="output folder (default runs/capstone)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out after the last finished epoch")
    p.add_argument("--batch-size", type=int, default=None, help="global batch per update (course 128, baseline 64)")
    p.add_argument("--policy", default="auto", help="auto | float32 | mixed_bfloat16 | mixed_float16")
    p.add_argument("--accumulate", type=int, default=1, metavar="K", help="micro-batches per update (lesson 05)")
    p.add_argument("--steps-per-execution", type=int, default=1, metavar="N")
    p.add_argument("--cpu-replicas", type=int, default=None, metavar="N", help="split the CPU into N replicas")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--tensorboard", default=None, metavar="DIR", help="TensorBoard scalars + a profile of a few steps")
    p.add_argument("--train-examples", type=int, default=None, metavar="N", help="first N training images (-1: all)")
    p.add_argument("--test-examples", type=int, default=None, metavar="N", help="first N test images (-1: all)")
    p.add_argument("--width", type=int, default=None, help=f"course: base width w (widths w,2w,4w,8w); default {COURSE['width']} (smoke 8), "
                        "chosen automatically with --time-budget")
    p.add_argument("--no-augment", dest="augment", action="store_const", const=False, default=None)
    p.add_argument("--label-smoothing", type=float, default=None, metavar="X")
    p.add_argument("--schedule", default=None, help="onecycle | constant")
    p.add_argument("--no-tta", dest="tta", action="store_const", const=False, default=None)
    p.add_argument("--ema", dest="ema", action="store_const", const=True, default=None, help="average the weights (EMA)")
    p.add_argument("--quiet", action="store_true", help="no progress bar, only the line per epoch")
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
    t0 = time.perf_counter()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        opts = parse_args(argv)
    except OptionsError as exc:
        print(f"{PROG}: error: {exc} (see --help)", file=sys.stderr)
        return 2
    from .data import DataSourceError

    try:
        result = train(opts, _t0=t0)
    except OptionsError as exc:  # found only after TensorFlow started (e.g. GPU count)
        print(f"{PROG}: error: {exc} (see --help)", file=sys.stderr)
        return 2
    except DataSourceError as exc:
        print(f"{PROG}: data error: {exc}", file=sys.stderr)
        return 1
    s = result.summary
    print(f"Done: test accuracy {100 * s['test_accuracy']:.2f}% after {s['epochs']} epochs in "
          f"{s['wall_time_s']:.1f} s; summary in {os.path.join(opts.out, 'summary.json')}")
    return 0


# ----------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------


def write_json_atomic(path: str, obj: Any) -> None:
    """Write JSON so that a reader (or a kill) never sees half a file: temp file, fsync, rename."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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


def next_width(width: int, epochs: int, tried: list[int], rule: dict = AUTO_WIDTH) -> int | None:
    """Auto width: the next base width to try after the warm-up says ``epochs`` fit at ``width`` (None = keep
    it). Doubles while the doubled net would still get ``min_epochs``; halves below ``narrow_below_epochs``;
    never turns back (``tried``: the widths measured so far)."""
    if (width * 2 <= rule["max"] and not any(w > width for w in tried)
            and epochs / rule["cost_of_doubling"] >= rule["min_epochs"]):
        return width * 2
    if width // 2 >= rule["min"] and not any(w < width for w in tried) and epochs < rule["narrow_below_epochs"]:
        return width // 2
    return None


def load_result(out: str) -> dict:
    """``{"summary": ..., "history": ...}`` of a finished (or interrupted) run in ``out``, read from disk."""
    return {"summary": _read_json(os.path.join(out, "summary.json")),
            "history": _read_json(os.path.join(out, "metrics.json"), [])}


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------


def resnet9(width: int = COURSE["width"], num_classes: int = 10, mean=None, variance=None,
            logit_scale: float = COURSE["logit_scale"], name: str = "resnet9"):
    """A ResNet-9-style network for 32×32 images (Page's DAWNBench net), widths ``w, 2w, 4w, 8w``.

    prep: conv-BN-ReLU(w) · layer1: conv-BN-ReLU(2w), max-pool, residual(2 × conv-BN-ReLU) ·
    layer2: conv-BN-ReLU(4w), max-pool · layer3: conv-BN-ReLU(8w), max-pool, residual · global max pool ·
    dense · ×``logit_scale``. Inputs are pixels 0-255; the first layer normalizes per channel with the
    training split's ``mean``/``variance``. Outputs float32 logits under any policy.
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
        """The trained model's predictions on the test split (flip TTA if the recipe used it, or as asked)."""
        tta = self.options.tta if tta is None else tta
        if self._predictions is not None and self._predictions.tta == tta:
            return self._predictions
        x, y = self._test
        probs = _predict_probs(self.model, x, tta, self.options.batch_size)
        return Predictions(x, y, probs.argmax(1), probs, tta)


def _predict_probs(model, x, tta: bool, batch_size: int, plain=None):
    """Class probabilities; with tta, averaged with the horizontally flipped images'. `plain`: the un-flipped
    probabilities if already computed."""
    import numpy as np
    import tensorflow as tf

    def probs_of(images):
        logits = model.predict(images, batch_size=max(batch_size, 256), verbose=0)
        return tf.nn.softmax(tf.cast(logits, tf.float32)).numpy()

    xf = x.astype(np.float32)
    p = plain if plain is not None else probs_of(xf)
    if tta:
        p = (p + probs_of(xf[:, :, ::-1, :])) / 2
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


def _choose_policy(o: Options, rt) -> tuple[str, str]:
    from . import memory

    if o.policy != "auto":
        return o.policy, "chosen with --policy"
    if o.recipe == "baseline":
        return "float32", "baseline: float32, as the tutorial"
    policy, why = memory.recommended_policy(rt)
    if rt.kind == "CPU" and policy == "mixed_bfloat16":
        supported, flags = memory.cpu_bf16_support()
        if supported is False:
            return "float32", "CPU without native bfloat16 (no avx512_bf16/amx_bf16): float32 is faster here"
        if supported:
            why = f"CPU with native bfloat16 ({', '.join(flags)}): mixed_bfloat16"
    return policy, why


class _Clock:
    """Wall time of the whole run, across restarts: time before this process + time in it."""

    def __init__(self, t0: float, before: float = 0.0):
        self.t0, self.before = t0, before

    def __call__(self) -> float:
        return self.before + time.perf_counter() - self.t0


def train(options: Options, *, _t0: float | None = None) -> Result:
    """Train one recipe (see :class:`Options`) and return a :class:`Result`. Writes ``options.out``.

    Raises :class:`OptionsError` for a bad option and :class:`course_utils.data.DataSourceError` when the
    data cannot be loaded (never a silent switch to synthetic data)."""
    t0 = time.perf_counter() if _t0 is None else _t0
    validate(options)
    o = options.resolved()
    say = print if o.verbose >= 0 else (lambda *a, **k: None)
    out = o.out
    paths = {k: os.path.join(out, v) for k, v in dict(
        metrics="metrics.json", summary="summary.json", plan="plan.json", clock="clock.json",
        backup="backup", best="best.weights.h5").items()}

    # Resume or start afresh (before anything slow).
    plan = _read_json(paths["plan"]) if o.resume else None
    if o.resume and plan is None:
        say(f"--resume: no plan.json in {out}: starting a new run there")
    if plan is not None:
        _check_same_run(plan["options"], o)
        if os.path.exists(paths["summary"]):
            raise OptionsError(f"--resume: the run in {out} has finished (summary.json); nothing to resume — "
                               "drop --resume to train again there, or use another --out")
    if plan is None:
        for key in ("metrics", "summary", "plan", "clock", "best"):
            if os.path.exists(paths[key]):
                os.remove(paths[key])
        shutil.rmtree(paths["backup"], ignore_errors=True)
    os.makedirs(out, exist_ok=True)
    before = 0.0
    if plan is not None:
        history = _read_json(paths["metrics"], [])
        clock_state = _read_json(paths["clock"], {}) or {}
        before = max([clock_state.get("elapsed_s", 0.0)] + [h["elapsed_s"] for h in history])
    clock = _Clock(t0, before)

    from . import config as _config
    from . import data as _data
    from . import runtime as _runtime

    # The hardware first: splitting the CPU into replicas must happen before TensorFlow starts (loading
    # data starts it). Then the data: a source that cannot deliver fails before anything is built.
    rt = _runtime.detect(cpu_replicas=o.cpu_replicas)
    cfg = _config.get()
    source = o.data if o.data is not None else cfg.data
    synthetic = source == "synthetic"
    n_train = o.train_examples if o.train_examples is not None else (None if synthetic else -1)
    n_test = o.test_examples if o.test_examples is not None else (None if synthetic else -1)
    d = _data.load_cifar10(source, n_train=n_train, n_test=n_test, seed=o.seed, verbose=o.verbose >= 0)

    import numpy as np
    import keras
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    strategy = rt.strategy
    replicas = strategy.num_replicas_in_sync
    if o.batch_size % (replicas * o.accumulate):
        raise OptionsError(f"--batch-size {o.batch_size} is not divisible by replicas × accumulate = "
                           f"{replicas} × {o.accumulate} on this {rt.kind}; use a multiple of {replicas * o.accumulate}")
    if o.steps_per_execution > 1 and rt.strategy_name == "MirroredStrategy":
        raise OptionsError(
            f"--steps-per-execution {o.steps_per_execution} fails under MirroredStrategy ({replicas} replicas) in "
            f"Keras {keras.__version__} (keras-team/keras#19246: 'You must feed a value for placeholder tensor'); "
            "use --steps-per-execution 1 here (it pays on TPUs, which use TPUStrategy)")
    policy, policy_why = _choose_policy(o, rt)
    keras.utils.set_random_seed(o.seed)
    x_train, y_train = _arrays(d.train)
    x_test, y_test = _arrays(d.test)
    steps_per_epoch = len(x_train) // o.batch_size
    if steps_per_epoch < 1:
        raise OptionsError(f"--batch-size {o.batch_size} is larger than the {len(x_train)} training images")
    say(rt.summary().splitlines()[0])
    say(f"Recipe {o.recipe}: policy {policy} ({policy_why}); global batch {o.batch_size} "
        f"({replicas} replica(s) × {o.batch_size // replicas // o.accumulate} × {o.accumulate} accumulated); "
        f"{steps_per_epoch} steps/epoch")

    # Pipelines (lesson 04): uint8 cached, shuffled every epoch, augmented, batched with the global batch.
    def one_hot(x, y):
        return x, tf.one_hot(y, 10)

    train_raw = tf.data.Dataset.from_tensor_slices((x_train, y_train))
    test_raw = tf.data.Dataset.from_tensor_slices((x_test, y_test))
    train_ds = _data.build_pipeline(train_raw, o.batch_size, training=True,
                                    augment_fn=_data.augment if o.augment else None,
                                    shuffle_buffer=len(x_train), seed=o.seed, prefetch=False)
    train_ds = train_ds.map(one_hot, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    test_ds = _data.build_pipeline(test_raw, max(o.batch_size, 256), training=False, drop_remainder=False,
                                   prefetch=False).map(one_hot).prefetch(tf.data.AUTOTUNE)

    # Model, optimizer, loss.
    Schedule = _schedule_class()
    mean = x_train.reshape(-1, 3).mean(0)
    var = x_train.reshape(-1, 3).var(0)

    def build(width: int):
        previous_policy = keras.config.dtype_policy()
        keras.config.set_dtype_policy(policy)
        try:
            with strategy.scope():
                if o.recipe == "course":
                    net = resnet9(width, mean=mean, variance=var)
                    peak = peak_learning_rate(o.batch_size)
                    schedule = Schedule(peak, o.schedule)
                    optimizer = keras.optimizers.SGD(schedule, momentum=COURSE["momentum"], nesterov=True,
                                                     weight_decay=COURSE["weight_decay"], use_ema=o.ema)
                else:
                    net = tutorial_cnn()
                    peak = BASELINE["learning_rate"] * o.batch_size / BASELINE["batch_size"]
                    schedule = Schedule(peak, o.schedule)
                    optimizer = keras.optimizers.Adam(schedule, use_ema=o.ema)
                model = net
                if o.accumulate > 1:
                    from . import accumulation

                    model = accumulation.AccumulatingModel(net, steps=o.accumulate)
                    model(tf.zeros((1, 32, 32, 3)))
                model.compile(optimizer=optimizer,
                              loss=keras.losses.CategoricalCrossentropy(from_logits=True,
                                                                        label_smoothing=o.label_smoothing),
                              metrics=[keras.metrics.CategoricalAccuracy(name="accuracy")],
                              steps_per_execution=o.steps_per_execution)
                model.optimizer.build(model.trainable_variables)
        finally:
            keras.config.set_dtype_policy(previous_policy)
        return net, model, schedule, peak

    # Width: --width, else the course default capped by the config's model width (smoke sizes: 8), and with a
    # time budget that is only where auto width starts.
    auto_width = o.recipe == "course" and o.width is None and o.time_budget is not None
    width = (plan or {}).get("width") or o.width or min(COURSE["width"], cfg.sizes.model_width)
    net, model, schedule, peak = build(width)
    if o.batch_size > MAX_LR_SCALING_BATCH and o.recipe == "course":
        say(f"Note: global batch {o.batch_size} > {MAX_LR_SCALING_BATCH}: the linear LR rule gets unreliable here")

    # Reset the allocator's peak so the figure is this run's (CPU with the BFC allocator, GPU, TPU).
    from . import memory as _memory

    mem_device = _memory.default_device()
    try:
        tf.config.experimental.reset_memory_stats(mem_device)
        allocator_stats = True
    except Exception:  # noqa: BLE001 - this allocator keeps no statistics
        allocator_stats = False

    # The plan: how many epochs, and the LR schedule that ends with them.
    if plan is None:
        plan = {"options": dataclasses.asdict(o), "steps_per_epoch": steps_per_epoch, "policy": policy}
        if o.time_budget is not None:
            tried = []
            while True:
                # A second epoch needs final_s + 2 × epoch_s left, at least FINAL_EVAL_MIN_S + 2 × EPOCH_MIN_S:
                # with less left once the first step has compiled, the plan is one epoch whatever the steps take.
                est = _warm_up(model, train_ds, test_ds, o.steps_per_execution, steps_per_epoch,
                               math.ceil(len(x_test) / max(o.batch_size, 256)),
                               one_epoch_only=lambda: o.time_budget - clock() < FINAL_EVAL_MIN_S + 2 * EPOCH_MIN_S)
                if est["train_step_s"] is None:  # compiling used the budget: nothing to measure, no width to try
                    final_s, epoch_s, epochs = FINAL_EVAL_MIN_S, 0.0, 1
                    tried.append((width, None, epochs))
                    break
                final_s = est["eval_epoch_s"] * (2 if o.tta else 1) * 1.2 + FINAL_EVAL_MIN_S
                epoch_s = est["train_epoch_s"] + est["eval_epoch_s"] + EPOCH_MIN_S
                left = o.time_budget - clock() - final_s
                epochs = max(1, int(left // epoch_s))
                tried.append((width, round(epoch_s, 2), epochs))
                if not auto_width:
                    break
                new_width = next_width(width, epochs, [w for w, _, _ in tried])
                if new_width is None:
                    break
                width = new_width
                say(f"Budget {o.time_budget:g} s: ~{epochs} epochs at width {tried[-1][0]} → trying width {width}")
                net, model, schedule, peak = build(width)
            plan["width_trials"] = tried
            plan.update(est, epoch_estimate_s=epoch_s, final_eval_estimate_s=final_s, planning_elapsed_s=clock())
            if est["train_step_s"] is None:
                say(f"Budget {o.time_budget:g} s: the first step compiled in {est['compile_s']:.1f} s; "
                    f"{clock():.1f} s used so far → 1 epoch (no time left to time steps)")
            else:
                say(f"Budget {o.time_budget:g} s: warm-up measured {est['train_step_s'] * 1e3:.1f} ms/step "
                    f"(compile excluded: {est['compile_s']:.1f} s, counted), ~{epoch_s:.1f} s/epoch with evaluation; "
                    f"{clock():.1f} s used so far → {epochs} epoch{'s' if epochs != 1 else ''}")
        else:
            epochs = o.epochs
        plan["epochs"] = plan["initial_epochs"] = epochs
        plan["width"] = width
        plan["warmup_steps"] = round(COURSE["warmup_fraction"] * epochs * steps_per_epoch)
        write_json_atomic(paths["plan"], plan)
    schedule.set_plan(plan["warmup_steps"], plan["epochs"] * steps_per_epoch)

    # Resume: BackupAndRestore reloads weights + optimizer state; we continue metrics.json after that epoch.
    if o.resume:
        repaired = repair_backup(paths["backup"])
        if repaired:
            say(repaired)
    meta = _read_json(os.path.join(paths["backup"], "training_metadata.json"), {}) or {}
    done = int(meta.get("epoch", 0)) if o.resume else 0
    history = [h for h in (_read_json(paths["metrics"], []) if o.resume else []) if h["epoch"] <= done]
    if o.resume:
        say(f"Resuming after epoch {done} of {plan['epochs']}; {clock():.1f} s already spent"
            + (f" of the {o.time_budget:g} s budget" if o.time_budget else ""))
    write_json_atomic(paths["metrics"], history)

    progress = _Progress(o, plan, paths, clock, history, schedule, steps_per_epoch, len(x_train), replicas, say)
    # The progress callback comes after every callback that saves: an epoch's time includes its checkpoint and
    # backup, and metrics.json lists an epoch only once the backup holds it (a kill in between resumes after it).
    callbacks = [keras.callbacks.ModelCheckpoint(paths["best"], monitor="val_accuracy", save_best_only=True,
                                                 save_weights_only=True),
                 keras.callbacks.BackupAndRestore(paths["backup"], double_checkpoint=True)]
    if o.tensorboard:
        first = min(3, steps_per_epoch)
        callbacks.append(keras.callbacks.TensorBoard(
            o.tensorboard, profile_batch=(first, min(first + 4, steps_per_epoch)), write_graph=False))
    callbacks.append(progress)
    if o.ema:
        # Evaluate with the averaged weights (swapped in for each evaluation and back), train and back up the raw
        # ones (+ the averages, which are optimizer variables); fit's end assigns the averages to the model.
        # (swap_on_epoch=True would leave the averages in the model across a kill/--resume, and with fit's
        # epoch cap above the plan its last-epoch fix-up would not run.)
        callbacks.insert(0, keras.callbacks.SwapEMAWeights(swap_on_epoch=False))
    if o.verbose >= 1:
        callbacks.append(_plan_progbar(plan))

    if done < plan["epochs"] and progress.fits_another(done):
        # With a budget the plan may still grow (the warm-up over-estimated) or shrink (the machine got
        # slower): fit may run up to `cap` epochs and the progress callback stops it at the plan.
        cap = plan["epochs"] if o.time_budget is None else max(2 * plan["epochs"], plan["epochs"] + 5)
        model.fit(train_ds, epochs=cap, validation_data=test_ds, callbacks=callbacks,
                  verbose=1 if o.verbose >= 1 else 0)
    else:  # nothing left to train: load the last backup
        if os.path.exists(os.path.join(paths["backup"], "latest.weights.h5")):
            model.load_weights(os.path.join(paths["backup"], "latest.weights.h5"))
        shutil.rmtree(paths["backup"], ignore_errors=True)

    # Final evaluation (counted in the wall time): plain and flip-TTA.
    t_final = time.perf_counter()
    probs_plain = _predict_probs(net, x_test, False, o.batch_size)
    probs = _predict_probs(net, x_test, True, o.batch_size, plain=probs_plain) if o.tta else probs_plain
    acc_plain = float((probs_plain.argmax(1) == y_test).mean())
    acc = float((probs.argmax(1) == y_test).mean())
    final_eval_s = time.perf_counter() - t_final
    wall = clock()

    peak_bytes, peak_method = None, None
    if allocator_stats:
        try:
            peak_bytes = int(tf.config.experimental.get_memory_info(mem_device)["peak"])
            peak_method = f"{_memory.MEMORY_INFO}({mem_device!r})['peak'] over this process's training"
        except Exception:  # noqa: BLE001
            peak_bytes = None
    if not peak_bytes:
        rss = _memory._maxrss_bytes()
        peak_bytes, peak_method = rss, "process peak RSS (resource.getrusage ru_maxrss; whole process)"

    history = progress.history
    # Throughput: the median epoch's, leaving out the first (it traces, compiles and fills the cache).
    steady = sorted(h["images_per_s"] for h in (history[1:] if len(history) > 1 else history) if h["images_per_s"])
    ips = steady[len(steady) // 2] if steady else None
    summary = {
        "recipe": o.recipe,
        "test_accuracy": acc,
        "test_accuracy_no_tta": acc_plain,
        "tta": o.tta,
        "best_epoch_test_accuracy": max((h["test_accuracy"] for h in history), default=None),
        "epochs": len(history),
        "planned_epochs": plan["epochs"],
        "initially_planned_epochs": plan["initial_epochs"],
        "wall_time_s": wall,
        "budget_s": o.time_budget,
        "budget_used_s": wall if o.time_budget else None,
        "budget_used_fraction": wall / o.time_budget if o.time_budget else None,
        "time_before_first_epoch_s": history[0]["elapsed_s"] - history[0]["epoch_time_s"] if history else None,
        "final_eval_s": final_eval_s,
        "resumed": bool(o.resume and done > 0),
        "resumed_after_epoch": done if o.resume else None,  # the backup's last epoch: 0 = it started over
        "images_per_s": ips,
        "images_per_s_per_replica": ips / replicas if ips else None,
        "replicas": replicas,
        "global_batch": o.batch_size,
        "per_replica_batch": o.batch_size // replicas,
        "micro_batch_per_replica": o.batch_size // replicas // o.accumulate,
        "steps_per_epoch": steps_per_epoch,
        "peak_learning_rate": peak,
        "policy": policy,
        "policy_why": policy_why,
        "width": width if o.recipe == "course" else None,
        "width_trials": plan.get("width_trials"),
        "parameters": int(net.count_params()),
        "peak_memory_bytes": peak_bytes,
        "peak_memory_method": peak_method,
        "data": d.source,
        "train_examples": len(x_train),
        "test_examples": len(x_test),
        "options": dataclasses.asdict(o),
        "hardware": dict(rt.as_dict(), cpu_count=os.cpu_count()),
        "tf_version": tf.__version__,
        "keras_version": keras.__version__,
        "python_version": sys.version.split()[0],
    }
    write_json_atomic(paths["summary"], summary)
    write_json_atomic(paths["clock"], {"elapsed_s": wall, "finished": True})
    say(f"Final test accuracy {100 * acc:.2f}%" + (f" with flip TTA ({100 * acc_plain:.2f}% without)" if o.tta else "")
        + f"; {wall:.1f} s wall" + (f" of the {o.time_budget:g} s budget" if o.time_budget else ""))
    preds = Predictions(x_test, y_test, probs.argmax(1), probs, o.tta)
    return Result(summary, history, net, o, (x_test, y_test), preds)


def _check_same_run(stored: dict, o: Options) -> None:
    for key in ("recipe", "data", "batch_size", "width", "accumulate", "policy", "augment", "label_smoothing",
                "schedule", "ema", "train_examples", "test_examples", "time_budget", "epochs"):
        if stored.get(key) != getattr(o, key):
            flag = "--" + key.replace("_", "-")
            raise OptionsError(f"--resume: {o.out} was started with {flag} {stored.get(key)}, not {getattr(o, key)}; "
                               "resume with the same options or use another --out")


def _warm_up(model, train_ds, test_ds, spe: int, steps_per_epoch: int, test_steps: int,
             one_epoch_only: Callable[[], bool] = lambda: False) -> dict:
    """Time a few real steps (the first call, which traces and compiles, is timed separately), then put the
    weights and optimizer state back as they were. If ``one_epoch_only()`` says so after the first call (the
    budget is spent), stop there: only ``compile_s`` is measured, every other figure is None."""
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

        def on_test_batch_end(self, batch, logs=None):
            self.test.append((batch, time.perf_counter()))

    snapshot = [v.numpy() for v in model.variables] + [v.numpy() for v in model.optimizer.variables]
    calls = max(4, math.ceil(min(12, steps_per_epoch) / spe)) + 1
    t = Times()
    start = time.perf_counter()
    model.fit(train_ds.repeat().take(calls * spe), epochs=1, verbose=0, callbacks=[t])
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
        eval_step = (t.test[-1][1] - t.test[0][1]) / max(t.test[-1][0] - t.test[0][0], 1)
    else:  # one test batch: its first call traced and compiled; time a compiled one (fit's evaluations reuse it)
        start = time.perf_counter()
        model.evaluate(test_ds.take(1), verbose=0)
        eval_step = time.perf_counter() - start
    restore()
    return {"train_step_s": train_step, "eval_step_s": eval_step, "compile_s": first_train + first_eval,
            "train_epoch_s": train_step * steps_per_epoch, "eval_epoch_s": eval_step * test_steps}


def _plan_progbar(plan: dict):
    """Keras' progress bar, showing the current plan's epoch count ("Epoch 3/17") rather than fit's cap."""
    import keras

    class PlanProgbar(keras.callbacks.ProgbarLogger):
        def on_epoch_begin(self, epoch, logs=None):
            self.epochs = plan["epochs"]
            super().on_epoch_begin(epoch, logs)

    return PlanProgbar()


class _Progress:  # replaced by a keras Callback subclass at construction (keras imported lazily)
    def __new__(cls, *args, **kwargs):
        import keras

        class Progress(keras.callbacks.Callback):
            """One line per epoch, metrics.json after every epoch, clock.json every few seconds, the plan
            shrunk when the rest would not fit in the budget."""

            def __init__(self, o, plan, paths, clock, history, schedule, steps_per_epoch, n_train, replicas, say):
                super().__init__()
                self.o, self.plan, self.paths, self.clock, self.history = o, plan, paths, clock, list(history)
                self.schedule, self.steps_per_epoch, self.n_train, self.replicas, self.say = (
                    schedule, steps_per_epoch, n_train, replicas, say)
                self.last_tick = 0.0
                self.pending: list[str] = []
                self.epoch_times: list[float] = []

            def fits_another(self, done: int) -> bool:
                if self.o.time_budget is None or done == 0:
                    return True
                est = self.plan.get("epoch_estimate_s", 0.0)
                return self.clock() + est + self.plan.get("final_eval_estimate_s", 0.0) <= self.o.time_budget + 0.5 * est

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
                    write_json_atomic(self.paths["clock"], {"elapsed_s": self.clock()})

            def on_epoch_end(self, epoch, logs=None):
                logs = logs or {}
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
                    "test_loss": float(logs.get("val_loss", float("nan"))),
                    "test_accuracy": float(logs.get("val_accuracy", float("nan"))),
                    "images_per_s": images / train_s if train_s > 0 else None,
                    "lr": self.schedule.value(max(step - 1, 0)),
                    "planned_epochs": self.plan["epochs"],
                }
                self.history.append(entry)
                self.epoch_times.append(entry["epoch_time_s"])
                write_json_atomic(self.paths["metrics"], self.history)
                write_json_atomic(self.paths["clock"], {"elapsed_s": entry["elapsed_s"]})
                # Printed at the next epoch's start / the end: Keras' progress bar finishes its line after us.
                self.pending.append(
                    f"epoch {epoch + 1}/{self.plan['epochs']} · {entry['elapsed_s']:.1f} s · train loss "
                    f"{entry['train_loss']:.4f} · test acc {100 * entry['test_accuracy']:.2f}% · "
                    f"{entry['images_per_s']:.0f} images/s")
                if self.o.verbose < 1:
                    self._flush()
                self._replan(epoch + 1)
                if epoch + 1 >= self.plan["epochs"]:
                    self.model.stop_training = True

            def _replan(self, done: int) -> None:
                """Fit the rest of the plan to the budget left, at the epoch time measured in this process
                (median of the last 3 epochs; the first epoch, which fills the cache and compiles the
                evaluation, only while it is all there is). Shrinks or grows the plan, up to fit's cap."""
                o, plan = self.o, self.plan
                cap = self.params.get("epochs") or plan["epochs"]
                if o.time_budget is None or done >= cap:
                    return
                times = self.epoch_times[1:] or self.epoch_times
                recent = sorted(times[-3:])
                epoch_s = recent[len(recent) // 2]
                plan["epoch_estimate_s"] = epoch_s
                left = o.time_budget - self.clock() - plan.get("final_eval_estimate_s", 0.0)
                fits = done + max(0, int(left / epoch_s + 0.25))  # a quarter epoch over is still "within one"
                fits = max(done, min(fits, cap))
                # Hysteresis: change the plan only when it would end more than half an epoch late or leave
                # more than 1.25 epochs (and 10 % of the time left) unused: short epochs jitter by ±30 % on a
                # shared machine, and re-planning 60 epochs for every jitter would only churn the schedule.
                slack = left - (plan["epochs"] - done) * epoch_s
                if -0.5 * epoch_s <= slack <= max(1.25 * epoch_s, 0.1 * left):
                    return
                if fits > plan["epochs"] and plan["epochs"] - done < 2:
                    return  # the LR has (almost) reached zero: do not raise it again for one more epoch
                if fits != plan["epochs"]:
                    old = plan["epochs"]
                    plan["epochs"] = fits
                    warmup = plan["warmup_steps"] if fits > old else min(plan["warmup_steps"], max(done, 1) * self.steps_per_epoch)
                    self.schedule.set_plan(warmup, fits * self.steps_per_epoch)
                    write_json_atomic(self.paths["plan"], plan)
                    decay = "; the LR decay now ends there" if o.schedule == "onecycle" else ""
                    self.pending.append(f"  (budget: {left:.0f} s left at {epoch_s:.1f} s/epoch: plan {old} -> "
                                        f"{fits} epochs{decay})")

        return Progress(*args, **kwargs)


if __name__ == "__main__":
    sys.exit(main())
