"""Honest timing (COURSE_DESIGN §6): warm-up excluded, median of repeats, results forced to finish."""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable


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


def matmul_tflops(n: int, dtype: str = "float32", repeats: int = 10, device: str | None = None) -> tuple[float, Timing]:
    """Measured TFLOP/s of an ``n×n @ n×n`` matmul (2·n³ floating-point operations) on this device."""
    import tensorflow as tf

    with tf.device(device) if device else _null():
        a = tf.random.normal((n, n), dtype=tf.float32)
        a = tf.cast(a, dtype)
        b = tf.cast(tf.random.normal((n, n)), dtype)
        step = tf.function(lambda: tf.matmul(a, b))
        timing = time_fn(step, repeats=repeats)
    return 2 * n**3 / timing.median_s / 1e12, timing


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def epoch_timer():
    """A Keras callback that records each epoch's wall time in ``.epoch_s``.

    The first epoch includes tracing and compilation; compare later epochs (``.steady_s``: their median).
    """
    import keras

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epoch_s: list[float] = []

        def on_epoch_begin(self, epoch, logs=None):
            self._t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.epoch_s.append(time.perf_counter() - self._t0)

        @property
        def steady_s(self) -> float:
            later = self.epoch_s[1:] or self.epoch_s
            return statistics.median(later)

    return EpochTimer()


def speedup_samples(slow: Callable[[], Any], fast: Callable[[], Any], rounds: int = 5, repeats: int = 3,
                    warmup: int = 1):
    """How many times faster ``fast`` is than ``slow``, measured ``rounds`` times, interleaved.

    Each round times both (median of ``repeats`` calls each, after ``warmup`` untimed calls in the
    first round) and records ``slow / fast``; interleaving keeps drifts of the machine (another
    process, thermal limits) out of the ratio. Returns :class:`course_utils.report.Samples`: feed it
    to ``report.Claim.from_samples`` so a verdict comes from the spread, not from one run.
    """
    from .report import Samples

    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    ratios = []
    for i in range(rounds):
        w = warmup if i == 0 else 0
        a = time_fn(slow, repeats=repeats, warmup=w)
        b = time_fn(fast, repeats=repeats, warmup=w)
        ratios.append(a.median_s / b.median_s)
    return Samples(ratios)
