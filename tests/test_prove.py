"""``python -m course_utils prove``: one command that measures lessons' claims on this hardware without Jupyter and
writes claims.json (claims as data, with the machine) and report.md; exit 0 / 1 / 2; an interrupted run keeps what
finished, and a lesson proved on the same machine and versions is not measured again."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from course_utils import lessons, proof, report

ROOT = pathlib.Path(__file__).resolve().parents[1]
KEYS = {"id", "lesson", "claim", "expected", "measured", "verdict", "reason", "samples"}


def _prove(*args: str, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, COURSE_SMOKE="1")
    env.pop("COURSE_CLAIMS_DIR", None)
    return subprocess.run(
        [sys.executable, "-m", "course_utils", "prove", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=kwargs.get("timeout", 600),
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--lessons", "99"], "unknown lesson '99'"),
        (["--lessons", "02", "--out", "{file}/sub"], "cannot write to --out"),
        (["--lessons", "02", "--out", "{file}"], "it exists and is not a folder"),
        (["--lessons", "02", "--out", "{fifo}"], "it exists and is not a folder"),
        (["--lessons", "02", "--out", ""], "the folder name is empty"),
        (["--data", "npz:/no/such/file.npz"], "--data npz:/no/such/file.npz: the file does not exist"),
        (["--data", "kaggle"], "--data 'kaggle' is not a data source"),
        (["--timeout", "-1"], "--timeout must be a positive number"),
        (["--timeout", "0"], "--timeout must be a positive number"),
        (["--timeout", "nan"], "--timeout must be a positive number of seconds, at most 604800 (a week), got nan"),
        (["--timeout", "inf"], "--timeout must be a positive number"),
        (["--mode", "fast"], "invalid choice: 'fast'"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(tmp_path, args, message):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    os.mkfifo(tmp_path / "a_fifo")
    args = [a.format(file=a_file, fifo=tmp_path / "a_fifo") for a in args]
    proc = _prove(*args, *([] if "--out" in args else ["--out", str(tmp_path / "out")]), timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr and "Traceback" not in proc.stderr + proc.stdout
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_missing_npz_in_course_data_is_refused_up_front(tmp_path):
    """COURSE_DATA=npz:/nonexistent.npz prove started the lessons, which failed one by one (the fifth hostile pass):
    the file is checked before any lesson starts, as --data's is."""
    env = dict(os.environ, COURSE_SMOKE="1", COURSE_DATA="npz:/no/such/file.npz")
    env.pop("COURSE_CLAIMS_DIR", None)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "course_utils", "prove", "--lessons", "04", "--out", str(tmp_path / "out")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr)
    assert proc.stderr.strip() == (
        "prove: COURSE_DATA=npz:/no/such/file.npz: the file does not exist. Give the path "
        "of a CIFAR-10 .npz (the README, section Modes, says how to make one), or unset "
        "COURSE_DATA"
    ), proc.stderr
    assert not (tmp_path / "out").exists() and time.perf_counter() - start < 60


def test_lessons_lists_every_notebook_once_each_with_its_folder_claims_and_exercises():
    from course_utils import exercises

    notebooks = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert [lesson.notebook for lesson in lessons.LESSONS] == notebooks
    assert list(lessons.BY_ID) == [f"{n:02d}" for n in range(1, len(notebooks) + 1)]
    folders = sorted(p.parent.name for p in (ROOT / "course_utils" / "lessons").glob("*/__init__.py"))
    assert sorted(lesson.name for lesson in lessons.LESSONS) == folders
    for lesson in lessons.LESSONS:
        assert callable(lesson.experiments.claims) and proof.lesson_notebook(lesson) == ROOT / lesson.notebook, lesson
        assert len(exercises.load(lesson.module)) >= 2, lesson


def _where_exists(lesson, key, fn) -> None:
    """A claim's ``where``: a function that exists, or a section of the notebook that measures it in its own cells
    ("notebook §3"), or None."""
    import importlib
    import re

    if fn is None:
        return
    if isinstance(fn, str) and fn.startswith("notebook §"):  # computed in the notebook's cells, there once
        section = fn.removeprefix("notebook §")
        headings = (ROOT / lesson.notebook).read_text(encoding="utf-8")
        assert re.search(rf'"## {re.escape(section)}\. ', headings), f"{key}: {lesson.notebook} has no §{section}"
        return
    module, _, name = report.function_name(fn).partition(":")
    target = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    assert callable(target), key


def test_every_lesson_declares_its_claims_each_with_the_function_that_measures_it():
    """Each claim leads a report card's reader to the code that measured it (claims.json's "where"), from its
    declaration in the lesson's ``CLAIMS``."""
    for lesson in lessons.LESSONS:
        declared = lesson.experiments.CLAIMS
        assert isinstance(declared, report.LessonClaims) and declared.lesson == lesson.id, lesson.id
        assert not hasattr(lesson.experiments, "MEASURED_BY") and not hasattr(lesson.experiments, "FIGURES")
        for spec in declared:
            _where_exists(lesson, spec.id, spec.where)


def test_a_declared_claims_prose_is_in_its_notebook():
    """A declaration's ``prose`` is what the notebook tells a learner a row will read (its threshold): the notebook
    must say it, with the threshold the claim uses."""
    from claims_helpers import notebook_prose

    checked = 0
    for lesson in lessons.LESSONS:
        prose = " ".join(notebook_prose(pathlib.Path(lesson.notebook).name).split())  # one space between words
        for spec in getattr(lesson.experiments, "CLAIMS", ()):
            if spec.prose:
                assert spec.words("prose", {}) in prose, (spec.id, spec.words("prose", {}))
                checked += 1
    assert checked


def test_placed_sets_each_claims_lesson_and_where_and_a_prefix_covers_ids_made_in_a_loop():
    claims = [
        report.Claim("a", "§1", "x", "y", True, id="02.forward_peak_bfloat16"),
        report.Claim("b", "§1", "x", "y", True, id="02.kernel_cast_raises"),
        report.Claim("c", "§1", "x", "y", None, id="02.not_run"),
    ]
    table = {
        "02.forward_peak_": report.Claim.from_dict,
        "02.kernel_cast_raises": "course_utils.memory:variable_bytes",
        "02.not_run": None,
    }
    placed = report.placed(claims, "02", table)
    assert [(c.lesson, c.where) for c in placed] == [
        ("02", "course_utils.report:Claim.from_dict"),
        ("02", "course_utils.memory:variable_bytes"),
        ("02", ""),
    ]
    assert report.where_label(placed[0].where) == "report.py: Claim.from_dict"
    card = proof.report_card(
        {"machine": {}, "lessons": {"02": {"title": "t", "claims": [c.to_dict() for c in placed]}}}
    )
    assert "| `02.kernel_cast_raises`<br>`memory.py: variable_bytes` | b |" in card, card


def test_exit_status_names_the_ids_of_the_claims_that_do_not_hold():
    bad = [
        report.Claim(f"claim {n}", "§1", "x", "y", False, lesson="05", id=f"05.claim_{n}").to_dict() for n in range(7)
    ]
    code, line = proof.exit_status({"lessons": {"05": {"claims": bad}}}, ["05"])
    assert (
        code == 1
        and line == "7 claim(s) do not hold here (05.claim_0, 05.claim_1, 05.claim_2, 05.claim_3, 05.claim_4, …)"
    )


def test_exit_status_counts_failed_claims_and_unmeasured_lessons():
    ok = report.Claim("a", "§1", "x", "x", True, lesson="02").to_dict()
    bad = report.Claim("b", "§1", "x", "y", False, lesson="02").to_dict()
    differs = report.Claim("c", "§1", "x", "y", False, differs_here="CPU", lesson="02").to_dict()
    assert proof.exit_status({"lessons": {"02": {"claims": [ok, differs]}}}, ["02"]) == (0, "")
    code, summary = proof.exit_status({"lessons": {"02": {"claims": [ok, bad]}}}, ["02"])
    assert code == 1 and summary.startswith("1 claim(s) do not hold")
    code, summary = proof.exit_status({"lessons": {"02": {"claims": [ok]}, "05": {"error": "timeout"}}}, ["02", "05"])
    assert code == 1 and "lessons not measured: 05" in summary


def test_a_notebook_that_stops_is_one_line_naming_its_cell_and_error(tmp_path):
    """The lesson's process prints why its notebook stopped on a line of its own; the card and prove's line give that
    line, not the traceback's last lines around it."""
    import argparse

    machine = {
        "accelerator": {"kind": "TPU", "name": "none", "replicas": 1},
        "cpu": {"model": "Some CPU", "cores": 2, "usable_cores": 1, "max_isa": "", "onednn": "0"},
        "memory_gib": 8.0,
        "os": "Linux",
        "python": "3.11",
        "tensorflow": "2.20.0",
        "keras": "3.15.1",
        "course_utils": "abc",
        "xla": True,
        "mode": "smoke",
        "data": "synthetic",
    }
    data = {"format": proof.FORMAT_VERSION, "machine": machine, "fingerprint": "f", "lessons": {}}
    why = "notebooks/04_data_pipeline_sharding.ipynb: cell 63 of 91: TPUStandInRefused: XLA compiled for the host"
    tail = [
        "  · cell 62/91 3.1 s",
        "Traceback (most recent call last):",
        '  File "proof.py", line 233',
        f"{proof.LESSON_ERROR}{why}",
    ]
    proof._record(argparse.Namespace(out=tmp_path, timeout=900.0), data, "04", 1, tail, tmp_path / "absent.json", 0.0)
    assert data["lessons"]["04"]["error"] == f"its notebook stopped: {why}"
    assert f"Could not be measured: its notebook stopped: {why}" in (tmp_path / "report.md").read_text()


def test_report_card_has_a_table_per_lesson_and_the_machine():
    machine = {
        "accelerator": {"kind": "CPU", "name": "none", "replicas": 1},
        "cpu": {"model": "Some CPU", "cores": 2, "usable_cores": 1, "max_isa": "AVX2", "onednn": "0"},
        "memory_gib": 8.0,
        "os": "Linux",
        "python": "3.11",
        "tensorflow": "2.20.0",
        "keras": "3.15.1",
        "course_utils": "abc",
        "xla": True,
        "mode": "smoke",
        "data": "synthetic",
    }
    claim = report.Claim("A claim", "§1", "< 1", "0.5", True, lesson="05").to_dict()
    card = proof.report_card(
        {
            "machine": machine,
            "lessons": {
                "05": {"title": "Gradient accumulation", "claims": [claim], "seconds": 3},
                "02": {"title": "bf16", "error": "timed out"},
            },
        }
    )
    assert "Some CPU, 1 of 2 cores" in card and "with XLA" in card and "ONEDNN_MAX_CPU_ISA=AVX2" in card
    assert "oneDNN off" in card
    assert card.index("## 02") < card.index("## 05") and "Could not be measured: timed out" in card
    assert "| A claim | < 1 | 0.5 | ✅ holds |" in card
    # a newcomer can read it on its own: what each verdict means, and that smoke figures are not representative
    assert proof.VERDICT_LEGEND in card and "➖ not measurable here" in card and proof.SMOKE_NOTE in card
    full = proof.report_card({"machine": dict(machine, mode="full"), "lessons": {}})
    assert proof.VERDICT_LEGEND in full and proof.SMOKE_NOTE not in full


@pytest.mark.extended  # two notebooks executed, then two more (~2 minutes): .ci/run runs it after the README's pytest
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
    driver = subprocess.Popen(
        [sys.executable, "-m", "course_utils", "prove", "--lessons", "3", "02", "--out", str(out)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
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
    (previous,) = out.glob("claims.previous-*.json")  # moved aside under its own name (UTC time), not overwritten
    assert json.loads(previous.read_text())["fingerprint"] == "another machine"
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
    assert machine["from"] == "notebooks"  # the claims of the executed notebooks, and the card says so
    for lesson_id in ("02", "03"):
        claims = data["lessons"][lesson_id]["claims"]
        assert len(claims) >= 10 and all(KEYS <= set(c) and c["lesson"] == lesson_id for c in claims)
        assert all(c["verdict"] in set(report.WORDS.values()) for c in claims)
        ids = [c["id"] for c in claims]  # stable ids, each once: "02.kernel_cast_raises"
        assert all(i.startswith(f"{lesson_id}.") for i in ids) and len(set(ids)) == len(ids), ids
    memory_claims = [c for c in data["lessons"]["02"]["claims"] if c["id"].startswith("02.forward_peak_")]
    assert len(memory_claims) == 2 and all(len(c["samples"]) == 3 for c in memory_claims)  # from repeats: kept
    card = (out / "report.md").read_text()
    assert "## 02 · bfloat16 conversion" in card and "## 03 · Mixed precision" in card
    assert "claims read from the executed notebooks" in card

    # the fingerprint claims.json stores is not taken on its word: a machine edited in (here another TensorFlow)
    # under this machine's fingerprint is moved aside, and the lesson measured again
    tampered = dict(data, machine=dict(machine, tensorflow="0.0-edited"))
    (out / "claims.json").write_text(json.dumps(tampered))
    proc = _prove("--lessons", "03", "--out", str(out))
    assert proc.returncode == 0 and "already proved here" not in proc.stdout, proc.stdout[-3000:] + proc.stderr
    assert "was written on another machine, versions or settings: moved to claims.previous-" in proc.stdout
    assert len(list(out.glob("claims.previous-*.json"))) == 2  # both earlier cards kept
    assert json.loads((out / "claims.json").read_text())["machine"] == machine


# ----------------------------------------------------------------------------------------------
# What prove writes, and what it refuses to touch (each refusal: one line, exit 2, nothing written)
# ----------------------------------------------------------------------------------------------


def _files(folder: pathlib.Path) -> dict[str, bytes]:
    """Every file in ``folder`` (links as 'link → target'), but the lock file prove leaves."""
    return {
        p.name: (f"link → {os.readlink(p)}".encode() if p.is_symlink() else p.read_bytes())
        for p in sorted(folder.iterdir())
        if p.name != ".lock"
    }


def _refused(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert all(w in proc.stderr for w in words), proc.stderr


@pytest.mark.parametrize("name", ["claims.json", "report.md", ".lock"])
def test_a_link_where_prove_writes_is_refused_and_its_target_left_alone(tmp_path, name):
    outside = tmp_path / "outside.txt"
    outside.write_text("a file elsewhere: prove must not write it")
    out = tmp_path / "proof"
    out.mkdir()
    (out / name).symlink_to(outside)
    before = _files(out)
    proc = _prove("--lessons", "03", "--out", str(out), timeout=120)
    _refused(proc, str(out / name), "symbolic link")
    assert outside.read_text() == "a file elsewhere: prove must not write it" and _files(out) == before


CLAIMS_OF_ANOTHER_RUN = json.dumps(
    {
        "format": 1,
        "machine": {},
        "fingerprint": "x",
        "lessons": {"05": {"title": "Gradient accumulation", "claims": [], "seconds": 3}},
    },
    indent=1,
)


@pytest.mark.parametrize(
    "content, words",
    [
        (
            CLAIMS_OF_ANOTHER_RUN.replace('"seconds": 3', '"seconds": 3,'),
            ["is not valid JSON", "line 10", "move it away"],
        ),
        (CLAIMS_OF_ANOTHER_RUN[:40], ["is not valid JSON", "move it away"]),  # truncated
        (b"\xff\xfe{}", ["is not UTF-8 text"]),
        ('{"accuracy": 0.9}', ["was not written by prove", "refusing to overwrite it"]),
        ("[1, 2]", ["was not written by prove"]),
    ],
)
def test_a_claims_json_prove_cannot_read_is_refused_never_overwritten(tmp_path, content, words):
    """A hand edit's trailing comma, a truncated copy, another program's claims.json: refused before anything runs,
    byte for byte as it was (treating it as absent would overwrite every lesson proved so far)."""
    out = tmp_path / "proof"
    out.mkdir()
    (out / "claims.json").write_bytes(content if isinstance(content, bytes) else content.encode())
    before = _files(out)
    proc = _prove("--lessons", "03", "--out", str(out), timeout=120)
    _refused(proc, str(out / "claims.json"), *words)
    assert _files(out) == before


def test_a_utf8_bom_in_claims_json_is_read_past_not_refused(tmp_path):
    """A Windows editor's byte order mark: the file is read (the refusal here is about report.md, checked after it)."""
    out = tmp_path / "proof"
    out.mkdir()
    (out / "claims.json").write_bytes("\ufeff".encode() + CLAIMS_OF_ANOTHER_RUN.encode())
    (out / "report.md").write_text("notes\n")
    before = _files(out)
    _refused(_prove("--lessons", "03", "--out", str(out), timeout=120), "report.md was not written by prove")
    assert _files(out) == before


def test_a_report_md_prove_did_not_write_is_refused_even_in_this_folder(tmp_path):
    (tmp_path / "report.md").write_text("# My notes on the course\n")
    env = dict(os.environ, COURSE_SMOKE="1")
    env.pop("COURSE_CLAIMS_DIR", None)
    proc = subprocess.run(
        [sys.executable, "-m", "course_utils", "prove", "--lessons", "03", "--out", "."],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    _refused(proc, "report.md was not written by prove", "refusing to overwrite it")
    assert (tmp_path / "report.md").read_text() == "# My notes on the course\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "report.md"]


# ----------------------------------------------------------------------------------------------
# Processes: prove's lesson process (and what it started) ends with prove, however prove ends
# ----------------------------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for stat_file in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(stat_file.parent.name))
    return tree


def _descendants(pid: int) -> list[int]:
    tree, found, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _cmdline(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for_child(parent: subprocess.Popen, needle: str, seconds: float = 60) -> int:
    """The pid of the first process below ``parent`` whose command line has ``needle``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for pid in _descendants(parent.pid):
            if needle in _cmdline(pid):
                return pid
        assert parent.poll() is None, parent.communicate()
        time.sleep(0.05)
    raise AssertionError(f"no process running {needle!r} below {parent.pid}")


def _all_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(map(_alive, pids)):
        time.sleep(0.05)
    return [f"{pid}: {_cmdline(pid)}" for pid in pids if _alive(pid)]


def _start_prove(out: pathlib.Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    if env is None:
        env = dict(os.environ, COURSE_SMOKE="1")
    env.pop("COURSE_CLAIMS_DIR", None)
    # default SIGINT disposition, as a terminal's Ctrl-C meets it (a runner may start tests with SIGINT ignored)
    return subprocess.Popen(
        [sys.executable, "-m", "course_utils", "prove", "--lessons", "03", "--out", str(out), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


linux_only = pytest.mark.skipif(not pathlib.Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")


@linux_only
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_signal_stops_prove_and_every_process_it_started(tmp_path, signame):
    """`kill`, a closed terminal or Ctrl-C while prove's child runs (here: lesson 03's, forked from the process that
    imported TensorFlow once): the child's whole process group is stopped, prove says so in one line and exits
    128 + signal."""
    driver = _start_prove(tmp_path / "proof")
    _wait_for_child(driver, "course_utils.proof _lesson")
    below = _descendants(driver.pid)
    driver.send_signal(getattr(signal, signame))
    _, err = driver.communicate(timeout=30)
    assert driver.returncode == 128 + getattr(signal, signame), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "the lesson running was stopped" in err and (signame == "SIGINT" or signame in err), err
    assert _all_gone(below, 1.0) == []


@linux_only
def test_prove_killed_takes_its_lesson_process_along(tmp_path):
    driver = _start_prove(tmp_path / "proof")
    child = _wait_for_child(driver, "course_utils.proof _lesson")
    driver.kill()  # SIGKILL: prove runs no handler, no finally
    driver.communicate(timeout=30)
    assert _all_gone([child], 1.0) == []


@linux_only
def test_a_second_prove_into_the_same_folder_stops_at_once_naming_the_first(tmp_path):
    out = tmp_path / "proof"
    first = _start_prove(out)
    try:
        _wait_for_child(first, "course_utils.proof _lesson")
        second = _prove("--lessons", "03", "--out", str(out), timeout=60)
        _refused(second, f"another prove is writing to {out} (pid {first.pid})")
    finally:
        first.terminate()
        first.communicate(timeout=30)


@linux_only
@pytest.mark.parametrize("smoke, mode", [(None, "1"), ("0", "0"), ("1", "1")])
def test_prove_defaults_to_smoke_mode_unless_course_smoke_says_otherwise(tmp_path, smoke, mode):
    env = dict(os.environ)
    env.pop("COURSE_SMOKE", None)
    if smoke is not None:
        env["COURSE_SMOKE"] = smoke
    driver = _start_prove(tmp_path / "proof", env=env)
    claims = tmp_path / "proof" / "claims.json"
    try:  # the machine prove describes is seen by its child process, in the mode the child was given
        deadline = time.monotonic() + 120
        while not (claims.exists() and "machine" in json.loads(claims.read_text() or "{}")):
            assert driver.poll() is None, driver.communicate()
            assert time.monotonic() < deadline, "prove wrote no claims.json"
            time.sleep(0.1)
        assert json.loads(claims.read_text())["machine"]["mode"] == {"1": "smoke", "0": "full"}[mode]
    finally:
        driver.terminate()
        driver.communicate(timeout=30)


def test_help_says_what_each_mode_costs():
    proc = _prove("--help", timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "smoke (default: a minute or so per lesson, synthetic data)" in text
    assert "about 30 minutes for all eight on 2 CPU cores on synthetic data, and about 16 more on real CIFAR-10" in text


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the forking process is Linux only")
def test_the_memory_forker_and_its_children_die_with_the_process_that_started_it(tmp_path):
    """Lesson 02 measures in processes forked from a helper that imported TensorFlow once. When the lesson's process
    ends without stopping it (prove's --timeout kills it; os._exit runs no atexit), the helper and the process it
    forked (here mid-step) end within a second, not after the step finishes."""
    (tmp_path / "slow_step.py").write_text("import time\n\ndef make_step(**kwargs):\n    time.sleep(120)\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    lesson = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import json, os, time
        from course_utils import memory
        forker = memory._Forker(dict(os.environ))
        forker.proc.stdin.write((json.dumps(["slow_step", "make_step", [["a", {}]], 1, 0, "CPU:0", 1, True, None])
                                 + "\\n").encode())
        forker.proc.stdin.flush()
        print(forker.proc.pid, flush=True)
        time.sleep(300)
    """),
        ],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        forker = int(lesson.stdout.readline())
        deadline = time.monotonic() + 120
        while not _descendants(forker):  # TensorFlow imported, the step's process forked
            assert time.monotonic() < deadline and _alive(forker), "the forker did not fork"
            time.sleep(0.1)
        forked = _descendants(forker)
    finally:
        lesson.kill()
        lesson.wait()
    assert _all_gone([forker, *forked], 1.0) == []


@pytest.mark.extended  # one lesson (~10 s), in a user namespace with a 256 KiB tmpfs as --out
@pytest.mark.skipif(
    subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0
    if shutil.which("unshare")
    else True,
    reason="needs unshare -rm (Linux user namespaces)",
)
def test_a_full_disk_is_one_line_exit_2_and_loses_nothing(tmp_path):
    """--out on a full file system (a real ENOSPC, from a tiny tmpfs): prove says so in one line, exit 2, no
    traceback, no temporary file left; the claims.json of another machine it moved aside before is intact, and the
    card kept from an older run (claims.previous.json) untouched."""
    prepared, snapshot, out = tmp_path / "prepared", tmp_path / "snapshot", tmp_path / "out"
    for folder in (prepared, snapshot / "out", out):
        folder.mkdir(parents=True)
    earlier = {
        "format": 1,
        "machine": {"elsewhere": True},
        "fingerprint": "another machine",
        "lessons": {"05": {"title": "Gradient accumulation", "claims": [], "seconds": 3}},
    }
    (prepared / "claims.json").write_text(json.dumps(earlier))
    (prepared / "report.md").write_text("# Claims vs. measured — report card\n\nfrom another machine\n")
    (prepared / "claims.previous.json").write_text("the oldest card")
    script = f"""
        mount -t tmpfs -o size=256k tmpfs "$OUT" || exit 99
        cp "$PREPARED"/* "$OUT"/
        i=0; while head -c 4096 /dev/zero > "$OUT/fill$i" 2>/dev/null; do i=$((i + 1)); done
        rm -f "$OUT/fill$i" "$OUT/fill0"  # one page left: the lock file's
        {sys.executable} -m course_utils prove --lessons 03 --out "$OUT" > "$SNAPSHOT/stdout" 2> "$SNAPSHOT/stderr"
        echo $? > "$SNAPSHOT/rc"
        rm -f "$OUT"/fill*
        cp -a "$OUT"/. "$SNAPSHOT/out/"
    """
    env = dict(os.environ, COURSE_SMOKE="1", OUT=str(out), PREPARED=str(prepared), SNAPSHOT=str(snapshot))
    env.pop("COURSE_CLAIMS_DIR", None)
    shell = subprocess.run(
        ["unshare", "-rm", "sh", "-c", textwrap.dedent(script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert shell.returncode == 0, shell.stderr
    err = (snapshot / "stderr").read_text()
    assert (snapshot / "rc").read_text().strip() == "2", (snapshot / "stdout").read_text()[-3000:] + err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"cannot write {out / 'claims.json'}: No space left on device" in err, err
    files = {p.name: p.read_bytes() for p in (snapshot / "out").iterdir() if p.name != ".lock"}
    moved = {name for name in files if name.startswith(("claims.previous-", "report.previous-"))}
    assert sorted(files) == sorted(["claims.previous.json", *moved]) and len(moved) == 2, sorted(files)
    assert files["claims.previous.json"] == b"the oldest card"
    for name in moved:
        assert files[name] == (prepared / ("claims.json" if name.endswith(".json") else "report.md")).read_bytes()


@linux_only
@pytest.mark.skipif(shutil.which("taskset") is None, reason=".ci/prove-perturbed needs taskset")
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_prove_perturbed_stopped_stops_prove_and_its_busy_loop(tmp_path, signame):
    env = dict(os.environ)
    env.pop("COURSE_CLAIMS_DIR", None)
    runner = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / ".ci" / "prove-perturbed"),
            "--only",
            "busy-core",
            "--lessons",
            "03",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    below: list[int] = []
    try:
        _wait_for_child(runner, "while True: pass")
        _wait_for_child(runner, "course_utils.proof _lesson")
        below = _descendants(runner.pid)
        runner.send_signal(getattr(signal, signame))
        _, err = runner.communicate(timeout=60)
        assert runner.returncode == 128 + getattr(signal, signame), err
        assert err.strip().splitlines()[-1] == f"prove-perturbed: {signame}; prove and the busy loop were stopped"
        assert _all_gone(below, 1.0) == []
    finally:
        for pid in below:  # a test that failed leaves nothing spinning
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if runner.poll() is None:
            runner.kill()
            runner.wait()


@pytest.mark.parametrize(
    "shape, jit, replicas",
    [
        (None, "0", {"01": "1", "04": "4"}),
        ("tpu", "1", {"01": "4", "04": "4"}),
        ("multi-gpu", "0", {"01": "2", "04": "2"}),
        ("gpu", "0", {"01": "1", "04": "1"}),
        ("tpu-1", "1", {"01": "1", "04": "1"}),
    ],
)
def test_shapes_set_every_lessons_replicas_and_xla(shape, jit, replicas):
    """--shape tpu: a 4-core TPU stand-in and XLA for every lesson (a TPU compiles every step); multi-gpu: 2 GPUs
    stood in for, XLA as the course chooses for several GPUs; gpu: one; none: each lesson's own replicas on the CPU,
    XLA as --jit says."""
    import argparse

    args = argparse.Namespace(mode="smoke", jit=False, data=None, shape=shape)
    for lesson_id, expected in replicas.items():
        env = proof._child_env(args, lessons.BY_ID[lesson_id])
        assert (env["COURSE_CPU_REPLICAS"], env["COURSE_JIT"]) == (expected, jit)
        assert env[proof.SHAPE_VARIABLE] == (shape or "")
    machine = {
        "accelerator": {"kind": "CPU", "name": "none", "replicas": 4},
        "cpu": {"model": "x", "cores": 2, "usable_cores": 2, "onednn": "default"},
        "memory_gib": 1,
        "os": "L",
        "python": "3",
        "tensorflow": "2",
        "keras": "3",
        "mode": "smoke",
        "xla": True,
        "data": "synthetic",
        "shape": shape,
    }
    line = proof.machine_line(machine)
    assert (proof.SHAPES[shape]["what"] in line) if shape else ("split it into 4 devices" in line)


def test_course_jit_in_the_environment_is_honoured(monkeypatch, tmp_path):
    """COURSE_JIT=1 prove ... measured without XLA: the driver overwrote the variable with --jit's default."""
    from course_utils import config

    monkeypatch.setenv("COURSE_JIT", "1")
    config.reload()
    try:
        args = proof._parse(["--lessons", "03", "--out", str(tmp_path / "p")])
        assert args.jit and proof._child_env(args, lessons.BY_ID["03"])["COURSE_JIT"] == "1"
    finally:
        monkeypatch.delenv("COURSE_JIT")
        config.reload()
    args = proof._parse(["--lessons", "03", "--out", str(tmp_path / "p")])
    assert not args.jit and proof._child_env(args, lessons.BY_ID["03"])["COURSE_JIT"] == "0"


# ----------------------------------------------------------------------------------------------
# --jobs N: N lessons at a time, each pinned to its own cores
# ----------------------------------------------------------------------------------------------


def test_core_slots_split_the_usable_cores_evenly_and_refuse_more_jobs_than_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 5}, raising=False)
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: None, raising=False)
    assert proof.core_slots(2) == [[0, 1], [2, 3]]  # equal shares: core 5 left out
    assert proof.core_slots(5) == [[0], [1], [2], [3], [5]]
    with pytest.raises(proof.UsageError, match="only 5 usable core"):
        proof.core_slots(6)
    monkeypatch.delattr(os, "sched_setaffinity")
    with pytest.raises(proof.UsageError, match="pin a process"):
        proof.core_slots(2)


def _cpus_allowed(pid: int) -> str:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return ""


two_cores = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="--jobs 2 needs two usable cores"
)


def test_jobs_start_the_longest_lessons_of_the_mode_first():
    """Measured on one core each on CI's kind of VM: full mode, the notebooks (2026-11-29): 06 1,223 s (about 920
    without the ablation rows synthetic images now skip), 07 790, 04 362, 01 307, 02 252, 08 167, 05 124, 03 63; smoke
    mode in the TPU shape, the notebooks (CI, 2026-11-29) 05 270 (before its smoke mode went to 2 replicas: about
    185 projected), 06 262, 07 198, 04 ~150 (113 under the GPU's), 08 ~100 (not proved there), 01 58, 02 42, 03 24."""
    every = list(lessons.BY_ID)
    assert proof.job_order(every, "full") == ["06", "07", "04", "01", "02", "08", "05", "03"]
    assert proof.job_order(every, "smoke") == ["06", "07", "05", "04", "08", "01", "02", "03"]
    assert proof.job_order(["03", "01", "02"], "smoke") == ["01", "02", "03"]


@linux_only
@two_cores
@pytest.mark.extended  # three notebooks, two at a time (~60 s)
def test_jobs_run_lessons_at_once_each_on_its_own_core_and_reuse_a_freed_one(tmp_path):
    out = tmp_path / "proof"
    driver = _start_prove(out, "--lessons", "03", "02", "01", "--jobs", "2", "--again")
    seen: dict[str, str] = {}
    while driver.poll() is None:  # the cores each lesson's process may run on, read while it runs
        for pid in _descendants(driver.pid):
            words = _cmdline(pid).split()
            if "_lesson" in words:
                seen[words[words.index("_lesson") + 1]] = _cpus_allowed(pid)  # the last look: after it pinned itself
        time.sleep(0.05)
    stdout, stderr = driver.communicate(timeout=30)
    assert driver.returncode == 0, stdout[-3000:] + stderr[-3000:]
    cores = sorted(os.sched_getaffinity(0))
    first, second = (",".join(map(str, s)) if len(s) == 1 else f"{s[0]}-{s[-1]}" for s in proof.core_slots(2))
    assert set(seen) == {"01", "02", "03"}, seen
    assert {seen["01"], seen["02"]} == {first, second}, seen  # the two longest first, one core set each
    assert seen["03"] in (first, second), seen  # then the last lesson, on the cores that came free
    import re

    ended = [m.start() for m in re.finditer(r"^\[0[12]\] \d+ claims in", stdout, re.M)]
    assert len(ended) == 2 and stdout.index("[03] Mixed precision …") > min(ended), stdout  # started when one ended
    data = json.loads((out / "claims.json").read_text())
    assert set(data["lessons"]) == {"01", "02", "03"} and all(e["claims"] for e in data["lessons"].values())
    assert data["machine"]["jobs"] == 2 and data["machine"]["cpu"]["usable_cores"] == len(cores) // 2
    assert "2 lessons at a time" in (out / "report.md").read_text()


@linux_only
@two_cores
@pytest.mark.extended  # two lessons started (~15 s)
def test_a_signal_stops_every_lesson_running_at_once(tmp_path):
    driver = _start_prove(tmp_path / "proof", "--lessons", "03", "02", "--jobs", "2")
    deadline = time.monotonic() + 120
    while sum("_lesson" in _cmdline(pid) for pid in _descendants(driver.pid)) < 2:
        assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()
        time.sleep(0.05)
    below = _descendants(driver.pid)
    driver.send_signal(signal.SIGTERM)
    _, err = driver.communicate(timeout=30)
    assert driver.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "the lesson running was stopped" in err, err
    assert _all_gone(below, 1.0) == []


def test_compare_verdicts_matches_by_id_takes_ids_for_an_old_card_by_wording_and_refuses_bad_input(tmp_path):
    """.ci/compare-verdicts: 0 when every claim reads the same, 1 (naming the id) when one differs, 2 in one line for
    an odd number of files or a file that is not a claims.json; a format-1 card (no ids) is matched by wording."""

    def card(name, claims, ids=True):
        entries = [
            dict(report.Claim(text, "§1", "x", "y", holds, id=cid).to_dict(), lesson="05")
            for cid, text, holds in claims
        ]
        for entry in entries:
            if not ids:
                entry.pop("id")
        path = tmp_path / name
        path.write_text(json.dumps({"format": 2 if ids else 1, "lessons": {"05": {"claims": entries}}}))
        return str(path)

    def run(*args):
        return subprocess.run(
            [sys.executable, str(ROOT / ".ci" / "compare-verdicts"), *args], capture_output=True, text=True, timeout=60
        )

    old = card("old.json", [("05.a", "claim a", True), ("05.b", "claim b", True)], ids=False)
    same = card("same.json", [("05.a", "claim a", True), ("05.b", "claim b reworded", True)])
    other = card("other.json", [("05.a", "claim a", False), ("05.b", "claim b", True)])
    proc = run(old, other)
    assert proc.returncode == 1 and "1 claim(s) read the same verdict, 1 differ" in proc.stdout, proc.stdout
    assert "05.a: holds → does not hold" in proc.stdout, proc.stdout
    assert run(same, same).returncode == 0
    for bad in ([old], [old, str(tmp_path / "missing.json")], [old, str(tmp_path)]):
        proc = run(*bad)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, (bad, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_compare_verdicts_refuses_a_fifo_a_device_a_claim_without_verdict_and_an_id_listed_twice(tmp_path):
    """The fifth hostile pass: a FIFO blocked forever, /dev/zero read until memory ran out, a claim without "verdict"
    was a KeyError traceback, and one id listed twice with two verdicts read "0 differ". Each is one line, exit 2,
    within seconds."""
    good = {"id": "05.a", "claim": "a", "verdict": "holds"}
    cards = {
        "no_verdict": [{"id": "05.a", "claim": "a"}],
        "twice": [good, dict(good, verdict="does not hold")],
        "not_a_dict": ["05.a"],
    }
    paths = {}
    for name, claims in cards.items():
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps({"format": 2, "lessons": {"05": {"claims": claims}}}))
    fine = tmp_path / "fine.json"
    fine.write_text(json.dumps({"format": 2, "lessons": {"05": {"claims": [good]}}}))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for bad, says in (
        (paths["no_verdict"], "without its text or verdict"),
        (paths["twice"], "twice"),
        (paths["not_a_dict"], "without its text or verdict"),
        (fifo, "not a regular file"),
        (pathlib.Path("/dev/zero"), "not a regular file"),
    ):
        proc = subprocess.run(
            [sys.executable, str(ROOT / ".ci" / "compare-verdicts"), str(fine), str(bad)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode == 2 and says in proc.stderr, (bad, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_a_stand_in_fails_on_a_claim_that_does_not_hold_unless_it_is_a_figure(monkeypatch):
    """Under a stand-in (--shape gpu|multi-gpu|tpu|tpu-1) the accelerator's code runs on CPU devices: a claim about
    values, errors or placement that does not hold fails the run as anywhere; a speed or memory figure is a CPU's
    judged as the accelerator's, and placed() marks it "differs on this hardware" with why — only under a stand-in,
    only when it is a figure. A lesson that could not be measured fails the run."""
    from course_utils import config

    def judged(standin: str, figures: dict) -> report.Claim:
        monkeypatch.setenv("COURSE_STANDIN", standin)
        config.reload()
        claim = report.Claim("c", "s", "e", "m", False, id="03.x")
        return report.placed([claim], "03", {}, figures)[0]

    try:
        for standin, figures, fails in (
            ("tpu", {"03.x": "memory"}, False),
            ("gpu", {"03.": "speed"}, False),
            ("tpu", {}, True),
            ("", {"03.x": "memory"}, True),
        ):
            claim = judged(standin, figures)
            assert claim.fails == fails, (standin, figures, claim.verdict)
            assert ("stand-in" in claim.verdict) == (not fails), claim.verdict
            data = {
                "machine": {"shape": "tpu-1" if standin else None},
                "lessons": {"03": {"claims": [claim.to_dict()]}},
            }
            got, summary = proof.exit_status(data, ["03"])
            assert got == int(fails) and (("03.x" in summary) == fails), (standin, figures, summary)
            got, summary = proof.exit_status(data, ["03", "05"])
            assert got == 1 and "lessons not measured: 05" in summary
        with pytest.raises(ValueError, match="figure 'time'"):
            judged("", {"03.x": "time"})
    finally:
        monkeypatch.delenv("COURSE_STANDIN", raising=False)
        config.reload()


def test_kernels_sets_each_lessons_cpu_kernels_and_refuses_a_path_this_cpu_cannot_take(monkeypatch):
    """prove --kernels PATH: every lesson's process runs with that kernel path's settings (a cap left in the caller's
    environment is dropped where it would change the path); a path the CPU cannot take (bfloat16 units it lacks) is
    refused up front, in one line; the machine line names the path."""
    from course_utils import hardware

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    for path, settings in hardware.KERNEL_PATHS.items():
        monkeypatch.setattr(hardware, "kernel_path", lambda environ=None, path=path: (path, "as asked"))
        args = proof._parse(["--kernels", path, "--lessons", "02"])
        env = proof._child_env(args, None)
        for name, value in settings["env"].items():
            assert env[name] == value, (path, name)
        assert ("ONEDNN_MAX_CPU_ISA" in env) == (path == "onednn-fp32"), path
    monkeypatch.setattr(hardware, "kernel_path", lambda environ=None: ("eigen", "no VNNI or AMX"))
    with pytest.raises(proof.UsageError, match="--kernels onednn-bf16: this CPU takes eigen"):
        proof._parse(["--kernels", "onednn-bf16"])
    machine = {
        "accelerator": {"kind": "CPU", "name": "none", "replicas": 1},
        "memory_gib": 24,
        "os": "Linux",
        "python": "3.11",
        "tensorflow": "2.20.0",
        "keras": "3.15.1",
        "mode": "smoke",
        "xla": False,
        "data": "synthetic",
        "cpu": {"model": "x", "cores": 2, "usable_cores": 2, "max_isa": "", "onednn": "0", "kernels": "eigen"},
    }
    assert "CPU kernels eigen" in proof.machine_line(machine)


def test_a_claim_whose_verdict_cannot_be_read_is_refused_when_claims_json_is_read():
    """A hand-edited `"holds": "maybe"` passed the check of claims.json and then raised a ValueError traceback at
    the end of the run (the fifth hostile pass): the check reads each claim's verdict too, and says which claim."""
    good = report.Claim("c", "s", "e", "m", True, id="07.x").to_dict()
    assert proof._entry_problem({"claims": [good]}) is None
    problem = proof._entry_problem({"claims": [good, dict(good, holds="maybe")]})
    assert problem == (
        "has a claim (number 2) that cannot be read (holds must be True, False, None or 'noise', got 'maybe')"
    ), problem


def test_prove_perturbed_refuses_bad_arguments_up_front_and_reads_an_odd_card(tmp_path):
    """.ci/prove-perturbed ran every perturbation and then failed in a traceback (the fifth hostile pass) for an
    unknown lesson, an --out that is a file or under /proc; each is now one line, exit 2, before anything runs. A
    claims.json with a lesson entry that is not an object reads "unreadable" in the table, not a traceback."""
    import importlib.machinery
    import importlib.util

    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for args, says in (
        (["--lessons", "99"], "unknown lesson '99'"),
        (["--out", str(a_file)], "it exists and is not a folder"),
        (["--out", "/proc/x/out"], "cannot write to --out /proc/x/out"),
    ):
        proc = subprocess.run(
            [sys.executable, str(ROOT / ".ci" / "prove-perturbed"), *args], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 2 and says in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    loader = importlib.machinery.SourceFileLoader("prove_perturbed", str(ROOT / ".ci" / "prove-perturbed"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    card = tmp_path / "claims.json"
    card.write_text(
        json.dumps({"lessons": {"02": ["not", "an", "object"], "03": {"claims": [{"verdict": "holds"}, 7]}}})
    )
    assert module.counts(card) == {"02": "unreadable", "03": "1✅ 1unreadable"}


def test_a_truncated_or_pickled_npz_is_refused_before_any_lesson_starts(tmp_path):
    """`prove --lessons 04 --data npz:` a truncated or pickled file started the lesson, which failed with fragments
    of a traceback (the fifth hostile pass): the file's headers are read up front, and it is one line, exit 2."""
    import numpy as np

    good = tmp_path / "good.npz"
    np.savez(good, x_train=np.zeros((4, 32, 32, 3), np.uint8), y_train=np.zeros(4, np.int64))
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(good.read_bytes()[:200])
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, x_train=np.array([object()] * 3, dtype=object), y_train=np.zeros(3))
    assert proof._npz_problem(str(good)) is None
    for path, says in ((truncated, "is not a readable .npz archive"), (pickled, "is an object array")):
        proc = _prove("--lessons", "04", "--data", f"npz:{path}", "--out", str(tmp_path / "out"), timeout=60)
        assert proc.returncode == 2 and says in proc.stderr, (path, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
        assert not (tmp_path / "out").exists()


# --from notebooks: the card read from the executed notebook (the issue: the notebook is the proof)


def _notebook(path: pathlib.Path, *sources: str) -> pathlib.Path:
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


TABLE = (
    "from course_utils import report\n"
    "report.ClaimsTable([report.Claim('It holds', '§1', 'x', 'x', True, lesson='03', id='03.fake',"
    " where='m:f'), report.Claim('It cannot be seen', '§2', 'y', '—', None, lesson='03', id='03.other',"
    " note='smoke sizes')])"
)


@pytest.mark.parametrize(
    "cells, says",
    [
        ((TABLE,), None),
        (("import os\nassert os.getcwd() != " + repr(str(ROOT)), TABLE), None),  # a scratch folder, not the checkout
        (("x = 1", "raise ValueError('boom')", TABLE), "cell 2 of 3: ValueError: boom"),
        (("x = 1",), "but saved no claims table for lesson 03 (FileNotFoundError)"),
    ],
)
def test_notebook_claims_are_what_the_executed_notebooks_table_saved(tmp_path, monkeypatch, cells, says):
    path = _notebook(tmp_path / "03_fake.ipynb", *cells)
    monkeypatch.setattr(proof, "lesson_notebook", lambda lesson: path)
    lines: list[str] = []
    if says is None:
        claims = proof.notebook_claims(lessons.BY_ID["03"], lines.append)
        assert [(c.id, c.outcome, c.where, c.note) for c in claims] == [
            ("03.fake", report.Verdict.HOLDS, "m:f", ""),
            ("03.other", report.Verdict.UNMEASURABLE, "", "smoke sizes"),
        ]
    else:
        with pytest.raises(RuntimeError, match=re.escape(says)):
            proof.notebook_claims(lessons.BY_ID["03"], lines.append)
    assert not list(tmp_path.glob("claims-*")) and not (tmp_path / "runs").exists()  # written in its own scratch


@pytest.mark.parametrize("content", [b'{"cells": [', b"not a notebook", b"\xff\xfe\x00"])
def test_a_notebook_that_cannot_be_read_is_one_clear_error(tmp_path, monkeypatch, content):
    path = tmp_path / "03_broken.ipynb"
    path.write_bytes(content)
    monkeypatch.setattr(proof, "lesson_notebook", lambda lesson: path)
    with pytest.raises(RuntimeError, match=r"03_broken.ipynb cannot be read as a notebook \(\w+\): restore it"):
        proof.notebook_claims(lessons.BY_ID["03"], lambda line: None)


def test_prove_needs_the_notebooks_and_jupyters_runner_and_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(proof, "lesson_notebook", lambda lesson: None)
    with pytest.raises(
        proof.UsageError,
        match=r"^prove executes the lessons' notebooks, and "
        r"notebooks/03_mixed_precision.ipynb is neither in this checkout nor "
        r"installed with course_utils: reinstall",
    ):
        proof._parse(["--lessons", "03", "--out", str(tmp_path)])
    monkeypatch.undo()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ipykernel" else real(name, *a))
    with pytest.raises(proof.UsageError, match=r"needs nbclient, nbformat and ipykernel \(ipykernel missing\): pip "):
        proof._parse(["--lessons", "03", "--out", str(tmp_path)])
