"""Lesson 08's worker program: a tiny model trained with MultiWorkerMirroredStrategy and a custom loop.

Run once per task by :func:`course_utils.cluster.run_cluster` (each process reads its ``TF_CONFIG``)::

    python -m course_utils cluster --workers 2 --module course_utils.lessons.scaling_out.multiworker -- --steps 4 --out DIR

Every worker writes ``DIR/worker{i}.npz`` (its final weights, losses and how many examples it saw). The
loop is lesson 05's: the dataset is batched with the *global* batch and split across workers by
``experimental_distribute_dataset`` (lesson 04: auto-sharding by DATA), each replica's loss is divided by
the global batch (``tf.nn.compute_average_loss``), and the gradients are all-reduced by the optimizer.
:func:`single_process_weights` trains the same model on the same global batches in one process: the
weights must match. ``--single`` runs one process without ``TF_CONFIG`` (lesson 08 §3's platform matrix:
``--preemptible`` under a fake GCE metadata server, and ``--own-handler``, periodic checkpoints with a SIGTERM handler
of our own).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback

import numpy as np

from ... import fileguard

GLOBAL_BATCH = 16
FEATURES = 6


def positive_int(text: str) -> int:
    """argparse type of the worker programs: a whole number of at least 1 (else one line, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def cluster_problem(needs: dict[str, int]) -> str:
    """Why this process's ``TF_CONFIG`` cannot run a program that needs ``needs`` tasks per type ("" if it can).

    A chief-driven program started without its chief would leave its workers serving forever: say so at once."""
    if "TF_CONFIG" not in os.environ:
        return "TF_CONFIG is not set: run this through `python -m course_utils cluster`"
    try:
        cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    except (ValueError, KeyError, TypeError):
        return "TF_CONFIG is not valid JSON with a 'cluster' entry"
    missing = [f"{n} {kind}" for kind, n in needs.items() if len(cluster.get(kind, [])) < n]
    if missing:
        flags = " ".join(
            ("--chief" if kind == "chief" else f"--{'workers' if kind == 'worker' else kind} {n}")
            for kind, n in needs.items()
        )
        return f"this program needs at least {', '.join(missing)} task(s): run it with `python -m course_utils cluster {flags}`"
    return ""


def load_result(path: str) -> tuple[list[np.ndarray], dict]:
    """A worker's saved ``.npz``: its final weights (in order) and the other arrays it wrote (losses, ...)."""
    with np.load(path) as f:
        weights = [f[k] for k in sorted((k for k in f.files if k.startswith("arr_")), key=lambda k: int(k[4:]))]
        return weights, {k: f[k] for k in f.files if not k.startswith("arr_")}


def toy_data(n: int = 256, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype("float32")
    y = ((x[:, 0] + 0.5 * x[:, 1]) > 0).astype("int32")
    return x, y


def toy_model(seed: int = 0):
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)]
    )


def _dataset(steps: int, global_batch: int):
    import tensorflow as tf

    x, y = toy_data(steps * global_batch)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch, drop_remainder=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    # No autotuning: nothing here to tune, and its model thread sleeps ever longer between rounds while the iterator
    # lives; deleting the iterator waits for that sleep to end (after §3's 12-s hang a worker sat 8-28 s in
    # ~MultiDeviceIterator: RootDataset::Iterator's destructor waiting on Model::OptimizeLoop, seen in gdb).
    options.autotune.enabled = False
    return ds.with_options(options)


def _train_step(strategy, model, optimizer, global_batch: int):
    """Lesson 05's custom-loop step: each replica's loss over the *global* batch, SUM across replicas."""
    import keras
    import tensorflow as tf

    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def step(batch):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(
                    per_example(y, model(x, training=True)), global_batch_size=global_batch
                )
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        return strategy.reduce("SUM", strategy.run(replica, args=batch), axis=None)

    return step


def train(strategy, steps: int, global_batch: int = GLOBAL_BATCH, lr: float = 0.1) -> dict:
    """``steps`` SGD updates of :func:`toy_model` under ``strategy``, custom loop; weights, losses, examples seen."""
    import keras

    with strategy.scope():
        model = toy_model()
        optimizer = keras.optimizers.SGD(lr)
    dist = strategy.experimental_distribute_dataset(_dataset(steps, global_batch))
    step = _train_step(strategy, model, optimizer, global_batch)
    losses, local_seen = [], 0
    for batch in dist:
        loss = step(batch)
        losses.append(float(loss))
        local_seen += int(sum(int(t.shape[0]) for t in strategy.experimental_local_results(batch[0])))
    return {"weights": [w.numpy() for w in model.trainable_variables], "losses": losses, "local_examples": local_seen}


def _task() -> tuple[str, int]:
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    return task.get("type", "worker"), int(task.get("index", 0))


def train_resumable(
    strategy,
    steps: int,
    ckpt_dir: str,
    log_path: str,
    crash_after: int | None = None,
    global_batch: int = GLOBAL_BATCH,
    lr: float = 0.1,
) -> dict:
    """:func:`train` with a checkpoint after every step, restored at start: a killed cluster resumes exactly.

    The checkpoint holds the weights, the optimizer and the step counter; on restart the input skips the
    global batches already used, so no step is lost or repeated. Worker 0 (the chief when there is no
    ``chief`` task) writes ``ckpt_dir``; the others write a scratch directory (every worker calls save: saving
    can be collective), as the TensorFlow multi-worker guide does. A step is committed once every worker has
    saved it (a barrier), then appended to ``log_path`` by each (another barrier, so a crash right after
    cannot cut another worker's log short). ``crash_after``: SIGKILL this process right after committing that step (a test of the
    fault tolerance, standing in for a preempted machine).
    """
    import signal

    import keras
    import tensorflow as tf

    task_type, index = _task()
    with strategy.scope():
        model = toy_model()
        optimizer = keras.optimizers.SGD(lr)
        done = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps_done")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, steps_done=done)
    is_chief = task_type == "chief" or (
        task_type == "worker"
        and index == 0
        and "chief" not in json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    )
    own_dir = ckpt_dir if is_chief else os.path.join(ckpt_dir, f"scratch_{task_type}{index}")
    manager = tf.train.CheckpointManager(checkpoint, own_dir, max_to_keep=2)
    latest = tf.train.latest_checkpoint(ckpt_dir)
    if latest:
        checkpoint.restore(latest)
    start = int(done.numpy())
    dist = strategy.experimental_distribute_dataset(_dataset(steps, global_batch).skip(start))
    step = _train_step(strategy, model, optimizer, global_batch)

    @tf.function
    def barrier():  # a tiny all-reduce: returns on each worker only once every worker has reached it
        return strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)

    for batch in dist:
        step(batch)
        done.assign_add(1)
        manager.save(checkpoint_number=int(done.numpy()))
        barrier()  # every worker has saved: worker 0's checkpoint of this step is complete
        with open(log_path, "a") as f:
            f.write(f"{int(done.numpy())}\n")
        barrier()  # every worker has logged it: the step is committed everywhere
        if crash_after is not None and int(done.numpy()) == crash_after:
            os.kill(os.getpid(), signal.SIGKILL)
    return {"weights": [w.numpy() for w in model.trainable_variables], "start": start}


PREEMPTED_EXIT = 42  # PreemptionCheckpointHandler's exit code after saving (TensorFlow's default on other platforms)
GCE_RESTART_EXIT = 143  # ... on a GCE GPU VM (failure_handling_util._RESTARTABLE_EXIT_CODE)
OWN_HANDLER_EXIT = 143  # train_with_own_sigterm_handler's exit after its save: 128 + SIGTERM, a shell's code for it


def pretend_gpu() -> None:
    """Make TensorFlow's platform detection see a GPU: ``failure_handling_util.detect_platform`` returns ``GCE_GPU``
    when the metadata server answers (``on_gcp()``, still asked for real) and ``INTERNAL_GPU`` when not. It decides
    GPU or not from ``list_logical_devices('GPU')`` alone, which no metadata server can change: on a CPU-only
    machine this is the only way to run the handler's GCE-GPU code path (everything after detection is TensorFlow's)."""
    from tensorflow.python.distribute.failure_handling import failure_handling_util as util

    util.detect_platform = lambda: util.PlatformDevice.GCE_GPU if util.on_gcp() else util.PlatformDevice.INTERNAL_GPU


def _notice(kind: str) -> None:
    """The preemption notice this worker gives itself: ``sigterm`` (how a VM is told it will stop: an ACPI soft-off
    becomes SIGTERM to every process), ``maintenance`` (the GCE metadata server announces
    ``TERMINATE_ON_HOST_MAINTENANCE``: the fake server's, :mod:`course_utils.gce`) or ``sigkill`` (no notice at all)."""
    import signal

    if kind == "maintenance":
        from ... import gce

        gce.send_maintenance_notice()
    else:
        os.kill(os.getpid(), signal.SIGKILL if kind == "sigkill" else signal.SIGTERM)


def train_preemptible(
    strategy,
    steps: int,
    ckpt_dir: str,
    log_path: str,
    term_after: int | None = None,
    step_seconds: float = 0.05,
    global_batch: int = GLOBAL_BATCH,
    lr: float = 0.1,
    notice: str = "sigterm",
    grace_period: float | None = None,
) -> dict:
    """TensorFlow's own answer for preempted workers in a custom loop: ``tf.distribute.experimental.
    PreemptionCheckpointHandler``. Off Google Cloud it restores the latest checkpoint in ``ckpt_dir`` when it is
    created (a step counter in the checkpoint says how many steps are done: TensorFlow deprecated
    ``handler.total_run_calls`` for that); every step goes through ``handler.run``. When any worker
    receives SIGTERM (how a cloud VM is told it will be preempted; off Google Cloud the handler watches SIGTERM), the
    workers agree on a step, all save a checkpoint after it, and exit with :data:`PREEMPTED_EXIT` — no step lost, no
    checkpoint every step. On a GCE VM it does something else (lesson 08 §3 measures it). ``term_after``: this worker
    gives itself ``notice`` (:func:`_notice`) after that step (standing in for the cloud's); ``step_seconds``: a pause
    per step, so the notice lands while the cluster is training; ``grace_period``: passed to
    ``TerminationConfig`` (None: the platform's default). Each worker appends every step it finished to
    ``log_path``."""
    import keras
    import tensorflow as tf

    with strategy.scope():
        model = toy_model()
        optimizer = keras.optimizers.SGD(lr)
        done = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps_done")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, steps_done=done)
    config = None if grace_period is None else tf.distribute.experimental.TerminationConfig(grace_period=grace_period)
    handler = tf.distribute.experimental.PreemptionCheckpointHandler(
        strategy.cluster_resolver, checkpoint, ckpt_dir, termination_config=config
    )
    start = int(done.numpy())  # the handler restored its latest checkpoint, the step counter with it
    platform = getattr(handler, "_platform_device", None)  # private: what detect_platform() said at creation
    print(f"platform: {platform.name if platform else 'unknown'}", flush=True)
    dist = iter(strategy.experimental_distribute_dataset(_dataset(steps, global_batch).skip(start)))
    step = _train_step(strategy, model, optimizer, global_batch)

    def step_and_count(batch):  # the counter moves inside the step: a checkpoint after it holds both
        step(batch)
        done.assign_add(1)

    for _ in range(start, steps):
        handler.run(step_and_count, next(dist))  # after a preemption notice: saves here, on every worker, and exits
        with open(log_path, "a") as f:
            f.write(f"{int(done.numpy())}\n")
        if term_after is not None and int(done.numpy()) == term_after:
            _notice(notice)
        time.sleep(step_seconds)
    return {"weights": [w.numpy() for w in model.trainable_variables], "start": start}


def train_with_own_sigterm_handler(
    strategy,
    steps: int,
    ckpt_dir: str,
    log_path: str,
    save_every: int,
    term_after: int | None = None,
    notice: str = "sigterm",
    step_seconds: float = 0.05,
    global_batch: int = GLOBAL_BATCH,
    lr: float = 0.1,
) -> dict:
    """What works on any VM, Colab's CPU and TPU runtimes included: a ``tf.train.CheckpointManager`` saving every
    ``save_every`` steps (the floor: a machine that dies without notice loses fewer than ``save_every`` steps) and a
    SIGTERM handler of our own that only raises a flag; the loop checks it after each step, saves once and exits with
    :data:`OWN_HANDLER_EXIT` (no step lost). ``restore_or_initialize`` resumes from the latest checkpoint. One process:
    on several workers they must first agree on the step (the coordination service does that for TensorFlow's
    handler)."""
    import signal

    import keras
    import tensorflow as tf

    with strategy.scope():
        model = toy_model()
        optimizer = keras.optimizers.SGD(lr)
        done = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps_done")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, steps_done=done)
    manager = tf.train.CheckpointManager(checkpoint, ckpt_dir, max_to_keep=2)
    manager.restore_or_initialize()
    start = int(done.numpy())
    noticed = []
    signal.signal(signal.SIGTERM, lambda signum, frame: noticed.append(signum))  # never save inside a signal handler
    dist = iter(strategy.experimental_distribute_dataset(_dataset(steps, global_batch).skip(start)))
    step = _train_step(strategy, model, optimizer, global_batch)
    for _ in range(start, steps):
        step(next(dist))
        done.assign_add(1)
        with open(log_path, "a") as f:
            f.write(f"{int(done.numpy())}\n")
        if noticed:  # the notice came during the last step: save it and leave
            manager.save(checkpoint_number=int(done.numpy()))
            sys.exit(OWN_HANDLER_EXIT)
        if int(done.numpy()) % save_every == 0:
            manager.save(checkpoint_number=int(done.numpy()))
        if term_after is not None and int(done.numpy()) == term_after:
            _notice(notice)
        time.sleep(step_seconds)
    return {"weights": [w.numpy() for w in model.trainable_variables], "start": start}


COLLECTIVE_TIMEOUT_EXIT = 3  # the worker program's exit code when a collective failed: timed out, or lost a peer
# (a restartable failure: a cluster manager would restart the job from its last checkpoint)


def strategy_with_timeout(timeout_s: float | None):
    """``MultiWorkerMirroredStrategy`` whose collectives fail after ``timeout_s`` seconds (None or 0: wait forever).

    ``CommunicationOptions(implementation=RING)``: the ring all-reduce over gRPC, TensorFlow's implementation for CPUs
    (``NCCL`` is for GPUs, ``AUTO`` lets TensorFlow choose); ``timeout_seconds``: a collective that takes longer
    raises ``tf.errors.DeadlineExceededError`` on this worker instead of waiting."""
    import tensorflow as tf

    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING, timeout_seconds=timeout_s or None
    )
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def set_heartbeat_timeout(seconds: float) -> None:
    """Start the coordination service as ``MultiWorkerMirroredStrategy`` would (``standalone``, led by the chief, or
    worker 0 when there is none, the chief and workers coordinated: TensorFlow 2.20,
    ``collective_all_reduce_strategy.py``) but with a heartbeat timeout of ``seconds``; call it before creating the
    strategy, which then keeps it. TensorFlow has no public setting for it: this is the private call the strategy
    makes. Lesson 08 uses it in smoke mode only, to find a dead worker sooner."""
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.distribute.cluster_resolver import TFConfigClusterResolver
    from tensorflow.python.eager import context

    spec = TFConfigClusterResolver().cluster_spec()
    jobs = [
        coordination_config_pb2.CoordinatedJob(name=job, num_tasks=spec.num_tasks(job))
        for job in ("chief", "worker")
        if job in spec.jobs
    ]
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(spec),
        coordinated_jobs=jobs,
        heartbeat_timeout_in_ms=int(seconds * 1000),
    )


def failure_detection(strategy) -> dict:
    """How this worker's ``MultiWorkerMirroredStrategy`` would notice a dead peer (TensorFlow 2.20,
    ``collective_all_reduce_strategy.py``): the strategy configures the *coordination service* (``standalone``, led by
    the chief or worker 0) unless something configured it first, and then switches its own Python health-check thread
    off ("Check health not enabled"): the service's heartbeats find dead peers instead. ``heartbeat_timeout_ms``: 0
    means the service's default (``kDefaultHeartbeatTimeoutMs``, 10 s, in XLA's ``coordination_service.cc``). Read
    from private attributes: they are what the strategy itself reads."""
    from tensorflow.python.eager import context

    config = context.context().coordination_service  # a CoordinationServiceConfig proto, or None
    return {
        "health_check_thread": bool(getattr(strategy.extended, "_enable_check_health", None)),
        "coordination_service": config.service_type if config is not None else "",
        "heartbeat_timeout_ms": int(config.heartbeat_timeout_in_ms) if config is not None else None,
    }


DIE_AFTER_S = 1.0  # a dying worker's pause before its death: its peers finish pulling the last step's data from it


def _die(died_path: str | None) -> None:
    """SIGKILL this process (no notice, no cleanup: a machine that dies), after writing when to ``died_path``. First a
    pause of :data:`DIE_AFTER_S`: a collective ends on a worker once it has its peers' data, while they may still be
    pulling its own (RecvBuf). Dying at once could cut their last step short — they would see a broken connection
    (measured: ``Socket closed`` 0.04 s later) — instead of waiting in the next step, as after a death between
    steps."""
    import signal

    time.sleep(DIE_AFTER_S)
    if died_path:
        with open(died_path, "w") as f:
            f.write(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def train_with_a_stall(
    strategy,
    steps: int,
    stall_after: int,
    stall_s: float,
    stalls: bool,
    global_batch: int = GLOBAL_BATCH,
    lr: float = 0.1,
    dies: bool = False,
    died_path: str | None = None,
    hang_path: str | None = None,
) -> dict:
    """:func:`train`'s loop, timing each step; if ``stalls``, this worker stops for ``stall_s`` seconds after step
    ``stall_after`` (standing in for a hung process: a deadlock, stuck storage, a debugger; when it starts goes to
    ``hang_path``) — or, with ``dies``, SIGKILLs itself there (a machine that dies; when goes to ``died_path``). The
    other workers' next all-reduce waits for it — as long as it takes, until the strategy's collective timeout, or
    until the coordination service reports the dead worker: then this returns the error's type, the sentence that
    says why, and how long the step had waited, instead of raising."""
    import keras
    import tensorflow as tf

    with strategy.scope():
        model = toy_model()
        optimizer = keras.optimizers.SGD(lr)
    dist = iter(strategy.experimental_distribute_dataset(_dataset(steps, global_batch)))
    step = _train_step(strategy, model, optimizer, global_batch)
    step_s: list[float] = []
    for number in range(1, steps + 1):
        if stalls and number == stall_after + 1:
            if dies:
                _die(died_path)
            if hang_path:
                with open(hang_path, "w") as f:
                    f.write(repr(time.time()))
            time.sleep(stall_s)
        start = time.perf_counter()
        try:
            step(next(dist))
        except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError, tf.errors.CancelledError) as err:
            return {
                "step_s": step_s,
                "error": type(err).__name__,
                "failed_step": number,
                "waited_s": time.perf_counter() - start,
                "failed_at": time.time(),
                "error_line": _key_line(str(err)),
            }
        step_s.append(time.perf_counter() - start)
    # Not deleted before the program ends (exit_with_peers: no teardown): the distributed iterator's per-device
    # datasets are autotuned whatever the options say, and after the hang deleting them waited 8 s for that thread.
    _KEEP_UNTIL_EXIT.append(dist)
    return {"step_s": step_s, "error": None, "failed_step": None, "waited_s": None}


_KEEP_UNTIL_EXIT: list = []


def _key_line(message: str) -> str:
    """The sentence of a collective's error that says what happened (TensorFlow's message opens with the op's name)."""
    for key in ("The following tasks are unhealthy", "Collective has timed out", "Collective ops is aborted by"):
        if key in message:
            line = " ".join(message[message.index(key) :].split())
            return line.split(" The tasks have crashed")[0].split(" [Op:")[0][:200]
    return " ".join(message.split())[:200]


def time_steps(strategy, steps: int, per_worker_batch: int = 64, rounds: int = 3) -> dict:
    """Seconds per training step, and per all-reduce of the same gradients alone (medians of ``rounds``).

    Weak scaling: each worker keeps ``per_worker_batch`` examples a step, so the compute per worker is the
    same with 1, 2 or 4 workers and what grows is the communication. The all-reduce is timed on its own
    (the replica context's ``all_reduce`` of tensors shaped like the gradients), so its share of the step
    is measured, not inferred."""
    import keras
    import tensorflow as tf

    global_batch = per_worker_batch * strategy.num_replicas_in_sync
    with strategy.scope():
        model = toy_model()
        optimizer = keras.optimizers.SGD(0.01)
    dist = iter(strategy.experimental_distribute_dataset(_dataset(steps, global_batch).repeat()))
    step = _train_step(strategy, model, optimizer, global_batch)

    @tf.function
    def all_reduce():
        def replica():
            return tf.distribute.get_replica_context().all_reduce(
                "SUM", [tf.identity(v) for v in model.trainable_variables]
            )

        return strategy.run(replica)

    def run(fn, n):
        start = time.perf_counter()
        for _ in range(n):
            out = fn()
        tf.nest.map_structure(
            lambda t: t.numpy() if hasattr(t, "numpy") else t, strategy.experimental_local_results(out)
        )
        return (time.perf_counter() - start) / n

    run(lambda: step(next(dist)), 3)  # warm-up: trace and first collectives
    run(all_reduce, 3)
    step_s, reduce_s = [], []
    for _ in range(rounds):
        step_s.append(run(lambda: step(next(dist)), steps))
        reduce_s.append(run(all_reduce, steps))
    return {
        "workers": strategy.num_replicas_in_sync,
        "per_worker_batch": per_worker_batch,
        "step_s": float(np.median(step_s)),
        "all_reduce_s": float(np.median(reduce_s)),
        "step_s_rounds": step_s,
        "all_reduce_s_rounds": reduce_s,
        "gradient_bytes": int(sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)),
    }


def fit_under_strategy(strategy, steps: int, global_batch: int = GLOBAL_BATCH) -> None:
    """Keras 3 ``model.fit`` under ``strategy`` (how the official multi-worker tutorial trains)."""
    import keras

    with strategy.scope():
        model = toy_model()
        model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(_dataset(steps, global_batch), epochs=1, steps_per_epoch=steps, verbose=0)


def serve_until_stopped(threads: int | None = None) -> bool:
    """For chief-driven layouts (parameter servers, model parallelism): a worker or ps task starts its
    TensorFlow server and serves the chief until the launcher stops it (never returns); the chief gets
    False back and goes on. ``threads``: limit the server's op threads (one core per "device")."""
    task_type, index = _task()
    if task_type not in ("worker", "ps"):
        return False
    import tensorflow as tf

    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=task_type, task_index=index, protocol="grpc", start=True
    )
    server.join()
    return True  # pragma: no cover - join() returns only when the process is stopped


def single_process_weights(steps: int, global_batch: int = GLOBAL_BATCH) -> dict:
    """The same training in this process on one device: the reference the workers must equal."""
    import tensorflow as tf

    return train(tf.distribute.OneDeviceStrategy("/cpu:0"), steps, global_batch)


def _time_alone(args, task: dict, workers: int, wait_s: float = 120.0) -> int:
    """``--time --alone``: this worker leaves the cluster (its own one-worker strategy), waits until every worker of
    the launch is ready (files in ``--out``: no communication between them), then times its step and its local
    all-reduce while the others do the same on the shared cores."""
    import tensorflow as tf

    del os.environ["TF_CONFIG"]  # a one-worker MultiWorkerMirroredStrategy: the same step, no peers
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    name = f"{task['type']}{task['index']}"
    with open(os.path.join(args.out, f"{name}.ready"), "w"):
        pass
    deadline = time.monotonic() + wait_s
    while sum(f.endswith(".ready") for f in os.listdir(args.out)) < workers:
        if time.monotonic() > deadline:
            print(f"{name}: the other workers did not get ready within {wait_s:g} s", file=sys.stderr)
            return 1
        time.sleep(0.01)
    timing = time_steps(strategy, args.time, args.per_worker_batch)
    fileguard.write_json(
        os.path.join(args.out, f"{name}_timing.json"), dict(timing, alone_of=workers), indent=None
    )  # whole or not at all
    print(f"{name}: {timing['step_s'] * 1e3:.2f} ms a step alone, beside {workers - 1} other worker(s)", flush=True)
    return 0


def non_negative_float(text: str) -> float:
    """argparse type: a finite number of seconds, 0 or more (else one line, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, 0 or more, got {text!r}")
    return value


def _stall(args, strategy, task: dict) -> int:
    """``--stall-worker I``: :func:`train_with_a_stall` (``--die``: that worker SIGKILLs itself instead of hanging);
    each worker writes ``worker{i}_stall.json``, with how this worker would notice a dead peer
    (:func:`failure_detection`) and, when its step failed after a worker died, how long after the death. A worker
    whose collective failed says so in one line and exits with :data:`COLLECTIVE_TIMEOUT_EXIT` (a cluster manager
    would restart the job from its last checkpoint)."""
    name = f"{task['type']}{task['index']}"
    died_path = os.path.join(args.out, f"worker{args.stall_worker}_died_at.txt")
    result = train_with_a_stall(
        strategy,
        args.steps,
        args.stall_after,
        args.stall_seconds,
        stalls=task["index"] == args.stall_worker,
        dies=args.die,
        died_path=died_path,
        hang_path=os.path.join(args.out, f"worker{args.stall_worker}_hangs.txt"),
    )
    result.update(
        timeout_s=args.collective_timeout,
        heartbeat_s=args.heartbeat_timeout,
        stall_s=args.stall_seconds,
        stall_after=args.stall_after,
        dies=args.die,
        detection=failure_detection(strategy),
    )
    if result["error"] and args.die and os.path.exists(died_path):
        with open(died_path) as f:
            result["after_death_s"] = result.pop("failed_at") - float(f.read())
    result.pop("failed_at", None)
    fileguard.write_json(os.path.join(args.out, f"{name}_stall.json"), result, indent=None)  # whole or not at all
    if result["error"]:
        print(
            f"{task['type']} {task['index']}: step {result['failed_step']} raised {result['error']} after "
            f"{result['waited_s']:.1f} s (collective timeout {args.collective_timeout:g} s): "
            f"{result['error_line'][:120]}",
            flush=True,
        )
        return COLLECTIVE_TIMEOUT_EXIT
    print(
        f"{task['type']} {task['index']}: {len(result['step_s'])} steps; the longest took "
        f"{max(result['step_s']):.1f} s",
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=4)
    parser.add_argument("--out", required=True)
    parser.add_argument("--ckpt", help="checkpoint after every step here and resume from it")
    parser.add_argument("--crash-worker", type=int, help="this worker SIGKILLs itself (with --crash-after)")
    parser.add_argument("--crash-after", type=positive_int, help="... right after committing this step")
    parser.add_argument("--fit", action="store_true", help="train with Keras model.fit instead of the custom loop")
    parser.add_argument(
        "--time",
        type=positive_int,
        metavar="STEPS",
        help="after training, time this many steps and all-reduces per round (3 rounds)",
    )
    parser.add_argument("--per-worker-batch", type=positive_int, default=64, help="with --time")
    parser.add_argument(
        "--preemptible", metavar="DIR", help="train under TensorFlow's PreemptionCheckpointHandler, checkpoints in DIR"
    )
    parser.add_argument("--term-worker", type=int, help="with --preemptible: this worker sends itself SIGTERM ...")
    parser.add_argument("--term-after", type=positive_int, help="... after this step")
    parser.add_argument(
        "--notice",
        choices=("sigterm", "maintenance", "sigkill"),
        default="sigterm",
        help="with --term-worker: the notice (SIGTERM; a GCE maintenance event on the fake metadata "
        "server of course_utils.gce; SIGKILL: none)",
    )
    parser.add_argument(
        "--grace-period",
        type=non_negative_float,
        help="with --preemptible: TerminationConfig(grace_period=...) (default: the platform's)",
    )
    parser.add_argument(
        "--pretend-gpu",
        action="store_true",
        help="with --preemptible: TensorFlow's platform detection sees a GPU (multiworker.pretend_gpu)",
    )
    parser.add_argument(
        "--own-handler", metavar="DIR", help="one process: periodic checkpoints in DIR and our own SIGTERM handler"
    )
    parser.add_argument("--save-every", type=positive_int, default=2, help="with --own-handler")
    parser.add_argument(
        "--step-seconds",
        type=non_negative_float,
        default=0.05,
        help="with --preemptible or --own-handler: a pause after each step",
    )
    parser.add_argument(
        "--single",
        action="store_true",
        help="one process without TF_CONFIG (no cluster): for --preemptible and --own-handler",
    )
    parser.add_argument(
        "--alone",
        action="store_true",
        help="with --time: each worker trains on its own (no cluster), all at the same time: the step "
        "with the cores shared and no communication",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=non_negative_float,
        default=0.0,
        metavar="SECONDS",
        help="the coordination service's heartbeat timeout (0: TensorFlow's default, 10 s)",
    )
    parser.add_argument(
        "--collective-timeout",
        type=non_negative_float,
        default=0.0,
        metavar="SECONDS",
        help="collectives fail after this long (CommunicationOptions.timeout_seconds; 0: never)",
    )
    parser.add_argument("--stall-worker", type=int, help="this worker stops for --stall-seconds ...")
    parser.add_argument("--stall-after", type=positive_int, default=1, help="... after this step")
    parser.add_argument("--stall-seconds", type=non_negative_float, default=0.0)
    parser.add_argument(
        "--die",
        action="store_true",
        help="with --stall-worker: that worker SIGKILLs itself after --stall-after instead of stopping",
    )
    args = parser.parse_args(argv)
    if args.own_handler and not args.single:
        print("--own-handler needs --single (one process)", file=sys.stderr)
        return 2
    problem = "" if args.single else cluster_problem({"worker": 1})
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if args.alone and not args.time:
        print("--alone needs --time STEPS", file=sys.stderr)
        return 2
    if args.die and args.stall_worker is None:
        print("--die needs --stall-worker I (the worker that dies)", file=sys.stderr)
        return 2
    import tensorflow as tf

    config = (
        json.loads(os.environ["TF_CONFIG"])
        if not args.single
        else {"cluster": {"worker": ["localhost"]}, "task": {"type": "worker", "index": 0}}
    )
    task = config["task"]
    os.makedirs(args.out, exist_ok=True)
    if args.alone:
        return _time_alone(args, task, len(config["cluster"]["worker"]))
    if args.heartbeat_timeout and not args.single:
        set_heartbeat_timeout(args.heartbeat_timeout)
    strategy = strategy_with_timeout(args.collective_timeout)
    if not args.single:
        _CLUSTER_STRATEGY.append(strategy)  # exit_with_peers: one last barrier, then no teardown
    if args.stall_worker is not None:
        return _stall(args, strategy, task)
    if args.fit:
        import keras

        keras.config.disable_traceback_filtering()  # keep Keras' own frames: the message names where it failed
        try:
            fit_under_strategy(strategy, args.steps)
        except Exception as err:  # noqa: BLE001 - one readable line: the error prints whole tensors
            text = re.sub(r"PerReplica:\{.*?\}\)", "PerReplica:{...})", str(err), flags=re.S)
            frames = [f for f in traceback.extract_tb(err.__traceback__) if f"{os.sep}keras{os.sep}" in f.filename]
            where = (
                f" (raised in keras/{frames[-1].filename.rsplit(os.sep + 'keras' + os.sep, 1)[1]}, {frames[-1].name})"
                if frames
                else ""
            )
            print(
                f"{task['type']} {task['index']}: model.fit failed: {type(err).__name__}: "
                f"{' '.join(text.split())[:300]}{where}",
                flush=True,
            )
            return 1
        print(f"{task['type']} {task['index']}: model.fit finished", flush=True)
        return 0
    if args.preemptible or args.ckpt or args.own_handler:
        name = f"{task['type']}{task['index']}"
        log_path = os.path.join(args.out, f"{name}_steps.txt")
        term = args.term_after if args.term_worker == task["index"] else None
        if args.own_handler:
            result = train_with_own_sigterm_handler(
                strategy,
                args.steps,
                args.own_handler,
                log_path,
                args.save_every,
                term_after=term,
                notice=args.notice,
                step_seconds=args.step_seconds,
            )
        elif args.preemptible:
            if args.pretend_gpu:
                pretend_gpu()
            result = train_preemptible(
                strategy,
                args.steps,
                args.preemptible,
                log_path,
                term_after=term,
                step_seconds=args.step_seconds,
                notice=args.notice,
                grace_period=args.grace_period,
            )
        else:
            crash = args.crash_after if args.crash_worker == task["index"] else None
            result = train_resumable(strategy, args.steps, args.ckpt, log_path, crash_after=crash)
        path = os.path.join(args.out, f"{name}.npz")
        np.savez(path, *result["weights"], start=np.array(result["start"]))
        print(
            f"{task['type']} {task['index']}: resumed at step {result['start']}, trained to {args.steps} → {path}",
            flush=True,
        )
        return 0
    result = train(strategy, args.steps)
    path = os.path.join(args.out, f"{task['type']}{task['index']}.npz")
    np.savez(
        path,
        *result["weights"],
        losses=np.array(result["losses"]),
        local_examples=np.array(result["local_examples"]),
        replicas=np.array(strategy.num_replicas_in_sync),
    )
    print(
        f"{task['type']} {task['index']}: {len(result['losses'])} steps on {strategy.num_replicas_in_sync} replicas, "
        f"last loss {result['losses'][-1]:.4f}, saw {result['local_examples']} examples → {path}",
        flush=True,
    )
    if args.time:
        timing = time_steps(strategy, args.time, args.per_worker_batch)
        fileguard.write_json(
            os.path.join(args.out, f"{task['type']}{task['index']}_timing.json"), timing, indent=None
        )  # whole or not at all
        print(
            f"{task['type']} {task['index']}: {timing['step_s'] * 1e3:.2f} ms a step, all-reduce alone "
            f"{timing['all_reduce_s'] * 1e3:.2f} ms ({timing['workers']} worker(s))",
            flush=True,
        )
    return 0


_CLUSTER_STRATEGY: list = []  # the MultiWorkerMirroredStrategy main() trained with, when it ran in a cluster


def exit_with_peers(code: int) -> None:
    """End the worker program with ``code`` without TensorFlow's teardown, which can stall a worker for the heartbeat
    timeout: at exit TensorFlow removes each traced function from every remote worker, and a worker whose peer has
    already exited waits until the coordination service declares that peer dead (measured: the slower worker of a
    cluster ended 8 s after the other, and logged "tasks have crashed"). A worker that succeeded first meets the
    others at a last tiny all-reduce — each passes it only once every other has reached it, its results written — and
    then exits at once; a barrier cut short by a peer that left first is ignored: everything is written. A collective
    that failed (:data:`COLLECTIVE_TIMEOUT_EXIT`: a peer is gone or hung) exits at once: at exit the coordination
    service would wait for the lost peer (measured: 13 s more)."""
    cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    if code == 0 and _CLUSTER_STRATEGY and len(cluster.get("worker", [])) + len(cluster.get("chief", [])) > 1:
        import tensorflow as tf

        strategy = _CLUSTER_STRATEGY[0]
        try:
            tf.function(lambda: strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None))()
        except tf.errors.OpError:
            pass
    if code in (0, COLLECTIVE_TIMEOUT_EXIT) and _CLUSTER_STRATEGY:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    exit_with_peers(main())
