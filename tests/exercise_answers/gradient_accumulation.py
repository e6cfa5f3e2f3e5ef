"""`course_utils.lessons.gradient_accumulation.exercises`: each exercise's reference answer and typical wrong
answers (each with words its message must contain). Only the tests read them, so they live here."""

from __future__ import annotations

import tensorflow as tf


def _accumulation_steps_reference(target_global_batch, per_replica_batch, strategy):
    return target_global_batch // (per_replica_batch * strategy.num_replicas_in_sync)


def _replica_loss_as_float(per_example_loss, global_batch_size):
    return float(per_example_loss.numpy().sum()) / global_batch_size


def _replica_loss_mean_over_replicas(per_example_loss, global_batch_size):
    return tf.reduce_mean(per_example_loss) / tf.distribute.get_strategy().num_replicas_in_sync


def _replica_loss_mean_over_share(per_example_loss, global_batch_size):
    replicas = global_batch_size // int(tf.size(per_example_loss))
    return tf.reduce_mean(per_example_loss) / replicas


def _replica_loss_reference(per_example_loss, global_batch_size):
    return tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)


def _builtin_warmup_steps_reference(warmup_updates, k):
    return warmup_updates * k


ANSWERS = {
    "accumulation_steps": (
        lambda: _accumulation_steps_reference,
        (
            ("ignores replicas", lambda: lambda t, p, s: t // p, "ignores the replicas"),
            ("multiplies", lambda: lambda t, p, s: t * s.num_replicas_in_sync // p, "multiplied"),
            ("not whole", lambda: lambda t, p, s: t / (p * s.num_replicas_in_sync) + 0.5, "must be a whole number"),
            ("off", lambda: lambda t, p, s: 4, "Not quite"),
        ),
    ),
    "replica_loss": (
        lambda: _replica_loss_reference,
        (
            (
                "reduce_mean",
                lambda: lambda pe, gb: __import__("tensorflow").reduce_mean(pe),
                "mean over this replica's examples only",
            ),
            ("mean ÷ num_replicas_in_sync", lambda: _replica_loss_mean_over_replicas, "outside `strategy.run`"),
            (
                "mean ÷ replicas from the batch",
                lambda: _replica_loss_mean_over_share,
                "the same number of examples",
            ),
            ("sum", lambda: lambda pe, gb: __import__("tensorflow").reduce_sum(pe), "summed without dividing"),
            ("per-example", lambda: lambda pe, gb: pe / gb, "a scalar"),
            ("off", lambda: lambda pe, gb: 1.0, "Not quite"),
            ("Python float", lambda: _replica_loss_as_float, "no gradient path"),
        ),
    ),
    "builtin_warmup_steps": (
        lambda: _builtin_warmup_steps_reference,
        (
            ("updates", lambda: lambda u, k: u, "micro-step counter"),
            ("divides", lambda: lambda u, k: u // k, "Other direction"),
            ("off", lambda: lambda u, k: u + k, "Not quite"),
        ),
    ),
}
