"""``python -m course_utils doctor``: can this environment run the course, and what exactly fixes it?

Prints one line per check (✔ fine, ! warning, ✘ problem), and under each warning or problem the
exact command that fixes it. Exit code 0 when the course can run — CPU-only counts, an unreachable
dataset is only a warning that names the offline options — and 1 with the reasons otherwise.

Options: ``--offline`` skips the network check (also ``COURSE_OFFLINE=1``); ``-h``/``--help``.

TensorFlow is imported in a child process first: on a CPU without AVX its import dies by SIGILL, with no
Python exception, and the doctor reports that as a problem instead of dying with it.

The doctor is the safety net: whatever the settings or the machine, it prints findings and an exit
code, never a traceback (a bad setting is a finding, an unreadable folder is a finding, a terminal
that cannot print ✔ gets ASCII marks).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import signal
import socket
import subprocess
import sys
from typing import Callable

from . import commandline, processes
from . import config as _config
from .runtime import TPU_INSTALL_FIX, describe_import_failure, in_colab, tpu_hints

PINNED_TF = "2.20"  # the newest TensorFlow with a TPU build (CONTRIBUTING.md §2)
MIN_PYTHON = (3, 11)  # Keras 3.13 and later (Colab's) need Python 3.11
# Where tensorflow-datasets fetches CIFAR-10: its GCS mirror first, then the original host.
DATASET_HOSTS = (("storage.googleapis.com", 443), ("www.cs.toronto.edu", 443))


@dataclasses.dataclass
class Finding:
    level: str  # "ok" | "warn" | "problem"
    name: str
    detail: str
    fix: str = ""

    def render(self, ascii_only: bool = False) -> str:
        mark = ({"ok": "ok", "warn": "!", "problem": "X"} if ascii_only else {"ok": "✔", "warn": "!", "problem": "✘"})[
            self.level
        ]
        text = f"  {mark} {self.name}: {self.detail}"
        if self.fix:
            text += "\n      fix: " + self.fix.replace("\n", "\n           ")
        return text


def _version_of(module: str) -> str | None:
    """The module's ``__version__``, None if it is not installed; an import that fails raises (kept small so
    tests can replace it)."""
    try:
        if importlib.util.find_spec(module) is None:
            return None
    except (ValueError, ImportError):  # a half-imported module left in sys.modules
        pass
    if module == "tensorflow_datasets":
        from ._imports import import_whole  # tfds can swallow its own import error (protobuf clash on Colab)

        mod = import_whole(module)
    else:
        mod = __import__(module)
    return getattr(mod, "__version__", "unknown")


def _checked_version(version_of: Callable[[str], str | None], module: str) -> tuple[str | None, BaseException | None]:
    """``(version, None)``, ``(None, None)`` when not installed, ``(None, error)`` when it fails to import."""
    try:
        return version_of(module), None
    except Exception as exc:  # noqa: BLE001 - e.g. protobuf's VersionError: a finding, never a crash
        return None, exc


# -- an import that kills the process ------------------------------------------------------------------------------
# TensorFlow's pip wheels use AVX from their first instructions: on a CPU without it (pre-2011 Intel/AMD, some low-end
# and emulated CPUs) `import tensorflow` dies by SIGILL, with no Python exception and no message, and the doctor with
# it. So the doctor first imports TensorFlow in a child process and reads how that ended.

IMPORT_PROBE_TIMEOUT_S = 600.0  # a first import on a slow disk takes a minute; a hang is not what the probe looks for
_SIGNAL_WORDS = {
    "SIGILL": "illegal instruction",
    "SIGSEGV": "segmentation fault",
    "SIGBUS": "bus error",
    "SIGABRT": "aborted",
    "SIGFPE": "floating-point exception",
    "SIGKILL": "killed",
}
_WINDOWS_STATUS = {0xC000001D: "SIGILL", 0xC0000005: "SIGSEGV", 0xC0000409: "SIGABRT"}  # NTSTATUS exit codes


def describe_import_death(returncode: int | None, package: str = "TensorFlow") -> tuple[str, str] | None:
    """``(what happened, the fix)`` when a process importing ``package`` was killed by a signal (a negative exit status
    on Linux/macOS, an NTSTATUS code on Windows); None when it exited by itself (0, or 1 after an ImportError, which
    the doctor reports from its own import) or did not run."""
    if not isinstance(returncode, int):
        return None
    name = None
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
    elif (returncode & 0xFFFFFFFF) in _WINDOWS_STATUS:
        name = _WINDOWS_STATUS[returncode & 0xFFFFFFFF]
    if name is None:
        return None
    words = _SIGNAL_WORDS.get(name)
    what = (
        f"importing {package} killed the process ({name}: {words})"
        if words
        else f"importing {package} killed the process ({name})"
    )
    if name == "SIGILL":
        return (
            f"{what} — this CPU lacks instructions {package}'s wheel needs (AVX); use Colab or a newer machine",
            "run the course on Colab (colab.research.google.com: every lesson runs there) or on a machine whose "
            "CPU has AVX (on Linux `grep -m1 -o avx /proc/cpuinfo` prints avx when it has)",
        )
    if name == "SIGKILL":
        return (
            f"{what} — most likely the system ran out of memory (its out-of-memory killer)",
            "close other programs, or use a machine with more memory (Colab's has 12 GB)",
        )
    return (
        f"{what} — a broken or mismatched install, or a library it loads",
        f"{_tf_install_fix()}\nin a fresh virtual environment: python3 -m venv .venv && . .venv/bin/activate",
    )


def _import_exit_status(module: str = "tensorflow", timeout: float = IMPORT_PROBE_TIMEOUT_S) -> int | None:
    """The exit status of a fresh Python that imports ``module`` (negative: a signal killed it); None when the probe is
    not needed or could not run: the module is already imported here (so importing it did not kill this process),
    it is not installed, or the child could not start or ran past ``timeout``."""
    if module in sys.modules:
        return None
    try:
        if importlib.util.find_spec(module) is None:
            return None
    except (ValueError, ImportError):
        pass
    try:
        proc = processes.run([sys.executable, "-c", f"import {module}"], timeout=timeout)
    except (OSError, subprocess.SubprocessError, processes.TimedOut):
        return None
    return proc.returncode


def _tf_install_fix() -> str:
    if tpu_hints():
        return f"{TPU_INSTALL_FIX}\n(this looks like a TPU machine: the TPU build, not plain tensorflow)"
    if in_colab():
        return f'pip install "tensorflow=={PINNED_TF}.0"   (then Runtime → Restart session)'
    return "pip install -r requirements.txt   (from the course folder)"


def _plain_network_error(exc: OSError) -> str:
    """A network error in plain words (not ``gaierror``)."""
    if isinstance(exc, socket.gaierror):
        return "cannot look up the host name (no internet connection or no DNS)"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "no answer in time (a firewall, or a very slow connection)"
    if isinstance(exc, ConnectionRefusedError):
        return "the connection was refused"
    return f"cannot connect ({exc.strerror or exc.__class__.__name__})"


def _dataset_reachable(timeout: float = 3.0, progress: Callable[[str], None] | None = None) -> tuple[bool, str]:
    last = "no host tried"
    for host, port in DATASET_HOSTS:
        if progress:
            progress(f"checking {host} (up to {timeout:g} s)…")
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return True, host
        except OSError as exc:
            last = f"{host}: {_plain_network_error(exc)}"
    return False, last


def _tfds_has_cifar10() -> str | None:
    """Path of an already-downloaded CIFAR-10 in the tfds data dir, if any (None if unreadable)."""
    data_dir = os.environ.get("TFDS_DATA_DIR", os.path.expanduser("~/tensorflow_datasets"))
    path = os.path.join(data_dir, "cifar10")
    try:
        return path if os.path.isdir(path) and os.listdir(path) else None
    except OSError:  # e.g. a folder this user cannot read: not usable, so not "downloaded"
        return None


def _npz_problem(path: str) -> str | None:
    """Why the npz at ``path`` cannot be used by the course, or None if it can: the same checks as
    ``course_utils.data.read_npz`` (the lessons' loader), so the doctor never says "can run" for a file the
    lessons reject."""
    if not os.path.exists(path):
        return f"COURSE_DATA points at {path}, which does not exist"
    if not os.path.isfile(path):
        return f"COURSE_DATA points at {path}, which is not a file"
    try:
        from . import data
    except ImportError:  # no numpy: TensorFlow is missing too, reported above
        return None
    try:
        data.read_npz(path)
    except data.DataSourceError as exc:
        return str(exc).split(" " + data.NPZ_HOWTO)[0]  # the fix line says how to get a good file
    except Exception as exc:  # noqa: BLE001 - the doctor never crashes
        from .runtime import _first_line

        return f"{path} could not be checked ({_first_line(exc)})"
    return None


def run_checks(
    network: bool = True,
    reachable: Callable[[], tuple[bool, str]] | None = None,
    version_of: Callable[[str], str | None] | None = None,
    import_exit_status: Callable[[str], int | None] | None = None,
) -> list[Finding]:
    """All checks, in order. ``reachable``, ``version_of`` and ``import_exit_status`` (how a fresh process importing
    a module ended) are replaceable for tests."""
    version_of = version_of or _version_of
    reachable = reachable or _dataset_reachable
    import_exit_status = import_exit_status or _import_exit_status
    out: list[Finding] = []

    py = sys.version_info
    if (py.major, py.minor) >= MIN_PYTHON:
        out.append(Finding("ok", "Python", f"{py.major}.{py.minor}.{py.micro}"))
    else:
        out.append(
            Finding(
                "problem",
                "Python",
                f"{py.major}.{py.minor} is too old (need ≥ 3.11: Keras 3.13 and later need it)",
                "use Python 3.11, 3.12 or 3.13 (Colab's is fine): python3.12 -m venv .venv",
            )
        )

    try:
        cfg = _config.load()
        out.append(Finding("ok", "Course settings", cfg.describe()))
    except _config.ConfigError as exc:
        out.append(Finding("problem", "Course settings", str(exc), "unset or correct the variable named above"))
        cfg = None

    death = describe_import_death(import_exit_status("tensorflow"))
    tf_version, tf_error = (None, None) if death else _checked_version(version_of, "tensorflow")
    tf_usable = False
    if death:  # importing it here would end the doctor too: everything that imports TensorFlow is skipped
        out.append(Finding("problem", "TensorFlow", *death))
    elif tf_error is not None:
        what, fix = describe_import_failure("tensorflow", tf_error)
        out.append(Finding("problem", "TensorFlow", what.split(" is ", 1)[1], fix))
    elif tf_version is None:
        out.append(Finding("problem", "TensorFlow", "not installed", _tf_install_fix()))
    else:
        major_minor = tuple(int(p) for p in tf_version.split(".")[:2] if p.isdigit())
        if major_minor < (2, 16):
            out.append(
                Finding(
                    "problem",
                    "TensorFlow",
                    f"{tf_version} bundles Keras 2; the course needs Keras 3 (TF ≥ 2.16)",
                    _tf_install_fix(),
                )
            )
        elif not tf_version.startswith(PINNED_TF):
            tf_usable = True
            out.append(
                Finding(
                    "warn",
                    "TensorFlow",
                    f"{tf_version} (the course is tested on {PINNED_TF}.x; most lessons should still run)",
                    _tf_install_fix() if not in_colab() else "",
                )
            )
        else:
            tf_usable = True
            out.append(Finding("ok", "TensorFlow", tf_version))

    keras_version, keras_error = _checked_version(version_of, "keras") if tf_usable else (None, None)
    if tf_usable:
        if keras_error is not None:
            tf_usable = False
            what, fix = describe_import_failure("keras", keras_error)
            out.append(Finding("problem", "Keras", what.split(" is ", 1)[1], fix))
        elif keras_version is None or not keras_version.startswith("3"):
            tf_usable = False
            out.append(
                Finding(
                    "problem",
                    "Keras",
                    f"{keras_version or 'not installed'}; the course needs Keras 3",
                    'pip install "keras>=3.10"',
                )
            )
        else:
            backend = os.environ.get("KERAS_BACKEND", "tensorflow")
            note = (
                "" if backend == "tensorflow" else f" (KERAS_BACKEND={backend}: course_utils switches it to tensorflow)"
            )
            out.append(Finding("ok", "Keras", keras_version + note))

    tfds_version, tfds_error = (None, None) if death else _checked_version(version_of, "tensorflow_datasets")
    if death:
        out.append(
            Finding(
                "warn",
                "tensorflow-datasets",
                "not checked: importing it imports TensorFlow, which cannot start here",
                "fix TensorFlow first (above), then run the doctor again",
            )
        )
    elif tfds_error is not None:
        what, fix = describe_import_failure("tensorflow-datasets", tfds_error)
        out.append(
            Finding(
                "warn",
                "tensorflow-datasets",
                f"{what.split(' is ', 1)[1]}; lesson 04 on cannot load real CIFAR-10 with it",
                f"{fix}\nor do without it: COURSE_DATA=npz:/path/cifar10.npz or COURSE_DATA=synthetic",
            )
        )
    elif tfds_version is None:
        out.append(
            Finding(
                "warn",
                "tensorflow-datasets",
                "not installed (needed from lesson 04 on for real CIFAR-10)",
                'pip install "tensorflow-datasets>=4.9"',
            )
        )
    else:
        out.append(Finding("ok", "tensorflow-datasets", tfds_version))

    hints = tpu_hints()
    if tf_usable and cfg is None:
        out.append(
            Finding(
                "warn",
                "Accelerator",
                "not checked: fix the course setting above first",
                "unset or correct the variable named above, then run the doctor again",
            )
        )
    elif tf_usable:
        from . import runtime

        rt = runtime.detect(use_cache=False)
        why = "; ".join(rt.fallbacks) or "nothing to fall back from"
        accelerator_fix = (
            "in Colab: Runtime → Change runtime type → v5e-1 TPU (or a GPU), then run the notebook "
            "again; elsewhere nothing to do: every lesson runs on a CPU, only slower"
        )
        if rt.kind == "TPU":
            out.append(Finding("ok", "Accelerator", f"TPU, {rt.num_replicas} replica(s)"))
        elif hints:
            out.append(
                Finding(
                    "warn",
                    "Accelerator",
                    f"{rt.kind} — a TPU seems attached ({hints[0]}) but did not connect. Fell back: {why}",
                    TPU_INSTALL_FIX,
                )
            )
        elif cfg.device == "tpu":
            out.append(
                Finding(
                    "warn",
                    "Accelerator",
                    f"COURSE_DEVICE=tpu, but no TPU was found; using {rt.kind}. Fell back: {why}",
                    "in Colab: Runtime → Change runtime type → v5e-1 TPU; or unset COURSE_DEVICE to use what "
                    "this machine has",
                )
            )
        else:
            out.append(
                Finding(
                    "warn" if rt.kind == "CPU" else "ok",
                    "Accelerator",
                    f"{rt.kind}, {rt.num_replicas} replica(s). Fell back: {why}"
                    + (
                        " — the course runs on CPU, slower; timings will differ from TPU/GPU"
                        if rt.kind == "CPU"
                        else ""
                    ),
                    accelerator_fix if rt.kind == "CPU" else "",
                )
            )
        if rt.kind == "CPU":  # which CPU kernels the lessons run on: they differ in speed more than most choices
            from . import hardware

            path, why = hardware.kernel_path()
            out.append(Finding("ok", "CPU kernels", f"{path} — {hardware.KERNEL_PATHS[path]['what']} ({why})"))
        import tensorflow as tf

        has_tpu_support = bool(tf.config.list_physical_devices("TPU")) or importlib.util.find_spec("libtpu") is not None
        if has_tpu_support:
            out.append(Finding("ok", "TPU support in this TensorFlow", "yes (libtpu found)"))
        elif hints:
            out.append(
                Finding("warn", "TPU support in this TensorFlow", "no, on a machine with a TPU", TPU_INSTALL_FIX)
            )
        else:
            out.append(Finding("ok", "TPU support in this TensorFlow", "no (only needed on a TPU runtime)"))

    offline_options = (
        "offline options: COURSE_DATA=synthetic (generated CIFAR-shaped data) or "
        "COURSE_DATA=npz:/path/cifar10.npz (a pre-downloaded copy); or run tfds once on a connected "
        "machine and copy ~/tensorflow_datasets/cifar10 here"
    )
    cached = _tfds_has_cifar10()
    if cached:
        out.append(Finding("ok", "Dataset", f"CIFAR-10 already downloaded at {cached}"))
    elif not network or os.environ.get("COURSE_OFFLINE", "").strip() in _config.TRUE_WORDS:
        out.append(Finding("warn", "Dataset", "source not checked (offline mode)", offline_options))
    else:
        ok, where = reachable()
        if ok:
            out.append(Finding("ok", "Dataset", f"CIFAR-10 source reachable ({where})"))
        elif cfg is not None and cfg.data != "tfds":  # smoke mode or a chosen file: the download is not needed
            out.append(
                Finding(
                    "ok",
                    "Dataset",
                    f"CIFAR-10 source not reachable ({where}); not needed with "
                    f"data={cfg.data} (full mode's tfds download would need it)",
                )
            )
        else:
            out.append(Finding("warn", "Dataset", f"CIFAR-10 source not reachable ({where})", offline_options))
    if cfg is not None and cfg.data.startswith("npz:"):
        problem = _npz_problem(os.path.expanduser(cfg.data[4:]))
        if problem:
            out.append(
                Finding(
                    "problem",
                    "Dataset",
                    problem,
                    "point COURSE_DATA at a course npz (course_utils.data.write_npz makes one), "
                    "or use COURSE_DATA=synthetic / tfds",
                )
            )
    return out


USAGE = "usage: python -m course_utils doctor [--offline] [-h]"
HELP = f"""{USAGE}

Checks Python, the course settings (COURSE_* variables), TensorFlow/Keras, the accelerator and TPU
support, and whether CIFAR-10 can be loaded; prints the exact fix under each warning or problem.
Exit code 0 when the course can run here (CPU-only counts), 1 otherwise.

  --offline   skip the network check (also COURSE_OFFLINE=1)
  -h, --help  show this help"""


def _can_print(text: str) -> bool:
    encoding = getattr(sys.stdout, "encoding", None) or "ascii"
    try:
        text.encode(encoding)
        return True
    except (UnicodeEncodeError, LookupError):
        return False


def main(argv: list[str] | None = None) -> int:
    """``python -m course_utils doctor [--offline]``: 0 the course can run, 1 it cannot yet, 2 bad usage, 130 Ctrl-C
    (:func:`course_utils.commandline.run`)."""
    return commandline.run("doctor", lambda: _main(list(sys.argv[1:] if argv is None else argv)))


def _main(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        print(HELP)
        return 0
    unknown = [a for a in argv if a not in ("--offline",)]
    if unknown:
        raise commandline.UsageError(f"unknown option(s) {' '.join(unknown)}; {USAGE}")
    ascii_only = not _can_print("✔✘—→·…×≥")
    if ascii_only:  # e.g. a cp1252 or ASCII terminal: replace what it cannot show instead of crashing
        try:
            sys.stdout.reconfigure(errors="replace")
        except (AttributeError, ValueError):
            pass
    print("course_utils doctor — can this environment run the course?")
    network = "--offline" not in argv and os.environ.get("COURSE_OFFLINE", "").strip().lower() not in _config.TRUE_WORDS
    if network:

        def progress(line):
            print(f"  … {line}", flush=True)

        findings = run_checks(network=True, reachable=lambda: _dataset_reachable(progress=progress))
    else:
        findings = run_checks(network=False)
    for f in findings:
        print(f.render(ascii_only))
    problems = [f for f in findings if f.level == "problem"]
    warnings = [f for f in findings if f.level == "warn"]
    if problems:
        print(
            f"Result: cannot run the course yet — {len(problems)} problem(s): "
            + "; ".join(f"{p.name}: {p.detail}" for p in problems)
        )
        return 1
    print(f"Result: the course can run here ({len(warnings)} warning(s)).")
    return 0


if __name__ == "__main__":  # python -m course_utils.doctor: the same as python -m course_utils doctor
    sys.exit(main())
