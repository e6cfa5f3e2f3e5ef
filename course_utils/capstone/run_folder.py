"""The output folder and what a resumed run reads from it (:class:`RunFolder`, :func:`read_resume_state`)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from typing import Any

from .. import fileguard
from .options import (
    MARKER,
    Options,
    OptionsError,
    PROG,
    RUN_FILES,
    RUN_FOLDERS,
    RunStateError,
    is_int,
    own_backup_name,
    own_name,
    out_problem,
)
from .plan import BudgetPlan


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
            what += (
                f" (test accuracy {100 * summary['test_accuracy']:.1f}% after {summary.get('epochs', '?')} epochs"
                f" on {summary.get('data', '?')} data)"
            )
        return (
            f"--out {out!r} holds {what}; nothing was changed: add --overwrite to replace it, or choose another --out"
        )
    history = _read_json(run.metrics, [])
    left = [name for name in RUN_FILES if name != "summary.json" and os.path.exists(os.path.join(out, name))]
    if os.path.isdir(run.backup) or left:
        epochs = len(history) if isinstance(history, list) else 0
        return (
            f"--out {out!r} holds an unfinished run ({epochs} epoch{'s' if epochs != 1 else ''} in metrics.json);"
            " nothing was changed: add --resume to continue it, --overwrite to start again, or choose another "
            "--out"
        )
    return None


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
        return (
            "The last backup was cut off mid-write (the run was stopped while saving it); resuming from the one "
            "before it."
        )
    shutil.rmtree(backup, ignore_errors=True)
    return (
        "The only backup was cut off mid-write (the run was stopped while saving it); training starts again "
        "from epoch 1 (the time already spent still counts)."
    )


def load_result(out: str) -> dict:
    """``{"summary": ..., "history": ...}`` of a finished (or interrupted) run in ``out``, read from disk."""
    return {
        "summary": _read_json(os.path.join(out, "summary.json")),
        "history": _read_json(os.path.join(out, "metrics.json"), []),
    }


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
                    if own_backup_name(inner) and os.path.isfile(os.path.join(path, inner)):
                        os.remove(os.path.join(path, inner))
                if not os.listdir(path):
                    os.rmdir(path)
            elif own_name(name) and name != MARKER and os.path.isfile(path):
                os.remove(path)
        fileguard.write_json(
            self.marker,
            {
                "written_by": f"course_utils.{PROG}",
                "what": "a capstone run's folder: the trainer may delete its own files here when a new run starts",
            },
        )


@dataclasses.dataclass
class ResumeState:
    """What ``--resume`` continues from, read and checked before anything changes: the plan, the finished epochs'
    records, the time already spent and the backup's epoch."""

    plan: BudgetPlan
    history: list
    spent_s: float
    backup_epoch: int


def backup_epoch(backup: str) -> int:
    """The last epoch ``BackupAndRestore`` saved (0: none, or unreadable)."""
    meta = _read_json(os.path.join(backup, "training_metadata.json"), {})
    epoch = meta.get("epoch", 0) if isinstance(meta, dict) else 0
    return epoch if is_int(epoch) and epoch > 0 else 0


def read_resume_state(run: RunFolder, o: Options) -> ResumeState:
    """The state ``--resume`` continues from; :class:`OptionsError` with the reason for anything the trainer did not
    write (nothing is changed, nothing discarded)."""
    where = repr(run.out)

    def fix(instead: str = "") -> str:
        return (
            f"nothing was changed: fix or remove it{instead}, or run with --overwrite instead of --resume to start "
            "again (that deletes the run)"
        )

    if os.path.exists(run.summary):
        raise RunStateError(
            f"--resume: the run in {run.out} has finished (summary.json); nothing to resume — "
            "use --overwrite instead of --resume to train again there, or use another --out"
        )
    if not os.path.exists(run.plan):
        raise RunStateError(
            f"--resume: nothing to resume in {where}: it has no plan.json (the run stopped before it "
            "had planned its epochs); run without --resume"
        )
    try:
        with open(run.plan, encoding="utf-8") as f:
            plan = BudgetPlan.from_dict(json.load(f))
    except (OSError, ValueError) as exc:
        raise RunStateError(
            f"--resume: plan.json in {where} is not a plan this trainer wrote ({_one_line(exc)}); {fix()}"
        ) from None
    _check_same_run(plan.options, o)

    history: list = []
    if os.path.exists(run.metrics):
        try:
            with open(run.metrics, encoding="utf-8") as f:
                history = json.load(f)
            _check_history(history)
        except (OSError, ValueError) as exc:
            raise RunStateError(
                f"--resume: metrics.json in {where} is not what the trainer writes ({_one_line(exc)}); {fix()}"
            ) from None
    spent = max([0.0] + [h["elapsed_s"] for h in history])
    if os.path.exists(run.clock):
        state = _read_json(run.clock, None)
        value = state.get("elapsed_s") if isinstance(state, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise RunStateError(
                f"--resume: clock.json in {where} is not what the trainer writes (elapsed_s is "
                f"{value!r}); {fix(' (the time spent is then read from metrics.json)')}"
            )
        spent = max(spent, float(value))

    meta_path = os.path.join(run.backup, "training_metadata.json")
    epoch = 0
    if os.path.exists(meta_path):
        meta = _read_json(meta_path, None)
        epoch = meta.get("epoch") if isinstance(meta, dict) else None
        if meta is not None and (not is_int(epoch) or epoch < 0):
            raise RunStateError(f"--resume: the backup in {where} says epoch {epoch!r}, not a finished epoch; {fix()}")
        epoch = epoch if is_int(epoch) else 0  # a metadata file cut off mid-write: repair_backup falls back
    if epoch > plan.epochs:
        raise RunStateError(
            f"--resume: the backup in {where} says epoch {epoch}, beyond the plan's {plan.epochs} "
            f"epochs: it is not this run's backup; {fix()}"
        )
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
    for key in (
        "recipe",
        "data",
        "batch_size",
        "width",
        "accumulate",
        "policy",
        "augment",
        "label_smoothing",
        "schedule",
        "ema",
        "whiten",
        "train_examples",
        "test_examples",
        "validation_examples",
        "time_budget",
        "epochs",
    ):
        if key == "batch_size" and (o.batch_size is None or stored.get(key) is None):  # the recipe's per-replica
            continue  # batch, here or then: the global batches are compared once the replicas are known (check_same_batch)
        if key not in stored:  # a plan from before the option existed: its model is not this trainer's
            raise OptionsError(
                f"--resume: {o.out} was started by an earlier version of the trainer (its plan has no "
                f"{key!r}); nothing was changed: start it again with --overwrite, or use another --out"
            )
        if stored.get(key) != getattr(o, key):
            flag = "--" + key.replace("_", "-")
            raise OptionsError(
                f"--resume: {o.out} was started with {flag} {stored.get(key)}, not {getattr(o, key)}; "
                "resume with the same options or use another --out"
            )


def check_same_batch(plan, batch: int, why: str, out: str) -> None:
    """--resume: the global batch chosen here (``batch``: the recipe's per replica × this machine's replicas) must be
    the one the run started with (``plan``'s) — its plan's steps per epoch and learning rate depend on it. (A plan
    from before plans kept ``global_batch`` holds it in its options, which the run rewrote then.)"""
    stored = plan.global_batch if plan.global_batch is not None else plan.options.get("batch_size")
    if stored != batch:
        raise OptionsError(
            f"--resume: {out} was started with a global batch of {stored}, and here it would be "
            f"{batch} ({why}): resume with --batch-size {stored} or use another --out"
        )


def check_backup_fits(run: RunFolder, model) -> None:
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
        raise RunStateError(
            f"--resume: the backup in {run.out!r} does not fit this run's model (its weights have "
            "other shapes): it is another run's; nothing was changed: resume with that run's options, "
            "or use another --out"
        ) from None
    for v, value in zip(model.variables, snapshot):  # BackupAndRestore loads it again, with the optimizer state
        v.assign(value)
