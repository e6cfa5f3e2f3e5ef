"""course_utils.cluster: a real 2-worker TensorFlow cluster on localhost, and every way it can fail.

Each test checks that no process it started is left behind: the tasks (by pid) and a grandchild a task
starts (by the pid it writes), since the launcher stops each task's whole process group.

The clusters' results — two MultiWorkerMirrored workers with identical weights equal to one process, each reading
half of every global batch, and a worker SIGKILLed mid-run with the restarted cluster committing every step once —
are lesson 08's claims: its notebook runs those clusters in the default pytest (and the suite fails a claim that does
not hold), and ``prove`` runs them in full mode. They are not run a second time here.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from course_utils import cluster

pytestmark = pytest.mark.usefixtures("float32_policy")  # conftest.py


def _gone(pid: int, within_s: float = 5.0) -> bool:
    """The process has exited (or is a zombie) — allowing a killed grandchild a moment to finish dying."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _task_script(tmp_path, body: str) -> list[str]:
    """A task that writes its pid and a sleeping grandchild's pid, then runs ``body`` (index ``i``)."""
    script = tmp_path / "task.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, os, subprocess, sys, time
        i = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        kind = json.loads(os.environ["TF_CONFIG"])["task"]["type"]
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        final = os.path.join({str(tmp_path)!r}, f"pids_{{kind}}{{i}}.json")
        with open(final + ".tmp", "w") as f:  # whole or not there: the test reads it as soon as it exists
            json.dump([os.getpid(), child.pid], f)
        os.replace(final + ".tmp", final)
        print("task", i, "started", flush=True)
    """)
        + textwrap.dedent(body)
    )
    return [sys.executable, str(script)]


def _pids(tmp_path) -> list[int]:
    out = []
    for path in sorted(tmp_path.glob("pids_*.json")):
        out += json.loads(path.read_text())
    return out


def _wait_for_pid_files(tmp_path, n: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while len(list(tmp_path.glob("pids_*.json"))) < n and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_worker_that_crashes_on_import_fails_fast_and_stops_the_others(tmp_path):
    command = _task_script(
        tmp_path,
        """
        if i == 1:
            time.sleep(0.5)  # let worker 0 start waiting, as it would for a collective
            import no_such_module_for_the_course_test
        time.sleep(120)  # worker 0: waits for its peer forever
    """,
    )
    start = time.monotonic()
    with pytest.raises(cluster.ClusterError) as info:
        cluster.run_cluster(command, workers=2, timeout=60, log=None)
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert "worker 1 exited with code 1" in message and "ModuleNotFoundError" in message, message
    assert elapsed < 20, elapsed
    pids = _pids(tmp_path)
    assert len(pids) == 4 and all(_gone(pid) for pid in pids), pids


@pytest.mark.extended  # waits out a limit (5 s): .ci/run
def test_timeout_stops_every_task_and_its_children(tmp_path):
    command = _task_script(tmp_path, "time.sleep(120)\n")
    start = time.monotonic()
    with pytest.raises(cluster.ClusterError, match=r"did not finish in 3 s"):
        cluster.run_cluster(command, workers=2, timeout=3, log=None)
    assert time.monotonic() - start < 15
    pids = _pids(tmp_path)
    assert len(pids) == 4 and all(_gone(pid) for pid in pids), pids


def test_keyboard_interrupt_stops_every_task(tmp_path, monkeypatch):
    command = _task_script(tmp_path, "time.sleep(120)\n")
    real_sleep = time.sleep
    pressed = []

    def interrupted_sleep(seconds):  # Ctrl-C once, while the launcher waits for running tasks
        if not pressed and len(list(tmp_path.glob("pids_*.json"))) == 2:
            pressed.append(True)
            raise KeyboardInterrupt
        real_sleep(seconds)

    monkeypatch.setattr(cluster.time, "sleep", interrupted_sleep)
    with pytest.raises(KeyboardInterrupt):
        cluster.run_cluster(command, workers=2, timeout=60, log=None)
    _wait_for_pid_files(tmp_path, 2, timeout=1)
    pids = _pids(tmp_path)
    assert len(pids) == 4 and all(_gone(pid) for pid in pids), pids


def test_a_port_in_use_is_refused_before_anything_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        free = cluster.free_ports(1)[0]
        with pytest.raises(cluster.ClusterError, match=f"port {port} on 127.0.0.1 is in use"):
            cluster.run_cluster(_task_script(tmp_path, ""), workers=2, ports=[port, free], log=None)
    assert not list(tmp_path.glob("pids_*.json"))  # no task was started


def test_tf_config_and_argument_checks():
    c = {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": ["127.0.0.1:3"]}
    assert json.loads(cluster.tf_config(c, "worker", 1)) == {"cluster": c, "task": {"type": "worker", "index": 1}}
    with pytest.raises(ValueError, match="out of range"):
        cluster.tf_config(c, "worker", 2)
    with pytest.raises(ValueError, match="not in the cluster"):
        cluster.tf_config(c, "chief", 0)
    with pytest.raises(ValueError, match="argv list"):
        cluster.run_cluster("python train.py")
    with pytest.raises(ValueError, match="at most 16 tasks"):
        cluster.run_cluster(["python"], workers=17)
    with pytest.raises(ValueError, match="at least one task"):
        cluster.run_cluster(["python"], workers=0)
    with pytest.raises(ValueError, match="2 tasks need 2 ports"):
        cluster.run_cluster(["python"], workers=2, ports=[1])
    ports = cluster.free_ports(3)
    assert len(set(ports)) == 3


def test_command_line_exit_codes():
    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "course_utils", "cluster", *args], capture_output=True, text=True, timeout=120
        )

    assert run().returncode == 2  # no program
    ok = run("--workers", "2", "--", sys.executable, "-c", "print('hello')")
    assert ok.returncode == 0 and "[worker 1] hello" in ok.stdout and "2 task(s) finished" in ok.stdout
    bad = run("--workers", "2", "--timeout", "60", "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert bad.returncode == 1 and "exited with code 3" in bad.stderr and "Traceback" not in bad.stderr
    assert run("--workers", "two").returncode == 2
    many = run("--workers", "1000", "--", sys.executable, "-c", "pass")
    assert many.returncode == 2 and "at most 16 tasks" in many.stderr  # nothing started
    zero = run("--workers", "2", "--timeout", "0", "--", sys.executable, "-c", "pass")
    assert zero.returncode == 2 and "timeout must be a positive" in zero.stderr
    missing = run("--workers", "2", "--", "/no/such/program")
    assert (
        missing.returncode == 1 and "could not start worker 0" in missing.stderr and "Traceback" not in missing.stderr
    )


def test_parameter_server_layout_ends_when_the_chief_ends(tmp_path):
    """wait_for=("chief",): workers and parameter servers serve until stopped, as in ParameterServerStrategy."""
    command = _task_script(
        tmp_path,
        """
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        if task["type"] == "chief":
            import glob
            deadline = time.time() + 30  # until every task has started (and written its pids)
            while len(glob.glob(os.path.join(os.path.dirname(__file__), "pids_*.json"))) < 4 and time.time() < deadline:
                time.sleep(0.05)
            print("cluster", sorted(json.loads(os.environ["TF_CONFIG"])["cluster"]), flush=True)
            sys.exit(0)
        time.sleep(120)  # a server: never exits by itself
    """,
    )
    lines = []
    result = cluster.run_cluster(
        command, workers=2, ps=1, chief=True, timeout=60, log=lines.append, wait_for=("chief",)
    )
    assert result.ok() and result.awaited == ("chief 0",)
    assert result.returncodes["chief 0"] == 0 and all(
        result.returncodes[n] < 0 for n in ("worker 0", "worker 1", "ps 0")
    )
    assert "[chief 0] cluster ['chief', 'ps', 'worker']" in lines
    pids = _pids(tmp_path)
    assert len(pids) == 8 and all(_gone(pid) for pid in pids) and all(_gone(pid) for pid in result.pids.values())


def test_a_broken_log_callback_does_not_stall_the_tasks(tmp_path):
    def broken(line):
        raise RuntimeError("log exploded")

    command = [sys.executable, "-c", "print('x' * 100000); print('done', flush=True)"]
    result = cluster.run_cluster(command, workers=2, timeout=30, log=broken)
    assert result.ok() and all(lines[-1] == "done" for lines in result.logs.values())


def test_worker_program_refuses_bad_arguments_in_one_line(tmp_path):
    def run(*args, tf_config=True):
        env = dict(os.environ)
        env.pop("TF_CONFIG", None)
        if tf_config:
            env["TF_CONFIG"] = cluster.tf_config({"worker": ["127.0.0.1:1"]}, "worker", 0)
        return subprocess.run(
            [sys.executable, "-m", "course_utils.lessons.scaling_out.multiworker", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    for bad in (["--steps", "0", "--out", str(tmp_path)], ["--steps", "-3", "--out", str(tmp_path)]):
        result = run(*bad)
        assert result.returncode == 2 and "must be at least 1" in result.stderr and "Traceback" not in result.stderr
    alone = run("--out", str(tmp_path), tf_config=False)
    assert alone.returncode == 2 and "python -m course_utils cluster" in alone.stderr


# -- issue 21: the launcher ends every task however it ends; bad arguments are refused --------------------------


def _cli(tmp_path, *args, workers=2):
    command = _task_script(tmp_path, "time.sleep(120)\n")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "course_utils",
            "cluster",
            "--workers",
            str(workers),
            "--timeout",
            "300",
            *args,
            "--",
            *command,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM", "SIGHUP"])
def test_every_task_and_its_children_end_when_the_launcher_ends(tmp_path, sig):
    """SIGKILL cannot be caught: the sentinel stops the groups when the launcher's pipe closes. SIGTERM and SIGHUP
    (a closed terminal) stop them through the launcher itself, which says so and exits 128 + the signal."""
    launcher = _cli(tmp_path)
    try:
        _wait_for_pid_files(tmp_path, 2)
        pids = _pids(tmp_path)
        assert len(pids) == 4, pids
        os.kill(launcher.pid, getattr(signal, sig))
        _, err = launcher.communicate(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert all(_gone(pid, within_s=10) for pid in pids), [p for p in pids if not _gone(p, 0)]
    if sig != "SIGKILL":
        assert launcher.returncode == 128 + getattr(signal, sig), err
        assert f"cluster: stopped by {sig}; every task was stopped" in err and "Traceback" not in err


def test_ctrl_c_while_tasks_start_leaves_none_behind(tmp_path):
    """Ctrl-C that lands while a task is being started (here: inside the call that starts it, every time) is held
    until the task is on the list, then stops every task started so far. In a fresh process: a main thread."""
    code = textwrap.dedent(f"""
        import os, signal, subprocess, sys
        from course_utils import cluster
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even if started with it ignored
        real = subprocess.Popen
        def popen(*args, **kwargs):
            proc = real(*args, **kwargs)
            if "TF_CONFIG" in (kwargs.get("env") or {{}}):
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C between the start and the task list
            return proc
        subprocess.Popen = popen
        try:
            cluster.run_cluster({_task_script(tmp_path, "time.sleep(120)")!r}, workers=3, timeout=60, log=None)
        except KeyboardInterrupt:
            print("interrupted")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "interrupted", proc.stdout + proc.stderr
    time.sleep(0.5)
    pids = _pids(tmp_path)
    assert all(_gone(pid) for pid in pids), pids  # the first task (if it wrote its pids) and its child are gone
    script = str(tmp_path / "task.py")
    started = [p.pid for p in psutil.process_iter(["cmdline"]) if script in " ".join(p.info["cmdline"] or [])]
    assert all(_gone(pid) for pid in started), started


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"timeout": float("nan")}, "positive, finite"),
        ({"timeout": float("inf")}, "positive, finite"),
        ({"timeout": "soon"}, "number of seconds"),
        ({"workers": 2.5}, "whole number"),
        ({"workers": "2"}, "whole number"),
        ({"workers": True}, "whole number"),
        ({"ps": -1, "workers": 2}, "0 or more"),
        ({"ports": [0, 5000]}, "port 0"),
        ({"ports": [70000, 5000]}, "outside 1-65535"),
        ({"ports": [5000, 5000]}, "more than one task"),
        ({"ports": [5000.5, 5001]}, "whole numbers"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(tmp_path, kwargs, words):
    kwargs = {"workers": 2, **kwargs}
    with pytest.raises(ValueError, match=words):
        cluster.launch("course_utils.lessons.scaling_out.multiworker", log=None, **kwargs)
    assert not list(tmp_path.glob("pids_*.json"))


def test_timeout_nan_on_the_command_line_is_one_line_exit_2():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "course_utils",
            "cluster",
            "--workers",
            "2",
            "--timeout",
            "nan",
            "--",
            sys.executable,
            "-c",
            "pass",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "cluster: timeout must be a positive, finite number of seconds, got nan"
    ], proc.stderr


def test_a_task_that_prints_hundreds_of_mb_keeps_the_launcher_small(tmp_path):
    """200 MB without a newline, then 1,000,000 short lines: the launcher keeps a bounded tail of each."""
    command = [
        sys.executable,
        "-c",
        "import sys\n"
        "for _ in range(200): sys.stdout.write('x' * 1_000_000)\n"
        "print()\n"
        "for i in range(1_000_000): print('line', i)\n"
        "print('done')",
    ]
    before = psutil.Process().memory_info().rss
    result = cluster.run_cluster(command, workers=1, timeout=120, log=None)
    grew_mib = (psutil.Process().memory_info().rss - before) / 2**20
    lines = result.logs["worker 0"]
    assert result.ok() and lines[-1] == "done" and len(lines) == cluster.MAX_LOG_LINES
    assert max(len(line) for line in lines) <= cluster.MAX_LINE_CHARS
    assert grew_mib < 100, grew_mib  # it held all of it before: 1.5 GB


def test_clusters_launched_at_once_are_never_given_the_same_port(monkeypatch):
    """Two clusters launched from two threads (lesson 08's hung-worker demo) were given the same port: free when
    picked, taken by the first cluster's task a moment later. The OS may hand a just-released port out again; this
    process does not, for PORT_REUSE_AFTER_S."""
    import socket as socket_module

    offered = iter([41000, 41001, 41000, 41001, 41002, 41003])  # what the OS offers, call after call

    class FakeSocket:
        def __init__(self, *args):
            self.port = None

        def bind(self, address):
            self.port = next(offered)

        def getsockname(self):
            return ("127.0.0.1", self.port)

        def close(self):
            pass

    monkeypatch.setattr(cluster, "_GIVEN_PORTS", {})
    monkeypatch.setattr(cluster, "_ephemeral_low", lambda: None)  # the OS picks (not Linux)
    monkeypatch.setattr(socket_module, "socket", FakeSocket)
    first, second = cluster.free_ports(2), cluster.free_ports(2)
    assert first == [41000, 41001] and second == [41002, 41003]


@pytest.mark.skipif(cluster._ephemeral_low() is None, reason="reads Linux's ephemeral port range")
def test_ports_come_from_below_the_range_outgoing_connections_use(monkeypatch):
    """Lesson 08's three overlapped clusters (TPU-shaped prove): a port picked by the OS from the ephemeral range was
    taken (or left in TIME_WAIT) by the other clusters' gRPC connections before its task bound it: "port 39031 on
    127.0.0.1 is in use by another program". Below that range no outgoing connection can take it."""
    monkeypatch.setattr(cluster, "_GIVEN_PORTS", {})
    low = cluster._ephemeral_low()
    picked = [cluster.free_ports(3) for _ in range(20)]
    ports = [p for three in picked for p in three]
    assert all(max(2048, low - 8192) <= p < low for p in ports), (low, ports)
    assert len(set(ports)) == len(ports)  # never handed out twice by this process
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a port another program holds is not picked
        s.bind(("127.0.0.1", 0))
        s.listen()
        monkeypatch.setattr(cluster, "_GIVEN_PORTS", {})
        monkeypatch.setattr(cluster, "_ephemeral_low", lambda: s.getsockname()[1] + 1)
        assert s.getsockname()[1] not in [p for _ in range(50) for p in cluster.free_ports(4)]


def test_stop_on_failure_false_leaves_the_others_running_and_says_when_each_ended(tmp_path):
    """Lesson 08's fault demos: a dead task must not stop its peers when what they do next is the point. Worker 1 fails
    at once; worker 0 runs on, notices (here: after a sleep) and fails too; both ends are reported, in order, with
    when each happened. By default worker 0 is stopped at once."""
    command = _task_script(
        tmp_path,
        """
        if i == 1:
            sys.exit(5)  # dies first
        time.sleep(2.0)
        print("worker 0 noticed", flush=True)
        sys.exit(3)
    """,
    )
    with pytest.raises(cluster.ClusterError) as info:
        cluster.run_cluster(command, workers=2, timeout=60, log=None, stop_on_failure=False)
    result = info.value.result
    assert result.returncodes == {"worker 0": 3, "worker 1": 5}
    assert result.ended["worker 0"] >= result.ended["worker 1"] + 1.5, result.ended
    message = str(info.value)
    assert message.index("worker 1 exited with code 5 after") < message.index("worker 0 exited with code 3 after")
    assert "worker 0 noticed" in message  # the last task to fail: its output, what it saw
    assert all(_gone(pid) for pid in _pids(tmp_path))

    for path in tmp_path.glob("pids_*.json"):
        path.unlink()
    with pytest.raises(cluster.ClusterError) as info:
        cluster.run_cluster(command, workers=2, timeout=60, log=None)
    assert info.value.result.returncodes["worker 0"] < 0  # stopped by the launcher, never noticed
    assert "worker 1 exited with code 5; the other tasks were stopped" in str(info.value)
    assert all(_gone(pid) for pid in _pids(tmp_path))


def test_stop_on_failure_false_with_a_chief_reports_only_the_chief(tmp_path):
    """A parameter-server layout that loses a worker on purpose: the run is the chief's; the dead worker shows in
    the result (its code, when it ended), not as a failure."""
    command = _task_script(
        tmp_path,
        """
        if kind == "worker" and i == 1:
            os.kill(os.getpid(), 9)
        if kind == "chief":
            time.sleep(1.5)
            sys.exit(0)
        time.sleep(120)  # a server
    """,
    )
    result = cluster.run_cluster(
        command, workers=2, ps=1, chief=True, timeout=60, log=None, wait_for=("chief",), stop_on_failure=False
    )
    assert result.ok() and result.returncodes["worker 1"] == -9 and result.returncodes["chief 0"] == 0
    assert "worker 1" in result.ended and result.ended["chief 0"] > result.ended["worker 1"]
    assert all(_gone(pid) for pid in _pids(tmp_path)) and all(_gone(pid) for pid in result.pids.values())


def test_quiet_launch_drops_grpc_details_after_tensorflow_lines():
    """A dead peer makes TensorFlow log failed RPCs with gRPC's details on the following lines; the quiet log drops
    them with the line they belong to, and keeps the program's own lines."""
    shown = []
    show = cluster._without_tf_noise(shown.append)
    for line in [
        "[chief 0] E0000 00:00:1.1 1 context.cc:908] Failed to remove function remotely due to ...",
        "[chief 0] Additional GRPC error information from remote target /job:worker/replica:0/task:1 while",
        "[chief 0] :UNKNOWN:Error received from peer  {grpc_status:14}",
        "[chief 0] This could happen if the remote target has been disconnected from the client.",
        "[chief 0] chief: 16/16 steps returned",
    ]:
        show(line)
    assert shown == ["[chief 0] chief: 16/16 steps returned"]
