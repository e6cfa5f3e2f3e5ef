"""Exercise bank "activation_memory" (lesson 07: where training memory goes, and cutting activation memory)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ...exercises import (
    Incorrect,
    Exercise,
    _is_tensor,
    call_learner,
    describe,
    ExerciseBank,
    require_callable,
    require_number,
)

# -- 1. relu_code -----------------------------------------------------------------------------

_TINY32 = float(np.finfo(np.float32).tiny)  # the smallest normal float32, about 1.2e-38

_RELU_INPUTS = (
    np.array([-2.0, -0.5, 0.0, 0.25, 3.0], np.float32),
    np.linspace(-4, 4, 33, dtype=np.float32).reshape(3, 11),
    np.array([[0.0, -0.0], [1e-30, -1e-30]], np.float32),
    # large x: ReLU passes the gradient however large x is; ReLU6 (Keras' `ReLU(max_value=6)`) blocks it from 6 on
    np.array([5.5, 6.0, 7.5, 1e4, 3e38, -3e38, -6.0, -7.5], np.float32),
    # the smallest normal float32: a threshold "just above 0" is not 0
    np.array([_TINY32, -_TINY32, 1e-37, 0.0], np.float32),
    # the dtypes ReLU also meets: mixed_float16's compute dtype (its smallest subnormal, 6e-8, included; TensorFlow's
    # ReLU gradient is 1 there) and numpy's default float64, whose tiny values a cast to float32 turns into 0
    np.array([-65504.0, -1.0, -6e-8, 0.0, 6e-8, 1e-3, 6.0, 65504.0], np.float16),
    np.array([-2.0, -1e-300, 0.0, 1e-300, 0.5, 7.5], np.float64),
)


def _as_array(value: Any, shown_as: str) -> np.ndarray:
    """A learner's array-like result as a numpy array, or Incorrect naming what came instead."""
    if isinstance(value, np.ma.MaskedArray):
        raise Incorrect(
            f"{shown_as} returned a masked array; return a plain array of codes (no mask: every element has a code)."
        )
    if isinstance(value, np.ndarray):
        return np.asarray(value)  # a subclass (np.matrix, a learner's own) as the plain array it holds
    if _is_tensor(value) and type(value).__name__ == "EagerTensor":
        try:
            return np.asarray(value.numpy())
        except Exception:  # noqa: BLE001
            pass
    raise Incorrect(
        f"{shown_as} returned {describe(value)}; return an array of codes, one per element of x "
        "(a numpy array or an eager tensor)."
    )


def _shown_relu_call(x: np.ndarray) -> str:
    head = np.array2string(x.ravel()[:5], precision=2)
    dtype = "" if x.dtype == np.float32 else f", a {x.dtype.name} x"
    return f"relu_code({head}{'…' if x.size > 5 else ''}{dtype})"


def _check_relu_code(answer: Any) -> str:
    fn = require_callable(answer, "relu_code(x)", arity=1)
    widest = None  # the widest integer dtype the codes came in (an unpacked 0/1 of any integer type is a code)
    for x in _RELU_INPUTS:
        shown = _shown_relu_call(x)
        code = _as_array(call_learner(fn, x.copy(), shown_as=shown), shown)
        if code.shape != x.shape:
            raise Incorrect(
                f"{shown} returned shape {code.shape}; the code needs one entry per element of x, "
                f"shape {x.shape} (whatever x's dtype: compare values, do not reinterpret bytes)."
            )
        if code.dtype.kind == "f" or code.dtype.name == "bfloat16":
            if code.shape == x.shape and np.array_equal(code.astype(np.float64), x.astype(np.float64)):
                raise Incorrect(
                    "That is x itself: 16 to 64 bits a number. The backward needs only one bit: which "
                    "side of 0 each element is on."
                )
            raise Incorrect(
                f"{shown} returned floats ({code.dtype.name}): a float is 16 to 64 bits a number, and the "
                "code is one bit. Return booleans (e.g. `x > 0`) or integer 0/1 (uint8 packs 8 to a byte)."
            )
        if code.dtype.kind not in "biu":
            raise Incorrect(f"{shown} returned an array of {code.dtype}; return booleans or integer 0/1.")
        values = set(np.unique(code).tolist())
        if not values <= {0, 1}:
            raise Incorrect(f"{shown} returned the values {sorted(values)[:6]}; a 1-bit code holds only 0 and 1.")
        if code.dtype.kind in "iu" and (widest is None or code.dtype.itemsize > widest.itemsize):
            widest = code.dtype
        have = code != 0
        want = x > 0  # TensorFlow's ReLU gradient: dy where x > 0, 0 where x <= 0 (0 at exactly 0), in every dtype
        if np.array_equal(have, want):
            continue
        wrong = have != want
        if np.array_equal(have, x >= 0):
            raise Incorrect(
                "Close: at exactly x = 0 TensorFlow's ReLU gradient is 0, so the code must be 0 there "
                "(`x > 0`, not `x >= 0`)."
            )
        if np.array_equal(have, x <= 0) or np.array_equal(have, x < 0):
            raise Incorrect("Upside down: the gradient passes (code 1) where x > 0 and is blocked where x <= 0.")
        missed = want & ~have  # code 0 where the gradient passes
        if np.array_equal(wrong, missed) and np.all(x[missed] >= 6):
            raise Incorrect(
                f"{shown} gives 0 for large x (e.g. {float(x[missed].min()):g}): that is the gradient of "
                "ReLU6 (a ReLU clipped at `max_value=6`), which stops passing it at 6. Plain ReLU passes the "
                "gradient for every x > 0, however large."
            )
        if np.array_equal(wrong, missed) and np.all(np.abs(x[missed].astype(np.float64)) < 1e-6):
            raise Incorrect(
                f"{shown} gives 0 for tiny positive x (e.g. {float(x[missed].min()):.3g}), where ReLU "
                "still passes the gradient. Does your code compare with a small threshold, or convert x to "
                "a smaller dtype first? Compare x itself with 0: `x > 0`, in x's own dtype."
            )
        raise Incorrect(f"dy × code differs from ReLU's gradient for {shown}: the code must be 1 exactly where x > 0.")
    note = ""
    if widest is not None and widest.itemsize > 1:
        note = (
            f" Your {widest.name} codes take {widest.itemsize} bytes each until packed; bool or uint8 take 1, and "
            "`np.packbits` puts 8 in a byte."
        )
    return (
        "One bit per element (`x > 0`) is all ReLU's backward needs: packed 8 to a byte that is 1/32 of a float32 "
        "input. GELU's derivative is not 0/1 everywhere, so few-bit GELU needs a few bits and a table." + note
    )


# -- 2. blocks_to_recompute -------------------------------------------------------------------

# (saved MiB per block, extra ms per block, target MiB); the checker compares the extra time with the optimum's,
# so any optimal set passes (in the fifth case two sets cost 7 ms)
_RECOMPUTE_CASES = (
    ((40, 10, 25, 5), (4.0, 1.0, 3.0, 0.5), 30),  # greedy by MiB alone takes 40 (4 ms); best: 25+5 (3.5 ms)
    ((12, 12, 12, 12), (2.0, 1.0, 3.0, 4.0), 24),  # same saving: the two cheapest
    ((8, 30, 30), (1.0, 2.0, 2.5), 60),  # needs both big ones
    ((50, 20, 20, 20), (9.0, 2.0, 2.0, 2.5), 40),  # ratio-greedy would take 20+20 (4 ms): also best
    ((30, 10, 10), (6.0, 1.0, 1.0), 31),  # ratio-greedy takes 10+10 then 30 (8 ms); best 30+10 (7 ms)
    ((5, 5), (1.0, 1.0), 0),  # nothing to save: recompute nothing
)


def _best(saved, cost, target):
    best = None
    for n in range(len(saved) + 1):
        for combo in itertools.combinations(range(len(saved)), n):
            if sum(saved[i] for i in combo) >= target:
                c = sum(cost[i] for i in combo)
                if best is None or c < best[0] - 1e-9:
                    best = (c, combo)
    return best


def _check_blocks_to_recompute(answer: Any) -> str:
    fn = require_callable(answer, "blocks_to_recompute(saved_mib, extra_ms, target_mib)", arity=3)
    for saved, cost, target in _RECOMPUTE_CASES:
        shown = f"blocks_to_recompute({list(saved)}, {list(cost)}, {target})"
        got = call_learner(fn, list(saved), list(cost), target, shown_as=shown)
        if isinstance(got, (str, bytes, dict)) or not isinstance(got, (list, tuple, set, frozenset, range, np.ndarray)):
            raise Incorrect(f"{shown} returned {describe(got)}; return a list of block indices, e.g. [0, 2].")
        try:  # at most one more item than there are blocks: a huge range() or a learner's iterable cannot run away
            items = list(itertools.islice(iter(got.tolist() if isinstance(got, np.ndarray) else got), len(saved) + 1))
        except Exception as exc:  # noqa: BLE001 - the learner's own container: iterating it raised
            raise Incorrect(
                f"{shown} returned {describe(got)}, which could not be read as a list "
                f"({type(exc).__name__}); return a plain list of block indices."
            ) from None
        if len(items) > len(saved):
            raise Incorrect(f"{shown} returned {describe(got)}: more indices than blocks.")
        indices = []
        for item in items:
            if isinstance(item, bool) or not isinstance(item, (int, np.integer)):
                raise Incorrect(f"{shown} returned {describe(got)}; the entries must be block indices (ints).")
            if not 0 <= int(item) < len(saved):
                raise Incorrect(f"{shown} returned index {int(item)}: blocks are numbered 0 to {len(saved) - 1}.")
            indices.append(int(item))
        if len(set(indices)) != len(indices):
            raise Incorrect(f"{shown} returned {indices}: a block is recomputed once or not at all.")
        total_saved = sum(saved[i] for i in indices)
        total_cost = sum(cost[i] for i in indices)
        if total_saved < target:
            raise Incorrect(f"{shown} returned {indices}: it saves {total_saved} MiB, short of the target {target}.")
        best_cost, best_combo = _best(saved, cost, target)
        if total_cost > best_cost + 1e-9:
            hint = (
                " Taking the biggest savings first is not the cheapest set."
                if indices and max(indices, key=lambda i: saved[i]) == max(range(len(saved)), key=lambda i: saved[i])
                else ""
            )
            raise Incorrect(
                f"{shown} returned {indices}: {total_cost:g} ms extra, but {sorted(best_combo)} reaches "
                f"the target for {best_cost:g} ms.{hint}"
            )
    return (
        "The cheapest set is a small knapsack problem: with a handful of blocks, trying every subset is exact "
        "and instant. Rules of thumb (largest saving per ms first) can miss the best set."
    )


# -- 3. largest_batch -------------------------------------------------------------------------

_BATCH_CASES = (
    (100.0, 164.0, 32, 64, 1000.0),
    (50.0, 90.0, 16, 32, 1000.0),
    (300.0, 500.0, 128, 256, 16384.0),
    (100.0, 164.0, 32, 64, 90.0),
    (10.0, 14.0, 1, 2, 12.0),
    (100.0, 164.0, 32, 64, 30.0),
)  # the fixed part (36) does not fit: 0


def _expected_batch(p1, p2, b1, b2, budget):
    per = (p2 - p1) / (b2 - b1)
    fixed = p1 - b1 * per
    return max(0, math.floor((budget - fixed) / per + 1e-9))


def _check_largest_batch(answer: Any) -> str:
    fn = require_callable(answer, "largest_batch(peak_small, peak_large, batch_small, batch_large, budget)", arity=5)
    for p1, p2, b1, b2, budget in _BATCH_CASES:
        shown = f"largest_batch({p1:g}, {p2:g}, {b1}, {b2}, {budget:g})"
        got = call_learner(fn, p1, p2, b1, b2, budget, shown_as=shown)
        value = require_number(got, "a batch size (a whole number)")
        expected = _expected_batch(p1, p2, b1, b2, budget)
        if value == expected and float(value).is_integer():
            continue
        quote = f"{shown} returned {describe(got)}, expected {expected}"
        per = (p2 - p1) / (b2 - b1)
        if math.isclose(value, budget / (p2 / b2)) or value == math.floor(budget / (p2 / b2)):
            raise Incorrect(
                f"{quote}: peak ÷ batch counts the weights and optimizer state once per example. Split the "
                "peak into a fixed part and a part per example first."
            )
        if not float(value).is_integer() and math.isclose(value, (budget - (p1 - b1 * per)) / per):
            raise Incorrect(f"{quote}: round down to a whole batch (a larger one does not fit).")
        if value < 0:
            raise Incorrect(f"{quote}: when even the fixed part does not fit, the answer is 0.")
        raise Incorrect(
            f"Not quite: {quote}. per example = (peak_large − peak_small) / (batch_large − batch_small); "
            "fixed = peak_small − batch_small × per example."
        )
    return (
        "Two measurements give the line peak = fixed + batch × per example; the budget minus the fixed part, "
        "divided by the per-example part, is the largest batch. Each technique changes only the per-example part."
    )


EXERCISES = ExerciseBank(
    "activation_memory",
    [
        Exercise(
            name="relu_code",
            question=(
                "Write `relu_code(x)`: the smallest code of x that ReLU's backward needs, one entry per element, "
                "so that `dy * code` is ReLU's gradient."
            ),
            checker=_check_relu_code,
            answer_name="relu_code",
            hints=(
                "ReLU's derivative takes only two values. Which?",
                "The code is 1 where the derivative is 1 and 0 elsewhere: one comparison of x with 0 gives a "
                "boolean per element. Mind which side exactly 0 falls on.",
            ),
            solution_code='''\
def relu_code(x):
    """What ReLU's backward must keep of x: 1 where the gradient passes, 0 where it is blocked."""
    return x > 0
''',
            stub='''\
def relu_code(x):
    """What ReLU's backward must keep of x: 1 where the gradient passes, 0 where it is blocked."""
    ...  # your code here
''',
        ),
        Exercise(
            name="blocks_to_recompute",
            question=(
                "Write `blocks_to_recompute(saved_mib, extra_ms, target_mib)`: the indices of the blocks to "
                "recompute so the saving reaches the target at the least extra time."
            ),
            checker=_check_blocks_to_recompute,
            answer_name="blocks_to_recompute",
            hints=(
                "A handful of blocks: you can afford to try every subset (`itertools.combinations`).",
                "Keep the subsets whose saving reaches the target; return the one with the least extra time.",
            ),
            solution_code='''\
import itertools


def blocks_to_recompute(saved_mib, extra_ms, target_mib):
    """Indices of the blocks to recompute: saving >= target_mib at the least extra time."""
    best, best_ms = None, float("inf")
    for n in range(len(saved_mib) + 1):
        for combo in itertools.combinations(range(len(saved_mib)), n):
            ms = sum(extra_ms[i] for i in combo)
            if sum(saved_mib[i] for i in combo) >= target_mib and ms < best_ms:
                best, best_ms = list(combo), ms
    return best
''',
            stub='''\
def blocks_to_recompute(saved_mib, extra_ms, target_mib):
    """Indices of the blocks to recompute: saving >= target_mib at the least extra time."""
    ...  # your code here
''',
        ),
        Exercise(
            name="largest_batch",
            question=(
                "Write `largest_batch(peak_small, peak_large, batch_small, batch_large, budget)`: from peaks "
                "measured at two batch sizes, the largest batch whose peak fits the budget (same units)."
            ),
            checker=_check_largest_batch,
            answer_name="largest_batch",
            hints=(
                "Peak memory is a straight line in the batch: a fixed part plus a part per example.",
                "Two measured points fix the line: its slope is the per-example part, its value at batch 0 the fixed "
                "part. How many per-example parts fit in what the fixed part leaves of the budget?",
            ),
            solution_code='''\
def largest_batch(peak_small, peak_large, batch_small, batch_large, budget):
    """The largest batch whose peak fits the budget, from two measured peaks."""
    per_example = (peak_large - peak_small) / (batch_large - batch_small)
    fixed = peak_small - batch_small * per_example
    return max(0, int((budget - fixed) // per_example))
''',
            stub='''\
def largest_batch(peak_small, peak_large, batch_small, batch_large, budget):
    """The largest batch whose peak fits the budget, from two measured peaks."""
    ...  # your code here
''',
        ),
    ],
)
