"""Exercise bank "capstone" (lesson 06: the CIFAR-10 capstone under a time budget)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ...exercises import Exercise, Incorrect, call_learner, describe, ExerciseBank, require_callable, require_number
from ... import capstone

# -- 1. scaled_learning_rate ------------------------------------------------------------------

# The last three rates need many digits (0.0666…, 0.1171875, 0.0260416…): a rate rounded to a few decimals or
# significant digits, or computed in float16/bfloat16, is off by more than the tolerance there. The tolerance, a
# millionth of the rate, takes any float32 or float64 arithmetic (float32 keeps about 7 digits).
_LR_CASES = (
    (0.2, 256, 512),
    (0.2, 256, 128),
    (0.1, 128, 1024),
    (0.4, 512, 64),
    (0.05, 64, 64),
    (0.1, 384, 256),
    (0.03, 256, 1000),
    (0.2, 768, 100),
)
_LR_REL_TOL = 1e-6


def _check_scaled_learning_rate(answer: Any) -> str:
    fn = require_callable(answer, "scaled_learning_rate(base_lr, base_batch, global_batch)", arity=3)
    for base_lr, base_batch, batch in _LR_CASES:
        got = call_learner(
            fn, base_lr, base_batch, batch, shown_as=f"scaled_learning_rate({base_lr}, {base_batch}, {batch})"
        )
        value = require_number(got, "a learning rate (a number)")
        expected = base_lr * batch / base_batch
        if math.isclose(value, expected, rel_tol=_LR_REL_TOL):
            continue
        quote = f"scaled_learning_rate({base_lr}, {base_batch}, {batch}) returned {value:.4g}, expected {expected:.4g}"
        if math.isclose(value, base_lr * base_batch / batch, rel_tol=_LR_REL_TOL):
            raise Incorrect(f"Upside down: {quote}. A bigger batch gets a bigger learning rate.")
        if math.isclose(value, base_lr * math.sqrt(batch / base_batch), rel_tol=_LR_REL_TOL):
            raise Incorrect(
                f"That is the square-root rule (used with Adam-type optimizers): {quote}. "
                "§1 uses the linear rule for SGD."
            )
        if math.isclose(value, base_lr, rel_tol=_LR_REL_TOL):
            raise Incorrect(f"The learning rate did not change with the batch: {quote}.")
        rounded = value != 0 and (
            any(value == round(expected, k) for k in range(1, 8))
            or any(value == float(f"{expected:.{k}g}") for k in range(1, 8))
        )
        if rounded or math.isclose(value, expected, rel_tol=0.01):
            shown = describe(got) if type(got) in (int, float) else f"{value!r} ({describe(got)})"
            raise Incorrect(
                f"Close, but not equal: scaled_learning_rate({base_lr}, {base_batch}, {batch}) returned "
                f"{shown}, expected {expected!r}. Return the exact product: do not "
                "round the rate (round only when you print it), and compute in Python floats, not "
                "float16/bfloat16 (they keep 3–4 digits)."
            )
        raise Incorrect(f"Not quite: {quote}. Scale base_lr by global_batch / base_batch.")
    return (
        "Linear scaling: twice the batch, twice the step — with a warm-up, and only up to about a thousand "
        "examples per update for SGD."
    )


# -- 2. epochs_that_fit -----------------------------------------------------------------------

# (budget, setup, epoch, expected). 100/28 = 3.57 and 90/16 = 5.63 catch rounding to the nearest (18.5 alone does
# not: Python's round() goes to the even 18); 110/11 and 100/25 are exact; 98/10 = 9.8 and 99.95/10 = 9.995 catch
# rounding up from a large fraction (`int(x + 0.25)`, `int(x + 0.1)`: 10 epochs end past the budget).
_FIT_CASES = (
    (120, 10, 11, 10),
    (120, 10, 10, 11),
    (600, 45, 30, 18),
    (60, 20, 50, 1),
    (30, 40, 5, 1),
    (100, 0, 100, 1),
    (100, 0, 25, 4),
    (100, 0, 28, 3),
    (96, 6, 16, 5),
    (100, 2, 10, 9),
    (100.0, 0.05, 10.0, 9),
)


def _is_whole_type(value: Any) -> bool:
    """An integer type: Python int (not bool), numpy integer, or a 0-d integer array/tensor. Floats are not, even
    when their value is whole: the trainer counts epochs in ints."""
    import numbers

    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return False
    if isinstance(value, numbers.Integral):
        return True
    dtype = getattr(value, "dtype", None)
    return bool(getattr(dtype, "is_integer", False)) or getattr(dtype, "kind", None) in ("i", "u")


def _check_epochs_that_fit(answer: Any) -> str:
    fn = require_callable(answer, "epochs_that_fit(budget_s, setup_s, epoch_s)", arity=3)
    for budget, setup, epoch, expected in _FIT_CASES:
        got = call_learner(fn, budget, setup, epoch, shown_as=f"epochs_that_fit({budget}, {setup}, {epoch})")
        value = require_number(got, "a whole number of epochs")
        if value == expected and float(value).is_integer():
            if not _is_whole_type(got):
                raise Incorrect(
                    f"epochs_that_fit({budget}, {setup}, {epoch}) returned {describe(got)}: epochs are "
                    "whole, return an int (`int(...)`; `//` on floats still gives a float)."
                )
            continue
        quote = f"epochs_that_fit({budget}, {setup}, {epoch}) returned {describe(got)}, expected {expected}"
        exact = (budget - setup) / epoch
        if value == round(exact) and value > expected and exact % 1 < 0.75:
            raise Incorrect(
                f"{quote}: rounding to the nearest overruns the budget when the fraction is over a half; "
                "round down (`//`)."
            )
        if expected == 1 and value < 1:
            raise Incorrect(f"{quote}: when not even one epoch fits, the run still trains one (at least 1).")
        if math.isclose(value, exact) and not float(value).is_integer():
            raise Incorrect(f"{quote}: round down to whole epochs (`//`): a started epoch runs to its end.")
        if value == budget // epoch and setup and value != math.ceil(exact):
            raise Incorrect(f"{quote}: the setup time comes out of the budget first.")
        if value > expected >= 1 and float(value).is_integer() and setup + value * epoch > budget:
            how = "rounding up" if value == math.ceil(exact) else "that"
            raise Incorrect(
                f"{quote}: {how} overruns the budget — {value:g} epochs end at {setup + value * epoch:g} s, "
                f"past the {budget:g} s budget ({exact:.4g} epochs fit). A started epoch runs to its end: "
                "round down (`//`), whatever the fraction."
            )
        raise Incorrect(f"Not quite: {quote}. (budget − setup) // epoch, and at least 1.")
    return (
        "Whole epochs after the setup, at least one: the trainer does this with the step time it measures in its "
        "warm-up (or, where start-up left no room for one, in its first epoch), then stretches the learning-rate "
        "schedule over exactly those epochs."
    )


# -- 3. one_knob ------------------------------------------------------------------------------

# The knobs: the recipe's options. Everything else either may differ freely (where the run writes, how much it prints)
# or must stay as `start` has it: the data, the split sizes, the seed and the budget are the experiment, not the
# recipe (a smaller test split or another seed can reach a target without a better recipe).
RECIPE_OPTIONS = (
    "recipe",
    "batch_size",
    "policy",
    "jit",
    "accumulate",
    "steps_per_execution",
    "augment",
    "label_smoothing",
    "schedule",
    "tta",
    "ema",
)
_FREE = ("out", "verbose", "resume", "overwrite", "tensorboard")
_FIXED = ("data", "train_examples", "test_examples", "validation_examples", "seed", "cpu_replicas")
# of the baseline recipe's validation accuracy with its own batch, same budget (the notebook's §2 run). Runs are
# compared on the validation split: choosing options by the test split would make its figure optimistic.
TARGET_FRACTION = 0.9


def start_options(time_budget: float, out: str, **overrides):
    """The exercise's deliberately poor start: the tutorial's recipe with 1024 examples per update."""
    return capstone.Options(recipe="baseline", time_budget=time_budget, batch_size=1024, out=out, **overrides)


def target_accuracy(reference_accuracy: float) -> float:
    """The exercise's target: 90% of the validation accuracy the same recipe reached with its own settings in the
    same budget."""
    return TARGET_FRACTION * float(reference_accuracy)


def _training_time(context: dict) -> float:
    """The check trains once: its budget, plus set-up and evaluation, plus a generous margin."""
    try:
        budget = float(getattr(context.get("start"), "time_budget", 0) or 0)
    except Exception:  # noqa: BLE001 - a malformed `start` is reported by the checker itself
        budget = 0.0
    return 2 * budget + 120 if 0 < budget < 86_400 else 0.0


def _check_one_knob(answer: Any, start: Any, target: Any) -> str:
    if not isinstance(start, capstone.Options):
        raise Incorrect(f"`start` should be the capstone.Options from the cell, got {describe(start)}.")
    target = require_number(target, "the target accuracy (a number between 0 and 1)")
    if not (0 < target < 1):  # NaN fails this too
        raise Incorrect(
            f"`target` is {describe(target)}: it should be an accuracy between 0 and 1 (the cell computes "
            "it from §2's run; run that cell again)."
        )
    if not isinstance(answer, capstone.Options):
        raise Incorrect(
            f"Expected capstone.Options, got {describe(answer)}: write "
            "`my_options = dataclasses.replace(start, <option>=<value>)`."
        )
    changed = [
        f.name
        for f in dataclasses.fields(capstone.Options)
        if f.name not in _FREE and getattr(answer, f.name) != getattr(start, f.name)
    ]
    if "time_budget" in changed or "epochs" in changed:
        raise Incorrect(
            f"Keep the budget: the exercise is to do better in the same {start.time_budget:g} s "
            "(`time_budget` unchanged, `epochs` not set)."
        )
    fixed = [name for name in changed if name in _FIXED]
    if fixed:
        raise Incorrect(
            f"`{fixed[0]}` is part of the experiment, not of the recipe: keep it as `start` has it "
            f"({describe(getattr(start, fixed[0]))}) and change one of the recipe's options "
            f"({', '.join(RECIPE_OPTIONS)})."
        )
    if not isinstance(answer.out, str) or not answer.out.strip():
        raise Incorrect(
            f"`out` is {describe(answer.out)}: it should name the folder the run writes to; keep `start`'s."
        )
    if not changed:
        raise Incorrect("These are the start options unchanged; change one option.")
    if len(changed) > 1:
        raise Incorrect(
            f"You changed {len(changed)} options ({', '.join(changed)}); change exactly one, so the "
            "run shows what that one is worth."
        )
    try:
        # each check trains afresh: in the exercise's own folder it replaces what the previous check left there (the
        # trainer refuses a folder holding a run unless told); any other folder the answer names is left as the
        # trainer's rules have it, so a check never overwrites another run's results
        fresh = answer.out == start.out
        run_options = dataclasses.replace(answer, verbose=-1, resume=False, **({"overwrite": True} if fresh else {}))
        capstone.validate(run_options)
    except capstone.OptionsError as err:
        raise Incorrect(f"The options are not valid: {err}") from None
    knob = changed[0]
    try:
        result = capstone.train(run_options)
    except (capstone.OptionsError, OSError) as err:  # the learner's options or folder, not the course
        raise Incorrect(f"With {knob}={describe(getattr(answer, knob))} the trainer stopped: {err}") from None
    summary = capstone.load_result(run_options.out)["summary"]
    accuracy = float(summary["validation_accuracy"])
    if summary.get("options", {}).get(knob) != result.summary.get("options", {}).get(knob):
        raise Incorrect(f"summary.json in {run_options.out!r} does not match the run just made; run the check again.")
    if accuracy < target:
        raise Incorrect(
            f"With {knob}={describe(getattr(answer, knob))} the run reached {accuracy:.1%} validation "
            f"accuracy in "
            f"{summary['wall_time_s']:.0f} s ({summary['epochs']} epochs), below the target "
            f"{target:.1%}. Try another option, or another value."
        )
    why = (
        " With batch 1024 an epoch of a small data set is a handful of updates; a budget buys updates, not epochs."
        if knob == "batch_size"
        else ""
    )
    return (
        f"{knob}={describe(getattr(answer, knob))}: {accuracy:.1%} validation accuracy in "
        f"{summary['wall_time_s']:.0f} s (target {target:.1%}; test accuracy {summary['test_accuracy']:.1%}).{why}"
    )


EXERCISES = ExerciseBank(
    "cifar10_capstone",
    [
        Exercise(
            name="scaled_learning_rate",
            question="Write `scaled_learning_rate(base_lr, base_batch, global_batch)` by the linear scaling rule.",
            checker=_check_scaled_learning_rate,
            answer_name="scaled_learning_rate",
            hints=(
                "The learning rate grows in proportion to the global batch.",
                "How many times larger than base_batch is global_batch? Multiply base_lr by that.",
            ),
            solution_code='''\
def scaled_learning_rate(base_lr, base_batch, global_batch):
    """The peak learning rate for global_batch, by the linear scaling rule."""
    return base_lr * global_batch / base_batch
''',
            stub='''\
def scaled_learning_rate(base_lr, base_batch, global_batch):
    """The peak learning rate for global_batch, by the linear scaling rule."""
    ...  # your code here
''',
        ),
        Exercise(
            name="epochs_that_fit",
            question=(
                "Write `epochs_that_fit(budget_s, setup_s, epoch_s)`: the most whole epochs that end within "
                "the budget after setup, at least 1."
            ),
            checker=_check_epochs_that_fit,
            answer_name="epochs_that_fit",
            hints=(
                "Subtract the setup from the budget first; a started epoch runs to its end.",
                "Round the number of epochs down, then make sure it is at least 1.",
            ),
            solution_code='''\
def epochs_that_fit(budget_s, setup_s, epoch_s):
    """Whole epochs that fit in the budget after setup; at least 1."""
    return max(1, int((budget_s - setup_s) // epoch_s))
''',
            stub='''\
def epochs_that_fit(budget_s, setup_s, epoch_s):
    """Whole epochs that fit in the budget after setup; at least 1."""
    ...  # your code here
''',
        ),
        Exercise(
            name="one_knob",
            question=(
                "Change ONE option of `start` so the run reaches `target` validation accuracy in the same "
                "budget; the checker trains with your options and reads summary.json."
            ),
            checker=_check_one_knob,
            answer_name="my_options",
            needs=("start", "target"),
            min_time_s=_training_time,
            hints=(
                "Look at what `start` sets that the recipe's default does not, and at §1: what does a large batch "
                "do to the number of updates a budget buys?",
                "With 1024 examples per update a small data set gives a handful of updates per epoch.",
            ),
            solution_code="""\
import dataclasses

my_options = dataclasses.replace(start, batch_size=64)  # 16× the updates per epoch
""",
            stub="""\
my_options = ...  # e.g. dataclasses.replace(start, <one option>=<new value>)
""",
        ),
    ],
)
