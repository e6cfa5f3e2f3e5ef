"""Running a notebook top to bottom in a fresh kernel: the one runner the course site (``python -m course_utils
site``), ``prove --from notebooks`` and the tests' full-mode, XLA and stand-in executions share.

:func:`run` executes a notebook (nbclient, the engine of ``jupyter nbconvert --execute`` and nbval) in place with the
environment given, in a working folder of the caller's, and returns how long it took and why it stopped, if it did.
A stop signal (SIGINT, SIGTERM, SIGHUP) while a kernel runs stops the kernel (its whole process group) at once and
raises KeyboardInterrupt (SIGINT) or :class:`processes.Stopped`; a cell that runs long reports itself every
``still_running_every_s``; the kernel's own output goes to a log file, not the terminal.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable

from jupyter_core.utils import run_sync
from nbclient import NotebookClient

from . import processes

STILL_RUNNING_EVERY_S = 30.0  # a progress line while one cell runs longer than this
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def stop_signals() -> list[int]:
    return [getattr(signal, name) for name in STOP_SIGNALS if hasattr(signal, name)]


class Client(NotebookClient):
    """nbclient's NotebookClient, changed in two ways. A stop signal (SIGINT, SIGTERM, SIGHUP) while a kernel runs
    stops the kernel at once and ends the execution (nbclient's own handlers shut the kernel down and let the
    execution carry on, so the notebook would be marked failed with a ZMQ error and the build would go on); the
    caller raises KeyboardInterrupt or :class:`processes.Stopped` after it. And each cell reports its progress."""

    course_stop: int | None = None  # the signal that stopped the execution
    course_task: asyncio.Task | None = None
    course_km: Any = None
    course_saved: dict = {}  # the Python-level handlers before the execution, put back after it
    course_running: tuple[int, float] | None = None  # (cell index, start) of the cell running now
    course_note_at = 0.0
    course_report: Callable[[int, float, str], None] | None = None  # (index, seconds, how) → a progress line
    course_every_s = STILL_RUNNING_EVERY_S

    def _course_on_signal(self, signum: int) -> None:
        if self.course_stop is None:  # the first one: later ones must not cut the kernel's shutdown short
            self.course_stop = signum
            self.shutdown_kernel = "immediate"  # killed, not asked: a busy kernel does not answer
            if self.course_task is not None:
                self.course_task.cancel()

    def _course_handle_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in stop_signals():
            try:
                loop.add_signal_handler(sig, self._course_on_signal, sig)
            except (RuntimeError, ValueError, NotImplementedError):  # not the main thread, or no signals
                pass

    async def async_start_new_kernel(self, **kwargs: Any) -> None:
        # nbclient has just put its own handlers in (async_setup_kernel): ours replace them before the
        # kernel exists, with no await in between
        self._course_handle_signals()
        self.course_task = self.course_task or asyncio.current_task()
        self.course_km = self.km
        await super().async_start_new_kernel(**kwargs)

    async def async_execute(self, reset_kc: bool = False, **kwargs: Any) -> Any:
        self.course_task = asyncio.current_task()
        self._course_handle_signals()
        ticker = asyncio.ensure_future(self._course_tick())
        try:
            return await super().async_execute(reset_kc=reset_kc, **kwargs)
        finally:
            ticker.cancel()
            loop = asyncio.get_running_loop()
            for sig in stop_signals():
                try:
                    loop.remove_signal_handler(sig)  # asyncio leaves SIG_DFL behind: the old ones go back
                    if sig in self.course_saved:
                        signal.signal(sig, self.course_saved[sig])
                except (RuntimeError, ValueError, NotImplementedError):
                    pass

    execute = run_sync(async_execute)  # nbclient's execute wraps its own async_execute, not this one

    async def _course_tick(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            if self.course_running is not None and self.course_report is not None:
                index, start = self.course_running
                if time.perf_counter() - start >= self.course_note_at:
                    self.course_report(index, time.perf_counter() - start, "still running")
                    self.course_note_at += self.course_every_s

    def course_cell_started(self, cell: Any, cell_index: int, **_: Any) -> None:
        self.course_running = (cell_index, time.perf_counter())
        self.course_note_at = self.course_every_s

    def course_cell_ended(self, cell: Any, cell_index: int, execute_reply: Any = None, **_: Any) -> None:
        if self.course_running is None or self.course_running[0] != cell_index:
            return  # reported already (on_cell_error comes before on_cell_executed)
        seconds = time.perf_counter() - self.course_running[1]
        self.course_running = None
        status = (execute_reply or {}).get("content", {}).get("status", "ok")
        if self.course_report is not None:
            self.course_report(cell_index, seconds, "" if status == "ok" else "error")


def kill_kernel_left(km: Any) -> None:
    """The kernel of ``km`` and its process group, killed if its process still runs (a stop that came while it
    started, before nbclient's cleanup could see it). Only a process this build started and has not reaped."""
    process = getattr(getattr(km, "provisioner", None), "process", None)
    if process is None or process.poll() is not None:
        return
    processes.kill_group(process, signal.SIGKILL)  # jupyter_client starts each kernel in its own session
    try:
        process.wait(10)
    except Exception:  # noqa: BLE001 - reaped or not, it was sent SIGKILL
        pass


def failed_cell(nb) -> tuple[int, str]:
    """(index, "ErrorName: message") of the cell that stopped the run: the first error output in a cell that was not
    tagged raises-exception."""
    for index, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code" or "raises-exception" in cell.get("metadata", {}).get("tags", []):
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                message = str(output.get("evalue", "")).strip().splitlines()
                return index, f"{output.get('ename', 'Error')}: {message[0][:300] if message else ''}".rstrip(": ")
    return -1, ""


def run(
    nb: Any,
    env: dict,
    *,
    workdir: str | os.PathLike,
    timeout: float,
    log_path: str | os.PathLike,
    report_cell: Callable[[int, float, str], None] | None = None,
    allow_errors: bool = False,
    still_running_every_s: float = STILL_RUNNING_EVERY_S,
) -> tuple[float, str]:
    """Execute ``nb`` (an nbformat notebook, changed in place) with ``env`` in ``workdir``; ``(seconds, failure)``,
    failure ``""`` when every cell ran (with ``allow_errors``, cells that raise do not stop it: read their error
    outputs). ``report_cell(index, seconds, how)`` hears of each cell as it ends (``how``: ``""``, ``"error"``) and
    of one still running (``"still running"``). A stop signal stops the kernel and raises KeyboardInterrupt or
    :class:`processes.Stopped`."""
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    client = Client(
        nb,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=allow_errors,
        resources={"metadata": {"path": str(workdir)}},
    )
    client.course_saved = {sig: signal.getsignal(sig) for sig in stop_signals()}
    client.course_report = report_cell
    client.course_every_s = still_running_every_s
    client.on_cell_execute = client.course_cell_started
    client.on_cell_error = client.course_cell_ended
    client.on_cell_executed = client.course_cell_ended
    log_path = Path(log_path)
    try:
        os.unlink(log_path)  # a name only: a link or a pipe put there is removed, never followed or opened
    except FileNotFoundError:
        pass
    log = open(
        os.open(
            log_path,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
            0o666,
        ),
        "wb",
    )
    start = time.perf_counter()
    failure = ""
    try:
        client.execute(env=env, stdout=log, stderr=log)
    except CellTimeoutError as err:
        failure = f"a cell ran past the {timeout:g} s limit ({str(err).strip().splitlines()[0][:200]})"
    except DeadKernelError as err:
        failure = f"the kernel died ({str(err).strip()[:200]}; its output is in {log_path.name})"
    except CellExecutionError:
        index, error = failed_cell(nb)
        failure = f"cell {index + 1} of {len(nb.cells)}: {error}" if index >= 0 else "a cell failed"
    except KeyboardInterrupt:  # before our handlers were in, or after
        client.course_stop = client.course_stop or signal.SIGINT
    except processes.Stopped as stop:
        client.course_stop = client.course_stop or stop.signum
    except asyncio.CancelledError:
        failure = "" if client.course_stop else "could not run (the execution was cancelled)"
    except Exception as err:  # noqa: BLE001 - e.g. no kernel: reported, the caller goes on
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        failure = f"could not run ({type(err).__name__}: {first})"
    finally:
        kill_kernel_left(client.course_km)
        log.close()
        for sig, handler in client.course_saved.items():  # whatever happened inside, the old handlers are back
            try:
                signal.signal(sig, handler)
            except (ValueError, OSError, TypeError):
                pass
    if client.course_stop is not None:
        if client.course_stop == signal.SIGINT:
            raise KeyboardInterrupt
        raise processes.Stopped(client.course_stop)
    return round(time.perf_counter() - start, 1), failure


__all__ = ["STILL_RUNNING_EVERY_S", "STOP_SIGNALS", "failed_cell", "kill_kernel_left", "run", "stop_signals"]
