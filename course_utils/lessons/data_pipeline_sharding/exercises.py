"""Exercise bank "data_pipeline" (lesson 04: tf.data pipelines and sharding across replicas).

The checkers build their own inputs (small datasets of example ids, simulated input contexts), so they
need no strategy and run in a second on a CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from ...exercises import (
    Exercise,
    Incorrect,
    call_learner,
    describe,
    read_dataset,
    ExerciseBank,
    require_callable,
    require_int,
)

# ----------------------------------------------------------------------------------------------
# 1. The batch size to hand to experimental_distribute_dataset
# ----------------------------------------------------------------------------------------------


def _check_batch_for_distribute_dataset(answer: Any) -> str:
    n = require_int(answer, "an int (a batch size)")
    if n == 64:
        raise Incorrect(
            "64 is the per-replica batch. `experimental_distribute_dataset` treats what you batch with as the "
            "GLOBAL batch and splits it, so each of the 4 replicas would get only 16 — the popular mistake."
        )
    if n == 16:
        raise Incorrect(
            "16 is what each replica would get if you batched with 64; you want 64 per replica, and the "
            "strategy divides the batch you pass by the number of replicas."
        )
    if n != 256:
        raise Incorrect(f"{n} is not it: each of the 4 replicas must receive 64 after the strategy splits your batch.")
    return (
        "`ds.batch(256)`: the strategy splits each global batch of 256 into 4 × 64. In code: "
        "`per_replica_batch * strategy.num_replicas_in_sync`."
    )


# ----------------------------------------------------------------------------------------------
# 2. dataset_fn for distribute_datasets_from_function
# ----------------------------------------------------------------------------------------------

_EXAMPLES, _GLOBAL = 1000, 64
# (input pipelines, replicas in sync): 2 workers with 2 replicas each, then one worker with 4 replicas.
_CONTEXTS = ((2, 4), (1, 4))


def _check_dataset_fn(answer: Any) -> str:
    fn = require_callable(answer, "dataset_fn(input_context)", arity=1)
    for pipelines, replicas in _CONTEXTS:
        per_replica = _GLOBAL // replicas
        shares: list[list[int]] = []  # the ids each input pipeline read
        for pid in range(pipelines):
            ctx = tf.distribute.InputContext(
                num_input_pipelines=pipelines, input_pipeline_id=pid, num_replicas_in_sync=replicas
            )
            where = f"dataset_fn(<InputContext pipeline {pid} of {pipelines}, {replicas} replicas>)"
            ds = call_learner(fn, ctx, shown_as=where)
            if not isinstance(ds, tf.data.Dataset):
                raise Incorrect(f"`{where}` returned {describe(ds)}; return the tf.data.Dataset.")
            leaves = tf.nest.flatten(ds.element_spec)
            spec = leaves[0] if leaves else None
            shape = getattr(spec, "shape", None)
            if not isinstance(spec, tf.TensorSpec) or shape is None or shape.rank is None:
                raise Incorrect(
                    f"`{where}` yields {describe(spec)}; yield batches of the example ids from `range(1000)`."
                )
            if shape.rank == 0:
                raise Incorrect(f"`{where}` yields single examples; batch them with the per-replica batch size.")
            batch_dim = shape[0]
            if batch_dim is None:
                raise Incorrect(
                    f"`{where}` has batch dimension None: the last batch can be smaller. Use "
                    "`drop_remainder=True` so every replica gets the same static shape (TPUs need it)."
                )
            if batch_dim != per_replica:
                hint = " — that is the global batch; each pipeline batches per replica" if batch_dim == _GLOBAL else ""
                raise Incorrect(
                    f"`{where}` batches {batch_dim} examples{hint}. Expected "
                    f"`input_context.get_per_replica_batch_size(GLOBAL_BATCH)` = {per_replica}."
                )
            if not spec.dtype.is_integer:
                raise Incorrect(f"`{where}` yields {spec.dtype.name} values; keep the example ids from `range(1000)`.")
            batches = read_dataset(
                ds,
                shown_as=where,
                limit=_EXAMPLES,
                what="batches",
                on_error="Keep the ids of `tf.data.Dataset.range(1000)` as they are: shard and batch, no `map` needed.",
            )
            ids = [int(v) for batch in batches for v in np.asarray(tf.nest.flatten(batch)[0], np.int64).reshape(-1)]
            outside = [v for v in ids if not 0 <= v < _EXAMPLES]
            if outside:
                raise Incorrect(
                    f"`{where}` yields ids outside 0–{_EXAMPLES - 1} (e.g. {outside[0]}): each pipeline reads its "
                    f"share of `tf.data.Dataset.range({_EXAMPLES})`, the check's {_EXAMPLES} examples, unchanged."
                )
            shares.append(ids)
        seen = [v for ids in shares for v in ids]
        counts = np.bincount(np.asarray(seen, np.int64), minlength=_EXAMPLES)
        duplicated, missing = int((counts > 1).sum()), int((counts == 0).sum())
        if duplicated:
            sharded = all(len(ids) <= -(-_EXAMPLES // pipelines) for ids in shares)  # each read one share's size
            if sharded and all(set(ids) == set(shares[0]) for ids in shares):
                raise Incorrect(
                    f"With {pipelines} input pipelines, every pipeline read the same examples: pass this pipeline's "
                    "`input_context.input_pipeline_id` as the shard index, not a fixed number."
                )
            if sharded:
                raise Incorrect(
                    f"With {pipelines} input pipelines, each read its share's size, but {duplicated} examples were "
                    "read by more than one pipeline: the pipelines saw the data in different orders before "
                    "`shard` — an unseeded `shuffle` before `shard`? Shard first (then shuffle), or give the "
                    "shuffle a `seed` so every pipeline shuffles alike."
                )
            raise Incorrect(
                f"With {pipelines} input pipelines, {duplicated} examples were read by more than one pipeline: "
                "shard with `ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)`."
            )
        if missing > per_replica * pipelines:
            raise Incorrect(
                f"With {pipelines} input pipeline(s), {missing} of {_EXAMPLES} examples were never read; shard by "
                "the number of input pipelines (workers), not by the number of replicas."
            )
    return (
        "Each input pipeline reads its own shard and batches per replica (64 / 4 = 16); the strategy puts one "
        "such batch on each replica, so a step still consumes the global batch of 64."
    )


# ----------------------------------------------------------------------------------------------
# 3. make_pipeline in the right order
# ----------------------------------------------------------------------------------------------

_N, _BATCH = 32, 8


_PASS_THROUGH = (
    "Options",
)  # dataset kinds that only set options: `prefetch(...).with_options(...)` still ends in prefetch


def _chain(ds: Any, limit: int = 200) -> list:
    """The learner's datasets from the last step back to the source (``ds``, its input, its input's input, …).

    Reads ``_input_dataset``, which tf.data's one-input datasets keep; a step without it ends the chain.
    Used only to explain a wrong result more precisely, never to decide that a result is right.
    """
    chain = []
    while ds is not None and len(chain) < limit:
        chain.append(ds)
        ds = getattr(ds, "_input_dataset", None)
    return chain


def _kind(ds: Any) -> str:
    return type(ds).__name__


def _same_order_message(ds: Any) -> str:
    """Why both epochs came in one shuffled order: a shuffle before the cache, or one that never reshuffles."""
    chain = _chain(ds)
    shuffles = [i for i, d in enumerate(chain) if "Shuffle" in _kind(d)]
    caches = [i for i, d in enumerate(chain) if "Cache" in _kind(d)]
    after_cache = [i for i in shuffles if not caches or i < caches[0]]  # nearer the output than the cache
    if after_cache and getattr(chain[after_cache[0]], "_reshuffle_each_iteration", True) is False:
        return (
            "Both epochs arrive in the same shuffled order: your `shuffle` comes after `cache` (good), but with "
            "`reshuffle_each_iteration=False` it repeats its first order every epoch. Leave that argument out "
            "(the default, True, reshuffles each epoch)."
        )
    if shuffles and caches and shuffles[0] > caches[0]:
        return (
            "Both epochs arrive in the same shuffled order: `shuffle` ran before `cache`, so the cache recorded "
            "one order and replays it. Shuffle after cache."
        )
    return (
        "Both epochs arrive in the same shuffled order: a `shuffle` before `cache` is recorded once and replayed, "
        "and `reshuffle_each_iteration=False` repeats one order. Shuffle after cache, with the default reshuffle."
    )


_MIN_JUMP = 4  # a full shuffle of 32 moves some example >= 4 places ahead in an epoch but for a chance of ~1e-17


def _shuffle_buffers(ds: Any) -> list[int]:
    """The buffer sizes, in examples, of the learner's `shuffle` steps over examples, where they can be read (an int,
    or a tensor such as `ds.cardinality()`). A shuffle of whole batches is left to the check that each epoch's batches
    hold other examples."""
    sizes = []
    for d in _chain(ds):
        if "Shuffle" in _kind(d):
            try:
                if tf.nest.flatten(d.element_spec)[0].shape.rank != 3:  # (height, width, channels): one example
                    continue
                size = int(getattr(d, "_buffer_size"))
            except Exception:  # noqa: BLE001 - not readable here: the order the check saw decides alone
                continue
            if size > 0:
                sizes.append(size)
    return sizes


def _small_shuffle_message(ds: Any, epochs: list[list[int]]) -> str | None:
    """Why the order is barely shuffled, or None: a buffer smaller than the data (read from the learner's `shuffle`),
    or, where it cannot be read, an order in which no example came more than a few places ahead of its place in the
    file in either epoch (a buffer of B moves an example at most B − 1 places ahead)."""
    why = (
        "`shuffle` draws each next example from only the examples in its buffer, so nearby examples of the file "
        "(often alike: one class, one source) stay together in a batch, and the first batches always come from the "
        "file's start. TensorFlow's docs: perfect shuffling needs a buffer at least the size of the dataset. Use "
        f"`shuffle(ds.cardinality())` or a buffer at least as large as the data (the check's {_N} examples, which "
        "come in file order; 50,000 for CIFAR-10, whose uint8 images fit in memory once cached — "
        "`data.build_pipeline`'s smaller default leans on CIFAR-10's files being in random order already)."
    )
    buffers = _shuffle_buffers(ds)
    if buffers:
        if max(buffers) >= _N:
            return None
        size = max(buffers)
        return (
            f"Your shuffle buffer holds {size} example{'s' if size != 1 else ''}, fewer than the check's {_N}: an "
            f"example moves at most {size - 1} place{'s' if size != 2 else ''} ahead. {why}"
        )
    jump = max(max(i - p for p, i in enumerate(ids)) for ids in epochs)
    if jump >= _MIN_JUMP:
        return None
    return (
        f"Your shuffle barely moves the examples: in two epochs none came more than {jump} place(s) ahead of its "
        f"place in the file — a shuffle buffer of a few examples? {why}"
    )


def _cached_dtype(ds: Any) -> str | None:
    """The dtype of the images the learner's `cache()` holds, if it can be seen."""
    for d in _chain(ds):
        if "Cache" in _kind(d):
            try:
                return d.element_spec[0].dtype.name
            except Exception:  # noqa: BLE001
                return None
    return None


def _check_pipeline(answer: Any) -> str:
    fn = require_callable(answer, "make_pipeline(ds, batch_size)", arity=2)
    reads = []  # one entry per example read from the source: fewer in epoch 2 means it was cached
    x = np.tile(np.arange(32, dtype=np.uint8)[None, :, None, None] * 8, (_N, 1, 32, 3))  # left-right asymmetric

    def count(image, label):
        tf.py_function(lambda: reads.append(1), [], [])
        return image, label

    source = tf.data.Dataset.from_tensor_slices((x, np.arange(_N, dtype=np.int64))).map(count)
    where = f"make_pipeline(ds, {_BATCH})"
    ds = call_learner(fn, source, _BATCH, shown_as=where)
    if not isinstance(ds, tf.data.Dataset):
        raise Incorrect(f"`make_pipeline` returned {describe(ds)}; return the tf.data.Dataset.")
    spec = ds.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2):
        raise Incorrect("Keep the (image, label) pairs: the pipeline must yield `(images, labels)` batches.")
    images, labels = spec
    if not isinstance(images, tf.TensorSpec):
        raise Incorrect(
            f"The images come out as {describe(images)}, not one tensor: keep the `(image, label)` pairs as they "
            "come (no dict of features) — the pipeline yields `(images, labels)` batches for `model.fit`."
        )
    if images.shape.rank != 4:
        raise Incorrect(
            f"Batches should be 4-D (batch, height, width, channels); got shape {images.shape}. Did you batch?"
        )
    if images.shape[0] is None:
        raise Incorrect("The batch dimension is None: use `batch(batch_size, drop_remainder=True)` for static shapes.")
    if images.shape[0] != _BATCH:
        raise Incorrect(
            f"`{where}` makes batches of {images.shape[0]}: batch with the `batch_size` argument ({_BATCH} here), "
            f"not a fixed number — the check's {_N} examples "
            + ("make no batch of that size at all." if images.shape[0] > _N else "make other batches.")
        )
    if images.dtype != tf.float32:
        raise Incorrect(
            f"The images come out as {images.dtype.name}, not float32: add `map(data.to_float)` after `cache()` "
            "(the cache keeps the smaller uint8 images; the model gets floats)."
        )
    if not isinstance(labels, tf.TensorSpec) or labels.shape.rank != 1:
        raise Incorrect(
            f"The labels come out as {describe(labels) if not isinstance(labels, tf.TensorSpec) else 'shape ' + str(labels.shape)}; "
            "leave them as they are (one int per example, shape (batch,)): the check follows each example by its "
            "label, and this exercise does not ask for one-hot labels."
        )
    epochs = []
    groups = []  # per epoch: which examples each batch holds
    for _ in range(2):
        batches = read_dataset(ds, shown_as=where, limit=_N, what="batches")
        if not batches:
            raise Incorrect(f"One epoch of `{where}` gave no batches from the check's {_N} examples.")
        ids = [int(v) for _, yb in batches for v in np.asarray(yb).reshape(-1)]
        stacked = np.concatenate([np.asarray(xb, np.float32) for xb, _ in batches])
        if sorted(ids) != list(range(_N)):
            raise Incorrect(
                f"One epoch should deliver each of the {_N} examples once; got {len(ids)} with repeats or gaps."
            )
        epochs.append((ids, stacked[np.argsort(ids)]))
        groups.append(sorted(sorted(int(v) for v in np.asarray(yb).reshape(-1)) for _, yb in batches))
    (ids1, im1), (ids2, im2) = epochs
    if ids1 == list(range(_N)) and ids2 == ids1:
        raise Incorrect("The examples arrive in file order every epoch: add `shuffle` (after `cache`).")
    if ids1 == ids2:
        raise Incorrect(_same_order_message(ds))
    small = _small_shuffle_message(ds, [ids1, ids2])
    if small:
        raise Incorrect(small)
    if groups[0] == groups[1]:  # shuffled examples make the same 4 batches of 8 twice with a chance of 1 in ~4e15
        raise Incorrect(
            "Every batch holds the same examples in both epochs; only the order of the batches changed: your "
            "`shuffle` comes after `batch`, so it shuffles whole batches. Shuffle the examples: `shuffle` before "
            "`batch` (right after `cache`)."
        )
    if np.array_equal(im1, im2):
        raise Incorrect(
            "Each image is identical in both epochs: the random augmentation was cached (or is missing). "
            "Apply `data.augment` after `cache`."
        )
    if len(reads) > _N:
        raise Incorrect(
            f"The source was read {len(reads)} times for {_N} examples in 2 epochs: nothing is cached. "
            "Add `cache()` right after reading (the uint8 images), before anything random."
        )
    last = next((d for d in _chain(ds) if not any(k in _kind(d) for k in _PASS_THROUGH)), ds)
    if "Prefetch" not in _kind(last):
        raise Incorrect(
            "The last step should be `prefetch(tf.data.AUTOTUNE)`, so batches are ready before the step asks."
        )
    cached = _cached_dtype(ds)
    if cached is not None and cached != "uint8":
        raise Incorrect(
            f"Everything else works, but your cache holds {cached} images: the question asks to cache the uint8 "
            "images — move `cache()` before `map(data.to_float)`, and the same cache takes 4× less memory than "
            "float32 (lesson 04 §2)."
        )
    return (
        "cache (uint8) → shuffle → to_float + augment → batch(drop_remainder=True) → prefetch: read once, a new "
        "order and new augmentations every epoch, static shapes, and the next batch ready in time."
    )


EXERCISES = ExerciseBank(
    "data_pipeline_sharding",
    [
        Exercise(
            name="batch_for_distribute_dataset",
            question=(
                "You want 64 examples per replica on 4 replicas with `strategy.experimental_distribute_dataset`. "
                "What batch size do you pass to `ds.batch(...)`?"
            ),
            checker=_check_batch_for_distribute_dataset,
            answer_name="answer",
            hints=(
                "`experimental_distribute_dataset` splits each batch it receives across the replicas.",
                "So the batch you build must be the global batch: per-replica batch × replicas.",
            ),
            solution_code="answer = 64 * 4  # the GLOBAL batch: the strategy splits it into 4 × 64\n",
            stub="answer = ...  # an int\n",
        ),
        Exercise(
            name="dataset_fn",
            question=(
                "Write `dataset_fn(input_context)` for `distribute_datasets_from_function`: "
                "`tf.data.Dataset.range(1000)`, sharded per input pipeline, batched per replica from "
                "`GLOBAL_BATCH = 64`, static shapes."
            ),
            checker=_check_dataset_fn,
            answer_name="dataset_fn",
            hints=(
                "The input context knows the split: `input_context.get_per_replica_batch_size(GLOBAL_BATCH)`, "
                "`input_context.num_input_pipelines`, `input_context.input_pipeline_id`.",
                "Shard first, by the number of input pipelines and this pipeline's id; then batch with the "
                "per-replica size, dropping the ragged last batch.",
            ),
            solution_code="""\
import tensorflow as tf

GLOBAL_BATCH = 64

def dataset_fn(input_context):
    per_replica = input_context.get_per_replica_batch_size(GLOBAL_BATCH)  # 64 / replicas
    ds = tf.data.Dataset.range(1000)
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)  # one share per worker
    return ds.batch(per_replica, drop_remainder=True)  # static shapes
""",
            stub='''\
GLOBAL_BATCH = 64

def dataset_fn(input_context):
    """Return tf.data.Dataset.range(1000), sharded for this input pipeline, batched per replica."""
    ...  # your code here
''',
        ),
        Exercise(
            name="pipeline_order",
            question=(
                "Write `make_pipeline(ds, batch_size)` for `(uint8 image, label)` examples: cache, shuffle, "
                "`data.to_float`, `data.augment`, batch with static shapes, prefetch — in the order that works."
            ),
            checker=_check_pipeline,
            answer_name="make_pipeline",
            hints=(
                "Cache what is the same every epoch, as early and as small as it is: the uint8 images (before "
                "`to_float`: 4× less memory than float32). Anything random must come after `cache()`.",
                "After the cache: a new order each epoch, then the float conversion and the random augmentation "
                "(both `map`, AUTOTUNE), then static-shape batches of `batch_size`, and prefetching last.",
            ),
            solution_code="""\
import tensorflow as tf
from course_utils import data

def make_pipeline(ds, batch_size):
    ds = ds.cache()                                                   # the uint8 images: read once, 4× smaller than float32
    ds = ds.shuffle(1000)                                             # a new order every epoch
    ds = ds.map(data.to_float, num_parallel_calls=tf.data.AUTOTUNE)   # uint8 → float32, after the cache
    ds = ds.map(data.augment, num_parallel_calls=tf.data.AUTOTUNE)    # new random crops/flips every epoch
    ds = ds.batch(batch_size, drop_remainder=True)                    # static shapes
    return ds.prefetch(tf.data.AUTOTUNE)                              # next batch ready in time
""",
            stub='''\
def make_pipeline(ds, batch_size):
    """cache (uint8) → shuffle → to_float → augment → batch (static shapes) → prefetch."""
    ...  # your code here
''',
        ),
    ],
)
