"""Lesson 01's experiments: what the TPU resolver recipes do here, how one global batch splits across
replicas, and how fast this hardware multiplies matrices in float32 and bfloat16.

The tools themselves (detection, the TPU recipe, timing) are in :mod:`course_utils.runtime` and
:mod:`course_utils.timing`.
"""

from __future__ import annotations

import os
import statistics

from .. import runtime
from ..report import Claim, Samples
from ..timing import MatmulRate, Timing, matmul_chain, matmul_operands, time_fn


def resolver_recipes() -> list[dict]:
    """Run the three TPU resolver recipes seen in tutorials and report what each does *here*.

    Returns rows ``{"recipe", "era", "outcome"}``. The ``tpu="local"`` recipe is only connected when a
    TPU is plausibly present (connecting on a machine without one changes TensorFlow's state).
    """
    import tensorflow as tf

    Resolver = tf.distribute.cluster_resolver.TPUClusterResolver
    rows = []
    for recipe, era, build in [
        ('TPUClusterResolver(tpu="grpc://" + os.environ["COLAB_TPU_ADDR"])', "TPU Node (retired)",
         lambda: Resolver(tpu="grpc://" + os.environ["COLAB_TPU_ADDR"])),
        ("TPUClusterResolver()", "TPU Node / Cloud TPU name", lambda: Resolver()),
    ]:
        try:
            build()
            outcome = "constructed (a TPU name or address is configured here)"
        except Exception as exc:  # noqa: BLE001
            outcome = "raises " + runtime._first_line(exc, 90)
        rows.append({"recipe": recipe, "era": era, "outcome": outcome})
    if runtime.tpu_hints():
        rt = runtime.detect()
        outcome = (
            f"connected: {rt.num_replicas} replica(s)" if rt.kind == "TPU" else "failed: " + rt.fallbacks[0]
        )
    else:
        Resolver(tpu="local")
        outcome = "constructed; not connected — no TPU on this machine, so the course falls back"
    rows.append({"recipe": 'TPUClusterResolver(tpu="local")', "era": "TPU VM (today)", "outcome": outcome})
    return rows


def split_one_batch(strategy, per_replica_batch: int, image_shape=(32, 32, 3)) -> dict:
    """Distribute one global batch with ``experimental_distribute_dataset``; report each replica's slice.

    Each example carries its index, so the result shows *which* examples each replica got:
    ``{"replicas", "global_batch", "per_replica_shapes", "per_replica_ids", "devices"}``.
    Run it on N CPU replicas with ``runtime.run_with_replicas(N, strategy, split_one_batch, ...)``.
    """
    import numpy as np
    import tensorflow as tf

    global_batch = per_replica_batch * strategy.num_replicas_in_sync
    ids = np.arange(global_batch * 2)
    images = np.zeros((len(ids), *image_shape), dtype="float32")
    ds = tf.data.Dataset.from_tensor_slices((images, ids)).batch(global_batch, drop_remainder=True)
    first_images, first_ids = next(iter(strategy.experimental_distribute_dataset(ds)))
    return {
        "replicas": strategy.num_replicas_in_sync,
        "global_batch": global_batch,
        "per_replica_shapes": [list(t.shape) for t in strategy.experimental_local_results(first_images)],
        "per_replica_ids": [t.numpy().tolist() for t in strategy.experimental_local_results(first_ids)],
        "devices": [str(d) for d in strategy.extended.worker_devices],
    }


def compare_matmul_dtypes(n: int, repeats: int, device: str | None = None, jit: bool = False,
                          dtypes: tuple[str, ...] = ("float32", "bfloat16"), target_s: float = 0.05,
                          seed: int = 0) -> dict:
    """TFLOP/s of chained ``n×n`` matmuls in each dtype, timed call by call in turn (interleaved).

    Every dtype runs the same chain length (calibrated on the first dtype to last about ``target_s``
    per call) inside one ``tf.function`` (:func:`course_utils.timing.matmul_chain`); round ``i`` times one
    call of each dtype, so a drift of the machine hits all of them alike. Returns ``{"rates": {dtype:
    MatmulRate}, "speed_vs_first": {dtype: Samples of (first dtype's time / this dtype's time) per round},
    "bytes": {dtype: bytes of one n×n matrix}}``.
    """
    import tensorflow as tf

    x_np, b_np = matmul_operands(n, seed=seed)
    chain = matmul_chain(jit)  # one tf.function: each dtype is its own trace
    with tf.device(device) if device else _Null():
        ops = {}
        for dt in dtypes:
            x, b = tf.cast(tf.constant(x_np), dt), tf.cast(tf.constant(b_np), dt)
            chain(x, b, tf.constant(1)).numpy()  # trace + compile, not timed
            ops[dt] = (x, b)
        x0, b0 = ops[dtypes[0]]
        one = time_fn(lambda: chain(x0, b0, tf.constant(1)), repeats=1, warmup=0).median_s
        matmuls = int(min(10_000, max(2, round(target_s / max(one, 1e-6)))))
        k = tf.constant(matmuls)
        calls = {dt: (lambda x=x, b=b: chain(x, b, k)) for dt, (x, b) in ops.items()}
        warm = {dt: time_fn(fn, repeats=1, warmup=0).median_s for dt, fn in calls.items()}  # untimed warm-up
        times = {dt: [] for dt in dtypes}
        for _ in range(repeats):
            for dt, fn in calls.items():
                times[dt].append(time_fn(fn, repeats=1, warmup=0).median_s)
        results = {dt: float(fn().numpy()) for dt, fn in calls.items()}
        nbytes = {dt: int(tf.size(x).numpy()) * x.dtype.size for dt, (x, _) in ops.items()}
    rates = {
        dt: MatmulRate(n, dt, matmuls, jit, device or "default",
                       Timing(statistics.median(times[dt]), times[dt], warm[dt]), results[dt])
        for dt in dtypes
    }
    first = dtypes[0]
    speed = {dt: Samples([a / b for a, b in zip(times[first], times[dt])]) for dt in dtypes}
    return {"rates": rates, "speed_vs_first": speed, "bytes": nbytes, "matmuls": matmuls}


def within_claim(claim: str, source: str, expected: str, samples: Samples, low: float, high: float,
                 fmt: str = ".2f", unit: str = "×", note: str = "", differs_here: str = "") -> Claim:
    """A claim that a repeated ratio lies in ``[low, high)``: holds when the whole spread does, fails when
    the whole spread is outside on one side, inconclusive (noise) when the spread crosses a bound."""
    above, below = samples.compare(">=", low), samples.compare("<", high)
    if above is True and below is True:
        holds = True
    elif above is False or below is False:
        holds = False
    else:
        holds = "noise"
    return Claim(claim, source, expected, samples.format(fmt, unit), holds, note=note, differs_here=differs_here)


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


__all__ = ["resolver_recipes", "split_one_batch", "compare_matmul_dtypes", "within_claim"]
