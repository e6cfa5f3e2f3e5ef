"""The exercises' test answers, by exercise name: a reference answer that must pass and typical wrong answers that
must fail with the words given, for every bank (one module per lesson). No learner reads them: they are the
course's tests, not its package."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

ANSWERS: dict[str, tuple[Callable[[], Any], tuple]] = {}
for _module in pkgutil.iter_modules(__path__):
    for _name, _answers in importlib.import_module(f"{__name__}.{_module.name}").ANSWERS.items():
        assert _name not in ANSWERS, f"two banks have an exercise named {_name!r}"
        ANSWERS[_name] = _answers


def _answers(ex) -> tuple:
    try:
        return ANSWERS[ex.name]
    except KeyError:
        raise LookupError(
            f"no test answers for the exercise {ex.name!r}: add its reference and wrong answers to ANSWERS in "
            "tests/exercise_answers/<its lesson's package name>.py"
        ) from None


def reference(ex) -> Callable[[], Any]:
    """A zero-argument callable returning a correct answer to ``ex``."""
    return _answers(ex)[0]


def wrong_examples(ex) -> tuple:
    """``(label, zero-argument callable returning a typical wrong answer, words its message must contain)``."""
    return _answers(ex)[1]
