"""Lesson 08's parameter-server program: ParameterServerStrategy + ClusterCoordinator with Keras 3.

Run by :func:`course_utils.cluster.run_cluster` with a chief, workers and parameter servers::

    python -m course_utils cluster --chief --workers 2 --ps 1 --wait-for chief \\
        --module course_utils.lessons.scaling_out.parameter_server -- --steps 20 --out DIR

Workers and parameter servers only start a TensorFlow server and serve. The chief (the *coordinator*)
creates the model under the strategy — its variables live on the parameter servers — and schedules
training steps with ``ClusterCoordinator.schedule``: each step runs on whichever worker is free, reads
the variables from the parameter servers and writes its update back (asynchronously: no all-reduce, no
waiting for the slowest worker). It first tries Keras 3 ``model.fit`` under the same strategy and records
what happens, then trains with a custom loop, evaluates two ways, and (``--kill-worker I``) SIGKILLs worker I in
the middle of a schedule to show the coordinator moving its steps to the others. Every task runs with
``GRPC_FAIL_FAST=use_caller``, as TensorFlow's parameter-server tutorial sets it. It writes
``DIR/parameter_server.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ... import fileguard
from .multiworker import GLOBAL_BATCH, _dataset, _task, cluster_problem, positive_int, serve_until_stopped, toy_model


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
    loop of lesson 05. Each step returns its loss and the index of the worker that ran it
    (``tf.distribute.coordinator.experimental_get_current_worker_index``), and counts itself in a variable on the
    parameter server (``assign_add`` there is atomic: unlike Keras' ``optimizer.iterations``, it misses no execution).
    The result's ``schedule_step`` schedules one more step (used by :func:`through_a_worker_failure`)."""
    import keras
    import tensorflow as tf

    with strategy.scope():
        optimizer = keras.optimizers.SGD(lr)
        executions = tf.Variable(0, dtype=tf.int64, trainable=False, name="step_executions")  # on the ps
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

        loss = strategy.reduce("SUM", strategy.run(replica, args=next(iterator)), axis=None)
        executions.assign_add(1)
        return loss, tf.distribute.coordinator.experimental_get_current_worker_index()

    start = time.perf_counter()
    scheduled = [coordinator.schedule(step, args=(iterator,)) for _ in range(steps)]
    coordinator.join()  # wait until every scheduled step has run on some worker
    seconds = time.perf_counter() - start
    results = [r.fetch() for r in scheduled]
    return {
        "losses": [float(loss) for loss, _ in results],
        "seconds": seconds,
        "workers": [int(worker) for _, worker in results],
        "variable_devices": sorted({v.value.device for v in model.trainable_variables}),
        "optimizer_iterations": int(optimizer.iterations.numpy()),
        "executions": int(executions.numpy()),
        "schedule_step": lambda: coordinator.schedule(step, args=(iterator,)),
        "count_executions": lambda: int(executions.numpy()),
    }


class _FailureLog:
    """While open, the coordinator's log goes here instead of to stderr, and its "Worker ... failed with ..." errors
    (``cluster_coordinator.py``, ``wait_on_failure``; "Remote function on worker ... failed" for a failure it treats
    as transient) are counted: each is one closure that failed on a lost worker and was put back in the queue for
    another. (Each also prints the gRPC error's details: a dozen lines.)"""

    def __init__(self):
        import logging

        self.logger = logging.getLogger("tensorflow")
        self.lines: list[str] = []
        self.handler = logging.Handler(logging.INFO)
        self.handler.emit = self._keep
        self._saved: list = []

    def _keep(self, record) -> None:
        message = record.getMessage()
        # a lost worker, or a failure it takes for a transient one: either way the closure goes back in the queue
        if (message.startswith("Worker ") and " failed with " in message) or message.startswith("Remote function on"):
            self.lines.append(message.splitlines()[0][:200])

    def __enter__(self):
        self._saved = [list(self.logger.handlers), self.logger.propagate]
        self.logger.handlers, self.logger.propagate = [self.handler], False
        return self

    def __exit__(self, *exc):
        self.logger.handlers, self.logger.propagate = self._saved


def pid_file(out: str, index: int) -> str:
    return os.path.join(out, f"worker{index}.pid")


def through_a_worker_failure(coordinator, trained: dict, worker: int, pid_path: str, steps: int = 8) -> dict:
    """Kill worker ``worker`` in the middle of a schedule and let the coordinator cope. Schedules ``steps`` training
    steps; as soon as one of them has run on that worker (or all have run), SIGKILLs it (its pid from ``pid_path``),
    schedules ``steps`` more, and joins. Returns which worker ran each step before and after the kill, how many
    steps returned a result, how many closures the coordinator put back after a failure, and how many times the step
    function ran (a closure cut off after its update reached the parameter server runs again: at least once)."""
    import signal

    import numpy as np

    before_count = trained["count_executions"]()
    first = [trained["schedule_step"]() for _ in range(steps)]
    ran_before = []
    for remote in first:  # in order: each fetch waits for that step
        ran_before.append(int(remote.fetch()[1]))
        if worker in ran_before:
            break
    with open(pid_path) as f:
        pid = int(f.read())
    with _FailureLog() as failures:
        os.kill(pid, signal.SIGKILL)
        killed_at = time.perf_counter()
        second = [trained["schedule_step"]() for _ in range(steps)]
        coordinator.join()
        seconds = time.perf_counter() - killed_at
    first_workers = [int(r.fetch()[1]) for r in first]
    second_workers = [int(r.fetch()[1]) for r in second]
    losses = [float(r.fetch()[0]) for r in first + second]
    return {
        "killed": worker,
        "scheduled": 2 * steps,
        "returned": int(np.isfinite(losses).sum()),
        "first_half": first_workers,
        "second_half": second_workers,
        "ran_on_killed_before_kill": ran_before.count(worker),
        "put_back": len(failures.lines),
        "failure_lines": failures.lines[:3],
        "executions": trained["count_executions"]() - before_count,
        "join_after_kill_s": seconds,
        "grpc_fail_fast": os.environ.get("GRPC_FAIL_FAST", ""),
    }


EVAL_EXAMPLES, EVAL_BATCH = 128, 16  # a held-out set of 8 batches (toy_data with another seed)


def batch_by_index(tensors, k, batch: int):
    """Batch ``k`` of ``tensors`` (tensors sharing their first dimension): rows ``k·batch`` to ``(k+1)·batch − 1``,
    sliced by index — the same work whatever ``k`` is. (``dataset.skip(k).take(1)`` would produce, and map, all the
    ``k`` batches before it: O(k) per step, O(n²) for an evaluation.)"""
    start = k * batch
    return tuple(t[start : start + batch] for t in tensors)


def evaluate(strategy, coordinator, model, examples: int = EVAL_EXAMPLES, batch: int = EVAL_BATCH) -> dict:
    """Evaluation scheduled on the workers, two ways, and the same model evaluated in the coordinator (the reference).

    *per-worker dataset* (the pattern of TensorFlow's parameter-server tutorial): every worker holds an iterator over
    the whole evaluation set, and each scheduled step evaluates the *next* batch of whichever worker runs it. *One
    batch per step*: step k is given k and evaluates batch k, sliced out of the set by index
    (:func:`batch_by_index`; with files on disk, file k). Each step returns the ids of the examples it saw and which
    it got right, so every visit is counted."""
    import numpy as np
    import tensorflow as tf

    from .multiworker import toy_data

    x, y = toy_data(examples, seed=1)
    ids = np.arange(examples, dtype="int32")
    batches = examples // batch
    eval_tensors = tuple(tf.constant(a) for a in (ids, x, y))  # small: it travels with the function to the worker

    def eval_set():
        return tf.data.Dataset.from_tensor_slices((ids, x, y)).batch(batch, drop_remainder=True)

    def judge(i, xb, yb):
        return i, tf.cast(tf.argmax(model(xb, training=False), axis=-1, output_type=tf.int32) == yb, tf.int32)

    per_worker = coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(lambda _context: eval_set())
    )
    iterator = iter(per_worker)

    @tf.function
    def next_batch(iterator):
        return strategy.run(judge, args=next(iterator))

    @tf.function
    def batch_k(k):
        return strategy.run(judge, args=batch_by_index(eval_tensors, k, batch))

    out = {"examples": examples, "batches": batches}
    for name, scheduled in (
        ("per-worker dataset", lambda: [coordinator.schedule(next_batch, args=(iterator,)) for _ in range(batches)]),
        (
            "one batch per step",
            lambda: [coordinator.schedule(batch_k, args=(tf.constant(k, tf.int64),)) for k in range(batches)],
        ),
    ):
        remote = scheduled()
        coordinator.join()
        seen = [r.fetch() for r in remote]
        visited = np.concatenate([np.asarray(i) for i, _ in seen])
        out[name] = {
            "visits": np.bincount(visited, minlength=examples).tolist(),
            "correct": int(sum(int(np.asarray(c).sum()) for _, c in seen)),
        }
    reference = judge(ids, x, y)[1]  # in the coordinator: the variables read from the parameter server
    out["coordinator_correct"] = int(np.asarray(reference).sum())
    return out


SKIP_BATCHES = 1024  # batch_cost's evaluation set: 1,024 batches of EVAL_BATCH


def batch_cost(batches: int = SKIP_BATCHES, batch: int = EVAL_BATCH, rounds: int = 3) -> dict:
    """Seconds to get batch k of a ``batches``-batch set (a ``map`` standing in for the parsing of real data), for the
    first and the last k: by ``skip(k).take(1)`` and by :func:`batch_by_index`. Each the best of ``rounds``, after
    one traced call. In this process (the coordinator): a tf.data question, not a cluster one."""
    import numpy as np
    import tensorflow as tf

    from .multiworker import toy_data

    x, _ = toy_data(batches * batch, seed=2)
    ids = np.arange(batches * batch, dtype="int32")

    def parse(i, features):  # stands in for decoding a record
        return i, tf.nn.relu(features) * 2.0 + 1.0

    @tf.function
    def by_skip(k):
        data = tf.data.Dataset.from_tensor_slices((ids, x)).map(parse).batch(batch, drop_remainder=True)
        return data.skip(k).take(1).get_single_element()

    tensors = (tf.constant(ids), tf.constant(x))

    @tf.function
    def by_index(k):
        return parse(*batch_by_index(tensors, k, batch))

    out = {"batches": batches, "batch": batch}
    for name, fn in (("skip(k).take(1)", by_skip), ("slice by index", by_index)):
        fn(tf.constant(0, tf.int64))  # trace
        out[name] = {}
        for k in (0, batches - 1):
            times = []
            for _ in range(rounds):
                start = time.perf_counter()
                first_id = int(fn(tf.constant(k, tf.int64))[0][0])
                times.append(time.perf_counter() - start)
            assert first_id == k * batch, (name, k, first_id)
            out[name][str(k)] = min(times)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=positive_int, default=20)
    parser.add_argument("--no-fit", action="store_true", help="skip the model.fit attempt")
    parser.add_argument(
        "--kill-worker",
        type=int,
        metavar="I",
        help="after evaluating, SIGKILL worker I in the middle of a schedule of training steps",
    )
    parser.add_argument(
        "--kill-steps",
        type=positive_int,
        default=8,
        help="with --kill-worker: steps scheduled before the kill, and as many after it",
    )
    args = parser.parse_args(argv)
    problem = cluster_problem({"chief": 1, "worker": 1, "ps": 1})
    if problem:
        print(problem, file=sys.stderr)
        return 2
    workers = len(json.loads(os.environ["TF_CONFIG"])["cluster"].get("worker", []))
    if args.kill_worker is not None and not 0 <= args.kill_worker < workers:
        print(f"--kill-worker {args.kill_worker}: the cluster has workers 0-{workers - 1}", file=sys.stderr)
        return 2
    if args.kill_worker is not None and workers < 2:
        print("--kill-worker needs at least 2 workers: one must survive", file=sys.stderr)
        return 2
    # Every task, before TensorFlow starts: an RPC of distributed execution to a task that is gone fails at once with
    # UnavailableError (which the coordinator handles), instead of waiting for the task to come back.
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    os.makedirs(args.out, exist_ok=True)
    task_type, index = _task()
    if task_type == "worker" and args.kill_worker is not None:
        with open(pid_file(args.out, index), "w") as f:  # the coordinator kills the worker by its pid
            f.write(str(os.getpid()))
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
    trained = train(strategy, coordinator, model, args.steps)
    result.update({k: v for k, v in trained.items() if not callable(v)})
    print(
        f"chief: custom loop, {args.steps} steps scheduled on the workers in {result['seconds']:.1f} s; loss "
        f"{result['losses'][0]:.3f} (first step) → {result['losses'][-1]:.3f} (last step); variables on "
        f"{result['variable_devices']}",
        flush=True,
    )
    result["evaluation"] = ev = evaluate(strategy, coordinator, model)
    for name in ("per-worker dataset", "one batch per step"):
        visits = ev[name]["visits"]
        print(
            f"chief: evaluation scheduled on the workers, {name}: {ev[name]['correct']}/{ev['examples']} right; "
            f"{visits.count(1)} examples seen once, {sum(v > 1 for v in visits)} more than once, "
            f"{visits.count(0)} never",
            flush=True,
        )
    print(
        f"chief: the same model evaluated in the coordinator: {ev['coordinator_correct']}/{ev['examples']} right",
        flush=True,
    )
    ev["batch_cost"] = cost = batch_cost()
    print(
        f"chief: batch {cost['batches'] - 1} of {cost['batches']}: skip(k).take(1) "
        f"{cost['skip(k).take(1)'][str(cost['batches'] - 1)] * 1e3:.1f} ms, slice by index "
        f"{cost['slice by index'][str(cost['batches'] - 1)] * 1e3:.2f} ms",
        flush=True,
    )
    if args.kill_worker is not None:
        result["worker_failure"] = lost = through_a_worker_failure(
            coordinator, trained, args.kill_worker, pid_file(args.out, args.kill_worker), args.kill_steps
        )
        print(
            f"chief: worker {lost['killed']} SIGKILLed mid-schedule (GRPC_FAIL_FAST={lost['grpc_fail_fast']}); "
            f"{lost['returned']}/{lost['scheduled']} steps returned; workers before the kill {lost['first_half']}, "
            f"after {lost['second_half']}; {lost['put_back']} closure(s) put back; the step ran "
            f"{lost['executions']} times",
            flush=True,
        )
    fileguard.write_json(os.path.join(args.out, "parameter_server.json"), result, indent=None)  # whole or not at all
    if args.kill_worker is not None:  # skip TensorFlow's teardown: it would try (and log failing) to remove every
        sys.stdout.flush()  # function from the killed worker, and the coordinator's threads still wait for it
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
