"""Every lesson proves its claims in every mode (issue 8): full mode on synthetic data, and under XLA.

The default ``pytest`` run executes every notebook in smoke mode (nbval, from ``testpaths``). These
slower runs are behind markers, and ``.ci/run`` runs them too:

- ``pytest -m full``: each notebook in full mode (``COURSE_SMOKE=0``) on synthetic data
  (``COURSE_DATA=synthetic``: offline, same sizes as real CIFAR-10);
- ``pytest -m xla``: lessons 02, 03 and 05 in smoke mode with ``COURSE_JIT=1`` (their measured steps
  compiled by XLA, as on a TPU).

A run fails when a cell not tagged ``raises-exception`` raises, or when any output reads
"❌ does not hold here": a claim that fails on this CPU must say why (``report.Claim(differs_here=...)``,
shown as "⚠️ differs on this hardware"), be measured from repeats ("〰️ inconclusive here (noise)" is
allowed: noise is not a verdict), or be fixed.
"""

from __future__ import annotations

import os
import pathlib
import time

import pytest

from course_utils import report

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
XLA_LESSONS = ("02_", "03_", "05_")
FULL_TIMEOUT_S = int(os.environ.get("COURSE_FULL_CELL_TIMEOUT_S", "900"))


def _execute(path: pathlib.Path, env: dict[str, str], monkeypatch) -> tuple[list[str], list[str]]:
    """Execute ``path`` in a fresh kernel with ``env`` set; return (unexpected errors, failed claims)."""
    import nbclient
    import nbformat

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=FULL_TIMEOUT_S, kernel_name="python3", allow_errors=True,
                                     resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    print(f"{path.name} {env}: {time.perf_counter() - start:.0f} s")
    errors, failed = [], []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        expected_error = "raises-exception" in cell.metadata.get("tags", [])
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error" and not expected_error:
                errors.append(f"cell {index}: {out.get('ename')}: {out.get('evalue', '')[:300]}")
            text = out.get("text", "") or "".join(out.get("data", {}).get("text/plain", ""))
            text += "".join(out.get("data", {}).get("text/markdown", ""))
            for line in text.splitlines():
                if report.FAILS in line:
                    failed.append(f"cell {index}: {line.strip()[:300]}")
    return errors, failed


def _claim_rows(failed: list[str]) -> list[str]:
    # The claims table prints as text and as Markdown: the same row can appear twice.
    return sorted(set(failed))


@pytest.mark.full
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_full_mode_on_synthetic_data(path, monkeypatch):
    errors, failed = _execute(path, {"COURSE_SMOKE": "0", "COURSE_DATA": "synthetic"}, monkeypatch)
    assert not errors, "cells raised in full mode:\n" + "\n".join(errors)
    assert not failed, "claims that do not hold in full mode:\n" + "\n".join(_claim_rows(failed))


@pytest.mark.xla
@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name.startswith(XLA_LESSONS)],
                         ids=[p.stem for p in NOTEBOOKS if p.name.startswith(XLA_LESSONS)])
def test_under_xla(path, monkeypatch):
    errors, failed = _execute(path, {"COURSE_SMOKE": "1", "COURSE_JIT": "1"}, monkeypatch)
    assert not errors, "cells raised under XLA:\n" + "\n".join(errors)
    assert not failed, "claims that do not hold under XLA:\n" + "\n".join(_claim_rows(failed))


def test_the_failure_marker_is_what_claims_print():
    """The scan above looks for report.FAILS: a failing claim must print exactly that, and an
    explained or noisy one must not."""
    failing = report.Claim("c", "s", "e", "m", False)
    explained = report.Claim("c", "s", "e", "m", False, differs_here="CPU")
    noisy = report.Claim.from_samples("c", "s", "e", [0.9, 1.1, 1.3], ">", 1.0)
    assert report.FAILS in str(report.ClaimsTable([failing]))
    assert report.FAILS in report.ClaimsTable([failing])._repr_markdown_()
    assert report.FAILS not in str(report.ClaimsTable([explained, noisy]))
    assert report.ClaimsTable([failing, explained, noisy]).unexplained_failures == [failing]
