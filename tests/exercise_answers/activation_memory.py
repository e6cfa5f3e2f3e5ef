"""`course_utils.lessons.activation_memory.exercises`: each exercise's reference answer and typical wrong
answers (each with words its message must contain). Only the tests read them, so they live here."""

from __future__ import annotations

import numpy as np

from course_utils.lessons.activation_memory.exercises import _best, _expected_batch


class _Unreadable(list):
    """A wrong answer for the tests: a list whose items cannot be read (its iteration raises)."""

    def __iter__(self):
        raise RuntimeError("no items for you")


class _Unfloatable(float):
    """A wrong answer for the tests: a number whose float() raises."""

    def __float__(self):
        raise RuntimeError("no float for you")


def _greedy_by_saving(saved, cost, target):
    """A typical wrong answer: the largest savings first until the target is met."""
    chosen, total = [], 0
    for i in sorted(range(len(saved)), key=lambda i: -saved[i]):
        if total >= target:
            break
        chosen.append(i)
        total += saved[i]
    return chosen


ANSWERS = {
    "relu_code": (
        lambda: lambda x: x > 0,
        (
            ("keeps x", lambda: lambda x: x, "x itself"),
            (">= 0", lambda: lambda x: x >= 0, "exactly x = 0"),
            ("inverted", lambda: lambda x: x <= 0, "Upside down"),
            ("floats", lambda: lambda x: (x > 0).astype(np.float32), "one bit"),
            ("ReLU6's code", lambda: lambda x: (x > 0) & (x < 6), "ReLU6"),
            ("a threshold above 0", lambda: lambda x: x > 1e-35, "tiny positive"),
            ("compared in float32", lambda: lambda x: x.astype(np.float32) > 0, "tiny positive"),
            ("masked", lambda: lambda x: np.ma.masked_array(x > 0), "masked array"),
        ),
    ),
    "blocks_to_recompute": (
        lambda: lambda s, c, t: list(_best(s, c, t)[1]),
        (
            ("biggest first", lambda: _greedy_by_saving, "cheapest"),
            ("everything", lambda: lambda s, c, t: list(range(len(s))), "reaches the target for"),
            ("nothing", lambda: lambda s, c, t: [], "short of the target"),
            ("a huge range", lambda: lambda s, c, t: range(10**12), "more indices than blocks"),
            ("a list that cannot be read", lambda: lambda s, c, t: _Unreadable([0, 1]), "could not be read"),
        ),
    ),
    "largest_batch": (
        lambda: lambda p1, p2, b1, b2, m: _expected_batch(p1, p2, b1, b2, m),
        (
            ("peak per example", lambda: lambda p1, p2, b1, b2, m: int(m // (p2 / b2)), "fixed part"),
            (
                "no floor",
                lambda: lambda p1, p2, b1, b2, m: (m - (p1 - b1 * (p2 - p1) / (b2 - b1))) / ((p2 - p1) / (b2 - b1)),
                "round down",
            ),
            (
                "a number that cannot be read",
                lambda: lambda p1, p2, b1, b2, m: _Unfloatable(1.0),
                "could not be read as a number",
            ),
        ),
    ),
}
