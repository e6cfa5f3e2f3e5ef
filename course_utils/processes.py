"""How the course starts child processes, and stop signals (TensorFlow is imported only by the fork server):

- :func:`start` starts a child in its own session (process group: :func:`kill_group` stops it and all it started);
  with ``fork=True``, a ``python -m MODULE`` or ``python -c CODE`` child is forked on Linux from a *fork server*
  that has imported TensorFlow and Keras once (each import costs about 4 s of CPU; lesson 08 starts some 30 cluster
  tasks). :func:`run` also waits for it; :func:`group` holds it for a ``with`` block and stops its group however the
  block ends. Past its time a child's group is killed and :class:`TimedOut` raised: the course's one timeout, a
  ``subprocess.TimeoutExpired`` whose message is one line;
- :func:`stop_on_signals` turns SIGTERM and SIGHUP into :class:`Stopped` in the main thread, so the cleanup that
  stops child processes runs and a command can exit ``128 + signal``; :func:`signals_held` holds SIGINT, SIGTERM and
  SIGHUP while a child starts, so none can leave a started process unwatched;
- :func:`stop_all` stops process groups (SIGTERM, then SIGKILL after a grace period) and reaps them; a
  :class:`Sentinel` process does it when this process dies without getting there (even by SIGKILL);
  :func:`die_with_parent` (Linux) has the kernel kill this process when its parent ends; :func:`crash_said` says one
  line when this process dies by a signal inside a block (a native crash while importing TensorFlow);
- :func:`usable_cores`: the cores this process may run on; :func:`interop_threads`: TensorFlow's inter-op threads
  for a child that talks to its peers; :func:`tensorflow_has_run_an_op`: whether a process forked from this one
  would start clean.

A forked child is a fresh process in every way the lessons rely on: its own pid and process group, its own
environment (``TF_CONFIG`` included), its own TensorFlow runtime (created on its first op), its output on the pipe
the launcher reads, signals delivered to it alone. Only the import is shared. Python's ``multiprocessing``
"forkserver" does the same for functions; this one runs modules and code, hands over the output pipes, reports exit
codes like ``subprocess`` (``-N``: killed by signal N), and starts a new server when a setting TensorFlow reads at
import changes (:data:`IMPORT_TIME_PREFIXES`).
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

__all__ = [
    "MIN_INTEROP_THREADS",
    "Process",
    "Sentinel",
    "ServerFailed",
    "Stopped",
    "TimedOut",
    "can_fork",
    "crash_said",
    "die_with_parent",
    "group",
    "interop_threads",
    "kill_group",
    "run",
    "signals_held",
    "start",
    "stop_all",
    "stop_on_signals",
    "stop_servers",
    "tail",
    "tensorflow_has_run_an_op",
    "usable_cores",
]


class Stopped(BaseException):
    """SIGTERM or SIGHUP arrived (raised in the main thread by :func:`stop_on_signals`); ``signum`` says which.
    A BaseException, like KeyboardInterrupt, so that ``except Exception`` does not swallow it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


@contextlib.contextmanager
def stop_on_signals(names: Sequence[str] = ("SIGTERM", "SIGHUP")) -> Iterator[None]:
    """Within the block, the first of these signals raises :class:`Stopped` in the main thread; later ones are
    ignored, so the cleanup it starts (stopping process groups, writing what finished) is not cut short. The
    old handlers come back when the block ends. Outside the main thread it does nothing. Typical use::

        with processes.stop_on_signals():
            try:
                return run()
            except processes.Stopped as stop:
                print(f"tool: {stop.name}; stopped", file=sys.stderr)
                return 128 + stop.signum
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum, frame):
        if not fired:
            fired.append(signum)
            raise Stopped(signum)

    old = {}
    for name in names:
        sig = getattr(signal, name, None)
        if sig is not None:
            old[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


@contextlib.contextmanager
def signals_held():
    """Hold SIGINT, SIGTERM and SIGHUP (main thread only) while a task starts: a Ctrl-C between the start of a
    process and its entry in the task list would leave that task running. Delivered when the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    old = {}
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is None:
            continue
        try:
            old[sig] = signal.signal(sig, lambda signum, frame: caught.append(signum))
        except (ValueError, OSError):  # not settable here
            pass
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if caught:
            handler = old.get(caught[0])
            if callable(handler):
                handler(caught[0], None)  # Python's SIGINT handler raises KeyboardInterrupt; main()'s, Stopped
            elif handler != signal.SIG_IGN:
                signal.raise_signal(caught[0])  # the default action, now that the task is on the list


def die_with_parent(parent_pid: int | None = None, sig: int = 9) -> bool:
    """Linux: have the kernel send ``sig`` (9 = SIGKILL) to this process when its parent ends, however it ends
    (``prctl(PR_SET_PDEATHSIG)``). If ``parent_pid`` is given and the parent is already gone (it died before this
    call), the signal is sent now. True when armed; False elsewhere (macOS, Windows) or if prctl failed.

    The kernel fires it when the *thread* that started this process ends: start such processes from a thread
    that lives as long as it should (the main thread, or the thread that waits for them)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, int(sig), 0, 0, 0) != 0:  # 1 = PR_SET_PDEATHSIG
            return False
    except (OSError, AttributeError):
        return False
    if parent_pid is not None and os.getppid() != int(parent_pid):
        os.kill(os.getpid(), sig)
    return True


@contextlib.contextmanager
def crash_said(line: str) -> Iterator[None]:
    """Print ``line`` on stderr if this process dies inside the block without a Python exception (SIGILL or SIGABRT
    in a native library's code: ``import tensorflow`` on a CPU without AVX, or a mismatched build), where it would
    otherwise end with no word. POSIX only; elsewhere, or where TensorFlow is already imported, nothing.

    A watcher forked before the block (a double fork: no zombie, nothing to reap) waits on a pipe; leaving the block
    in any way — an exception included — writes to it and the watcher exits at once, saying nothing. Only a process
    that died in the block (its end of the pipe closed, nothing written) leaves the watcher the line to say. The
    watcher ignores SIGINT, SIGHUP and SIGTERM (a Ctrl-C reaches the process, which says its own line), lives no
    longer than the block, and never imports anything."""
    if os.name != "posix" or not hasattr(os, "fork") or "tensorflow" in sys.modules:
        yield
        return
    message = (line.rstrip("\n") + "\n").encode()
    read_end, write_end = os.pipe()
    try:
        first = os.fork()
    except OSError:  # no process to spare: go on unwatched
        os.close(read_end)
        os.close(write_end)
        yield
        return
    if first == 0:  # pragma: no cover - a forked watcher; its effect is tested from outside
        try:
            os.close(write_end)
            if os.fork() == 0:
                for fd in (0, 1):  # hold nothing of the process's but stderr: not its output, its locks or files
                    os.close(fd)
                os.closerange(3, read_end)
                os.closerange(read_end + 1, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1024)
                for name in ("SIGINT", "SIGHUP", "SIGTERM"):
                    signal.signal(getattr(signal, name), signal.SIG_IGN)
                if not os.read(read_end, 1):
                    os.write(2, message)
        finally:
            os._exit(0)
    os.close(read_end)
    os.waitpid(first, 0)  # the first child exits at once, leaving the watcher to init
    try:
        yield
    finally:
        try:
            os.write(write_end, b"1")
        except OSError:  # the watcher is gone (killed on its own): nothing to tell, and no traceback here for it
            pass
        finally:
            os.close(write_end)


# One per cluster: the launcher writes each task's pid (= its process group) to it and "done" when every task is
# stopped. If its input ends without "done", the launcher died (SIGKILL, a kernel restart): it stops every group.
SENTINEL = (
    "import os, signal, sys, time\n"
    "for name in ('SIGINT', 'SIGHUP', 'SIGTERM'):\n"
    "    signal.signal(getattr(signal, name), signal.SIG_IGN)\n"
    "groups = []\n"
    "for line in sys.stdin:\n"
    "    if line.strip() == 'done':\n"
    "        sys.exit(0)\n"
    "    if line.strip().isdigit():\n"
    "        groups.append(int(line))\n"
    "for sig in (signal.SIGTERM, signal.SIGKILL):\n"
    "    for group in groups:\n"
    "        try:\n"
    "            os.killpg(group, sig)\n"
    "        except OSError:\n"
    "            pass\n"
    "    time.sleep(1)\n"
)


class Sentinel:
    """Stops the tasks' process groups when the launcher dies without stopping them (see ``SENTINEL``)."""

    def __init__(self):
        self.proc = None
        if not hasattr(os, "killpg"):
            return
        try:
            self.proc = start(
                [sys.executable, "-S", "-c", SENTINEL],
                stdin=subprocess.PIPE,  # its own session:
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                text=True,
            )  # Ctrl-C spares it
        except OSError:
            self.proc = None

    def tell(self, line: str) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.write(line + "\n")
                self.proc.stdin.flush()
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        """Every task is stopped: the sentinel ends without doing anything."""
        if self.proc is None:
            return
        self.tell("done")
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            self.proc.kill()


def kill_group(proc, sig: int) -> None:
    """Send ``sig`` to the process group that ``proc`` (anything with a ``pid``: a ``Popen``, a forked
    :class:`Process`) leads; nothing if it is gone."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError, OSError):
        pass


FORK_KWARGS = {"env", "cwd", "stdout", "stderr", "text", "errors"}


def start(argv: Sequence[str], *, fork: bool = False, **kwargs: Any):
    """``subprocess.Popen(argv, **kwargs)`` in a new session (its own process group: :func:`kill_group` stops it and
    all it started), with SIGINT, SIGTERM and SIGHUP held while it starts.

    ``fork=True``: ``argv`` is ``[sys.executable, "-m", MODULE, ...]`` or ``[sys.executable, "-c", CODE, ...]`` and
    ``env`` is given (all of it: nothing is inherited); its output is text (``stdout``: ``PIPE``, the default, or
    ``DEVNULL``; ``stderr``: ``STDOUT``, the default, or ``PIPE``). Where :func:`can_fork`, it is forked from the fork
    server (a :class:`Process`, which dies with that server: it must not check that its parent is this process);
    elsewhere it starts as above. ValueError for what cannot be forked."""
    argv = list(argv)
    if fork:
        kwargs = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "errors": "replace", **kwargs}
        if (
            argv[:1] != [sys.executable]
            or len(argv) < 3
            or argv[1] not in ("-m", "-c")
            or not isinstance(argv[2], str)
            or "env" not in kwargs
            or set(kwargs) - FORK_KWARGS
            or kwargs["text"] is not True
            or kwargs["stdout"] not in (subprocess.PIPE, subprocess.DEVNULL)
            or kwargs["stderr"] not in (subprocess.STDOUT, subprocess.PIPE)
        ):
            raise ValueError(
                "fork=True runs `python -m MODULE ...` or `python -c CODE ...` with an env, its output "
                "text on pipes (stdout PIPE or DEVNULL, stderr STDOUT or PIPE)"
            )
    with signals_held():
        if fork and can_fork():
            target = {"module": argv[2]} if argv[1] == "-m" else {"code": argv[2]}
            return _server_for(kwargs["env"]).spawn(
                target,
                list(argv[3:]),
                kwargs["env"],
                kwargs.get("cwd"),
                separate_stderr=kwargs["stderr"] == subprocess.PIPE,
                discard_stdout=kwargs["stdout"] == subprocess.DEVNULL,
            )
        if fork:  # started afresh instead: stdin /dev/null, as a forked child's
            kwargs["stdin"] = subprocess.DEVNULL
        return subprocess.Popen(argv, start_new_session=True, **kwargs)


def tail(text: str | bytes | None, lines: int = 5) -> str:
    """The last ``lines`` non-empty lines of a child's output."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").strip().splitlines()[-lines:])


class TimedOut(subprocess.TimeoutExpired):
    """A child ran past its time and its process group was killed: the course's one timeout type (a
    ``subprocess.TimeoutExpired``: ``except subprocess.TimeoutExpired`` catches it too, with ``output`` and
    ``stderr``); its message is one line: what, how long, its last line of output."""

    def __init__(self, cmd, timeout: float, output=None, stderr=None, what: str | None = None):
        super().__init__(cmd, timeout, output, stderr)
        last = tail(stderr, 1) or tail(output, 1)
        self.what = what or " ".join(map(str, cmd))[:120]
        self.message = f"{self.what} ran past {timeout:g} s and was stopped" + (
            f" (its last line: {last[:200]})" if last else ""
        )

    def __str__(self) -> str:
        return self.message


def run(
    argv: Sequence[str], *, timeout: float | None = None, what: str | None = None, fork: bool = False, **kwargs: Any
) -> subprocess.CompletedProcess:
    """:func:`start` ``argv`` (``fork`` as there), its stdout and stderr captured as text, apart (stdin
    ``/dev/null`` unless given; a forked child's is always), and wait. Past ``timeout`` seconds, or on any exception
    while waiting (Ctrl-C), its whole group is killed and reaped; a timeout raises :class:`TimedOut`, naming ``what``
    (default: the command)."""
    kwargs = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "errors": "replace", **kwargs}
    if not fork:
        kwargs.setdefault("stdin", subprocess.DEVNULL)
    proc = start(argv, fork=fork, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc, signal.SIGKILL)
        out, err = proc.communicate()
        raise TimedOut(list(argv), timeout, out, err, what=what) from None
    except BaseException:
        kill_group(proc, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


@contextlib.contextmanager
def group(argv: Sequence[str], *, grace_s: float = 2.0, fork: bool = False, **kwargs: Any) -> Iterator[Any]:
    """:func:`start` ``argv`` (``fork`` as there) for the ``with`` block; when the block ends, however it ends (done,
    an exception, Ctrl-C, :class:`Stopped`), the group is stopped: SIGTERM if the process still runs, SIGKILL to the
    whole group after ``grace_s`` (also when the process itself has ended: what it started goes too), and reaped —
    :func:`stop_all`. If this process dies without getting there (SIGKILL included), a :class:`Sentinel` sends the
    group SIGTERM, then SIGKILL. SIGINT/SIGTERM/SIGHUP are held while it starts and delivered inside the block's
    guard, so no signal can leave a started process unwatched::

        with processes.group([sys.executable, "-m", "tool"], stdout=subprocess.PIPE) as proc:
            code = proc.wait(timeout=60)   # TimeoutExpired: the group is stopped on the way out
    """
    sentinel = proc = None
    try:
        sentinel = Sentinel()
        with signals_held():
            proc = start(argv, fork=fork, **kwargs)
            sentinel.tell(str(proc.pid))
        yield proc
    finally:
        try:
            if proc is not None:
                stop_all({"": proc}, grace_s=grace_s)
        finally:
            if sentinel is not None:
                sentinel.close()  # every process of the group is gone: it ends without doing anything


def stop_all(procs: dict, grace_s: float = 3.0) -> None:
    """SIGTERM every task's process group, then SIGKILL what is left after ``grace_s``; reap them all.

    A second Ctrl-C while it waits cuts the grace period short: the SIGKILL still goes out, then the
    interrupt is raised again."""
    interrupted = None
    for proc in procs.values():
        if proc.poll() is None:
            kill_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    try:
        for proc in procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    except KeyboardInterrupt as exc:
        interrupted = exc
    for proc in procs.values():
        kill_group(proc, signal.SIGKILL)  # the group: children of the task too, even if the task itself exited
    for proc in procs.values():
        while True:
            try:
                proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:  # pragma: no cover - a process that survives SIGKILL
                break
            except KeyboardInterrupt as exc:  # keep reaping: SIGKILL has been sent, this is quick
                interrupted = exc
    deadline = time.monotonic() + 5.0  # SIGKILL is asynchronous: wait (briefly) until each group is empty
    for proc in procs.values():
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except (ProcessLookupError, PermissionError, OSError):
                break
            try:
                time.sleep(0.02)
            except KeyboardInterrupt as exc:
                interrupted = exc
                break
    if interrupted is not None:
        raise interrupted


def usable_cores() -> int:
    """The CPU cores this process may run on: what ``taskset``, a container or ``prove --jobs`` left it (all of
    them where the OS cannot say: macOS, Windows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


MIN_INTEROP_THREADS = 2


def interop_threads() -> int:
    """Inter-op threads for a cluster task: TensorFlow's default (one per core this process may use), but at least
    :data:`MIN_INTEROP_THREADS`. With one core TensorFlow starts one inter-op thread, and a distributed task that
    blocks it (waiting for a peer's tensor or a scheduled function) has none left to serve its peers: a
    parameter-server cluster under ``taskset -c 0`` never finished (measured; with 2 threads it runs in seconds)."""
    return max(MIN_INTEROP_THREADS, usable_cores())


def tensorflow_has_run_an_op() -> bool:
    """Whether this process has started TensorFlow's eager runtime (run an op, listed devices): its thread pools
    then exist, and a process forked from it would not start clean. Reads the private
    ``context.context()._initialized`` (no public API tells); raises, naming the TensorFlow version, if a release
    renames it — so the fork-based measurements stop loudly instead of forking a process that may hang."""
    import tensorflow as tf
    from tensorflow.python.eager import context

    ctx = context.context()
    if not isinstance(getattr(ctx, "_initialized", None), bool):
        raise RuntimeError(
            f"TensorFlow {tf.__version__}'s eager context has no boolean '_initialized' any more: "
            "course_utils.processes.tensorflow_has_run_an_op needs updating for this release"
        )
    return ctx._initialized


# ---- the fork server ----

# environment variables read while TensorFlow and Keras are imported (logging, oneDNN, CUDA, library paths,
# Python's own): a child must have been forked from a server that imported them with the same values
IMPORT_TIME_PREFIXES = (
    "TF_",
    "XLA_",
    "ONEDNN_",
    "DNNL_",
    "CUDA_",
    "KERAS_",
    "LD_",
    "PYTHON",
    "OMP_",
    "MKL_",
    "KMP_",
    "TPU_",
    "HOME",
    "COVERAGE_PROCESS_",  # coverage's start-up hook (its .pth file): devtools.coverage_map measures forked tasks too
)
# read when the program makes its strategy or runtime, after the fork: may differ per child
PER_TASK = ("TF_CONFIG", "TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS")
START_TIMEOUT_S = 120.0  # the server's import plus one fork

_SERVER = "import sys\nfrom course_utils import processes\nprocesses._serve(int(sys.argv[1]))\n"


def can_fork() -> bool:
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
        self._readers: list[threading.Thread] | None = None
        self._texts: dict[str, list[str]] = {}

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._server.ended:
            if not self._server.ended.wait_for(lambda: self.returncode is not None, timeout):
                raise subprocess.TimeoutExpired(f"forked task {self.pid}", timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        """Read ``stdout`` and ``stderr`` (those that are pipes) to the end and wait, as ``Popen.communicate``;
        on ``timeout`` ``subprocess.TimeoutExpired`` (the task is left running: kill it, then call this again, which returns all it said)."""
        if self._readers is None:  # the first call starts the readers; a call after a timeout goes on with them
            self._texts, self._readers = {}, []
            for name in ("stdout", "stderr"):
                stream = getattr(self, name)
                if stream is not None and not stream.closed:
                    texts = self._texts[name] = []
                    self._readers.append(
                        threading.Thread(
                            target=lambda f=stream, t=texts: t.extend(iter(lambda: f.read(1 << 16), "")), daemon=True
                        )
                    )
                    self._readers[-1].start()
        texts = self._texts
        deadline = None if timeout is None else time.monotonic() + timeout
        self.wait(timeout)
        for reader in self._readers:
            reader.join(None if deadline is None else max(1.0, deadline - time.monotonic()))
        for name in texts:
            getattr(self, name).close()
        return (
            "".join(texts["stdout"]) if "stdout" in texts else None,
            "".join(texts["stderr"]) if "stderr" in texts else None,
        )

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
        self.proc = start(
            [sys.executable, "-c", _SERVER, str(theirs.fileno())],
            env=server_env,
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
        )
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
        resets = 0
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except ConnectionResetError:  # the server ended with a request of ours unread: the kernel reports that
                resets += 1  # once, and what the server sent before (its error) is still to be read
                if resets <= 3:
                    continue
                data = b""
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
                    kill_group(child, signal.SIGKILL)
                    child.returncode = -signal.SIGKILL
            self.ended.notify_all()

    def spawn(
        self, target: dict, args: list, env: dict, cwd: str | None, separate_stderr: bool, discard_stdout: bool
    ) -> Process:
        pipes: list[tuple[int | None, int]] = [
            (None, os.open(os.devnull, os.O_WRONLY)) if discard_stdout else os.pipe()
        ]
        if separate_stderr:
            pipes.append(os.pipe())
        request = json.dumps(
            {**target, "args": [str(a) for a in args], "env": env, "cwd": os.path.abspath(cwd) if cwd else os.getcwd()}
        ).encode()
        mine = [r for r, _ in pipes if r is not None]
        try:
            with self.lock:
                with self.ended:
                    before = len(self.started)
                socket.send_fds(self.sock, [request], [w for _, w in pipes])
                with self.ended:
                    if not self.ended.wait_for(lambda: len(self.started) > before or not self.alive, START_TIMEOUT_S):
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
        how = (
            "it is still running"
            if code is None
            else f"it died of {signal.Signals(-code).name} (while importing TensorFlow?)"
            if code < 0
            else f"it exited with code {code}"
        )
        self.stderr.seek(0)
        lines = self.stderr.read().decode(errors="replace").strip().splitlines()
        return how + (f"; its last line: {lines[-1][-300:]}" if lines else "")

    def stderr_tail(self) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace").strip()
        return ("; its output: " + text[-2000:]) if text else ""

    def stop(self) -> None:
        for end in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.sock.close):  # the server ends when its
            try:  # socket does (shutdown also
                end()  # wakes this side's reader)
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


def stop_servers() -> bool:
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


atexit.register(stop_servers)


def _name(target: dict) -> str:
    return target.get("module") or "python -c"


# ---- the server side ----


def _serve(fd: int) -> None:
    """Import TensorFlow and Keras once, then fork a child per request until the socket closes; report each
    child's pid when started and its exit code (``subprocess``'s convention) when it ends."""
    sock = socket.socket(fileno=fd)
    for name in ("SIGINT", "SIGHUP"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)  # ended by its socket closing, not by Ctrl-C
    try:  # first, while argv and environ are as the process started (the memory it rewrites for each child)
        import setproctitle

        setproctitle.setproctitle(
            f"{sys.executable} -c course_utils.processes._serve (the fork server: TensorFlow imported)"
        )
    except ImportError:  # pragma: no cover
        pass
    try:
        import tensorflow  # noqa: F401 - the point: once, for every child
        import keras  # noqa: F401
    except BaseException as exc:  # noqa: BLE001 - a broken install: say so in one line, start nothing
        last = (str(exc).strip().splitlines() or [""])[-1]
        error = f"TensorFlow could not be imported ({type(exc).__name__}: {last})"
        print(error, file=sys.stderr, flush=True)  # also its last line: ServerFailed says it if the message is lost
        sock.send(json.dumps({"error": error}).encode())
        return

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
        die_with_parent(server_pid)  # the server ends with its launcher (its socket closes): so does the task
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
