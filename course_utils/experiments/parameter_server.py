"""Lesson 08's parameter-server program: ParameterServerStrategy + ClusterCoordinator with Keras 3.

Run by :func:`course_utils.cluster.run_cluster` with a chief, workers and parameter servers::

    python -m course_utils cluster --chief --workers 2 --ps 1 --wait-for chief \\
        --module course_utils.experiments.parameter_server -- --steps 20 --out DIR

Workers and parameter servers only start a TensorFlow server and serve. The chief (the *coordinator*)
creates the model under the strategy — its variables live on the parameter servers — and schedules
training steps with ``ClusterCoordinator.schedule``: each step runs on whichever worker is free, reads
the variables from the parameter servers and writes its update back (asynchronously: no all-reduce, no
waiting for the slowest worker). It first tries Keras 3 ``model.fit`` under the same strategy and records
what happens, then trains with a custom loop. It writes ``DIR/parameter_server.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .multiworker import GLOBAL_BATCH, _dataset, cluster_problem, positive_int, serve_until_stopped, toy_model


def try_fit(strategy, steps: int) -> str:
    """Keras 3 ``model.fit`` under ``strategy``: "runs", or the error's type and first line."""
    import keras

    with strategy.scope():
        model = toy_model()
        model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    try:
        model.fit(_dataset(steps, GLOBAL_BATCH).repeat(), epochs=1, steps_per_epoch=steps, verbose=0)
    except Exception as err:  # noqa: BLE001 - recorded and shown: this is the finding
        return f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"
    return "runs"


def train(strategy, coordinator, model, steps: int, batch: int = GLOBAL_BATCH, lr: float = 0.1) -> dict:
    """``steps`` steps of ``model`` (built under ``strategy``) scheduled on the workers by ``coordinator``; the custom
    loop of lesson 05."""
    import keras
    import tensorflow as tf

    with strategy.scope():
        optimizer = keras.optimizers.SGD(lr)
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def dataset_fn(_context):  # each worker builds its own copy of the input (shuffled differently at scale)
        return _dataset(steps, batch).repeat()

    # create_per_worker_dataset wants a function of no arguments that returns a (distributed) dataset
    per_worker = coordinator.create_per_worker_dataset(lambda: strategy.distribute_datasets_from_function(dataset_fn))
    iterator = iter(per_worker)

    @tf.function
    def step(iterator):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(per_example(y, model(x, training=True)), global_batch_size=batch)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        return strategy.reduce("SUM", strategy.run(replica, args=next(iterator)), axis=None)

    start = time.perf_counter()
    scheduled = [coordinator.schedule(step, args=(iterator,)) for _ in range(steps)]
    coordinator.join()  # wait until every scheduled step has run on some worker
    seconds = time.perf_counter() - start
    losses = [float(r.fetch()) for r in scheduled]
    return {"losses": losses, "seconds": seconds,
            "variable_devices": sorted({v.value.device for v in model.trainable_variables}),
            "optimizer_iterations": int(optimizer.iterations.numpy())}


EVAL_EXAMPLES, EVAL_BATCH = 128, 16  # a held-out set of 8 batches (toy_data with another seed)


def evaluate(strategy, coordinator, model, examples: int = EVAL_EXAMPLES, batch: int = EVAL_BATCH) -> dict:
    """Evaluation scheduled on the workers, two ways, and the same model evaluated in the coordinator (the reference).

    *per-worker dataset* (the pattern of TensorFlow's parameter-server tutorial): every worker holds an iterator over
    the whole evaluation set, and each scheduled step evaluates the *next* batch of whichever worker runs it. *One
    batch per step*: step k is given k and evaluates batch k (``skip(k).take(1)``; with files on disk, file k). Each
    step returns the ids of the examples it saw and which it got right, so every visit is counted."""
    import numpy as np
    import tensorflow as tf

    from .multiworker import toy_data

    x, y = toy_data(examples, seed=1)
    ids = np.arange(examples, dtype="int32")
    batches = examples // batch

    def eval_set():
        return tf.data.Dataset.from_tensor_slices((ids, x, y)).batch(batch, drop_remainder=True)

    def judge(i, xb, yb):
        return i, tf.cast(tf.argmax(model(xb, training=False), axis=-1, output_type=tf.int32) == yb, tf.int32)

    per_worker = coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(lambda _context: eval_set()))
    iterator = iter(per_worker)

    @tf.function
    def next_batch(iterator):
        return strategy.run(judge, args=next(iterator))

    @tf.function
    def batch_k(k):
        return strategy.run(judge, args=eval_set().skip(k).take(1).get_single_element())

    out = {"examples": examples, "batches": batches}
    for name, scheduled in (("per-worker dataset", lambda: [coordinator.schedule(next_batch, args=(iterator,))
                                                           for _ in range(batches)]),
                            ("one batch per step", lambda: [coordinator.schedule(batch_k, args=(tf.constant(k, tf.int64),))
                                                           for k in range(batches)])):
        remote = scheduled()
        coordinator.join()
        seen = [r.fetch() for r in remote]
        visited = np.concatenate([np.asarray(i) for i, _ in seen])
        out[name] = {"visits": np.bincount(visited, minlength=examples).tolist(),
                     "correct": int(sum(int(np.asarray(c).sum()) for _, c in seen))}
    reference = judge(ids, x, y)[1]  # in the coordinator: the variables read from the parameter server
    out["coordinator_correct"] = int(np.asarray(reference).sum())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=positive_int, default=20)
    parser.add_argument("--no-fit", action="store_true", help="skip the model.fit attempt")
    args = parser.parse_args(argv)
    problem = cluster_problem({"chief": 1, "worker": 1, "ps": 1})
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if serve_until_stopped():  # workers and parameter servers serve here until the launcher stops them
        return 0
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    result = {"fit": "not tried" if args.no_fit else try_fit(strategy, args.steps)}
    print(f"chief: Keras model.fit under ParameterServerStrategy: {result['fit']}", flush=True)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = toy_model()  # its variables are created on the parameter server
    result.update(train(strategy, coordinator, model, args.steps))
    print(f"chief: custom loop, {args.steps} steps scheduled on the workers in {result['seconds']:.1f} s; loss "
          f"{result['losses'][0]:.3f} (first step) → {result['losses'][-1]:.3f} (last step); variables on "
          f"{result['variable_devices']}", flush=True)
    result["evaluation"] = ev = evaluate(strategy, coordinator, model)
    for name in ("per-worker dataset", "one batch per step"):
        visits = ev[name]["visits"]
        print(f"chief: evaluation scheduled on the workers, {name}: {ev[name]['correct']}/{ev['examples']} right; "
              f"{visits.count(1)} examples seen once, {sum(v > 1 for v in visits)} more than once, "
              f"{visits.count(0)} never", flush=True)
    print(f"chief: the same model evaluated in the coordinator: {ev['coordinator_correct']}/{ev['examples']} right",
          flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "parameter_server.json"), "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
