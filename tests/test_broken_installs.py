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
    proc = subprocess.run([sys.executable, "-m", "course_utils", "prove", "--lessons", "01", "--out",
                           str(tmp_path / "cards")], env=_broken_tensorflow(tmp_path, how), capture_output=True,
                          text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr)
    expected = ("TensorFlow could not be imported (ImportError: libtensorflow_framework.so.2" if how == "ImportError"
                else "it died of SIGABRT (while importing TensorFlow?)")
    assert lines[0].startswith("prove: the fork server could not start course_utils.proof: ") and expected in lines[0]
    assert lines[0].endswith("check the install: python -m course_utils doctor"), lines[0]


@pytest.mark.parametrize("how", ["ImportError", "RuntimeError"])
def test_capstone_where_tensorflow_does_not_import_is_one_line(tmp_path, how):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "course_utils.capstone", "--data", "synthetic", "--epochs", "1",
                           "--out", str(out), "--quiet"], env=_broken_tensorflow(tmp_path, how), capture_output=True,
                          text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr)
    assert lines[0].startswith(f"capstone: error: TensorFlow could not be imported ({how}: "), lines[0]
    assert not out.exists()  # nothing written


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_stdout_is_one_line_on_stderr_not_a_traceback_or_blame_on_out(tmp_path):
    """`doctor > /dev/full` ended in an OSError traceback; `prove > /dev/full` said it could not write --out."""
    with open("/dev/full", "w") as full:
        doctor = subprocess.run([sys.executable, "-m", "course_utils", "doctor", "--offline"], stdout=full,
                                stderr=subprocess.PIPE, text=True, timeout=300)
        prove = subprocess.run([sys.executable, "-m", "course_utils", "prove", "--lessons", "01", "--out",
                                str(tmp_path / "cards")], stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    assert doctor.returncode == 1 and doctor.stderr.strip() == "doctor: cannot write its output: No space left on device"
    lines = prove.stderr.strip().splitlines()
    assert prove.returncode == 1 and len(lines) == 1 and "Traceback" not in prove.stderr, prove.stderr
    assert lines[0].startswith("prove: cannot write its output: No space left on device; "), lines[0]
    assert "cannot write " + str(tmp_path) not in lines[0]  # --out is not blamed
