"""Lesson 04's experiments: what reaches each replica and each worker, and what the pipeline's tuning buys.

* replicas: :func:`replica_checks` (every example exactly once, both APIs, with and without
  ``drop_remainder``) and :func:`remainder_split` (how each API deals out a ragged last step) — each returns a
  JSON-able dict, so ``runtime.run_with_replicas(4, strategy, replica_checks, ...)`` can run it in a fresh
  process with 4 CPU replicas;
* workers: :func:`auto_shard_table` (FILE / DATA / OFF on simulated workers) and :func:`shuffle_shard_cases`
  (an unseeded shuffle before ``shard`` against the two fixes), drawn by :func:`plot_worker_ids`;
* speed: :func:`interleaved_times` (several variants timed in interleaved rounds), :func:`input_bound_check`,
  :func:`simulated_accelerator` (a training loop whose step runs "elsewhere", as on a TPU), :func:`plot_speedups`.

The tools themselves (loading, ``build_pipeline``, ``distribute``, TFRecords) are in :mod:`course_utils.data`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import numpy as np

from ..data import APIS, distribute, tfrecord_dataset
from ..report import Samples

# ----------------------------------------------------------------------------------------------
# Replicas: every example exactly once, and who gets the ragged last step
# ----------------------------------------------------------------------------------------------


def local_shapes(strategy, per_replica_value) -> list[list[int]]:
    """The shape each replica received for one distributed batch."""
    return [list(t.shape) for t in strategy.experimental_local_results(per_replica_value)]


def seen_ids(strategy, dist_ds) -> tuple[list[int], list[list[list[int]]]]:
    """Iterate one epoch of a distributed dataset of example ids; returns (all ids, shapes per step)."""
    ids, shapes = [], []
    for batch in dist_ds:
        parts = strategy.experimental_local_results(batch)
        shapes.append([list(p.shape) for p in parts])
        for p in parts:
            ids.extend(int(v) for v in np.asarray(p).reshape(-1))
    return ids, shapes


def exactly_once(ids, n: int) -> dict:
    """How often each of the ids ``0..n-1`` was seen: counts of missing and duplicated ids."""
    counts = np.bincount(np.asarray(ids, np.int64), minlength=n) if len(ids) else np.zeros(n, np.int64)
    return {
        "seen": int(len(ids)),
        "missing": int((counts[:n] == 0).sum()),
        "duplicated": int((counts[:n] > 1).sum()),
        "exactly_once": bool(len(counts) == n and (counts == 1).all()),
    }


def replica_checks(strategy, n_examples: int, per_replica_batch: int) -> dict:
    """Every example once? For both APIs, with and without ``drop_remainder``, on ``strategy``.

    The dataset is ``range(n_examples)`` (each example is its own id). Returns ``{"replicas", "rows"}``, one
    row per case: api, drop_remainder, replicas, examples, global batch, steps, first/last step's per-replica
    sizes, seen, missing, duplicated, exactly_once.
    """
    import tensorflow as tf

    n_rep = strategy.num_replicas_in_sync
    global_batch = per_replica_batch * n_rep
    rows = []
    for api in APIS:
        for drop in (False, True):
            dist = distribute(strategy, tf.data.Dataset.range(n_examples), global_batch, api, drop_remainder=drop)
            ids, shapes = seen_ids(strategy, dist)
            row = {
                "api": api,
                "drop_remainder": drop,
                "replicas": n_rep,
                "examples": n_examples,
                "global_batch": global_batch,
                "steps": len(shapes),
                "first_step": [s[0] for s in shapes[0]] if shapes else [],
                "last_step": [s[0] for s in shapes[-1]] if shapes else [],
            }
            row.update(exactly_once(ids, n_examples))
            rows.append(row)
    return {"replicas": n_rep, "rows": rows}


def dealt_last_step(examples: int, per_replica_batch: int, replicas: int) -> list[int]:
    """What ``distribute_datasets_from_function`` (one input pipeline) gives each replica in the last step,
    predicted: the pipeline cuts per-replica batches and deals them to the replicas in turn, so the
    remainder fills whole per-replica batches first, then one partial batch, then empty ones."""
    global_batch = per_replica_batch * replicas
    left = examples % global_batch or global_batch
    return [max(0, min(per_replica_batch, left - r * per_replica_batch)) for r in range(replicas)]


def remainder_split(strategy, per_replica_batch: int, examples: list[int]) -> dict:
    """The last step's per-replica sizes for each dataset size in ``examples`` (``drop_remainder=False``),
    with both APIs, next to :func:`dealt_last_step`'s prediction. Returns ``{"replicas", "rows"}``."""
    import tensorflow as tf

    n_rep = strategy.num_replicas_in_sync
    rows = []
    for n in examples:
        row = {"examples": int(n), "remainder": int(n % (per_replica_batch * n_rep))}
        for api in APIS:
            _, shapes = seen_ids(strategy, distribute(strategy, tf.data.Dataset.range(n), per_replica_batch * n_rep,
                                                      api, drop_remainder=False))
            row[api] = [s[0] for s in shapes[-1]]
        row["predicted (dealt in turn)"] = dealt_last_step(n, per_replica_batch, n_rep)
        rows.append(row)
    return {"replicas": n_rep, "rows": rows}


# ----------------------------------------------------------------------------------------------
# Workers: auto-shard policies, and shuffling before shard
# ----------------------------------------------------------------------------------------------


def shard_as_worker(ds, input_context):
    """Apply tf.distribute's auto-shard rewrite as the worker ``input_context`` describes.

    This is the rewrite ``experimental_distribute_dataset`` applies on each worker of a multi-worker
    strategy (``MultiWorkerMirroredStrategy``, TPU pods), run here in one process so we can look at every
    worker's share. It uses TensorFlow's internal ``_AutoShardDataset`` (no public API exposes the
    rewrite without a real cluster).
    """
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import distribute as _dist

    rewrite = getattr(_dist, "_AutoShardDataset", None)
    if rewrite is None:
        raise RuntimeError(f"TensorFlow {tf.__version__} has no tensorflow.python.data.experimental.ops.distribute."
                           "_AutoShardDataset any more: course_utils.experiments.pipeline.shard_as_worker needs "
                           "updating for this release")
    return rewrite(ds, input_context.num_input_pipelines, input_context.input_pipeline_id,
                   input_context.num_replicas_in_sync)


def _coverage(per_worker: list[list[int]], n_total: int) -> dict:
    all_ids = [i for ids in per_worker for i in ids]
    counts = np.bincount(np.asarray(all_ids, np.int64), minlength=n_total) if all_ids else np.zeros(n_total, int)
    return {"duplicated": int((counts > 1).sum()), "missing": int((counts == 0).sum()), "count": len(all_ids)}


def auto_shard_table(paths: list[str], num_workers: int, policies=("FILE", "DATA", "OFF")) -> list[dict]:
    """Which example ids each simulated worker reads under each auto-shard policy.

    Rows: policy, worker, count, ids (as runs, or the error), id_list; plus per policy a summary row (worker
    ``"all"``) with failed, duplicated and missing ids over the whole dataset.
    """
    import tensorflow as tf

    n_total = sum(1 for p in paths for _ in tf.data.TFRecordDataset(p))
    rows = []
    for policy in policies:
        per_worker, failed = [], False
        for w in range(num_workers):
            ctx = tf.distribute.InputContext(num_input_pipelines=num_workers, input_pipeline_id=w,
                                             num_replicas_in_sync=num_workers)
            try:
                ids = sorted(int(e["id"]) for e in shard_as_worker(tfrecord_dataset(paths, policy), ctx))
                rows.append({"policy": policy, "worker": w, "count": len(ids), "ids": short_ids(ids) or "(nothing)",
                             "id_list": ids})
            except Exception as exc:  # noqa: BLE001 - FILE with too few files fails: show it
                msg = str(exc).split("Could not apply FILE based sharding:")[-1].strip().splitlines()[0]
                msg = msg.split(" If you are using")[0]
                rows.append({"policy": policy, "worker": w, "count": 0, "ids": f"{type(exc).__name__}: {msg}",
                             "id_list": []})
                ids, failed = [], True
            per_worker.append(ids)
        cov = _coverage(per_worker, n_total)
        rows.append({
            "policy": policy, "worker": "all", "failed": failed, **cov,
            "ids": ("FAILED on some workers; " if failed else "")
            + f"{cov['duplicated']} ids duplicated, {cov['missing']} missing of {n_total}",
        })
    return rows


SHUFFLE_CASES = ("unseeded shuffle → shard", "seeded shuffle → shard", "shard → shuffle")


def worker_pipeline(case: str, n: int, num_workers: int, worker: int, seed: int = 7):
    """One worker's ``range(n)`` pipeline for one of :data:`SHUFFLE_CASES`.

    * ``unseeded shuffle → shard``: ``shuffle(n)`` with no seed, then ``shard`` — each worker draws its own
      random order, so the workers' every-k-th picks overlap (the pitfall);
    * ``seeded shuffle → shard``: the same ``seed`` on every worker — one order, split cleanly;
    * ``shard → shuffle``: each worker takes its share first, then shuffles it (any seed).
    """
    import tensorflow as tf

    ds = tf.data.Dataset.range(n)
    if case == SHUFFLE_CASES[0]:
        return ds.shuffle(n).shard(num_workers, worker)
    if case == SHUFFLE_CASES[1]:
        return ds.shuffle(n, seed=seed).shard(num_workers, worker)
    if case == SHUFFLE_CASES[2]:
        return ds.shard(num_workers, worker).shuffle(n)
    raise ValueError(f"case must be one of {SHUFFLE_CASES}, got {case!r}")


def shuffle_shard_cases(n: int, num_workers: int, seed: int = 7, cases=SHUFFLE_CASES) -> list[dict]:
    """One epoch of every simulated worker for each case: ``{"case", "per_worker" (ids), "count",
    "duplicated", "missing"}``. Each worker's pipeline is built separately, as each worker of a cluster
    builds its own."""
    rows = []
    for case in cases:
        per_worker = [sorted(int(i) for i in worker_pipeline(case, n, num_workers, w, seed).as_numpy_iterator())
                      for w in range(num_workers)]
        rows.append({"case": case, "per_worker": per_worker, **_coverage(per_worker, n)})
    return rows


def short_ids(ids: list[int], limit: int = 6) -> str:
    """Sorted ids as runs: ``0–31, 64–95``; at most ``limit`` runs, then ``…``."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(f"{a}–{b}" if b > a else f"{a}" for a, b in runs[:limit])
    return text + (", …" if len(runs) > limit else "")


def plot_worker_ids(cases: dict[str, list[list[int]]], n: int, title: str = ""):
    """One strip per case: which worker read which id (a row per worker), and below it how many times each
    id was read in total (white: once; red: never; orange: more than once). Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    fig, axes = plt.subplots(len(cases), 1, figsize=(10, 0.55 * sum(len(w) + 1.6 for w in cases.values())),
                             squeeze=False)
    count_cmap = ListedColormap(["#d62728", "#ffffff", "#ff7f0e", "#ff7f0e"])
    for ax, (name, per_worker) in zip(axes[:, 0], cases.items()):
        grid = np.zeros((len(per_worker) + 1, n))
        for w, ids in enumerate(per_worker):
            grid[w, ids] = 1 + w
        counts = np.bincount(np.asarray([i for ids in per_worker for i in ids], np.int64), minlength=n)[:n]
        img = np.ma.masked_equal(grid[:-1], 0)
        ax.imshow(img, aspect="auto", cmap="tab10", vmin=1, vmax=10, interpolation="nearest",
                  extent=(-0.5, n - 0.5, len(per_worker) + 0.5, 0.5))
        ax.imshow(np.minimum(counts, 3)[None, :], aspect="auto", cmap=count_cmap, vmin=0, vmax=3,
                  interpolation="nearest", extent=(-0.5, n - 0.5, len(per_worker) + 1.5, len(per_worker) + 0.5))
        ax.set_ylim(len(per_worker) + 1.5, 0.5)
        ax.set_yticks(list(range(1, len(per_worker) + 1)) + [len(per_worker) + 1],
                      [f"worker {w}" for w in range(len(per_worker))] + ["times read"])
        dup, miss = int((counts > 1).sum()), int((counts == 0).sum())
        ax.set_title(f"{name}: {dup} ids read more than once (orange), {miss} never (red)", fontsize=10, loc="left")
        ax.tick_params(axis="y", labelsize=8)
    axes[-1, 0].set_xlabel("example id")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------
# Speed: interleaved repeats, the input-bound check, prefetch with a simulated accelerator
# ----------------------------------------------------------------------------------------------


def drain(ds) -> int:
    """Read one pass of ``ds``; returns the number of examples (first dimension of each batch)."""
    import tensorflow as tf

    count = 0
    for batch in ds:
        count += int(tf.shape(tf.nest.flatten(batch)[0])[0])
    return count


def pipeline_throughput(ds, epochs: int = 2, max_batches: int | None = None) -> float:
    """Images per second the pipeline alone delivers, over ``epochs`` full passes (no training)."""
    count, start = 0, time.perf_counter()
    for _ in range(epochs):
        count += drain(ds.take(max_batches) if max_batches else ds)
    return count / (time.perf_counter() - start)


def interleaved_times(fns: dict[str, Callable[[], Any]], rounds: int = 5, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each function, timed in ``rounds`` interleaved rounds (A, B, C, A, B, C, …) after
    ``warmup`` untimed calls each, so a drift of the machine hits every variant alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def ratio_samples(times: dict[str, list[float]], slow: str, fast: str) -> Samples:
    """Per-round ``slow / fast`` time ratios from :func:`interleaved_times`: how many times faster ``fast`` is."""
    return Samples([a / b for a, b in zip(times[slow], times[fast])])


def without_auto_prefetch(ds):
    """``ds`` with tf.data's own overlap switched off: TF 2.20 by default parallelises stateless maps
    (``map_parallelization``), fuses ``map`` + ``batch`` into one asynchronous step (``map_and_batch_fusion``)
    and injects a prefetch after a final synchronous step (``inject_prefetch``), so a pipeline without
    ``prefetch`` is rarely synchronous. This shows what the explicit ``prefetch`` does on its own."""
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    options.experimental_optimization.map_parallelization = False
    options.experimental_optimization.map_and_batch_fusion = False
    return ds.with_options(options)


def simulated_accelerator(ds, step_s: float) -> Callable[[], int]:
    """A training loop whose step runs *elsewhere*: for each batch the host waits ``step_s`` seconds (sleeping,
    cores free), as a TPU host waits for the chip. Returns a function that runs one epoch."""

    def run_epoch() -> int:
        n = 0
        for _ in ds:
            time.sleep(step_s)
            n += 1
        return n

    return run_epoch


@dataclasses.dataclass
class BottleneckReport:
    pipeline_images_per_s: float  # the input pipeline alone, no training
    step_images_per_s: float  # the training step alone, on one batch already in memory
    batch_size: int

    @property
    def bottleneck(self) -> str:
        return "input pipeline" if self.pipeline_images_per_s < self.step_images_per_s else "training step"

    @property
    def ratio(self) -> float:
        """How many times faster the pipeline is than the step (< 1: input-bound)."""
        return self.pipeline_images_per_s / self.step_images_per_s

    def __str__(self) -> str:
        verdict = (
            "INPUT-BOUND: the accelerator waits for data — tune the pipeline (parallel map, cache, prefetch)"
            if self.bottleneck == "input pipeline"
            else "COMPUTE-BOUND: the pipeline keeps up — speed up the step (bigger batch, mixed precision, XLA)"
        )
        return (
            f"pipeline alone: {self.pipeline_images_per_s:,.0f} images/s · training step alone: "
            f"{self.step_images_per_s:,.0f} images/s (pipeline/step = {self.ratio:.2f}×) → {verdict}"
        )


def input_bound_check(model, ds, steps: int = 10, repeats: int = 5) -> BottleneckReport:
    """Measure the pipeline alone (``steps`` batches, after one warm-up batch) and the compiled model's
    training step alone (on one batch already in memory, median of ``repeats``); say which is slower."""
    from ..timing import time_fn

    it = iter(ds.repeat())
    x, y = next(it)  # warm-up: starts the pipeline's threads and fills buffers
    batch_size = int(x.shape[0])
    start = time.perf_counter()
    for _ in range(steps):
        next(it)
    pipeline = steps * batch_size / (time.perf_counter() - start)
    step = time_fn(lambda: model.train_on_batch(x, y, return_dict=True)["loss"], repeats=repeats, warmup=2)
    return BottleneckReport(pipeline, batch_size / step.median_s, batch_size)


def plot_speedups(speedups: dict[str, Samples], title: str = ""):
    """Horizontal bars: median speed-up of each comparison, with its spread as an error bar, and a line at
    1× (no change). Returns the figure."""
    import matplotlib.pyplot as plt

    names = list(speedups)
    med = [speedups[k].median for k in names]
    err = [[m - speedups[k].low for k, m in zip(names, med)], [speedups[k].high - m for k, m in zip(names, med)]]
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(names) + 1.2))
    colors = ["#2ca02c" if speedups[k].low > 1 else "#7f7f7f" if speedups[k].high >= 1 else "#d62728" for k in names]
    ax.barh(range(len(names)), med, xerr=err, color=colors, capsize=4)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("speed-up (× as fast; bar: median, whisker: spread of the repeats)")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
