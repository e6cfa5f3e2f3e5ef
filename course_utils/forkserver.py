"""Start ``python -m MODULE`` (or ``-c CODE``) processes without paying ``import tensorflow`` in each (Linux).

A TensorFlow process spends about 4 s of CPU importing TensorFlow and Keras before it runs a line of its own;
lesson 08 starts some 30 cluster tasks, so on a 2-core machine most of its time went there. A *fork server*
imports them once, runs no TensorFlow op (so no thread pool or device exists yet: memory.py's check), and
forks a child per task on request. Each child is a fresh process in every way the lessons rely on: its own
pid and process group, its own environment (``TF_CONFIG`` included), its own TensorFlow runtime (created on
its first op), its output on the pipe the launcher reads, signals delivered to it alone. Only the import is
shared. Python's ``multiprocessing`` "forkserver" does the same for functions; this one runs modules, hands
over the output pipe, reports exit codes like ``subprocess`` (``-N``: killed by signal N), and starts again
when a setting TensorFlow reads at import changes (:data:`IMPORT_TIME_PREFIXES`).

:func:`spawn` returns a :class:`Process` (``pid``, ``stdout``, ``poll``, ``wait``, ``returncode``); where
forking is not available it returns a ``subprocess.Popen`` of the same command.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Iterator, Sequence

from . import processes

__all__ = ["Process", "available", "run", "spawn", "stop"]

# environment variables read while TensorFlow and Keras are imported (logging, oneDNN, CUDA, library paths,
# Python's own): a child must have been forked from a server that imported them with the same values
IMPORT_TIME_PREFIXES = ("TF_", "XLA_", "ONEDNN_", "DNNL_", "CUDA_", "KERAS_", "LD_", "PYTHON", "OMP_", "MKL_",
                        "KMP_", "TPU_", "HOME")
# read when the program makes its strategy or runtime, after the fork: may differ per child
PER_TASK = ("TF_CONFIG", "TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS")
START_TIMEOUT_S = 120.0  # the server's import plus one fork

_SERVER = (
    "import sys\n"
    "from course_utils import forkserver\n"
    "forkserver._serve(int(sys.argv[1]))\n"
)


def available() -> bool:
    """Whether tasks can be forked here: Linux (``fork`` after importing TensorFlow is not safe on macOS),
    and Python can pass a file descriptor over a socket."""
    return sys.platform.startswith("linux") and hasattr(socket, "send_fds")


def _import_env(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES) and k not in PER_TASK}


class ServerFailed(RuntimeError):
    """The fork server started nothing: TensorFlow did not import there, or the server died (the message, one line,
    says which)."""


class Process:
    """A forked task, as the launcher sees it: the parts of ``subprocess.Popen`` that :mod:`cluster` uses."""

    def __init__(self, pid: int, stdout, stderr, server: "_Server"):
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr  # None: stderr is on ``stdout``
        self.returncode: int | None = None
        self._server = server

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._server.ended:
            if not self._server.ended.wait_for(lambda: self.returncode is not None, timeout):
                raise subprocess.TimeoutExpired(f"forked task {self.pid}", timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        """Read ``stdout`` and ``stderr`` (those that are pipes) to the end and wait, as ``Popen.communicate``;
        on ``timeout`` ``subprocess.TimeoutExpired`` (the task is left running: kill it, then call this again)."""
        texts: dict[str, list[str]] = {}
        readers = []
        for name in ("stdout", "stderr"):
            stream = getattr(self, name)
            if stream is not None and not stream.closed:
                texts[name] = []
                readers.append(threading.Thread(
                    target=lambda f=stream, t=texts[name]: t.extend(iter(lambda: f.read(1 << 16), "")), daemon=True))
                readers[-1].start()
        deadline = None if timeout is None else time.monotonic() + timeout
        self.wait(timeout)
        for reader in readers:
            reader.join(None if deadline is None else max(1.0, deadline - time.monotonic()))
        for name in texts:
            getattr(self, name).close()
        return ("".join(texts["stdout"]) if "stdout" in texts else None,
                "".join(texts["stderr"]) if "stderr" in texts else None)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Server:
    """This process's handle on a fork server (kept for later calls while the import-time settings match)."""

    def __init__(self, env: dict):
        self.key = _import_env(env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        self.stderr = tempfile.TemporaryFile()
        server_env = dict(self.key, PATH=env.get("PATH", os.environ.get("PATH", "")), PYTHONUNBUFFERED="1")
        self.proc = processes.start([sys.executable, "-c", _SERVER, str(theirs.fileno())], env=server_env,
                                    pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=self.stderr)
        theirs.close()
        self.lock = threading.Lock()  # one request at a time
        self.ended = threading.Condition()
        self.children: dict[int, Process] = {}
        self.codes: dict[int, int] = {}  # exit codes that came before their pid was registered
        self.started: list[int] = []
        self.alive = True
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            message = json.loads(data)
            with self.ended:
                if "started" in message:
                    self.started.append(message["started"])
                elif "exit" in message:
                    child = self.children.pop(message["exit"], None)  # ended: no longer tracked
                    if child is None:
                        self.codes[message["exit"]] = message["code"]
                    else:
                        child.returncode = message["code"]
                elif "error" in message:
                    self.started.append(-1)
                    self.error = message["error"]
                self.ended.notify_all()
        with self.ended:  # the server is gone: its children are orphans now; stop them, report them killed
            self.alive = False
            for child in self.children.values():
                if child.returncode is None:
                    processes.kill_group(child, signal.SIGKILL)
                    child.returncode = -signal.SIGKILL
            self.ended.notify_all()

    def spawn(self, target: dict, args: list, env: dict, cwd: str | None, separate_stderr: bool,
              discard_stdout: bool) -> Process:
        pipes: list[tuple[int | None, int]] = [(None, os.open(os.devnull, os.O_WRONLY)) if discard_stdout
                                               else os.pipe()]
        if separate_stderr:
            pipes.append(os.pipe())
        request = json.dumps({**target, "args": [str(a) for a in args], "env": env,
                              "cwd": os.path.abspath(cwd) if cwd else os.getcwd()}).encode()
        mine = [r for r, _ in pipes if r is not None]
        try:
            with self.lock:
                with self.ended:
                    before = len(self.started)
                socket.send_fds(self.sock, [request], [w for _, w in pipes])
                with self.ended:
                    if not self.ended.wait_for(lambda: len(self.started) > before or not self.alive,
                                               START_TIMEOUT_S):
                        raise RuntimeError(f"the fork server did not start {_name(target)} in {START_TIMEOUT_S:g} s")
                    if not self.alive or self.started[before] == -1:
                        raise ServerFailed(f"the fork server could not start {_name(target)}: {self.why_not()}")
                    pid = self.started[before]
                    streams = [None if r is None else os.fdopen(r, "r", errors="replace") for r, _ in pipes]
                    mine = []
                    child = Process(pid, streams[0], streams[1] if separate_stderr else None, self)
                    self.children[pid] = child
                    if pid in self.codes:  # it ended before this saw its start
                        child.returncode = self.codes.pop(pid)
                        del self.children[pid]
                    return child
        finally:
            for fd in [w for _, w in pipes] + mine:
                os.close(fd)

    def busy(self) -> bool:
        """Whether a task it started still runs."""
        with self.ended:
            return any(child.returncode is None for child in self.children.values())

    def why_not(self) -> str:
        """Why the server started nothing, in one line: its own message (TensorFlow did not import), else how it
        ended (a crash while importing TensorFlow: SIGABRT, SIGILL) and its last line of output."""
        if getattr(self, "error", ""):
            return self.error
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        how = ("it is still running" if code is None else
               f"it died of {signal.Signals(-code).name} (while importing TensorFlow?)" if code < 0 else
               f"it exited with code {code}")
        self.stderr.seek(0)
        lines = self.stderr.read().decode(errors="replace").strip().splitlines()
        return how + (f"; its last line: {lines[-1][-300:]}" if lines else "")

    def stderr_tail(self) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace").strip()
        return ("; its output: " + text[-2000:]) if text else ""

    def stop(self) -> None:
        for end in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.sock.close):  # the server ends when its
            try:                                                                   # socket does (shutdown also
                end()                                                              # wakes this side's reader)
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


MAX_SERVERS = 3  # servers kept at once, one per set of import-time settings (each holds a few hundred MiB)
_servers: dict[tuple, _Server] = {}
_server_lock = threading.Lock()


def stop() -> bool:
    """Stop the fork servers (each holds TensorFlow's libraries, a few hundred MiB); True if one ran. A task
    still running dies with its server (the kernel's parent-death signal)."""
    with _server_lock:
        running = bool(_servers)
        for server in _servers.values():
            server.stop()
        _servers.clear()
    return running


def _server_for(env: dict) -> _Server:
    key = tuple(sorted(_import_env(env).items()))
    with _server_lock:
        server = _servers.get(key)
        if server is not None and not server.alive:
            server.stop()
            del _servers[key]
            server = None
        if server is None:
            idle = [k for k, s in _servers.items() if not s.busy()]
            while len(_servers) >= MAX_SERVERS and idle:  # the oldest idle one makes room
                _servers.pop(idle.pop(0)).stop()
            server = _servers[key] = _Server(env)
        return server


atexit.register(stop)


def _name(target: dict) -> str:
    return target.get("module") or "python -c"


def spawn(module: str | None, args: list, env: dict, cwd: str | None = None, code: str | None = None,
          separate_stderr: bool = False, discard_stdout: bool = False):
    """Run ``python -m module args`` (or ``python -c code args``) with ``env`` (all of it: nothing is inherited)
    and ``cwd``, in its own process group, its stdout and stderr on one text pipe (``.stdout``) or, with
    ``separate_stderr``, two (``.stdout``, ``.stderr``); ``discard_stdout``: stdout to ``/dev/null``
    (``.stdout`` is None). A :class:`Process` forked from the server, or a ``subprocess.Popen`` where
    :func:`available` is false."""
    if (module is None) == (code is None):
        raise ValueError("give a module or code, not both")
    if not available():
        argv = [sys.executable, *(["-m", module] if module else ["-c", code]), *map(str, args)]
        return processes.start(argv, env=env, cwd=cwd, text=True, errors="replace",
                               stdout=subprocess.DEVNULL if discard_stdout else subprocess.PIPE,
                               stderr=subprocess.PIPE if separate_stderr else subprocess.STDOUT)
    return _server_for(env).spawn({"module": module} if module else {"code": code}, list(args), env, cwd, separate_stderr,
                        discard_stdout)


def run(module: str | None, args: list, env: dict, cwd: str | None = None, timeout: float | None = None,
        code: str | None = None, separate_stderr: bool = False) -> subprocess.CompletedProcess:
    """:func:`spawn`, then wait: ``subprocess.run(..., capture_output=True, text=True)`` for ``python -m module``
    (or ``-c code``); stderr in ``stdout`` unless ``separate_stderr``. On ``timeout`` its process group is
    killed and ``subprocess.TimeoutExpired`` raised."""
    proc = spawn(module, args, env, cwd, code=code, separate_stderr=separate_stderr)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        processes.kill_group(proc, signal.SIGKILL)
        proc.wait()  # its readers see the pipes close and end by themselves
        raise
    argv = [sys.executable, *(["-m", module] if module else ["-c", code]), *map(str, args)]
    return subprocess.CompletedProcess(argv, proc.returncode, out, err if separate_stderr else "")


# ---- the server side ----

def _serve(fd: int) -> None:
    """Import TensorFlow and Keras once, then fork a child per request until the socket closes; report each
    child's pid when started and its exit code (``subprocess``'s convention) when it ends."""
    sock = socket.socket(fileno=fd)
    for name in ("SIGINT", "SIGHUP"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)  # ended by its socket closing, not by Ctrl-C
    try:  # first, while argv and environ are as the process started (the memory it rewrites for each child)
        import setproctitle

        setproctitle.setproctitle(f"{sys.executable} -m course_utils.forkserver (TensorFlow imported; forks tasks)")
    except ImportError:  # pragma: no cover
        pass
    try:
        import tensorflow  # noqa: F401 - the point: once, for every child
        import keras  # noqa: F401
    except BaseException as exc:  # noqa: BLE001 - a broken install: say so in one line, start nothing
        last = (str(exc).strip().splitlines() or [""])[-1]
        sock.send(json.dumps({"error": f"TensorFlow could not be imported ({type(exc).__name__}: {last})"}).encode())
        return

    if processes.tensorflow_has_run_an_op():  # pragma: no cover - an import ran an op: its children would not start clean
        sock.send(json.dumps({"error": "importing TensorFlow ran an op here"}).encode())
        return
    import select

    running: set[int] = set()
    while True:
        ready = select.select([sock], [], [], 0.05)[0]
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            running.discard(pid)
            sock.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
        if not ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 2)
        except OSError:
            data, fds = b"", []
        if not data:
            break
        request = json.loads(data)
        server = os.getpid()
        pid = os.fork()
        if pid == 0:
            _child(request, fds, sock, server)  # never returns
        for fd in fds:
            os.close(fd)
        running.add(pid)
        sock.send(json.dumps({"started": pid}).encode())
    os._exit(0)  # skip TensorFlow's teardown; the children live on until their launcher stops them


def _set_title(request: dict) -> None:
    """The task's command line as ``ps``, ``top`` and ``/proc/PID/cmdline`` show it: the ``python -m`` command it
    stands for, not the server's (setproctitle; without it, the server's)."""
    import shlex

    try:
        import setproctitle
    except ImportError:  # pragma: no cover - a dependency of course_utils
        return
    what = ["-m", request["module"]] if "module" in request else ["-c", request["code"].splitlines()[0] + " …"]
    setproctitle.setproctitle(shlex.join([sys.executable, *what, *request["args"]]))


def _child(request: dict, fds: list, sock: socket.socket, server_pid: int) -> None:
    """In the forked child: become the task (own group, its output pipe, its environment), run it, exit."""
    code = 1
    try:
        sock.close()
        processes.die_with_parent(server_pid)  # the server ends with its launcher (its socket closes): so does the task
        os.setsid()
        for name in ("SIGINT", "SIGHUP", "SIGTERM", "SIGCHLD"):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[-1], 2)  # the same pipe, or stderr's own
        os.close(null)
        for fd in fds:
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        _set_title(request)
        if "module" in request:
            import runpy

            sys.argv = [request["module"], *request["args"]]
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        else:  # as `python -c`: the code runs as __main__, argv[0] is "-c"
            import types

            sys.argv = ["-c", *request["args"]]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(request["code"], "<string>", "exec"), main.__dict__)
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - as Python would: the traceback on stderr, exit 1
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()
        except BaseException:  # noqa: BLE001
            pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001
                pass
        os._exit(code)


@contextlib.contextmanager
def process_group(argv: Sequence[str], *, grace_s: float = 2.0, fork: bool = False,
                  **kwargs: Any) -> Iterator[subprocess.Popen]:
    """``subprocess.Popen(argv, **kwargs)`` in a new session (its own process group) for the ``with`` block; when
    the block ends, however it ends (done, an exception, Ctrl-C, :class:`processes.Stopped`), the group is stopped: SIGTERM
    if the process still runs, SIGKILL to the whole group after ``grace_s`` (also when the process itself has
    ended: what it started goes too), and reaped — :func:`processes.stop_all`. If this process dies
    without getting there (SIGKILL included), a :class:`processes.Sentinel` sends the group SIGTERM, then
    SIGKILL. SIGINT/SIGTERM/SIGHUP are held while it starts and delivered inside the block's guard, so no signal
    can leave a started process unwatched::

        with forkserver.process_group([sys.executable, "-m", "tool"], stdout=subprocess.PIPE) as proc:
            code = proc.wait(timeout=60)   # TimeoutExpired: the group is stopped on the way out

    ``fork``: ``argv`` is ``[sys.executable, "-m", MODULE, ...]`` with an ``env`` and ``stdout=PIPE,
    stderr=STDOUT, text=True``; on Linux the process is forked from one that has imported TensorFlow
    (this module's server) and dies with it, so it must not check that its parent is this process.
    """
    sentinel = proc = None
    try:
        sentinel = processes.Sentinel()
        with processes.signals_held():
            if fork and _forkable(argv, kwargs):
                proc = spawn(argv[2], list(argv[3:]), kwargs["env"], kwargs.get("cwd"))
            else:
                proc = processes.start(argv, **kwargs)
            sentinel.tell(str(proc.pid))
        yield proc
    finally:
        try:
            if proc is not None:
                processes.stop_all({"": proc}, grace_s=grace_s)
        finally:
            if sentinel is not None:
                sentinel.close()  # every process of the group is gone: it ends without doing anything


def _forkable(argv: Sequence[str], kwargs: dict) -> bool:
    """Whether :func:`process_group` can fork ``argv`` (ValueError if ``fork=True`` was given what it cannot)."""
    merged = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    if list(argv[:2]) != [sys.executable, "-m"] or "env" not in kwargs or set(kwargs) - {"env", "cwd", "errors",
                                                                                          *merged}:
        raise ValueError("fork=True runs `python -m MODULE ...` with an env, its output on one text pipe")
    if any(kwargs.get(k) != v for k, v in merged.items()):
        raise ValueError("fork=True needs stdout=PIPE, stderr=STDOUT, text=True")
    return available()
