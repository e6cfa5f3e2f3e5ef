"""`course_utils.lessons.cifar10_capstone.exercises`: each exercise's reference answer and typical wrong
answers (each with words its message must contain). Only the tests read them, so they live here."""

from __future__ import annotations

import dataclasses
import math

from course_utils.lessons.cifar10_capstone.exercises import start_options

EXAMPLE_TARGET = 0.25  # for example_start(): chance is 0.10


def example_start():
    """The start the course's own tests use: synthetic data, small splits, a 10 s budget (enough epochs for the
    tutorial's CNN to learn even on a busy machine). Its folder is this process's own: two test processes checking
    at once (pytest-xdist) wrote the same weights file, and HDF5's lock stopped one of them."""
    import os
    import tempfile

    return start_options(
        10.0,
        out=os.path.join(tempfile.gettempdir(), f"course_capstone_exercise-{os.getpid()}"),
        data="synthetic",
        train_examples=512,
        test_examples=256,
    )


def _changed(**change):
    return lambda: dataclasses.replace(example_start(), **change)


ANSWERS = {
    "scaled_learning_rate": (
        lambda: lambda lr, b0, b: lr * b / b0,
        (
            ("inverse", lambda: lambda lr, b0, b: lr * b0 / b, "Upside down"),
            ("sqrt", lambda: lambda lr, b0, b: lr * (b / b0) ** 0.5, "square-root"),
            ("constant", lambda: lambda lr, b0, b: lr, "did not change"),
            ("rounded", lambda: lambda lr, b0, b: round(lr * b / b0, 3), "do not round"),
        ),
    ),
    "epochs_that_fit": (
        lambda: lambda b, s, e: max(1, int((b - s) // e)),
        (
            ("no setup", lambda: lambda b, s, e: max(1, int(b // e)), "setup time"),
            ("no minimum", lambda: lambda b, s, e: int((b - s) // e), "at least 1"),
            ("float", lambda: lambda b, s, e: max(1.0, (b - s) // e), "return an int"),
            ("ceil", lambda: lambda b, s, e: max(1, math.ceil((b - s) / e)), "rounding up"),
            ("nearest", lambda: lambda b, s, e: max(1, round((b - s) / e)), "rounding to the nearest"),
            ("up from .75", lambda: lambda b, s, e: max(1, int((b - s) / e + 0.25)), "past the 100 s budget"),
            (
                "numpy float",
                lambda: lambda b, s, e: __import__("numpy").float32(max(1, (b - s) // e)),
                "return an int",
            ),
        ),
    ),
    "one_knob": (
        _changed(batch_size=64),
        (
            ("two knobs", _changed(batch_size=64, label_smoothing=0.1), "change exactly one"),
            ("more time", _changed(time_budget=60.0), "Keep the budget"),
            ("unchanged", example_start, "unchanged"),
            ("not options", lambda: {"batch_size": 128}, "Expected capstone.Options"),
            ("smaller test split", _changed(test_examples=32), "part of the experiment"),
            ("another seed", _changed(seed=7), "part of the experiment"),
            ("synthetic data", _changed(data="npz:x.npz"), "part of the experiment"),
            ("no folder", _changed(out=""), "should name the folder"),
        ),
    ),
}
