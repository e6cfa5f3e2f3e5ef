"""Exercise bank "data_pipeline" (lesson 04: tf.data pipelines and sharding across replicas).

The checkers build their own inputs (small datasets of example ids, simulated input contexts), so they
need no strategy and run in a second on a CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..exercises import Exercise, Incorrect, call_learner, describe, register_bank, require_callable, require_int

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


def _dataset_fn_reference(input_context):
    import tensorflow as tf

    per_replica = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
    ds = tf.data.Dataset.range(1000)
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.batch(per_replica, drop_remainder=True)


GLOBAL_BATCH = _GLOBAL  # the name the learner's function reads (the notebook defines it too)


def _dataset_fn_no_shard(input_context):
    import tensorflow as tf

    return tf.data.Dataset.range(1000).batch(input_context.get_per_replica_batch_size(64), drop_remainder=True)


def _dataset_fn_global_batch(input_context):
    import tensorflow as tf

    ds = tf.data.Dataset.range(1000).shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.batch(64, drop_remainder=True)


def _dataset_fn_ragged(input_context):
    import tensorflow as tf

    ds = tf.data.Dataset.range(1000).shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.batch(input_context.get_per_replica_batch_size(64))


def _dataset_fn_replica_id(input_context):
    import tensorflow as tf

    ds = tf.data.Dataset.range(1000).shard(input_context.num_replicas_in_sync, input_context.input_pipeline_id)
    return ds.batch(input_context.get_per_replica_batch_size(64), drop_remainder=True)


def _check_dataset_fn(answer: Any) -> str:
    import tensorflow as tf

    fn = require_callable(answer, "dataset_fn(input_context)", arity=1)
    for pipelines, replicas in _CONTEXTS:
        per_replica = _GLOBAL // replicas
        seen: list[int] = []
        for pid in range(pipelines):
            ctx = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=pid,
                                             num_replicas_in_sync=replicas)
            where = f"dataset_fn(<InputContext pipeline {pid} of {pipelines}, {replicas} replicas>)"
            ds = call_learner(fn, ctx, shown_as=where)
            if not isinstance(ds, tf.data.Dataset):
                raise Incorrect(f"`{where}` returned {describe(ds)}; return the tf.data.Dataset.")
            spec = tf.nest.flatten(ds.element_spec)[0]
            batch_dim = spec.shape[0] if spec.shape.rank else None
            if spec.shape.rank == 0:
                raise Incorrect(f"`{where}` yields single examples; batch them with the per-replica batch size.")
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
            for batch in ds:
                seen += [int(v) for v in np.asarray(tf.nest.flatten(batch)[0]).reshape(-1)]
        counts = np.bincount(np.asarray(seen, np.int64), minlength=_EXAMPLES) if seen else np.zeros(_EXAMPLES)
        duplicated, missing = int((counts > 1).sum()), int((counts == 0).sum())
        if duplicated:
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


def _pipeline_reference(ds, batch_size):
    import tensorflow as tf

    from course_utils import data

    ds = ds.map(data.to_float, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.cache()  # after the deterministic work ...
    ds = ds.shuffle(1000)  # ... then a fresh order every epoch ...
    ds = ds.map(data.augment, num_parallel_calls=tf.data.AUTOTUNE)  # ... and fresh augmentations
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _pipeline_augment_before_cache(ds, batch_size):
    import tensorflow as tf

    from course_utils import data

    ds = ds.map(data.to_float).map(data.augment).cache().shuffle(1000)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _pipeline_shuffle_before_cache(ds, batch_size):
    import tensorflow as tf

    from course_utils import data

    ds = ds.map(data.to_float).shuffle(1000).cache().map(data.augment)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _pipeline_no_cache(ds, batch_size):
    import tensorflow as tf

    from course_utils import data

    ds = ds.map(data.to_float).shuffle(1000).map(data.augment)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _pipeline_ragged(ds, batch_size):
    import tensorflow as tf

    from course_utils import data

    ds = ds.map(data.to_float).cache().shuffle(1000).map(data.augment)
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def _pipeline_no_prefetch(ds, batch_size):
    from course_utils import data

    ds = ds.map(data.to_float).cache().shuffle(1000).map(data.augment)
    return ds.batch(batch_size, drop_remainder=True)


def _check_pipeline(answer: Any) -> str:
    import tensorflow as tf

    fn = require_callable(answer, "make_pipeline(ds, batch_size)", arity=2)
    reads = []  # one entry per example read from the source: fewer in epoch 2 means it was cached
    x = np.tile(np.arange(32, dtype=np.uint8)[None, :, None, None] * 8, (_N, 1, 32, 3))  # left-right asymmetric

    def count(image, label):
        tf.py_function(lambda: reads.append(1), [], [])
        return image, label

    source = tf.data.Dataset.from_tensor_slices((x, np.arange(_N, dtype=np.int64))).map(count)
    ds = call_learner(fn, source, _BATCH, shown_as=f"make_pipeline(ds, {_BATCH})")
    if not isinstance(ds, tf.data.Dataset):
        raise Incorrect(f"`make_pipeline` returned {describe(ds)}; return the tf.data.Dataset.")
    spec = ds.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2):
        raise Incorrect("Keep the (image, label) pairs: the pipeline must yield `(images, labels)` batches.")
    if spec[0].shape.rank != 4:
        raise Incorrect(f"Batches should be 4-D (batch, height, width, channels); got shape {spec[0].shape}. Did you batch?")
    if spec[0].shape[0] is None:
        raise Incorrect("The batch dimension is None: use `batch(batch_size, drop_remainder=True)` for static shapes.")
    epochs = []
    for _ in range(2):
        ids, images = [], []
        for xb, yb in ds:
            ids += [int(v) for v in np.asarray(yb)]
            images.append(np.asarray(xb, np.float32))
        epochs.append((ids, np.concatenate(images)[np.argsort(ids)]))
    (ids1, im1), (ids2, im2) = epochs
    if sorted(ids1) != list(range(_N)):
        raise Incorrect(f"One epoch should deliver each of the {_N} examples once; got {len(ids1)} with repeats or gaps.")
    if ids1 == list(range(_N)) and ids2 == ids1:
        raise Incorrect("The examples arrive in file order every epoch: add `shuffle` (after `cache`).")
    if ids1 == ids2:
        raise Incorrect(
            "Both epochs arrive in the same shuffled order: `shuffle` ran before `cache`, so the cache recorded "
            "one order and replays it. Shuffle after cache."
        )
    if np.array_equal(im1, im2):
        raise Incorrect(
            "Each image is identical in both epochs: the random augmentation was cached (or is missing). "
            "Apply `data.augment` after `cache`."
        )
    if len(reads) > _N:
        raise Incorrect(
            f"The source was read {len(reads)} times for {_N} examples in 2 epochs: nothing is cached. "
            "Add `cache()` after the deterministic steps."
        )
    if "Prefetch" not in type(ds).__name__:
        raise Incorrect("The last step should be `prefetch(tf.data.AUTOTUNE)`, so batches are ready before the step asks.")
    return (
        "cache → shuffle → augment → batch(drop_remainder=True) → prefetch: read once, a new order and new "
        "augmentations every epoch, static shapes, and the next batch ready in time."
    )


register_bank(
    "data_pipeline",
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
            reference=lambda: 256,
            wrong_examples=(
                ("per-replica", lambda: 64, "popular mistake"),
                ("divided", lambda: 16, "strategy divides"),
                ("other", lambda: 128, "128 is not it"),
                ("float", lambda: 256.0, "got float 256.0"),
            ),
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
                "`ds.shard(num_input_pipelines, input_pipeline_id)`, then "
                "`ds.batch(per_replica, drop_remainder=True)`.",
            ),
            solution_code='''\
import tensorflow as tf

GLOBAL_BATCH = 64

def dataset_fn(input_context):
    per_replica = input_context.get_per_replica_batch_size(GLOBAL_BATCH)  # 64 / replicas
    ds = tf.data.Dataset.range(1000)
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)  # one share per worker
    return ds.batch(per_replica, drop_remainder=True)  # static shapes
''',
            stub='''\
GLOBAL_BATCH = 64

def dataset_fn(input_context):
    """Return tf.data.Dataset.range(1000), sharded for this input pipeline, batched per replica."""
    ...  # your code here
''',
            reference=lambda: _dataset_fn_reference,
            wrong_examples=(
                ("no shard", lambda: _dataset_fn_no_shard, "read by more than one pipeline"),
                ("global batch", lambda: _dataset_fn_global_batch, "that is the global batch"),
                ("ragged", lambda: _dataset_fn_ragged, "drop_remainder=True"),
                ("shard by replicas", lambda: _dataset_fn_replica_id, "not by the number of replicas"),
                ("result not function", lambda: 16, "Pass the function itself"),
            ),
        ),
        Exercise(
            name="pipeline_order",
            question=(
                "Write `make_pipeline(ds, batch_size)` for `(uint8 image, label)` examples: `data.to_float`, "
                "cache, shuffle, `data.augment`, batch with static shapes, prefetch — in the order that works."
            ),
            checker=_check_pipeline,
            answer_name="make_pipeline",
            hints=(
                "Cache only what is the same every epoch (decoding, `to_float`); anything random must come after "
                "`cache()`.",
                "`map(to_float) → cache() → shuffle(...) → map(augment) → batch(batch_size, drop_remainder=True) "
                "→ prefetch(tf.data.AUTOTUNE)`.",
            ),
            solution_code='''\
import tensorflow as tf
from course_utils import data

def make_pipeline(ds, batch_size):
    ds = ds.map(data.to_float, num_parallel_calls=tf.data.AUTOTUNE)  # deterministic work first
    ds = ds.cache()                                                   # read and convert once
    ds = ds.shuffle(1000)                                             # a new order every epoch
    ds = ds.map(data.augment, num_parallel_calls=tf.data.AUTOTUNE)    # new random crops/flips every epoch
    ds = ds.batch(batch_size, drop_remainder=True)                    # static shapes
    return ds.prefetch(tf.data.AUTOTUNE)                              # next batch ready in time
''',
            stub='''\
def make_pipeline(ds, batch_size):
    """to_float → cache → shuffle → augment → batch (static shapes) → prefetch."""
    ...  # your code here
''',
            reference=lambda: _pipeline_reference,
            wrong_examples=(
                ("augment before cache", lambda: _pipeline_augment_before_cache, "augmentation was cached"),
                ("shuffle before cache", lambda: _pipeline_shuffle_before_cache, "same shuffled order"),
                ("no cache", lambda: _pipeline_no_cache, "nothing is cached"),
                ("ragged", lambda: _pipeline_ragged, "drop_remainder=True"),
                ("no prefetch", lambda: _pipeline_no_prefetch, "prefetch"),
            ),
        ),
    ],
)
