"""Show code that fails on purpose, without stopping "Run all".

Colab's *Run all* stops at the first cell that raises, whatever the cell's tags (JupyterLab and nbval honour a
``raises-exception`` tag; Colab does not). A lesson that shows a popular but wrong snippet therefore runs it inside
:func:`expect_failure`::

    with expect_failure(KeyError):
        tpu_address = "grpc://" + os.environ["COLAB_TPU_ADDR"]

The learner still sees the real error — its type, its message and the line that raised it, in their cell and, when
that is elsewhere, in the library — and the notebook goes on. The check is strict, so a demo cannot rot silently: the
cell fails when nothing is raised (the snippet works now: the lesson is out of date) or when another exception is
(the cell fails for another reason than the one the text explains).
"""

from __future__ import annotations

import linecache
import os
import sys
import traceback
from types import TracebackType

MAX_MESSAGE_LINES = 6  # TensorFlow's messages can run to pages (graph dumps): the head says what went wrong
MAX_MESSAGE_CHARS = 700


class DemoDidNotFail(AssertionError):
    """The snippet that should fail ran without error, or failed with another exception than the lesson says."""


def short_path(path: str) -> str:
    """A file path as a learner can read it anywhere: ``keras/src/layers/layer.py``, not a venv's full path."""
    parts = path.replace("\\", "/").split("/")
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(marker) :])
    if "course_utils" in parts:
        return "/".join(parts[parts.index("course_utils") :])
    for i, part in enumerate(parts[:-1]):  # the standard library: lib/python3.11/json/decoder.py -> json/decoder.py
        if part.startswith("python3") and i and parts[i - 1] == "lib":
            return "/".join(parts[i + 1 :])
    return os.path.basename(path)


def _message(exc: BaseException) -> str:
    try:
        text = str(exc).strip() or "(no message)"
    except Exception as err:  # noqa: BLE001 - an exception whose __str__ raises: say so, do not raise with it
        text = f"(its message could not be read: {type(err).__name__} in its __str__)"
    lines = text.splitlines()
    head = "\n".join(lines[:MAX_MESSAGE_LINES])
    if len(head) > MAX_MESSAGE_CHARS:
        head = head[:MAX_MESSAGE_CHARS].rstrip() + " …"
    if len(lines) > MAX_MESSAGE_LINES:
        head += f"\n… ({len(lines) - MAX_MESSAGE_LINES} more lines)"
    return head


def _type_name(exc_type: type) -> str:
    module = exc_type.__module__
    if module == "builtins":
        return exc_type.__qualname__
    if module.startswith("tensorflow."):  # tf.errors.InvalidArgumentError, not errors_impl's
        return f"tf.errors.{exc_type.__qualname__}" if "errors_impl" in module else exc_type.__qualname__
    return exc_type.__qualname__


def _names(types: tuple[type, ...]) -> str:
    return " or ".join(_type_name(t) for t in types)


class expect_failure:  # noqa: N801 — used as a statement, like contextlib's suppress
    """Run a ``with`` block that must raise one of ``exceptions``; print the error and carry on.

    ``when``: whether this runtime is expected to fail. Pass a condition when the snippet fails only in some shapes
    (e.g. ``when=replicas > 1``); where it is False, the block must run without error and says so.
    """

    def __init__(self, *exceptions: type[BaseException], when: bool = True):
        if not exceptions or not all(isinstance(e, type) and issubclass(e, BaseException) for e in exceptions):
            raise TypeError("expect_failure(...) takes one or more exception classes, e.g. expect_failure(KeyError)")
        never = [e for e in exceptions if not issubclass(e, Exception)]
        if (
            never
        ):  # it lets these through (a learner's Ctrl-C, sys.exit must stop the cell): expecting one would stop it
            raise TypeError(
                f"expect_failure cannot catch {_names(tuple(never))}: it lets SystemExit, KeyboardInterrupt "
                "and the like through, so that they stop the cell; expect an Exception subclass"
            )
        self.exceptions = exceptions
        self.when = bool(when)
        self.error: BaseException | None = None  # what was raised, for a later cell or a test to look at
        self._cell_file: str | None = None

    def __enter__(self) -> expect_failure:
        self._cell_file = sys._getframe(1).f_code.co_filename  # the notebook cell (or script) the block is in
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        if exc is None:
            if not self.when:
                print(f"Ran without error, as expected here (it raises {_names(self.exceptions)} elsewhere).")
                return False
            raise DemoDidNotFail(
                f"expected {_names(self.exceptions)}, but the code ran without error: what this "
                "cell demonstrates no longer fails here (a new library version?)"
            )
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            return False  # never swallow a learner's interrupt
        if not self.when or not isinstance(exc, self.exceptions):
            expected = "no error here" if not self.when else _names(self.exceptions)
            raise DemoDidNotFail(f"expected {expected}, got {_type_name(type(exc))}: {_message(exc)}") from exc
        self.error = exc
        print(self.describe(exc, tb))
        return True  # handled: the notebook goes on

    def describe(self, exc: BaseException, tb: TracebackType | None) -> str:
        """The lines printed for an expected failure: type and message, the cell's line, the library's line."""
        frames = traceback.extract_tb(tb)
        lines = [f"✋ Failed as expected — {_type_name(type(exc))}: {_message(exc)}"]
        mine = [f for f in frames if f.filename == self._cell_file]
        if mine:
            f = mine[-1]
            code = (f.line or linecache.getline(f.filename, f.lineno)).strip()
            lines.append(f"   raised by this cell's line {f.lineno}: {code}")
        if frames and (not mine or frames[-1] is not mine[-1]):
            f = frames[-1]
            lines.append(f"   inside {short_path(f.filename)}, line {f.lineno}, in {f.name}")
        return "\n".join(lines)


def show_code(*functions):
    """The source of ``functions`` (or a program's text, given as a string) as highlighted code in a notebook (plain text elsewhere): a lesson shows the code
    it teaches this way and then calls it, so the learner reads the very lines that ``prove`` runs for the report
    card — one copy, in ``course_utils.lessons``, never a second one typed into the notebook."""
    import inspect

    source = "\n\n\n".join((fn if isinstance(fn, str) else inspect.getsource(fn)).strip("\n") for fn in functions)
    try:
        from IPython.display import Code
    except ImportError:  # no IPython: the text itself
        return source
    return Code(source, language="python")
