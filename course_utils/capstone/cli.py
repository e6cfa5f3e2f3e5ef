"""The command line: ``python -m course_utils capstone`` / ``python -m course_utils.capstone``."""

from __future__ import annotations

import argparse
import os
import sys
import time

from .. import commandline
from .checks import validate
from .options import COURSE, Options, OptionsError, PROG, RunStateError, TensorFlowUnavailable
from .plan import MAX_VALIDATION, VALIDATION_FRACTION
from .recipes import TPU_STEPS_PER_EXECUTION
from .run_folder import backup_epoch
from .trainer import train
from .. import data as _data
from ..data import DataSourceError


class _Parser(commandline.ArgumentParser):
    error_class = OptionsError


def _positive_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=f"python -m course_utils.{PROG}",
        description="Train CIFAR-10 with the course recipe or the tutorial baseline, for a number of "
        "epochs or a time budget; resumable.",
    )
    p.add_argument("--data", default=None, help="tfds | synthetic | npz:PATH (default: COURSE_DATA, else tfds)")
    p.add_argument("--recipe", default="course", help="course | baseline (default course)")
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--time-budget",
        type=_positive_float,
        default=None,
        metavar="SECONDS",
        help="wall-clock budget, evaluation included; picks the epochs and shapes the LR schedule",
    )
    g.add_argument("--epochs", type=int, default=None, metavar="N", help="train exactly N epochs (no budget)")
    p.add_argument(
        "--out",
        default="runs/capstone",
        metavar="DIR",
        help="output folder: new, empty, or an earlier capstone run (default runs/capstone)",
    )
    r = p.add_mutually_exclusive_group()
    r.add_argument("--resume", action="store_true", help="continue the run in --out after the last finished epoch")
    r.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in --out (without it, a folder holding a run is refused)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="global batch per update (default: course 128 per replica × replicas, with the learning rate "
        "scaled linearly; baseline 32, the tutorial's)",
    )
    p.add_argument("--policy", default="auto", help="auto | float32 | mixed_bfloat16 | mixed_float16")
    j = p.add_mutually_exclusive_group()
    j.add_argument(
        "--jit",
        dest="jit",
        action="store_const",
        const=True,
        default=None,
        help="compile the step with XLA (default: on one GPU, and on a CPU running TensorFlow's own kernels; off "
        "with oneDNN and on several replicas, where fit cannot be compiled; a TPU always compiles)",
    )
    j.add_argument("--no-jit", dest="jit", action="store_const", const=False, help="do not compile the step with XLA")
    p.add_argument("--accumulate", type=int, default=1, metavar="K", help="micro-batches per update (lesson 05)")
    p.add_argument(
        "--steps-per-execution",
        type=int,
        default=None,
        metavar="N",
        help=f"steps per call into the compiled function (default: {TPU_STEPS_PER_EXECUTION} on a TPU, at "
        "most an epoch's steps; 1 elsewhere; lesson 04)",
    )
    p.add_argument("--cpu-replicas", type=int, default=None, metavar="N", help="split the CPU into N replicas")
    p.add_argument("--seed", type=int, default=42, help="random seed of the weights and the data order (default 42)")
    p.add_argument("--tensorboard", default=None, metavar="DIR", help="TensorBoard scalars + a profile of a few steps")
    p.add_argument(
        "--train-examples",
        type=int,
        default=None,
        metavar="N",
        help="first N training images, validation included (-1: all)",
    )
    p.add_argument("--test-examples", type=int, default=None, metavar="N", help="first N test images (-1: all)")
    p.add_argument(
        "--validation-examples",
        type=int,
        default=None,
        metavar="N",
        help=f"held out of the training images (default {VALIDATION_FRACTION:.0%}, at most {MAX_VALIDATION:,})".replace(
            "%", "%%"
        ),
    )  # argparse %-formats help strings
    p.add_argument(
        "--width",
        type=int,
        default=None,
        help=f"course: base width w (widths w,2w,4w,8w); default {COURSE['width']} (smoke 8), "
        "chosen automatically with --time-budget",
    )
    p.add_argument(
        "--no-augment",
        dest="augment",
        action="store_const",
        const=False,
        default=None,
        help="no flips and crops while training (an ablation)",
    )
    p.add_argument(
        "--label-smoothing",
        type=float,
        default=None,
        metavar="X",
        help="label smoothing in [0, 1) (course 0.2, baseline 0)",
    )
    p.add_argument("--schedule", default=None, help="onecycle | constant")
    p.add_argument(
        "--no-tta",
        dest="tta",
        action="store_const",
        const=False,
        default=None,
        help="no test-time augmentation (mirror and one-pixel shifts)",
    )
    p.add_argument(
        "--no-whiten",
        dest="whiten",
        action="store_const",
        const=False,
        default=None,
        help="course: no fixed patch-whitening first convolution (an ablation)",
    )
    p.add_argument(
        "--stem",
        default=None,
        help="course: full (the first layers at 32x32) | s2d (at 16x16, from "
        "2x2 patches: about twice the epochs where a budget fits few); default: full",
    )
    p.add_argument(
        "--ema", dest="ema", action="store_const", const=True, default=None, help="average the weights (EMA)"
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar, only the line per epoch (the bar is drawn only on a terminal or in "
        "a notebook, never into a log or a pipe)",
    )
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
    t0 = process_start()  # the budget counts from here: Python's and the imports' start-up included
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        opts = parse_args(argv)
    except RunStateError as exc:  # the folder, not the options: its line says what to add
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except OptionsError as exc:
        print(f"{PROG}: error: {exc} (see --help)", file=sys.stderr)
        return 2

    def body() -> int:
        try:
            result = train(opts, _t0=t0, _command_line=True)
        except TensorFlowUnavailable as exc:  # a broken install: one line, not an import's traceback
            raise commandline.Failed(f"error: {exc}") from None
        except RunStateError as exc:  # the run's folder, not the options
            raise commandline.UsageError(f"error: {exc}") from None
        except OptionsError as exc:  # found only after TensorFlow started (e.g. GPU count)
            raise commandline.UsageError(f"error: {exc} (see --help)") from None
        except DataSourceError as exc:
            raise commandline.Failed(f"data error: {in_cli_words(str(exc))}") from None
        except OSError as exc:  # the disk, not the options: full, removed, or made read-only mid-run
            where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
            raise commandline.Failed(
                f"error: {exc.strerror or exc}{where}; the finished epochs are saved: fix it and "
                "run the same command with --resume"
            ) from None
        s = result.summary
        print(
            f"Done: test accuracy {100 * s['test_accuracy']:.2f}% (validation {100 * s['validation_accuracy']:.2f}%) "
            f"after {s['epochs']} epochs in {s['wall_time_s']:.1f} s; summary in "
            f"{os.path.join(opts.out, 'summary.json')}"
        )
        return 0

    def stopped(what: str) -> str:
        # A preempted VM (a Spot or preemptible one, Colab's runtimes when reclaimed) is told with SIGTERM, and killed
        # about 30 s later: stop at once, with every finished epoch already saved (BackupAndRestore writes each)
        done = backup_epoch(os.path.join(opts.out, "backup"))
        saved = f"epochs 1–{done} are saved" if done else "no epoch had finished"
        why = " (how a preempted VM is warned, about 30 s before it is killed)" if what.startswith("stopped") else ""
        return f"{what}{why}: {saved}; run the same command with --resume to continue"

    return commandline.run(PROG, body, stopped=stopped)


def process_start() -> float:
    """This process's start on the ``time.perf_counter`` clock (now, where it cannot be read): a budget counts
    Python's start-up and the imports, which on a slow machine take seconds. On Linux from ``/proc/self/stat``'s
    start time (clock ticks since boot) against ``CLOCK_BOOTTIME``; elsewhere psutil's creation time. (psutil's on
    Linux adds the boot time in whole seconds, ``btime`` of ``/proc/stat``: it read 0.40 s too early on a 2-core VM,
    and may read up to a second early.)"""
    now = time.perf_counter()
    age = _process_age_s()
    return now - age if age is not None else now


def _process_age_s() -> float | None:
    psutil_age = None
    try:
        import psutil

        psutil_age = max(0.0, time.time() - psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - no psutil, or the process table unreadable
        pass
    try:
        with open("/proc/self/stat") as f:
            age = max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - stat_start_s(f.read()))
    except Exception:  # noqa: BLE001 - not Linux, or /proc unreadable: psutil's, else none
        return psutil_age
    # psutil's is late by the boot time's fraction of a second; a /proc whose clock disagrees by more (an emulated
    # one) is not believed
    if psutil_age is not None and not psutil_age - 1.1 <= age <= psutil_age + 0.1:
        return psutil_age
    return age


def stat_start_s(stat: str) -> float:
    """A process's start in seconds after boot from its ``/proc/PID/stat`` line: field 22 (``starttime``, clock
    ticks), counted after the ``(comm)`` field, which may hold spaces and brackets."""
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


def in_cli_words(message: str) -> str:
    """A data error as the command line says it: ``--data synthetic``, not the notebooks' ``COURSE_DATA=synthetic``
    set before a setup cell the command line does not have."""
    message = message.replace(
        _data.NO_INTERNET_FIX,
        (
            "Use --data npz:/path/cifar10.npz (a copy of CIFAR-10) or --data synthetic (generated CIFAR-shaped data, no "
            'download). To get CIFAR-10 for this machine: on a connected one run load_cifar10("tfds", n_train=-1, '
            "n_test=-1) and write_npz(...) (see course_utils.data.write_npz), or copy its ~/tensorflow_datasets/cifar10 "
            "folder here."
        ),
    )
    for notebook, cli in (
        (" or COURSE_SMOKE=1 before the setup cell (restart the kernel if it already ran)", " or --data synthetic"),
        (" or COURSE_SMOKE=1 before the setup cell", " or --data synthetic"),
        (" (then restart the kernel)", ""),
        ("Fix the path in COURSE_DATA", "Fix the path in --data"),
        ("COURSE_DATA=npz:", "--data npz:"),
        ("COURSE_DATA=synthetic", "--data synthetic"),
        ("COURSE_DATA", "--data"),
        ("set --data", "use --data"),
    ):
        message = message.replace(notebook, cli)
    return message
