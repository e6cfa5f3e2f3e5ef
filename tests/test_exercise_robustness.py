"""Every exercise of every bank, fed malformed answers: nothing escapes, nothing hangs, nothing passes.

A table of 43 malformed answers (values, and functions that misbehave: wrong arity, raise, exit, loop,
sleep, return junk or a dataset that never ends) goes through the public ``check()`` of each exercise
that ``exercises.load()`` gives for each registered bank. For each pair the test asserts:

* ``check()`` returns a :class:`CheckResult` (no exception of any kind escapes, SystemExit included);
* it returns within the check's time bound plus a margin (the hang cases run under a short bound);
* the result is not a pass, and its message is one line without terminal escape codes.

A bank that accepts one of these answers is a bank bug: the case is marked xfail in ``KNOWN_ACCEPTED``
with the bank and exercise named, so the bug stays visible until the bank is fixed (then the case
XPASSes: delete its entry). "The checker itself failed" is not a pass either, but it is a bank bug too;
``test_no_checker_failure`` lists those separately, with their own known cases.
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np
import pytest

from course_utils import exercises, lessons

HANG_TIMEOUT_S = 0.5  # the bound for the cases that loop or sleep (they cost this much each)
OTHER_TIMEOUT_S = 20.0  # the bound for the rest: generous, so slow checker work is not cut short
MARGIN_S = 10.0  # a check may overrun its bound by one uninterruptible TensorFlow call


class _HostileObject:
    """repr/str/eq/bool/len/iter/getattr all raise: describe() and the checkers must cope."""

    def __repr__(self):
        raise RuntimeError("repr exploded")

    __str__ = __repr__

    def __eq__(self, other):
        raise RuntimeError("eq exploded")

    __hash__ = object.__hash__

    def __bool__(self):
        raise RuntimeError("bool exploded")

    def __len__(self):
        raise RuntimeError("len exploded")

    def __iter__(self):
        raise RuntimeError("iter exploded")

    def __getattr__(self, name):
        raise RuntimeError(f"getattr {name} exploded")


class _BadFloat(float):
    def __repr__(self):
        raise RuntimeError("float repr exploded")


def _nested(depth: int) -> list:
    outer = inner = []
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    return outer


def _self_referencing() -> list:
    items: list = []
    items.append(items)
    return items


_BIG_LIST = None


def _big_list() -> list:
    global _BIG_LIST
    if _BIG_LIST is None:
        _BIG_LIST = [0] * 5_000_000
    return _BIG_LIST


def _loops_forever(*args, **kwargs):
    while True:
        pass


def _sleeps(*args, **kwargs):
    time.sleep(3600)


def _exits(*args, **kwargs):
    sys.exit(3)


def _interrupts(*args, **kwargs):
    raise KeyboardInterrupt


def _raises_ansi(*args, **kwargs):
    raise ValueError("\x1b[1m\x1b[31mKeras-style coloured\x1b[0m error\nwith a second line")


def _raises_base_exception(*args, **kwargs):
    raise BaseException("a bare BaseException")


def _returns(value):
    def fn(*args, **kwargs):
        return value() if callable(value) else value

    return fn


def _repeat_dataset(*args, **kwargs):
    import tensorflow as tf

    x = np.zeros((4, 32, 32, 3), np.uint8)
    return tf.data.Dataset.from_tensor_slices((x, np.arange(4, dtype=np.int64))).repeat()


def _generator(*args, **kwargs):
    yield 1


def _identity(*args, **kwargs):
    return args[0] if args else 0


def _kw_only(*, x):
    return x


def _tensor():
    import tensorflow as tf

    return tf.constant([1, 2])


# (id, zero-arg factory of the answer, hangs?) — a factory so each check gets a fresh object.
MALFORMED = [
    ("none", lambda: None, False),
    ("zero", lambda: 0, False),
    ("negative", lambda: -1, False),
    ("seven", lambda: 7, False),
    ("huge-int", lambda: 10**400, False),
    ("giant-int", lambda: 10**5000, False),
    ("nan", lambda: math.nan, False),
    ("inf", lambda: math.inf, False),
    ("true", lambda: True, False),
    ("empty-str", lambda: "", False),
    ("str-1", lambda: "1", False),
    ("str-text", lambda: "a string", False),
    ("bytes-1", lambda: b"1", False),
    ("empty-list", lambda: [], False),
    ("list", lambda: [1, 2, 3], False),
    ("nested-list", lambda: _nested(5000), False),
    ("self-referencing-list", _self_referencing, False),
    ("5M-list", _big_list, False),
    ("dict", lambda: {"answer": 1}, False),
    ("set", lambda: {1, 2}, False),
    ("tuple-of-3", lambda: (1, 2, 3), False),
    ("numpy-array", lambda: np.array([1, 2, 3]), False),
    ("numpy-float", lambda: np.float64(-3.5), False),
    ("tensor", _tensor, False),
    ("hostile-object", _HostileObject, False),
    ("bad-repr-float", lambda: _BadFloat(2.5), False),
    ("a-class", lambda: int, False),
    ("fn-no-args", lambda: lambda: 1, False),
    ("fn-seven-args", lambda: lambda a, b, c, d, e, f, g: 1, False),
    ("fn-keyword-only", lambda: _kw_only, False),
    ("fn-raises-ansi", lambda: _raises_ansi, False),
    ("fn-sys-exit", lambda: _exits, False),
    ("fn-keyboard-interrupt", lambda: _interrupts, False),
    ("fn-base-exception", lambda: _raises_base_exception, False),
    ("fn-returns-giant-int", lambda: _returns(lambda: 10**5000), False),
    ("fn-returns-hostile", lambda: _returns(_HostileObject), False),
    ("fn-returns-str", lambda: _returns("1"), False),
    ("fn-returns-repeat-dataset", lambda: _repeat_dataset, True),
    ("fn-generator", lambda: _generator, False),
    ("fn-identity", lambda: _identity, False),
    ("builtin-max", lambda: max, False),
    ("fn-loops-forever", lambda: _loops_forever, True),
    ("fn-sleeps", lambda: _sleeps, True),
]

# Wrong answers a bank accepts today: (bank, exercise, case id) -> reason. Bank bugs, to fix in the bank.
# Empty: every bank rejects every malformed answer (issue 9 §1). A new entry needs the bug named.
KNOWN_ACCEPTED: dict[tuple[str, str, str], str] = {}

# Malformed answers that make a checker crash ("the checker itself failed"): bank bugs as well. Empty too.
KNOWN_CHECKER_FAILURES: dict[tuple[str, str, str], str] = {}

ALL = [(lesson.name, ex.name) for lesson in lessons.LESSONS for ex in exercises.load(lesson.module)]


def _params(known: dict, verb: str):
    params = []
    for bank, name in ALL:
        for case_id, make, hangs in MALFORMED:
            key = (bank, name, case_id)
            marks = ()
            if key in known:
                marks = (
                    pytest.mark.xfail(reason=f"bank {bank!r}, exercise {name!r} {verb}: {known[key]}", strict=False),
                )
            params.append(pytest.param(bank, name, make, hangs, marks=marks, id=f"{bank}.{name}-{case_id}"))
    return params


def test_the_table_is_big_enough():
    assert len(MALFORMED) >= 30
    assert len({case_id for case_id, _, _ in MALFORMED}) == len(MALFORMED)
    assert len(ALL) >= 14 and {bank for bank, _ in ALL} >= {"tpu_initialization", "data_pipeline_sharding"}


@pytest.fixture(scope="module")
def context():
    import tensorflow as tf

    from exercise_answers import cifar10_capstone as capstone_bank

    return {
        "strategy": tf.distribute.OneDeviceStrategy("/cpu:0"),
        "start": capstone_bank.example_start(),
        "target": capstone_bank.EXAMPLE_TARGET,
    }


_RESULTS: dict = {}


def _run(bank, name, make, hangs, context, monkeypatch):
    """Run one check once (the two tests below share the result)."""
    key = (bank, name, make)
    if key not in _RESULTS:
        ex = getattr(exercises.load(getattr(lessons, bank)), name)
        bound = HANG_TIMEOUT_S if hangs else OTHER_TIMEOUT_S
        monkeypatch.setenv("COURSE_CHECK_TIMEOUT", str(bound))
        for _attempt in range(2):
            start = time.monotonic()
            try:
                result = ex.check(make(), **{k: context[k] for k in ex.needs})
            except BaseException as exc:  # noqa: BLE001 - this is what the test is about
                pytest.fail(f"check() let {type(exc).__name__} escape: {exc!r}"[:500])
            elapsed = time.monotonic() - start
            if elapsed < bound + MARGIN_S:
                break
            # Over the limit once: a check that is not bounded is over it again. Two full runs each saw one 35 s
            # stall of a check that takes 0.2 s (never alone, never twice in a row; the cause was not found).
        _RESULTS[key] = (result, elapsed, bound)
    return _RESULTS[key]


@pytest.mark.parametrize("bank, name, make, hangs", _params(KNOWN_ACCEPTED, "accepts this malformed answer"))
def test_malformed_answer_is_not_accepted(bank, name, make, hangs, context, monkeypatch):
    result, elapsed, bound = _run(bank, name, make, hangs, context, monkeypatch)
    assert isinstance(result, exercises.CheckResult)
    assert elapsed < bound + MARGIN_S, f"took {elapsed:.1f} s under a {bound} s bound: {result}"
    assert "\n" not in result.message and "\x1b" not in result.message, result
    assert "Traceback" not in result.message, result
    assert result.status != "correct" and not result, result


@pytest.mark.parametrize("bank, name, make, hangs", _params(KNOWN_CHECKER_FAILURES, "crashes on this answer"))
def test_no_checker_failure(bank, name, make, hangs, context, monkeypatch):
    result, _, _ = _run(bank, name, make, hangs, context, monkeypatch)
    assert "checker itself failed" not in result.message, result
