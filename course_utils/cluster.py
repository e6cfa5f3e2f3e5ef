"""A TensorFlow cluster on this machine: N worker processes on 127.0.0.1, each with its own ``TF_CONFIG``.

``MultiWorkerMirroredStrategy`` (and ``ParameterServerStrategy``) read the cluster from the ``TF_CONFIG``
environment variable of each process: every task lists the whole cluster and says which task it is.
:func:`run_cluster` starts one process per task on free localhost ports with a correct ``TF_CONFIG``,
streams their output with a ``[worker 0]`` prefix, waits with a time limit, and always stops every process
it started (on success, on a failing task, on a timeout, on KeyboardInterrupt, SIGTERM or SIGHUP) — including
their children, since each task runs in its own process group. Each task also dies with the launcher however
the launcher ends (``SIGKILL``, a kernel restart): a small sentinel process stops their groups when its
pipe from the launcher closes (Linux, macOS). Usable from a notebook and from the command line::

    python -m course_utils cluster --workers 2 -- python my_training_script.py --steps 10
    python -m course_utils cluster --workers 2 --module course_utils.lessons.scaling_out.multiworker -- --steps 4
    python -m course_utils cluster --chief --workers 2 --ps 1 --wait-for chief \
        --module course_utils.lessons.scaling_out.parameter_server -- --steps 20 --out runs/ps

In a notebook, :func:`launch` runs ``python -m MODULE`` on every task with TensorFlow's start-up chatter left out.

Exit codes of the command: 0 all tasks succeeded, 1 a task failed or the cluster timed out, 2 usage, 130 Ctrl-C,
128 + N when signal N (SIGTERM, SIGHUP) stopped it; every task is stopped in each case.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import operator
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, Sequence

from . import commandline, processes

__all__ = ["ClusterError", "ClusterResult", "free_ports", "launch", "main", "run_cluster", "tf_config"]

TASK_TYPES = ("chief", "worker", "ps")
MAX_TASKS = 16  # each task starts TensorFlow (~0.5 GB): more than this would only thrash one machine
MAX_LOG_LINES = 2000  # per task, the last lines kept (a task that prints hundreds of MB must not fill the memory)
MAX_LINE_CHARS = 4000  # a longer line (or output with no newline) is kept in pieces of this size


class ClusterError(RuntimeError):
    """The cluster could not start, a task failed, or it did not finish in time (the message says which).

    ``result``: when tasks ran and one failed, what they did (:class:`ClusterResult`: exit codes, output, when each
    ended); None when the cluster could not start or timed out."""

    def __init__(self, message: str, result: "ClusterResult | None" = None):
        super().__init__(message)
        self.result = result


_GIVEN_PORTS: dict[int, float] = {}  # port -> when this process last handed it to a cluster
_GIVEN_LOCK = threading.Lock()
PORT_REUSE_AFTER_S = 120.0  # a port handed out is not handed out again by this process for this long


def _ephemeral_low() -> int | None:
    """The first port of the range the OS gives out for outgoing connections (Linux), or None where unknown."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports that were free a moment ago (another program could still take one).

    On Linux they come from just below the range the OS draws outgoing connections' ports from: a cluster's own gRPC
    connections (thousands, in lesson 08's overlapped clusters) then cannot take one, or leave it in TIME_WAIT,
    between the pick and the task's bind. Elsewhere the OS picks them. Never one this process handed out in the last
    :data:`PORT_REUSE_AFTER_S` seconds: clusters launched at the same time (threads) would otherwise be given the
    same port — free when picked, taken once the first cluster's task binds it."""
    import random

    with _GIVEN_LOCK:
        now = time.monotonic()
        for port in [p for p, t in _GIVEN_PORTS.items() if now - t > PORT_REUSE_AFTER_S]:
            del _GIVEN_PORTS[port]
        socks, ports = [], []
        low = _ephemeral_low()
        try:
            if low is not None and low > 4096:
                candidates = list(range(max(2048, low - 8192), low))
                random.shuffle(candidates)
                for port in candidates:
                    if len(ports) == int(n):
                        break
                    if port in _GIVEN_PORTS:
                        continue
                    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    try:
                        s.bind((host, port))
                    except OSError:
                        s.close()
                        continue
                    socks.append(s)
                    ports.append(port)
            while len(ports) < int(n):  # elsewhere (or that range is full): the OS picks
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.bind((host, 0))
                socks.append(s)  # held until all are picked: the OS gives each a different port
                port = s.getsockname()[1]
                if port not in _GIVEN_PORTS:
                    ports.append(port)
                if len(socks) > 100 * max(1, int(n)):  # pragma: no cover - defensive
                    raise ClusterError("could not find free ports on 127.0.0.1")
        finally:
            for s in socks:
                s.close()
        _GIVEN_PORTS.update((p, now) for p in ports)
    return ports


def _port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, int(port)))
        except OSError:
            return True
    return False


def tf_config(cluster: dict, task_type: str, index: int) -> str:
    """The ``TF_CONFIG`` JSON for one task: the whole cluster, and which task this process is."""
    if task_type not in cluster:
        raise ValueError(f"task type {task_type!r} is not in the cluster {sorted(cluster)}")
    if not 0 <= int(index) < len(cluster[task_type]):
        raise ValueError(f"{task_type} index {index} is out of range: the cluster has {len(cluster[task_type])}")
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": int(index)}})


@dataclasses.dataclass
class ClusterResult:
    """What the cluster did: per task (``"worker 0"``…) its exit code, output lines and process id."""

    cluster: dict
    returncodes: dict
    logs: dict
    pids: dict
    seconds: float
    awaited: tuple = ()  # the tasks whose exit ended the run (the others were stopped: a negative code)
    ended: dict = dataclasses.field(default_factory=dict)  # task -> seconds after the start when it ended by itself

    def ok(self) -> bool:
        return all(self.returncodes[name] == 0 for name in (self.awaited or self.returncodes))


def _whole(value, message: str) -> int:
    """``value`` as an int when it is a whole number (an int or numpy integer, not a bool, float or str)."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise ValueError(f"{message}, got {value!r}")


def _count(value, name: str) -> int:
    """A number of tasks: a whole number (``2``, not ``2.5``, ``"2"`` or ``True``), 0 or more."""
    count = _whole(value, f"{name} must be a whole number of tasks")
    if count < 0:
        raise ValueError(f"{name} must be 0 or more, got {count}")
    return count


def _checked_ports(ports, n: int) -> list[int]:
    out = []
    for port in ports:
        port = _whole(port, "ports must be whole numbers 1-65535")
        if port == 0:
            raise ValueError(
                "port 0 asks the system for any free port, but every task must know its peers' real "
                "ports in advance: give real ports, or none (the launcher then picks free ones)"
            )
        if not 1 <= port <= 65535:
            raise ValueError(f"port {port} is outside 1-65535")
        out.append(port)
    if len(out) != n:
        raise ValueError(f"{n} tasks need {n} ports, got {len(out)}")
    repeated = sorted({p for p in out if out.count(p) > 1})
    if repeated:
        raise ValueError(f"port {', '.join(map(str, repeated))} is given to more than one task; each needs its own")
    return out


def _tail(lines: list[str], n: int = 6) -> str:
    """The last ``n`` lines a task printed, without TensorFlow's start-up chatter."""
    lines = [line for line in list(lines) if not TF_NOISE.match(line)]  # list(): a reader may still append
    return "\n".join("    " + line for line in lines[-n:]) or "    (no output)"


def run_cluster(
    command: Sequence[str],
    workers: int = 2,
    ps: int = 0,
    chief: bool = False,
    timeout: float = 120.0,
    env: dict | None = None,
    cwd: str | None = None,
    log: Callable[[str], None] | None = print,
    ports: Sequence[int] | None = None,
    task_env: Callable[[str, int], dict] | None = None,
    wait_for: Sequence[str] | None = None,
    stop_on_failure: bool = True,
    fork: bool = False,
) -> ClusterResult:
    """Run ``command`` once per task of a localhost cluster and wait for all of them.

    ``command``: argv, e.g. ``[sys.executable, "train.py"]``; every task runs the same program and tells
    itself apart by ``TF_CONFIG``. ``workers``/``ps``/``chief``: the cluster's tasks. ``ports``: one per
    task in the order chief, workers, ps (default: free ports). ``log``: called with each output line,
    prefixed ``[worker 0]`` (``None``: quiet). ``task_env(task_type, index)`` adds per-task variables.
    ``wait_for``: the task types whose exit ends the run (default: every task); e.g. ``("chief",)`` for
    parameter-server training, where workers and parameter servers serve until they are stopped.
    ``stop_on_failure``: a task that exits with an error stops the others at once (default: a collective would wait
    for the dead task forever). False: the others go on — the fault-tolerance demos, where what the survivors do is
    the point (do they notice? how soon?); the run then ends when the awaited tasks have ended, and a task that
    failed there is reported only if it was awaited. Each task's end, as seen by the launcher (50 ms polls), is in
    the result's ``ended``. ``fork``: a ``[sys.executable, "-m", MODULE, ...]`` command's tasks are forked from a
    process that has imported TensorFlow once (:func:`processes.start` with ``fork=True``, Linux; ~4 s of CPU saved per
    task) instead of each starting Python afresh; :func:`launch` does this by default.
    Raises :class:`ClusterError` when a port is taken, when an awaited task exits with an error (with its
    ``result``) or after ``timeout`` seconds; every process started is stopped before it returns or raises.
    """
    if not command or isinstance(command, str):
        raise ValueError("command must be a non-empty argv list, e.g. [sys.executable, 'train.py']")
    workers, ps = _count(workers, "workers"), _count(ps, "ps")
    if workers + ps + int(bool(chief)) < 1:
        raise ValueError("the cluster needs at least one task")
    if workers + ps + int(bool(chief)) > MAX_TASKS:
        raise ValueError(
            f"at most {MAX_TASKS} tasks on one machine (each is a TensorFlow process), got "
            f"{workers + ps + int(bool(chief))}"
        )
    try:
        timeout = float(timeout)
    except (TypeError, ValueError):
        raise ValueError(f"timeout must be a number of seconds, got {timeout!r}") from None
    if not (math.isfinite(timeout) and timeout > 0):  # nan and inf too: a cluster always has a limit
        raise ValueError(f"timeout must be a positive, finite number of seconds, got {timeout!r}")
    tasks = [("chief", 0)] * bool(chief) + [("worker", i) for i in range(workers)] + [("ps", i) for i in range(ps)]
    if wait_for is not None and (
        isinstance(wait_for, str) or not wait_for or not set(wait_for) <= {kind for kind, _ in tasks}
    ):
        raise ValueError(
            f"wait_for must name task types of this cluster ({', '.join(sorted({k for k, _ in tasks}))}),"
            f" got {wait_for!r}"
        )
    tasks = [("chief", 0)] * bool(chief) + [("worker", i) for i in range(workers)] + [("ps", i) for i in range(ps)]
    if ports is None:  # ours to pick: a port another program took in the meantime (or was testing, as free_ports
        for _attempt in range(5):  # does in another process: the same range) is picked again
            ports = free_ports(len(tasks))
            taken = [p for p in ports if _port_in_use(p)]
            if not taken:
                break
    else:
        ports = _checked_ports(ports, len(tasks))
        taken = [p for p in ports if _port_in_use(p)]
    if taken:
        raise ClusterError(
            f"port {', '.join(map(str, taken))} on 127.0.0.1 is in use by another program; "
            "choose other ports (or none: the launcher then picks free ones)"
        )
    cluster: dict = {}
    for (task_type, _), port in zip(tasks, ports):
        cluster.setdefault(task_type, []).append(f"127.0.0.1:{port}")

    base_env = dict(os.environ if env is None else env)
    base_env.setdefault("PYTHONUNBUFFERED", "1")
    base_env.setdefault("TF_NUM_INTEROP_THREADS", str(processes.interop_threads()))
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, collections.deque] = {}
    readers = []
    start = time.monotonic()
    fork = fork and len(command) > 2 and command[0] == sys.executable and command[1] == "-m"
    sentinel = processes.Sentinel()

    def read(name: str, stream) -> None:
        show = log
        # always drained (a full pipe would block the task), in pieces: a line without end cannot fill the memory
        for line in iter(lambda: stream.readline(MAX_LINE_CHARS), ""):
            line = line.rstrip("\n")
            logs[name].append(line)
            if show is not None:
                try:
                    show(f"[{name}] {line}")
                except Exception:  # noqa: BLE001 - a broken log callback must not stall the task
                    show = None
        stream.close()

    try:
        for task_type, index in tasks:
            name = f"{task_type} {index}"
            task_vars = dict(base_env, TF_CONFIG=tf_config(cluster, task_type, index))
            if task_env is not None:
                task_vars.update({k: str(v) for k, v in task_env(task_type, index).items()})
            logs[name] = collections.deque(maxlen=MAX_LOG_LINES)
            try:
                with processes.signals_held():  # started and on the list, or neither
                    procs[name] = processes.start(  # own process group: stopped as a whole; python -m MODULE
                        command,
                        fork=fork,
                        env=task_vars,
                        cwd=cwd,
                        stdout=subprocess.PIPE,  # forked from a process
                        stderr=subprocess.STDOUT,
                        text=True,
                        errors="replace",
                    )  # that has imported TensorFlow
                    sentinel.tell(str(procs[name].pid))
            except OSError as err:
                raise ClusterError(
                    f"could not start {name} with {list(command)[:3]}: {err.strerror or err}; check the program's path"
                ) from None
            except RuntimeError as err:  # the fork server could not start the task
                raise ClusterError(f"could not start {name}: {err}") from None
            reader = threading.Thread(target=read, args=(name, procs[name].stdout), daemon=True)
            reader.start()
            readers.append(reader)

        ended: dict[str, float] = {}
        while True:
            codes = {name: proc.poll() for name, proc in procs.items()}
            now = time.monotonic() - start
            for name, code in codes.items():
                if code is not None and name not in ended:
                    ended[name] = now
            failures = [name for name, code in codes.items() if code not in (None, 0)]
            awaited = [code for name, code in codes.items() if wait_for is None or name.split()[0] in wait_for]
            if (failures and stop_on_failure) or all(code is not None for code in awaited):
                break
            if time.monotonic() - start > timeout:
                running = [name for name, code in codes.items() if code is None]
                processes.stop_all(procs)
                raise ClusterError(
                    f"the cluster did not finish in {timeout:g} s ({', '.join(running)} still "
                    "running; all stopped). A task waiting for a peer that never came, or a "
                    "limit too short? Last output of " + running[0] + ":\n" + _tail(logs[running[0]])
                )
            time.sleep(0.05)
        if not stop_on_failure:  # only the awaited tasks' failures count; the first to fail is named first
            failures = [name for name in failures if wait_for is None or name.split()[0] in wait_for]
        if failures:
            failures.sort(key=lambda name: ended[name])
            processes.stop_all(procs)
            for reader in readers:
                reader.join(timeout=2)

            def how(name: str) -> str:
                code = procs[name].returncode
                return (
                    f"was killed by {signal.Signals(-code).name}"
                    if code < 0 and -code in signal.valid_signals()
                    else f"exited with code {code}"
                )

            if stop_on_failure:
                first = failures[0]
                message = (
                    f"{first} {how(first)}; the other tasks were stopped (a collective would wait for it "
                    f"forever). Last output of {first}:\n" + _tail(logs[first])
                )
            else:  # the survivors ran on: say how each failed task ended, and when; the last one's output
                message = (
                    "; ".join(f"{name} {how(name)} after {ended[name]:.1f} s" for name in failures)
                    + f" (the tasks ran on after a failure: stop_on_failure=False). Last output of "
                    f"{failures[-1]}:\n" + _tail(logs[failures[-1]])
                )
            result = ClusterResult(
                cluster,
                {n: p.returncode for n, p in procs.items()},
                {n: list(v) for n, v in logs.items()},
                {n: p.pid for n, p in procs.items()},
                time.monotonic() - start,
                tuple(n for n in procs if wait_for is None or n.split()[0] in wait_for),
                ended,
            )
            raise ClusterError(message, result)
    except BaseException:  # KeyboardInterrupt and errors alike: never leave a task behind
        try:
            processes.stop_all(procs)
        finally:
            sentinel.close()
        raise
    try:
        processes.stop_all(procs)  # reaps; stops the tasks not waited for and anything a task left running in its group
    finally:
        sentinel.close()
    for reader in readers:  # the pipes close once every process in the group is gone
        reader.join(timeout=5)
    awaited = tuple(n for n in procs if wait_for is None or n.split()[0] in wait_for)
    return ClusterResult(
        cluster,
        {n: p.returncode for n, p in procs.items()},
        {n: list(v) for n, v in logs.items()},
        {n: p.pid for n, p in procs.items()},
        time.monotonic() - start,
        awaited,
        ended,
    )


# TensorFlow's start-up chatter (C++ logging, absl's first-line warning): dropped by launch(quiet=True)
TF_NOISE = re.compile(
    r"^(WARNING: All log messages before absl|[IWE]0000 |\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWE] )"
)


# a multi-line TensorFlow log message goes on with a proto dump (indented, braces, `key: value` lines) or, for a
# failed RPC, gRPC's details (a task that is gone: the fault-tolerance demos)
_TF_NOISE_CONTINUES = re.compile(
    r'^(\s.*|\}|[a-z_]+ \{|[a-z_]+: ("[^"]*"|-?\d+|true|false)'
    r"|Additional GRPC error information .*|:UNKNOWN:Error received from peer .*"
    r"|This could happen if the remote target has been disconnected from the client\.)?$"
)


def _without_tf_noise(log: Callable[[str], None]) -> Callable[[str], None]:
    """``log`` without TensorFlow's start-up lines (and the proto dumps that follow them), per task."""
    in_noise: dict[str, bool] = {}

    def show(line: str) -> None:
        task, _, text = line.partition("] ")
        if TF_NOISE.match(text) or (in_noise.get(task) and _TF_NOISE_CONTINUES.match(text)):
            in_noise[task] = True
            return
        in_noise[task] = False
        log(line)

    return show


def launch(
    module: str,
    args: Sequence[str] = (),
    workers: int = 2,
    ps: int = 0,
    chief: bool = False,
    timeout: float = 120.0,
    log: Callable[[str], None] | None = print,
    quiet: bool = True,
    **kwargs,
) -> ClusterResult:
    """:func:`run_cluster` for ``python -m module args`` — how the lessons start their cluster programs.

    The tasks see no GPU (``CUDA_VISIBLE_DEVICES=""`` unless the ``env`` you pass sets it): every task on one
    machine would otherwise try to reserve the same GPU's memory. With a ``chief``, the run ends when the chief
    does (workers and parameter servers serve it until stopped). ``quiet``: TensorFlow's own log lines are
    turned down (``TF_CPP_MIN_LOG_LEVEL=2``) and its start-up chatter is left out of ``log`` (all of it stays
    in the result's ``logs``). ``fork=False`` starts each task as a new ``python -m`` (by default they are
    forked from a process that has imported TensorFlow: the same programs, started seconds sooner)."""
    given = kwargs.pop("env", None)
    env = dict(os.environ if given is None else given)
    if given is None or "CUDA_VISIBLE_DEVICES" not in given:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the tasks run on the CPU: the notebook may hold the GPU's memory
    if quiet:
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        if log is not None:
            log = _without_tf_noise(log)
    kwargs.setdefault("wait_for", ("chief",) if chief else None)
    kwargs.setdefault("fork", True)
    return run_cluster(
        [sys.executable, "-m", module, *map(str, args)],
        workers=workers,
        ps=ps,
        chief=chief,
        timeout=timeout,
        log=log,
        env=env,
        **kwargs,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m course_utils cluster --workers N [--ps N] [--chief] [--timeout S] [--wait-for TYPE] [--module M] -- COMMAND...``"""
    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        split = argv.index("--")
        own, command = argv[:split], argv[split + 1 :]
    else:
        own, command = argv, []
    parser = argparse.ArgumentParser(
        prog="python -m course_utils cluster",
        description="Run a program once per task of a TensorFlow cluster on localhost.",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ps", type=int, default=0)
    parser.add_argument("--chief", action="store_true")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before every task is stopped")
    parser.add_argument("--module", help="run `python -m MODULE` (what follows -- are its arguments)")
    parser.add_argument(
        "--wait-for",
        choices=TASK_TYPES,
        action="append",
        help="end when these tasks end (e.g. chief: parameter servers and workers serve until "
        "stopped); default: every task",
    )
    try:
        args = parser.parse_args(own)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 2
    if args.module:
        command = [sys.executable, "-m", args.module, *command]
    if not command:
        print("error: give the program after --, e.g. `-- python train.py`, or --module MODULE", file=sys.stderr)
        return 2

    def body() -> int:  # a closed terminal (SIGHUP), `kill` (SIGTERM) or Ctrl-C: every task is stopped, then it ends
        result = run_cluster(
            command, workers=args.workers, ps=args.ps, chief=args.chief, timeout=args.timeout, wait_for=args.wait_for
        )
        print(f"cluster: {len(result.returncodes)} task(s) finished in {result.seconds:.1f} s")
        return 0

    # ValueError: a bad option (too many tasks, a timeout <= 0 or nan, a bad port)
    return commandline.run(
        "cluster",
        body,
        usage=(ValueError,),
        failures=(ClusterError,),
        stopped=lambda what: f"{what}; every task was stopped",
    )
