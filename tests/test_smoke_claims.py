"""The repo's conftest fails a notebook cell that saved a claim whose verdict is "does not hold", in smoke mode (the
README's pytest runs every notebook that way; full mode and XLA: ``python -m course_utils prove``). It reads the
claims a ``report.ClaimsTable`` saves as JSON to ``$COURSE_CLAIMS_DIR`` — never the cell's printed output."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run_nbval(tmp_path: pathlib.Path, *cells: str) -> subprocess.CompletedProcess:
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from course_utils import report")]
    nb.cells += [nbformat.v4.new_code_cell(source) for source in cells]
    nbformat.write(nb, tmp_path / "claims.ipynb")
    env = dict(os.environ, COURSE_SMOKE="1", COURSE_CLAIMS_DIR=str(tmp_path / "claims"))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--nbval-lax",
            "--nbval-current-env",
            "-p",
            "no:cacheprovider",
            "-q",
            "claims.ipynb",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _table(holds: str, lesson: str = "05", id: str = "05.a_claim") -> str:
    return (
        f'report.ClaimsTable([report.Claim("A claim", "§1", "> 1", "0.5", {holds}, "a reason", lesson="{lesson}", '
        f'id="{id}")])'
    )


def test_a_claim_that_does_not_hold_fails_its_cell_in_smoke_mode(tmp_path):
    proc = _run_nbval(tmp_path, _table("False"), "1 + 1")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "1 failed, 2 passed" in proc.stdout, proc.stdout[-3000:]  # the table's cell, not the one after it
    assert "does not hold in smoke mode" in proc.stdout
    assert "- 05.a_claim: expected > 1, measured 0.5 (a reason)" in proc.stdout, proc.stdout[-3000:]  # by its id
    assert (tmp_path / "claims" / "claims-05.json").is_file()


def test_the_verdict_is_read_from_the_saved_claims_not_the_output(tmp_path):
    # a failing claim whose table prints nothing still fails; printed text that looks like one does not
    proc = _run_nbval(tmp_path, "_ = " + _table("False", lesson=""))
    assert proc.returncode == 1 and "1 failed" in proc.stdout, proc.stdout[-3000:]
    assert (tmp_path / "claims" / "claims-notebook.json").is_file()
    proc = _run_nbval(tmp_path, f'print("A claim | ❌ does not hold here")\n{_table("True")}')
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_a_saved_claim_with_an_unknown_verdict_fails_its_cell_naming_it(tmp_path):
    """A verdict word conftest does not know (a typo, a newer card format) is not taken as a pass."""
    write = (
        "import json, os\n"
        "json.dump([{'id': '05.odd', 'claim': 'odd', 'verdict': 'mostly holds'}], "
        "open(os.path.join(os.environ['COURSE_CLAIMS_DIR'], 'claims-05.json'), 'w'))"
    )
    proc = _run_nbval(tmp_path, "import os; os.makedirs(os.environ['COURSE_CLAIMS_DIR'], exist_ok=True)", write)
    assert proc.returncode == 1 and "1 failed" in proc.stdout, proc.stdout[-3000:]
    assert "- 05.odd: unknown verdict 'mostly holds'" in proc.stdout, proc.stdout[-3000:]


def test_a_claim_not_measurable_here_passes(tmp_path):
    proc = _run_nbval(tmp_path, _table("None"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "2 passed" in proc.stdout


@pytest.mark.extended  # two pytest-xdist workers and a kernel (~6 s)
def test_under_xdist_unit_tests_wait_while_a_notebook_that_uses_every_core_runs(tmp_path):
    """Lesson 04 times pipelines on every core: while a notebook of ``ALL_CORES_NOTEBOOKS`` runs, the unit-test worker
    starts no test (one already running finishes); before and after it, the tests run beside the notebooks."""
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    stamp = "import time; open({!r}, 'a').write(f'{{time.time()}}\\n')"
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(stamp.format(str(tmp_path / "start"))),
        nbformat.v4.new_code_cell("import time; time.sleep(4)"),
        nbformat.v4.new_code_cell(stamp.format(str(tmp_path / "end"))),
    ]
    nbformat.write(nb, tmp_path / "busy.ipynb")
    (tmp_path / "test_unit.py").write_text(
        "import time\n"
        + "".join(
            f"def test_{i}():\n    open({str(tmp_path / 'units')!r}, 'a').write(f'{{time.time()}}\\n')\n"
            "    time.sleep(0.3)\n"
            for i in range(16)
        )
    )
    env = dict(os.environ, COURSE_SMOKE="1", COURSE_ALL_CORES_NOTEBOOKS="busy.ipynb")
    env.pop("COURSE_CLAIMS_DIR", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--nbval-lax",
            "--nbval-current-env",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            "busy.ipynb",
            "test_unit.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    start, end = (float((tmp_path / name).read_text()) for name in ("start", "end"))
    units = [float(t) for t in (tmp_path / "units").read_text().split()]
    assert len(units) == 16
    during = [t for t in units if start + 0.5 < t < end]  # a test started just before the flag may still be running
    assert not during, (start, end, units)
    assert any(t > end for t in units) and max(units) < end + 20, (start, end, units)  # they went on after it, at once


@pytest.mark.extended  # two pytest-xdist workers and two kernels (~15 s)
def test_under_xdist_notebooks_share_one_worker_and_a_failing_claim_still_fails_its_cell(tmp_path):
    """The README's pytest runs on every usable core (pytest-xdist, ``-n auto``): every notebook on one worker, in
    order, and each worker reads the claims its own kernels saved (a claims folder per worker)."""
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    for name, cells in {
        "a.ipynb": ["x = 1", _table("True")],
        "b.ipynb": ["y = 2", _table("False", lesson="07", id="07.a_claim")],
    }.items():
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell("from course_utils import report")]
        nb.cells += [nbformat.v4.new_code_cell(source) for source in cells]
        nbformat.write(nb, tmp_path / name)
    (tmp_path / "test_unit.py").write_text("".join(f"def test_{i}():\n    assert True\n" for i in range(6)))
    env = dict(os.environ, COURSE_SMOKE="1")
    env.pop("COURSE_CLAIMS_DIR", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--nbval-lax",
            "--nbval-current-env",
            "-p",
            "no:cacheprovider",
            "-v",
            "-n",
            "2",
            "a.ipynb",
            "b.ipynb",
            "test_unit.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout[-3000:]
    workers = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"\[(gw\d+)\] \[\s*\d+%\] (\w+) (\S+?)::", line)
        if m:
            workers.setdefault(m.group(3).removesuffix(".ipynb"), set()).add(m.group(1))  # xdist shows a::ipynb::…
    notebooks = workers.get("a", set()) | workers.get("b", set())
    assert len(notebooks) == 1, workers  # every cell of both notebooks on one worker
    assert re.search(r"FAILED b(\.|::)ipynb::Cell 2", proc.stdout) and "1 failed" in proc.stdout, proc.stdout[-3000:]
    assert "- 07.a_claim: expected > 1, measured 0.5 (a reason)" in proc.stdout, proc.stdout[-3000:]


def test_the_notebooks_that_use_every_core_run_first_and_the_rest_keep_their_order(monkeypatch):
    """Unit tests wait only while no test has begun beside an earlier notebook: the all-cores notebooks first."""
    import types

    import conftest

    monkeypatch.setenv("COURSE_ALL_CORES_NOTEBOOKS", "04_b.ipynb")
    ids = [
        "tests/test_a.py::test_1",
        "notebooks/01_a.ipynb::Cell 0",
        "notebooks/01_a.ipynb::Cell 1",
        "notebooks/04_b.ipynb::Cell 0",
        "notebooks/04_b.ipynb::Cell 1",
        "tests/test_z.py::test_2",
        "notebooks/05_c.ipynb::Cell 0",
    ]
    items = [types.SimpleNamespace(nodeid=i) for i in ids]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == [ids[3], ids[4], ids[0], ids[1], ids[2], ids[5], ids[6]]
    monkeypatch.setenv("COURSE_ALL_CORES_NOTEBOOKS", "")  # none: the order as collected
    items = [types.SimpleNamespace(nodeid=i) for i in ids]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == ids
