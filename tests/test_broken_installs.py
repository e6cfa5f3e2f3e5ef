"""Issue 51 (the fifth hostile pass): `prove` and `capstone` where TensorFlow does not import, and commands whose own
output cannot be written — each one line and an exit status, never a traceback, each in a fresh process as a
learner meets it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

BROKEN = {
    "ImportError": 'raise ImportError("libtensorflow_framework.so.2: cannot open shared object file")',
    "RuntimeError": 'raise RuntimeError("module compiled against ABI version 0x1000009 but this version of numpy")',
    "SIGABRT": "import os\nos.abort()",
    "SIGILL": "import os, signal\nos.kill(os.getpid(), signal.SIGILL)",  # a CPU without AVX: the first instruction
}


def _broken_tensorflow(tmp_path, how: str) -> dict:
    package = tmp_path / "fake" / "tensorflow"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(BROKEN[how] + "\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "fake"), os.environ.get("PYTHONPATH", "")]))


@pytest.mark.parametrize("how", ["ImportError", "SIGABRT"])
def test_prove_where_tensorflow_does_not_import_is_one_line(tmp_path, how):
    """It was "the fork server could not start course_utils.proof" with the server's nested traceback (or nothing
    after the colon when the import crashed)."""
    proc = subprocess.run(
        [sys.executable, "-m", "course_utils", "prove", "--lessons", "01", "--out", str(tmp_path / "cards")],
        env=_broken_tensorflow(tmp_path, how),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr)
    expected = (
        "TensorFlow could not be imported (ImportError: libtensorflow_framework.so.2"
        if how == "ImportError"
        else "it died of SIGABRT (while importing TensorFlow?)"
    )
    assert lines[0].startswith("prove: the fork server could not start course_utils.proof: ") and expected in lines[0]
    assert lines[0].endswith("check the install: python -m course_utils doctor"), lines[0]


@pytest.mark.parametrize("how", ["ImportError", "RuntimeError"])
def test_capstone_where_tensorflow_does_not_import_is_one_line(tmp_path, how):
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "course_utils.capstone",
            "--data",
            "synthetic",
            "--epochs",
            "1",
            "--out",
            str(out),
            "--quiet",
        ],
        env=_broken_tensorflow(tmp_path, how),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr)
    assert lines[0].startswith(f"capstone: error: TensorFlow could not be imported ({how}: "), lines[0]
    assert not out.exists()  # nothing written


@pytest.mark.skipif(os.name != "posix", reason="signals: POSIX")
@pytest.mark.parametrize("how", ["SIGABRT", "SIGILL"])
def test_capstone_killed_by_the_tensorflow_import_says_one_line(tmp_path, how):
    """It ended with exit 134/132 and not a word on stderr (a shell adds "Illegal instruction"; a notebook's `!` cell
    or a script's subprocess nothing): the process that dies cannot speak, so a watcher forked before the import says
    it — and says nothing when the import succeeds (every other capstone test)."""
    import signal

    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "course_utils.capstone",
            "--data",
            "synthetic",
            "--epochs",
            "1",
            "--out",
            str(out),
            "--quiet",
        ],
        env=_broken_tensorflow(tmp_path, how),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -getattr(signal, how), (proc.returncode, proc.stderr)  # the crash's own exit, kept
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0] == (
        "capstone: error: importing TensorFlow killed this process (a crash in its native code, no Python error); "
        "python -m course_utils doctor says why"
    ), proc.stderr
    # nothing written but the lock's file (the lock itself died with the process): the same command runs once fixed
    assert not out.exists() or [p.name for p in out.iterdir()] == [".lock"]


def test_the_crash_watcher_is_silent_when_the_block_ends_in_any_way(tmp_path):
    """In a fresh process (no TensorFlow imported): leaving the block normally or by an exception says nothing, and
    no watcher outlives it; dying inside the block (os._exit from native code stands in) says the line."""
    script = tmp_path / "w.py"
    script.write_text(
        "import os, sys\n"
        "from course_utils import processes\n"
        "how = sys.argv[1]\n"
        "try:\n"
        "    with processes.crash_said('the line'):\n"
        "        if how == 'raise':\n"
        "            raise ValueError('x')\n"
        "        if how == 'die':\n"
        "            os.kill(os.getpid(), 9)\n"
        "except ValueError:\n"
        "    pass\n"
        "print('after')\n"
    )
    said = {}
    for how in ("ok", "raise", "die"):
        proc = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=60)
        said[how] = (proc.returncode, proc.stdout.strip(), proc.stderr.strip())
    assert said == {"ok": (0, "after", ""), "raise": (0, "after", ""), "die": (-9, "", "the line")}, said


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_stdout_is_one_line_on_stderr_not_a_traceback_or_blame_on_out(tmp_path):
    """`doctor > /dev/full` ended in an OSError traceback; `prove > /dev/full` said it could not write --out."""
    with open("/dev/full", "w") as full:
        doctor = subprocess.run(
            [sys.executable, "-m", "course_utils", "doctor", "--offline"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
        prove = subprocess.run(
            [sys.executable, "-m", "course_utils", "prove", "--lessons", "01", "--out", str(tmp_path / "cards")],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    assert (
        doctor.returncode == 1 and doctor.stderr.strip() == "doctor: cannot write its output: No space left on device"
    )
    lines = prove.stderr.strip().splitlines()
    assert prove.returncode == 1 and len(lines) == 1 and "Traceback" not in prove.stderr, prove.stderr
    assert lines[0].startswith("prove: cannot write its output: No space left on device; "), lines[0]
    assert "cannot write " + str(tmp_path) not in lines[0]  # --out is not blamed
