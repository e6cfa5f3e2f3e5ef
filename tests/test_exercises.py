"""Tests of course_utils.exercises, data-driven over every registered bank.

For each exercise: the reference passes; each wrong example fails with its expected message; every
stub (including the notebook's own stub code) counts as unanswered; learner crashes become a one-line
"error"; junk never makes check() raise; the printed solution, executed, passes the checker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from exercise_answers import reference, wrong_examples

from course_utils import exercises, lessons

ALL = [(lesson.name, ex) for lesson in lessons.LESSONS for ex in exercises.load(lesson.module)]
IDS = [f"{bank}.{ex.name}" for bank, ex in ALL]
WRONG = [(ex, label, make, expected) for _, ex in ALL for label, make, expected in wrong_examples(ex)]
WRONG_IDS = [f"{ex.name}-{label}" for ex, label, _, _ in WRONG]


@pytest.fixture(scope="module")
def context():
    """Every context keyword a bank may declare in `needs`."""
    import tensorflow as tf

    from exercise_answers import cifar10_capstone as capstone_bank

    return {
        "strategy": tf.distribute.OneDeviceStrategy("/cpu:0"),
        "start": capstone_bank.example_start(),
        "target": capstone_bank.EXAMPLE_TARGET,
    }


def _ctx(ex, context):
    return {key: context[key] for key in ex.needs}


@pytest.fixture(scope="module", autouse=True)
def train_each_capstone_answer_once():
    """The capstone's one_knob checker trains for its budget (10 s) with the answer's options. Several tests here
    check the same correct answer (the reference, the printed solution, by keyword, silently): the first check
    trains; a later check of equal options gets a copy of that run's folder and result, and the checker reads them
    as it reads any run. What the training itself reaches is tested once, by the first check."""
    import dataclasses
    import shutil

    from course_utils import capstone

    real_train, runs = capstone.train, {}

    def train_once(options, **kwargs):
        key = repr(dataclasses.replace(options, out=""))
        if key not in runs:
            runs[key] = (real_train(options, **kwargs), options.out)
        result, out = runs[key]
        if out != options.out:
            shutil.rmtree(options.out, ignore_errors=True)
            shutil.copytree(out, options.out)
        return result

    capstone.train = train_once
    yield
    capstone.train = real_train


def _not_implemented(*args):
    raise NotImplementedError


def _returns_none(*args):
    return None


def _returns_ellipsis(*args):
    return ...


def _raises_value_error(*args):
    raise ValueError("boom from learner code")


def test_banks_are_registered():
    assert "tpu_initialization" in [lesson.name for lesson in lessons.LESSONS]
    assert [e.name for e in exercises.load(lessons.tpu_initialization)] == [
        "replicas_on_v5e",
        "global_batch_size",
        "build_in_scope",
    ]
    for _, ex in ALL:
        assert ex.hints and ex.solution_code and ex.stub and wrong_examples(ex), ex.name


@pytest.mark.parametrize("bank, ex", ALL, ids=IDS)
def test_reference_passes(bank, ex, context):
    result = ex.check(reference(ex)(), **_ctx(ex, context))
    if result.status != "correct" and ex.name == "one_knob":
        # the one checker that trains under a time budget: a machine that stalls during those 10 s trains fewer
        # epochs (seen once in a full run, never alone); a second run tells a stall from a wrong reference
        result = ex.check(reference(ex)(), **_ctx(ex, context))
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
STUB_CASES = [
    (ex, stub, words) for _, ex in ALL for _, stub, words in STUBS if not callable(stub) or callable(reference(ex)())
]
STUB_IDS = [
    f"{ex.name}-{label}" for _, ex in ALL for label, stub, _ in STUBS if not callable(stub) or callable(reference(ex)())
]
FUNCTION_EXERCISES = [ex for _, ex in ALL if callable(reference(ex)())]


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


@pytest.mark.parametrize(
    "bank, ex", [(b, e) for b, e in ALL if e.needs], ids=[i for i, (_, e) in zip(IDS, ALL) if e.needs]
)
def test_missing_context_is_an_error_with_the_call(bank, ex):
    result = ex.check(reference(ex)())
    assert result.status == "error", result
    assert ex.call_hint in result.message
    if ex.name == "build_in_scope":
        assert ex.call_hint == "ex.build_in_scope.check(make_model, strategy=strategy)"
    typo = ex.check(reference(ex)(), stratgy=object())
    assert typo.status == "error" and "`stratgy=`" in typo.message


@pytest.mark.parametrize("bank, ex", ALL, ids=IDS)
@pytest.mark.parametrize(
    "junk",
    [
        object(),
        "a string",
        lambda: 1,
        lambda *a, **k: object(),
        3.5,
        [1, 2],
        type,
        lambda *a: __import__("numpy").array([1, 2]),
        lambda *a: __import__("tensorflow").constant(256),
    ],
    ids=[
        "object",
        "str",
        "no-args-lambda",
        "returns-object",
        "float",
        "list",
        "type",
        "returns-array",
        "returns-tensor",
    ],
)
def test_check_never_raises_on_junk(bank, ex, junk, context):
    result = ex.check(junk, **_ctx(ex, context))
    assert result.status in {"incorrect", "error"}, result
    assert result.message and "Traceback" not in result.message
    assert "checker itself failed" not in result.message, result


def test_bad_strategy_context_is_an_error():
    ex = exercises.load(lessons.tpu_initialization).build_in_scope
    result = ex.check(reference(ex)(), strategy="tpu")
    assert result.status == "error" and "tf.distribute strategy" in result.message


def test_specific_messages():
    import tensorflow as tf

    ex = exercises.load(lessons.tpu_initialization)
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
    namespace: dict = dict(_ctx(ex, context))  # the notebook cell's names the solution may use (e.g. `start`)
    exec(code, namespace)
    result = ex.check(namespace[ex.answer_name], **_ctx(ex, context))
    assert result.status == "correct", result


def test_hint_progression(capsys):
    ex = exercises.load(lessons.tpu_initialization).global_batch_size
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
    exercises.load(lessons.tpu_initialization).global_batch_size.hint()
    assert capsys.readouterr().out.startswith("Hint 1 of 2")


def test_check_does_not_print(capsys, context):
    for _, ex in ALL:
        ex.check(reference(ex)(), **_ctx(ex, context))
        ex.check(..., **_ctx(ex, context))
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("wrong", ["tpu_initialization", None, 3, exercises])
def test_load_takes_a_lesson_and_says_how_in_one_line_otherwise(wrong):
    with pytest.raises(exercises.UnknownBankError) as info:
        exercises.load(wrong)
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    message = str(info.value)
    assert "\n" not in message and "exercises.load(tpu_initialization)" in message, message


def test_load_takes_the_lesson_its_exercises_module_or_its_bank_and_gives_fresh_hint_counters():
    banks = [
        exercises.load(x)
        for x in (
            lessons.tpu_initialization,
            lessons.tpu_initialization.exercises,
            lessons.tpu_initialization.exercises.EXERCISES,
        )
    ]
    assert [[e.name for e in bank] for bank in banks] == [[e.name for e in banks[0]]] * 3
    assert banks[0].global_batch_size is not banks[1].global_batch_size


def test_unknown_exercise_lists_available():
    ex = exercises.load(lessons.tpu_initialization)
    with pytest.raises(AttributeError, match="replicas_on_v5e"):
        ex.replicas_on_v5e1


def test_a_bank_rejects_duplicate_or_invalid_exercise_names():
    (first, *_) = exercises.load(lessons.tpu_initialization)
    with pytest.raises(ValueError, match="unique Python identifiers"):
        exercises.ExerciseBank("twice", [first, first])


# ----------------------------------------------------------------------------------------------
# Hardening (issue 9 §1): one test per class of bug in the core
# ----------------------------------------------------------------------------------------------


def _toy(checker, needs=()):
    """An unregistered exercise around ``checker`` (registering it would add it to every bank test)."""
    return exercises.Exercise(
        name="toy",
        question="?",
        checker=checker,
        answer_name="fn",
        hints=("h",),
        solution_code="fn = 1",
        stub="fn = ...",
        needs=needs,
    )


def _calls(answer, **context):
    value = exercises.call_learner(answer, shown_as="fn()")
    return f"got {exercises.describe(value)}"


def test_context_may_be_positional(context):
    ex = exercises.load(lessons.tpu_initialization).build_in_scope
    assert ex.check(reference(ex)(), context["strategy"]).passed
    too_many = ex.check(reference(ex)(), context["strategy"], 3)
    assert too_many.status == "error" and ex.call_hint in too_many.message, too_many
    twice = ex.check(reference(ex)(), context["strategy"], strategy=context["strategy"])
    assert twice.status == "error" and "twice" in twice.message, twice
    none_needed = exercises.load(lessons.tpu_initialization).replicas_on_v5e.check(1, context["strategy"])
    assert none_needed.status == "error" and "only your answer" in none_needed.message, none_needed


def test_answer_may_be_a_keyword(context):
    ex = exercises.load(lessons.tpu_initialization)
    assert ex.replicas_on_v5e.check(answer=1).passed
    assert ex.replicas_on_v5e.check(answer=8).status == "incorrect"
    assert ex.build_in_scope.check(make_model=reference(ex.build_in_scope)(), strategy=context["strategy"]).passed
    twice = ex.replicas_on_v5e.check(1, answer=1)
    assert twice.status == "error" and "twice" in twice.message, twice
    assert ex.replicas_on_v5e.check().status == "unanswered"


@pytest.mark.parametrize(
    "exc",
    [SystemExit(3), KeyboardInterrupt(), BaseException("odd"), GeneratorExit()],
    ids=["SystemExit", "KeyboardInterrupt", "BaseException", "GeneratorExit"],
)
def test_base_exceptions_from_learner_code_do_not_escape(exc):
    def learner():
        raise exc

    result = _toy(_calls).check(learner)
    assert result.status == "error" and "\n" not in result.message, result
    assert type(exc).__name__ in result.message or "exit()" in result.message, result

    def checker(answer):  # raised outside call_learner (e.g. from the learner's object inside the checker)
        raise exc

    result = _toy(checker).check(1)
    assert result.status == "error", result


def test_sys_exit_message_names_exit():
    result = _toy(_calls).check(lambda: sys.exit("bye"))
    assert result.status == "error" and "sys.exit()" in result.message and "bye" in result.message, result


def _loop():
    while True:
        pass


def _sleep():
    time.sleep(600)


@pytest.mark.parametrize("learner", [_loop, _sleep], ids=["loop", "sleep"])
def test_learner_code_is_bounded_in_time(learner, monkeypatch):
    monkeypatch.setenv("COURSE_CHECK_TIMEOUT", "0.3")
    start = time.monotonic()
    result = _toy(_calls).check(learner)
    assert time.monotonic() - start < 5
    assert result.status == "error" and "did not finish within 0.3 s" in result.message, result
    assert "`.repeat()`" in result.message and "COURSE_CHECK_TIMEOUT" in result.message
    # the timer and handler are gone: nothing fires later
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None, signal.default_int_handler)


def test_time_bound_swallowing_exceptions_in_learner_code(monkeypatch):
    """`except Exception` in the learner's loop cannot hold the bound: it is a BaseException."""
    monkeypatch.setenv("COURSE_CHECK_TIMEOUT", "0.3")

    def stubborn():
        while True:
            try:
                sum(range(100))
            except Exception:
                pass

    result = _toy(_calls).check(stubborn)
    assert result.status == "error" and "did not finish" in result.message, result


_RELEASE = threading.Event()  # set at the end of each blocking test: threads the answers started may end


def _blocking_answers():
    """Answers that block in a system call or a lock (issue 21: signal.siginterrupt(SIGALRM, False) let the kernel
    restart them, so the bound never fired) or swallow the interrupt in a loop."""
    import os
    import queue
    import socket
    import subprocess

    def event_wait():
        threading.Event().wait()

    def queue_get():
        queue.Queue().get()

    def thread_join():
        worker = threading.Thread(target=_RELEASE.wait, daemon=True)
        worker.start()
        worker.join()

    def run_a_program():
        subprocess.run(["sleep", "600"])

    def read_a_pipe():
        read_end, write_end = os.pipe()
        try:
            os.read(read_end, 1)
        finally:
            os.close(read_end)
            os.close(write_end)

    def accept():
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen()
            server.accept()

    def swallow_everything():
        while True:
            try:
                time.sleep(1)
            except BaseException:  # noqa: BLE001 - what the learner wrote
                pass

    def swallow_nested_while_waiting():
        while True:
            try:
                try:
                    threading.Event().wait()
                except:  # noqa: E722
                    continue
            except BaseException:  # noqa: BLE001
                pass

    return {
        f.__name__: f
        for f in (
            event_wait,
            queue_get,
            thread_join,
            run_a_program,
            read_a_pipe,
            accept,
            swallow_everything,
            swallow_nested_while_waiting,
        )
    }


@pytest.mark.parametrize("name", list(_blocking_answers()))
def test_the_time_bound_holds_for_blocking_and_swallowing_answers(name, monkeypatch):
    import psutil

    monkeypatch.setenv("COURSE_CHECK_TIMEOUT", "0.3")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    start = time.monotonic()
    try:
        result = _toy(_calls).check(_blocking_answers()[name])
    finally:
        _RELEASE.set()
    assert time.monotonic() - start < 5, name
    assert result.status == "error" and "did not finish within 0.3 s" in result.message, result
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None, signal.default_int_handler)
    assert sys.gettrace() is None or "coverage" in type(sys.gettrace()).__module__.lower()
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.status() != "zombie"]
    assert not left, left  # subprocess.run killed its program when the bound cut it short
    assert _toy(_calls).check(lambda: 5).passed  # nothing pending afterwards
    _RELEASE.clear()


def test_a_time_bound_cut_short_while_arming_leaves_nothing_armed(monkeypatch):
    """An outer bound's interrupt landing just after an inner bound armed (describe's 0.5 s bound inside a check's
    0.3 s one) skipped the inner's __exit__: its handler and watchdog stayed, and a test-suite worker got _TimedOut
    between tests."""
    from course_utils import exercises as ex

    real = ex._TimeBound._enter_alarm

    def cut_short(self):
        real(self)
        raise ex._TimedOut(9)  # the outer bound's interrupt

    monkeypatch.setattr(ex._TimeBound, "_enter_alarm", cut_short)
    before = signal.getsignal(signal.SIGALRM)
    with pytest.raises(ex._TimedOut):
        with ex._TimeBound(0.05):
            pass
    assert signal.getsignal(signal.SIGALRM) == before
    assert not [t for t in threading.enumerate() if t.name == "course-check-timeout" and t.is_alive()]
    time.sleep(0.2)  # past the inner bound: nothing fires


def test_a_leaked_time_bound_disarms_itself_instead_of_raising_elsewhere():
    """A bound whose `with` ended without __exit__ (however it leaked: a CI worker once died between tests of a
    leaked _TimedOut(0.5)) must not raise in code outside it: its handler finds its `with` gone and disarms."""
    from course_utils import exercises as ex

    before = signal.getsignal(signal.SIGALRM)

    def leak():
        ex._TimeBound(0.05).__enter__()  # entered, never exited

    leak()
    time.sleep(0.3)  # past its bound: without the guard, _TimedOut here
    assert signal.getsignal(signal.SIGALRM) == before
    time.sleep(0.05)
    assert not [t for t in threading.enumerate() if t.name == "course-check-timeout" and t.is_alive()]


def test_the_time_bound_holds_in_a_fresh_process_with_tensorflow_threads():
    """Where a learner meets it: a kernel's main thread, TensorFlow's threads beside it (a process timer's signal
    could wake one of them instead of the waiting main thread)."""
    code = (
        "import os, threading, time\n"
        "os.environ['COURSE_CHECK_TIMEOUT'] = '0.5'\n"
        "import tensorflow as tf\n"
        "tf.data.Dataset.range(10).map(lambda x: x + 1).reduce(tf.constant(0, tf.int64), lambda a, b: a + b)\n"
        "from course_utils import exercises, lessons\n"
        "ex = exercises.load(lessons.cifar10_capstone).scaled_learning_rate\n"
        "def answer(lr, b0, b):\n"
        "    while True:\n"
        "        try:\n"
        "            threading.Event().wait()\n"
        "        except BaseException:\n"
        "            pass\n"
        "t = time.monotonic(); r = ex.check(answer)\n"
        "print(r.status, round(time.monotonic() - t, 1), r.message[:40])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    status, seconds, *_ = proc.stdout.split()
    assert status == "error" and float(seconds) < 5, proc.stdout + proc.stderr[-2000:]
    assert "did not finish within 0.5 s" in proc.stdout


def test_time_bound_in_another_thread(monkeypatch):
    """Off the main thread (no SIGALRM there) a watchdog thread bounds the check instead."""
    monkeypatch.setenv("COURSE_CHECK_TIMEOUT", "0.3")
    results = []
    worker = threading.Thread(target=lambda: results.append(_toy(_calls).check(_loop)))
    worker.start()
    worker.join(10)
    assert not worker.is_alive() and results[0].status == "error", results
    assert "did not finish" in results[0].message
    assert _toy(_calls).check(lambda: 5).passed  # and nothing was left pending in this thread


def test_time_bound_keeps_an_outer_timer():
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        assert _toy(_calls).check(lambda: 5).passed
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < remaining <= 0.5
        time.sleep(1)
        assert fired == [1]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize(
    "raw, expected", [("2.5", 2.5), ("0", 0.0), ("off", 0.0), ("junk", None), ("-3", None), ("nan", None), ("", None)]
)
def test_timeout_setting(raw, expected, monkeypatch):
    monkeypatch.setenv("COURSE_CHECK_TIMEOUT", raw)
    assert exercises.check_timeout_s() == (exercises.CHECK_TIMEOUT_S if expected is None else expected)


def test_read_dataset_bounds_elements():
    import tensorflow as tf

    ds = tf.data.Dataset.range(5)
    assert [int(x) for x in exercises.read_dataset(ds, shown_as="f()")] == [0, 1, 2, 3, 4]
    with pytest.raises(exercises.Incorrect, match=r"never ends: it has a `\.repeat\(\)`"):
        exercises.read_dataset(ds.repeat(), shown_as="f()")
    with pytest.raises(exercises.Incorrect, match="has 50 batches; .* at most 10"):
        exercises.read_dataset(ds.repeat(10), shown_as="f()", limit=10, what="batches")
    unknown = ds.repeat().filter(lambda x: x >= 0)  # unknown cardinality, endless: take() bounds it
    assert int(unknown.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY)
    with pytest.raises(exercises.Incorrect, match="more than 10 elements"):
        exercises.read_dataset(unknown, shown_as="f()", limit=10)
    with pytest.raises(exercises.Incorrect, match="returned list"):
        exercises.read_dataset([1, 2], shown_as="f()")
    broken = ds.map(lambda x: tf.gather(tf.constant([1, 2, 3]), x))  # ids 3 and 4 are out of range
    with pytest.raises(exercises._Verdict) as info:
        exercises.read_dataset(broken, shown_as="f()")
    assert info.value.result.status == "error" and "Reading the dataset from `f()` raised" in info.value.result.message


def test_repeat_dataset_in_a_checker_is_bounded(monkeypatch):
    """A checker that iterates a learner's `.repeat()` dataset itself ends at the time bound."""
    import tensorflow as tf

    monkeypatch.setenv("COURSE_CHECK_TIMEOUT", "0.5")

    def checker(answer):
        for _ in exercises.call_learner(answer, shown_as="fn()"):
            pass
        return "done"

    result = _toy(checker).check(lambda: tf.data.Dataset.range(3).repeat())
    assert result.status == "error" and "did not finish" in result.message, result


class _BadRepr:
    def __repr__(self):
        raise RuntimeError("no repr")

    __str__ = __repr__


def _deep(depth):
    outer = inner = []
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    return outer


def _self_ref():
    items = []
    items.append(items)
    return items


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: 10**400, "an int with about 401 digits"),
        (lambda: -(10**5000), "a negative int with about 5001 digits"),
        (lambda: _deep(100_000), "list [[[[…]]]]"),
        (_self_ref, "list [[[[…]]]]"),
        (_BadRepr, "an object of type _BadRepr"),
        (lambda: [_BadRepr(), 10**5000], "list [<_BadRepr>, <int with about 5001 digits>]"),
        (lambda: [0] * 5_000_000, "… 5000000 items in all]"),
        (lambda: {"a": [1, {"b": (2,)}]}, "dict {'a': [1, {'b': (…)}]}"),
        (lambda: "x" * 10**6, "str 'xxxx"),
        (lambda: b"1", "bytes b'1'"),
        (lambda: (1,), "tuple (1,)"),
        (lambda: __import__("numpy").float32(2.0), "numpy.float32 2.0"),
    ],
    ids=[
        "int-400",
        "int-5000",
        "deep-list",
        "self-list",
        "bad-repr",
        "mixed-list",
        "5M-list",
        "dict",
        "long-str",
        "bytes",
        "tuple-1",
        "numpy-scalar",
    ],
)
def test_describe_never_fails_and_is_fast(make, words):
    value = make()
    start = time.perf_counter()
    text = exercises.describe(value)
    assert time.perf_counter() - start < 0.05
    assert words in text and len(text) < 120 and "\n" not in text, text


def test_describe_survives_hostile_objects():
    class Hostile:
        def __getattr__(self, name):
            raise RuntimeError(name)

    assert exercises.describe(Hostile()) == "an object of type Hostile"
    assert "digits" in _toy(lambda a: exercises.require_int(a)).check(10**5000).message


def test_messages_are_one_line_without_terminal_codes():
    def learner():
        raise ValueError(
            "\x1b[1m\x1b[31mInvalid dtype\x1b[0m:\n  expected \x1b]8;;http://x\x07link\x1b]8;;\x07 float32\r\n"
        )

    result = _toy(_calls).check(learner)
    assert result.status == "error", result
    assert "\x1b" not in result.message and "\n" not in result.message and "\r" not in result.message
    assert "Invalid dtype: expected link float32" in result.message, result
    made = exercises.CheckResult("incorrect", "a\n\tb \x1b[0m" + "c" * 5000)
    assert made.message.startswith("a b c") and len(made.message) == 1000 and made.message.endswith("…")


def test_require_number():
    import numpy as np
    import tensorflow as tf

    assert exercises.require_number(np.float32(2.5)) == 2.5
    assert exercises.require_number(tf.constant(1.5)) == 1.5
    assert exercises.require_number(np.array(3)) == 3.0
    # bfloat16/float16 scalars: what lesson 02's exercise asks learners to compute
    import ml_dtypes

    assert exercises.require_number(tf.constant(1.5, tf.bfloat16)) == 1.5
    assert exercises.require_number(tf.constant(1.5, tf.float16)) == 1.5
    assert exercises.require_number(ml_dtypes.bfloat16(0.5)) == 0.5
    for junk, words in [
        (True, "True/False"),
        ("1", "quotes"),
        (b"1", "quotes"),
        (10**400, "far too large"),
        (np.array([1.0, 2.0]), "a single number"),
        (tf.constant("x"), "Expected"),
        (_BadRepr(), "_BadRepr"),
    ]:
        with pytest.raises(exercises.Incorrect, match=words):
            exercises.require_number(junk)


# ----------------------------------------------------------------------------------------------
# Bank bugs (issue 9 §1): answers that were accepted wrongly, rejected wrongly, crashed the checker
# or got a misleading message. Wrong answers that must be rejected are also `wrong_examples` of their
# exercise (run by test_wrong_example_fails_with_targeted_message); here are the rest.
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bank, ex", ALL, ids=IDS)
def test_answer_by_keyword_is_checked_not_unanswered(bank, ex, context):
    for keyword in {"answer", ex.answer_name}:
        result = ex.check(**{keyword: reference(ex)()}, **_ctx(ex, context))
        assert result.status == "correct", (keyword, result)


@pytest.mark.parametrize(
    "junk",
    [True, "1", b"1", 10**400, 10**5000, [1.0], __import__("numpy").array([1.0, 1.0])],
    ids=["True", "str", "bytes", "10**400", "10**5000", "list", "array"],
)
def test_vanishing_update_takes_only_a_number(junk):
    result = exercises.load(lessons.bfloat16_conversion).vanishing_update.check(junk)
    assert result.status == "incorrect", result
    assert "checker itself failed" not in result.message


def test_vanishing_update_takes_numpy_and_tensor_scalars():
    import numpy as np
    import tensorflow as tf

    ex = exercises.load(lessons.bfloat16_conversion).vanishing_update
    import ml_dtypes

    for value in (
        1.0,
        1,
        np.float32(1.0),
        ml_dtypes.bfloat16(1.0),
        tf.constant(1.0),
        tf.cast(tf.constant(1.0) - 0.001, tf.bfloat16),
        tf.constant(1.0, tf.float16),
    ):
        assert ex.check(value).passed, value


def test_param_bytes_as_a_numpy_array():
    import numpy as np

    ex = exercises.load(lessons.bfloat16_conversion).param_bytes
    params = 256 * 512 + 512
    assert ex.check(np.array([params * 2, params * 4])).passed
    assert ex.check((np.int64(params * 2), np.int64(params * 4))).passed
    wrong = ex.check(np.array([params * 4, params * 2]))
    assert wrong.status == "incorrect" and "swapped" in wrong.message, wrong
    assert ex.check(np.array([1, 2, 3])).status == "incorrect"


def test_global_batch_size_via_worker_devices():
    ex = exercises.load(lessons.tpu_initialization).global_batch_size
    assert ex.check(lambda per, strategy: per * len(strategy.extended.worker_devices)).passed
    other = ex.check(lambda per, strategy: strategy.extended.num_replicas_in_sync)
    assert other.status == "error" and "num_replicas_in_sync" in other.message, other


def test_global_batch_size_shows_huge_results_without_failing():
    ex = exercises.load(lessons.tpu_initialization).global_batch_size
    for value in (10**5000, 10**400):
        result = ex.check(lambda per, strategy, v=value: v)
        assert result.status == "incorrect" and "digits" in result.message, result


def test_build_in_scope_default_strategy_still_sees_the_scope():
    """With the default strategy as context every variable 'belongs' to it: the check uses a real one."""
    import keras
    import tensorflow as tf

    from exercise_answers import tpu_initialization as bank

    ex = exercises.load(lessons.tpu_initialization).build_in_scope
    default = tf.distribute.get_strategy()
    outside = ex.check(bank._make_model_built_outside, strategy=default)
    assert outside.status == "incorrect" and "built outside `strategy.scope()`" in outside.message, outside

    def ignores_the_scope(strategy):
        model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Flatten(), keras.layers.Dense(10)])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        return model

    assert ex.check(ignores_the_scope, strategy=default).status == "incorrect"
    assert ex.check(reference(ex)(), strategy=default).passed


def test_build_in_scope_takes_a_subclassed_model(context):
    import keras
    import numpy as np

    class Classifier(keras.Model):
        def __init__(self):
            super().__init__()
            self.flatten = keras.layers.Flatten()
            self.dense = keras.layers.Dense(10)

        def call(self, x):
            return self.dense(self.flatten(x))

    def make_model(strategy):
        with strategy.scope():
            model = Classifier()
            model(np.zeros((1, 32, 32, 3), np.float32))  # creates the weights, in the scope
            model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    assert (
        exercises.load(lessons.tpu_initialization).build_in_scope.check(make_model, strategy=context["strategy"]).passed
    )


def test_layer_dtypes_takes_dtype_objects_not_enum_ints():
    import numpy as np
    import tensorflow as tf

    ex = exercises.load(lessons.mixed_precision).layer_dtypes
    assert ex.check((tf.bfloat16, tf.float32)).passed
    assert ex.check(("bfloat16", np.float32)).passed
    assert ex.check(["bfloat16", np.dtype("float32")]).passed
    for junk in [
        (14, 1),
        (tf.bfloat16.as_datatype_enum, tf.float32.as_datatype_enum),
        (True, 1),
        (b"bfloat16", b"float32"),
    ]:
        result = ex.check(junk)
        assert result.status == "incorrect" and "dtype names" in result.message, (junk, result)


def test_scale_loss_outside_the_tape_is_one_plain_line():
    from exercise_answers import mixed_precision as bank

    result = exercises.load(lessons.mixed_precision).loss_scaled_step.check(bank._step_scale_outside_tape)
    assert result.status == "incorrect", result
    assert "inside the `with` block" in result.message
    for internal in ("Cond.call", "Arguments received", "\x1b", "LossScaleOptimizer._"):
        assert internal not in result.message, result


@pytest.mark.parametrize("value", [2.0, "np.float32", "np.int64", "tensor"])
def test_accumulation_steps_accepts_whole_numbers_alike(value):
    import numpy as np
    import tensorflow as tf

    convert = {2.0: float, "np.float32": np.float32, "np.int64": np.int64, "tensor": tf.constant}[value]
    ex = exercises.load(lessons.gradient_accumulation).accumulation_steps
    result = ex.check(lambda t, p, s: convert(t // (p * s.num_replicas_in_sync)))
    assert result.passed, result


def test_accumulation_steps_rule_for_fractions():
    import numpy as np

    ex = exercises.load(lessons.gradient_accumulation).accumulation_steps
    for convert in (float, np.float32):
        result = ex.check(lambda t, p, s, c=convert: c(t / (p * s.num_replicas_in_sync) + 0.5))
        assert result.status == "incorrect", result
        assert "must be a whole number" in result.message and "such as 2.0" in result.message, result
    float_tip = ex.check(lambda t, p, s: t / (p * s.num_replicas_in_sync))
    assert float_tip.passed and "`//`" in float_tip.message, float_tip
    assert "`//`" not in ex.check(reference(ex)()).message


@pytest.mark.parametrize("case", ["fn-returns-giant-int", "fn-returns-hostile", "fn-returns-str"])
@pytest.mark.parametrize("name", ["accumulation_steps", "replica_loss", "builtin_warmup_steps"])
def test_gradient_accumulation_results_are_described_safely(name, case):
    class Hostile:
        def __getattr__(self, item):
            raise RuntimeError(item)

        def __repr__(self):
            raise RuntimeError("repr")

    value = {"fn-returns-giant-int": 10**5000, "fn-returns-hostile": Hostile(), "fn-returns-str": "1"}[case]
    ex = getattr(exercises.load(lessons.gradient_accumulation), name)
    result = ex.check(lambda *args: value)
    assert result.status == "incorrect", result
    assert "checker itself failed" not in result.message


def test_replica_loss_needs_a_gradient_path():
    import numpy as np
    import tensorflow as tf

    ex = exercises.load(lessons.gradient_accumulation).replica_loss
    for no_path in (
        lambda pe, gb: float(tf.reduce_sum(pe)) / gb,
        lambda pe, gb: np.float32(np.sum(pe.numpy()) / gb),
        lambda pe, gb: tf.constant(float(tf.reduce_sum(pe)) / gb),
        lambda pe, gb: tf.stop_gradient(tf.reduce_sum(pe) / gb),
    ):
        result = ex.check(no_path)
        assert result.status == "incorrect" and "no gradient path" in result.message, result
    assert ex.check(lambda pe, gb: tf.reduce_sum(pe) / gb).passed


def _solution_returns(ex):
    lines = [line.split("#")[0].strip() for line in ex.solution_code.splitlines()]
    return [line[len("return ") :].strip() for line in lines if line.startswith("return ")]


@pytest.mark.parametrize("bank, ex", ALL, ids=IDS)
def test_no_hint_is_the_solution(bank, ex):
    squeeze = lambda text: "".join(text.replace("`", "").split())  # noqa: E731
    for expression in _solution_returns(ex):
        if expression.isidentifier():  # `return model`: no giveaway
            continue
        for hint in ex.hints:
            assert squeeze(expression) not in squeeze(hint), (ex.name, hint)


def test_pipeline_order_teaches_caching_uint8():
    """Lesson 04 §2 caches the uint8 images (4× smaller) and converts to float after the cache."""
    ex = exercises.load(lessons.data_pipeline_sharding).pipeline_order
    stub_doc = ex.stub.split('"""')[1]
    assert "uint8" in stub_doc and stub_doc.index("cache") < stub_doc.index("to_float"), stub_doc
    assert "uint8" in ex.hints[0] and "before `to_float`" in ex.hints[0], ex.hints[0]
    code = ex.solution_code
    assert code.index("ds.cache()") < code.index("data.to_float"), code


def _pipeline(tail=None, cache_float=False):
    def make_pipeline(ds, batch_size):
        import tensorflow as tf

        from course_utils import data

        ds = ds.map(data.to_float).cache() if cache_float else ds.cache().map(data.to_float)
        ds = ds.shuffle(1000).map(data.augment).batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
        return tail(ds) if tail else ds

    return make_pipeline


def test_pipeline_order_accepts_with_options_at_the_end():
    import tensorflow as tf

    options = tf.data.Options()
    options.deterministic = False
    ex = exercises.load(lessons.data_pipeline_sharding).pipeline_order
    result = ex.check(_pipeline(lambda ds: ds.with_options(options)))
    assert result.passed, result
    assert "Tip" not in result.message


def test_pipeline_order_rejects_a_float32_cache():
    """Issue 22: the question asks for the uint8 images in the cache; a float32 cache was accepted with a tip."""
    result = exercises.load(lessons.data_pipeline_sharding).pipeline_order.check(_pipeline(cache_float=True))
    assert result.status == "incorrect" and "your cache holds float32 images" in result.message, result


def test_dataset_fn_ids_out_of_range_are_one_clear_line():
    import tensorflow as tf

    ex = exercises.load(lessons.data_pipeline_sharding).dataset_fn

    def shifted(input_context):
        ds = tf.data.Dataset.range(1000).map(lambda i: i - 1)
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return ds.batch(input_context.get_per_replica_batch_size(64), drop_remainder=True)

    result = ex.check(shifted)
    assert result.status == "incorrect" and "ids outside 0–999 (e.g. -1)" in result.message, result

    def gathers(input_context):
        table = tf.range(500, dtype=tf.int64)
        ds = tf.data.Dataset.range(1000).map(lambda i: tf.gather(table, i))
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return ds.batch(input_context.get_per_replica_batch_size(64), drop_remainder=True)

    result = ex.check(gathers)
    assert result.status == "error" and "Reading the dataset from `dataset_fn(" in result.message, result
    assert "\n" not in result.message and "Traceback" not in result.message


def test_build_in_scope_takes_any_image_size_model(context):
    import keras

    def make_model(strategy):
        with strategy.scope():
            model = keras.Sequential(
                [
                    keras.Input((None, None, 3)),
                    keras.layers.Conv2D(4, 3),
                    keras.layers.GlobalAveragePooling2D(),
                    keras.layers.Dense(10),
                ]
            )
            model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    assert (
        exercises.load(lessons.tpu_initialization).build_in_scope.check(make_model, strategy=context["strategy"]).passed
    )


# -- issue 21: lesson 06's checkers ----------------------------------------------------------------


def test_epochs_that_fit_takes_integer_types_only():
    import numpy as np
    import tensorflow as tf

    ex = exercises.load(lessons.cifar10_capstone).epochs_that_fit

    def answer(convert):
        return lambda b, s, e: convert(max(1, int((b - s) // e)))

    for convert in (int, np.int64, np.int32, lambda v: tf.constant(v), lambda v: np.array(v)):
        assert ex.check(answer(convert)).passed, convert
    for convert in (float, np.float32, np.float64, lambda v: tf.constant(float(v)), lambda v: np.array(float(v))):
        result = ex.check(answer(convert))
        assert result.status == "incorrect" and "return an int" in result.message, (convert, result)


@pytest.mark.parametrize("target", [float("nan"), 0.0, -0.5, 1.0, 7.0])
def test_one_knob_refuses_a_target_that_is_not_an_accuracy_before_training(target, context, monkeypatch):
    from course_utils import capstone

    monkeypatch.setattr(capstone, "train", lambda *a, **k: pytest.fail("trained with a meaningless target"))
    ex = exercises.load(lessons.cifar10_capstone).one_knob
    result = ex.check(reference(ex)(), start=context["start"], target=target)
    assert result.status == "incorrect" and "between 0 and 1" in result.message, result


def test_one_knob_reports_a_trainer_refusal_as_the_learners_not_a_course_bug(context, monkeypatch):
    from course_utils import capstone

    def refuse(options, **kwargs):
        raise capstone.OptionsError(f"--out {options.out!r} is a file")

    monkeypatch.setattr(capstone, "train", refuse)
    ex = exercises.load(lessons.cifar10_capstone).one_knob
    result = ex.check(reference(ex)(), start=context["start"], target=0.25)
    assert result.status == "incorrect" and "the trainer stopped: --out" in result.message, result
    assert "checker itself failed" not in result.message


def test_one_knob_refuses_the_course_networks_width_on_the_baseline_before_training(context, monkeypatch):
    import dataclasses

    from course_utils import capstone

    monkeypatch.setattr(capstone, "train", lambda *a, **k: pytest.fail("trained an option that changes nothing"))
    ex = exercises.load(lessons.cifar10_capstone).one_knob
    result = ex.check(dataclasses.replace(context["start"], width=4), start=context["start"], target=0.25)
    assert result.status == "incorrect", result
    assert "The options are not valid: --width (width=4) shapes the course recipe's network" in result.message


# -- Issue 21: the scaling_out checkers under hostile answers ------------------------------------------------------

_HOSTILE = """
import json
class LoopExc(Exception):
    def __str__(self):
        while True:
            pass
class LoopLen(tuple):
    def __len__(self):
        raise LoopExc()
class BadStr(str):
    def startswith(self, *a):
        raise TypeError("boom")
class BadItem(tuple):
    def __getitem__(self, i):
        raise KeyError("learner getitem")
"""


def test_a_learner_exception_whose_message_loops_cannot_hang_the_check():
    """Seen: the checker used the learner's object, it raised an exception whose __str__ loops, and check() hung
    building its message (after the check's time bound had ended)."""
    code = (
        _HOSTILE
        + """
from course_utils import exercises, lessons
r = exercises.load(lessons.scaling_out).global_batch_and_lr.check(lambda b, c, lr, bb: LoopLen((b * c, lr * b * c / bb)))
print(r.status, "|", r.message)
"""
    )
    env = dict(os.environ, COURSE_SMOKE="1", COURSE_CHECK_TIMEOUT="3")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert time.monotonic() - start < 30 and proc.returncode == 0, proc.stderr[-1500:]
    status, message = proc.stdout.strip().splitlines()[-1].split(" | ", 1)
    assert status in ("incorrect", "error") and "course bug" not in message, message


def test_json_text_in_a_str_subclass_is_read_as_the_text_it_holds():
    """A str subclass whose methods raise once gave "the checker itself failed": its text is what TensorFlow reads."""
    namespace: dict = {}
    exec(_HOSTILE, namespace)  # noqa: S102
    answer = eval(
        "lambda a, i: BadStr(json.dumps({'cluster': {'worker': a}, 'task': {'type': 'worker', "  # noqa: S307
        "'index': i}}))",
        namespace,
    )
    assert exercises.load(lessons.scaling_out).tf_config_for.check(answer).status == "correct"


@pytest.mark.parametrize(
    "name,answer,expected",
    [
        ("global_batch_and_lr", "lambda b, c, lr, bb: BadItem((b * c, lr * b * c / bb))", "return two numbers"),
        (
            "tf_config_for",
            "lambda a, i: {'cluster': {'worker': a}, 'task': {'type': 'worker', 'index': i}, 'rpc_layer': 'bogus'}",
            "sets 'rpc_layer'",
        ),
        (
            "tf_config_for",
            "lambda a, i: {'cluster': {'worker': a}, 'task': {'type': 'worker', 'index': (len(a) - 1) if i else 0}}",
            "expected 2",
        ),
        ("global_batch_and_lr", "lambda b, c, lr, bb: (float(b * c), lr * b * c / bb)", "whole numbers"),
        ("global_batch_and_lr", "lambda b, c, lr, bb: (b * c, round(lr * b * c / bb, 2))", "expected 0.01845"),
        (
            "global_batch_and_lr",
            "lambda b, c, lr, bb: (b * c, lr * 2 ** round(__import__('math').log2(b * c / bb)))",
            "expected 0.01845",
        ),
        ("global_batch_and_lr", "lambda b, c, lr, bb: (b * c, lr * max(b * c / bb, 1))", "the base LR unchanged"),
        ("pipeline_idle_fraction", "lambda s, m: (s - 1) / (m + s - 1) if m >= s else (s - m) / s", "expected 0.6"),
    ],
)
def test_scaling_out_checkers_reject_hostile_and_subtly_wrong_answers(name, answer, expected):
    namespace: dict = {}
    exec(_HOSTILE, namespace)  # noqa: S102 - the hostile classes, as a learner's cell defines them
    result = getattr(exercises.load(lessons.scaling_out), name).check(eval(answer, namespace))  # noqa: S307
    assert result.status == "incorrect" and expected in result.message, (result.status, result.message)
    assert "course bug" not in result.message


def test_an_exception_from_the_learners_own_class_is_theirs_not_a_course_bug():
    """The checker reads an attribute of the learner's object; the learner's property raises: the verdict names the
    learner's code (it said "the checker itself failed … a course bug")."""

    class FakeNumber:
        __module__ = "numpy"

        @property
        def ndim(self):
            raise ValueError("from my class")

    result = exercises.load(lessons.scaling_out).pipeline_idle_fraction.check(lambda s, m: FakeNumber())
    assert result.status == "incorrect" and "Your code raised ValueError (from my class)" in result.message
    assert "in `ndim`" in result.message and "course bug" not in result.message


# -- hostile reviews: answers a checker accepted that are wrong, or rejected that are right --------------------------


def _relu6_tape_code(x):
    """ReLU6's gradient (Keras' ReLU(max_value=6)) as the code: 0 again from x = 6 on — the wrong layer."""
    import tensorflow as tf

    t = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(t)
        y = tf.nn.relu6(t)
    return tape.gradient(y, t).numpy() > 0


@pytest.mark.parametrize(
    "label, answer, expected",
    [
        ("ReLU6's code", lambda x: (x > 0) & (x < 6), "ReLU6"),
        ("ReLU6's gradient from a tape", _relu6_tape_code, "ReLU6"),
        ("a small threshold", lambda x: x > 1e-35, "tiny positive"),
        ("compared in float32 whatever x is", lambda x: x.astype("float32") > 0, "tiny positive"),
        ("float32 bits reinterpreted", lambda x: x.view("int32") > 0, "shape"),
    ],
)
def test_relu_code_rejects_wrong_layers_and_dtype_tricks(label, answer, expected):
    result = exercises.load(lessons.activation_memory).relu_code.check(answer)
    assert result.status == "incorrect" and expected in result.message, (label, result)


@pytest.mark.parametrize(
    "label, answer",
    [
        ("int64 0/1", lambda x: (x > 0).astype("int64")),
        ("bool × 1", lambda x: (x > 0) * 1),
        ("int32 tensor", lambda x: __import__("tensorflow").cast(x > 0, "int32")),
        ("uint8 0/1", lambda x: (x > 0).astype("uint8")),
        ("bool tensor", lambda x: __import__("tensorflow").constant(x) > 0),
    ],
)
def test_relu_code_takes_integer_0_1_as_the_prompt_allows(label, answer):
    """Lesson 07's prompt: "one unpacked 0/1 (or boolean) per element"; an int 0/1 is that (packing comes after)."""
    result = exercises.load(lessons.activation_memory).relu_code.check(answer)
    assert result.passed, (label, result)


@pytest.mark.parametrize(
    "label, answer",
    [
        ("2 decimals", lambda lr, b0, b: round(lr * b / b0, 2)),
        ("4 decimals", lambda lr, b0, b: round(lr * b / b0, 4)),
        ("4 significant digits", lambda lr, b0, b: float(f"{lr * b / b0:.4g}")),
        ("float16", lambda lr, b0, b: __import__("numpy").float16(lr * b / b0)),
    ],
)
def test_scaled_learning_rate_rejects_a_rounded_rate(label, answer):
    result = exercises.load(lessons.cifar10_capstone).scaled_learning_rate.check(answer)
    assert result.status == "incorrect" and "do not round" in result.message, (label, result)


def test_scaled_learning_rate_takes_float32_arithmetic():
    import numpy as np
    import tensorflow as tf

    ex = exercises.load(lessons.cifar10_capstone).scaled_learning_rate
    assert ex.check(lambda lr, b0, b: np.float32(lr) * np.float32(b) / np.float32(b0)).passed
    assert ex.check(lambda lr, b0, b: tf.constant(lr, tf.float32) * b / b0).passed
    assert ex.check(lambda lr, b0, b: lr / b0 * b).passed


def test_global_batch_and_lr_takes_a_namedtuple():
    import collections
    import typing

    ex = exercises.load(lessons.scaling_out).global_batch_and_lr
    Pair = collections.namedtuple("Pair", "global_batch lr")
    assert ex.check(lambda b, c, lr, bb: Pair(b * c, lr * b * c / bb)).passed
    Swapped = collections.namedtuple("Swapped", "lr global_batch")  # the right fields, in another order
    assert ex.check(lambda b, c, lr, bb: Swapped(lr=lr * b * c / bb, global_batch=b * c)).passed

    class Typed(typing.NamedTuple):
        global_batch_size: int
        learning_rate: float

    assert ex.check(lambda b, c, lr, bb: Typed(b * c, lr * b * c / bb)).passed
    Other = collections.namedtuple("Other", "a b")  # no names to go by: read in order, as a plain tuple
    assert ex.check(lambda b, c, lr, bb: Other(b * c, lr * b * c / bb)).passed
    wrong = ex.check(lambda b, c, lr, bb: Other(lr * b * c / bb, b * c))
    assert wrong.status == "incorrect" and "global batch" in wrong.message, wrong


def _pipeline_tiny_shuffle(ds, batch_size):
    import tensorflow as tf

    from course_utils import data

    ds = ds.cache().shuffle(2).map(data.to_float).map(data.augment)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _pipeline_whole_shuffle(ds, batch_size):
    import tensorflow as tf

    from course_utils import data

    ds = ds.cache()
    ds = ds.shuffle(ds.cardinality()).map(data.to_float).map(data.augment)  # the whole dataset, as a tensor
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def test_pipeline_order_rejects_a_shuffle_buffer_too_small_to_shuffle():
    ex = exercises.load(lessons.data_pipeline_sharding).pipeline_order
    result = ex.check(_pipeline_tiny_shuffle)
    assert result.status == "incorrect" and "shuffle buffer" in result.message, result
    assert "2 examples" in result.message, result
    assert ex.check(_pipeline_whole_shuffle).passed


def _step_by_hand(with_lr: bool):
    """A step that scales, unscales, skips an overflow and halves the scale itself, and never calls
    `optimizer.apply` (the bank's wrong example, exercise_answers.mixed_precision._step_by_hand); without the learning rate it
    is right only when the rate is 1."""
    from exercise_answers import mixed_precision as bank

    if with_lr:
        return bank._step_by_hand

    def step(model, optimizer, loss_fn, x, y):
        rate = optimizer.learning_rate
        optimizer.learning_rate = 1.0
        try:
            return bank._step_by_hand(model, optimizer, loss_fn, x, y)
        finally:
            optimizer.learning_rate = rate

    return step


@pytest.mark.parametrize("step", [_step_by_hand(True), _step_by_hand(False)], ids=["with the LR", "without the LR"])
def test_loss_scaled_step_rejects_a_step_that_never_calls_the_optimizer(step):
    result = exercises.load(lessons.mixed_precision).loss_scaled_step.check(step)
    assert result.status == "incorrect" and "optimizer.apply" in result.message, result


def test_loss_scaled_step_takes_apply_gradients():
    import tensorflow as tf

    def step(model, optimizer, loss_fn, x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    assert exercises.load(lessons.mixed_precision).loss_scaled_step.check(step).passed


@pytest.mark.parametrize(
    "label, answer",
    [
        ("+ 0.25", lambda b, s, e: max(1, int((b - s) / e + 0.25))),
        ("+ 0.1", lambda b, s, e: max(1, int((b - s) / e + 0.1))),
    ],
)
def test_epochs_that_fit_rejects_rounding_up_from_a_large_fraction(label, answer):
    result = exercises.load(lessons.cifar10_capstone).epochs_that_fit.check(answer)
    assert result.status == "incorrect" and "past the" in result.message and "budget" in result.message, (label, result)
