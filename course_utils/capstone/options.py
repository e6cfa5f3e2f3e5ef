"""The capstone's options: what a run may be asked (:class:`Options`), their bounds, and the checks made before
TensorFlow starts (:func:`validate`, :func:`out_problem`: the output folder)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any


CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

POLICIES = ("auto", "float32", "mixed_bfloat16", "mixed_float16")

SCHEDULES = ("onecycle", "constant")

PROG = "capstone"

# The course recipe's constants, each traced to its source (also shown by the notebook's plan table).
COURSE = dict(
    batch_size=128,  # per replica per update: the global batch is 128 × replicas (1,024 on a v5e-8; lesson 08 §6)
    # peak LR for a global batch of 256; linear in the global batch (see peak_learning_rate). Page's 0.2 (0.4 at 512)
    # was chosen for 24 epochs of 50,000 images; budgets of minutes buy a few hundred updates, where 4× that learned
    # more: validation accuracy, width 4, batch 128, TensorFlow's own kernels, one core (exploration runs, 2026-11-28):
    # 15 epochs 55.3 / 53.6% at 0.2, 58.0% at 0.4, 63.9 / 60.2 / 63.6% at 0.8, 60.7% at 1.6; 30 epochs 63.1% at 0.2,
    # 67.1% at 0.8; 6 epochs 45.7 / 43.7% at 0.2, 49.9% at 0.4, 53.6% at 0.8, 52.1% at 1.6; width 8, 12 epochs 60.9%
    # at 0.2, 68.1% at 0.8
    lr_per_256=0.8,
    momentum=0.9,
    weight_decay=5e-3,  # decoupled (Keras SGD: w -= lr·wd·w per step) ≈ Page's 5e-4 L2 through momentum 0.9
    label_smoothing=0.2,
    warmup_fraction=0.2,  # of all steps: Page warms up for 5 of 24 epochs
    logit_scale=0.125,  # Page's final "Mul(0.125)": keeps early logits small
    width=16,  # base width w: widths w, 2w, 4w, 8w (ResNet-9 uses w=64; a 2-core CPU needs far less)
)

# the tutorial's recipe (tensorflow.org/tutorials/images/cnn): fit without batch_size, Keras' default 32, and Adam's
# default rate; a global batch, whatever the replicas
BASELINE = dict(batch_size=32, learning_rate=1e-3)

# Bounds on the numeric options, each with its reason (checked before TensorFlow starts)
MAX_EPOCHS = 10_000  # the schedule counts steps in float32: exact only up to 2**24 steps (checked too)

MAX_SCHEDULE_STEPS = 2**24

MAX_BUDGET_S = 7 * 86_400  # a week: no runtime the course targets lives longer (Colab: 12-24 hours)

MAX_BATCH = 65_536

STEMS = ("full", "s2d")  # resnet9's first layers: at 32×32, or at 16×16 from 2×2 patches (models.resnet9)
MAX_WIDTH = 512  # 8w = 4,096 filters: beyond any memory the course targets

MAX_STEPS_PER_EXECUTION = 10_000

MAX_SEED = 2**32 - 1  # NumPy's seeds (keras.utils.set_random_seed) are 32-bit

# The output folder: the marker a run leaves, and the names the trainer itself writes there
MARKER = "capstone_run.json"

RUN_FILES = ("metrics.json", "summary.json", "plan.json", "clock.json", "best.weights.h5")

RUN_FOLDERS = ("backup",)

LOCK = ".lock"  # fileguard.folder_lock's: one run at a time writes into a folder (kept, never deleted)

BACKUP_FILES = ("latest.weights.h5", "training_metadata.json")  # BackupAndRestore's, each also as ".bkp"


def tensorboard_installed() -> bool:
    """Whether TensorBoard is installed: ``tf.summary`` (the TensorBoard callback's scalars and profile) needs it,
    and TensorFlow 2.21 stopped depending on it."""
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


class OptionsError(ValueError):
    """An option the trainer cannot use; the message is one line that says which and what to do."""


class TensorFlowUnavailable(RuntimeError):
    """TensorFlow failed to import (checked after the options and the folder, before anything is written); the
    message is one line with the import's own last line and what to run."""


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
    stem: str | None = None  # course: "full" | "s2d" (models.STEMS); None: "full" (a resumed run: its plan's)
    ema: bool | None = None
    verbose: int = 1  # 1: progress bar + a line per epoch; 0: the line per epoch; -1: silent


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def own_name(name: str) -> bool:
    """A file name the trainer writes in its output folder: its files and their temporary copies — a kill can leave
    one behind (:func:`fileguard.write_bytes`' ``.NAME.PID-RANDOM.tmp``, or ``NAME.tmpPID`` from runs before it)."""
    if name.startswith(".") and name.endswith(".tmp"):
        base = name[1 : -len(".tmp")].rsplit(".", 1)[0]
    else:
        base = name.split(".tmp", 1)[0] if ".tmp" in name else name
    return base == MARKER or base in RUN_FILES


def own_backup_name(name: str) -> bool:
    return name.removesuffix(".bkp") in BACKUP_FILES


def _foreign_entries(out: str) -> list[str]:
    """What in ``out`` the trainer did not write: names other than its files, its backup folder and the backup's
    files (one level down)."""
    foreign = []
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        if name == LOCK and os.path.isfile(path) and not os.path.islink(path):
            continue
        if name in RUN_FOLDERS and os.path.isdir(path) and not os.path.islink(path):
            foreign += [f"{name}/{inner}" for inner in sorted(os.listdir(path)) if not own_backup_name(inner)]
        elif not (own_name(name) and os.path.isfile(path)):
            foreign.append(name)
    return foreign


def _written_by_trainer(path: str) -> bool:
    """Whether ``summary.json`` or ``metrics.json`` at ``path`` reads as the trainer's: a summary naming its recipe
    and options, or a list of epochs numbered from 1 (at most 16 MiB read)."""
    import json

    try:
        if os.path.getsize(path) > 16 << 20:
            return False
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return False
    if os.path.basename(path) == "summary.json":
        return (
            isinstance(data, dict)
            and data.get("recipe") in ("course", "baseline")
            and isinstance(data.get("options"), dict)
        )
    return isinstance(data, list) and all(isinstance(e, dict) and e.get("epoch") == i for i, e in enumerate(data, 1))


def _nearest_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return path


def folder_problem(flag: str, path: Any) -> str | None:
    """Why ``path`` cannot be (or become) a folder this process writes into; None when it can."""
    if not isinstance(path, str) or not path.strip():
        return f"{flag} must name a folder, got {path!r}"
    if os.path.lexists(path) and not os.path.isdir(path):
        return f"{flag} {path!r} is a file, not a folder"
    existing = _nearest_existing(path)
    if not os.path.isdir(existing):
        return f"{flag} {path!r} cannot be created: {existing!r} is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return (
            f"{flag} {path!r} is not writable"
            if existing == os.path.abspath(path)
            else f"{flag} {path!r} cannot be created: {existing!r} is not writable"
        )
    return None


def out_problem(out: Any) -> str | None:
    """Why a run may not write into ``out``: it must be a new or empty folder, or a capstone run already (its
    :data:`MARKER`, or — runs from before the marker — only the trainer's own files). None when it may."""
    problem = folder_problem("--out", out)
    if problem or not os.path.isdir(out):
        return problem
    try:
        foreign = _foreign_entries(out)
    except OSError as exc:
        return f"--out {out!r} cannot be read ({exc.strerror or exc})"
    for name in RUN_FOLDERS:  # Keras writes its backups there: a link would send them (and their removal) elsewhere
        path = os.path.join(out, name)
        if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
            kind = "a symbolic link" if os.path.islink(path) else "a file"
            return (
                f"--out {out!r}: its {name!r} is {kind}, not a folder; the trainer keeps its backups only in a "
                f"folder of its own there: remove {name!r}, or choose another --out"
            )
    if os.path.isfile(os.path.join(out, MARKER)):  # its own run: other files may stay, but not in backup/
        inside = [name for name in foreign if name.startswith(tuple(f"{f}/" for f in RUN_FOLDERS))]
        if inside:
            return (
                f"--out {out!r}: its backup folder holds files the trainer did not write ({', '.join(inside[:3])}),"
                " and Keras removes that folder when a run finishes: move them, or choose another --out"
            )
        return None
    # no marker: a run from before it, if what carries the trainer's names reads as the trainer's (a folder holding
    # only someone's own summary.json and metrics.json is theirs, not a run to replace)
    foreign = sorted(
        foreign
        + [
            name
            for name in ("metrics.json", "summary.json")
            if name not in foreign
            and os.path.isfile(os.path.join(out, name))
            and not _written_by_trainer(os.path.join(out, name))
        ]
    )
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        return (
            f"--out {out!r} holds files that are not a capstone run's ({shown}); the trainer writes only into a new "
            "or empty folder or one of its own runs: choose another --out"
        )
    return None


def divisor_below(n: int, k: int) -> int:
    """The largest divisor of ``n`` below ``k`` (an --accumulate that divides the per-replica batch)."""
    return max(d for d in range(1, k) if n % d == 0)


def bounded(name: str, value: Any, low: float, high: float, why: str, whole: bool = True) -> None:
    flag = "--" + name.replace("_", "-")
    if whole and not is_int(value):
        raise OptionsError(f"{flag} must be a whole number, got {value!r}")
    if not whole and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise OptionsError(f"{flag} must be a number, got {value!r}")
    if not (low <= value <= high):  # NaN fails this too
        span = f"{low:,} to {high:,}" if whole else f"at most {high:,}"
        raise OptionsError(f"{flag} must be {span}{why}, got {value!r}")
