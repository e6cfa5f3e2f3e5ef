"""course_utils.processes with ``fork=True``: a forked task behaves as ``python -m module`` would — its own environment,
directory, process group, output, exit code and TensorFlow runtime — a changed import-time setting gets a new server,
and a timeout is the course's one timeout type."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from course_utils import processes

pytestmark = pytest.mark.skipif(not processes.can_fork(), reason="forking tasks needs Linux")


def _run(args, env, cwd, timeout):  # python -m fs_program ARGS, forked, stdout and stderr on one pipe
    return processes.run(
        [sys.executable, "-m", "fs_program", *args],
        fork=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
        stderr=subprocess.STDOUT,
    )


def _start(args, env, cwd):
    return processes.start([sys.executable, "-m", "fs_program", *args], fork=True, env=env, cwd=cwd)


PROGRAM = textwrap.dedent("""
    import json, os, sys, time
    what = sys.argv[1]
    if what == "report":
        import tensorflow as tf
        print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "pgid": os.getpgid(0), "pid": os.getpid(),
                          "config": os.environ.get("TF_CONFIG"), "home": os.environ.get("TASK_ONLY"),
                          "inherited": os.environ.get("FORKSERVER_TEST_PARENT_ONLY"),
                          "log_level": os.environ.get("TF_CPP_MIN_LOG_LEVEL"),
                          "cmdline": open("/proc/self/cmdline").read().replace(chr(0), " ").strip(),
                          "sum": float(tf.reduce_sum(tf.ones([3])))}))
        print("on stderr", file=sys.stderr)
    elif what == "exit":
        sys.exit(int(sys.argv[2]))
    elif what == "raise":
        raise ValueError("raised on purpose")
    elif what == "sleep":
        print("sleeping", flush=True)
        time.sleep(60)
""")


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    folder = tmp_path_factory.mktemp("forkserver")
    (folder / "fs_program.py").write_text(PROGRAM)
    os.environ["FORKSERVER_TEST_PARENT_ONLY"] = "yes"  # in the launcher's environment, not the task's
    env = {"PATH": os.environ.get("PATH", ""), "TF_CPP_MIN_LOG_LEVEL": "2", "TASK_ONLY": "set for the task"}
    try:
        yield str(folder), env
    finally:
        del os.environ["FORKSERVER_TEST_PARENT_ONLY"]
        processes.stop_servers()


def test_a_forked_task_gets_its_own_environment_directory_group_output_and_runtime(program):
    import json

    cwd, env = program
    done = _run(["report", "x y"], dict(env, TF_CONFIG='{"task": 1}'), cwd, 120)
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    report = json.loads(next(line for line in lines if line.startswith("{")))
    assert report["argv"] == ["report", "x y"]
    assert report["cwd"] == cwd
    assert report["pgid"] == report["pid"] != os.getpid()  # its own process group: stopped as a whole
    assert report["config"] == '{"task": 1}' and report["home"] == "set for the task"
    assert report["inherited"] is None  # only the environment given
    assert report["sum"] == 3.0  # its TensorFlow runs ops (the server never did)
    assert report["cmdline"] == f"{sys.executable} -m fs_program report 'x y'"  # what ps shows: the task's command
    assert "on stderr" in lines  # stderr on the same pipe


@pytest.mark.parametrize(
    "what, code, shown",
    [(["exit", "0"], 0, None), (["exit", "42"], 42, None), (["raise"], 1, "ValueError: raised on purpose")],
)
def test_exit_codes_are_those_of_python_m(program, what, code, shown):
    cwd, env = program
    done = _run(what, env, cwd, 120)
    assert done.returncode == code
    if shown:  # as a fresh `python -m` shows it
        fresh = subprocess.run(
            [sys.executable, "-m", "fs_program", *what], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
        )
        assert fresh.returncode == code
        assert shown in done.stdout and shown in fresh.stderr


def test_a_signal_reaches_the_task_alone_and_its_code_says_so(program):
    cwd, env = program
    first = _start(["sleep"], env, cwd)
    second = _start(["sleep"], env, cwd)
    try:
        assert first.stdout.readline().strip() == "sleeping"
        os.killpg(first.pid, signal.SIGTERM)
        assert first.wait(timeout=30) == -signal.SIGTERM
        assert second.poll() is None  # the other task runs on
        with pytest.raises(subprocess.TimeoutExpired):
            second.wait(timeout=0.2)
    finally:
        second.kill()
        assert second.wait(timeout=30) == -signal.SIGKILL
        for proc in (first, second):
            proc.stdout.close()


def test_an_import_time_setting_starts_a_new_server_a_per_task_one_does_not(program):
    import json

    cwd, env = program

    def level(**extra):
        done = _run(["report"], dict(env, **extra), cwd, 120)
        assert done.returncode == 0, done.stdout
        return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))["log_level"]

    processes.stop_servers()
    assert level() == "2"
    [server] = processes._servers.values()
    level(TF_CONFIG="{}", TF_NUM_INTEROP_THREADS="1")
    assert list(processes._servers.values()) == [server]  # read after the fork: the same server
    assert level(TF_CPP_MIN_LOG_LEVEL="3") == "3"  # read while importing TensorFlow: a server imported with it
    assert len(processes._servers) == 2 and server in processes._servers.values()


def test_a_task_outlives_a_timeout_no_longer_than_the_timeout_and_says_so_in_one_line(program):
    cwd, env = program
    start = time.monotonic()
    with pytest.raises(processes.TimedOut) as caught:
        processes.run(
            [sys.executable, "-m", "fs_program", "sleep"],
            fork=True,
            env=env,
            cwd=cwd,
            timeout=2,
            what="the sleeping task",
        )
    assert time.monotonic() - start < 15
    assert isinstance(caught.value, subprocess.TimeoutExpired)  # one type: what `except TimeoutExpired` catches
    assert str(caught.value) == "the sleeping task ran past 2 s and was stopped (its last line: sleeping)"
    assert caught.value.output.strip() == "sleeping" and caught.value.timeout == 2


def test_fork_takes_only_a_python_command_with_an_env_and_text_pipes(program):
    cwd, env = program
    for argv, extra in [
        (["ls"], {"env": env}),
        ([sys.executable, "-m", "fs_program"], {}),
        ([sys.executable, "-m", "fs_program"], {"env": env, "stdin": subprocess.PIPE}),
        ([sys.executable, "-m", "fs_program"], {"env": env, "text": False}),
    ]:
        with pytest.raises(ValueError, match="fork=True runs"):
            processes.start(argv, fork=True, **extra)


def test_where_it_cannot_fork_the_same_command_starts_afresh(program, monkeypatch):
    cwd, env = program
    monkeypatch.setattr(processes, "can_fork", lambda: False)
    proc = _start(["exit", "7"], env, cwd)
    assert isinstance(proc, subprocess.Popen) and proc.wait(timeout=60) == 7
    proc.stdout.close()
    done = processes.run(
        [sys.executable, "-c", "import sys; print(repr(sys.stdin.read()))"], fork=True, env=env, timeout=60
    )
    assert done.stdout.strip() == "''"  # stdin /dev/null, as a forked child's: never the launcher's terminal


def test_a_dead_server_reports_its_tasks_killed(program):
    cwd, env = program
    task = _start(["sleep"], env, cwd)
    try:
        assert task.stdout.readline().strip() == "sleeping"
        for server in processes._servers.values():
            server.proc.kill()
        assert task.wait(timeout=30) == -signal.SIGKILL
        with pytest.raises(ProcessLookupError):  # stopped, not left running as an orphan
            for _ in range(100):
                os.kill(task.pid, 0)
                time.sleep(0.1)
    finally:
        task.stdout.close()


def test_a_server_whose_error_message_is_lost_still_says_why(tmp_path, monkeypatch):
    """A server that cannot import TensorFlow sends why and exits; if our request reached it unread, the kernel
    reported ECONNRESET and its message was once lost ("could not start ...: it exited with code 0"). Its own stderr
    line keeps the reason: here the message is dropped on purpose, and the reason must still come through."""
    fake = tmp_path / "fake" / "tensorflow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("libtensorflow_framework.so.2: cannot open")\n')
    # PYTHONPATH is read at import: a server of its own, which finds this broken TensorFlow
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "fake"), os.environ.get("PYTHONPATH", "")]))
    real = processes.json.loads  # the json module itself: patched for this test only

    def drop_errors(data):
        message = real(data)
        return {"ignored": True} if isinstance(message, dict) and "error" in message else message

    monkeypatch.setattr(processes.json, "loads", drop_errors)
    with pytest.raises(processes.ServerFailed) as caught:
        processes.start([sys.executable, "-c", "pass"], fork=True, env=env)
    assert "TensorFlow could not be imported (ImportError: libtensorflow_framework.so.2" in str(caught.value)
