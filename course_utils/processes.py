"""Child processes and stop signals, the plumbing every command and measurement shares (no TensorFlow here):

- :func:`stop_on_signals` turns SIGTERM and SIGHUP into :class:`Stopped` in the main thread, so the cleanup that
  stops child processes runs and a command can exit ``128 + signal``; :func:`signals_held` holds SIGINT, SIGTERM and
  SIGHUP while a child starts, so none can leave a started process unwatched;
- :func:`start` starts a child in its own session (process group), :func:`run` also waits for it (a timeout kills
  the group and becomes one line, :class:`TimedOut`), :func:`tail` keeps the last lines of what it said;
- :func:`stop_all` stops process groups (SIGTERM, then SIGKILL after a grace period) and reaps them; a
  :class:`Sentinel` process does it when this process dies without getting there (even by SIGKILL);
  :func:`die_with_parent` (Linux) has the kernel kill this process when its parent ends; :func:`crash_said` says one
  line when this process dies by a signal inside a block (a native crash while importing TensorFlow);
- :func:`usable_cores`: the cores this process may run on; :func:`interop_threads`: TensorFlow's inter-op threads for a child that talks to its peers;
  :func:`tensorflow_has_run_an_op`: whether a process forked from this one would start clean.

:func:`course_utils.forkserver.process_group` runs one command this way for a ``with`` block.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Iterator, Sequence

__all__ = ["MIN_INTEROP_THREADS", "Sentinel", "Stopped", "TimedOut", "crash_said", "die_with_parent", "interop_threads",
           "kill_group", "run", "signals_held", "start", "stop_all", "stop_on_signals", "tail",
           "tensorflow_has_run_an_op", "usable_cores"]


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
            self.proc = subprocess.Popen([sys.executable, "-S", "-c", SENTINEL], stdin=subprocess.PIPE,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                                         start_new_session=True)  # a closed terminal or Ctrl-C does not stop it
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
    :class:`course_utils.forkserver.Process`) leads; nothing if it is gone."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def start(argv: Sequence[str], **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(argv, **kwargs)`` in a new session (its own process group: :func:`kill_group` stops it and
    all it started), with SIGINT, SIGTERM and SIGHUP held while it starts."""
    with signals_held():
        return subprocess.Popen(list(argv), start_new_session=True, **kwargs)


class TimedOut(RuntimeError):
    """A child ran past its time and was stopped; the message is one line (what, how long, its last words)."""


def tail(text: str | bytes | None, lines: int = 5) -> str:
    """The last ``lines`` non-empty lines of a child's output."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").strip().splitlines()[-lines:])


def run(argv: Sequence[str], *, timeout: float | None = None, what: str | None = None, **kwargs) -> subprocess.CompletedProcess:
    """:func:`start` ``argv``, its stdout and stderr captured as text (stdin ``/dev/null`` unless given), and wait.
    Past ``timeout`` seconds, or on any exception while waiting (Ctrl-C), its whole group is killed and reaped; a
    timeout raises :class:`TimedOut`, one line naming ``what`` (default: the command) and its last output line."""
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    kwargs.setdefault("text", True)
    kwargs.setdefault("errors", "replace")
    proc = start(argv, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc, signal.SIGKILL)
        out, err = proc.communicate()
        last = tail(err, 1) or tail(out, 1)
        raise TimedOut(f"{what or ' '.join(map(str, argv))[:120]} ran past {timeout:g} s and was stopped"
                       + (f" (its last line: {last[:200]})" if last else "")) from None
    except BaseException:
        kill_group(proc, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)

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
        raise RuntimeError(f"TensorFlow {tf.__version__}'s eager context has no boolean '_initialized' any more: "
                           "course_utils.processes.tensorflow_has_run_an_op needs updating for this release")
    return ctx._initialized
