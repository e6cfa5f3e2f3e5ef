"""How every command of the course ends (``doctor``, ``lint``, ``set-repo``, ``prove``, ``capstone``, ``cluster``,
``site``): one helper, so each one says a problem in one line, never a traceback, and exits the same way:

- 0 done; 1 it ran and something failed (a claim, a task, the data: the command's ``failures``);
- 2 bad usage (an option, a folder it must not touch: the command's ``usage`` errors), said as ``prog: message``;
- 130 Ctrl-C, and 128 + N when signal N (SIGTERM, SIGHUP) stopped it — after the command's own cleanup, with one
  line saying what was kept.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from typing import Callable

from . import processes

USAGE, FAILED, INTERRUPTED = 2, 1, 130
BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader closed the pipe


class UsageError(Exception):
    """Bad usage, said in one line (the message after ``prog: ``): exit 2."""


class Failed(Exception):
    """The command ran and failed, said in one line: exit 1."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser that says a bad option in one line: it raises ``error_class(message)`` (a ``usage`` error
    of :func:`run`, so exit 2) where argparse prints the whole usage and exits itself."""

    error_class: type[Exception] = UsageError

    def error(self, message):
        raise self.error_class(message)


# A write with no file name that fails so: this process's own output (stdout on a full device, a dead terminal)
_OUTPUT_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EBADF)


def run(
    prog: str,
    body: Callable[[], int | None],
    *,
    usage: tuple[type[BaseException], ...] = (),
    failures: tuple[type[BaseException], ...] = (),
    stopped: Callable[[str], str] = lambda what: what,
) -> int:
    """``body()``'s exit status, run under :func:`processes.stop_on_signals` (SIGTERM and SIGHUP raise
    :class:`processes.Stopped`, as Ctrl-C raises ``KeyboardInterrupt``). An exception of ``usage`` becomes
    ``prog: message`` and 2; a :class:`Failed` or one of ``failures``, the same and 1; Ctrl-C, ``prog: `` + ``stopped("interrupted")`` and 130;
    a signal, ``prog: `` + ``stopped("stopped by SIGTERM")`` and 128 + its number. ``stopped`` adds what was kept
    (``lambda what: f"{what}: the pages built so far are kept"``)."""
    try:
        with processes.stop_on_signals():
            return int(body() or 0)
    except BrokenPipeError:  # the reader of our output went away (`doctor | head -1`): stop quietly, as a pipe's
        # writer does; what is still buffered goes nowhere (else Python's exit flush raises the same error again)
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):  # no real stdout (a notebook's, a test's): nothing to redirect
            pass
        return BROKEN_PIPE
    except KeyboardInterrupt:
        print(f"\n{prog}: {stopped('interrupted')}", file=sys.stderr)
        return INTERRUPTED
    except processes.Stopped as stop:
        print(f"\n{prog}: {stopped(f'stopped by {stop.name}')}", file=sys.stderr)
        return 128 + stop.signum
    except (UsageError, *usage) as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return USAGE
    except (Failed, *failures) as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return FAILED
    except OSError as err:
        if err.filename is not None or err.errno not in _OUTPUT_ERRORS:
            raise  # a file's, or another error: not ours to word
        # this process's own output cannot be written (`doctor > /dev/full`, a closed stdout): one line on stderr,
        # and stdout pointed at /dev/null so that Python's exit flush does not raise again
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        print(f"{prog}: cannot write its output: {err.strerror or err}", file=sys.stderr)
        return FAILED
