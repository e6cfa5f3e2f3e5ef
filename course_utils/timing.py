"""Honest timing (CONTRIBUTING.md §6): warm-up excluded, median of repeats, results forced to finish."""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable

from . import config
from .report import Samples


@dataclasses.dataclass
class Timing:
    median_s: float
    times_s: list[float]
    warmup_s: float  # the first call(s): tracing, compilation, caches — not counted

    def __str__(self) -> str:
        return f"median {self.median_s * 1e3:.2f} ms over {len(self.times_s)} runs, warm-up {self.warmup_s * 1e3:.1f} ms excluded"


def _block(result: Any) -> None:
    """Wait for asynchronous TPU/GPU work: fetch one value of the result to the host."""
    import tensorflow as tf

    for t in tf.nest.flatten(result):
        if hasattr(t, "numpy"):
            t.numpy()
            return


def time_fn(fn: Callable[[], Any], repeats: int = 10, warmup: int = 1) -> Timing:
    """Call ``fn`` ``warmup`` times untimed, then ``repeats`` times timed; report the median."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    start = time.perf_counter()
    for _ in range(warmup):
        _block(fn())
    warm = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _block(fn())
        times.append(time.perf_counter() - t0)
    return Timing(statistics.median(times), times, warm)


@dataclasses.dataclass
class MatmulRate:
    """What :func:`matmul_tflops` measured: ``matmuls`` chained ``n×n`` matmuls per timed call."""

    n: int
    dtype: str
    matmuls: int  # matmuls per timed call, all inside one tf.function
    jit: bool  # compiled with XLA (jit_compile=True)?
    device: str
    timing: Timing  # one entry per timed call
    result: float  # the scalar each call returned (and the timer waited for)

    @property
    def flops_per_call(self) -> int:
        """2·n³ floating-point operations per matmul (n³ multiplies + n³ adds), times the chain length."""
        return 2 * self.n**3 * self.matmuls

    @property
    def samples(self):
        """TFLOP/s of every timed call, as :class:`course_utils.report.Samples` (median and spread)."""
        return Samples([self.flops_per_call / t / 1e12 for t in self.timing.times_s])

    @property
    def tflops(self) -> float:
        return self.samples.median

    @property
    def xla_label(self) -> str:
        return "with XLA" if self.jit else "without XLA"

    def __str__(self) -> str:
        return (
            f"{self.n}×{self.n} {self.dtype}, {self.matmuls} matmuls per call, {self.xla_label}: "
            f"{self.samples.format('.3f', ' TFLOP/s')}"
        )


def matmul_chain(jit: bool):
    """A ``tf.function`` ``chain(x, b, matmuls)``: ``x ← x @ b`` repeated ``matmuls`` times in a
    ``tf.while_loop``, returning ``x[0, 0]`` as a float32 scalar.

    Each matmul feeds the next, so no compiler can drop one; the loop runs on the device, so one call
    costs one dispatch; the caller waits for one scalar, not for an n×n copy to the host. ``matmuls`` is a
    tensor: one trace (and one XLA compile) serves every chain length.
    """
    import tensorflow as tf

    @tf.function(jit_compile=jit)
    def chain(x, b, matmuls):
        _, x = tf.while_loop(lambda i, x: i < matmuls, lambda i, x: (i + 1, tf.matmul(x, b)), (tf.constant(0), x))
        return tf.cast(x[0, 0], tf.float32)

    return chain


def matmul_operands(n: int, dtype: str = "float32", seed: int = 0):
    """``(x, b)`` for :func:`matmul_chain`, as numpy float32 arrays before the cast to ``dtype``: x ~ N(0, 1)
    and b ~ N(0, 1/n), so ``x @ b`` keeps x's scale and a long chain neither overflows nor vanishes."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, n)).astype("float32")
    b = (rng.standard_normal((n, n)) / np.sqrt(n)).astype("float32")
    return x, b


def matmul_tflops(
    n: int,
    dtype: str = "float32",
    repeats: int = 10,
    device: str | None = None,
    *,
    jit: bool | None = None,
    matmuls: int | None = None,
    target_s: float = 0.05,
    seed: int = 0,
) -> MatmulRate:
    """Measured TFLOP/s of ``n×n @ n×n`` matmuls on ``device``: a chain of ``matmuls`` of them per call.

    ``jit``: compile with XLA (default: ``course_utils.config.get().jit``; a TPU always does).
    ``matmuls``: chain length per call; default: enough for about ``target_s`` seconds per call (from one
    calibration call), at least 2 — so dispatch and the 4-byte result copy are a small part of each call.
    One untimed warm-up call (tracing, compilation) comes first; then ``repeats`` timed calls.
    """
    import tensorflow as tf

    jit = config.get().jit if jit is None else bool(jit)
    x_np, b_np = matmul_operands(n, dtype, seed)
    chain = matmul_chain(jit)
    with tf.device(device) if device else _null():
        x, b = tf.cast(tf.constant(x_np), dtype), tf.cast(tf.constant(b_np), dtype)
        chain(x, b, tf.constant(1)).numpy()  # trace + compile, not timed
        if matmuls is None:
            one = time_fn(lambda: chain(x, b, tf.constant(1)), repeats=1, warmup=0).median_s
            matmuls = int(min(10_000, max(2, round(target_s / max(one, 1e-6)))))
        k = tf.constant(int(matmuls))
        timing = time_fn(lambda: chain(x, b, k), repeats=repeats, warmup=1)
        result = float(chain(x, b, k).numpy())
    return MatmulRate(n, dtype, int(matmuls), jit, device or "default", timing, result)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def speedup_samples(
    slow: Callable[[], Any], fast: Callable[[], Any], rounds: int = 5, repeats: int = 3, warmup: int = 1
):
    """How many times faster ``fast`` is than ``slow``, measured ``rounds`` times, interleaved.

    Each round times both (median of ``repeats`` calls each, after ``warmup`` untimed calls in the
    first round) and records ``slow / fast``; interleaving keeps drifts of the machine (another
    process, thermal limits) out of the ratio. Returns :class:`course_utils.report.Samples`: feed it
    to ``report.Claim.from_samples`` so a verdict comes from the spread, not from one run.
    """
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    ratios = []
    for i in range(rounds):
        w = warmup if i == 0 else 0
        a = time_fn(slow, repeats=repeats, warmup=w)
        b = time_fn(fast, repeats=repeats, warmup=w)
        ratios.append(a.median_s / b.median_s)
    return Samples(ratios)
