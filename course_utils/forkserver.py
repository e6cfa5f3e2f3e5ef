"""Start ``python -m MODULE ARGS`` processes without paying ``import tensorflow`` in each (Linux).

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
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

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


class Process:
    """A forked task, as the launcher sees it: the parts of ``subprocess.Popen`` that :mod:`cluster` uses."""

    def __init__(self, pid: int, stdout, server: "_Server"):
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self._server = server

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._server.ended:
            if not self._server.ended.wait_for(lambda: self.returncode is not None, timeout):
                raise subprocess.TimeoutExpired(f"forked task {self.pid}", timeout)
        return self.returncode

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
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(theirs.fileno())], env=server_env,
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.stderr, start_new_session=True)
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
                    child = self.children.get(message["exit"])
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
                    try:
                        os.killpg(child.pid, signal.SIGKILL)
                    except OSError:
                        pass
                    child.returncode = -signal.SIGKILL
            self.ended.notify_all()

    def spawn(self, module: str, args: list, env: dict, cwd: str | None) -> Process:
        read_fd, write_fd = os.pipe()
        request = json.dumps({"module": module, "args": [str(a) for a in args], "env": env,
                              "cwd": os.path.abspath(cwd) if cwd else os.getcwd()}).encode()
        try:
            with self.lock:
                with self.ended:
                    before = len(self.started)
                socket.send_fds(self.sock, [request], [write_fd])
                with self.ended:
                    if not self.ended.wait_for(lambda: len(self.started) > before or not self.alive,
                                               START_TIMEOUT_S):
                        raise RuntimeError(f"the fork server did not start {module} in {START_TIMEOUT_S:g} s")
                    if not self.alive or self.started[before] == -1:
                        raise RuntimeError(f"the fork server could not start {module}: "
                                           f"{getattr(self, 'error', '')}{self.stderr_tail()}")
                    pid = self.started[before]
                    child = Process(pid, os.fdopen(read_fd, "r", errors="replace"), self)
                    read_fd = None
                    self.children[pid] = child
                    if pid in self.codes:
                        child.returncode = self.codes.pop(pid)
                    return child
        finally:
            os.close(write_fd)
            if read_fd is not None:
                os.close(read_fd)

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


_server: _Server | None = None
_server_lock = threading.Lock()


def stop() -> bool:
    """Stop the fork server (it holds TensorFlow's libraries, a few hundred MiB); True if one ran. Its running
    children are not stopped (the launcher stops its tasks)."""
    global _server
    with _server_lock:
        running = _server is not None
        if _server is not None:
            _server.stop()
            _server = None
    return running


atexit.register(stop)


def spawn(module: str, args: list, env: dict, cwd: str | None = None):
    """Run ``python -m module args`` with ``env`` (all of it: nothing is inherited) and ``cwd``, its stdout
    and stderr on one text pipe, in its own process group: a :class:`Process` forked from the server, or a
    ``subprocess.Popen`` where :func:`available` is false."""
    if not available():
        return subprocess.Popen([sys.executable, "-m", module, *map(str, args)], env=env, cwd=cwd,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True)
    global _server
    with _server_lock:
        if _server is not None and (not _server.alive or _server.key != _import_env(env)):
            _server.stop()
            _server = None
        if _server is None:
            _server = _Server(env)
        server = _server
    return server.spawn(module, list(args), env, cwd)


def run(module: str, args: list, env: dict, cwd: str | None = None,
        timeout: float | None = None) -> subprocess.CompletedProcess:
    """:func:`spawn`, then wait: ``subprocess.run(..., capture_output=True, text=True)`` for ``python -m module``,
    with stdout and stderr together in ``stdout``. On ``timeout`` its process group is killed and
    ``subprocess.TimeoutExpired`` raised."""
    proc = spawn(module, args, env, cwd)
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: proc.stdout.read(1 << 16), "")), daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        raise
    finally:
        reader.join(timeout=10)
    proc.stdout.close()
    return subprocess.CompletedProcess([sys.executable, "-m", module, *map(str, args)], proc.returncode,
                                       "".join(chunks), "")


# ---- the server side ----

def _serve(fd: int) -> None:
    """Import TensorFlow and Keras once, then fork a child per request until the socket closes; report each
    child's pid when started and its exit code (``subprocess``'s convention) when it ends."""
    sock = socket.socket(fileno=fd)
    for name in ("SIGINT", "SIGHUP"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)  # ended by its socket closing, not by Ctrl-C
    import tensorflow  # noqa: F401 - the point: once, for every child
    import keras  # noqa: F401

    from .memory import tensorflow_has_run_an_op

    if tensorflow_has_run_an_op():  # pragma: no cover - an import ran an op: its children would not start clean
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
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 1)
        except OSError:
            data, fds = b"", []
        if not data:
            break
        request = json.loads(data)
        pid = os.fork()
        if pid == 0:
            _child(request, fds[0], sock)  # never returns
        os.close(fds[0])
        running.add(pid)
        sock.send(json.dumps({"started": pid}).encode())
    os._exit(0)  # skip TensorFlow's teardown; the children live on until their launcher stops them


def _child(request: dict, out_fd: int, sock: socket.socket) -> None:
    """In the forked child: become the task (own group, its output pipe, its environment), run it, exit."""
    code = 1
    try:
        sock.close()
        os.setsid()
        for name in ("SIGINT", "SIGHUP", "SIGTERM", "SIGCHLD"):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(null)
        os.close(out_fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv = [request["module"], *request["args"]]
        import runpy

        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
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
