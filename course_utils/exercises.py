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
:func:`register_bank` at the bottom of this module. ``tests/test_exercises.py`` then checks every
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


def available_banks() -> list[str]:
    return sorted(_BANKS)


def load(name: str) -> ExerciseBank:
    """One lesson's exercises, with fresh hint counters: ``ex = exercises.load("tpu_initialization")``."""
    if name not in _BANKS:
        raise UnknownBankError(
            f"no exercise bank named {name!r}; available banks: {', '.join(available_banks()) or '(none)'}"
        )
    return ExerciseBank(name, [copy.copy(e) for e in _BANKS[name]])


# ----------------------------------------------------------------------------------------------
# Bank "tpu_initialization" (lesson: TPU initialization and distribution strategies)
# ----------------------------------------------------------------------------------------------


def _check_replicas_on_v5e(answer: Any) -> str:
    n = require_int(answer, "an int (a number of replicas)")
    if n == 8:
        raise Incorrect(
            "8 is what the retired v2-8 runtime reported (4 chips × 2 TensorCores = 8 replicas); "
            "v5e-1 is one chip with one TensorCore, and TPUStrategy makes one replica per TensorCore."
        )
    if n != 1:
        raise Incorrect(
            f"{n} is not it: v5e-1 has a single chip with a single TensorCore, and TPUStrategy makes one "
            "replica per TensorCore. (If your current runtime reports a different number: "
            "the question is about v5e-1.)"
        )
    return (
        "v5e-1 is one chip with one TensorCore, so `strategy.num_replicas_in_sync == 1`. "
        "Code that reads it instead of assuming 8 runs unchanged on any TPU, GPU or CPU."
    )


class _FakeStrategy:
    """Stands in for a strategy with ``n`` replicas when checking ``global_batch_size``."""

    def __init__(self, n: int):
        self.num_replicas_in_sync = n

    def __getattr__(self, item: str):
        raise AttributeError(
            f"the test strategy only has `num_replicas_in_sync` (you asked for `{item}`); "
            "the global batch size needs nothing else"
        )

    def __repr__(self) -> str:
        return f"<strategy with {self.num_replicas_in_sync} replicas>"


# (per-replica batch, replicas): the first case is the one quoted in messages.
_BATCH_CASES = ((64, 4), (128, 8), (64, 1), (128, 1), (128, 4), (64, 8))


def _check_global_batch_size(answer: Any) -> str:
    fn = require_callable(answer, "global_batch_size(per_replica_batch, strategy)", arity=2)
    got = {}
    for per, n in _BATCH_CASES:
        got[per, n] = call_learner(
            fn,
            per,
            _FakeStrategy(n),
            shown_as=f"global_batch_size({per}, <strategy with {n} replicas>)",
            on_error="Check that you read `strategy.num_replicas_in_sync` (an attribute, not a method call).",
        )
    import numbers

    def is_number(v):
        return isinstance(v, numbers.Real) and not isinstance(v, bool)

    def show(v):  # numbers as themselves, anything else with its type
        return repr(v) if is_number(v) else describe(v)

    wrong = [(per, n, v) for (per, n), v in got.items() if not (is_number(v) and v == per * n)]
    per0, n0, value0 = wrong[0] if wrong else (0, 0, None)
    quote = (
        f"for {n0} replicas and per-replica batch {per0} you returned {show(value0)}, expected {per0 * n0}"
    )

    values = got.values()
    if wrong and all(is_number(v) for v in values):
        if all(v == per for (per, n), v in got.items()):
            raise Incorrect(
                f"your function ignores the number of replicas: {quote}. Each replica gets its own "
                "per-replica batch, so multiply by the `strategy` argument's `num_replicas_in_sync`."
            )
        if all(v == per * 8 for (per, n), v in got.items()):
            raise Incorrect(
                f"your function assumes 8 replicas (the retired v2-8): {quote}. "
                "Use `strategy.num_replicas_in_sync`; on Colab's v5e-1 it is 1."
            )
        if all(v in (per // n, per / n) for (per, n), v in got.items()):
            raise Incorrect(
                f"you divided: {quote}. Each replica processes a full per-replica batch, "
                "so per-replica × replicas = global."
            )
        factors = {v / per for (per, n), v in got.items()}
        if len(factors) == 1:
            raise Incorrect(
                f"your function always multiplies by {factors.pop():g}: {quote}. Use the `strategy` "
                "argument's `num_replicas_in_sync`, not a fixed number or the notebook's own `strategy`."
            )
    for (per, n), value in got.items():
        if require_int(value, "an int (the global batch size)") != per * n:
            raise Incorrect(
                f"for {n} replicas and per-replica batch {per} you returned {show(value)}, "
                f"expected {per * n}. Global batch = per-replica batch × `strategy.num_replicas_in_sync`."
            )
    return (
        "global batch = per-replica batch × `strategy.num_replicas_in_sync`. "
        "This global size is what you pass to `dataset.batch()` before `experimental_distribute_dataset`."
    )


def _check_build_in_scope(answer: Any, strategy: Any) -> str:
    if not (hasattr(strategy, "scope") and hasattr(strategy, "extended")):
        raise _error(
            f"`strategy=` must be the tf.distribute strategy from the setup cell, got {describe(strategy)}. "
            "Call it as `ex.build_in_scope.check(make_model, strategy=strategy)`."
        )
    import keras

    if isinstance(answer, keras.Model):
        raise Incorrect(
            "you passed a model, not the function: pass `make_model` itself, "
            "check calls `make_model(strategy)` so it can see where the model is built."
        )
    fn = require_callable(answer, "make_model(strategy)", arity=1)
    model = call_learner(
        fn,
        strategy,
        shown_as="make_model(strategy)",
        on_error="Check the model definition and that `compile()` gets an optimizer and a loss.",
    )
    if not isinstance(model, keras.Model):
        raise Incorrect(
            f"Expected `make_model` to return a keras.Model, got {describe(model)}; "
            "`return model` at the end."
        )
    weights = list(model.weights)
    if not weights:
        raise Incorrect(
            "your model has no weights yet, so nothing was created in the scope; give it an input shape "
            "(start with `keras.Input(shape=(32, 32, 3))`) so its weights are created inside "
            "`strategy.scope()`."
        )
    optimizer = getattr(model, "optimizer", None)  # Keras 3: no attribute at all before compile()
    if optimizer is None:
        raise Incorrect(
            "the model is not compiled: call `model.compile(optimizer='adam', loss=...)` "
            "inside the `with strategy.scope():` block, before returning the model."
        )
    outside = [w for w in weights if not strategy.extended.variable_created_in_scope(getattr(w, "value", w))]
    if outside:
        raise Incorrect(
            f"the model was built outside `strategy.scope()`: {len(outside)} of {len(weights)} weights "
            f"(e.g. `{outside[0].path}`) do not belong to this strategy: with one replica the model silently "
            "ignores the strategy, with several `fit` fails. Create the model inside `with strategy.scope():`, "
            "using the `strategy` passed to `make_model`."
        )
    if not _optimizer_in_scope(optimizer, strategy):
        raise Incorrect(
            "the optimizer was created outside the scope (an optimizer object made before the `with` block, "
            "or `compile()` called after it); once it creates its state (Adam's moments, momentum) `fit` fails "
            "with 'Mixing different tf.distribute.Strategy objects'. Create it inside the scope, or pass a "
            "string like `optimizer='adam'` to `compile()` "
            "inside the scope."
        )
    return (
        "every weight and the optimizer were created inside `strategy.scope()`, "
        "so `fit` can mirror the variables and update them on every replica."
    )


def _optimizer_in_scope(optimizer: Any, strategy: Any) -> bool:
    """Whether the optimizer (and a wrapped inner one, e.g. LossScaleOptimizer) belongs to ``strategy``.

    Keras 3's TensorFlow optimizer records ``tf.distribute.get_strategy()`` at construction in
    ``_distribution_strategy`` (keras/src/backend/tensorflow/optimizer.py); ``fit`` later raises
    "Mixing different tf.distribute.Strategy objects" if that is not the model's strategy. If a
    future Keras renames it, fall back to where its step counter variable was created.
    """
    for opt in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        if opt is None:
            continue
        owner = getattr(opt, "_distribution_strategy", None)
        if owner is not None:
            if owner is not strategy:
                return False
        elif getattr(opt, "iterations", None) is not None:
            step = getattr(opt.iterations, "value", opt.iterations)
            if not strategy.extended.variable_created_in_scope(step):
                return False
    return True


# References and typical wrong answers (tests use them; notebooks never see them).


def _global_batch_size_reference(per_replica_batch, strategy):
    return per_replica_batch * strategy.num_replicas_in_sync


def _small_model():
    import keras

    return keras.Sequential(
        [keras.Input(shape=(32, 32, 3)), keras.layers.Flatten(), keras.layers.Dense(10)]
    )


def _compile(model, optimizer="adam"):
    import keras

    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _make_model_reference(strategy):
    with strategy.scope():
        return _compile(_small_model())


def _make_model_built_outside(strategy):
    model = _small_model()
    with strategy.scope():
        return _compile(model)


def _make_model_optimizer_outside(strategy):
    import keras

    optimizer = keras.optimizers.Adam(1e-3)
    with strategy.scope():
        return _compile(_small_model(), optimizer)


def _make_model_compiled_after_scope(strategy):
    with strategy.scope():
        model = _small_model()
    return _compile(model)


def _make_model_not_compiled(strategy):
    with strategy.scope():
        return _small_model()


def _make_model_no_input_shape(strategy):
    import keras

    with strategy.scope():
        return _compile(keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(10)]))


def _model_in_default_strategy():
    import tensorflow as tf

    return _make_model_reference(tf.distribute.get_strategy())


def _make_model_returns_layer(strategy):
    import keras

    with strategy.scope():
        return keras.layers.Dense(10)


register_bank(
    "tpu_initialization",
    [
        Exercise(
            name="replicas_on_v5e",
            question=(
                "How many replicas does `strategy.num_replicas_in_sync` report on Colab's free TPU "
                "runtime (v5e-1)?"
            ),
            checker=_check_replicas_on_v5e,
            answer_name="answer",
            hints=(
                "TPUStrategy makes one replica per TensorCore. How many chips does a v5e-1 have?",
                "The old v2-8 had 4 chips × 2 TensorCores = 8 replicas. A v5e chip has one TensorCore.",
            ),
            solution_code=(
                "answer = 1  # v5e-1: 1 chip × 1 TensorCore = 1 replica (the retired v2-8 had 8)\n"
            ),
            stub="answer = ...  # an int\n",
            reference=lambda: 1,
            wrong_examples=(
                ("v2-8 count", lambda: 8, "v2-8"),
                ("string", lambda: "1", "Expected an int (a number of replicas), got str '1'"),
                ("bool", lambda: True, "got bool True"),
                ("float", lambda: 1.0, "got float 1.0"),
                ("other int", lambda: 4, "v5e-1 has a single chip"),
            ),
        ),
        Exercise(
            name="global_batch_size",
            question=(
                "Write `global_batch_size(per_replica_batch, strategy)`: examples per step "
                "across all replicas."
            ),
            checker=_check_global_batch_size,
            answer_name="global_batch_size",
            hints=(
                "Every replica processes its own per-replica batch in each step. "
                "How many replicas are there? Ask the strategy.",
                "`strategy.num_replicas_in_sync` is a plain int; the answer is one multiplication.",
            ),
            solution_code='''\
def global_batch_size(per_replica_batch, strategy):
    """Examples one training step consumes across all replicas."""
    return per_replica_batch * strategy.num_replicas_in_sync
''',
            stub='''\
def global_batch_size(per_replica_batch, strategy):
    """Return how many examples one training step consumes across all replicas."""
    ...  # your code here
''',
            reference=lambda: _global_batch_size_reference,
            wrong_examples=(
                (
                    "ignores replicas",
                    lambda: (lambda per, s: per),
                    "ignores the number of replicas: for 4 replicas and per-replica batch 64 "
                    "you returned 64, expected 256",
                ),
                ("hard-codes 8", lambda: (lambda per, s: per * 8), "assumes 8 replicas (the retired v2-8)"),
                ("divides", lambda: (lambda per, s: per // s.num_replicas_in_sync), "you divided"),
                ("true division", lambda: (lambda per, s: per / s.num_replicas_in_sync), "you divided"),
                (
                    "float result",
                    lambda: (lambda per, s: float(per * s.num_replicas_in_sync)),
                    "Expected an int (the global batch size), got float",
                ),
                ("string result", lambda: (lambda per, s: str(per * 4)), "got str '256'"),
                (
                    "fixed factor",
                    lambda: (lambda per, s: per * 4),
                    "always multiplies by 4: for 8 replicas and per-replica batch 128 you returned 512, "
                    "expected 1024",
                ),
                ("adds", lambda: (lambda per, s: per + s.num_replicas_in_sync), "expected 256"),
                ("result, not function", lambda: 256, "Pass the function itself"),
                ("wrong arity", lambda: (lambda per: per), "define it with exactly 2 parameters"),
            ),
        ),
        Exercise(
            name="build_in_scope",
            question=(
                "Write `make_model(strategy)`: build AND compile a small classifier for 32×32×3 images "
                "inside `strategy.scope()`."
            ),
            checker=_check_build_in_scope,
            answer_name="make_model",
            needs=("strategy",),
            hints=(
                "Everything that creates variables must run inside `with strategy.scope():` — "
                "the layers (via `keras.Input`, which builds them) and the optimizer.",
                "Inside the `with` block: `keras.Sequential([keras.Input(shape=(32, 32, 3)), ...])`, then "
                "`model.compile(optimizer='adam', loss=...)`; return the model after the block.",
            ),
            solution_code='''\
import keras

def make_model(strategy):
    with strategy.scope():  # weights AND optimizer must be created in here
        model = keras.Sequential([
            keras.Input(shape=(32, 32, 3)),  # an input shape builds the weights now, in the scope
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ])
        model.compile(
            optimizer="adam",  # a string: the optimizer is created inside the scope
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    return model
''',
            stub='''\
def make_model(strategy):
    """Build AND compile a small classifier for 32x32x3 images so it can train under `strategy`."""
    ...  # your code here: build the model, compile it, return it
''',
            reference=lambda: _make_model_reference,
            wrong_examples=(
                ("outside scope", lambda: _make_model_built_outside, "built outside `strategy.scope()`"),
                (
                    "optimizer object outside",
                    lambda: _make_model_optimizer_outside,
                    "Mixing different tf.distribute.Strategy objects",
                ),
                (
                    "compiled after the scope",
                    lambda: _make_model_compiled_after_scope,
                    "optimizer was created outside the scope",
                ),
                ("not compiled", lambda: _make_model_not_compiled, "not compiled"),
                ("no input shape", lambda: _make_model_no_input_shape, "input shape"),
                (
                    "returns a layer",
                    lambda: _make_model_returns_layer,
                    "Expected `make_model` to return a keras.Model, got an object of type Dense",
                ),
                ("model, not function", _model_in_default_strategy, "you passed a model, not the function"),
            ),
        ),
    ],
)
