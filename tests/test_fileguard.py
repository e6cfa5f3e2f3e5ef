"""course_utils.fileguard: atomic writes that never follow a link, reads of regular files only, a folder lock, and
process groups that stop with their parent (SIGTERM, SIGHUP, SIGKILL). Processes are real (fresh interpreters), as
a command line tool meets them."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from course_utils import fileguard, processes

ROOT = pathlib.Path(__file__).resolve().parents[1]
posix_only = pytest.mark.skipif(not hasattr(os, "killpg") or not hasattr(os, "mkfifo"), reason="POSIX only")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, only not reaped yet
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS)
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.02)
    return not _alive(pid)


def _script(code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# ----------------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------------


def test_write_replaces_atomically_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "claims.json"
    target.write_text("old")
    fileguard.write_json(target, {"lessons": {"02": "é"}})
    assert json.loads(target.read_text(encoding="utf-8")) == {"lessons": {"02": "é"}}
    fileguard.write_text(tmp_path / "report.md", "# card\n", inside=tmp_path)
    assert (tmp_path / "report.md").read_text() == "# card\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["claims.json", "report.md"]


@posix_only
def test_write_refuses_a_link_and_leaves_its_target_alone(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").symlink_to(outside)
    (out / "dangling.json").symlink_to(tmp_path / "does-not-exist")
    for name in ("report.md", "dangling.json"):
        with pytest.raises(fileguard.UnsafePath, match="symbolic link"):
            fileguard.write_text(out / name, "overwritten?", inside=out)
    assert outside.read_text() == "precious" and not (tmp_path / "does-not-exist").exists()
    assert sorted(p.name for p in out.iterdir()) == ["dangling.json", "report.md"]  # no temporary file left


@posix_only
def test_write_refuses_a_path_outside_inside_and_a_non_regular_file(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "sub").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(fileguard.UnsafePath, match="outside"):
        fileguard.write_text(out / "sub" / "claims.json", "x", inside=out)
    assert list(elsewhere.iterdir()) == []
    os.mkfifo(out / "fifo.md")
    with pytest.raises(fileguard.UnsafePath, match="not a regular file"):
        fileguard.write_text(out / "fifo.md", "x")
    assert isinstance(fileguard.UnsafePath("x"), ValueError)


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary_one(tmp_path, monkeypatch):
    target = tmp_path / "claims.json"
    target.write_text("every earlier lesson")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as info:
        fileguard.write_text(target, "new")
    assert info.value.errno == errno.ENOSPC
    assert target.read_text() == "every earlier lesson" and [p.name for p in tmp_path.iterdir()] == ["claims.json"]


@posix_only
def test_read_regular_reads_only_regular_files_up_to_a_limit(tmp_path):
    (tmp_path / "small.json").write_bytes(b"{}")
    assert fileguard.read_regular(tmp_path / "small.json", 2) == b"{}"
    with pytest.raises(fileguard.NotRegular, match="larger than 1 bytes"):
        fileguard.read_regular(tmp_path / "small.json", 1)
    os.mkfifo(tmp_path / "fifo")  # no writer: a plain open() would wait forever
    for path in (tmp_path / "fifo", tmp_path, "/dev/zero"):
        with pytest.raises(fileguard.NotRegular, match="not a regular file"):
            fileguard.read_regular(path, 100)
    (tmp_path / "link").symlink_to(tmp_path / "small.json")
    assert fileguard.read_regular(tmp_path / "link", 10) == b"{}"
    with pytest.raises(fileguard.NotRegular, match="symbolic link"):
        fileguard.read_regular(tmp_path / "link", 10, follow_links=False)
    assert issubclass(fileguard.NotRegular, ValueError)


@posix_only
@pytest.mark.parametrize(
    "case, message",
    [
        ("empty", "empty"),
        ("file", "not a folder"),
        ("under-file", "Not a directory"),
        ("fifo", "not a folder"),
    ],
)
def test_folder_problem_names_what_is_wrong_in_one_line(tmp_path, case, message):
    (tmp_path / "a_file").write_text("")
    os.mkfifo(tmp_path / "a_fifo")
    raw = {
        "empty": "",
        "file": tmp_path / "a_file",
        "under-file": tmp_path / "a_file" / "out",
        "fifo": tmp_path / "a_fifo",
    }[case]
    problem = fileguard.folder_problem(raw)
    assert problem and message in problem and "\n" not in problem
    assert fileguard.folder_problem(tmp_path / "new" / "folder") is None and (tmp_path / "new" / "folder").is_dir()
    assert list((tmp_path / "new" / "folder").iterdir()) == []


# ----------------------------------------------------------------------------------------------
# Locks
# ----------------------------------------------------------------------------------------------


@posix_only
def test_folder_lock_refuses_a_second_writer_naming_its_pid(tmp_path):
    holder = _script(f"""
        import sys, time
        from course_utils import fileguard
        with fileguard.folder_lock({str(tmp_path)!r}, "site"):
            print("locked", flush=True)
            time.sleep(60)
    """)
    try:
        assert holder.stdout.readline().strip() == "locked", holder.stderr.read()
        with pytest.raises(fileguard.FolderBusy) as info:
            with fileguard.folder_lock(tmp_path, "site"):
                pass
        assert f"another site is writing to {tmp_path} (pid {holder.pid})" in str(info.value)
    finally:
        holder.kill()
        holder.wait()
    with fileguard.folder_lock(tmp_path, "site"):  # the kernel dropped the dead holder's lock
        assert (tmp_path / ".lock").read_text().strip() == str(os.getpid())


@posix_only
def test_folder_lock_refuses_a_link(tmp_path):
    (tmp_path / "elsewhere").write_text("keep")
    (tmp_path / ".lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(fileguard.UnsafePath, match="symbolic link"):
        with fileguard.folder_lock(tmp_path):
            pass
    assert (tmp_path / "elsewhere").read_text() == "keep"


# ----------------------------------------------------------------------------------------------
# Processes
# ----------------------------------------------------------------------------------------------

# a process group to stop: a child that starts a grandchild and prints both pids
GROUP = (
    "import subprocess, sys, time; g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "print(g.pid, flush=True); time.sleep(60)"
)


@posix_only
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_a_signal_stops_the_group_and_exits_128_plus_signal(signame):
    tool = _script(f"""
        import subprocess, sys
        from course_utils import processes
        with processes.stop_on_signals():
            try:
                with processes.group([sys.executable, "-c", {GROUP!r}], stdout=subprocess.PIPE, text=True) as proc:
                    print(proc.pid, proc.stdout.readline().strip(), flush=True)
                    proc.wait()
            except processes.Stopped as stop:
                print(f"tool: {{stop.name}}", file=sys.stderr)
                sys.exit(128 + stop.signum)
    """)
    child, grandchild = map(int, tool.stdout.readline().split())
    tool.send_signal(getattr(signal, signame))
    _, err = tool.communicate(timeout=30)
    assert tool.returncode == 128 + getattr(signal, signame) and err.strip() == f"tool: {signame}", err
    assert _gone_within(child, 1) and _gone_within(grandchild, 1)


@posix_only
def test_the_group_is_stopped_when_the_block_ends_also_after_the_process_itself_ended():
    """What the process started (here: a grandchild left behind when the child exits) goes with the block."""
    leaves_one = GROUP.rsplit(";", 1)[0]  # starts the grandchild, prints its pid, exits
    with processes.group([sys.executable, "-c", leaves_one], stdout=subprocess.PIPE, text=True) as proc:
        grandchild = int(proc.stdout.readline())
        assert proc.wait(timeout=30) == 0 and _alive(grandchild)
    assert _gone_within(grandchild, 1)


@posix_only
def test_the_group_dies_when_its_parent_is_killed():
    tool = _script(f"""
        import subprocess, sys, time
        from course_utils import processes
        with processes.group([sys.executable, "-c", {GROUP!r}], stdout=subprocess.PIPE, text=True) as proc:
            print(proc.pid, proc.stdout.readline().strip(), flush=True)
            time.sleep(60)
    """)
    child, grandchild = map(int, tool.stdout.readline().split())
    tool.kill()  # SIGKILL: no handler, no finally, no atexit
    tool.wait()
    assert _gone_within(child, 3) and _gone_within(grandchild, 3)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux only")
def test_die_with_parent_ends_a_process_whose_parent_was_killed():
    parent = _script("""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import os, sys, time; from course_utils import processes; "
                                  "assert processes.die_with_parent(int(sys.argv[1])); print('armed', flush=True); "
                                  "time.sleep(60)", str(__import__('os').getpid())], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "armed"
        print(child.pid, flush=True)
        time.sleep(60)
    """)
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    assert _gone_within(child, 1)


def test_run_captures_a_child_and_a_timeout_kills_its_whole_group_in_one_line():
    """processes.run: output captured as text, stdin closed; past its timeout the child and what it started are
    killed (the grandchild's pid no longer exists) and the error is one line naming what ran and its last words."""
    done = processes.run(
        [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); print(sys.stdin.read() == '')"]
    )
    assert (done.returncode, done.stdout.split(), done.stderr.strip()) == (0, ["out", "True"], "err")
    grandchild = (
        "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
        "time.sleep(60)']); print(p.pid, flush=True); print('waiting for ever', file=sys.stderr, flush=True); "
        "time.sleep(60)"
    )
    started = time.monotonic()
    with pytest.raises(processes.TimedOut) as caught:
        processes.run([sys.executable, "-c", grandchild], timeout=3, what="the sleeper")
    assert time.monotonic() - started < 20
    message = str(caught.value)
    assert "\n" not in message and message.startswith("the sleeper ran past 3 s and was stopped")
    assert "waiting for ever" in message
    # the grandchild was in the same group: gone (reaped by init) within a moment
    import re

    pid = None
    for _ in range(50):
        out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
        pid = re.search(r"^\s*(\d+) \S*python\S* -c import time; time.sleep\(60\)$", out, re.M)
        if pid is None:
            break
        time.sleep(0.1)
    assert pid is None, "the grandchild outlived the timeout"


def test_tail_keeps_the_last_lines_of_text_or_bytes():
    assert processes.tail("a\nb\nc\n\n", 2) == "b\nc"
    assert processes.tail(b"x\ny", 1) == "y"
    assert processes.tail(None) == ""
