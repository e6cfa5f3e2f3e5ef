"""Exercise bank "gradient_accumulation" (lesson 05: gradient accumulation and custom training loops)."""

from __future__ import annotations

import math
import numbers
from typing import Any

from ..exercises import Exercise, Incorrect, call_learner, describe, register_bank, require_callable


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


def _as_number(value: Any, what: str) -> float:
    """A learner's result as a Python number, or Incorrect naming what came back."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        raise Incorrect(f"Expected {what}, got {describe(value)}.")
    if isinstance(value, numbers.Real):
        return float(value)
    if hasattr(value, "numpy") and hasattr(value, "shape"):
        if tuple(value.shape) != ():
            raise Incorrect(
                f"Expected {what} (a scalar), got {describe(value)}; reduce the per-example losses to one number."
            )
        try:
            return float(value.numpy())
        except Exception:  # noqa: BLE001 - e.g. a string tensor
            raise Incorrect(f"Expected {what}, got {describe(value)}.") from None
    if type(value).__module__ == "numpy" and getattr(value, "shape", None) == ():
        return float(value)
    raise Incorrect(f"Expected {what}, got {describe(value)}.")


# -- 1. accumulation_steps ---------------------------------------------------------------------

_STEP_CASES = ((1024, 128, 4, 2), (1024, 128, 1, 8), (4096, 64, 8, 8), (256, 64, 4, 1), (2048, 32, 2, 32))


def _check_accumulation_steps(answer: Any) -> str:
    fn = require_callable(answer, "accumulation_steps(target_global_batch, per_replica_batch, strategy)", arity=3)
    for target, per, n, expected in _STEP_CASES:
        got = call_learner(
            fn, target, per, _FakeStrategy(n),
            shown_as=f"accumulation_steps({target}, {per}, <strategy with {n} replicas>)",
            on_error="Read `strategy.num_replicas_in_sync` (an attribute, not a method call).",
        )
        if isinstance(got, float) and float(got).is_integer() and got == expected:
            raise Incorrect(
                f"For target {target}, per-replica batch {per} and {n} replicas you returned {got!r}, a float: "
                "k counts micro-steps, so return an int (use `//`)."
            )
        value = _as_number(got, "an int (the number of micro-batches k)")
        if value == expected:
            continue
        quote = f"for target {target}, per-replica batch {per} and {n} replicas you returned {got!r}, expected {expected}"
        if value == target // per:
            raise Incorrect(f"Your k ignores the replicas: {quote}. One micro-step already consumes "
                            "per_replica_batch × num_replicas_in_sync examples.")
        if value == target // (per * n) * n or value == target * n // per:
            raise Incorrect(f"You multiplied by the replica count instead of dividing: {quote}.")
        raise Incorrect(f"Not quite: {quote}. k = target global batch / (per-replica batch × replicas).")
    return (
        "k = target / (per-replica batch × replicas): with more replicas each micro-step already covers more "
        "examples, so fewer micro-steps are needed for the same effective batch."
    )


def _accumulation_steps_reference(target_global_batch, per_replica_batch, strategy):
    return target_global_batch // (per_replica_batch * strategy.num_replicas_in_sync)


# -- 2. replica_loss --------------------------------------------------------------------------

_PER_EXAMPLE = (0.5, 1.5, 2.0, 0.25, 1.0, 3.0, 0.75, 1.0)  # one replica's 8 examples


def _check_replica_loss(answer: Any) -> str:
    import tensorflow as tf

    fn = require_callable(answer, "replica_loss(per_example_loss, global_batch_size)", arity=2)
    per_example = tf.constant(_PER_EXAMPLE, dtype=tf.float32)
    total = sum(_PER_EXAMPLE)
    for global_batch in (128, 32):  # 8 examples here; 16 replicas × 8, or 4 replicas × 8
        got = call_learner(fn, per_example, global_batch,
                           shown_as=f"replica_loss(<8 per-example losses>, {global_batch})",
                           on_error="Pass the global batch as `global_batch_size=`.")
        value = _as_number(got, "a scalar loss")
        expected = total / global_batch
        if math.isclose(value, expected, rel_tol=1e-5):
            continue
        quote = f"with 8 losses summing to {total} and global batch {global_batch} you returned {value:.4g}, expected {expected:.4g}"
        if math.isclose(value, total / len(_PER_EXAMPLE), rel_tol=1e-5):
            raise Incorrect(
                f"That is `reduce_mean` over this replica's examples only: {quote}. After the SUM all-reduce "
                "the update is num_replicas times too large; divide by the GLOBAL batch."
            )
        if math.isclose(value, total, rel_tol=1e-5):
            raise Incorrect(f"You summed without dividing: {quote}.")
        raise Incorrect(f"Not quite: {quote}. Sum this replica's losses and divide by the global batch size.")
    return (
        "Each replica divides its sum by the global batch, so the SUM all-reduce of the gradients gives "
        "the gradient of the mean over all examples — on 1 replica or 64."
    )


def _replica_loss_reference(per_example_loss, global_batch_size):
    import tensorflow as tf

    return tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)


# -- 3. builtin_warmup_steps ------------------------------------------------------------------

_WARMUP_CASES = ((100, 4), (500, 8), (10, 1), (64, 2))


def _check_builtin_warmup_steps(answer: Any) -> str:
    fn = require_callable(answer, "builtin_warmup_steps(warmup_updates, k)", arity=2)
    for updates, k in _WARMUP_CASES:
        got = call_learner(fn, updates, k, shown_as=f"builtin_warmup_steps({updates}, {k})")
        value = _as_number(got, "a number of schedule steps")
        expected = updates * k
        if value == expected:
            continue
        quote = f"for a warm-up of {updates} updates with k={k} you returned {got!r}, expected {expected}"
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


def _builtin_warmup_steps_reference(warmup_updates, k):
    return warmup_updates * k


register_bank(
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
                "k = target_global_batch // (per_replica_batch * strategy.num_replicas_in_sync)",
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
            reference=lambda: _accumulation_steps_reference,
            wrong_examples=(
                ("ignores replicas", lambda: (lambda t, p, s: t // p), "ignores the replicas"),
                ("multiplies", lambda: (lambda t, p, s: t * s.num_replicas_in_sync // p), "multiplied"),
                ("float", lambda: (lambda t, p, s: t / (p * s.num_replicas_in_sync)), "a float"),
                ("off", lambda: (lambda t, p, s: 4), "Not quite"),
            ),
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
                "`tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)`",
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
            reference=lambda: _replica_loss_reference,
            wrong_examples=(
                ("reduce_mean", lambda: (lambda pe, gb: __import__("tensorflow").reduce_mean(pe)), "reduce_mean"),
                ("sum", lambda: (lambda pe, gb: __import__("tensorflow").reduce_sum(pe)), "summed without dividing"),
                ("per-example", lambda: (lambda pe, gb: pe / gb), "a scalar"),
                ("off", lambda: (lambda pe, gb: 1.0), "Not quite"),
            ),
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
            reference=lambda: _builtin_warmup_steps_reference,
            wrong_examples=(
                ("updates", lambda: (lambda u, k: u), "micro-step counter"),
                ("divides", lambda: (lambda u, k: u // k), "Other direction"),
                ("off", lambda: (lambda u, k: u + k), "Not quite"),
            ),
        ),
    ],
)
