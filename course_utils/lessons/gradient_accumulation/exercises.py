"""Exercise bank "gradient_accumulation" (lesson 05: gradient accumulation and custom training loops)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf

from ...exercises import Exercise, Incorrect, call_learner, describe, ExerciseBank, require_callable, require_number


class _FakeStrategy:
    """Stands in for a strategy with ``n`` replicas."""

    def __init__(self, n: int):
        self.num_replicas_in_sync = n

    def __getattr__(self, item: str):
        raise AttributeError(
            f"the test strategy only has `num_replicas_in_sync` (you asked for `{item}`); nothing else is needed"
        )

    def __repr__(self) -> str:
        return f"<strategy with {self.num_replicas_in_sync} replicas>"


# -- 1. accumulation_steps ---------------------------------------------------------------------

_STEP_CASES = ((1024, 128, 4, 2), (1024, 128, 1, 8), (4096, 64, 8, 8), (256, 64, 4, 1), (2048, 32, 2, 32))


def _check_accumulation_steps(answer: Any) -> str:
    fn = require_callable(answer, "accumulation_steps(target_global_batch, per_replica_batch, strategy)", arity=3)
    floats = 0  # results that were whole floats (2.0): right, but `//` would give the int directly
    for target, per, n, expected in _STEP_CASES:
        got = call_learner(
            fn,
            target,
            per,
            _FakeStrategy(n),
            shown_as=f"accumulation_steps({target}, {per}, <strategy with {n} replicas>)",
            on_error="Read `strategy.num_replicas_in_sync` (an attribute, not a method call).",
        )
        value = require_number(got, "a whole number (the number of micro-batches k)")
        if not value.is_integer():
            raise Incorrect(
                f"For target {target}, per-replica batch {per} and {n} replicas you returned {describe(got)}: k "
                "counts micro-steps, so it must be a whole number — an int, or a float with nothing after the "
                "point such as 2.0 (`//` gives an int)."
            )
        if value == expected:
            floats += isinstance(got, float) or "float" in type(got).__name__
            continue
        quote = (
            f"for target {target}, per-replica batch {per} and {n} replicas you returned {describe(got)}, "
            f"expected {expected}"
        )
        if value == target // per:
            raise Incorrect(
                f"Your k ignores the replicas: {quote}. One micro-step already consumes "
                "per_replica_batch × num_replicas_in_sync examples."
            )
        if value == target // (per * n) * n or value == target * n // per:
            raise Incorrect(f"You multiplied by the replica count instead of dividing: {quote}.")
        raise Incorrect(f"Not quite: {quote}. k = target global batch / (per-replica batch × replicas).")
    tip = (
        " (Your k came back as a float such as 2.0: right, but `//` gives the int that range() needs.)"
        if floats
        else ""
    )
    return (
        "k = target / (per-replica batch × replicas): with more replicas each micro-step already covers more "
        "examples, so fewer micro-steps are needed for the same effective batch." + tip
    )


# -- 2. replica_loss --------------------------------------------------------------------------

_PER_EXAMPLE = (0.5, 1.5, 2.0, 0.25, 1.0, 3.0, 0.75, 1.0)  # one replica's 8 examples


def _check_replica_loss(answer: Any) -> str:
    fn = require_callable(answer, "replica_loss(per_example_loss, global_batch_size)", arity=2)
    per_example = tf.constant(_PER_EXAMPLE, dtype=tf.float32)
    total = sum(_PER_EXAMPLE)
    for global_batch in (128, 32, 30):  # 8 examples here; 16 replicas × 8, 4 replicas × 8, or unequal shares (30)
        with tf.GradientTape() as tape:  # the loss must stay differentiable: strategy.run takes its gradient
            tape.watch(per_example)
            got = call_learner(
                fn,
                per_example,
                global_batch,
                shown_as=f"replica_loss(<8 per-example losses>, {global_batch})",
                on_error="Pass the global batch as `global_batch_size=`.",
            )
        value = require_number(got, "a scalar loss")
        expected = total / global_batch
        if math.isclose(value, expected, rel_tol=1e-5):
            if not _has_gradient(tape, got, per_example, 1.0 / global_batch):
                raise Incorrect(
                    f"The value is right, but you returned {describe(got)}, which has no gradient path back to "
                    "`per_example_loss` (a Python/numpy number, `.numpy()`, `float()` or a new constant): "
                    "`tape.gradient` of it is None, so nothing would train. Compute it with TensorFlow ops on "
                    "the tensor you were given."
                )
            continue
        quote = f"with 8 losses summing to {total} and global batch {global_batch} you returned {value:.4g}, expected {expected:.4g}"
        mean = total / len(_PER_EXAMPLE)
        if math.isclose(value, mean, rel_tol=1e-5):
            raise Incorrect(
                f"That is the mean over this replica's examples only: {quote}. After the SUM all-reduce the update "
                "would be num_replicas times too large. (If you divided it by `num_replicas_in_sync`: the check "
                "calls your function outside `strategy.run`, where that is 1, and the division is right only when "
                "every replica holds the same number of examples.) Divide this replica's SUM by the GLOBAL batch: "
                "right for any split."
            )
        if global_batch % len(_PER_EXAMPLE) and math.isclose(
            value, mean / (global_batch // len(_PER_EXAMPLE)), rel_tol=1e-5
        ):
            raise Incorrect(
                f"Right while every replica holds the same number of examples, not otherwise: {quote}. This replica "
                f"holds 8 of {global_batch} (the others hold {global_batch - 8}: a last, partial batch), so the mean "
                "divided by a number of replicas is not this replica's share of the global mean. Divide this "
                "replica's SUM by the GLOBAL batch (`tf.nn.compute_average_loss` does): right for any split."
            )
        if math.isclose(value, total, rel_tol=1e-5):
            raise Incorrect(f"You summed without dividing: {quote}.")
        raise Incorrect(f"Not quite: {quote}. Sum this replica's losses and divide by the global batch size.")
    return (
        "Each replica divides its sum by the global batch, so the SUM all-reduce of the gradients gives "
        "the gradient of the mean over all examples — on 1 replica or 64."
    )


def _has_gradient(tape: Any, loss: Any, per_example: Any, expected: float) -> bool:
    """Whether ``d loss / d per_example`` exists and is ``expected`` for every example."""
    if not isinstance(loss, (tf.Tensor, tf.Variable)):
        return False
    try:
        grad = tape.gradient(loss, per_example)
    except Exception:  # noqa: BLE001 - e.g. an integer tensor: not differentiable
        return False
    return grad is not None and np.allclose(np.asarray(grad, np.float64), expected, rtol=1e-4)


# -- 3. builtin_warmup_steps ------------------------------------------------------------------

_WARMUP_CASES = ((100, 4), (500, 8), (10, 1), (64, 2))


def _check_builtin_warmup_steps(answer: Any) -> str:
    fn = require_callable(answer, "builtin_warmup_steps(warmup_updates, k)", arity=2)
    for updates, k in _WARMUP_CASES:
        got = call_learner(fn, updates, k, shown_as=f"builtin_warmup_steps({updates}, {k})")
        value = require_number(got, "a number of schedule steps")
        expected = updates * k
        if value == expected:
            continue
        quote = f"for a warm-up of {updates} updates with k={k} you returned {describe(got)}, expected {expected}"
        if k > 1 and value == updates:
            raise Incorrect(
                f"{quote}. Keras' built-in accumulation evaluates the schedule at the micro-step counter, so "
                f"{updates} schedule steps pass after only {updates}/{k} updates."
            )
        if k > 1 and value * k == updates:
            raise Incorrect(f"Other direction: {quote}. The schedule counts MORE steps than updates.")
        raise Incorrect(f"Not quite: {quote}.")
    return (
        "The built-in option's schedule sees micro-steps, so write warm-ups in micro-steps (× k). The course's "
        "AccumulatingModel and GradientAccumulator count updates: there the answer is just warmup_updates."
    )


EXERCISES = ExerciseBank(
    "gradient_accumulation",
    [
        Exercise(
            name="accumulation_steps",
            question=(
                "Write `accumulation_steps(target_global_batch, per_replica_batch, strategy)`: how many "
                "micro-batches k to accumulate to reach the target effective batch."
            ),
            checker=_check_accumulation_steps,
            answer_name="accumulation_steps",
            hints=(
                "One micro-step consumes per_replica_batch examples on EACH replica.",
                "One micro-step consumes per_replica_batch × `strategy.num_replicas_in_sync` examples in all. "
                "How many such steps add up to target_global_batch? (Keep k a whole number.)",
            ),
            solution_code='''\
def accumulation_steps(target_global_batch, per_replica_batch, strategy):
    """Micro-batches to accumulate so one update sees target_global_batch examples."""
    return target_global_batch // (per_replica_batch * strategy.num_replicas_in_sync)
''',
            stub='''\
def accumulation_steps(target_global_batch, per_replica_batch, strategy):
    """Micro-batches to accumulate so one update sees target_global_batch examples."""
    ...  # your code here
''',
        ),
        Exercise(
            name="replica_loss",
            question=(
                "Write `replica_loss(per_example_loss, global_batch_size)`: the loss one replica "
                "differentiates inside `strategy.run`."
            ),
            checker=_check_replica_loss,
            answer_name="replica_loss",
            hints=(
                "The gradients of all replicas are SUMMED. What must each replica divide by so the sum is a mean?",
                "Sum this replica's losses (not their mean) and divide by the GLOBAL batch size, with TensorFlow "
                "ops so the gradient flows; `tf.nn` has a helper that does exactly this (its name ends in "
                "`average_loss`).",
            ),
            solution_code='''\
import tensorflow as tf


def replica_loss(per_example_loss, global_batch_size):
    """This replica's share of the mean loss over the global batch."""
    return tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)
''',
            stub='''\
def replica_loss(per_example_loss, global_batch_size):
    """This replica's share of the mean loss over the global batch."""
    ...  # your code here
''',
        ),
        Exercise(
            name="builtin_warmup_steps",
            question=(
                "Keras' built-in `gradient_accumulation_steps=k`: write `builtin_warmup_steps(warmup_updates, k)`, "
                "the schedule step count that makes a warm-up last `warmup_updates` updates."
            ),
            checker=_check_builtin_warmup_steps,
            answer_name="builtin_warmup_steps",
            hints=(
                "Section 6 measured which counter the built-in option's schedule reads: updates or micro-steps?",
                "It reads the micro-step counter, which advances k times per update.",
            ),
            solution_code='''\
def builtin_warmup_steps(warmup_updates, k):
    """Schedule steps for a warm-up of warmup_updates updates with Keras' built-in accumulation."""
    return warmup_updates * k  # its schedule sees micro-steps
''',
            stub='''\
def builtin_warmup_steps(warmup_updates, k):
    """Schedule steps for a warm-up of warmup_updates updates with Keras' built-in accumulation."""
    ...  # your code here
''',
        ),
    ],
)
