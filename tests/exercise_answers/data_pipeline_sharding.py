"""`course_utils.lessons.data_pipeline_sharding.exercises`: each exercise's reference answer and typical wrong
answers (each with words its message must contain). Only the tests read them, so they live here."""

from __future__ import annotations

import tensorflow as tf

from course_utils import data
from course_utils.lessons.data_pipeline_sharding.exercises import _GLOBAL


def _dataset_fn_reference(input_context):
    per_replica = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
    ds = tf.data.Dataset.range(1000)
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.batch(per_replica, drop_remainder=True)


GLOBAL_BATCH = _GLOBAL  # the name the learner's function reads (the notebook defines it too)


def _dataset_fn_no_shard(input_context):
    return tf.data.Dataset.range(1000).batch(input_context.get_per_replica_batch_size(64), drop_remainder=True)


def _dataset_fn_global_batch(input_context):
    ds = tf.data.Dataset.range(1000).shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.batch(64, drop_remainder=True)


def _dataset_fn_ragged(input_context):
    ds = tf.data.Dataset.range(1000).shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.batch(input_context.get_per_replica_batch_size(64))


def _dataset_fn_replica_id(input_context):
    ds = tf.data.Dataset.range(1000).shard(input_context.num_replicas_in_sync, input_context.input_pipeline_id)
    return ds.batch(input_context.get_per_replica_batch_size(64), drop_remainder=True)


def _dataset_fn_shuffle_before_shard(input_context):
    per_replica = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
    ds = tf.data.Dataset.range(1000).shuffle(1000)  # unseeded: every pipeline gets its own order
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.batch(per_replica, drop_remainder=True)


def _dataset_fn_range_2000(input_context):
    ds = tf.data.Dataset.range(2000).shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.batch(input_context.get_per_replica_batch_size(GLOBAL_BATCH), drop_remainder=True)


def _dataset_fn_same_shard(input_context):
    ds = tf.data.Dataset.range(1000).shard(input_context.num_input_pipelines, 0)
    return ds.batch(input_context.get_per_replica_batch_size(GLOBAL_BATCH), drop_remainder=True)


def _pipeline_reference(ds, batch_size):
    ds = ds.cache()  # the decoded uint8 images: 4× smaller than float32 ...
    ds = ds.shuffle(1000)  # ... then a fresh order every epoch ...
    ds = ds.map(data.to_float, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.map(data.augment, num_parallel_calls=tf.data.AUTOTUNE)  # ... and fresh augmentations
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _pipeline_augment_before_cache(ds, batch_size):
    ds = ds.map(data.to_float).map(data.augment).cache().shuffle(1000)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _pipeline_shuffle_before_cache(ds, batch_size):
    ds = ds.shuffle(1000).cache().map(data.to_float).map(data.augment)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _pipeline_no_reshuffle(ds, batch_size):
    ds = ds.cache().shuffle(1000, reshuffle_each_iteration=False).map(data.to_float).map(data.augment)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _pipeline_no_cache(ds, batch_size):
    ds = ds.shuffle(1000).map(data.to_float).map(data.augment)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _pipeline_float_cache(ds, batch_size):
    ds = ds.map(data.to_float).cache().shuffle(1000).map(data.augment)  # caches float32: 4× the uint8 bytes
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _pipeline_ragged(ds, batch_size):
    ds = ds.cache().shuffle(1000).map(data.to_float).map(data.augment)
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def _pipeline_no_prefetch(ds, batch_size):
    ds = ds.cache().shuffle(1000).map(data.to_float).map(data.augment)
    return ds.batch(batch_size, drop_remainder=True)


def _pipeline_no_to_float(ds, batch_size):
    ds = ds.cache().shuffle(1000).map(data.augment)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _pipeline_fixed_batch(ds, batch_size):
    ds = ds.cache().shuffle(1000).map(data.to_float).map(data.augment)
    return ds.batch(64, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _pipeline_one_hot(ds, batch_size):
    ds = ds.cache().shuffle(1000).map(data.to_float).map(data.augment).map(lambda x, y: (x, tf.one_hot(y, 10)))
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _pipeline_dict_features(ds, batch_size):
    ds = ds.cache().shuffle(1000).map(data.to_float).map(data.augment).map(lambda x, y: ({"image": x}, y))
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _pipeline_tiny_shuffle(ds, batch_size):
    ds = ds.cache().shuffle(2).map(data.to_float).map(data.augment)  # a buffer of 2: neighbours swap, nothing more
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _pipeline_shuffle_batches(ds, batch_size):
    ds = ds.cache().map(data.to_float).map(data.augment).batch(batch_size, drop_remainder=True)
    return ds.shuffle(1000).prefetch(tf.data.AUTOTUNE)  # shuffles batches: each holds the same examples every epoch


ANSWERS = {
    "batch_for_distribute_dataset": (
        lambda: 256,
        (
            ("per-replica", lambda: 64, "popular mistake"),
            ("divided", lambda: 16, "strategy divides"),
            ("other", lambda: 128, "128 is not it"),
            ("float", lambda: 256.0, "got float 256.0"),
        ),
    ),
    "dataset_fn": (
        lambda: _dataset_fn_reference,
        (
            ("no shard", lambda: _dataset_fn_no_shard, "read by more than one pipeline"),
            ("global batch", lambda: _dataset_fn_global_batch, "that is the global batch"),
            ("ragged", lambda: _dataset_fn_ragged, "drop_remainder=True"),
            ("shard by replicas", lambda: _dataset_fn_replica_id, "not by the number of replicas"),
            (
                "unseeded shuffle before shard",
                lambda: _dataset_fn_shuffle_before_shard,
                "give the shuffle a `seed`",
            ),
            ("range(2000)", lambda: _dataset_fn_range_2000, "yields ids outside 0–999"),
            (
                "same shard everywhere",
                lambda: _dataset_fn_same_shard,
                "`input_context.input_pipeline_id` as the shard index",
            ),
            ("result not function", lambda: 16, "Pass the function itself"),
        ),
    ),
    "pipeline_order": (
        lambda: _pipeline_reference,
        (
            ("augment before cache", lambda: _pipeline_augment_before_cache, "augmentation was cached"),
            ("shuffle before cache", lambda: _pipeline_shuffle_before_cache, "`shuffle` ran before `cache`"),
            ("no reshuffle", lambda: _pipeline_no_reshuffle, "`reshuffle_each_iteration=False` it repeats"),
            ("no to_float", lambda: _pipeline_no_to_float, "come out as uint8"),
            ("batch 64 on 32 examples", lambda: _pipeline_fixed_batch, "make no batch of that size"),
            ("one-hot labels", lambda: _pipeline_one_hot, "one-hot"),
            ("dict features", lambda: _pipeline_dict_features, "no dict of features"),
            ("no cache", lambda: _pipeline_no_cache, "nothing is cached"),
            ("ragged", lambda: _pipeline_ragged, "drop_remainder=True"),
            ("no prefetch", lambda: _pipeline_no_prefetch, "prefetch"),
            ("float32 cache", lambda: _pipeline_float_cache, "your cache holds float32 images"),
            ("shuffle(2)", lambda: _pipeline_tiny_shuffle, "Your shuffle buffer holds 2 examples"),
            ("shuffle after batch", lambda: _pipeline_shuffle_batches, "shuffles whole batches"),
        ),
    ),
}
