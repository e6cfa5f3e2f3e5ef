"""``python -m course_utils prove``: every lesson's claims, measured on this hardware by its executed notebook.

Each lesson's notebook (listed in :data:`course_utils.lessons.LESSONS`) ends with a table of its claims
(``report.ClaimsTable`` of its ``experiments.claims(results)``), which saves them where ``COURSE_CLAIMS_DIR`` says.
This command executes each lesson's notebook top to bottom in a fresh kernel (:mod:`course_utils.notebook_run`),
in a process of its own with the lesson's settings (mode, CPU split, XLA, stand-in, data), and reads the claims its
table saved: the card proves the notebook a learner runs. The notebooks come from the checkout, or, installed, from
the copy the package ships (``course_utils/notebooks``). One lesson after another (or ``--jobs`` at a time); it
writes

- ``DIR/claims.json`` — every claim (id, lesson, claim, expected, measured, verdict in words and its reason,
  the samples where it came from repeats) and the machine it ran on, in format :data:`FORMAT_VERSION`;
- ``DIR/report.md`` — the same as a report card, one table per lesson.

Both are rewritten after every lesson, so an interrupted run keeps what finished. A lesson already proved in
DIR on the same machine, versions and settings is skipped unless ``--again``. Exit status: 0 when no claim
reads "does not hold", 1 when one does (or a lesson could not run), 2 on bad usage or when DIR cannot be
written safely, 128 + N when signal N (SIGTERM, SIGHUP) stopped it (130 for Ctrl-C).

What it writes, and what it will not do (each refusal is one line and exit status 2):

- every file is written whole or not at all (:mod:`course_utils.fileguard`: a temporary file in DIR, fsync,
  rename), never through a symbolic link: a link where ``claims.json``, ``report.md`` or ``.lock`` should be is
  refused; a full disk leaves the files as they were;
- one ``prove`` at a time per DIR (an ``flock`` on ``DIR/.lock``): a second one stops at once, naming the first's pid;
- a ``claims.json`` or ``report.md`` it did not write (or cannot read) is never overwritten: see :func:`_load`;
- a ``claims.json`` from another machine, versions or settings is moved aside to
  ``claims.previous-<UTC time>.json`` (its ``report.md`` to ``report.previous-<UTC time>.md``), never overwritten;
- the lesson's process and everything it started stop with ``prove``: on a timeout, Ctrl-C, SIGTERM, SIGHUP,
  and (through a sentinel process, and the kernel's parent-death signal on Linux) when ``prove`` is killed.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.util
import json
import math
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

from . import config as _config
from . import commandline, fileguard, processes, report
from . import hardware as _hardware
from .lessons import BY_ID, Lesson
from .runtime import usable_cores
import course_utils

FORMAT_VERSION = 2  # 2: every claim has an id ("05.accumulated_peak"); 1 had none
CLAIMS, REPORT = "claims.json", "report.md"
REPORT_HEADING = "# Claims vs. measured — report card"  # the first line of every report.md prove writes
MAX_CLAIMS_BYTES = 64 << 20  # a claims.json larger than this is not one prove wrote (all eight lessons: ~100 KB)
MAX_TIMEOUT_S = 7 * 24 * 3600.0
PARENT_VARIABLE = "COURSE_PROVE_PARENT"  # the driver's pid, for the lesson process to die with it


def job_order(todo: list[str], mode: str) -> list[str]:
    """The order ``--jobs`` starts lessons in: the longest in ``mode`` first (``Lesson.cost``, ``smoke_cost``)."""
    return sorted(
        todo, key=lambda lesson_id: -(BY_ID[lesson_id].smoke_cost if mode == "smoke" else BY_ID[lesson_id].cost)
    )


# The shapes learners run, emulated on a CPU (a --shape of prove): how many replicas every lesson gets, whether the
# measured steps are compiled with XLA, and which accelerator's code paths run (course_utils.standin: the runtime
# answers GPU or TPU over CPU devices, so every branch on the runtime's kind executes). Default (no --shape): the
# lessons' own replicas (4 for those about distribution, else 1) on the CPU, XLA as --jit says.
SHAPES = {
    "tpu": {
        "replicas": 4,
        "jit": True,
        "standin": "tpu",
        "what": "TPU stand-in: a 4-core TPU over CPU devices (CPU:0 its host), every step compiled with XLA, "
        "refusing what TPUStrategy refuses",
    },
    "tpu-1": {
        "replicas": 1,
        "jit": True,
        "standin": "tpu",
        "what": "TPU stand-in: a one-core TPU (Colab's v5e-1) over CPU devices (CPU:0 its host), every step "
        "compiled with XLA, refusing what TPUStrategy refuses",
    },
    "gpu": {
        "replicas": 1,
        "jit": False,
        "standin": "gpu",
        "what": "GPU stand-in: one GPU over a CPU device, memory read in the process as on a GPU, XLA as the "
        "course chooses on one GPU (fit: on)",
    },
    "multi-gpu": {
        "replicas": 2,
        "jit": False,
        "standin": "gpu",
        "what": "multi-GPU stand-in: 2 GPUs over CPU devices (MirroredStrategy), XLA as the course chooses "
        "on several GPUs (fit: off)",
    },
}


class UsageError(Exception):
    """Bad usage of ``prove``: one line, exit 2."""


# ----------------------------------------------------------------------------------------------
# The machine
# ----------------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_gib() -> float | None:
    try:
        import psutil

        return round(psutil.virtual_memory().total / 2**30, 1)
    except Exception:  # noqa: BLE001 - psutil missing or refused: not worth failing a proof
        return None


def code_fingerprint() -> str:
    """A hash of course_utils' own source and the lessons' notebooks: a proof is redone when what measures changed."""
    digest = hashlib.sha256()
    root = pathlib.Path(__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    for lesson in BY_ID.values():
        path = lesson_notebook(lesson)
        digest.update(lesson.notebook.encode() + (path.read_bytes() if path else b"missing"))
    return digest.hexdigest()[:16]


def describe_machine(runtime: Any, cfg: Any) -> dict:
    """The machine and settings a proof ran on (claims.json's ``machine``)."""
    import tensorflow as tf
    import keras

    names = []
    for kind in ("TPU", "GPU"):
        for device in tf.config.list_physical_devices(kind):
            try:
                details = tf.config.experimental.get_device_details(device)
            except Exception:  # noqa: BLE001
                details = {}
            names.append(details.get("device_name") or device.name)
    return {
        "accelerator": {
            "kind": runtime.kind,
            "name": ", ".join(dict.fromkeys(names)) or "none",
            "replicas": runtime.num_replicas,
        },
        "cpu": {
            "model": _cpu_model(),
            "cores": os.cpu_count(),
            "usable_cores": usable_cores(),
            "max_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
            "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default"),
            "kernels": _hardware.kernel_path()[0],
        },
        "memory_gib": _memory_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "course_utils": code_fingerprint(),
        "xla": bool(cfg.jit or runtime.kind == "TPU"),
        "shape": os.environ.get(SHAPE_VARIABLE, "") or None,
        **({"jobs": int(os.environ[JOBS_VARIABLE])} if os.environ.get(JOBS_VARIABLE, "1") != "1" else {}),
        "mode": cfg.mode,
        "data": cfg.data,
        "from": "notebooks",  # the claims come from executed notebooks (course_utils 2026.11.2's cards ran measure())
    }


def fingerprint(machine: dict) -> str:
    """What must match for a lesson proved earlier to count as proved here (everything but free text)."""
    return hashlib.sha256(json.dumps(machine, sort_keys=True).encode()).hexdigest()[:16]


def machine_line(machine: dict) -> str:
    acc, cpu = machine["accelerator"], machine["cpu"]
    where = f"{acc['kind']} ({acc['name']})" if acc["name"] != "none" else acc["kind"]
    cores = (
        f"{cpu['usable_cores']} of {cpu['cores']} cores"
        if cpu["usable_cores"] != cpu["cores"]
        else f"{cpu['cores']} cores"
    )
    extra = (
        [f"CPU kernels {cpu['kernels']}"]
        if cpu.get("kernels")
        else [f"oneDNN {'off' if cpu['onednn'] == '0' else 'on'}"]
    )
    if cpu.get("max_isa"):
        extra.append(f"ONEDNN_MAX_CPU_ISA={cpu['max_isa']}")
    replicas = f"{acc['replicas']} replica(s)" + (
        " (lessons on distribution split it into 4 devices)"
        if acc["kind"] == "CPU" and not machine.get("shape")
        else ""
    )
    return (
        f"{where}, {replicas} · CPU {cpu['model']}, {cores}, "
        f"{machine['memory_gib']} GiB · {machine['os']} · Python {machine['python']} · TensorFlow "
        f"{machine['tensorflow']} · Keras {machine['keras']} · {machine['mode']} mode, "
        f"{'with' if machine['xla'] else 'without'} XLA, data {machine['data']} · "
        + ", ".join(extra)
        + (f" · {SHAPES[machine['shape']]['what']}" if machine.get("shape") in SHAPES else "")
        + (
            f" · {machine['jobs']} lessons at a time, each on its own {cpu['usable_cores']} core(s)"
            if machine.get("jobs")
            else ""
        )
        + (" · claims read from the executed notebooks" if machine.get("from") == "notebooks" else "")
    )


# ----------------------------------------------------------------------------------------------
# One lesson, in the process that measures it
# ----------------------------------------------------------------------------------------------


def lesson_notebook(lesson: Lesson) -> pathlib.Path | None:
    """The lesson's notebook: in the checkout this ``course_utils`` runs from (``notebooks/``), else the copy an
    installed package ships (``course_utils/notebooks/``, the same files); None when neither is there."""
    here = pathlib.Path(__file__).resolve().parent
    for path in (here.parent / lesson.notebook, here / lesson.notebook):
        if path.is_file():
            return path
    return None


def notebook_claims(lesson: Lesson, progress: Callable[[str], None]) -> list[report.Claim]:
    """Execute the lesson's notebook top to bottom in a fresh kernel with this process's settings (mode, shape,
    replicas, XLA, data: the driver set them) and read the claims its last table saved (``report.ClaimsTable``,
    ``claims-NN.json``). A notebook that stops, or saves no table, is an error."""
    import nbformat

    from . import notebook_run

    path = lesson_notebook(lesson)
    if path is None:
        raise FileNotFoundError(f"{lesson.notebook} is neither in this checkout nor installed with course_utils")
    try:
        nb = nbformat.read(path, as_version=4)
    except (OSError, ValueError, UnicodeDecodeError) as err:  # truncated, hand-edited, not a notebook at all
        raise RuntimeError(
            f"{path} cannot be read as a notebook ({type(err).__name__}): restore it "
            "(git checkout, or reinstall course_utils)"
        ) from None
    with tempfile.TemporaryDirectory(prefix=f"prove-{lesson.id}-") as scratch:
        claims_dir, workdir = pathlib.Path(scratch, "claims"), pathlib.Path(scratch, "work")
        workdir.mkdir()
        env = {**os.environ, report.CLAIMS_DIR_VARIABLE: str(claims_dir)}

        def cell(index: int, seconds: float, how: str) -> None:
            if how or seconds >= 2:  # the slow cells, an error, one still running: a line each
                progress(f"cell {index + 1}/{len(nb.cells)} {seconds:.1f} s" + (f" — {how}" if how else ""))

        seconds, failure = notebook_run.run(
            nb,
            env,
            workdir=workdir,
            timeout=MAX_TIMEOUT_S,
            log_path=pathlib.Path(scratch, "kernel.log"),
            report_cell=cell,
            still_running_every_s=60.0,
        )
        if failure:
            raise RuntimeError(f"{lesson.notebook}: {failure}")
        saved = claims_dir / f"claims-{lesson.id}.json"
        try:
            data = json.loads(fileguard.read_regular(saved, MAX_CLAIMS_BYTES, follow_links=False))
        except (OSError, ValueError) as err:
            raise RuntimeError(
                f"{lesson.notebook} ran ({seconds:.0f} s) but saved no claims table for lesson "
                f"{lesson.id} ({type(err).__name__})"
            ) from None
    return [report.Claim.from_dict(c) for c in data]


def run_lesson(lesson_id: str, out_path: str) -> int:
    """The child process: execute one lesson's notebook here (the driver set its settings in the environment: its
    CPU replicas or --shape's, the mode, XLA, data) and write ``{lesson, title, claims, seconds}`` to out_path."""
    lesson = BY_ID[lesson_id]
    start = time.perf_counter()

    def progress(message: str) -> None:
        print(f"  · {message} ({time.perf_counter() - start:.0f} s)", flush=True)

    try:
        claims = notebook_claims(lesson, progress)
    except (RuntimeError, FileNotFoundError) as err:  # a cell raised, no table was saved: one line says which
        print(f"{LESSON_ERROR}{err}", flush=True)
        return 1
    for claim in claims:
        claim.lesson = claim.lesson or lesson.id
    problems = report.id_problems(claims, lesson.id)
    if problems:
        raise ValueError(f"lesson {lesson.id}'s claims: {'; '.join(problems)}")
    out = {
        "lesson": lesson.id,
        "title": lesson.title,
        "seconds": round(time.perf_counter() - start, 1),
        "claims": [c.to_dict() for c in claims],
    }
    fileguard.write_json(out_path, out, indent=None)
    return 0


LESSON_ERROR = "lesson failed: "  # how a lesson's process prints why its notebook failed, for the driver's line
SHAPE_VARIABLE = "COURSE_PROVE_SHAPE"  # prove's --shape, for the machine description its child writes
JOBS_VARIABLE = "COURSE_PROVE_JOBS"  # prove's --jobs, likewise
CPUS_VARIABLE = "COURSE_PROVE_CPUS"  # the cores a lesson's process is pinned to under --jobs ("0,1"), before TensorFlow


def core_slots(jobs: int) -> list[list[int]]:
    """The usable cores split into ``jobs`` equal, disjoint sets (``--jobs``): [[0], [1]] for 2 jobs on 2 cores.
    :class:`UsageError` when there are fewer usable cores than jobs, or no way to pin a process here."""
    if not hasattr(os, "sched_setaffinity"):
        raise UsageError("--jobs needs a system that can pin a process to cores (Linux): run without it")
    cores = sorted(os.sched_getaffinity(0))
    if jobs > len(cores):
        raise UsageError(f"--jobs {jobs}: only {len(cores)} usable core(s) here; each lesson needs one of its own")
    each = len(cores) // jobs
    return [cores[i * each : (i + 1) * each] for i in range(jobs)]


def _describe_here(out_path: str, cpu_replicas: int) -> int:
    cfg = _config.get()
    machine = describe_machine(course_utils.detect(cpu_replicas=cpu_replicas), cfg)
    fileguard.write_json(out_path, machine, indent=None)
    return 0


# ----------------------------------------------------------------------------------------------
# The driver
# ----------------------------------------------------------------------------------------------


def _child_env(args: argparse.Namespace, lesson: Lesson | None) -> dict:
    env = dict(os.environ)
    env["COURSE_SMOKE"] = "1" if args.mode == "smoke" else "0"
    shape = SHAPES.get(getattr(args, "shape", None) or "")
    env["COURSE_JIT"] = "1" if args.jit or (shape and shape["jit"]) else "0"
    if args.data:
        env["COURSE_DATA"] = args.data
    env["COURSE_CPU_REPLICAS"] = str(shape["replicas"] if shape else lesson.cpu_replicas if lesson else 1)
    env[SHAPE_VARIABLE] = getattr(args, "shape", None) or ""
    if shape:
        env["COURSE_STANDIN"] = shape["standin"]
    else:
        env.pop("COURSE_STANDIN", None)
    if getattr(args, "kernels", None):
        env.update(_hardware.KERNEL_PATHS[args.kernels]["env"])
        if args.kernels != "onednn-fp32":
            env.pop("ONEDNN_MAX_CPU_ISA", None)  # a cap left from the caller would change the path asked for
    env[JOBS_VARIABLE] = str(getattr(args, "jobs", 1))
    env.pop(CPUS_VARIABLE, None)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.pop(report.CLAIMS_DIR_VARIABLE, None)
    env["PYTHONUNBUFFERED"] = "1"
    if not processes.can_fork():  # forked (Linux): it dies with its fork server, which ends with this process
        env[PARENT_VARIABLE] = str(os.getpid())
    return env


def _echo(proc: subprocess.Popen, tail, prefix: str):
    """A thread reading the child's output: every line into ``tail``, its progress lines echoed with ``prefix``."""
    import threading

    def pump() -> None:
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line.strip():
                tail.append(line)
                if line.startswith("  · "):
                    print(prefix + line, flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    return reader


def _run_child(argv: list[str], env: dict, timeout: float, prefix: str) -> tuple[int | None, list[str]]:
    """Run ``python -m course_utils.proof ARGV`` in its own process group, echoing its progress lines with
    ``prefix``; (exit code or None on timeout, the last lines). However it ends — the child's exit, the timeout,
    Ctrl-C, SIGTERM — the group is stopped before this returns or raises (:func:`processes.group`): the
    lesson's process and whatever it started. If this process is killed instead, the group's sentinel stops it,
    and on Linux the kernel kills the child at once (``PARENT_VARIABLE``; a forked child: with its fork server)."""
    import collections

    tail: collections.deque = collections.deque(maxlen=12)
    code = None
    with processes.group(
        [sys.executable, "-m", "course_utils.proof", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        fork=True,
    ) as proc:
        reader = _echo(proc, tail, prefix)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    reader.join(timeout=5)
    return code, list(tail)


def _read_result(path: pathlib.Path) -> dict | None:
    """A child's result file (in the driver's private folder), or None if it wrote none or a broken one."""
    try:
        data = json.loads(fileguard.read_regular(path, MAX_CLAIMS_BYTES, follow_links=False))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _load(path: pathlib.Path) -> dict | None:
    """The claims.json an earlier run left in DIR, or None when there is none.

    A file that is there but cannot be used — not valid JSON (a hand edit's trailing comma, a truncated copy),
    not UTF-8, not what prove writes (another program's claims.json), a link, a folder — is refused
    (:class:`UsageError`: one line, exit 2), never treated as absent: starting a new one would overwrite every
    lesson proved so far. Refusing, rather than moving it aside under a new name, leaves the learner's file where
    they look for it, and the line says what is wrong and what to do (fix it, or move it away to start anew).
    A UTF-8 byte order mark (some Windows editors add one) is read past: the rest of the file is fine.

    Nothing in it is trusted because it says so: whether its lessons count as proved here is decided by
    recomputing the fingerprint of the machine it records (:func:`_same_machine`), and the lessons it keeps are
    checked for the shape :func:`report_card` and :func:`exit_status` read (:func:`_entry_problem`)."""
    try:
        raw = fileguard.read_regular(path, MAX_CLAIMS_BYTES, follow_links=False)
    except FileNotFoundError:
        return None
    except fileguard.NotRegular as err:
        raise UsageError(f"{err}; prove keeps its claims in that name: move it away or use another --out") from None
    todo = "fix it, or move it away (it keeps the lessons proved so far) to start a new one"
    try:
        data = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text: {todo}") from None
    except json.JSONDecodeError as err:
        raise UsageError(
            f"{path} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}): {todo}"
        ) from None
    except (ValueError, RecursionError):
        raise UsageError(f"{path} is not valid JSON: {todo}") from None
    if not (isinstance(data, dict) and isinstance(data.get("lessons"), dict) and "fingerprint" in data):
        raise UsageError(
            f"{path} was not written by prove (it has no lessons and fingerprint): refusing to "
            "overwrite it; move it away or use another --out"
        )
    return data


def _same_machine(data: dict, machine: dict) -> bool:
    """Whether claims.json ``data`` was written on this machine, versions and settings: the fingerprint is
    recomputed from the machine it records (and must match the one it stores), never taken on its word."""
    stored = data.get("machine")
    return (
        data.get("format") == FORMAT_VERSION
        and isinstance(stored, dict)
        and fingerprint(stored) == fingerprint(machine) == data.get("fingerprint")
    )


def _entry_problem(entry: Any) -> str | None:
    """None when a lesson's entry in claims.json has the shape prove writes; else what is wrong (a few words)."""
    if not isinstance(entry, dict):
        return "is not an object"
    if not isinstance(entry.get("error", ""), (str, type(None))) or not isinstance(entry.get("claims", []), list):
        return "has an error that is not text or claims that are not a list"
    for n, claim in enumerate(entry.get("claims", []), 1):
        if not isinstance(claim, dict) or not all(
            isinstance(claim.get(k), str) for k in ("claim", "expected", "measured", "verdict")
        ):
            return f"has a claim (number {n}) without text claim, expected, measured and verdict"
        try:
            report.Claim.from_dict(claim).outcome  # noqa: B018 - its verdict too ("holds": "maybe" raised later)
        except Exception as err:  # noqa: BLE001 - whatever a hand edit broke
            return f"has a claim (number {n}) that cannot be read ({err})"
    return None


def _written_by_prove(report_path: pathlib.Path) -> bool:
    try:
        text = fileguard.read_regular(report_path, MAX_CLAIMS_BYTES, follow_links=False).decode("utf-8", "replace")
    except (OSError, ValueError):
        return False
    return text.lstrip("\ufeff").startswith(REPORT_HEADING)


def _check_out(out: pathlib.Path) -> dict | None:
    """Before anything runs (TensorFlow takes seconds to start): refuse a link where prove writes and a report.md
    it did not write; the earlier claims.json, checked (:func:`_load`)."""
    for name in (CLAIMS, REPORT):
        if os.path.islink(out / name):
            raise UsageError(
                f"{out / name} is a symbolic link: prove does not write through links; remove it or use another --out"
            )
    data = _load(out / CLAIMS)
    if os.path.lexists(out / REPORT) and not _written_by_prove(out / REPORT):
        raise UsageError(
            f"{out / REPORT} was not written by prove: refusing to overwrite it; move it away or use another --out"
        )
    return data


def _move_aside(out: pathlib.Path) -> list[str]:
    """Move claims.json and report.md to ``claims.previous-<UTC time>.json`` / ``report.previous-<UTC time>.md``
    (a free name: ``-2``, ``-3`` … is added rather than overwrite one); the new names."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    moved = []
    for name, stem, suffix in ((CLAIMS, "claims", ".json"), (REPORT, "report", ".md")):
        src = out / name
        if not os.path.lexists(src):
            continue
        for n in range(1, 1000):
            dst = out / f"{stem}.previous-{stamp}{'' if n == 1 else f'-{n}'}{suffix}"
            try:
                os.link(src, dst, follow_symlinks=False)  # fails if dst exists: never overwrites
            except FileExistsError:
                continue
            except OSError:  # no hard links on this file system: rename (under the lock) to a name not taken
                if os.path.lexists(dst):
                    continue
                os.rename(src, dst)
            else:
                os.unlink(src)
            moved.append(dst.name)
            break
    return moved


VERDICT_LEGEND = (
    "How to read a verdict: ✅ holds — measured here as the lesson says; ❌ does not hold here — a real disagreement "
    "(please report it with this file); ⚠️ differs on this hardware — true where the lesson says, different here for "
    "the reason given (e.g. a CPU without bfloat16 units); 〰️ inconclusive — the repeats straddle the threshold "
    "(noise, not a verdict); ➖ not measurable here — this machine or mode cannot show it, and the reason says why. "
    "`course_utils` names the exact code that measured it (cards from other code are another experiment)."
)
SMOKE_NOTE = (
    "**Smoke mode:** tiny sizes and generated data, so the code paths are proved but speed and accuracy figures are "
    "not representative; for the card to keep, run `python -m course_utils prove --mode full` (about 45 minutes on "
    "2 cores; real CIFAR-10, or `--data npz:PATH`)."
)


def _id_cell(claim: report.Claim) -> str:
    """A report card's first column: the claim's id, and under it the function that measured it."""
    cell = f"`{claim.id}`" if claim.id else ""
    return cell + (f"<br>`{report.where_label(claim.where)}`" if claim.where else "")


def report_card(data: dict) -> str:
    """claims.json as Markdown: the machine, then one table per lesson."""
    machine = data.get("machine") or {}
    lines = [REPORT_HEADING, ""]
    if machine:
        lines += [f"**Machine:** {machine_line(machine)}", ""]
    lines += [
        f"Written {data.get('written', '')} by `python -m course_utils prove` (course_utils "
        f"{machine.get('course_utils', '?')}).",
        "",
    ]
    counts: dict[str, int] = {}
    for entry in data["lessons"].values():
        for c in entry.get("claims", []):
            counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
    if counts:
        lines += ["**Verdicts:** " + ", ".join(f"{n} {v}" for v, n in counts.items()), ""]
    lines += [VERDICT_LEGEND, ""]
    if machine.get("mode") == "smoke":
        lines += [SMOKE_NOTE, ""]
    for lesson_id in sorted(data["lessons"]):
        entry = data["lessons"][lesson_id]
        lines += [f"## {lesson_id} · {entry.get('title', '')}", ""]
        if entry.get("error"):
            lines += [f"Could not be measured: {entry['error']}", ""]
            continue
        claims = [report.Claim.from_dict(c) for c in entry.get("claims", [])]
        table = report.Table(
            [(_id_cell(c), c.claim, c.expected, c.measured, c.verdict) for c in claims],
            ("Id, measured by", "Claim", "Expected", "Measured here", "Verdict"),
        )
        lines += [table._repr_markdown_(), "", f"_{entry.get('seconds', '?')} s_", ""]
    return "\n".join(lines)


MODES_HELP = """modes:
  smoke  (the default) tiny sizes on synthetic data, offline: under 90 s per notebook, about 7 minutes for all eight
         on 2 CPU cores.
  full   the lessons' real sizes: about 30 minutes for all eight on 2 CPU cores on synthetic data, and about 16 more
         on real CIFAR-10 (lesson 06's sweep and ablation train on real images only), downloaded from the internet
         (tensorflow-datasets) unless --data says otherwise.
  Without --mode: smoke, unless COURSE_SMOKE is set (COURSE_SMOKE=0: full)."""


def _npz_problem(path: str) -> str | None:
    """Why the .npz at ``path`` cannot be the lessons' data, as a predicate ("does not exist", "is not a readable .npz
    archive …", "member x is an object array …"), or None; from its headers only (course_utils.data), before any
    lesson starts: a truncated or pickled file failed every lesson that read it, each with fragments of a traceback."""
    from . import data

    problem = data.file_problem(path)
    if problem is not None:
        return problem
    try:
        data._npz_headers(os.path.expanduser(path), 32, 10)
    except data.DataSourceError as err:
        return str(err).split(" — ", 1)[-1].split(f". {data.NPZ_HOWTO}")[0]
    except Exception as err:  # noqa: BLE001 - zipfile's own refusal of a file that is no zip archive at all
        return f"is not a readable .npz archive ({' '.join(str(err).split())[:120] or type(err).__name__})"
    return None


class _Parser(commandline.ArgumentParser):
    error_class = UsageError


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = _Parser(
        prog="python -m course_utils prove",
        description=__doc__.split("\n\n")[0],
        epilog=MODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--lessons", nargs="+", metavar="NN", help="lessons to prove (default: all): 02 05 …")
    parser.add_argument(
        "--mode",
        choices=("smoke", "full"),
        default=None,
        help="smoke (default: a minute or so per lesson, synthetic data) or full (~30+ minutes on 2 "
        "cores, real CIFAR-10 unless --data); see below",
    )
    parser.add_argument("--jit", action="store_true", help="compile the measured steps with XLA, as a TPU does")
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default=None,
        help="run every lesson in a shape learners run, emulated on this CPU: "
        + "; ".join(v["what"] for v in SHAPES.values()),
    )
    parser.add_argument(
        "--kernels",
        choices=list(_hardware.KERNEL_PATHS),
        default=None,
        help="the CPU kernels every lesson runs on (TF_ENABLE_ONEDNN_OPTS, ONEDNN_MAX_CPU_ISA; default: "
        "TensorFlow's choice for this CPU): "
        + "; ".join(f"{k}: {v['what']}, as on {v['who']}" for k, v in _hardware.KERNEL_PATHS.items()),
    )
    parser.add_argument(
        "--data", default=None, help="tfds | synthetic | npz:PATH (default: COURSE_DATA, or the mode's)"
    )
    parser.add_argument("--out", default=os.path.join("runs", "proof"), help="folder for claims.json and report.md")
    parser.add_argument("--again", action="store_true", help="measure lessons already proved in --out on this machine")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="measure N lessons at a time, each pinned to its own equal share of the cores (Linux; "
        "default 1: one lesson at a time on every core). The claims then hold for that share: "
        "--jobs 2 on 2 cores proves every lesson on one core",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds one lesson may take (default: 900 in smoke mode, 3600 in full)",
    )
    args = parser.parse_args(argv)
    wanted = args.lessons or sorted(BY_ID)
    lessons = []
    for raw in wanted:
        lesson_id = raw.strip().zfill(2)
        if lesson_id not in BY_ID:
            raise UsageError(f"unknown lesson {raw!r}: prove knows {' '.join(sorted(BY_ID))}")
        if lesson_id not in lessons:
            lessons.append(lesson_id)
    args.lessons = lessons
    missing = [BY_ID[i].notebook for i in lessons if lesson_notebook(BY_ID[i]) is None]
    if missing:
        raise UsageError(
            f"prove executes the lessons' notebooks, and {', '.join(missing)} is neither in this "
            "checkout nor installed with course_utils: reinstall course_utils, or run from a checkout"
        )
    absent = [name for name in ("nbclient", "nbformat", "ipykernel") if importlib.util.find_spec(name) is None]
    if absent:
        raise UsageError(
            f"prove executes the lessons' notebooks and needs nbclient, nbformat and ipykernel "
            f"({', '.join(absent)} missing): pip install -r requirements.txt, or "
            "pip install 'course_utils[notebook]'"
        )
    # XLA: --jit, --shape tpu, or COURSE_JIT=1 in the environment (as the notebooks read it)
    args.jit = bool(args.jit or _config.get().jit)
    if args.mode is None:  # smoke, unless the environment asks (COURSE_SMOKE=1 or 0, as the notebooks read it)
        args.mode = _config.get().mode if os.environ.get("COURSE_SMOKE", "").strip() else "smoke"
    if args.data is not None:
        try:
            args.data = _config.parse_data(args.data)
        except _config.ConfigError as e:
            raise UsageError(str(e).replace("COURSE_DATA=", "--data ")) from None
        problem = _npz_problem(args.data[4:]) if args.data.startswith("npz:") else None
        if problem is not None:
            raise UsageError(
                f"--data {args.data}: the file {problem}. Give the path of a CIFAR-10 .npz "
                "(the README, section Modes, says how to make one), or --data synthetic"
            )
    elif os.environ.get("COURSE_DATA", "").strip().startswith("npz:"):  # the lessons would read it: check it now
        path = os.environ["COURSE_DATA"].strip()[4:]
        problem = _npz_problem(path)
        if problem is not None:
            raise UsageError(
                f"COURSE_DATA=npz:{path}: the file {problem}. Give the path of a CIFAR-10 .npz (the "
                "README, section Modes, says how to make one), or unset COURSE_DATA"
            )
    if args.kernels is not None:
        got, why = _hardware.kernel_path(dict(os.environ, **_hardware.KERNEL_PATHS[args.kernels]["env"]))
        if got != args.kernels:
            raise UsageError(
                f"--kernels {args.kernels}: this CPU takes {got} with its settings ({why}); "
                f"choose one of the paths it can run"
            )
    if args.jobs < 1:
        raise UsageError(f"--jobs must be 1 or more, got {args.jobs}")
    args.slots = core_slots(args.jobs) if args.jobs > 1 else [None]
    if args.timeout is None:
        args.timeout = 900.0 if args.mode == "smoke" else 3600.0
    if not (math.isfinite(args.timeout) and 0 < args.timeout <= MAX_TIMEOUT_S):
        raise UsageError(
            f"--timeout must be a positive number of seconds, at most {MAX_TIMEOUT_S:.0f} (a week), "
            f"got {args.timeout:g}"
        )
    problem = fileguard.folder_problem(args.out)
    if problem:
        raise UsageError(f"cannot write to --out {args.out!r}: {problem}")
    args.out = pathlib.Path(args.out).expanduser()
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parse(argv)
    except (UsageError, _config.ConfigError) as e:
        print(f"prove: {e}", file=sys.stderr)
        return 2
    kept = f"{args.out / CLAIMS} keeps the lessons that finished (run the same command again to go on)"

    def body() -> int:
        try:
            with fileguard.folder_lock(args.out, "prove"):
                return _prove(args)
        except processes.ServerFailed as e:  # TensorFlow does not import (or crashes on import) here
            raise commandline.Failed(f"{e}; check the install: python -m course_utils doctor") from None
        except OSError as e:  # a full disk, a folder made read-only meanwhile: nothing half-written (fileguard)
            if e.filename is None:  # not a file of --out: this process's own output (a full or closed stdout)
                raise commandline.Failed(f"cannot write its output: {e.strerror or e}; {kept}") from None
            raise UsageError(
                f"cannot write {e.filename or args.out}: {e.strerror or e}; the files in {args.out} are "
                "as they were before this write (fix that, then run the same command again)"
            ) from None

    return commandline.run(
        "prove",
        body,
        usage=(UsageError, fileguard.UnsafePath, fileguard.NotRegular, fileguard.FolderBusy),
        stopped=lambda what: f"{what}; the lesson running was stopped; {kept}",
    )


def _prove(args: argparse.Namespace) -> int:
    data = _check_out(args.out)  # before TensorFlow starts: a refusal costs no time
    with tempfile.TemporaryDirectory(prefix="prove-") as private:  # the children's results: not in DIR
        return _prove_into(args, data, pathlib.Path(private))


def _save(args: argparse.Namespace, data: dict) -> None:
    """claims.json, then report.md, each whole or not at all; SIGINT/SIGTERM/SIGHUP wait until both are written."""

    with processes.signals_held():
        fileguard.write_json(args.out / CLAIMS, data, inside=args.out)
        fileguard.write_text(args.out / REPORT, report_card(data), inside=args.out)


def _prove_into(args: argparse.Namespace, data: dict | None, private: pathlib.Path) -> int:
    claims_path, report_path = args.out / CLAIMS, args.out / REPORT
    start = time.perf_counter()

    machine_file = private / "machine.json"
    replicas = SHAPES[args.shape]["replicas"] if args.shape else 1
    env = _child_env(args, None)
    if args.slots[0] is not None:  # described as a lesson sees it: on one slot's cores
        env[CPUS_VARIABLE] = ",".join(map(str, args.slots[0]))
    code, tail = _run_child(["_describe", str(machine_file), str(replicas)], env, 300, "")
    machine = _read_result(machine_file) if code == 0 else None
    if machine is None:
        print(f"prove: could not start TensorFlow to describe this machine (exit {code}):", file=sys.stderr)
        print("\n".join(tail[-5:]), file=sys.stderr)
        return 1
    print(f"Proving lessons {' '.join(args.lessons)} on: {machine_line(machine)}", flush=True)
    print(f"Writing {claims_path} and {report_path} after each lesson.", flush=True)

    if data is not None and not _same_machine(data, machine):
        moved = _move_aside(args.out)
        why = (
            "in an older format (claims without ids)"
            if data.get("format") != FORMAT_VERSION
            else "on another machine, versions or settings"
        )
        print(f"{claims_path} was written {why}: moved to {' and '.join(moved)}; starting a new one.", flush=True)
        data = None
    if data is not None:
        for lesson_id, entry in data["lessons"].items():
            problem = _entry_problem(entry)
            if problem:
                raise UsageError(
                    f"{claims_path}: lesson {lesson_id}'s entry {problem}: fix it, or move the file "
                    "away (it keeps the lessons proved so far) to start a new one"
                )
    if data is None:
        data = {"format": FORMAT_VERSION, "machine": machine, "fingerprint": fingerprint(machine), "lessons": {}}
        _save(args, data)  # the machine, at once: the card names where it runs before the first lesson ends

    todo = []
    for lesson_id in args.lessons:
        previous = data["lessons"].get(lesson_id)
        if previous and previous.get("claims") and not previous.get("error") and not args.again:
            print(
                f"[{lesson_id}] {BY_ID[lesson_id].title}: already proved here ({previous.get('written', '')}); "
                "--again to measure it again",
                flush=True,
            )
        else:
            todo.append(lesson_id)
    if args.jobs > 1:
        _prove_at_once(args, data, todo, private)
    for lesson_id in todo if args.jobs == 1 else ():
        print(f"[{lesson_id}] {BY_ID[lesson_id].title} …", flush=True)
        result_file = private / f"lesson-{lesson_id}.json"
        t0 = time.perf_counter()
        code, tail = _run_child(
            ["_lesson", lesson_id, str(result_file)], _child_env(args, BY_ID[lesson_id]), args.timeout, f"[{lesson_id}]"
        )
        _record(args, data, lesson_id, code, tail, result_file, t0)

    print(f"Done in {time.perf_counter() - start:.0f} s: {claims_path}, {report_path}", flush=True)
    code, summary = exit_status(data, args.lessons)
    if summary:
        print(summary, flush=True)
    return code


def _record(
    args: argparse.Namespace,
    data: dict,
    lesson_id: str,
    code: int | None,
    tail: list[str],
    result_file: pathlib.Path,
    t0: float,
) -> None:
    """A lesson's process has ended (``code``; None: timed out): its entry, a line saying how it went, and both
    files saved."""
    lesson = BY_ID[lesson_id]
    entry = _read_result(result_file) if code == 0 else None
    if entry is not None and _entry_problem(entry):
        entry = None
    written = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    if entry is None:
        said = [line.removeprefix(LESSON_ERROR) for line in tail if line.startswith(LESSON_ERROR)]
        why = (
            f"did not finish within {args.timeout:g} s (--timeout)"
            if code is None
            else f"its notebook stopped: {said[-1]}"
            if said
            else f"its process failed (exit {code}): " + " | ".join(tail[-4:])
        )
        entry = {
            "lesson": lesson_id,
            "title": lesson.title,
            "error": why,
            "claims": [],
            "seconds": round(time.perf_counter() - t0, 1),
        }
        print(f"[{lesson_id}] could not be measured: {why}", flush=True)
    else:
        counts: dict[str, int] = {}
        for c in entry["claims"]:
            counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
        print(
            f"[{lesson_id}] {len(entry['claims'])} claims in {entry['seconds']:.0f} s: "
            + ", ".join(f"{n} {v}" for v, n in counts.items()),
            flush=True,
        )
        for c in entry["claims"]:
            if c["verdict"] == report.Verdict.FAILS:
                print(
                    f"[{lesson_id}]   ❌ {c.get('id') or c['claim']}: {c['claim']} — expected {c['expected']}, "
                    f"measured {c['measured']}",
                    flush=True,
                )
    entry["written"] = written
    data["lessons"][lesson_id] = entry
    data["written"] = written
    _save(args, data)


def _prove_at_once(args: argparse.Namespace, data: dict, todo: list[str], private: pathlib.Path) -> None:
    """``--jobs N``: up to N lessons at a time, each in its own process group pinned to its own cores
    (:func:`core_slots`), the longest first (:func:`job_order`); each lesson is recorded as it ends. However this
    ends (Ctrl-C, SIGTERM), every lesson still running is stopped (its group's ``with`` block is left)."""
    import collections
    import contextlib

    queue = job_order(todo, args.mode)
    free = list(args.slots)
    running: dict[str, dict] = {}
    try:
        while queue or running:
            while queue and free:
                lesson_id, slot = queue.pop(0), free.pop(0)
                print(f"[{lesson_id}] {BY_ID[lesson_id].title} … (on core(s) {','.join(map(str, slot))})", flush=True)
                env = _child_env(args, BY_ID[lesson_id])
                env[CPUS_VARIABLE] = ",".join(map(str, slot))
                result_file = private / f"lesson-{lesson_id}.json"
                run = {
                    "slot": slot,
                    "result_file": result_file,
                    "t0": time.perf_counter(),
                    "stack": contextlib.ExitStack(),
                    "tail": collections.deque(maxlen=12),
                }
                running[lesson_id] = run
                proc = run["proc"] = run["stack"].enter_context(
                    processes.group(
                        [sys.executable, "-m", "course_utils.proof", "_lesson", lesson_id, str(result_file)],
                        env=env,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                        errors="replace",
                        fork=True,
                    )
                )
                run["reader"] = _echo(proc, run["tail"], f"[{lesson_id}]")
            time.sleep(0.2)
            for lesson_id, run in list(running.items()):
                code = run["proc"].poll()
                timed_out = code is None and time.perf_counter() - run["t0"] > args.timeout
                if code is None and not timed_out:
                    continue
                run["stack"].close()  # the group stopped (a timeout) and reaped
                run["reader"].join(timeout=5)
                del running[lesson_id]
                free.append(run["slot"])
                _record(
                    args, data, lesson_id, None if timed_out else code, list(run["tail"]), run["result_file"], run["t0"]
                )
    finally:
        for run in running.values():
            run["stack"].close()


def exit_status(data: dict, lessons: list[str]) -> tuple[int, str]:
    """0 when no claim of ``lessons`` in claims.json ``data`` reads "does not hold" and each was measured, else 1;
    with a one-line summary of what failed. Under a stand-in shape (``--shape gpu|multi-gpu|tpu|tpu-1``) too: there a
    speed or memory figure (a claim's ``figure``) is a CPU's judged as the accelerator's, and the lesson marks it
    "differs on this hardware" when it does not hold (:func:`course_utils.report.placed`); every other claim must
    hold, as the stand-in runs the accelerator's code."""
    failing = [
        c
        for lid in lessons
        for c in data["lessons"].get(lid, {}).get("claims", [])
        if report.Claim.from_dict(c).outcome is report.Verdict.FAILS
    ]
    unmeasured = [lid for lid in lessons if lid not in data["lessons"] or data["lessons"][lid].get("error")]
    if not failing and not unmeasured:
        return 0, ""
    names = ", ".join(c.get("id") or c["claim"][:40] for c in failing[:5]) + (", …" if len(failing) > 5 else "")
    summary = (
        f"{len(failing)} claim(s) do not hold here"
        + (f" ({names})" if failing else "")
        + (f"; lessons not measured: {' '.join(unmeasured)}" if unmeasured else "")
    )
    return 1, summary


def _child_main(argv: list[str]) -> int:
    if argv[:1] in (["_lesson"], ["_describe"]):  # a driver's child: dies with the driver, however that ends
        parent = os.environ.pop(PARENT_VARIABLE, "")
        processes.die_with_parent(int(parent) if parent.isdigit() else None)
        cpus = os.environ.pop(CPUS_VARIABLE, "")
        if cpus:  # --jobs: this lesson's cores, before TensorFlow sizes its thread pools (its children inherit them)
            os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    if argv[:1] == ["_lesson"]:
        return run_lesson(argv[1], argv[2])
    if argv[:1] == ["_describe"]:
        return _describe_here(argv[1], int(argv[2]))
    return main(argv)


if __name__ == "__main__":
    code = _child_main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)  # skip TensorFlow's teardown (seconds): the results are written
