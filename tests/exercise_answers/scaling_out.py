"""`course_utils.lessons.scaling_out.exercises`: each exercise's reference answer and typical wrong
answers (each with words its message must contain). Only the tests read them, so they live here."""

from __future__ import annotations

import json
import math

from course_utils.lessons.scaling_out.exercises import _expected_config

ANSWERS = {
    "tf_config_for": (
        lambda: lambda a, i: json.dumps(_expected_config(a, i)),
        (
            (
                "plural job",
                lambda: lambda a, i: {"cluster": {"workers": a}, "task": {"type": "worker", "index": i}},
                "singular",
            ),
            (
                "index as text",
                lambda: lambda a, i: {"cluster": {"worker": a}, "task": {"type": "worker", "index": str(i)}},
                "not text",
            ),
            (
                "always 0",
                lambda: lambda a, i: {"cluster": {"worker": a}, "task": {"type": "worker", "index": 0}},
                "expected 1",
            ),
            (
                "own address only",
                lambda: lambda a, i: {"cluster": {"worker": [a[i]]}, "task": {"type": "worker", "index": 0}},
                "every worker",
            ),
        ),
    ),
    "global_batch_and_lr": (
        lambda: lambda b, c, lr, bb: (b * c, lr * b * c / bb),
        (
            ("per-core batch", lambda: lambda b, c, lr, bb: (b, lr * b * c / bb), "one core's share"),
            ("LR × cores", lambda: lambda b, c, lr, bb: (b * c, lr * c), "base_batch"),
            ("sqrt", lambda: lambda b, c, lr, bb: (b * c, lr * math.sqrt(b * c / bb)), "square-root"),
        ),
    ),
    "pipeline_idle_fraction": (
        lambda: lambda s, m: (s - 1) / (m + s - 1),
        (
            ("busy", lambda: lambda s, m: m / (m + s - 1), "busy fraction"),
            ("over M", lambda: lambda s, m: (s - 1) / m, "slots of the whole"),
            ("naive", lambda: lambda s, m: (s - 1) / s, "naive split"),
        ),
    ),
}
