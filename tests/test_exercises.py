"""Tests of course_utils.exercises, data-driven over every registered bank.

For each exercise: the reference passes; each wrong example fails with its expected message; every
stub (including the notebook's own stub code) counts as unanswered; learner crashes become a one-line
"error"; junk never makes check() raise; the printed solution, executed, passes the checker.
"""

from __future__ import annotations

import pytest

from course_utils import exercises

ALL = [(bank, ex) for bank in exercises.available_banks() for ex in exercises.load(bank)]
IDS = [f"{bank}.{ex.name}" for bank, ex in ALL]
WRONG = [(ex, label, make, expected) for _, ex in ALL for label, make, expected in ex.wrong_examples]
WRONG_IDS = [f"{ex.name}-{label}" for ex, label, _, _ in WRONG]


@pytest.fixture(scope="module")
def context():
    """Every context keyword a bank may declare in `needs`."""
    import tensorflow as tf

    return {"strategy": tf.distribute.OneDeviceStrategy("/cpu:0")}


def _ctx(ex, context):
    return {key: context[key] for key in ex.needs}


def _not_implemented(*args):
    raise NotImplementedError


def _returns_none(*args):
    return None


def _returns_ellipsis(*args):
    return ...


def _raises_value_error(*args):
    raise ValueError("boom from learner code")


def test_banks_are_registered():
    assert "tpu_initialization" in exercises.available_banks()
    assert [e.name for e in exercises.load("tpu_initialization")] == [
        "replicas_on_v5e",
        "global_batch_size",
        "build_in_scope",
    ]
    for _, ex in ALL:
        assert ex.hints and ex.solution_code and ex.stub and ex.wrong_examples, ex.name


@pytest.mark.parametrize("bank, ex", ALL, ids=IDS)
def test_reference_passes(bank, ex, context):
    result = ex.check(ex.reference(), **_ctx(ex, context))
    assert result.status == "correct", result
    assert result.passed and bool(result)
    assert repr(result).startswith("✅ Correct — ")
    assert result._repr_markdown_().startswith("✅ **Correct** — ")


@pytest.mark.parametrize("ex, label, make, expected", WRONG, ids=WRONG_IDS)
def test_wrong_example_fails_with_targeted_message(ex, label, make, expected, context):
    result = ex.check(make(), **_ctx(ex, context))
    assert result.status == "incorrect", result
    assert not result and not result.passed
    assert expected in result.message, result
    assert repr(result).startswith("❌ Not yet — ")


STUBS = [
    ("ellipsis", ..., "replace the `...`"),
    ("none", None, "None"),
    ("returns-none", _returns_none, "forget `return`"),
    ("returns-ellipsis", _returns_ellipsis, "`...`"),
    ("not-implemented", _not_implemented, "NotImplementedError"),
]
# Function stubs only make sense where the answer is a function.
STUB_CASES = [(ex, stub, words) for _, ex in ALL for _, stub, words in STUBS
              if not callable(stub) or callable(ex.reference())]
STUB_IDS = [f"{ex.name}-{label}" for _, ex in ALL for label, stub, _ in STUBS
            if not callable(stub) or callable(ex.reference())]
FUNCTION_EXERCISES = [ex for _, ex in ALL if callable(ex.reference())]


@pytest.mark.parametrize("ex, stub, words", STUB_CASES, ids=STUB_IDS)
def test_stubs_are_unanswered(ex, stub, words, context):
    result = ex.check(stub, **_ctx(ex, context))
    assert result.status == "unanswered", result
    assert words in result.message, result
    assert not result
    assert repr(result).startswith("✏️ Not answered yet — ")


@pytest.mark.parametrize("bank, ex", ALL, ids=IDS)
def test_notebook_stub_code_is_unanswered(bank, ex, context):
    namespace: dict = {}
    exec(ex.stub, namespace)
    result = ex.check(namespace[ex.answer_name], **_ctx(ex, context))
    assert result.status == "unanswered", result


@pytest.mark.parametrize("ex", FUNCTION_EXERCISES, ids=[e.name for e in FUNCTION_EXERCISES])
def test_learner_exception_is_a_one_line_error(ex, context):
    result = ex.check(_raises_value_error, **_ctx(ex, context))
    assert result.status == "error", result
    assert "Your code raised ValueError: boom from learner code when called as `" in result.message
    assert "Traceback" not in result.message and "\n" not in result.message
    assert repr(result).startswith("⚠️ Error — ")


@pytest.mark.parametrize("bank, ex", [(b, e) for b, e in ALL if e.needs],
                         ids=[i for i, (_, e) in zip(IDS, ALL) if e.needs])
def test_missing_context_is_an_error_with_the_call(bank, ex):
    result = ex.check(ex.reference())
    assert result.status == "error", result
    assert ex.call_hint in result.message
    if ex.name == "build_in_scope":
        assert ex.call_hint == "ex.build_in_scope.check(make_model, strategy=strategy)"
    typo = ex.check(ex.reference(), stratgy=object())
    assert typo.status == "error" and "`stratgy=`" in typo.message


@pytest.mark.parametrize("bank, ex", ALL, ids=IDS)
@pytest.mark.parametrize(
    "junk",
    [object(), "a string", lambda: 1, lambda *a, **k: object(), 3.5, [1, 2], type,
     lambda *a: __import__("numpy").array([1, 2]), lambda *a: __import__("tensorflow").constant(256)],
    ids=["object", "str", "no-args-lambda", "returns-object", "float", "list", "type", "returns-array",
         "returns-tensor"],
)
def test_check_never_raises_on_junk(bank, ex, junk, context):
    result = ex.check(junk, **_ctx(ex, context))
    assert result.status in {"incorrect", "error"}, result
    assert result.message and "Traceback" not in result.message
    assert "checker itself failed" not in result.message, result


def test_bad_strategy_context_is_an_error():
    ex = exercises.load("tpu_initialization").build_in_scope
    result = ex.check(ex.reference(), strategy="tpu")
    assert result.status == "error" and "tf.distribute strategy" in result.message


def test_specific_messages():
    import tensorflow as tf

    ex = exercises.load("tpu_initialization")
    eight = ex.replicas_on_v5e.check(8).message
    assert "4 chips × 2 TensorCores = 8 replicas" in eight and "one chip with one TensorCore" in eight
    import numpy as np

    assert ex.replicas_on_v5e.check(np.int64(1)).passed
    assert not ex.replicas_on_v5e.check(np.bool_(True)).passed
    tensor = ex.global_batch_size.check(lambda per, s: tf.constant(per * s.num_replicas_in_sync))
    assert tensor.status == "incorrect" and "got tf.Tensor (shape (), dtype int32)" in tensor.message, tensor
    result = ex.global_batch_size.check(lambda per, s: s.num_replicas_in_sync())
    assert result.status == "error" and "TypeError" in result.message, result
    assert "not a method call" in result.message


@pytest.mark.parametrize("bank, ex", ALL, ids=IDS)
def test_solution_text_runs_and_passes(bank, ex, context, capsys):
    ex.solution()
    code = capsys.readouterr().out
    assert code.strip()
    namespace: dict = {}
    exec(code, namespace)
    result = ex.check(namespace[ex.answer_name], **_ctx(ex, context))
    assert result.status == "correct", result


def test_hint_progression(capsys):
    ex = exercises.load("tpu_initialization").global_batch_size
    ex.hint()
    first = capsys.readouterr().out
    assert first.startswith(f"Hint 1 of 2: {ex.hints[0]}") and "No more hints" not in first
    ex.hint()
    second = capsys.readouterr().out
    assert second.startswith(f"Hint 2 of 2: {ex.hints[1]}") and "solution()" in second
    ex.hint()
    third = capsys.readouterr().out
    assert third.startswith(f"Hint 2 of 2: {ex.hints[1]}") and "No more hints" in third
    # load() gives fresh counters
    exercises.load("tpu_initialization").global_batch_size.hint()
    assert capsys.readouterr().out.startswith("Hint 1 of 2")


def test_check_does_not_print(capsys, context):
    for _, ex in ALL:
        ex.check(ex.reference(), **_ctx(ex, context))
        ex.check(..., **_ctx(ex, context))
    assert capsys.readouterr().out == ""


def test_unknown_bank_lists_available():
    with pytest.raises(exercises.UnknownBankError) as info:
        exercises.load("nope")
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert "'nope'" in str(info.value) and "tpu_initialization" in str(info.value)


def test_unknown_exercise_lists_available():
    ex = exercises.load("tpu_initialization")
    with pytest.raises(AttributeError, match="replicas_on_v5e"):
        ex.replicas_on_v5e1


def test_register_bank_rejects_duplicates():
    with pytest.raises(ValueError, match="already registered"):
        exercises.register_bank("tpu_initialization", [])
