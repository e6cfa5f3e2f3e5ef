"""``python -m course_utils prove``: every lesson's claims, measured on this hardware, without Jupyter.

Each lesson's measurements and claims live in code (its experiments module): ``measure(lab)`` runs what the
notebook measures and returns JSON-able results, ``claims(results)`` turns them into :class:`report.Claim`s.
The notebook calls the same pieces and ends with the table ``claims(results)`` builds; this command runs
``measure`` and ``claims`` for each lesson in a fresh process (its own TensorFlow, CPU split and settings),
one lesson after another, and writes

- ``DIR/claims.json`` — every claim (lesson, claim, expected, measured, verdict in words and its reason,
  the samples where it came from repeats) and the machine it ran on;
- ``DIR/report.md`` — the same as a report card, one table per lesson.

Both are rewritten after every lesson, so an interrupted run keeps what finished. A lesson already proved in
DIR on the same machine, versions and settings is skipped unless ``--again``. Exit status: 0 when no claim
reads "does not hold", 1 when one does (or a lesson could not run), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import importlib
import json
import os
import pathlib
import platform
import subprocess
import sys
import time
from typing import Any, Callable

from . import config as _config
from . import report

FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Lesson:
    """A lesson whose claims ``prove`` can measure: ``module`` has ``measure(lab)`` and ``claims(results)``."""

    id: str
    title: str
    module: str
    cpu_replicas: int = 1  # on a CPU, split it into this many devices (lessons about replicas)


LESSONS = {lesson.id: lesson for lesson in (
    Lesson("01", "TPU initialization", "course_utils.experiments.tpu"),
    Lesson("02", "bfloat16 conversion", "course_utils.experiments.conversion"),
    Lesson("03", "Mixed precision", "course_utils.experiments.precision"),
    Lesson("04", "Data pipelines and sharding", "course_utils.experiments.pipeline", cpu_replicas=4),
    Lesson("05", "Gradient accumulation", "course_utils.experiments.accumulation", cpu_replicas=4),
    Lesson("06", "CIFAR-10 capstone", "course_utils.experiments.capstone"),
    Lesson("07", "Activation memory", "course_utils.experiments.activation_memory"),
    Lesson("08", "Scaling out", "course_utils.experiments.scaling_out"),
)}


class UsageError(Exception):
    """Bad usage of ``prove``: one line, exit 2."""


# ----------------------------------------------------------------------------------------------
# What a lesson's measure() gets
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Lab:
    """What a lesson's ``measure`` runs with: the course config, the runtime (hardware and strategy), and a
    progress callback for long measurements (``lab.progress("timing 5 rounds")`` prints one line)."""

    cfg: Any
    runtime: Any
    progress: Callable[[str], None] = lambda message: None

    @property
    def sizes(self):
        return self.cfg.sizes

    @property
    def jit(self) -> bool:
        """Compile the measured steps with XLA: asked for (COURSE_JIT=1, ``--jit``), or a TPU (always compiles) — the
        notebooks' ``runtime.xla``, for the configuration this Lab was given."""
        return bool(self.cfg.jit or getattr(self.runtime, "kind", "") == "TPU")


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


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what taskset or a container left this process
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _memory_gib() -> float | None:
    try:
        import psutil

        return round(psutil.virtual_memory().total / 2**30, 1)
    except Exception:  # noqa: BLE001 - psutil missing or refused: not worth failing a proof
        return None


def _code_fingerprint() -> str:
    """A hash of course_utils' own source: a proof is redone when the code that measures changed."""
    digest = hashlib.sha256()
    root = pathlib.Path(__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
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
        "accelerator": {"kind": runtime.kind, "name": ", ".join(dict.fromkeys(names)) or "none",
                        "replicas": runtime.num_replicas},
        "cpu": {"model": _cpu_model(), "cores": os.cpu_count(), "usable_cores": _usable_cores(),
                "max_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
                "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default")},
        "memory_gib": _memory_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "course_utils": _code_fingerprint(),
        "xla": bool(cfg.jit or runtime.kind == "TPU"),
        "mode": cfg.mode,
        "data": cfg.data,
    }


def fingerprint(machine: dict) -> str:
    """What must match for a lesson proved earlier to count as proved here (everything but free text)."""
    return hashlib.sha256(json.dumps(machine, sort_keys=True).encode()).hexdigest()[:16]


def machine_line(machine: dict) -> str:
    acc, cpu = machine["accelerator"], machine["cpu"]
    where = f"{acc['kind']} ({acc['name']})" if acc["name"] != "none" else acc["kind"]
    cores = f"{cpu['usable_cores']} of {cpu['cores']} cores" if cpu["usable_cores"] != cpu["cores"] else f"{cpu['cores']} cores"
    extra = [f"oneDNN {'off' if cpu['onednn'] == '0' else 'on'}"]
    if cpu.get("max_isa"):
        extra.append(f"ONEDNN_MAX_CPU_ISA={cpu['max_isa']}")
    replicas = f"{acc['replicas']} replica(s)" + (" (lessons on distribution split it into 4 devices)"
                                                  if acc["kind"] == "CPU" else "")
    return (f"{where}, {replicas} · CPU {cpu['model']}, {cores}, "
            f"{machine['memory_gib']} GiB · {machine['os']} · Python {machine['python']} · TensorFlow "
            f"{machine['tensorflow']} · Keras {machine['keras']} · {machine['mode']} mode, "
            f"{'with' if machine['xla'] else 'without'} XLA, data {machine['data']} · " + ", ".join(extra))


# ----------------------------------------------------------------------------------------------
# One lesson, in the process that measures it
# ----------------------------------------------------------------------------------------------


def run_lesson(lesson_id: str, out_path: str) -> int:
    """The child process: measure one lesson here and write ``{lesson, title, claims, seconds}`` to out_path."""
    lesson = LESSONS[lesson_id]
    start = time.perf_counter()
    import course_utils

    cfg = _config.get()
    runtime = course_utils.detect(cpu_replicas=lesson.cpu_replicas)

    def progress(message: str) -> None:
        print(f"  · {message} ({time.perf_counter() - start:.0f} s)", flush=True)

    module = importlib.import_module(lesson.module)
    results = module.measure(Lab(cfg, runtime, progress))
    claims = module.claims(results)
    for claim in claims:
        claim.lesson = claim.lesson or lesson.id
    out = {"lesson": lesson.id, "title": lesson.title, "seconds": round(time.perf_counter() - start, 1),
           "claims": [c.to_dict() for c in claims]}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)
    return 0


def _describe_here(out_path: str, cpu_replicas: int) -> int:
    import course_utils

    cfg = _config.get()
    machine = describe_machine(course_utils.detect(cpu_replicas=cpu_replicas), cfg)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(machine, f)
    return 0


# ----------------------------------------------------------------------------------------------
# The driver
# ----------------------------------------------------------------------------------------------


def _child_env(args: argparse.Namespace, lesson: Lesson | None) -> dict:
    env = dict(os.environ)
    env["COURSE_SMOKE"] = "1" if args.mode == "smoke" else "0"
    env["COURSE_JIT"] = "1" if args.jit else "0"
    if args.data:
        env["COURSE_DATA"] = args.data
    env["COURSE_CPU_REPLICAS"] = str(lesson.cpu_replicas if lesson else 1)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.pop(report.CLAIMS_DIR_VARIABLE, None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run_child(argv: list[str], env: dict, timeout: float, prefix: str) -> tuple[int | None, list[str]]:
    """Run ``python -m course_utils.proof ARGV``, echoing its output with ``prefix``; (exit code or None on
    timeout, the last lines)."""
    import collections
    import threading

    tail: collections.deque = collections.deque(maxlen=12)
    proc = subprocess.Popen([sys.executable, "-m", "course_utils.proof", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)

    def pump() -> None:
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line.strip():
                tail.append(line)
                if line.startswith("  · "):
                    print(prefix + line, flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    except BaseException:  # Ctrl-C: stop the lesson's process (and whatever it started) too
        _kill(proc)
        raise
    if code is None:
        _kill(proc)
    reader.join(timeout=5)
    return code, list(tail)


def _kill(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (OSError, AttributeError):
        proc.kill()
    proc.wait()


def _load(path: pathlib.Path) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("lessons"), dict) else None


def _write_json(path: pathlib.Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


def report_card(data: dict) -> str:
    """claims.json as Markdown: the machine, then one table per lesson."""
    machine = data.get("machine") or {}
    lines = ["# Claims vs. measured — report card", ""]
    if machine:
        lines += [f"**Machine:** {machine_line(machine)}", ""]
    lines += [f"Written {data.get('written', '')} by `python -m course_utils prove` (course_utils "
              f"{machine.get('course_utils', '?')}).", ""]
    counts: dict[str, int] = {}
    for entry in data["lessons"].values():
        for c in entry.get("claims", []):
            counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
    if counts:
        lines += ["**Verdicts:** " + ", ".join(f"{n} {v}" for v, n in counts.items()), ""]
    for lesson_id in sorted(data["lessons"]):
        entry = data["lessons"][lesson_id]
        lines += [f"## {lesson_id} · {entry.get('title', '')}", ""]
        if entry.get("error"):
            lines += [f"Could not be measured: {entry['error']}", ""]
            continue
        claims = [report.Claim.from_dict(c) for c in entry["claims"]]
        table = report.Table([(c.claim, c.expected, c.measured, c.verdict) for c in claims],
                             ("Claim", "Expected", "Measured here", "Verdict"))
        lines += [table._repr_markdown_(), "", f"_{entry.get('seconds', '?')} s_", ""]
    return "\n".join(lines)


def writable_problem(folder: pathlib.Path) -> str | None:
    """None when ``folder`` exists or can be made, and a file can be written in it; otherwise why not (one line).
    Used for ``--out`` by ``prove`` and ``site``."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        return err.strerror or str(err)
    return None


def _parse(argv: list[str]) -> argparse.Namespace:
    class Parser(argparse.ArgumentParser):
        def error(self, message):  # one line, exit 2 (argparse would print the usage first)
            raise UsageError(message)

    parser = Parser(prog="python -m course_utils prove", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lessons", nargs="+", metavar="NN", help="lessons to prove (default: all): 02 05 …")
    parser.add_argument("--mode", choices=("smoke", "full"), default=None,
                        help="sizes: smoke (tiny, seconds) or full (the lessons' real sizes); default: COURSE_SMOKE")
    parser.add_argument("--jit", action="store_true", help="compile the measured steps with XLA, as a TPU does")
    parser.add_argument("--data", default=None, help="tfds | synthetic | npz:PATH (default: COURSE_DATA, or the mode's)")
    parser.add_argument("--out", default=os.path.join("runs", "proof"), help="folder for claims.json and report.md")
    parser.add_argument("--again", action="store_true", help="measure lessons already proved in --out on this machine")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="seconds one lesson may take (default: 900 in smoke mode, 3600 in full)")
    args = parser.parse_args(argv)
    wanted = args.lessons or sorted(LESSONS)
    lessons = []
    for raw in wanted:
        lesson_id = raw.strip().zfill(2)
        if lesson_id not in LESSONS:
            raise UsageError(f"unknown lesson {raw!r}: prove knows {' '.join(sorted(LESSONS))}")
        if lesson_id not in lessons:
            lessons.append(lesson_id)
    args.lessons = lessons
    if args.mode is None:
        args.mode = _config.get().mode
    if args.data is not None:
        try:
            args.data = _config._parse_data(args.data)
        except _config.ConfigError as e:
            raise UsageError(str(e).replace("COURSE_DATA=", "--data ")) from None
        from .data import file_problem

        problem = file_problem(args.data[4:]) if args.data.startswith("npz:") else None
        if problem is not None:
            raise UsageError(f"--data {args.data}: the file {problem}. Give the path of a CIFAR-10 .npz "
                             "(the README, section Modes, says how to make one), or --data synthetic")
    if args.timeout is None:
        args.timeout = 900.0 if args.mode == "smoke" else 3600.0
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
    out = pathlib.Path(args.out).expanduser()
    problem = writable_problem(out)
    if problem:
        raise UsageError(f"cannot write to --out {str(out)!r}: {problem}")
    args.out = out
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parse(argv)
    except UsageError as e:
        print(f"prove: {e}", file=sys.stderr)
        return 2
    except _config.ConfigError as e:
        print(f"prove: {e}", file=sys.stderr)
        return 2
    try:
        return _prove(args)
    except KeyboardInterrupt:
        print(f"\nprove: interrupted; {args.out / 'claims.json'} keeps the lessons that finished "
              "(run the same command again to go on)", file=sys.stderr)
        return 130


def _prove(args: argparse.Namespace) -> int:
    claims_path, report_path = args.out / "claims.json", args.out / "report.md"
    start = time.perf_counter()

    machine_file = args.out / ".machine.json"
    code, tail = _run_child(["_describe", str(machine_file), "1"], _child_env(args, None), 300, "")
    try:
        machine = json.loads(machine_file.read_text())
        machine_file.unlink()
    except (OSError, ValueError):
        print(f"prove: could not start TensorFlow to describe this machine (exit {code}):", file=sys.stderr)
        print("\n".join(tail[-5:]), file=sys.stderr)
        return 1
    print(f"Proving lessons {' '.join(args.lessons)} on: {machine_line(machine)}", flush=True)
    print(f"Writing {claims_path} and {report_path} after each lesson.", flush=True)

    data = _load(claims_path)
    if data is not None and data.get("fingerprint") != fingerprint(machine):
        old = claims_path.with_name("claims.previous.json")
        os.replace(claims_path, old)
        print(f"{claims_path} was written on another machine, versions or settings: kept as {old.name}, "
              "starting a new one.", flush=True)
        data = None
    if data is None:
        data = {"format": FORMAT_VERSION, "machine": machine, "fingerprint": fingerprint(machine), "lessons": {}}

    for lesson_id in args.lessons:
        lesson = LESSONS[lesson_id]
        previous = data["lessons"].get(lesson_id)
        if previous and not previous.get("error") and not args.again:
            print(f"[{lesson_id}] {lesson.title}: already proved here ({previous.get('written', '')}); "
                  "--again to measure it again", flush=True)
            continue
        print(f"[{lesson_id}] {lesson.title} …", flush=True)
        result_file = args.out / f".lesson-{lesson_id}.json"
        result_file.unlink(missing_ok=True)
        t0 = time.perf_counter()
        code, tail = _run_child(["_lesson", lesson_id, str(result_file)], _child_env(args, lesson), args.timeout,
                                f"[{lesson_id}]")
        entry = None
        if code == 0:
            try:
                entry = json.loads(result_file.read_text())
            except (OSError, ValueError):
                entry = None
        result_file.unlink(missing_ok=True)
        written = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        if entry is None:
            why = (f"did not finish within {args.timeout:g} s (--timeout)" if code is None
                   else f"its process failed (exit {code}): " + " | ".join(tail[-4:]))
            entry = {"lesson": lesson_id, "title": lesson.title, "error": why, "claims": [],
                     "seconds": round(time.perf_counter() - t0, 1)}
            print(f"[{lesson_id}] could not be measured: {why}", flush=True)
        else:
            counts: dict[str, int] = {}
            for c in entry["claims"]:
                counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
            print(f"[{lesson_id}] {len(entry['claims'])} claims in {entry['seconds']:.0f} s: "
                  + ", ".join(f"{n} {v}" for v, n in counts.items()), flush=True)
            for c in entry["claims"]:
                if c["verdict"] == report.WORDS[report.FAILS]:
                    print(f"[{lesson_id}]   ❌ {c['claim']} — expected {c['expected']}, measured {c['measured']}",
                          flush=True)
        entry["written"] = written
        data["lessons"][lesson_id] = entry
        data["written"] = written
        _write_json(claims_path, data)
        report_path.write_text(report_card(data), encoding="utf-8")

    print(f"Done in {time.perf_counter() - start:.0f} s: {claims_path}, {report_path}", flush=True)
    code, summary = exit_status(data, args.lessons)
    if summary:
        print(summary, flush=True)
    return code


def exit_status(data: dict, lessons: list[str]) -> tuple[int, str]:
    """0 when no claim of ``lessons`` in claims.json ``data`` reads "does not hold" and each was measured, else 1;
    with a one-line summary of what failed."""
    failing = [c for lid in lessons for c in data["lessons"].get(lid, {}).get("claims", [])
               if c.get("verdict") == report.WORDS[report.FAILS]]
    unmeasured = [lid for lid in lessons if lid not in data["lessons"] or data["lessons"][lid].get("error")]
    if not failing and not unmeasured:
        return 0, ""
    return 1, (f"{len(failing)} claim(s) do not hold here"
               + (f"; lessons not measured: {' '.join(unmeasured)}" if unmeasured else ""))


def _child_main(argv: list[str]) -> int:
    if argv[:1] == ["_lesson"]:
        return run_lesson(argv[1], argv[2])
    if argv[:1] == ["_describe"]:
        return _describe_here(argv[1], int(argv[2]))
    return main(argv)


if __name__ == "__main__":
    code = _child_main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)  # skip TensorFlow's teardown (seconds): the results are written
