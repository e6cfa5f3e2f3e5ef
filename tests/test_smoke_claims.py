"""The repo's conftest fails a notebook cell that saved a claim whose verdict is "does not hold", in smoke mode (the
README's pytest runs every notebook that way; full mode and XLA: ``python -m course_utils prove``). It reads the
claims a ``report.ClaimsTable`` saves as JSON to ``$COURSE_CLAIMS_DIR`` — never the cell's printed output."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import nbformat

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run_nbval(tmp_path: pathlib.Path, *cells: str) -> subprocess.CompletedProcess:
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from course_utils import report")]
    nb.cells += [nbformat.v4.new_code_cell(source) for source in cells]
    nbformat.write(nb, tmp_path / "claims.ipynb")
    env = dict(os.environ, COURSE_SMOKE="1", COURSE_CLAIMS_DIR=str(tmp_path / "claims"))
    return subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env",
                           "-p", "no:cacheprovider", "-q", "claims.ipynb"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def _table(holds: str, lesson: str = "05") -> str:
    return f'report.ClaimsTable([report.Claim("A claim", "§1", "> 1", "0.5", {holds}, "a reason", lesson="{lesson}")])'


def test_a_claim_that_does_not_hold_fails_its_cell_in_smoke_mode(tmp_path):
    proc = _run_nbval(tmp_path, _table("False"), "1 + 1")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "1 failed, 2 passed" in proc.stdout, proc.stdout[-3000:]  # the table's cell, not the one after it
    assert "does not hold in smoke mode" in proc.stdout
    assert "- 05 A claim: expected > 1, measured 0.5 (a reason)" in proc.stdout, proc.stdout[-3000:]
    assert (tmp_path / "claims" / "claims-05.json").is_file()


def test_the_verdict_is_read_from_the_saved_claims_not_the_output(tmp_path):
    # a failing claim whose table prints nothing still fails; printed text that looks like one does not
    proc = _run_nbval(tmp_path, "_ = " + _table("False", lesson=""))
    assert proc.returncode == 1 and "1 failed" in proc.stdout, proc.stdout[-3000:]
    assert (tmp_path / "claims" / "claims-notebook.json").is_file()
    proc = _run_nbval(tmp_path, f'print("A claim | ❌ does not hold here")\n{_table("True")}')
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_a_claim_not_measurable_here_passes(tmp_path):
    proc = _run_nbval(tmp_path, _table("None"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "2 passed" in proc.stdout
