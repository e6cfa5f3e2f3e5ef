"""Exercises for the course notebooks: ``check()``, ``hint()`` and ``solution()``, no grader needed.

How a lesson uses it (the setup cell already imported ``course_utils``)::

    from course_utils import exercises
    ex = exercises.load("tpu_initialization")      # one bank per lesson

    answer = ...                                     # the learner replaces the ...
    ex.replicas_on_v5e.check(answer)                 # last expression: shows "✅ Correct — ..."

    ex.replicas_on_v5e.hint()                        # prints hint 1, then hint 2, ...
    ex.replicas_on_v5e.solution()                    # prints the reference solution as code

``check()`` never raises and never prints: it returns a :class:`CheckResult` whose status is
``"correct"``, ``"incorrect"``, ``"unanswered"`` (an untouched stub: ``...``, ``None``, a function
that returns ``None``/``...`` or raises ``NotImplementedError``) or ``"error"`` (the learner's code
raised, or ``check`` was called without the context it needs). Exercises that need objects from
the notebook declare them in ``needs`` and receive them by keyword:
``ex.build_in_scope.check(make_model, strategy=strategy)``.

Hints and solutions live here, not in the notebook, so a learner sees them only on request.

Adding a bank for a new lesson: write one checker per exercise (``checker(answer, **context)``
returns the success message, or raises :class:`Incorrect` with a one- or two-sentence message that
names what was expected, what was got, and the idea to revisit), wrap each in :class:`Exercise`
with its hints, solution, stub, a ``reference`` and some ``wrong_examples``, and call
:func:`register_bank` at the bottom of a new module in ``course_utils/exercise_banks/`` (one per lesson). ``tests/test_exercises.py`` then checks every
bank automatically: the reference passes, each wrong example fails with its expected message, every
stub counts as unanswered, and each printed solution, executed, passes.
Helpers for checkers: :func:`call_learner` (runs learner code and turns stubs and crashes into the
right result), :func:`require_callable`, :func:`require_int`, :func:`describe`.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import re
from typing import Any, Callable, Iterator, Sequence

__all__ = [
    "CheckResult",
    "Exercise",
    "ExerciseBank",
    "Incorrect",
    "UnknownBankError",
    "available_banks",
    "call_learner",
    "describe",
    "load",
    "register_bank",
    "require_callable",
    "require_int",
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
    """What ``check()`` returns. Shown as one line, e.g. ``✅ Correct — v5e-1 is one chip…``."""

    status: str  # "correct" | "incorrect" | "unanswered" | "error"
    message: str

    def __post_init__(self):
        if self.status not in _PREFIX:
            raise ValueError(f"status must be one of {sorted(_PREFIX)}, got {self.status!r}")

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


def _error(message: str) -> _Verdict:
    return _Verdict("error", message)


# ----------------------------------------------------------------------------------------------
# Helpers for checkers
# ----------------------------------------------------------------------------------------------


def _short(text: str, limit: int = 200) -> str:
    text = re.sub(r"\s+", " ", str(text)).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _is_tensor(value: Any) -> bool:
    return (
        type(value).__module__.startswith("tensorflow")
        and hasattr(value, "dtype")
        and hasattr(value, "shape")
    )


def describe(value: Any) -> str:
    """A short, learner-readable description of a value: ``str '1'``, ``float 64.0``, ``tf.Tensor …``."""
    if value is None or value is ...:
        return repr(value)
    if _is_tensor(value):
        dtype = getattr(value.dtype, "name", value.dtype)
        return f"tf.Tensor (shape {tuple(value.shape)}, dtype {dtype})"
    module = type(value).__module__
    if module == "numpy":
        if hasattr(value, "ndim") and value.ndim > 0:
            return f"numpy array (shape {value.shape}, dtype {value.dtype})"
        return f"numpy.{type(value).__name__} {_short(repr(value.item()), 60)}"
    if inspect.isfunction(value) or inspect.ismethod(value):
        return f"function {value.__name__}"
    if isinstance(value, (str, bool, int, float, list, tuple, dict, set)):
        return f"{type(value).__name__} {_short(repr(value), 60)}"
    return f"an object of type {type(value).__name__}"


def require_int(value: Any, what: str = "an int") -> int:
    """Return ``value`` as a Python int (numpy ints accepted), or raise :class:`Incorrect` naming the type."""
    import numbers

    if isinstance(value, bool) or type(value).__name__ == "bool_":
        raise Incorrect(f"Expected {what}, got {describe(value)}; True/False are not counts, write a number.")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, str):
        raise Incorrect(
            f"Expected {what}, got {describe(value)}; remove the quotes so it is a number, not text."
        )
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


def require_callable(value: Any, call: str, arity: int) -> Callable:
    """Check that the learner passed a function that can be called with ``arity`` positional args.

    ``call`` is how the checker will call it, e.g. ``"global_batch_size(per_replica_batch, strategy)"``.
    """
    name = call.split("(")[0]
    if not callable(value):
        if isinstance(value, (int, float)) or _is_tensor(value) or type(value).__module__ == "numpy":
            raise Incorrect(
                f"Expected the function `{name}`, got {describe(value)} (a result). "
                f"Pass the function itself: `check({name})`, not `check({call})`."
            )
        raise Incorrect(
            f"Expected the function `{name}`, got {describe(value)}; "
            f"pass the function itself: `check({name})`."
        )
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):  # builtins and some C callables have no signature: just try it
        return value
    try:
        signature.bind(*([None] * arity))
    except TypeError:
        raise Incorrect(
            f"Your function's parameters are {signature}, but check calls it as `{call}`; "
            f"define it with exactly {arity} parameter{'s' if arity != 1 else ''}."
        ) from None
    return value


def call_learner(fn: Callable, *args: Any, shown_as: str, on_error: str = "") -> Any:
    """Call learner code; turn stubs into "unanswered" and exceptions into a one-line "error".

    ``shown_as`` is how the call is described to the learner (``"make_model(strategy)"``);
    ``on_error`` says what to check when their code raises.
    """
    try:
        result = fn(*args)
    except NotImplementedError:
        raise _unanswered(
            "your function still raises NotImplementedError; replace that line with your code."
        ) from None
    except Exception as exc:  # the learner's bug: report it in one line, no traceback
        message = f"Your code raised {type(exc).__name__}: {_short(exc)} when called as `{shown_as}`."
        raise _error(f"{message} {on_error}".strip()) from None
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
    """One exercise: how to check it, hints, the solution, and test data for the course's own tests.

    checker:        ``checker(answer, **context) -> str``: returns the success message, raises
                    :class:`Incorrect` (or lets :func:`call_learner` raise) otherwise.
    answer_name:    the name the learner's cell defines (``answer``, ``make_model``); used in call
                    hints and by the tests to run ``stub`` and ``solution_code``.
    needs:          context keywords ``check`` must receive, e.g. ``("strategy",)``.
    stub:           the learner's starting code (without the check line), as in the notebook.
    reference:      zero-arg callable returning a correct answer (tests).
    wrong_examples: ``(label, zero-arg callable returning a typical wrong answer, expected
                    substring of the message)`` (tests).
    """

    name: str
    question: str
    checker: Callable[..., str]
    answer_name: str
    hints: Sequence[str]
    solution_code: str
    stub: str
    reference: Callable[[], Any]
    wrong_examples: Sequence[tuple[str, Callable[[], Any], str]] = ()
    needs: tuple[str, ...] = ()
    _hints_shown: int = dataclasses.field(default=0, repr=False, compare=False)

    @property
    def call_hint(self) -> str:
        """How a notebook calls ``check`` for this exercise."""
        context = "".join(f", {key}={key}" for key in self.needs)
        return f"ex.{self.name}.check({self.answer_name}{context})"

    def check(self, answer: Any = ..., /, **context: Any) -> CheckResult:
        """Check ``answer``; never raises, never prints. Show the result as a cell's last expression."""
        try:
            if answer is ...:
                raise _unanswered("replace the `...` with your answer, then run this cell again.")
            if answer is None:
                raise _unanswered(f"`{self.answer_name}` is None; replace it with your answer.")
            missing = [key for key in self.needs if context.get(key) is None]
            unknown = [key for key in context if key not in self.needs]
            if missing or unknown:
                problems = []
                if missing:
                    needed = ", ".join(f"`{k}=`" for k in missing)
                    problems.append(f"check() needs {needed} to test your code")
                if unknown:
                    problems.append("check() does not take " + ", ".join(f"`{k}=`" for k in unknown))
                raise _error("; ".join(problems) + f". Call it as `{self.call_hint}`.")
            return CheckResult("correct", self.checker(answer, **context))
        except _Verdict as verdict:
            return verdict.result
        except Exception as exc:  # a bug in the checker itself must not look like the learner's
            return CheckResult(
                "error",
                f"the checker itself failed ({type(exc).__name__}: {_short(exc)}); this is a course bug, "
                "please report it. Compare your code with `solution()` meanwhile.",
            )

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
        self._name = name
        self._exercises = {e.name: e for e in exercises}

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
    """``load()`` got a bank name that is not registered; the message lists the registered ones."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


_BANKS: dict[str, list[Exercise]] = {}


def register_bank(name: str, exercises: Sequence[Exercise], *, replace: bool = False) -> None:
    """Register a lesson's exercises under ``name`` (what the notebook passes to :func:`load`)."""
    if name in _BANKS and not replace:
        raise ValueError(
            f"an exercise bank named {name!r} is already registered (pass replace=True to replace it)"
        )
    names = [e.name for e in exercises]
    bad = [n for n in names if not n.isidentifier()]
    if bad or len(set(names)) != len(names):
        raise ValueError(f"exercise names must be unique Python identifiers, got {names}")
    _BANKS[name] = list(exercises)


def _import_banks() -> None:
    """Banks live one per lesson in ``course_utils/exercise_banks/``; importing one registers it."""
    import importlib
    import pkgutil

    from . import exercise_banks

    for info in pkgutil.iter_modules(exercise_banks.__path__):
        importlib.import_module(f"{exercise_banks.__name__}.{info.name}")


def available_banks() -> list[str]:
    _import_banks()
    return sorted(_BANKS)


def load(name: str) -> ExerciseBank:
    """One lesson's exercises, with fresh hint counters: ``ex = exercises.load("tpu_initialization")``."""
    _import_banks()
    if name not in _BANKS:
        raise UnknownBankError(
            f"no exercise bank named {name!r}; available banks: {', '.join(available_banks()) or '(none)'}"
        )
    return ExerciseBank(name, [copy.copy(e) for e in _BANKS[name]])
