"""Exercises for the course notebooks: ``check()``, ``hint()`` and ``solution()``, no grader needed.

How a lesson uses it (the setup cell already imported ``course_utils``)::

    from course_utils import exercises
    from course_utils.lessons import tpu_initialization
    ex = exercises.load(tpu_initialization)          # one bank per lesson

    answer = ...                                     # the learner replaces the ...
    ex.replicas_on_v5e.check(answer)                 # last expression: shows "✅ Correct — ..."

    ex.replicas_on_v5e.hint()                        # prints hint 1, then hint 2, ...
    ex.replicas_on_v5e.solution()                    # prints the reference solution as code

``check()`` never raises (not even ``SystemExit`` from learner code), never prints and never hangs:
it returns a :class:`CheckResult` whose status is ``"correct"``, ``"incorrect"``, ``"unanswered"``
(an untouched stub: ``...``, ``None``, a function that returns ``None``/``...`` or raises
``NotImplementedError``) or ``"error"`` (the learner's code raised or ran past the time bound, or
``check`` was called without the context it needs). Its message is one line. Exercises that need
objects from the notebook declare them in ``needs`` and receive them by keyword or in that order:
``ex.build_in_scope.check(make_model, strategy=strategy)`` or ``…check(make_model, strategy)``.

Hints and solutions live here, not in the notebook, so a learner sees them only on request.

Adding a bank for a new lesson: write one checker per exercise (``checker(answer, **context)``
returns the success message, or raises :class:`Incorrect` with a one- or two-sentence message that
names what was expected, what was got, and the idea to revisit), wrap each in :class:`Exercise`
with its hints, solution and stub, and list them in ``EXERCISES = ExerciseBank("<lesson>", [...])`` in the lesson's
``course_utils/lessons/<lesson>/exercises.py``; a reference answer and some typical wrong ones go in the tests
(``tests/exercise_answers/<lesson>.py``). ``tests/test_exercises.py`` then checks every lesson's bank
(``course_utils.lessons.LESSONS``) automatically: the reference passes, each wrong example fails with its expected
message, every stub counts as unanswered, and each printed solution, executed, passes.
Helpers for checkers: :func:`call_learner` (runs learner code and turns stubs and crashes into the
right result), :func:`read_dataset` (one bounded pass over a learner's dataset: a `.repeat()` is
caught, not iterated forever), :func:`require_callable`, :func:`require_int`, :func:`require_number`,
:func:`describe` (use it, not ``repr``/f-strings, to show a learner's value: a huge int or a hostile
``__repr__`` cannot make it fail). Every ``check()`` runs under a time bound (:data:`CHECK_TIMEOUT_S`,
``COURSE_CHECK_TIMEOUT``).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import itertools
import math
import os
import re
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator, Sequence

__all__ = [
    "CheckResult",
    "Exercise",
    "ExerciseBank",
    "Incorrect",
    "UnknownBankError",
    "CHECK_TIMEOUT_S",
    "DATASET_LIMIT",
    "call_learner",
    "check_timeout_s",
    "describe",
    "load",
    "read_dataset",
    "require_callable",
    "require_int",
    "require_number",
]

# ----------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------

_PREFIX = {
    "correct": ("✅", "Correct"),
    "incorrect": ("❌", "Not yet"),
    "unanswered": ("✏️", "Not answered yet"),
    "error": ("⚠️", "Error"),
}


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """What ``check()`` returns. Shown as one line, e.g. ``✅ Correct — v5e-1 is one chip…``.

    The message is always one clean line: terminal colour codes (Keras puts them in its errors) and
    control characters are removed, whitespace is collapsed and it is cut at 1,000 characters.
    """

    status: str  # "correct" | "incorrect" | "unanswered" | "error"
    message: str

    def __post_init__(self):
        if self.status not in _PREFIX:
            raise ValueError(f"status must be one of {sorted(_PREFIX)}, got {self.status!r}")
        object.__setattr__(self, "message", _one_line(self.message))

    @property
    def passed(self) -> bool:
        return self.status == "correct"

    def __bool__(self) -> bool:
        return self.passed

    @property
    def text(self) -> str:
        icon, word = _PREFIX[self.status]
        return f"{icon} {word} — {self.message}"

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__

    def _repr_markdown_(self) -> str:
        icon, word = _PREFIX[self.status]
        return f"{icon} **{word}** — {self.message}"


class _Verdict(Exception):
    """Internal: carries a finished CheckResult out of a checker."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.result = CheckResult(status, message)


class Incorrect(_Verdict):
    """Raise from a checker when the answer is wrong; the message is shown to the learner."""

    def __init__(self, message: str):
        super().__init__("incorrect", message)


def _unanswered(message: str) -> _Verdict:
    return _Verdict("unanswered", message)


def error(message: str) -> _Verdict:
    """For a checker: raise this when the check cannot run with what it was given (not the learner's answer being
    wrong): the result reads "error" with ``message``."""
    return _Verdict("error", message)


# ----------------------------------------------------------------------------------------------
# Text that is safe to show: one line, no terminal colour codes, bounded length
# ----------------------------------------------------------------------------------------------

# CSI sequences (colours, cursor moves: ESC [ … letter), OSC sequences (ESC ] … BEL or ESC \),
# other two-character escapes; then the C0/C1 control characters that are not whitespace.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]|\x9b[0-?]*[ -/]*[@-~]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_MESSAGE_LIMIT = 1000  # characters in a CheckResult message


def _safe_text(value: Any, limit: int = _MESSAGE_LIMIT) -> str:
    """``str(value)`` that never raises (a learner's ``__str__`` may) and is cut to a few × ``limit``."""
    try:
        text = value if isinstance(value, str) else str(value)
        if not isinstance(text, str):
            raise TypeError
    except BaseException:  # noqa: BLE001 - SystemExit from a hostile __str__ must not escape either
        text = f"<{type(value).__name__} that cannot be shown>"
    return str.__getitem__(text, slice(0, limit * 4))


def _one_line(value: Any, limit: int = _MESSAGE_LIMIT) -> str:
    """One clean line: colour codes and control characters removed, whitespace collapsed, ≤ ``limit``."""
    text = _CONTROL.sub("", _ANSI.sub("", _safe_text(value, limit)))
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _short(text: Any, limit: int = 200) -> str:
    return _one_line(text, limit)


# ----------------------------------------------------------------------------------------------
# describe(): a learner's value in a few words, never crashing and never slow
# ----------------------------------------------------------------------------------------------

_BRIEF_ITEMS = 6  # items shown per container
_BRIEF_DEPTH = 3  # container levels shown
_BIG_INT_BITS = 200  # ints above ~60 digits are shown by their size (str() of 10**5000 raises)


def _module_of(value: Any) -> str:
    module = getattr(type(value), "__module__", "")
    return module if isinstance(module, str) else ""


def _is_tensor(value: Any) -> bool:
    try:
        return _module_of(value).startswith("tensorflow") and hasattr(value, "dtype") and hasattr(value, "shape")
    except Exception:  # noqa: BLE001 - a __getattr__ that raises something odd
        return False


def _digits(n: int) -> str:
    return f"about {int(abs(n).bit_length() * 0.30103) + 1} digits"


def _brief(value: Any, depth: int = 0) -> str:
    """A bounded ``repr`` of Python's own scalars and containers; other objects by type name only.

    It never calls a learner's ``__repr__``, shows at most ``_BRIEF_ITEMS`` items per container and
    ``_BRIEF_DEPTH`` levels, and shows huge ints by their size, so any value costs microseconds.
    """
    if value is None or value is ... or isinstance(value, bool):
        return repr(bool(value)) if isinstance(value, bool) else repr(value)
    if isinstance(value, int):
        if value.bit_length() > _BIG_INT_BITS:
            return f"<{'negative ' if value < 0 else ''}int with {_digits(value)}>"
        return int.__repr__(value)
    if isinstance(value, float):
        return float.__repr__(value)
    if isinstance(value, complex):
        return complex.__repr__(value)
    if isinstance(value, str):
        head = str.__getitem__(value, slice(0, 50))
        return str.__repr__(head) + ("…" if str.__len__(value) > 50 else "")
    if isinstance(value, (bytes, bytearray)):
        head = bytes(value[:50])
        return bytes.__repr__(head) + ("…" if len(value) > 50 else "")
    containers = {list: "[]", tuple: "()", set: "{}", frozenset: "{}", dict: "{}"}
    kind = next((k for k in containers if isinstance(value, k)), None)
    if kind is not None:
        opening, closing = containers[kind]
        size = len(value)
        if size == 0:
            return {list: "[]", tuple: "()", set: "set()", frozenset: "frozenset()", dict: "{}"}[kind]
        if depth >= _BRIEF_DEPTH:
            return f"{opening}…{closing}"
        if kind is dict:
            items = itertools.islice(dict.items(value), _BRIEF_ITEMS)
            parts = [f"{_brief(k, depth + 1)}: {_brief(v, depth + 1)}" for k, v in items]
        else:
            parts = [_brief(v, depth + 1) for v in itertools.islice(iter(value), _BRIEF_ITEMS)]
        if size > _BRIEF_ITEMS:
            parts.append(f"… {size} items in all")
        elif kind is tuple and size == 1:
            parts[0] += ","
        return opening + ", ".join(parts) + closing
    if inspect.isfunction(value) or inspect.ismethod(value):
        return f"<function {getattr(value, '__name__', '?')}>"
    if _module_of(value) == "numpy" and getattr(value, "ndim", None) == 0:
        try:
            item = value.item()
        except Exception:  # noqa: BLE001
            return f"<numpy.{type(value).__name__}>"
        if isinstance(item, (bool, int, float, complex, str, bytes)):
            return _brief(item, depth)
    return f"<{type(value).__name__}>"


def describe(value: Any) -> str:
    """A short, learner-readable description of a value: ``str '1'``, ``float 64.0``, ``tf.Tensor …``.

    Never raises and never takes long, whatever the value: huge ints are shown by their size, long
    or deeply nested containers are cut, and a learner's own ``__repr__`` is never called.
    """
    try:
        return _describe(value)
    except BaseException:  # noqa: BLE001 - describing a value must never be the thing that fails
        try:
            return f"an object of type {type(value).__name__}"
        except BaseException:  # noqa: BLE001
            return "an object"


def _describe(value: Any) -> str:
    if value is None or value is ...:
        return repr(value)
    if _is_tensor(value):
        dtype = getattr(value.dtype, "name", value.dtype)
        try:
            shape = tuple(value.shape)
        except Exception:  # noqa: BLE001 - unknown rank
            shape = "unknown"
        return f"tf.Tensor (shape {shape}, dtype {_short(dtype, 40)})"
    if _module_of(value) == "numpy":
        ndim = getattr(value, "ndim", None)
        if isinstance(ndim, int) and ndim > 0:
            return f"numpy array (shape {tuple(value.shape)}, dtype {value.dtype})"
        return f"numpy.{type(value).__name__} {_short(_brief(value), 60)}"
    if inspect.isfunction(value) or inspect.ismethod(value):
        return f"function {_short(getattr(value, '__name__', '?'), 60)}"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > _BIG_INT_BITS:
        sign = "a negative int" if value < 0 else "an int"
        return f"{sign} with {_digits(value)}"
    if isinstance(value, (str, bytes, bool, int, float, complex, list, tuple, dict, set, frozenset)):
        return f"{type(value).__name__} {_short(_brief(value), 60)}"
    return f"an object of type {type(value).__name__}"


# ----------------------------------------------------------------------------------------------
# A time bound for checking: learner code can loop, sleep or read a `.repeat()` dataset forever
# ----------------------------------------------------------------------------------------------

CHECK_TIMEOUT_S = 30.0
"""Seconds one ``check()`` may take, learner code included; ``COURSE_CHECK_TIMEOUT`` overrides it.

Generous on purpose: the checker's own work (building a small model, tracing a ``tf.function``) takes a
few seconds on a slow CPU, and a false "took too long" is worse than waiting for a real one."""


def check_timeout_s() -> float:
    """The time bound of one ``check()``: ``COURSE_CHECK_TIMEOUT`` (seconds, > 0) or :data:`CHECK_TIMEOUT_S`.

    ``COURSE_CHECK_TIMEOUT=0`` (or ``off``) removes the bound. An unreadable value is ignored: a check
    must never fail because of a setting.
    """
    raw = os.environ.get("COURSE_CHECK_TIMEOUT", "").strip().lower()
    if raw in {"0", "off", "none", "no"}:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        value = float(CHECK_TIMEOUT_S)
    return value


class _TimedOut(BaseException):
    """Raised inside the running check when its time bound is hit.

    A ``BaseException``, so a learner's ``except Exception:`` (and the checkers' own) cannot swallow it.
    """


_REFIRE_S = 0.02  # after the bound, fire again this often: a bare `except:` in a loop cannot hold it


_ESCALATE_S = 1.0  # interrupts swallowed this long after the bound: raise at the learner's lines too
_LIBRARY_FILES: dict[str, bool] = {}


def _learner_code(filename: str) -> bool:
    """Is this file the learner's (a notebook cell, their module), not Python's, an installed library's or the
    course's? The escalated time bound raises only in the learner's lines: raising inside a library (say the
    ``finally`` of ``Condition.wait``) would be caught by the learner's ``except`` and remove the trace function."""
    known = _LIBRARY_FILES.get(filename)
    if known is None:
        import sysconfig

        roots = {os.path.dirname(os.path.abspath(__file__))}
        roots |= {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
        path = os.path.abspath(filename) if not filename.startswith("<") else filename
        known = _LIBRARY_FILES[filename] = filename.startswith("<frozen") or any(
            path.startswith(root + os.sep) for root in roots
        )
    return not known


def _raised_in_learner_code(exc: BaseException) -> bool:
    """Did the exception pass through the learner's code (a method of their class the checker called)?"""
    import traceback

    try:
        return any(_learner_code(frame.filename) for frame in traceback.extract_tb(exc.__traceback__))
    except Exception:  # noqa: BLE001 - a traceback that cannot be read: not the learner's, as far as we know
        return False


def _learner_place(exc: BaseException) -> str:
    """ " (in `name`, line N)" of the last learner frame the exception passed through, or ""."""
    import traceback

    try:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if _learner_code(f.filename)]
    except Exception:  # noqa: BLE001
        return ""
    return f" (in `{frames[-1].name}`, line {frames[-1].lineno})" if frames else ""


def _bounded_short(exc: BaseException, limit: int = 200) -> str:
    """An exception's message in one line, read under a short time bound: its ``__str__`` may be the learner's, and
    the check's own time bound has ended by the time a message is built."""
    try:
        with _TimeBound(MESSAGE_TIMEOUT_S):
            return _short(exc, limit)
    except BaseException:  # noqa: BLE001 - _TimedOut, or anything its __str__ raised past _safe_text
        return "its message could not be read"


MESSAGE_TIMEOUT_S = 0.5  # reading one exception's message (a learner's __str__ may loop)


class _TimeBound:
    """``with _TimeBound(seconds): ...`` raises :class:`_TimedOut` in this thread after ``seconds``, whatever the
    code inside does.

    Why this design (and not a worker thread with ``join(timeout)``): the learner's code runs in the
    caller's thread, as it would in the notebook. TensorFlow and Keras keep thread-local state that a
    check depends on: ``strategy.scope()``, gradient tapes, and Keras 3's global dtype policy (set by
    ``keras.mixed_precision.set_global_policy`` in the notebook); in a worker thread that state is
    missing, and a thread that loops forever cannot be killed anyway: it would go on burning CPU and
    memory (a ``.repeat()`` dataset grows by tens of MB/s) while the kernel looked free.

    * Main thread (Jupyter and Colab run cells there; Linux, macOS): a watchdog thread sends ``SIGALRM`` to the
      main thread itself (``signal.pthread_kill``) at the bound and every ``_REFIRE_S`` after it. The handler raises
      :class:`_TimedOut` at the next bytecode; a blocking call (``time.sleep``, ``Event.wait``, ``Queue.get``,
      ``join``, ``subprocess.run``, ``os.read``, ``accept``) is cut short, because the signal reaches the thread
      that waits and the handler is installed without ``SA_RESTART``. (A process timer would wake whichever
      thread the kernel picks — often one of TensorFlow's — and a call waiting in the main thread would never
      notice.) An outer ``SIGALRM`` timer (e.g. pytest-timeout) is left running; one that fires before the bound is
      still served.
    * Code that swallows the interrupt (``except BaseException:`` or a bare ``except:`` in a loop, nested or not)
      holds it for at most ``_ESCALATE_S``: then a trace function raises :class:`_TimedOut` at the next line of
      the learner's code that no ``try`` covers — at the latest the loop's header.
    * Elsewhere (another thread, Windows): the watchdog injects :class:`_TimedOut` with
      ``PyThreadState_SetAsyncExc``. That lands at the next bytecode too, but cannot cut a blocking call short.

    Neither can stop a single long-running C++ call: a TensorFlow op (a huge matmul, ``ds.reduce`` over
    an infinite dataset, a ``tf.function`` with an endless ``tf.while_loop``) ends only when it returns.
    Python-level iteration over a dataset is interruptible between elements, which is why checkers read
    datasets element by element (see :func:`read_dataset`).
    """

    def __init__(self, seconds: float):
        self.seconds = float(seconds)
        self._armed = False
        self._mode = None
        self._old_trace = None
        self._tracing = False

    # -- entering --------------------------------------------------------------------------------
    def __enter__(self) -> "_TimeBound":
        if not (self.seconds > 0 and math.isfinite(self.seconds)):
            return self
        self._start = time.monotonic()
        self._deadline = self._start + self.seconds
        self._owner = sys._getframe(1)  # the frame running the `with`: while the bound holds, it is on the stack
        try:
            if (
                hasattr(signal, "pthread_kill")
                and hasattr(signal, "SIGALRM")
                and threading.current_thread() is threading.main_thread()
            ):
                try:
                    self._enter_alarm()
                    return self
                except (ValueError, OSError):  # an embedded interpreter without signals: use the watchdog
                    self._mode = None
            self._enter_watchdog()
            return self
        except BaseException:
            # An outer bound's interrupt (or Ctrl-C) landed while this one was arming: `with` never reaches __exit__,
            # so disarm here, or this bound's handler and watchdog would stay and raise _TimedOut in whatever runs
            # next (a test-suite worker crashed so, between tests)
            self.__exit__(None, None, None)
            raise

    def _enter_alarm(self) -> None:
        self._old_handler = signal.getsignal(signal.SIGALRM)
        self._done, self._watchdog, self._mode = threading.Event(), None, "alarm"  # all _disarm needs, first
        self._armed = True
        signal.signal(signal.SIGALRM, self._on_alarm)  # Python installs it without SA_RESTART: calls see EINTR
        try:
            signal.siginterrupt(signal.SIGALRM, True)  # and say so, should another library have changed it
        except (AttributeError, OSError, ValueError):
            pass
        main = threading.main_thread().ident

        def fire():
            wait = self.seconds
            while not self._done.wait(wait):
                try:
                    signal.pthread_kill(main, signal.SIGALRM)
                except (OSError, ValueError):  # the main thread is gone: nothing left to bound
                    return
                wait = _REFIRE_S

        self._watchdog = threading.Thread(target=fire, name="course-check-timeout", daemon=True)
        self._watchdog.start()

    def _on_alarm(self, signum, frame):
        if not self._armed:
            return None
        if not _on_stack(self._owner, frame):  # leaked: its `with` ended without __exit__; never raise outside it
            self._armed = False
            self._done.set()
            signal.signal(signal.SIGALRM, self._old_handler if self._old_handler is not None else signal.SIG_DFL)
            return None
        now = time.monotonic()
        if now < self._deadline:  # not ours: an outer timer (pytest-timeout, the learner's own) fired
            if callable(self._old_handler):
                return self._old_handler(signum, frame)
            return None
        if now - self._deadline > _ESCALATE_S:
            self._trace_learner_frames(frame)  # (again: CPython drops a trace function once it has raised)
        raise _TimedOut(self.seconds)

    def _trace_learner_frames(self, frame) -> None:
        """From now until the bound is left, raise at every line of code outside this module that no ``try`` covers
        (a loop's header, a statement after a ``try``): a swallowed interrupt is caught by a ``try``, and the next
        uncovered line — at the latest the loop's header — raises out of it. Lines inside a ``try`` are left alone:
        CPython removes a trace function that raises, so raising where it would only be caught ends the tracing."""
        import sys

        if not self._tracing:
            self._tracing = True
            self._old_trace = sys.gettrace()
            tables: dict = {}

            def uncovered(frame_) -> bool:
                code = frame_.f_code
                if code not in tables:
                    try:
                        import dis

                        tables[code] = [(e.start, e.end) for e in dis._parse_exception_table(code)]  # 3.11+
                    except Exception:  # noqa: BLE001 - no table to read: raise on every line
                        tables[code] = []
                return not any(start <= frame_.f_lasti < end for start, end in tables[code])

            def tracer(frame_, event, arg):
                if self._armed and event == "line" and _learner_code(frame_.f_code.co_filename) and uncovered(frame_):
                    raise _TimedOut(self.seconds)
                return tracer

            self._tracer = tracer
        if sys.gettrace() is not self._tracer:
            while frame is not None:
                if frame.f_code.co_filename != __file__:
                    frame.f_trace = self._tracer
                frame = frame.f_back
            sys.settrace(self._tracer)

    def _enter_watchdog(self) -> None:
        try:
            import ctypes

            set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
        except (ImportError, AttributeError):  # not CPython: no bound rather than a wrong one
            return
        target = ctypes.c_ulong(threading.get_ident())
        self._clear = lambda: set_async_exc(target, None)
        self._done, self._watchdog, self._mode = threading.Event(), None, "watchdog"
        self._armed = True

        def watch():
            wait = self.seconds
            while not self._done.wait(wait):
                set_async_exc(target, ctypes.py_object(_TimedOut))
                wait = _REFIRE_S

        self._watchdog = threading.Thread(target=watch, name="course-check-timeout", daemon=True)
        self._watchdog.start()

    # -- leaving ---------------------------------------------------------------------------------
    def __exit__(self, *exc_info) -> None:
        # A late firing can raise _TimedOut inside this method; retry until everything is restored.
        while True:
            try:
                self._disarm()
                return None
            except _TimedOut:
                continue

    def _disarm(self) -> None:
        self._armed = False
        self._owner = None
        if self._mode is not None:
            self._done.set()
            if self._watchdog is not None and self._watchdog.ident is not None:  # (started: not when arming was cut)
                self._watchdog.join()
        if self._tracing:
            sys.settrace(self._old_trace)
            frame = sys._getframe()
            while frame is not None:
                if frame.f_trace is self._tracer:
                    frame.f_trace = None
                frame = frame.f_back
            self._tracing = False
        if self._mode == "alarm":
            signal.signal(signal.SIGALRM, self._old_handler if self._old_handler is not None else signal.SIG_DFL)
        elif self._mode == "watchdog":
            self._clear()  # drop an exception injected just before the watchdog stopped
        self._mode = None


def _on_stack(target, frame) -> bool:
    """Whether ``target`` is ``frame`` or one of its callers."""
    while frame is not None:
        if frame is target:
            return True
        frame = frame.f_back
    return False


def _timeout_message(seconds: float) -> str:
    return (
        f"your code did not finish within {seconds:g} s, the time limit of a check: an infinite loop, "
        "a long `time.sleep`, or a dataset that never ends (`.repeat()` with no count)? Fix it and run the "
        "check again. (Set `COURSE_CHECK_TIMEOUT` to change the limit.)"
    )


# ----------------------------------------------------------------------------------------------
# Helpers for checkers
# ----------------------------------------------------------------------------------------------

_COUNT_BITS = 63  # require_int: anything larger is no count, batch size or byte size of this course

DATASET_LIMIT = 10_000
"""Default bound on the elements :func:`read_dataset` reads from one learner dataset."""


def read_dataset(
    ds: Any, *, shown_as: str, limit: int = DATASET_LIMIT, what: str = "elements", on_error: str = ""
) -> list:
    """Read one pass of a learner's ``tf.data.Dataset`` into a list, bounded to ``limit`` elements.

    Raises :class:`Incorrect` when ``ds`` is not a dataset, never ends (``.repeat()``: its cardinality
    is infinite) or has more than ``limit`` elements (it reads ``ds.take(limit + 1)``, so a dataset of
    unknown length cannot run away with time or memory); an error raised while reading (the learner's
    ``map`` function, a shape mismatch in ``batch``) becomes a one-line "error" like
    :func:`call_learner`'s. ``shown_as`` names the dataset for the learner, e.g.
    ``"make_pipeline(ds, 8)"``; ``what`` names its elements (``"batches"``). Each call is a new pass (a
    new epoch: ``shuffle`` reshuffles).
    """
    import tensorflow as tf

    if not isinstance(ds, tf.data.Dataset):
        raise Incorrect(f"`{shown_as}` returned {describe(ds)}; return the tf.data.Dataset.")
    limit = int(limit)
    try:
        cardinality = int(ds.cardinality())
    except Exception:  # noqa: BLE001 - unknown: the take() below still bounds it
        cardinality = int(tf.data.UNKNOWN_CARDINALITY)
    if cardinality == int(tf.data.INFINITE_CARDINALITY):
        raise Incorrect(
            f"the dataset from `{shown_as}` never ends: it has a `.repeat()` with no count. Remove it: "
            "Keras repeats epochs for you, and the check reads one pass."
        )
    if cardinality > limit:
        raise Incorrect(
            f"the dataset from `{shown_as}` has {cardinality} {what}; one pass of the check's data has at "
            f"most {limit}. Did you `.repeat()` it or batch too small?"
        )
    elements = []
    try:
        for element in ds.take(limit + 1):
            elements.append(element)
    except Exception as exc:  # the learner's pipeline failed while running: their bug, one line
        message = f"Reading the dataset from `{shown_as}` raised {type(exc).__name__}: {_short(exc)}."
        raise error(f"{message} {on_error}".strip()) from None
    if len(elements) > limit:
        raise Incorrect(
            f"the dataset from `{shown_as}` has more than {limit} {what}; one pass of the check's data has "
            f"at most {limit}. Did you `.repeat()` it?"
        )
    return elements


def require_int(value: Any, what: str = "an int") -> int:
    """Return ``value`` as a Python int (numpy ints accepted), or raise :class:`Incorrect` naming the type."""
    import numbers

    if isinstance(value, bool) or type(value).__name__ == "bool_":
        raise Incorrect(f"Expected {what}, got {describe(value)}; True/False are not counts, write a number.")
    if isinstance(value, numbers.Integral):
        try:
            number = int(value)
        except Exception as exc:  # noqa: BLE001 - the learner's own int class: its __int__ raised
            raise Incorrect(
                f"Expected {what}, got {describe(value)}, which could not be read as a whole number "
                f"(int() raised {type(exc).__name__}); return a plain int."
            ) from None
        if number.bit_length() > _COUNT_BITS:
            raise Incorrect(f"Expected {what}, got {describe(number)}; that is far too large for this answer.")
        return number
    if isinstance(value, (str, bytes)):
        raise Incorrect(f"Expected {what}, got {describe(value)}; remove the quotes so it is a number, not text.")
    if isinstance(value, numbers.Real):
        raise Incorrect(
            f"Expected {what}, got {describe(value)}; counts and batch sizes are whole numbers "
            "(use `*` or `//`, not `/`, and no float())."
        )
    if _is_tensor(value):
        raise Incorrect(
            f"Expected {what}, got {describe(value)}; this is plain Python arithmetic, "
            "no TensorFlow ops needed (`num_replicas_in_sync` is already a Python int)."
        )
    raise Incorrect(f"Expected {what}, got {describe(value)}.")


def require_number(value: Any, what: str = "a number") -> float:
    """Return ``value`` as a Python float, or raise :class:`Incorrect` naming what came instead.

    Accepts Python and numpy real numbers and 0-d numeric tensors/arrays; rejects True/False, text
    (``"1"``, ``b"1"``), non-scalar arrays/tensors, ints too large for a float, and any other object,
    without calling anything on it that a learner's class could make raise.
    """
    import numbers

    if isinstance(value, bool) or type(value).__name__ == "bool_":
        raise Incorrect(f"Expected {what}, got {describe(value)}; True/False are not numbers, write a number.")
    if isinstance(value, (str, bytes)):
        raise Incorrect(f"Expected {what}, got {describe(value)}; remove the quotes so it is a number, not text.")
    if isinstance(value, numbers.Real):
        try:
            return float(value)
        except OverflowError:
            raise Incorrect(f"Expected {what}, got {describe(value)}; that is far too large for this answer.") from None
        except Exception as exc:  # noqa: BLE001 - the learner's own number class: its __float__ raised
            raise Incorrect(
                f"Expected {what}, got {describe(value)}, which could not be read as a number "
                f"(float() raised {type(exc).__name__}); return a plain int or float."
            ) from None
    if _is_tensor(value) or (
        _module_of(value) in ("numpy", "ml_dtypes") and isinstance(getattr(value, "ndim", None), int)
    ):
        try:
            shape = tuple(value.shape)
        except Exception:  # noqa: BLE001
            shape = None
        if shape != ():
            raise Incorrect(f"Expected {what} (a single number), got {describe(value)}.")
        try:
            import numpy as np

            readable = value
            if _is_tensor(value) and type(value).__name__ == "EagerTensor":
                readable = value.numpy()  # np.asarray cannot read a bfloat16 EagerTensor; .numpy() gives ml_dtypes
            array = np.asarray(readable)
            if array.dtype.kind not in "iuf" and array.dtype.name != "bfloat16":
                raise TypeError(array.dtype)
            return float(array.astype(np.float64))  # bfloat16 (ml_dtypes) has no direct float()
        except Exception:  # noqa: BLE001 - a string tensor, an object array
            raise Incorrect(f"Expected {what}, got {describe(value)}.") from None
    raise Incorrect(f"Expected {what}, got {describe(value)}.")


def require_callable(value: Any, call: str, arity: int) -> Callable:
    """Check that the learner passed a function that can be called with ``arity`` positional args.

    ``call`` is how the checker will call it, e.g. ``"global_batch_size(per_replica_batch, strategy)"``.
    """
    name = call.split("(")[0]
    if not callable(value):
        if isinstance(value, (int, float)) or _is_tensor(value) or _module_of(value) == "numpy":
            raise Incorrect(
                f"Expected the function `{name}`, got {describe(value)} (a result). "
                f"Pass the function itself: `check({name})`, not `check({call})`."
            )
        raise Incorrect(
            f"Expected the function `{name}`, got {describe(value)}; pass the function itself: `check({name})`."
        )
    if isinstance(value, type):
        raise Incorrect(
            f"Expected the function `{name}`, got the class `{_short(value.__name__, 60)}`; "
            f"define `def {call}:` and pass it: `check({name})`."
        )
    try:
        signature = inspect.signature(value)
    except Exception:  # noqa: BLE001 - builtins and some C callables have no signature: just try it
        return value
    try:
        signature.bind(*([None] * arity))
    except TypeError:
        params = _short(", ".join(signature.parameters), 120)  # names only: defaults may not print
        raise Incorrect(
            f"Your function's parameters are ({params}), but check calls it as `{call}`; "
            f"define it with exactly {arity} parameter{'s' if arity != 1 else ''}."
        ) from None
    return value


def call_learner(fn: Callable, *args: Any, shown_as: str, on_error: str = "") -> Any:
    """Call learner code; turn stubs into "unanswered" and exceptions into a one-line "error".

    ``shown_as`` is how the call is described to the learner (``"make_model(strategy)"``);
    ``on_error`` says what to check when their code raises. ``sys.exit()``/``exit()`` and a
    ``KeyboardInterrupt`` in the learner's code are reported too, not passed on; only the check's time
    bound (see :data:`CHECK_TIMEOUT_S`) goes through, to end the whole check.
    """
    try:
        result = fn(*args)
    except NotImplementedError:
        raise _unanswered("your function still raises NotImplementedError; replace that line with your code.") from None
    except _TimedOut:
        raise
    except SystemExit as exc:
        raise error(
            f"Your code called `exit()`/`sys.exit()` (SystemExit: {_short(exc.code, 60)}) when called as "
            f"`{shown_as}`; a function that is checked must return its result, not end the program."
        ) from None
    except KeyboardInterrupt:
        raise error(
            f"Your code was interrupted (KeyboardInterrupt) while running `{shown_as}`; "
            "run the check again when it is ready."
        ) from None
    except BaseException as exc:  # the learner's bug: report it in one line, no traceback
        message = f"Your code raised {type(exc).__name__}: {_short(exc)} when called as `{shown_as}`."
        raise error(f"{message} {on_error}".strip()) from None
    if result is None:
        raise _unanswered(
            "your function returned None — did you forget `return`? "
            "(Not started yet? Replace the `...` in the function body with your code.)"
        )
    if result is ...:
        raise _unanswered("your function returned `...`; replace the `...` with your code.")
    return result


# ----------------------------------------------------------------------------------------------
# Exercises and banks
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Exercise:
    """One exercise: how to check it, hints and the solution (its reference and wrong answers, test data, are in the
    course's tests: tests/exercise_answers).

    checker:        ``checker(answer, **context) -> str``: returns the success message, raises
                    :class:`Incorrect` (or lets :func:`call_learner` raise) otherwise.
    answer_name:    the name the learner's cell defines (``answer``, ``make_model``); used in call
                    hints and by the tests to run ``stub`` and ``solution_code``.
    needs:          context keywords ``check`` must receive, e.g. ``("strategy",)``.
    stub:           the learner's starting code (without the check line), as in the notebook.
    """

    name: str
    question: str
    checker: Callable[..., str]
    answer_name: str
    hints: Sequence[str]
    solution_code: str
    stub: str
    needs: tuple[str, ...] = ()
    # seconds this exercise's checker needs beyond the usual bound, from its context (an exercise that trains
    # for a budget); the check's bound is then the larger of the two
    min_time_s: Callable[[dict], float] | None = None
    _hints_shown: int = dataclasses.field(default=0, repr=False, compare=False)

    @property
    def call_hint(self) -> str:
        """How a notebook calls ``check`` for this exercise."""
        context = "".join(f", {key}={key}" for key in self.needs)
        return f"ex.{self.name}.check({self.answer_name}{context})"

    def check(self, answer: Any = ..., /, *args: Any, **context: Any) -> CheckResult:
        """Check ``answer``; never raises, never prints, never hangs. Show the result as a cell's last expression.

        Context may be passed by keyword (``check(make_model, strategy=strategy)``) or positionally in
        the order of ``needs`` (``check(make_model, strategy)``); the answer may be passed by keyword
        too (``check(answer=1)``). The whole check is bounded by :func:`check_timeout_s` seconds.
        """
        seconds = 0.0
        try:
            answer, context = self._arguments(answer, args, context)
            if answer is ...:
                raise _unanswered("replace the `...` with your answer, then run this cell again.")
            if answer is None:
                raise _unanswered(f"`{self.answer_name}` is None; replace it with your answer.")
            self._require_context(context)
            seconds = check_timeout_s()
            if seconds and self.min_time_s is not None:
                seconds = max(seconds, float(self.min_time_s(context)))
            with _TimeBound(seconds):
                message = self.checker(answer, **context)
            return CheckResult("correct", message)
        except _Verdict as verdict:
            return verdict.result
        except _TimedOut:
            return CheckResult("error", _timeout_message(seconds))
        except KeyboardInterrupt:  # Ctrl-C lands in whatever frame runs, the learner's too: never "your code raised"
            return CheckResult("error", "the check was interrupted (KeyboardInterrupt); run it again.")
        except Exception as exc:  # a bug in the checker itself must not look like the learner's
            if _raised_in_learner_code(exc):  # the checker used the learner's object (a method of their class)
                return CheckResult(
                    "incorrect",
                    f"Your code raised {type(exc).__name__} ({_bounded_short(exc)}) while the checker used your "
                    f"answer{_learner_place(exc)}. Return plain values (numbers, text, lists, dicts), not objects "
                    "of your own classes.",
                )
            return CheckResult(
                "error",
                f"the checker itself failed ({type(exc).__name__}: {_bounded_short(exc)}); this is a course bug, "
                "please report it. Compare your code with `solution()` meanwhile.",
            )
        except BaseException as exc:  # noqa: BLE001 - SystemExit & co. from learner code reached via the checker
            return CheckResult(
                "error",
                f"the check was stopped by {type(exc).__name__} ({_bounded_short(exc, 80)}), raised while it ran "
                "your code; does your code call `exit()` or `sys.exit()`? A checked function must return its result.",
            )

    def _arguments(self, answer: Any, args: tuple, context: dict) -> tuple[Any, dict]:
        """Normalise how ``check`` was called into ``(answer, context)``, or raise an "error" verdict."""
        context = dict(context)
        for key in dict.fromkeys((self.answer_name, "answer")):  # check(answer=1), check(make_model=...)
            if key in context and key not in self.needs:
                value = context.pop(key)
                if answer is not ...:
                    raise error(
                        f"check() got your answer twice (positionally and as `{key}=`); pass it once: "
                        f"`{self.call_hint}`."
                    )
                answer = value
        if args:
            if len(args) > len(self.needs):
                takes = (
                    "only your answer"
                    if not self.needs
                    else ("your answer and " + ", ".join(f"`{k}`" for k in self.needs))
                )
                raise error(f"check() takes {takes}, but got {1 + len(args)} values. Call it as `{self.call_hint}`.")
            for key, value in zip(self.needs, args):
                if key in context:
                    raise error(f"check() got `{key}` twice; pass it once: `{self.call_hint}`.")
                context[key] = value
        return answer, context

    def _require_context(self, context: dict) -> None:
        missing = [key for key in self.needs if context.get(key) is None]
        unknown = [key for key in context if key not in self.needs]
        if missing or unknown:
            problems = []
            if missing:
                needed = ", ".join(f"`{k}=`" for k in missing)
                problems.append(f"check() needs {needed} to test your code")
            if unknown:
                shown = ", ".join(f"`{_short(k, 40)}=`" for k in unknown[:5])
                problems.append(f"check() does not take {shown}")
            raise error("; ".join(problems) + f". Call it as `{self.call_hint}`.")

    def hint(self) -> None:
        """Print the next hint: hint 1, then hint 2, …; after the last one it repeats it."""
        if not self.hints:
            print(f"No hints for this exercise. `ex.{self.name}.solution()` shows the answer.")
            return
        index = min(self._hints_shown, len(self.hints) - 1)
        self._hints_shown += 1
        print(f"Hint {index + 1} of {len(self.hints)}: {self.hints[index]}")
        if self._hints_shown >= len(self.hints):
            if self._hints_shown > len(self.hints):
                print("No more hints; that was the last one.", end=" ")
            print(f"Still stuck? `ex.{self.name}.solution()` shows the answer.")

    def solution(self) -> None:
        """Print the reference solution as code you can paste into a cell."""
        print(self.solution_code.strip("\n"))

    def __repr__(self) -> str:
        return f"Exercise {self.name!r}: {self.question}\n  check with: {self.call_hint}"


class ExerciseBank:
    """The exercises of one lesson, as attributes: ``ex.replicas_on_v5e``."""

    def __init__(self, name: str, exercises: Sequence[Exercise]):
        names = [e.name for e in exercises]
        bad = [n for n in names if not n.isidentifier()]
        if bad or len(set(names)) != len(names):
            raise ValueError(f"exercise names must be unique Python identifiers, got {names}")
        self._name = name
        self._exercises = {e.name: e for e in exercises}

    @property
    def name(self) -> str:
        return self._name

    def __getattr__(self, item: str) -> Exercise:
        exercises = self.__dict__.get("_exercises", {})
        if item in exercises:
            return exercises[item]
        if item.startswith("__"):
            raise AttributeError(item)
        raise AttributeError(
            f"bank {self.__dict__.get('_name')!r} has no exercise {item!r}; it has: {', '.join(exercises)}"
        )

    def __dir__(self):
        return [*super().__dir__(), *self._exercises]

    def __iter__(self) -> Iterator[Exercise]:
        return iter(self._exercises.values())

    def __len__(self) -> int:
        return len(self._exercises)

    def __repr__(self) -> str:
        lines = [f"Exercises {self._name!r}:"]
        lines += [f"  ex.{e.name}: {e.question}" for e in self]
        return "\n".join(lines)


class UnknownBankError(KeyError, ValueError):
    """``load()`` got something that is not a lesson or its exercises; the message says what to pass."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def load(lesson) -> ExerciseBank:
    """One lesson's exercises, with fresh hint counters: ``ex = exercises.load(tpu_initialization)``, where
    ``tpu_initialization`` is the lesson's package (``from course_utils.lessons import tpu_initialization``), its
    ``exercises`` module, or an :class:`ExerciseBank`."""
    bank = getattr(lesson, "exercises", lesson)  # a lesson's package -> its exercises module
    bank = getattr(bank, "EXERCISES", bank)  # -> its bank
    if isinstance(bank, ExerciseBank):
        return ExerciseBank(bank.name, [copy.copy(e) for e in bank])
    raise UnknownBankError(
        f"exercises.load() takes a lesson, not {describe(lesson)}: "
        "from course_utils.lessons import tpu_initialization; ex = exercises.load(tpu_initialization)"
    )
