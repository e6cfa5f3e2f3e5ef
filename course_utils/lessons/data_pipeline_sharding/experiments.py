"""Lesson 04's experiments: what reaches each replica and each worker, and what the pipeline's tuning buys.

* replicas: :func:`replica_checks` (every example exactly once, both APIs, with and without
  ``drop_remainder``) and :func:`remainder_split` (how each API deals out a ragged last step) — each returns a
  JSON-able dict, so ``runtime.run_with_replicas(4, strategy, replica_checks, ...)`` can run it in a fresh
  process with 4 CPU replicas;
* workers: :func:`auto_shard_table` (FILE / DATA / OFF on simulated workers) and :func:`shuffle_shard_cases`
  (an unseeded shuffle before ``shard`` against the two fixes), drawn by :func:`plot_worker_ids`;
* speed: :func:`interleaved_times` (several variants timed in interleaved rounds), :func:`input_bound_check`,
  :func:`simulated_accelerator` (a training loop whose step runs "elsewhere", as on a TPU), :func:`plot_speedups`;
* the lesson's claims: :func:`claims` (the table, from the notebook's results).

The tools themselves (loading, ``build_pipeline``, ``distribute``, TFRecords) are in :mod:`course_utils.data`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from ...data import APIS, distribute, tfrecord_dataset
from ...profiler import INPUT_BOUND_ABOVE
from ...report import Samples
from ...runtime import usable_cores  # noqa: F401 - the notebook's exp.usable_cores (§4)
from ... import data, models, profiler, report
from ... import runtime as _runtime
from ...data import augment, augment_batch, parse_record, to_float
from ...timing import time_fn

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
    n_rep = strategy.num_replicas_in_sync
    rows = []
    for n in examples:
        row = {"examples": int(n), "remainder": int(n % (per_replica_batch * n_rep))}
        for api in APIS:
            _, shapes = seen_ids(
                strategy,
                distribute(strategy, tf.data.Dataset.range(n), per_replica_batch * n_rep, api, drop_remainder=False),
            )
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
    # TensorFlow's internals, imported here: a release that moves them fails this function, not the lesson's import
    from tensorflow.python.data.experimental.ops import distribute as _dist

    rewrite = getattr(_dist, "_AutoShardDataset", None)
    if rewrite is None:
        raise RuntimeError(
            f"TensorFlow {tf.__version__} has no tensorflow.python.data.experimental.ops.distribute."
            "_AutoShardDataset any more: course_utils.lessons.data_pipeline_sharding.experiments.shard_as_worker needs "
            "updating for this release"
        )
    return rewrite(
        ds, input_context.num_input_pipelines, input_context.input_pipeline_id, input_context.num_replicas_in_sync
    )


def _coverage(per_worker: list[list[int]], n_total: int) -> dict:
    all_ids = [i for ids in per_worker for i in ids]
    counts = np.bincount(np.asarray(all_ids, np.int64), minlength=n_total) if all_ids else np.zeros(n_total, int)
    return {"duplicated": int((counts > 1).sum()), "missing": int((counts == 0).sum()), "count": len(all_ids)}


def auto_shard_table(paths: list[str], num_workers: int, policies=("FILE", "DATA", "OFF")) -> list[dict]:
    """Which example ids each simulated worker reads under each auto-shard policy.

    Rows: policy, worker, count, ids (as runs, or the error), id_list; plus per policy a summary row (worker
    ``"all"``) with failed, duplicated and missing ids over the whole dataset.
    """
    n_total = sum(1 for p in paths for _ in tf.data.TFRecordDataset(p))
    rows = []
    for policy in policies:
        per_worker, failed = [], False
        for w in range(num_workers):
            ctx = tf.distribute.InputContext(
                num_input_pipelines=num_workers, input_pipeline_id=w, num_replicas_in_sync=num_workers
            )
            try:
                ids = sorted(int(e["id"]) for e in shard_as_worker(tfrecord_dataset(paths, policy), ctx))
                rows.append(
                    {
                        "policy": policy,
                        "worker": w,
                        "count": len(ids),
                        "ids": short_ids(ids) or "(nothing)",
                        "id_list": ids,
                    }
                )
            except Exception as exc:  # noqa: BLE001 - FILE with too few files fails: show it
                msg = str(exc).split("Could not apply FILE based sharding:")[-1].strip().splitlines()[0]
                msg = msg.split(" If you are using")[0]
                rows.append(
                    {"policy": policy, "worker": w, "count": 0, "ids": f"{type(exc).__name__}: {msg}", "id_list": []}
                )
                ids, failed = [], True
            per_worker.append(ids)
        cov = _coverage(per_worker, n_total)
        rows.append(
            {
                "policy": policy,
                "worker": "all",
                "failed": failed,
                **cov,
                "ids": ("FAILED on some workers; " if failed else "")
                + f"{cov['duplicated']} ids duplicated, {cov['missing']} missing of {n_total}",
            }
        )
    return rows


UPSTREAM_CASES = (
    "DATA after shuffle(n), no seed",
    "DATA after shuffle(n, seed=SEED)",
    "FILE on list_files(pattern), its default shuffle",
    "FILE on list_files(pattern, shuffle=False)",
)


def upstream_order_cases(pattern: str, num_workers: int, seed: int = 7, cases=UPSTREAM_CASES) -> list[dict]:
    """Auto-sharding when the order *above* the shard is random: each simulated worker builds its own pipeline
    and gets tf.distribute's rewrite (:func:`shard_as_worker`), as on a cluster. ``DATA`` keeps every k-th element
    of what its pipeline produces — TensorFlow's docstring: it "needs to produce elements in a deterministic
    order" — and ``FILE`` every k-th file of the file list, which ``list_files`` shuffles unless told not to.
    Returns ``{"case", "per_worker" (ids), "count", "duplicated", "missing"}`` per case."""

    def pipeline(case: str):
        options = tf.data.Options()
        if case.startswith("DATA"):
            ds = tf.data.Dataset.list_files(pattern, shuffle=False).interleave(tf.data.TFRecordDataset, cycle_length=1)
            ds = ds.map(parse_record).shuffle(10_000, seed=seed if "seed=" in case else None)
            options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        else:
            files = (
                tf.data.Dataset.list_files(pattern)
                if "default" in case
                else tf.data.Dataset.list_files(pattern, shuffle=False)
            )
            ds = files.interleave(tf.data.TFRecordDataset, cycle_length=1).map(parse_record)
            options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.FILE
        return ds.with_options(options)

    n = sum(1 for _ in tf.data.TFRecordDataset(tf.io.gfile.glob(pattern)))
    rows = []
    for case in cases:
        per_worker = []
        for w in range(num_workers):
            ctx = tf.distribute.InputContext(
                num_input_pipelines=num_workers, input_pipeline_id=w, num_replicas_in_sync=num_workers
            )
            per_worker.append(sorted(int(e["id"]) for e in shard_as_worker(pipeline(case), ctx)))
        rows.append({"case": case, "per_worker": per_worker, **_coverage(per_worker, n)})
    return rows


SHUFFLE_CASES = ("unseeded shuffle → shard", "seeded shuffle → shard", "shard → shuffle")


def worker_pipeline(case: str, n: int, num_workers: int, worker: int, seed: int = 7):
    """One worker's ``range(n)`` pipeline for one of :data:`SHUFFLE_CASES`.

    * ``unseeded shuffle → shard``: ``shuffle(n)`` with no seed, then ``shard`` — each worker draws its own
      random order, so the workers' every-k-th picks overlap (the pitfall);
    * ``seeded shuffle → shard``: the same ``seed`` on every worker — one order, split cleanly;
    * ``shard → shuffle``: each worker takes its share first, then shuffles it (any seed).
    """
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
        per_worker = [
            sorted(int(i) for i in worker_pipeline(case, n, num_workers, w, seed).as_numpy_iterator())
            for w in range(num_workers)
        ]
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

    fig, axes = plt.subplots(
        len(cases), 1, figsize=(10, 0.55 * sum(len(w) + 1.6 for w in cases.values())), squeeze=False
    )
    count_cmap = ListedColormap(["#d62728", "#ffffff", "#ff7f0e", "#ff7f0e"])
    for ax, (name, per_worker) in zip(axes[:, 0], cases.items()):
        grid = np.zeros((len(per_worker) + 1, n))
        for w, ids in enumerate(per_worker):
            grid[w, ids] = 1 + w
        counts = np.bincount(np.asarray([i for ids in per_worker for i in ids], np.int64), minlength=n)[:n]
        img = np.ma.masked_equal(grid[:-1], 0)
        ax.imshow(
            img,
            aspect="auto",
            cmap="tab10",
            vmin=1,
            vmax=10,
            interpolation="nearest",
            extent=(-0.5, n - 0.5, len(per_worker) + 0.5, 0.5),
        )
        ax.imshow(
            np.minimum(counts, 3)[None, :],
            aspect="auto",
            cmap=count_cmap,
            vmin=0,
            vmax=3,
            interpolation="nearest",
            extent=(-0.5, n - 0.5, len(per_worker) + 1.5, len(per_worker) + 0.5),
        )
        ax.set_ylim(len(per_worker) + 1.5, 0.5)
        ax.set_yticks(
            list(range(1, len(per_worker) + 1)) + [len(per_worker) + 1],
            [f"worker {w}" for w in range(len(per_worker))] + ["times read"],
        )
        dup, miss = int((counts > 1).sum()), int((counts == 0).sum())
        ax.set_title(f"{name}: {dup} ids read more than once (orange), {miss} never (red)", fontsize=10, loc="left")
        ax.tick_params(axis="y", labelsize=8)
    axes[-1, 0].set_xlabel("example id")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------
# The shuffle buffer: how much it mixes, what it holds (§2)
# ----------------------------------------------------------------------------------------------

SHUFFLE_IDS, SHUFFLE_CLASSES, SHUFFLE_BATCH = 1000, 10, 32  # §2: ids sorted by class, the batch read first
SHUFFLE_BUFFERS = (10, 100, SHUFFLE_IDS)
BUFFER_CASES = ("uint8, decoded", "float32, after to_float", "uint8, from an in-memory cache()")
CIFAR10_TRAIN = 50_000  # images in CIFAR-10's training split


def shuffle_mixing(
    buffers=SHUFFLE_BUFFERS,
    n: int = SHUFFLE_IDS,
    classes: int = SHUFFLE_CLASSES,
    batch: int = SHUFFLE_BATCH,
    seed: int = 0,
) -> list[dict]:
    """§2: ids 0…n−1 sorted by class (n / classes of each, like a class-sorted file), shuffled with each buffer
    size: how much order is left (the correlation of position and id: 1 = still sorted, ≈ 0 = shuffled), how many
    classes the first batch holds, and the largest id in it — at most batch + buffer − 2, since the k-th element out
    is one of the first k + buffer − 1 in (``shuffle`` samples from a buffer it refills from upstream)."""
    rows = []
    for buffer in buffers:
        order = np.fromiter(tf.data.Dataset.range(n).shuffle(buffer, seed=seed).as_numpy_iterator(), np.int64)
        first = order[:batch]
        rows.append(
            {
                "buffer": int(buffer),
                "order left": float(np.corrcoef(np.arange(n), order)[0, 1]),
                "classes in the first batch": len(set((first * classes // n).tolist())),
                "largest id in the first batch": int(first.max()),
            }
        )
    return rows


def shuffle_buffer_bytes(ds, buffer: int, seed: int = 0) -> int | None:
    """§2: how much the CPU allocator's memory in use grows while ``ds.shuffle(buffer)`` is full (its iterator made
    and one element taken: that fills the buffer). None where the allocator keeps no statistics (course_utils turns
    them on for the CPU: ``TF_CPU_ALLOCATOR_USE_BFC``)."""
    try:
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    except (ValueError, RuntimeError, tf.errors.OpError):
        return None
    iterator = iter(ds.shuffle(buffer, seed=seed))
    next(iterator)
    grown = tf.config.experimental.get_memory_info("CPU:0")["current"] - before
    del iterator
    return int(grown)


def shuffle_buffer_memory(encoded, n: int, seed: int = 0) -> dict:
    """§2: a shuffle buffer of all ``n`` examples of ``encoded`` (PNG-encoded images, labels), measured
    (:func:`shuffle_buffer_bytes`) and counted (n × the bytes of its first element), for the images decoded
    (uint8), the same after ``to_float`` (float32), and decoded images read from a filled in-memory ``cache()``:
    there the buffer holds references to the cache's tensors, not copies."""
    decoded = encoded.take(n).map(data.decode_png)
    cached = decoded.cache()
    drain(cached)  # fill the cache first: its memory is not the buffer's
    _destroy_retired()
    out = {}
    for case, ds in zip(BUFFER_CASES, (decoded, decoded.map(data.to_float), cached)):
        one = sum(t.numpy().nbytes for t in tf.nest.flatten(next(iter(ds))))  # decoded PNGs have no static shape
        out[case] = {"measured": shuffle_buffer_bytes(ds, n, seed), "counted": n * one}
    return out


# ----------------------------------------------------------------------------------------------
# Speed: interleaved repeats, the input-bound check, prefetch with a simulated accelerator
# ----------------------------------------------------------------------------------------------


_RETIRED: list = []  # drained iterators, destroyed once the timer has stopped (:func:`interleaved_times`)


def _retire(iterator) -> None:
    """Keep a drained iterator alive until the timing around it has ended. TensorFlow (2.20, 2.21) destroys an
    iterator only once its tf.data autotuning thread wakes from a sleep that grows with the iterator's life: measured
    here on one core, 0–67 ms after a 0.11 s pass of the tuned pipeline (``data.without_autotune`` has the long
    case). That wait is not the pipeline's speed, and it came in some rounds only: a tuned pipeline read 0.86× as
    fast as the naive one."""
    _RETIRED.append(iterator)


def _destroy_retired() -> None:
    _RETIRED.clear()


def drain(ds) -> int:
    """Read one pass of ``ds``; returns the number of examples (first dimension of each batch). The iterator is
    destroyed after the timing around it (:func:`_retire`): by :func:`interleaved_times` or
    :func:`pipeline_throughput`; a ``drain`` outside them leaves it alive until one of them runs."""
    count = 0
    iterator = iter(ds)
    for batch in iterator:
        count += int(tf.shape(tf.nest.flatten(batch)[0])[0])
    _retire(iterator)
    return count


def pipeline_throughput(ds, epochs: int = 2, max_batches: int | None = None) -> float:
    """Images per second the pipeline alone delivers, over ``epochs`` full passes (no training)."""
    count, start = 0, time.perf_counter()
    for _ in range(epochs):
        count += drain(ds.take(max_batches) if max_batches else ds)
    seconds = time.perf_counter() - start
    _destroy_retired()
    return count / seconds


def interleaved_times(fns: dict[str, Callable[[], Any]], rounds: int = 5, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each function, timed in ``rounds`` interleaved rounds (A, B, C, A, B, C, …) after
    ``warmup`` untimed calls each, so a drift of the machine hits every variant alike. Iterators that :func:`drain`
    and :func:`simulated_accelerator` read are destroyed after each call's timer stops (:func:`_retire`)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
            _destroy_retired()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
            _destroy_retired()
    return times


def ratio_samples(times: dict[str, list[float]], slow: str, fast: str) -> Samples:
    """Per-round ``slow / fast`` time ratios from :func:`interleaved_times`: how many times faster ``fast`` is."""
    return Samples([a / b for a, b in zip(times[slow], times[fast])])


def without_auto_prefetch(ds):
    """``ds`` with tf.data's own overlap switched off: TF 2.20 by default parallelises stateless maps
    (``map_parallelization``), fuses ``map`` + ``batch`` into one asynchronous step (``map_and_batch_fusion``)
    and injects a prefetch after a final synchronous step (``inject_prefetch``), so a pipeline without
    ``prefetch`` is rarely synchronous. This shows what the explicit ``prefetch`` does on its own."""
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
        iterator = iter(ds)
        for _ in iterator:
            time.sleep(step_s)
            n += 1
        _retire(iterator)
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
    it = iter(ds.repeat())
    x, y = next(it)  # warm-up: starts the pipeline's threads and fills buffers
    batch_size = int(x.shape[0])
    start = time.perf_counter()
    for _ in range(steps):
        next(it)
    pipeline = steps * batch_size / (time.perf_counter() - start)
    step = time_fn(lambda: model.train_on_batch(x, y, return_dict=True)["loss"], repeats=repeats, warmup=2)
    return BottleneckReport(pipeline, batch_size / step.median_s, batch_size)


# ----------------------------------------------------------------------------------------------
# Reading files (interleave, deterministic=False), batching before map, the profiler's view
# ----------------------------------------------------------------------------------------------

BUCKET_OPEN_S = 0.02  # simulated: opening one file in a cloud bucket
BUCKET_REQUEST_S = 0.008  # simulated: one request for the next REQUEST_RECORDS records of a file
REQUEST_RECORDS = 16
TAIL_S = 0.08  # simulated tail latency: a slow request takes this long instead of BUCKET_REQUEST_S
TAIL_ONE_IN = 8  # one request in this many, in each file, is slow
IO_THREADS = 32
READ_CASES = (
    "local files, one at a time",
    "local files, interleave",
    "bucket, one file at a time",
    "bucket, interleave",
)
MAP_CASES = ("per image: map → batch", "per batch: batch → map")
ONE_CORE_MAP = (
    "one usable core: map → batch runs as one fused tf.data step, batch → map as two that take turns on the "
    "core — measured 0.6–1.0× on one core of the course's test machines, 2× and more on two"
)
CROP_CASES = ("data.augment_batch", "random_crop on the batch (wrong)")
PROFILE_CASES = ("bucket, one file at a time", "in memory (train_pipeline)")


def bucket_batch_ms(batch_size: int, request_s: float = BUCKET_REQUEST_S) -> float:
    """The simulated bucket's wait for one batch read one file at a time: its requests of :data:`REQUEST_RECORDS`
    records each, one after another (the files' openings left out). A training step that takes longer than this
    leaves the pipeline time to keep up, and nothing waits (§6's profile)."""
    return -(-int(batch_size) // REQUEST_RECORDS) * request_s * 1e3


def _waited(x, seconds: float, slow=None, slow_s: float = 0.0):
    """``x`` unchanged, after sleeping ``seconds`` (``slow_s`` where the boolean tensor ``slow`` is true)."""

    def wait(value, is_slow):
        time.sleep(slow_s if bool(is_slow) else seconds)
        return value

    out = tf.py_function(wait, [x, False if slow is None else slow], x.dtype)
    out.set_shape(x.shape)
    return out


def bucket_reader(open_s: float = BUCKET_OPEN_S, request_s: float = BUCKET_REQUEST_S, tail_s: float | None = None):
    """``path → its records``, read as from a cloud bucket: the file takes ``open_s`` to open and each request for
    :data:`REQUEST_RECORDS` records ``request_s``. With ``tail_s``, one request in :data:`TAIL_ONE_IN` of each file
    takes ``tail_s`` instead (which one depends on the file: the slow requests of different files fall at different
    times). The waits are sleeps: time passes, no core works — as when a TPU host waits for Cloud Storage. Local
    files in the page cache have nothing to wait for, so this is what ``interleave`` is for."""

    def read(path):
        opened = tf.data.Dataset.from_tensors(path).map(lambda p: _waited(p, open_s))
        requests = opened.flat_map(tf.data.TFRecordDataset).batch(REQUEST_RECORDS).enumerate()
        phase = tf.strings.to_hash_bucket_fast(path, TAIL_ONE_IN)

        def request(k, chunk):
            slow = tf.equal((k + phase) % TAIL_ONE_IN, 0) if tail_s is not None else None
            return _waited(chunk, request_s, slow, tail_s or 0.0)

        return requests.map(request).unbatch()

    return read


def with_io_threads(ds, threads: int = IO_THREADS):
    """``ds`` with a private pool of ``threads`` tf.data threads. A simulated wait (:func:`bucket_reader`) runs as a
    TensorFlow op on tf.data's pool, which has one thread per core: on 2 cores at most 2 waits overlap (measured). A
    real bucket read waits inside the interleave's own threads, so the simulation gets threads to wait in."""
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    return ds.with_options(options)


def _records_to_batches(records, batch_size: int):
    batches = records.map(parse_record, num_parallel_calls=tf.data.AUTOTUNE).batch(batch_size)
    return with_io_threads(batches.prefetch(tf.data.AUTOTUNE))


def read_pipelines(paths: list[str], batch_size: int) -> dict[str, Any]:
    """The :data:`READ_CASES`: the files read one after another (``flat_map``) or ``interleave``d (all files in flight,
    ``num_parallel_calls=AUTOTUNE``), from local disk and from a simulated bucket (:func:`bucket_reader`); each parsed
    and batched the same way. Elements are :func:`data.parse_record` dicts (``id``, ``image``, ``label``)."""
    files = tf.data.Dataset.from_tensor_slices(paths)
    bucket = bucket_reader()
    return {
        READ_CASES[0]: _records_to_batches(files.flat_map(tf.data.TFRecordDataset), batch_size),
        READ_CASES[1]: _records_to_batches(
            files.interleave(tf.data.TFRecordDataset, cycle_length=len(paths), num_parallel_calls=tf.data.AUTOTUNE),
            batch_size,
        ),
        READ_CASES[2]: _records_to_batches(files.flat_map(bucket), batch_size),
        READ_CASES[3]: _records_to_batches(
            files.interleave(bucket, cycle_length=len(paths), num_parallel_calls=tf.data.AUTOTUNE), batch_size
        ),
    }


def tail_latency_pipelines(paths: list[str], batch_size: int, cycle_length: int = 4) -> dict[bool, Any]:
    """``interleave(..., deterministic=flag)`` for both flags, over a bucket with tail latency (one slow request in
    :data:`TAIL_ONE_IN`), ``cycle_length`` files in flight."""
    files = tf.data.Dataset.from_tensor_slices(paths)
    bucket = bucket_reader(tail_s=TAIL_S)
    return {
        flag: _records_to_batches(
            files.interleave(bucket, cycle_length=cycle_length, num_parallel_calls=cycle_length, deterministic=flag),
            batch_size,
        )
        for flag in (True, False)
    }


def arrival_ids(ds) -> np.ndarray:
    """The ``id`` of every record, in the order ``ds`` (batches of :func:`data.parse_record` dicts) delivers them."""
    return np.concatenate([batch["id"] for batch in ds.as_numpy_iterator()])


def fused_map_order(n: int = 256, batch_size: int = 32, slow_one_in: int = 16, slow_s: float = 0.02) -> dict:
    """``map(f, num_parallel_calls=4, deterministic=False).batch(n)`` where one element in ``slow_one_in`` takes
    ``slow_s``: how many elements arrive out of place with tf.data's ``map_and_batch_fusion`` on (the default: map
    and batch become one step) and off. The slow calls sleep, so they get threads to sleep in
    (:func:`with_io_threads`): with one core, tf.data's own pool runs one call at a time and nothing can overtake."""

    def wait(i):
        time.sleep(slow_s if int(i) % slow_one_in == 0 else slow_s / 20)
        return i

    def slow(i):
        out = tf.py_function(wait, [i], tf.int64)
        out.set_shape(())
        return out

    moved = {}
    for fusion in (True, False):
        options = tf.data.Options()
        options.experimental_optimization.map_and_batch_fusion = fusion
        ds = tf.data.Dataset.range(n).map(slow, num_parallel_calls=4, deterministic=False).batch(batch_size)
        order = np.concatenate(list(with_io_threads(ds.with_options(options)).as_numpy_iterator()))
        moved["fused (default)" if fusion else "fusion off"] = int((order != np.arange(n)).sum())
    return moved


def map_placement_pipelines(images, batch_size: int) -> dict[str, Any]:
    """The :data:`MAP_CASES` on ``images`` (uint8 ``(image, label)`` pairs, cached): random augmentation per image
    (:func:`data.augment`, then ``batch``) or per batch (``batch``, then :func:`data.augment_batch`), both
    ``num_parallel_calls=AUTOTUNE`` and prefetched."""
    auto = tf.data.AUTOTUNE
    return {
        MAP_CASES[0]: images.map(lambda x, y: augment(*to_float(x, y)), num_parallel_calls=auto)
        .batch(batch_size)
        .prefetch(auto),
        MAP_CASES[1]: images.batch(batch_size)
        .map(lambda x, y: augment_batch(*to_float(x, y)), num_parallel_calls=auto)
        .prefetch(auto),
    }


def augment_batch_one_crop(images, labels, pad: int = 4):
    """WRONG, on purpose: the per-image recipe applied to a batch — ``tf.image.random_crop`` on a 4-D batch draws
    one crop offset for the whole batch."""
    size = images.shape[1]
    images = tf.image.random_flip_left_right(images)
    images = tf.image.resize_with_crop_or_pad(images, size + 2 * pad, size + 2 * pad)
    return tf.image.random_crop(images, tf.stack([tf.shape(images)[0], size, size, 3])), labels


def distinct_crops(augment_fn, batch_size: int, pad: int = 4) -> int:
    """How many different vertical crop offsets ``augment_fn`` (a batch function like :func:`data.augment_batch`)
    gives the images of one batch: each image's rows are numbered in its pixels, so the crop is read back."""
    size = 32
    rows = np.broadcast_to((np.arange(size) + 100)[None, :, None, None], (batch_size, size, size, 3)).astype(np.uint8)
    out, _ = augment_fn(tf.constant(rows), tf.zeros([batch_size], tf.int64), pad=pad)
    middle = np.asarray(out)[:, size // 2, size // 2, 0].astype(int)  # = 100 + size // 2 + offset - pad
    return len(set((middle - 100 - size // 2 + pad).tolist()))


PROFILED_STEPS = 6  # §6: steps profiled after the first and counted in the share of waiting
PROFILE_TRIES = 3  # §6: profiled runs at most, while the training loop paused among them
PAUSE_FLOOR_MS = 100.0  # §6: a pause of the loop shorter than this (or than 2 steps) cannot feed much from a buffer


@dataclasses.dataclass(frozen=True)
class ProfiledShare:
    """:func:`profiled_input_share`'s answer: the share of each steady step spent waiting for input (steps 2 on of the
    profile; step 1 starts the pipeline), the longest pause of the training loop between getting a batch and asking
    for the next beyond its usual (``pause_ms``; None where the profile does not say when a step asked for its batch:
    an accelerator's input pipeline analysis), the pause above which the steps after it may have been fed from the pipeline's buffers
    (``pause_limit_ms``), how many profiled runs it took, and the profile itself read as is (every profiled step)."""

    input_share: float
    steps: int
    step_ms: float
    pause_ms: float | None
    pause_limit_ms: float
    tries: int
    reading: Any  # course_utils.profiler.ProfileReading
    after_first: bool = True  # the share leaves the first profiled step out (False: too few steps to)

    @property
    def paused(self) -> bool:
        """The loop paused long enough for a slow pipeline to run ahead: the share may hide waiting."""
        return self.pause_ms is not None and self.pause_ms > self.pause_limit_ms

    @property
    def bound(self) -> str:
        return "input-bound" if self.input_share > INPUT_BOUND_ABOVE else "compute-bound"

    @property
    def stall(self) -> str:
        """'' for a profile of steady steps, else what went wrong, in words."""
        if not self.paused:
            return ""
        return (
            f"the training loop paused between two profiled steps in each of {self.tries} profiled runs "
            f"({self.pause_ms:.0f} ms in the last: a busy machine)"
        )

    def __str__(self) -> str:
        text = (
            f"{self.bound}: {self.input_share:.1%} of each step waits for input ({self.steps} profiled steps"
            f"{' after the first' if self.after_first else ''}, {self.step_ms:.1f} ms each; from "
            f"{self.reading.source})"
        )
        if self.paused:
            text += (
                f"\nnot a steady profile: {self.stall}, so the pipeline ran ahead and the steps after the pause "
                "were fed from its buffers"
            )
        return text + (f"\nprofiler: {self.reading.conclusion}" if self.reading.conclusion else "")


def steady_share(reading, pause_floor_ms: float = PAUSE_FLOOR_MS) -> ProfiledShare:
    """The profile ``reading`` (:func:`course_utils.profiler.read_input_bound`) of a run profiled from its first step,
    read for the steady steps: the share of waiting over steps 2 on (the first waits for the pipeline to start: a
    shuffle buffer to fill, a file to open), and the longest pause of the loop between getting a batch and asking for
    the next, beyond the usual (the median), over all of them. While the loop pauses, a slow pipeline goes on filling
    its buffers, and the steps after the pause are fed from them: above ``max(2 steps, pause_floor_ms)`` the share may
    hide waiting (:attr:`ProfiledShare.paused`). An accelerator's input pipeline analysis does not say when a step
    asked for its batch: no pause then (None); fewer than 3 steps: the reading as is."""
    import statistics

    timeline = reading.timeline
    if len(timeline) < 3:
        return ProfiledShare(
            reading.input_share, reading.steps, reading.step_ms, None, pause_floor_ms, 1, reading, after_first=False
        )
    steady = timeline[1:]
    total = sum(t.step_ms for t in steady)
    share = min(sum(t.wait_ms for t in steady) / total, 1.0) if total > 0 else 0.0
    between = [
        b.asked_ms - a.got_ms for a, b in zip(timeline, timeline[1:]) if a.got_ms is not None and b.asked_ms is not None
    ]
    pause = max(between) - statistics.median(between) if len(between) >= 2 else None
    limit = max(2 * statistics.median(t.step_ms for t in steady), pause_floor_ms)
    return ProfiledShare(share, len(steady), total / len(steady), pause, limit, 1, reading)


def profiled_input_share(
    model, ds, log_dir: str, steps: int = PROFILED_STEPS, tries: int = PROFILE_TRIES
) -> ProfiledShare:
    """Train ``model`` on ``ds`` for ``steps + 1`` steps with Keras' TensorBoard callback profiling all of them, and
    read the profile (:func:`course_utils.profiler.read_input_bound`, then :func:`steady_share`): the share of each
    step after the first spent waiting for input.

    One step is trained first, in a fit of its own, so the training function is built (and, with XLA, compiled)
    before the profiled run starts. The profile starts with the run's first step, when the pipeline starts: a slow
    pipeline only gets ahead of the steps while the training loop does not ask for data, and any such pause is in the
    profile. Measured on 2 busy cores (lesson 04, the bucket read one file at a time, about 100 ms a batch), profiling
    steps 3 to 6 instead: a pause of the loop before step 3 let the pipeline fill its buffers (up to 7 batches), and
    the 4 profiled steps were fed from them — with XLA, step 1 compiling in the profiled run: 11% waiting instead of
    93%; with the function built first, a pause of the loop (a garbage collection, 0.1–0.25 s each in this process;
    the machine busy elsewhere): 1–3% waiting, 11 ms steps, instead of ~85% and 100 ms. Garbage collection is off
    during the run; a run whose loop paused anyway (:attr:`ProfiledShare.paused`) is profiled again, up to ``tries``
    runs (each in ``log_dir/try<n>`` after the first); if every run paused, the last is returned, ``paused``."""
    import gc
    import os

    model.fit(ds.take(1), epochs=1, verbose=0)  # build and compile the train function; this iterator is dropped
    result = None
    for attempt in range(1, max(tries, 1) + 1):
        run_dir = log_dir if attempt == 1 else os.path.join(log_dir, f"try{attempt}")
        keras_profile = keras.callbacks.TensorBoard(run_dir, profile_batch=(1, steps + 1), write_graph=False)
        collecting = gc.isenabled()
        gc.disable()  # no collection pauses the loop (the garbage waits until after the run)
        try:
            model.fit(ds.repeat(), steps_per_epoch=steps + 1, epochs=1, callbacks=[keras_profile], verbose=0)
        finally:
            if collecting:
                gc.enable()
        result = dataclasses.replace(steady_share(profiler.read_input_bound(run_dir)), tries=attempt)
        if not result.paused:
            break
    return result


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


# ----------------------------------------------------------------------------------------------
# The lesson's claims: claims() turns what the notebook measured into the table
# ----------------------------------------------------------------------------------------------

# §7: the small CNN's speed-up a claim of a gain asks for. On a CPU it measures about 1x (medians 1.01-1.08x, middle
# halves reaching 1.16x at most in six proves of unchanged code on a 2-core CPU, with and without XLA): against 1.0x
# its verdict flipped between "holds" and "inconclusive" from run to run. The guides promise a large gain on a TPU.
SPE_CLEAR_GAIN = 1.2


def cache_order_rows(train, per_replica_batch: int) -> list[dict]:
    """§1: two epochs of two pipelines over 4 batches of ``train`` — random augmentation and shuffle before
    ``cache()`` (wrong), and ``cache()`` first (right, :func:`course_utils.data.build_pipeline`): whether each read
    the same order and the same pixels in both epochs."""

    def epoch(ds):  # one pass: the ids in arrival order, and the images sorted by id
        xs, ys = zip(*ds.as_numpy_iterator())
        ids = np.concatenate(ys)
        return ids, np.concatenate(xs)[np.argsort(ids, kind="stable")]

    small = train.take(4 * per_replica_batch)
    wrong = small.map(data.to_float).shuffle(1000, seed=1).map(data.augment).cache().batch(per_replica_batch)
    right = data.build_pipeline(small, per_replica_batch, seed=1)
    rows = []
    for name, ds in [
        ("shuffle + augment, then cache (wrong)", wrong),
        ("cache, then shuffle + augment (right)", right),
    ]:
        (ids1, im1), (ids2, im2) = epoch(ds), epoch(ds)
        rows.append(
            {
                "pipeline": name,
                "same order both epochs": bool(np.array_equal(ids1, ids2)),
                "same pixels both epochs": bool(np.array_equal(im1, im2)),
            }
        )
    return rows


def count_traces(n_examples: int, global_batch: int, drop_remainder: bool):
    """§4: one epoch of ``range(n_examples)`` batched by ``global_batch`` through a ``tf.function``: the dataset's
    batch shape, and the input shapes the function was traced for (one entry per new shape)."""
    traces = []

    @tf.function
    def step(x):
        traces.append(x.shape)  # Python runs only while tracing: one entry per new input shape
        return tf.reduce_sum(x)

    ds = tf.data.Dataset.range(n_examples).batch(global_batch, drop_remainder=drop_remainder)
    for x in ds:
        step(x)
    return ds.element_spec.shape, traces


class StepsAtEpochEnd(keras.callbacks.Callback):
    """The optimizer's step counter at the end of each epoch (``steps``)."""

    def __init__(self):
        super().__init__()
        self.steps: list[int] = []

    def on_epoch_end(self, epoch, logs=None):
        self.steps.append(int(self.model.optimizer.iterations))


RAN_OUT = "Your input ran out of data"  # the start of Keras 3's warning (keras/src/trainers/epoch_iterator.py)


def ran_out_of_data(batches: int, steps_per_epoch: int, epochs: int) -> dict:
    """§4: ``fit(steps_per_epoch=...)`` on a dataset of ``batches`` batches without ``.repeat()``. Returns the training
    steps each epoch really ran (the optimizer's counter), how many "ran out of data" warnings Keras gave, and the
    first one's text. Keras 3 does not stop ``fit``: it ends each epoch when the data ends and starts the next on a
    fresh pass (``EpochIterator``), warning every time."""
    import warnings

    x = np.zeros((batches * 8, 4), "float32")
    ds = tf.data.Dataset.from_tensor_slices((x, np.zeros(len(x), "int64"))).batch(8)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    counter = StepsAtEpochEnd()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(ds, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=0, callbacks=[counter])
    counts = counter.steps
    ran_out = [str(w.message) for w in caught if str(w.message).startswith(RAN_OUT)]
    return {
        "steps_per_epoch_run": [b - a for a, b in zip([0] + counts, counts)],
        "warnings": len(ran_out),
        "message": ran_out[0] if ran_out else "",
    }


def tiny_model():
    """§7: a model whose step is mostly overhead (one Dense layer over the flattened image)."""
    return keras.Sequential(
        [keras.Input((32, 32, 3)), keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")]
    )


def compiled(make_model, steps_per_execution: int, on_strategy, *, seed: int, jit: bool):
    """§7: a fresh ``make_model()`` in ``on_strategy``'s scope, compiled with ``steps_per_execution`` (and XLA when
    ``jit``); the same seed every time."""
    keras.utils.set_random_seed(seed)
    with on_strategy.scope():
        m = make_model()
        m.compile(
            optimizer="adam",
            loss="sparse_categorical_crossentropy",
            steps_per_execution=steps_per_execution,
            jit_compile=jit,
        )
    return m


class BatchLog(keras.callbacks.Callback):
    """The batch numbers ``on_train_batch_end`` was called with, in order (``.batches``)."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append(batch)


def fit_epochs(
    steps_per_execution: int, pipeline, on_strategy, *, seed: int, jit: bool, epochs: int = 1, tiny: bool = True
) -> list[int]:
    """§7: :func:`compiled` (the tiny model, or the small CNN) fitted on ``pipeline``: the batch numbers
    ``on_train_batch_end`` was called with, in order."""
    log = BatchLog()
    compiled(tiny_model if tiny else models.small_cnn, steps_per_execution, on_strategy, seed=seed, jit=jit).fit(
        pipeline, epochs=epochs, callbacks=[log], verbose=0
    )
    return log.batches


SPE_CHECK_TIMEOUT_S = 15.0  # §7: how long the several-replica check may run before it is stopped (it takes 3-4 s)


def spe_on_mirrored(strategy, steps_per_execution: int, seed: int = 0) -> dict:
    """§7: :func:`fit_epochs` of the tiny model with ``steps_per_execution`` under ``strategy``, on 8 global batches
    of random images held in memory: ``{"replicas", "outcome": "fit ran" or the error's class name, "error": the
    error's first line}`` (JSON-able: :func:`course_utils.runtime.run_with_replicas` runs it in a fresh process)."""
    replicas = strategy.num_replicas_in_sync
    batch = 8 * replicas
    rng = np.random.default_rng(seed)
    x = rng.random((8 * batch, 32, 32, 3), dtype=np.float32)
    y = rng.integers(0, 10, size=8 * batch).astype(np.int32)
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)
    try:
        fit_epochs(steps_per_execution, batches, strategy, seed=seed, jit=False)
    except Exception as err:  # noqa: BLE001 - the point: which error, in one line
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        said = next((line for line in lines if "You must feed" in line), lines[0] if lines else "")
        return {"replicas": replicas, "outcome": type(err).__name__, "error": said[:200]}
    return {"replicas": replicas, "outcome": "fit ran", "error": ""}


def spe_on_mirrored_fresh(steps_per_execution: int, replicas: int = 4, timeout: float = SPE_CHECK_TIMEOUT_S) -> dict:
    """§7: :func:`spe_on_mirrored` in a fresh process whose CPU is split into ``replicas`` devices (MirroredStrategy),
    stopped after ``timeout`` seconds. The step that fails there sometimes blocks its process long before it raises
    (TF 2.20, Keras 3.15.1, on 2 and 4 CPU replicas: about 1 run in 10 took 15-80 s instead of 3), so the notebook's
    own process stays out of it. A run stopped that way reads ``"outcome": "hung"``; a process that failed otherwise
    (it could not start TensorFlow), ``"process failed"`` with its last line, so that Run all goes on and the claim
    does not hold."""
    import subprocess

    where = f"a fresh process with {replicas} CPU replicas"
    try:
        return _runtime.run_with_replicas(
            replicas, None, spe_on_mirrored, timeout=timeout, steps_per_execution=steps_per_execution
        )
    except subprocess.TimeoutExpired:
        return {
            "replicas": replicas,
            "outcome": "hung",
            "where": where,
            "error": f"no result in {timeout:g} s: the process was stopped",
        }
    except RuntimeError as err:  # runtime.run_on_cpu_replicas: the process exited with an error
        lines = str(err).strip().splitlines()
        return {
            "replicas": replicas,
            "outcome": "process failed",
            "where": where,
            "error": lines[-1][:200] if lines else "",
        }


def simulated_download_error() -> str:
    """§1: what ``data.load_cifar10("tfds")`` raises when the hosts answer but the download fails (simulated with
    ``mock``: no network needed); "no error" if it loads."""
    from unittest import mock

    no_route = ConnectionError("simulated: no route to storage.googleapis.com")
    with (
        mock.patch.object(data, "_probe_hosts", return_value=(True, "simulated")),
        mock.patch.object(data, "_tfds_load", side_effect=no_route),
    ):
        try:
            data.load_cifar10("tfds")
            return "no error"
        except data.DataSourceError as e:
            return str(e)


def steps_per_execution_auto() -> str:
    """§7: ``compile(steps_per_execution="auto")`` (tf.keras 2 style) on a tiny model, then ``fit``: "fit ran", or
    the name of the error Keras 3 raises."""
    try:
        tiny = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        tiny.compile(optimizer="sgd", loss="mse", steps_per_execution="auto")
        tiny.fit(np.zeros((8, 4)), np.zeros((8, 1)), verbose=0)
        return "fit ran"
    except Exception as e:  # noqa: BLE001 - the claim is about which error
        return type(e).__name__


def _samples(values) -> Samples:
    return values if isinstance(values, Samples) else Samples(list(values))


def _upstream_claim(rows: list[dict]):
    """§5: auto-sharding after a random order — DATA overlaps unless the shuffle is seeded; FILE does not (the rewrite
    shards the file list before list_files' shuffle)."""
    by = {row["case"]: row for row in rows}
    clean = [by[c] for c in UPSTREAM_CASES[1:]]
    unseeded = by[UPSTREAM_CASES[0]]
    return CLAIMS.judge(
        "04.data_shard_after_unseeded_shuffle",
        "; ".join(f"{row['case']}: {row['duplicated']} dups, {row['missing']} missing" for row in rows),
        unseeded["duplicated"] > 0
        and unseeded["missing"] > 0
        and all(row["duplicated"] == row["missing"] == 0 for row in clean),
    )


def _shuffle_mixing_claim(rows: list[dict]):
    """§2: a small buffer leaves a class-sorted set nearly sorted; a buffer of the whole set shuffles it."""
    small, full = rows[0], rows[-1]
    return CLAIMS.judge(
        "04.small_shuffle_buffer",
        "; ".join(
            f"buffer {row['buffer']}: order left {row['order left']:.3f}, "
            f"{row['classes in the first batch']} classes, largest id {row['largest id in the first batch']}"
            for row in rows
        ),
        small["order left"] > 0.99
        and small["classes in the first batch"] == 1
        and full["buffer"] >= SHUFFLE_IDS
        and abs(full["order left"]) < 0.15
        and full["classes in the first batch"] > 5
        and all(row["largest id in the first batch"] <= SHUFFLE_BATCH + row["buffer"] - 2 for row in rows),
        small=small["buffer"],
        full=full["buffer"],
    )


def _buffer_memory_claim(memory: dict):
    """§2: a full buffer holds buffer × example bytes (float32 4× uint8); over a filled cache, references only."""
    if any(case["measured"] is None for case in memory.values()):
        return CLAIMS.judge(
            "04.shuffle_buffer_memory", "—", None, note="this runtime's CPU allocator keeps no statistics"
        )
    u8, f32, cached = (memory[case] for case in BUFFER_CASES)
    return CLAIMS.judge(
        "04.shuffle_buffer_memory",
        "; ".join(
            f"{case}: {m['measured'] / 2**20:.2f} MiB (counted {m['counted'] / 2**20:.2f})"
            for case, m in memory.items()
        ),
        all(abs(m["measured"] / m["counted"] - 1) < 0.1 for m in (u8, f32))
        and 3.6 < f32["measured"] / u8["measured"] < 4.4
        and cached["measured"] < 0.1 * cached["counted"],
    )


# Every claim of the lesson, declared once: its words, threshold and the function that measures it (claims.json's
# "where": a report card's row leads to the code). A "speed" figure is judged on the accelerator's own speed: under a
# GPU or TPU stand-in a CPU measures it, so one that does not hold there is marked, not failed.
CLAIMS = report.LessonClaims(
    "04",
    [
        report.Declared(
            "04.sources_agree",
            "Every source yields the same elements; a failed download is an error naming "
            "the offline options, never a switch",
            "course_utils.data; §1",
            "same spec; DataSourceError",
            where=simulated_download_error,
        ),
        report.Declared(
            "04.tuned_pipeline_faster",
            "A tuned pipeline (parallel map, cache, prefetch) delivers more images/s than a naive one",
            "tf.data performance guide; §2",
            "> 1× once the cache is filled (TPU host with many cores: more)",
            where=interleaved_times,
            op=">",
            threshold=1.0,
        ),
        report.Declared(
            "04.augment_before_cache_frozen",
            "Random augmentation or shuffle before cache() is frozen: epoch 2 replays epoch 1",
            "tf.data guide; §2",
            "same order and pixels",
            where=cache_order_rows,
        ),
        report.Declared(
            "04.small_shuffle_buffer",
            "A shuffle buffer smaller than the dataset mixes only nearby elements "
            "(a class-sorted set stays nearly sorted); only a buffer of the whole set shuffles it",
            "tf.data.Dataset.shuffle docs; §2",
            "buffer {small}: order left > 0.99, 1 class in the first batch; buffer {full} (all): "
            "|order left| < 0.15, > 5 classes; first batch's ids < batch + buffer − 1",
            where=shuffle_mixing,
        ),
        report.Declared(
            "04.shuffle_buffer_memory",
            "A shuffle buffer holds buffer × example bytes — 4× as much in "
            "float32 as in uint8; over a filled in-memory cache() it holds references, not copies",
            "tf.data shuffle; §2 (CPU allocator)",
            "uint8 and float32 within 10% of counted, float32 ≈ 4× uint8; from cache < 10% of counted",
            where=shuffle_buffer_memory,
        ),
        report.Declared(
            "04.interleave_overlaps_waits",
            "interleave overlaps the waits of reading files from a bucket: several files in flight instead of one",
            "tf.data performance guide (parallelizing data extraction); §2",
            "> 1× (up to the 8 files in flight)",
            where=read_pipelines,
            op=">",
            threshold=1.0,
        ),
        report.Declared(
            "04.nondeterministic_interleave_faster",
            "deterministic=False lets interleave hand out the next ready record: faster when some reads are slow",
            "tf.data performance guide (non-deterministic order); §2",
            "> 1×",
            where=tail_latency_pipelines,
            op=">",
            threshold=1.0,
        ),
        report.Declared(
            "04.nondeterministic_order",
            "deterministic=False changes the order; a parallel map followed by "
            "batch is fused into one step that keeps it",
            "measured: tf.data map_and_batch_fusion; §2",
            "interleave: records move; map → batch: 0 fused, > 0 unfused",
            where=fused_map_order,
        ),
        report.Declared(
            "04.batch_before_map_faster",
            "Batching before a cheap map (one call per batch) is faster than mapping each image, then batching",
            "tf.data performance guide (vectorizing mapping); §2",
            "> 1× (with 2+ cores)",
            where=map_placement_pipelines,
            op=">",
            threshold=1.0,
        ),
        report.Declared(
            "04.batch_random_crop_one_offset",
            "tf.image.random_crop on a batch crops every image at one offset; data.augment_batch draws one per image",
            "tf.image.random_crop; §2",
            "1 offset vs > 1",
            where=distinct_crops,
        ),
        report.Declared(
            "04.per_replica_batch",
            "Both APIs give each replica the per-replica batch (global batch / replicas)",
            "tf.distribute input guide; §3",
            "{replicas} × [{per_replica}]",
            where=local_shapes,
        ),
        report.Declared(
            "04.per_replica_batching_shrinks",
            "Per-replica batching before experimental_distribute_dataset "
            "shrinks the real global batch by the replica count",
            "popular mistake; §3",
            "{global_batch} → {shrunk}",
            where=local_shapes,
        ),
        report.Declared(
            "04.every_example_once",
            "One epoch delivers every example exactly once across replicas, ragged last batch included (both APIs)",
            "tf.distribute; §4",
            "all ids once",
            where=replica_checks,
        ),
        report.Declared(
            "04.ragged_remainder_dealt",
            "distribute_datasets_from_function deals the ragged remainder out in "
            "per-replica batches (the first replica gets all of it only when it is smaller than one "
            "per-replica batch)",
            "measured; §4",
            "{examples} examples → {dealt}",
            where=remainder_split,
        ),
        report.Declared(
            "04.drop_remainder_drops",
            "drop_remainder=True drops examples % global batch per epoch and gives one static shape (one trace)",
            "§4",
            "{dropped} dropped; 1 trace vs 2",
            where=count_traces,
        ),
        report.Declared(
            "04.auto_shard_policies",
            "Auto-shard: FILE and DATA split without duplicates, OFF duplicates, "
            "FILE fails with fewer files than workers",
            "tf.data distributed input; §5",
            "0 / 0 dups; OFF dups; FILE error",
            where=auto_shard_table,
        ),
        report.Declared(
            "04.unseeded_shuffle_before_shard",
            "An unseeded shuffle before shard makes workers overlap "
            "(duplicates and missing ids); shard first or seed it",
            "tf.data guide; §5",
            "unseeded: > 0 dups and > 0 missing; fixes: 0 / 0",
            where=shuffle_shard_cases,
        ),
        report.Declared(
            "04.data_shard_after_unseeded_shuffle",
            "Sharding by DATA after an unseeded shuffle overlaps the "
            "workers (DATA needs a deterministic order); seeded it splits cleanly; FILE shards the file list "
            "before list_files' own shuffle",
            "tf.data AutoShardPolicy; §5",
            "DATA unseeded: > 0 dups and > 0 missing; the other three: 0 / 0",
            where=upstream_order_cases,
        ),
        report.Declared(
            "04.spe_callbacks_every_n",
            "With steps_per_execution={N}, batch callbacks fire once every {N} steps",
            "Keras compile docs; §7",
            "⌈{steps}/{N}⌉ = {calls} calls per epoch",
            where=fit_epochs,
        ),
        report.Declared(
            "04.spe_auto_fails",
            'steps_per_execution must be an integer: "auto" fails in Keras 3',
            "Keras 3 behaviour; §7",
            "TypeError",
            where=steps_per_execution_auto,
        ),
        report.Declared(
            "04.spe_fails_on_mirrored",
            "steps_per_execution > 1 fails under MirroredStrategy with several "
            "replicas (Keras 3.13.2 and 3.15.1, TF 2.20 and 2.21)",
            "measured; keras-team/keras#19246; §7",
            "InvalidArgumentError",
            where=spe_on_mirrored,
        ),
        report.Declared(
            "04.spe_faster_tiny_model",
            "steps_per_execution={N} speeds up training when steps are short (tiny model, one replica)",
            "Keras/TPU guides; §7",
            "> 1× (TPU: large gain)",
            where=compiled,
            figure="speed",
            op=">",
            threshold=1.0,
        ),
        report.Declared(
            "04.spe_faster_small_cnn",
            f"steps_per_execution={{N}} speeds up training of the small CNN by "
            f"more than {SPE_CLEAR_GAIN - 1:.0%} (one replica)",
            "Keras/TPU guides; §7",
            "> {threshold}× (TPU: clear gain; CPU: about 1×)",
            where=compiled,
            figure="speed",
            op=">",
            threshold=SPE_CLEAR_GAIN,
            prose="more than {threshold}×",
        ),
        report.Declared(
            "04.prefetch_overlaps",
            "prefetch overlaps input preparation with a step that runs elsewhere (as on a TPU/GPU)",
            "tf.data performance guide; §7",
            "> 1× (up to 2×)",
            where=simulated_accelerator,
            figure="speed",
            op=">",
            threshold=1.0,
        ),
        report.Declared(
            "04.autotune_injects_prefetch",
            "TF 2.20's tf.data injects a prefetch by itself: with default options an explicit one adds little",
            "tf.data Options (inject_prefetch); §7",
            "< {threshold}×",
            where=simulated_accelerator,
            figure="speed",
            op="<",
            threshold=1.3,
        ),
        report.Declared(
            "04.input_bound_check",
            "The input-bound check names the slower half: on a CPU the model step, on a TPU often the pipeline",
            "§6",
            "CPU: training step",
            where=input_bound_check,
            figure="speed",
        ),
        report.Declared(
            "04.profile_shows_wait",
            "A training run's profile shows the wait: reading a bucket one file at a "
            "time is input-bound, the in-memory pipeline waits less",
            "TensorBoard profiler (input pipeline analysis); §6",
            "> {threshold:.0%} of each step waiting, and more than in memory",
            where=profiled_input_share,
            figure="speed",
            threshold=INPUT_BOUND_ABOVE,
        ),
    ],
)


def claims(r: dict) -> list:
    """Lesson 04's claims from the notebook's results. Speed-ups are
    per-round ratios (a :class:`Samples` or a list); ``summary`` maps each auto-shard policy to its ``"all"`` row."""
    replicas, per_replica_batch, global_batch = r["replicas"], r["per_replica_batch"], r["global_batch"]
    real_global, n_examples, N = r["real_global"], r["n_examples"], r["N"]
    checks, split, summary, kind, xla_label = r["checks"], r["split"], r["summary"], r["kind"], r["xla_label"]
    dfn = {row["drop_remainder"]: row for row in checks if row["api"] == APIS[1]}
    edd = {row["drop_remainder"]: row for row in checks if row["api"] == APIS[0]}
    unseeded, fixes = r["shuffle_rows"][0], r["shuffle_rows"][1:]
    traces_static, traces_ragged = r["traces_static"], r["traces_ragged"]
    spe = r["spe_mirrored"]  # §7's check: in a fresh process with several CPU replicas where the notebook has them
    mirrored_measurable = r["several_mirrored"] and spe["replicas"] > 1  # a TPU's CPU stand-in is a MirroredStrategy
    fused, crops, shares = r["fused_moved"], r["crops"], r["profile_shares"]
    stalls = {name: why for name, why in r["profile_stalls"].items() if why}  # profiled runs whose loop paused
    # a step slower than the bucket's read of a batch: the pipeline keeps up and nothing waits (one core of a 2-core
    # AVX2 VM, TensorFlow's Eigen kernels, full mode: 120 ms steps against the bucket's 64 ms: 0% waiting)
    compute_ms, read_ms = r["profile_step_ms"][PROFILE_CASES[1]], bucket_batch_ms(global_batch)
    if stalls:
        profile_note = (
            "; ".join(f"{name}: {why}" for name, why in stalls.items()) + ": a slow pipeline runs ahead "
            "while the loop pauses, and the steps after the pause are fed from its buffers"
        )
    elif compute_ms >= read_ms:
        profile_note = (
            f"this machine's step ({compute_ms:.0f} ms, in memory) outlasts the simulated bucket's read of a "
            f"batch ({read_ms:.0f} ms): the pipeline keeps up and nothing waits; on a TPU or GPU, whose step "
            "takes milliseconds, the wait shows"
        )
    else:
        profile_note = ""
    cpu_tiny = (
        "on a CPU the step runs where fit runs, so there is no host-to-device round trip for N steps per call "
        "to save: measured 0.6-1.2x across CPUs, cores and Keras versions; on a TPU each call is a round trip "
        "to the device — expect a large gain"
    )
    return CLAIMS.all(
        [
            CLAIMS.judge(
                "04.sources_agree",
                f"same spec: {r['same_spec']}; error names COURSE_DATA=synthetic: "
                f"{'COURSE_DATA=synthetic' in r['download_error']}",
                r["same_spec"] and "COURSE_DATA=synthetic" in r["download_error"],
            ),
            CLAIMS.judge_samples("04.tuned_pipeline_faster", r["pipeline_speedup"]),
            CLAIMS.judge(
                "04.augment_before_cache_frozen",
                f"wrong order frozen: {r['order_frozen']}; right order fresh: {r['order_fresh']}",
                r["order_frozen"] and r["order_fresh"],
            ),
            _shuffle_mixing_claim(r["shuffle_mixing"]),
            _buffer_memory_claim(r["buffer_memory"]),
            CLAIMS.judge_samples(
                "04.interleave_overlaps_waits",
                r["read_speedups"]["bucket"],
                note=f"simulated bucket; local files, warm in the page cache (nothing to wait for): "
                f"{_samples(r['read_speedups']['local files']).format(unit='×')}",
            ),
            CLAIMS.judge_samples(
                "04.nondeterministic_interleave_faster",
                r["nondeterministic_speedup"],
                note=f"simulated bucket: one request in {TAIL_ONE_IN} takes {TAIL_S * 1e3:.0f} ms, not "
                f"{BUCKET_REQUEST_S * 1e3:.0f}",
            ),
            CLAIMS.judge(
                "04.nondeterministic_order",
                f"interleave: {r['order_moved']} records moved; map → batch: {fused['fused (default)']} moved "
                f"fused, {fused['fusion off']} with the fusion off",
                r["order_moved"] > 0 and fused["fused (default)"] == 0 and fused["fusion off"] > 0,
            ),
            CLAIMS.judge_samples(
                "04.batch_before_map_faster",
                r["vectorized_speedup"],
                differs_here=ONE_CORE_MAP if r["usable_cores"] == 1 else "",
            ),
            CLAIMS.judge(
                "04.batch_random_crop_one_offset",
                f"{crops[CROP_CASES[1]]} vs {crops[CROP_CASES[0]]} different offsets in one batch",
                crops[CROP_CASES[1]] == 1 and crops[CROP_CASES[0]] > 1,
            ),
            CLAIMS.judge(
                "04.per_replica_batch",
                "; ".join(f"{row['API'][:12]}…: {row['per-replica shapes']}" for row in r["shape_rows"]),
                all(row["per-replica shapes"] == [[per_replica_batch]] * replicas for row in r["shape_rows"]),
                replicas=replicas,
                per_replica=per_replica_batch,
            ),
            CLAIMS.judge(
                "04.per_replica_batching_shrinks",
                f"{global_batch} → {real_global}",
                real_global == global_batch // replicas if replicas > 1 else None,
                "" if replicas > 1 else "1 replica: the mistake is invisible here (that is why it hides)",
                global_batch=global_batch,
                shrunk=global_batch // replicas,
            ),
            CLAIMS.judge(
                "04.every_example_once",
                f"{checks[0]['replicas']} replicas, {n_examples} examples: each id once with "
                + " and ".join(f"{row['api'][:12]}…: {row['exactly_once']}" for row in (edd[False], dfn[False])),
                edd[False]["exactly_once"] and dfn[False]["exactly_once"],
            ),
            CLAIMS.judge(
                "04.ragged_remainder_dealt",
                "; ".join(f"{row['examples']} → {row['distribute_datasets_from_function']}" for row in split),
                r["remainder_dealt"],
                examples=split[1]["examples"],
                dealt=split[1]["predicted (dealt in turn)"],
            ),
            CLAIMS.judge(
                "04.drop_remainder_drops",
                f"{edd[True]['missing']} dropped; {len(traces_static)} trace vs {len(traces_ragged)}",
                edd[True]["missing"] == n_examples % edd[True]["global_batch"]
                and len(traces_static) == 1
                and len(traces_ragged) == 2,
                dropped=n_examples % edd[True]["global_batch"],
            ),
            CLAIMS.judge(
                "04.auto_shard_policies",
                "; ".join(f"{p}: {row['duplicated']} dups" for p, row in summary.items())
                + f"; FILE, 2 files on 4 workers: {'failed' if r['file_policy_failed'] else 'ran'}",
                summary["FILE"]["duplicated"] == summary["DATA"]["duplicated"] == 0
                and summary["OFF"]["duplicated"] > 0
                and r["file_policy_failed"],
            ),
            CLAIMS.judge(
                "04.unseeded_shuffle_before_shard",
                "; ".join(
                    f"{row['case']}: {row['duplicated']} dups, {row['missing']} missing" for row in r["shuffle_rows"]
                ),
                unseeded["duplicated"] > 0
                and unseeded["missing"] > 0
                and all(row["duplicated"] == row["missing"] == 0 for row in fixes),
            ),
            _upstream_claim(r["upstream_rows"]),
            CLAIMS.judge(
                "04.spe_callbacks_every_n",
                f"{r['calls_per_epoch_n']} calls ({r['steps_per_epoch']} steps)",
                r["calls_per_epoch_n"] == r["calls_expected"],
                N=N,
                steps=r["steps_per_epoch"],
                calls=r["calls_expected"],
            ),
            CLAIMS.judge("04.spe_auto_fails", r["spe_auto"], r["spe_auto"] == "TypeError"),
            CLAIMS.judge(
                "04.spe_fails_on_mirrored",
                f"{spe['outcome']} on {spe['replicas']} replica(s)"
                + (f": {spe['error'][:80]}" if spe["error"] else ""),
                spe["outcome"] in ("InvalidArgumentError", "hung") if mirrored_measurable else None,
                (
                    ""
                    if spe["outcome"] != "hung"
                    else "the failed step hung instead of raising and was stopped "
                    "(about 1 run in 10 on a 2-core CPU, TF 2.20)"
                )
                if mirrored_measurable
                else "needs MirroredStrategy with ≥ 2 replicas",
            ),
            CLAIMS.judge_samples(
                "04.spe_faster_tiny_model",
                r["spe_speedups"]["tiny model"],
                note=f"{kind}, {xla_label}",
                differs_here=cpu_tiny if kind == "CPU" else "",
                N=N,
            ),
            CLAIMS.judge_samples(
                "04.spe_faster_small_cnn",
                r["spe_speedups"]["small CNN"],
                note=f"{kind}, {xla_label}",
                differs_here="a CNN step takes milliseconds of computation on a CPU, so the per-step "
                "host overhead that N steps per call save is a small share: about 1×; on a "
                "TPU such a step takes microseconds — expect a clear gain",
                N=N,
            ),
            CLAIMS.judge_samples(
                "04.prefetch_overlaps", r["prefetch_sim"], note="simulated step; tf.data's automatic overlap off"
            ),
            CLAIMS.judge_samples("04.autotune_injects_prefetch", r["prefetch_default"], note="simulated step"),
            CLAIMS.judge(
                "04.input_bound_check",
                f"{r['bottleneck']} ({r['bottleneck_ratio']:.2f}× pipeline/step) on {kind}, {xla_label}",
                (r["bottleneck"] == "training step") if kind == "CPU" else None,
                "" if kind == "CPU" else "on an accelerator either answer can be right: the check tells you which",
            ),
            CLAIMS.judge(
                "04.profile_shows_wait",
                "; ".join(f"{name}: {share:.0%} waiting" for name, share in shares.items()),
                None
                if profile_note
                else (
                    shares[PROFILE_CASES[0]] > INPUT_BOUND_ABOVE and shares[PROFILE_CASES[0]] > shares[PROFILE_CASES[1]]
                ),
                profile_note,
            ),
        ]
    )
