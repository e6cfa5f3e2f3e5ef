"""The repo's conftest fails a notebook cell whose output has a claim reading "❌ does not hold here" in smoke
mode (the README's pytest runs every notebook that way; full mode and XLA are checked by test_notebook_modes)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import nbformat

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run_nbval(tmp_path: pathlib.Path, holds: str) -> subprocess.CompletedProcess:
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("from course_utils import report"),
        nbformat.v4.new_code_cell(
            f'report.ClaimsTable([report.Claim("A claim", "§1", "> 1", "0.5", {holds}, "a reason")])'),
    ]
    nbformat.write(nb, tmp_path / "claims.ipynb")
    env = dict(os.environ, COURSE_SMOKE="1")
    return subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env",
                           "-p", "no:cacheprovider", "-q", "claims.ipynb"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_a_claim_that_does_not_hold_fails_its_cell_in_smoke_mode(tmp_path):
    proc = _run_nbval(tmp_path, "False")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout[-3000:]
    assert "does not hold in smoke mode" in proc.stdout
    assert "A claim | §1 | > 1 | 0.5 | ❌ does not hold here" in proc.stdout, proc.stdout[-3000:]


def test_a_claim_not_measurable_here_passes(tmp_path):
    proc = _run_nbval(tmp_path, "None")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "2 passed" in proc.stdout
