"""Lesson 08's model-parallel program: one model split over two devices, naive and pipelined, timed.

Run by :func:`course_utils.cluster.run_cluster` with a chief and two workers::

    python -m course_utils cluster --chief --workers 2 --wait-for chief \\
        --module course_utils.lessons.scaling_out.model_parallel -- --out DIR

Each worker is a "device": a TensorFlow server pinned to one CPU core (one compute unit, as an
accelerator is), reached over gRPC — so moving an activation from one to the other is a real transfer.
The chief connects to the cluster (``tf.config.experimental_connect_to_cluster``) and places each half of
an MLP on one worker with ``tf.device``; it times one training step (forward, backward, gradients) with

- the whole model on worker 0 (the reference),
- the model split in two stages (stage 1 on worker 0, stage 2 on worker 1), the batch in one piece
  (*naive* model parallelism: each device waits while the other computes),
- the same split with the batch cut into M micro-batches (GPipe-style *pipelining*: while stage 2
  works on micro-batch m, stage 1 can work on m + 1).

It writes ``DIR/model_parallel.json``: step times (interleaved rounds), each stage alone, the bytes that
cross between the devices per step, and the largest gradient difference between split and whole.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from ... import fileguard
from ...runtime import usable_cores
from .multiworker import cluster_problem, positive_int, serve_until_stopped
from ...timing import time_fn

DEVICE = "/job:worker/replica:0/task:{}/device:CPU:0"


def pin_to_one_core(index: int) -> str:
    """Pin this process to one CPU core (``index`` modulo the cores it may use); say what was done."""
    if not hasattr(os, "sched_setaffinity"):  # macOS, Windows: no affinity API
        return "not pinned (this OS has no sched_setaffinity)"
    cores = sorted(os.sched_getaffinity(0))
    core = cores[index % len(cores)]
    os.sched_setaffinity(0, {core})
    shared = "" if len(cores) > index else f" (shared: only {len(cores)} core(s))"
    return f"pinned to CPU core {core}{shared}"


def init_weights(width: int, layers: int, seed: int = 0) -> list[np.ndarray]:
    """``2 × layers`` square weight matrices: the first half is stage 1, the second stage 2."""
    rng = np.random.default_rng(seed)
    scale = np.float32(1.0 / np.sqrt(width))
    return [(rng.normal(size=(width, width)).astype("float32") * scale) for _ in range(2 * layers)]


def _stage(weights, h):
    import tensorflow as tf

    for w in weights:
        h = tf.nn.relu(tf.matmul(h, w))
    return h


def build_step(weights: list, devices: tuple[str, str], micro_batches: int):
    """One training step of the two-stage MLP (squared error): ``step(x, y) -> (loss, gradients)``.

    Stage 1 runs on ``devices[0]``, stage 2 on ``devices[1]`` (the same device twice = no split). Each
    stage's backward runs on its own device (gradients computed under its ``tf.device``): the activation
    crosses forward, its gradient crosses back. With ``micro_batches`` M > 1 the batch is cut into M
    pieces and nothing orders them: TensorFlow's executor runs whatever is ready on each device, so stage 2
    on piece m overlaps stage 1 on another piece (forcing GPipe's order with control dependencies measured
    slower here). Gradients are summed over the pieces (each piece's loss is divided by M: the same gradient
    as the whole batch).
    """
    import tensorflow as tf

    half = len(weights) // 2
    first, second = weights[:half], weights[half:]

    @tf.function
    def step(x, y):
        xs, ys = tf.split(x, micro_batches), tf.split(y, micro_batches)
        tapes, hs = [], []
        for m in range(micro_batches):  # stage 1 forward of every piece
            with tf.device(devices[0]):
                with tf.GradientTape() as tape:
                    hs.append(_stage(first, xs[m]))
                tapes.append(tape)
        g2 = [tf.zeros_like(w) for w in second]
        loss, back = 0.0, []
        for m in range(micro_batches):  # stage 2 forward and backward, as each piece arrives
            with tf.device(devices[1]):
                with tf.GradientTape() as tape:
                    tape.watch(hs[m])
                    piece_loss = tf.reduce_mean(tf.square(_stage(second, hs[m]) - ys[m])) / micro_batches
                grads = tape.gradient(piece_loss, list(second) + [hs[m]])
                g2 = [a + b for a, b in zip(g2, grads[:-1])]
                loss += piece_loss
                back.append(grads[-1])  # the activation's gradient: goes back to stage 1's device
        g1 = [tf.zeros_like(w) for w in first]
        for m in range(micro_batches):  # stage 1 backward, as each gradient arrives
            with tf.device(devices[0]):
                g1 = [a + b for a, b in zip(g1, tapes[m].gradient(hs[m], list(first), output_gradients=back[m]))]
        return loss, g1 + g2

    return step


def build_stage_alone(weights: list, device: str):
    """Forward and backward of one stage on its device, nothing else: that device's compute per step."""
    import tensorflow as tf

    @tf.function
    def step(x):
        with tf.device(device):
            with tf.GradientTape() as tape:
                out = tf.reduce_sum(_stage(weights, x))
            return tape.gradient(out, list(weights))

    return step


def _variables(arrays, device: str) -> list:
    import tensorflow as tf

    with tf.device(device):
        return [tf.Variable(a) for a in arrays]


def measure(width: int, layers: int, batch: int, micro_batches: list[int], rounds: int = 3, repeats: int = 3) -> dict:
    """Run on the chief of a chief + 2 workers cluster (already connected): every variant, timed."""
    import tensorflow as tf

    d0, d1 = DEVICE.format(0), DEVICE.format(1)
    arrays = init_weights(width, layers)
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(size=(batch, width)).astype("float32"))
    y = tf.constant(rng.normal(size=(batch, width)).astype("float32"))
    half = len(arrays) // 2
    variants = {"one device": ((d0, d0), 1), "split (naive)": ((d0, d1), 1)}
    for m in micro_batches:
        variants[f"split, {m} micro-batches"] = ((d0, d1), m)
    steps, placed = {}, {}
    for name, (devices, m) in variants.items():
        weights = _variables(arrays[:half], devices[0]) + _variables(arrays[half:], devices[1])
        placed[name] = sorted({w.device for w in weights})
        steps[name] = build_step(weights, devices, m)
    stage_steps = {
        "stage 1 alone (worker 0)": build_stage_alone(_variables(arrays[:half], d0), d0),
        "stage 2 alone (worker 1)": build_stage_alone(_variables(arrays[half:], d1), d1),
    }
    reference = steps["one device"](x, y)
    max_diff = {}
    for name, step in steps.items():  # also the warm-up: every function traced and run once
        loss, grads = step(x, y)
        max_diff[name] = max(float(tf.reduce_max(tf.abs(a - b))) for a, b in zip(grads, reference[1]))
    for step in stage_steps.values():
        step(x)

    def fetched(fn, *args):  # every output to the host: the remote devices' work is done
        return lambda: [t.numpy() for t in tf.nest.flatten(fn(*args))]

    timed = {name: fetched(step, x, y) for name, step in steps.items()}
    timed |= {name: fetched(step, x) for name, step in stage_steps.items()}
    times = {name: [] for name in timed}
    for _ in range(rounds):  # interleaved: a drift of the machine hits every variant alike
        for name, fn in timed.items():
            times[name].append(time_fn(fn, repeats=repeats, warmup=0).median_s)
    grad_scale = max(float(tf.reduce_max(tf.abs(g))) for g in reference[1])
    return {
        "width": width,
        "layers_per_stage": layers,
        "batch": batch,
        "micro_batches": micro_batches,
        "times_s": times,
        "max_grad_diff": max_diff,
        "grad_scale": grad_scale,
        "devices": placed,
        # forward: the activation (batch × width float32) crosses once; backward: its gradient, once
        "bytes_across_per_step": 2 * batch * width * 4,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--width", type=positive_int, default=512)
    parser.add_argument("--layers", type=positive_int, default=4, help="layers per stage")
    parser.add_argument("--batch", type=positive_int, default=256)
    parser.add_argument("--micro-batches", type=positive_int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=positive_int, default=3)
    args = parser.parse_args(argv)
    problem = cluster_problem({"chief": 1, "worker": 2})
    if problem:
        print(problem, file=sys.stderr)
        return 2
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    if any(args.batch % m for m in args.micro_batches):
        print(f"--batch {args.batch} must divide by every --micro-batches value", file=sys.stderr)
        return 2
    if task["type"] == "worker":
        print(f"worker {task['index']}: {pin_to_one_core(task['index'])}; serving", flush=True)
    if serve_until_stopped(threads=1):  # workers serve here until the launcher stops them
        return 0
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    tf.config.experimental_connect_to_cluster(resolver, job_name="chief", task_index=0)
    result = measure(args.width, args.layers, args.batch, args.micro_batches, rounds=args.rounds)
    # the cores the two stages' workers were pinned to (pin_to_one_core): one core means they took turns
    result["stage_cores"] = min(2, usable_cores())
    os.makedirs(args.out, exist_ok=True)
    fileguard.write_json(os.path.join(args.out, "model_parallel.json"), result, indent=None)  # whole or not at all
    for name, values in result["times_s"].items():
        print(f"chief: {name:28s} {np.median(values) * 1e3:7.1f} ms a step", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
