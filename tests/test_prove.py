"""``python -m course_utils prove``: one command that measures lessons' claims on this hardware without Jupyter and
writes claims.json (claims as data, with the machine) and report.md; exit 0 / 1 / 2; an interrupted run keeps what
finished, and a lesson proved on the same machine and versions is not measured again."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from course_utils import proof, report

ROOT = pathlib.Path(__file__).resolve().parents[1]
KEYS = {"lesson", "claim", "expected", "measured", "verdict", "reason", "samples"}


def _prove(*args: str, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, COURSE_SMOKE="1")
    env.pop("COURSE_CLAIMS_DIR", None)
    return subprocess.run([sys.executable, "-m", "course_utils", "prove", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=kwargs.get("timeout", 600))


@pytest.mark.parametrize("args, message", [
    (["--lessons", "99"], "unknown lesson '99'"),
    (["--lessons", "02", "--out", "{file}/sub"], "cannot write to --out"),
    (["--data", "npz:/no/such/file.npz"], "--data npz:/no/such/file.npz: the file does not exist"),
    (["--data", "kaggle"], "--data 'kaggle' is not a data source"),
    (["--timeout", "-1"], "--timeout must be a positive number"),
    (["--mode", "fast"], "invalid choice: 'fast'"),
])
def test_bad_usage_is_one_line_and_exit_2(tmp_path, args, message):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    args = [a.format(file=a_file) for a in args]
    proc = _prove(*args, *([] if "--out" in args else ["--out", str(tmp_path / "out")]), timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr and "Traceback" not in proc.stderr + proc.stdout
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_every_lesson_is_known_and_measurable():
    import importlib

    assert sorted(proof.LESSONS) == ["01", "02", "03", "04", "05", "06", "07", "08"]
    for lesson in proof.LESSONS.values():
        module = importlib.import_module(lesson.module)
        assert callable(module.measure) and callable(module.claims), lesson


def test_exit_status_counts_failed_claims_and_unmeasured_lessons():
    ok = report.Claim("a", "§1", "x", "x", True, lesson="02").to_dict()
    bad = report.Claim("b", "§1", "x", "y", False, lesson="02").to_dict()
    differs = report.Claim("c", "§1", "x", "y", False, differs_here="CPU", lesson="02").to_dict()
    assert proof.exit_status({"lessons": {"02": {"claims": [ok, differs]}}}, ["02"]) == (0, "")
    code, summary = proof.exit_status({"lessons": {"02": {"claims": [ok, bad]}}}, ["02"])
    assert code == 1 and summary.startswith("1 claim(s) do not hold")
    code, summary = proof.exit_status({"lessons": {"02": {"claims": [ok]}, "05": {"error": "timeout"}}}, ["02", "05"])
    assert code == 1 and "lessons not measured: 05" in summary


def test_report_card_has_a_table_per_lesson_and_the_machine():
    machine = {"accelerator": {"kind": "CPU", "name": "none", "replicas": 1},
               "cpu": {"model": "Some CPU", "cores": 2, "usable_cores": 1, "max_isa": "AVX2", "onednn": "0"},
               "memory_gib": 8.0, "os": "Linux", "python": "3.11", "tensorflow": "2.20.0", "keras": "3.15.1",
               "course_utils": "abc", "xla": True, "mode": "smoke", "data": "synthetic"}
    claim = report.Claim("A claim", "§1", "< 1", "0.5", True, lesson="05").to_dict()
    card = proof.report_card({"machine": machine, "lessons": {"05": {"title": "Gradient accumulation",
                                                                     "claims": [claim], "seconds": 3},
                                                              "02": {"title": "bf16", "error": "timed out"}}})
    assert "Some CPU, 1 of 2 cores" in card and "with XLA" in card and "ONEDNN_MAX_CPU_ISA=AVX2" in card
    assert "oneDNN off" in card
    assert card.index("## 02") < card.index("## 05") and "Could not be measured: timed out" in card
    assert "| A claim | < 1 | 0.5 | ✅ holds |" in card


@pytest.mark.extended  # two lessons measured twice (16 s): .ci/run runs it after the README's pytest
def test_prove_two_lessons_interrupted_then_resumed(tmp_path):
    """Two lessons in smoke mode (03 and 02, the quickest with memory claims from repeats). Interrupted (Ctrl-C)
    after the first lesson, the folder keeps it; run again, it is skipped and only 02 is measured. A claims.json
    from other settings is kept aside, not mixed in."""
    out = tmp_path / "proof"
    out.mkdir()
    (out / "claims.json").write_text(json.dumps({"fingerprint": "another machine", "lessons": {"03": {}}}))
    env = dict(os.environ, COURSE_SMOKE="1")
    env.pop("COURSE_CLAIMS_DIR", None)
    # Ctrl-C's SIGINT must reach the driver as a terminal sends it: a runner may start tests with SIGINT ignored
    # (Python then keeps it ignored in the processes it starts), so the driver gets the default disposition
    driver = subprocess.Popen([sys.executable, "-m", "course_utils", "prove", "--lessons", "3", "02", "--out", str(out)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    deadline = time.monotonic() + 300
    for line in driver.stdout:
        lines.append(line)
        if line.startswith("[02] bfloat16 conversion …"):
            driver.send_signal(signal.SIGINT)  # Ctrl-C while lesson 02 measures
            break
        assert time.monotonic() < deadline, "".join(lines)
    rest, _ = driver.communicate(timeout=60)
    assert driver.returncode == 130, "".join(lines) + rest
    assert "keeps the lessons that finished" in rest and "Traceback" not in rest
    assert json.loads((out / "claims.previous.json").read_text())["fingerprint"] == "another machine"
    first = json.loads((out / "claims.json").read_text())
    assert set(first["lessons"]) == {"03"}

    proc = _prove("--lessons", "03", "02", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[03] Mixed precision: already proved here" in proc.stdout
    data = json.loads((out / "claims.json").read_text())
    assert data["lessons"]["03"] == first["lessons"]["03"]  # not measured again
    machine = data["machine"]
    assert {"accelerator", "cpu", "memory_gib", "os", "python", "tensorflow", "keras", "xla", "mode"} <= set(machine)
    assert machine["mode"] == "smoke" and machine["xla"] is False and machine["cpu"]["cores"] >= 1
    for lesson_id in ("02", "03"):
        claims = data["lessons"][lesson_id]["claims"]
        assert len(claims) >= 10 and all(KEYS <= set(c) and c["lesson"] == lesson_id for c in claims)
        assert all(c["verdict"] in set(report.WORDS.values()) for c in claims)
    memory_claims = [c for c in data["lessons"]["02"]["claims"] if "peak memory" in c["claim"]]
    assert len(memory_claims) == 2 and all(len(c["samples"]) == 3 for c in memory_claims)  # from repeats: kept
    card = (out / "report.md").read_text()
    assert "## 02 · bfloat16 conversion" in card and "## 03 · Mixed precision" in card
