"""Memory accounting: bytes of variables by dtype, a training-memory estimate, and measured peak memory.

Three helpers, each saying exactly what it counts (CONTRIBUTING.md §6):

- :func:`variable_bytes` — the bytes a model's variables occupy, split by dtype (exact).
- :func:`estimate_training_memory` — parameters + gradients + optimizer slots (exact for the
  optimizers it knows) + activations (an estimate: every top-level layer's output kept for backprop),
  under a dtype policy. Under ``mixed_bfloat16``/``mixed_float16`` the **variables stay float32**, so
  parameters, gradients and optimizer slots do not shrink; only activations (compute dtype) halve.
  Only a pure ``bfloat16``/``float16`` policy halves the parameter bytes.
- :func:`measure_peak` — run a function and measure the peak memory it needed: reset the allocator's
  statistics, run, read ``tf.config.experimental.get_memory_info(device)["peak"]`` (TPU, GPU, and a CPU
  whose allocator is TensorFlow's BFC one: ``TF_CPU_ALLOCATOR_USE_BFC=true``, which importing course_utils sets before
  TensorFlow starts), otherwise fall back to the process's peak resident memory (RSS) growth. The
  result always names the method used.
- :func:`measure_peak_isolated` / :func:`measure_peaks_isolated` — the same, for a step built in a
  **fresh process**, so that nothing this process ran before changes the figure (on a CPU; on a
  TPU/GPU, which belongs to this process, they measure here and say so). On Linux the fresh processes
  are forked from one helper process that has only imported TensorFlow (kept for the next call;
  :func:`stop_measuring_process` ends it). :func:`measure_isolated` also times the steps against a
  baseline in those same processes, so each step is compiled once for both figures.

Which mixed policy suits the hardware is :mod:`course_utils.policy`'s.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Mapping

from . import processes
from .report import Samples, Table
from .timing import time_fn

__all__ = [
    "IsolatedMeasurements",
    "MemoryEstimate",
    "PeakMemory",
    "VariableBytes",
    "estimate_training_memory",
    "format_bytes",
    "measure_isolated",
    "measure_peak",
    "measure_peak_isolated",
    "measure_peaks_isolated",
    "stop_measuring_process",
    "optimizer_slots_per_variable",
    "variable_bytes",
]

MIB = 2**20


def format_bytes(n: float) -> str:
    """``1536`` → ``'1.5 KiB'``; binary units, as memory tools report them."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _dtype_name(dtype: Any) -> str:
    """A dtype's canonical name ('float32', 'bfloat16', ...) from a string, tf.DType, numpy dtype, ..."""
    import tensorflow as tf

    if isinstance(dtype, str):
        return tf.as_dtype(dtype).name
    return tf.as_dtype(getattr(dtype, "name", dtype)).name


def _itemsize(dtype: Any) -> int:
    import tensorflow as tf

    return tf.as_dtype(_dtype_name(dtype)).size


def _numel(shape: Any) -> int:
    n = 1
    for d in tuple(shape):
        if d is None:
            raise ValueError(f"shape {tuple(shape)} has an unknown dimension; build the model with keras.Input first")
        n *= int(d)
    return n


def _is_float(dtype_name: str) -> bool:
    return dtype_name.startswith(("float", "bfloat"))


# ----------------------------------------------------------------------------------------------
# Variable bytes
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class VariableBytes:
    """Bytes of a set of variables: ``total`` and ``by_dtype`` (``{"float32": 4004000}``)."""

    total: int
    by_dtype: dict[str, int]
    count: int = 0  # number of variables counted

    def __str__(self) -> str:
        parts = ", ".join(f"{k}: {v:,} B" for k, v in sorted(self.by_dtype.items()))
        return f"{self.total:,} bytes ({format_bytes(self.total)}) in {self.count} variables [{parts}]"


def _variables_of(model_or_variables: Any) -> list:
    obj = model_or_variables
    if hasattr(obj, "weights") and not isinstance(obj, (list, tuple)):
        variables = list(obj.weights)  # trainable + non-trainable (e.g. BatchNorm moving statistics)
    elif hasattr(obj, "variables") and not isinstance(obj, (list, tuple)):
        variables = list(obj.variables)  # e.g. a tf.Module or an optimizer
    elif hasattr(obj, "dtype") and hasattr(obj, "shape"):
        variables = [obj]
    else:
        variables = list(obj)
    seen, unique = set(), []
    for v in variables:  # a shared variable counts once
        if id(v) not in seen:
            seen.add(id(v))
            unique.append(v)
    return unique


def variable_bytes(model_or_variables: Any) -> VariableBytes:
    """Exact bytes of a model's (or layer's, optimizer's, list's) variables, split by dtype.

    ``Dense(1000)`` on 1000 inputs with a bias: 1,001,000 numbers → 4,004,000 B in float32,
    2,002,000 B in bfloat16. Counts every variable (trainable and not) once.
    """
    by_dtype: dict[str, int] = {}
    variables = _variables_of(model_or_variables)
    for v in variables:
        name = _dtype_name(v.dtype)
        by_dtype[name] = by_dtype.get(name, 0) + _numel(v.shape) * _itemsize(name)
    return VariableBytes(total=sum(by_dtype.values()), by_dtype=by_dtype, count=len(variables))


# ----------------------------------------------------------------------------------------------
# Training-memory estimate
# ----------------------------------------------------------------------------------------------

# Per trainable variable, how many same-shaped slot variables the optimizer keeps.
_SLOTS_BY_NAME = {
    "sgd": 0,
    "sgd_momentum": 1,
    "adam": 2,
    "adamw": 2,
    "adagrad": 1,
    "rmsprop": 1,
    "nadam": 2,
    "adamax": 2,
    "lion": 1,
}
# Besides its slots, every Keras 3 optimizer keeps an int64 iteration counter and a float32 learning rate.
_OPTIMIZER_SCALAR_BYTES = 8 + 4


def optimizer_slots_per_variable(optimizer: Any) -> int:
    """Slot variables per trainable variable: "sgd" 0, "sgd_momentum" 1, "adam" 2 (3 with amsgrad), ...

    Accepts a name or a Keras optimizer instance (SGD, Adam, AdamW, Adamax, Nadam, RMSprop, Adagrad, Lion;
    a LossScaleOptimizer counts its inner optimizer).
    """
    if isinstance(optimizer, str):
        key = optimizer.lower().replace("-", "_")
        if key not in _SLOTS_BY_NAME:
            raise ValueError(
                f"unknown optimizer {optimizer!r}; use one of {sorted(_SLOTS_BY_NAME)} or a keras optimizer"
            )
        return _SLOTS_BY_NAME[key]
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None:
        return optimizer_slots_per_variable(inner)
    kind = type(optimizer).__name__.lower()
    config = optimizer.get_config() if hasattr(optimizer, "get_config") else {}
    if kind == "sgd":
        return 1 if float(config.get("momentum", 0.0) or 0.0) > 0 else 0
    if kind in ("adam", "adamw"):
        return 3 if config.get("amsgrad") else 2
    if kind == "rmsprop":
        return 1 + (float(config.get("momentum", 0.0) or 0.0) > 0) + bool(config.get("centered"))
    if kind in _SLOTS_BY_NAME:
        return _SLOTS_BY_NAME[kind]
    raise ValueError(
        f"no slot count known for {type(optimizer).__name__}; pass one of {sorted(_SLOTS_BY_NAME)} "
        "or build the optimizer and use variable_bytes(optimizer.variables)"
    )


def _optimizer_label(optimizer: Any) -> str:
    return optimizer if isinstance(optimizer, str) else type(optimizer).__name__


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of training state for one model, batch size, optimizer and dtype policy.

    ``parameters``, ``gradients`` and ``optimizer_slots`` are exact counts for the optimizers this
    module knows; ``activations`` is an estimate (every top-level layer's output for the batch, in its
    compute dtype, as kept for the backward pass; real kernels keep somewhat more or less).
    """

    parameters: int
    gradients: int
    optimizer_slots: int
    activations: int
    batch_size: int
    optimizer: str
    policy: str
    variable_dtype: str
    compute_dtype: str

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_slots + self.activations

    def rows(self) -> list[dict]:
        def row(part, n, what):
            return {"part": part, "bytes": f"{n:,}", "size": format_bytes(n), "counts": what}

        return [
            row("parameters", self.parameters, f"all variables, float ones in {self.variable_dtype}"),
            row("gradients", self.gradients, f"one per trainable variable, {self.variable_dtype}"),
            row("optimizer slots", self.optimizer_slots, f"{self.optimizer} state + step counter and learning rate"),
            row(
                "activations (est.)",
                self.activations,
                f"layer outputs for batch {self.batch_size}, {self.compute_dtype}",
            ),
            row("total", self.total, f"policy {self.policy}"),
        ]

    def table(self):
        return Table(self.rows(), columns=("part", "bytes", "size", "counts"))

    def _repr_markdown_(self) -> str:
        return self.table()._repr_markdown_()

    def __str__(self) -> str:
        return str(self.table())

    __repr__ = __str__


def _policy(policy: Any):
    import keras

    if policy is None:
        return None
    if isinstance(policy, str):
        return keras.dtype_policies.get(policy)
    return policy


def _layer_output_elements(layer) -> int:
    """Elements per example in a layer's output(s) (batch dimension dropped)."""
    import tensorflow as tf

    try:
        output = layer.output
    except (AttributeError, ValueError, RuntimeError):
        return 0
    total = 0
    for t in tf.nest.flatten(output):
        total += _numel(tuple(t.shape)[1:])
    return total


def _leaf_layers(model) -> list:
    """The model's layers, with a nested functional or Sequential model replaced by its own layers (recursively)."""
    import keras

    out = []
    for layer in model.layers:
        if type(layer).__name__ == "InputLayer":
            continue
        if isinstance(layer, keras.Model) and getattr(layer, "layers", None):
            out += _leaf_layers(layer)
        else:
            out.append(layer)
    return out


def estimate_training_memory(
    model: Any, batch_size: int, optimizer: Any = "adam", policy: Any = None
) -> MemoryEstimate:
    """Estimate the memory one training step needs, split into parameters, gradients, optimizer slots, activations.

    ``model``: a built Keras model (``keras.Input`` first). ``policy``: ``None`` counts the model as it
    is; a policy name (``"float32"``, ``"bfloat16"``, ``"mixed_bfloat16"``, ``"mixed_float16"``) counts it
    as if rebuilt under that policy: floating-point variables in the policy's *variable* dtype (float32
    for both mixed policies, so parameter bytes do NOT halve under mixed precision), activations in
    its *compute* dtype. Layers built with a ``dtype=`` different from the global policy at call time
    keep theirs; a layer whose dtype equals it is assumed to follow it (so a ``dtype="float32"``
    softmax in a float32-built model is counted as switching). For exact per-layer dtypes, build the
    model under the policy and pass ``policy=None``.
    """
    import keras

    if int(batch_size) < 1:
        raise ValueError("batch_size must be at least 1")
    batch_size = int(batch_size)
    target = _policy(policy)
    default = keras.config.dtype_policy()

    def var_dtype(v) -> str:
        name = _dtype_name(v.dtype)
        if target is None or not _is_float(name) or name != _dtype_name(default.variable_dtype):
            return name
        return _dtype_name(target.variable_dtype)

    def compute_dtype(layer) -> str:
        own = _dtype_name(layer.compute_dtype)
        if target is None or getattr(layer.dtype_policy, "name", None) != default.name:
            return own
        return _dtype_name(target.compute_dtype)

    variables = _variables_of(model)
    trainable_ids = {id(v) for v in model.trainable_weights}
    parameters = sum(_numel(v.shape) * _itemsize(var_dtype(v)) for v in variables)
    trainable_bytes = sum(_numel(v.shape) * _itemsize(var_dtype(v)) for v in variables if id(v) in trainable_ids)
    slots = optimizer_slots_per_variable(optimizer)

    # Activations: the input batch plus each top-level layer's output (kept for the backward pass).
    activations = 0
    for inp in getattr(model, "inputs", None) or []:
        activations += _numel(tuple(inp.shape)[1:]) * batch_size * _itemsize(inp.dtype)
    for layer in _leaf_layers(model):
        activations += _layer_output_elements(layer) * batch_size * _itemsize(compute_dtype(layer))

    if target is None:  # describe the model as built, not the global policy
        built = [l for l in model.layers if type(l).__name__ != "InputLayer"]
        names = sorted(
            {l.dtype_policy.name for l in built}, key=lambda n: -sum(l.dtype_policy.name == n for l in built)
        )
        label = "/".join(names) + " (as built)" if names else f"{default.name} (as built)"
        var_label = "/".join(sorted({var_dtype(v) for v in variables if _is_float(var_dtype(v))})) or "float32"
        compute_label = "/".join(sorted({compute_dtype(l) for l in built})) or _dtype_name(default.compute_dtype)
    else:
        label = target.name
        var_label, compute_label = _dtype_name(target.variable_dtype), _dtype_name(target.compute_dtype)
    return MemoryEstimate(
        parameters=parameters,
        gradients=trainable_bytes,
        optimizer_slots=slots * trainable_bytes + _OPTIMIZER_SCALAR_BYTES,
        activations=activations,
        batch_size=batch_size,
        optimizer=_optimizer_label(optimizer),
        policy=label,
        variable_dtype=var_label,
        compute_dtype=compute_label,
    )


# ----------------------------------------------------------------------------------------------
# Measured peak memory
# ----------------------------------------------------------------------------------------------

MEMORY_INFO = "tf.config.experimental.get_memory_info"


@dataclasses.dataclass
class PeakMemory:
    """A measured peak: ``peak_bytes`` on ``device``, measured by ``method``; ``result`` is what fn returned.

    ``samples``: every repeat's peak in bytes when the peak was measured more than once
    (:func:`measure_peaks_isolated`; ``peak_bytes`` is then their median), else empty."""

    peak_bytes: int
    method: str
    device: str
    result: Any = dataclasses.field(default=None, repr=False)
    samples: list = dataclasses.field(default_factory=list, repr=False)

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / MIB

    def __str__(self) -> str:
        return f"peak {self.peak_bytes / MIB:.1f} MiB on {self.device} ({self.method})"

    def __repr__(self) -> str:
        return f"PeakMemory({self})"


def default_device() -> str:
    """The accelerator a measurement here is about: 'TPU:0', else 'GPU:0', else 'CPU:0'. TensorFlow places ops on a
    GPU by default, on a TPU only when told (``tf.device`` or TPUStrategy): a step measured on a TPU must be placed.
    Under a stand-in (:mod:`course_utils.standin`) the device that stands in for it: the TPU's first core ('CPU:1'),
    the GPU's ('CPU:0')."""
    import tensorflow as tf

    from . import standin

    if standin.active() == "tpu":
        return "CPU:1"
    for kind in ("TPU", "GPU"):
        if tf.config.list_logical_devices(kind):
            return f"{kind}:0"
    return "CPU:0"


def in_process() -> bool:
    """Whether this process's measurements are made here rather than in fresh processes: on a TPU or GPU, which
    belongs to the process that uses it (and its stand-ins); not on a CPU, where a fresh process gives each step a
    clean allocator (:func:`measure_isolated`)."""
    from . import standin

    return bool(standin.active()) or default_device() != "CPU:0"


def _short_device(device: Any) -> str:
    """'/job:localhost/replica:0/task:0/device:TPU:0' or a strategy → 'TPU:0'."""
    if hasattr(device, "extended"):  # a tf.distribute strategy: its first replica's device
        device = device.extended.worker_devices[0]
    text = str(device)
    if "device:" in text:
        text = text.split("device:")[-1]
    text = text.lstrip("/").upper()
    if text.count(":") == 0:
        text += ":0"
    return text


def _block_all(result: Any) -> None:
    import tensorflow as tf

    for t in tf.nest.flatten(result):
        if hasattr(t, "numpy"):
            t.numpy()


class _RssSampler:
    """Samples this process's resident memory in a thread; ``peak`` is the highest value seen."""

    def __init__(self, interval_s: float = 0.001):
        import psutil

        self._process = psutil.Process()
        self._interval = interval_s
        self.start_rss = self._process.memory_info().rss
        self.peak = self.start_rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            time.sleep(self._interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.peak = max(self.peak, self._process.memory_info().rss)
        self._stop.set()
        self._thread.join()
        return False


def maxrss_bytes() -> int | None:
    try:
        import resource
        import sys

        scale = 1 if sys.platform == "darwin" else 1024  # Linux reports KiB, macOS bytes
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    except Exception:  # Windows has no `resource`
        return None


def measure_peak(fn: Callable[..., Any], *args: Any, device: Any = None, **kwargs: Any) -> PeakMemory:
    """Run ``fn(*args, **kwargs)`` once, wait for its result, and return the peak memory it needed.

    ``device``: ``"CPU:0"``, ``"GPU:0"``, ``"TPU:0"``, a full device name, or a strategy (its first
    replica's device); default: the device TensorFlow uses by default here. Method 1: reset the
    allocator's statistics, run, read ``tf.config.experimental.get_memory_info(device)["peak"]``
    (TPU, GPU, and a CPU with ``TF_CPU_ALLOCATOR_USE_BFC=true``, set by importing course_utils). Method 2
    (when the allocator does not report): the growth of the process's resident memory during the call,
    sampled every millisecond (psutil; or ``resource.getrusage`` peak RSS). Run ``fn`` once beforehand if you want tracing excluded; wrap it in
    ``tf.function`` (eager mode keeps extra tensors alive).
    """
    import tensorflow as tf

    dev = _short_device(device) if device is not None else default_device()
    supported = True
    try:
        tf.config.experimental.reset_memory_stats(dev)
        tf.config.experimental.get_memory_info(dev)
    except (ValueError, RuntimeError, tf.errors.OpError):
        supported = False

    maxrss_before = maxrss_bytes()
    try:
        sampler = _RssSampler()
    except Exception:  # psutil missing
        sampler = None
    if sampler is not None:
        with sampler:
            result = fn(*args, **kwargs)
            _block_all(result)
    else:
        result = fn(*args, **kwargs)
        _block_all(result)

    if supported:
        info = tf.config.experimental.get_memory_info(dev)
        if info.get("peak", 0) > 0:
            return PeakMemory(int(info["peak"]), MEMORY_INFO, dev, result)
    reason = "allocator reports no statistics" if not supported else "allocator reported 0"
    if sampler is not None:
        peak = max(0, sampler.peak - sampler.start_rss)
        method = f"process peak RSS growth, psutil sampling ({reason})"
    else:
        after = maxrss_bytes()
        peak = max(0, (after or 0) - (maxrss_before or 0))
        method = f"process peak RSS growth, resource.getrusage ({reason}; 0 if below an earlier peak)"
    return PeakMemory(int(peak), method, f"process (asked for {dev})", result)


# ----------------------------------------------------------------------------------------------
# Peak memory of a step in isolation
# ----------------------------------------------------------------------------------------------

# Why a fresh process: on a CPU (and a GPU) TensorFlow's BFC allocator keeps every block it ever got and
# counts whole chunks as "in use". A request that needs more than half of a free chunk gets all of it,
# and new regions grow in powers of two, so a step's peak depends on which chunks earlier work left
# behind (measured: the same bfloat16 forward pass reads 20 or 36 MiB depending on what ran before;
# keras.backend.clear_session() frees none of those chunks). A fresh process first reserves one large
# block and frees it (uninitialised: it costs only the allocator's bookkeeping, ~3% of its size in RAM),
# so the step's tensors are cut from that block at their own sizes: the figure is the step's own, and
# the same on every run.
RESERVE_MIB = 1024


def _reserve_block(mib: int, device: str = "CPU:0") -> None:
    """Allocate ``mib`` MiB through TensorFlow's allocator without touching it, and free it at once."""
    import tensorflow as tf

    if mib > 0:
        with tf.device(device):
            block = tf.raw_ops.Empty(shape=[int(mib) * MIB], dtype=tf.uint8, init=False)
        del block


def _as_steps(built: Any) -> dict:
    """What a ``make_step`` returned, as ``{key: step}`` (one step: key "")."""
    return {str(k): v for k, v in (built if isinstance(built, Mapping) else {"": built}).items()}


def _build_and_measure(
    module: str, name: str, kwargs: dict, repeats: int, reserve_mib: int, device: str
) -> tuple[dict, dict]:
    """In the fresh process: reserve, build the step(s), warm each up, measure each ``repeats`` times.

    Everything runs on ``device``, the one whose peak is read: on a TPU nothing runs there unless placed (an unplaced
    XLA step would even be compiled for the host: :mod:`course_utils.standin`).

    Returns ``({key: {"samples", "method", "device"}}, {key: step})``."""
    import importlib

    import tensorflow as tf

    _reserve_block(reserve_mib, device)
    with tf.device(device):
        built = getattr(importlib.import_module(module), name)(**kwargs)
        steps = _as_steps(built)
        out = {}
        for key, step in steps.items():
            _block_all(step())  # warm-up: tracing and compiling are not part of the step's peak
            samples = []
            for _ in range(repeats):
                peak = measure_peak(step, device=device)
                peak.result = None  # do not keep one repeat's output alive during the next
                samples.append(peak.peak_bytes)
            out[key] = {"samples": samples, "method": peak.method, "device": peak.device}
    return out, steps


def _median_peak(samples: list, method: str, device: str) -> PeakMemory:
    import statistics

    return PeakMemory(int(statistics.median(samples)), method, device, None, list(samples))


def _error_line(label: Any) -> str:
    """``{"label", "error"}`` with the last lines of the exception being handled."""
    import traceback

    tail = "\n".join(traceback.format_exc().strip().splitlines()[-5:])
    return json.dumps({"label": label, "error": tail[-4000:]})


def _interleaved_ratios(
    seconds_of: Callable[[str, str], float], labels: list, keys: list, base: str, rounds: int
) -> tuple[dict[str, list], dict[str, list]]:
    """Rounds of (baseline, variant) timings, adjacent in time: ``{label + key: [variant ÷ baseline per round]}``
    and ``{key: [the baseline's seconds, every time]}``. ``seconds_of(label, key)`` times one step."""
    ratios: dict[str, list] = {label + key: [] for key in keys for label in labels}
    base_seconds: dict[str, list] = {key: [] for key in keys}
    for _ in range(rounds):
        for key in keys:
            for label in labels:
                t_base = seconds_of(base, key)
                ratios[label + key].append(seconds_of(label, key) / t_base)
                base_seconds[key].append(t_base)
    return ratios, base_seconds


def _measure_jobs(
    module: str,
    name: str,
    jobs: list,
    repeats: int,
    reserve_mib: int,
    device: str,
    parallel: int,
    fork: bool,
    timing: dict | None = None,
) -> None:
    """The child program of :func:`measure_isolated`: prints one JSON line per job (and one for the timings).

    Without ``fork``: the one job runs in this process. With ``fork`` (Linux): this process imports
    TensorFlow and the step's module once, runs no TensorFlow op, and forks one child per job (up to
    ``parallel`` building at a time). A forked child is a fresh process in every way that matters here:
    its allocator is new (the parent never made one) and nothing ran before its step; it only skips the
    seconds that ``import tensorflow`` takes. With ``timing`` (``{"rounds", "repeats", "base", "labels"}``)
    the children stay alive after measuring and time their steps one process at a time, in interleaved
    rounds (the others wait, idle), so each step is traced and compiled once for both measurements.
    """
    import importlib

    if not fork:
        ((label, kwargs),) = jobs
        try:
            print(
                "\n"
                + json.dumps(
                    {
                        "label": label,
                        "result": _build_and_measure(module, name, kwargs, repeats, reserve_mib, device)[0],
                    }
                ),
                flush=True,
            )
        except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
            print("\n" + _error_line(label), flush=True)
        return
    import tensorflow  # noqa: F401 - what every child would import: once, here

    importlib.import_module(module)
    if processes.tensorflow_has_run_an_op():  # a module ran an op at import: threads exist now
        raise RuntimeError(f"importing {module} ran a TensorFlow op; its children could not start clean")

    children: dict[str, tuple[int, Any, Any]] = {}  # label -> (pid, command pipe, reply pipe)

    def start(label: str, kwargs: dict) -> None:
        cmd_r, cmd_w = os.pipe()
        reply_r, reply_w = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child: ends here, whatever happens (never returns into the parent's code)
            try:
                from .processes import die_with_parent

                die_with_parent(parent)  # the forking process killed (its parent died): this one goes too
                os.close(cmd_w)
                os.close(reply_r)
                for _, cmd, reply in children.values():  # the other children's pipes are not this one's
                    cmd.close()
                    reply.close()
                reply = os.fdopen(reply_w, "w")
                try:
                    out, steps = _build_and_measure(module, name, kwargs, repeats, reserve_mib, device)
                    reply.write(json.dumps({"label": label, "result": out}) + "\n")
                    reply.flush()
                    if timing:
                        for command in os.fdopen(cmd_r):  # "key": time that step; end of file: done
                            t = time_fn(steps[command.rstrip("\n")], repeats=timing["repeats"], warmup=1).median_s
                            reply.write(json.dumps(t) + "\n")
                            reply.flush()
                except BaseException:  # noqa: BLE001
                    reply.write(_error_line(label) + "\n")  # raises if the parent stopped listening
                    reply.flush()
            finally:
                os._exit(0)  # also skips TensorFlow's teardown (seconds)
        os.close(cmd_r)
        os.close(reply_w)
        children[label] = (pid, os.fdopen(cmd_w, "w"), os.fdopen(reply_r))

    def answer(label: str) -> Any:
        line = children[label][2].readline()
        if not line:  # killed (e.g. out of memory) before it could answer
            raise RuntimeError(f"the process measuring {label!r} ended without a result")
        reply = json.loads(line)
        if isinstance(reply, dict) and "error" in reply:
            raise RuntimeError(reply["error"])
        return reply

    def finish(label: str) -> None:
        pid, cmd, reply = children.pop(label)
        cmd.close()  # end of file: the child exits
        reply.close()
        os.waitpid(pid, 0)

    current = None
    keys_of: dict[str, list] = {}  # label -> the keys of its steps
    try:
        building: list[str] = []
        pending = list(jobs)
        while pending or building:
            while pending and len(building) < max(1, int(parallel)):
                label, kwargs = pending.pop(0)
                start(label, kwargs)
                building.append(label)
            current = building.pop(0)
            reply = answer(current)
            keys_of[current] = list(reply["result"])
            print("\n" + json.dumps(reply), flush=True)
            if not timing:
                finish(current)
        if timing:

            def seconds_of(label: str, key: str) -> float:
                nonlocal current
                current = label
                children[label][1].write(key + "\n")
                children[label][1].flush()
                return float(answer(label))

            keys = keys_of[timing["base"]]
            ratios, base_seconds = _interleaved_ratios(
                seconds_of, timing["labels"], keys, timing["base"], timing["rounds"]
            )
            print("\n" + json.dumps({"timing": {"ratios": ratios, "base_seconds": base_seconds}}), flush=True)
    except Exception as e:  # noqa: BLE001
        print("\n" + json.dumps({"label": current, "error": str(e)}), flush=True)
    finally:
        for label in list(children):
            finish(label)


_DONE = '{"done": true}'
_LAST = '{"done": true, "exiting": true}'  # the forking process exits after this answer


def _serve() -> None:
    """The forking process (Linux): import TensorFlow once, then run each request read from stdin with
    :func:`_measure_jobs` (``fork=True``) and end its answer with a ``{"done": true}`` line. It never runs a
    TensorFlow op itself, so every child it forks starts clean; it exits when its stdin closes."""
    import tensorflow  # noqa: F401 - once, for every child

    for line in sys.stdin:
        try:
            _measure_jobs(*json.loads(line))
        except BaseException:  # noqa: BLE001 - answered, then the next request
            print("\n" + _error_line(None), flush=True)
        if processes.tensorflow_has_run_an_op():  # a module ran an op at import: not clean any more
            print("\n" + _LAST, flush=True)
            break
        print("\n" + _DONE, flush=True)


class _Forker:
    """This process's handle on its forking process (started on first use, kept for the next measurements)."""

    def __init__(self, env: dict):
        import tempfile

        self.env = env
        self.stderr = tempfile.TemporaryFile()
        # it dies with this process, however that ends (a timeout's SIGKILL, Ctrl-C, os._exit: no atexit runs):
        # the kernel's parent-death signal (Linux), armed before TensorFlow's import (seconds)
        code = (
            "from course_utils import memory, processes\n"
            f"processes.die_with_parent({os.getpid()})\n"
            "memory._serve()\n"
            "import os; os._exit(0)  # skip TensorFlow's teardown\n"
        )
        self.proc = processes.start(
            [sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr
        )
        self.buffer = b""
        self.exiting = False

    def alive(self, env: dict) -> bool:
        return not self.exiting and self.proc.poll() is None and env == self.env

    def request(self, args: list, deadline: float) -> list[str]:
        """Send one request; the lines of its answer. TimeoutError / EOFError when it hangs / dies."""
        import select

        try:
            self.proc.stdin.write((json.dumps(args) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise EOFError from None
        fd = self.proc.stdout.fileno()
        lines = []
        while True:
            while b"\n" not in self.buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                    raise TimeoutError
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise EOFError
                self.buffer += chunk
            line, self.buffer = self.buffer.split(b"\n", 1)
            text = line.decode()
            if text in (_DONE, _LAST):
                self.exiting = text == _LAST
                return lines
            lines.append(text)

    def stderr_tail(self, n: int = 5) -> str:
        self.stderr.seek(0, os.SEEK_END)
        self.stderr.seek(max(0, self.stderr.tell() - 8192))
        return processes.tail(self.stderr.read(), n)

    def stop(self) -> None:
        processes.kill_group(self.proc, signal.SIGKILL)  # it and whatever it forked
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.stderr):
            f.close()


_forker: _Forker | None = None
_forker_lock = threading.Lock()
atexit.register(lambda: _forker is not None and _forker.stop())


def _stop_forker() -> None:
    global _forker
    if _forker is not None:
        _forker.stop()
        _forker = None


def stop_measuring_process() -> bool:
    """Stop the process :func:`measure_isolated` keeps for forking (it holds TensorFlow's libraries in memory,
    a few hundred MiB). It also stops when this process exits. True if one was running."""
    with _forker_lock:
        running = _forker is not None
        _stop_forker()
    return running


@dataclasses.dataclass
class IsolatedMeasurements:
    """What :func:`measure_isolated` measured.

    ``peaks``: ``{label (+ key): PeakMemory}``. ``time_ratios``: ``{label (+ key): Samples}`` — the step's
    time ÷ the baseline's (same key), one value per round; empty when timing was not asked for.
    ``baseline_seconds``: ``{key: [seconds of every baseline timing]}``. ``timed``: where the steps were timed."""

    peaks: dict
    time_ratios: dict
    baseline_seconds: dict
    timed: str = ""


def measure_isolated(
    make_step: Callable[..., Callable[[], Any]],
    variants: Mapping[str, Mapping[str, Any]],
    repeats: int = 3,
    reserve_mib: int = RESERVE_MIB,
    parallel: int = 4,
    fresh_process: bool | None = None,
    timeout: float = 300,
    fork: bool | None = None,
    time_rounds: int = 0,
    time_repeats: int = 3,
    time_baseline: str | None = None,
    time_labels: list | None = None,
) -> IsolatedMeasurements:
    """Peak memory (and, if asked, step time) of one step per variant, each in its own fresh Python process.

    ``make_step``: a module-level function; ``make_step(**variants[label])`` builds whatever the step
    needs (a model under a policy, its inputs) and returns a zero-argument callable — the step, e.g. a
    ``tf.function`` — that returns tensors. Each process reserves ``reserve_mib`` MiB in TensorFlow's
    allocator and frees it (see above), builds the step, calls it once (tracing/compiling excluded),
    then measures it ``repeats`` times with :func:`measure_peak`; ``peak_bytes`` is the median and
    ``samples`` every repeat. Up to ``parallel`` processes build and measure at once.

    ``make_step`` may instead return a dict ``{key: step}`` of steps that share what it built (e.g. one
    model's step compiled without and with XLA): each is warmed up and measured in turn in the same
    process, labelled ``label + key``. Only the step differs, so the second sees the same weights and
    allocator as the first (measured: the same peaks as in separate processes within 0.2%, in either order).

    ``time_rounds`` > 0: also each step's time ÷ the ``time_baseline`` variant's step time (same key),
    for ``time_labels`` (default: every other variant), in ``time_rounds`` interleaved rounds — in each,
    the baseline is timed right before every step (``time_repeats`` calls after one warm-up; median).
    With ``fork``, the processes that measured the peaks time their own steps, one process at a time
    while the others wait; otherwise the steps are built again and timed in this process.

    ``fork``: ``None`` (default) = on Linux, one process imports TensorFlow once and forks the fresh
    processes from itself before running anything (each then starts in well under a second instead of
    the seconds ``import tensorflow`` takes; measured: the same peaks as processes started from
    scratch); elsewhere, each process starts from scratch. ``timeout``: seconds per variant.

    ``fresh_process``: ``None`` (default) = a fresh process when this process computes on the CPU; on
    a TPU or GPU (which belongs to this process) the steps are measured here, first to last and again last to
    first, with each variant's readings pooled (no variant always runs first), and the method says so
    (:func:`in_process`). In fresh processes ``kwargs`` values must be JSON-able (here, a strategy object may be
    passed); ``make_step``'s module must not run TensorFlow ops when it is imported.
    """
    import importlib

    if not callable(make_step) or "<" in getattr(make_step, "__qualname__", "<"):
        raise TypeError(f"make_step must be a module-level function, got {make_step!r}")
    module, name = make_step.__module__, make_step.__qualname__
    if getattr(importlib.import_module(module), name, None) is not make_step:
        raise TypeError(f"{module}.{name} is not importable in a fresh process")
    if int(repeats) < 1:
        raise ValueError("repeats must be at least 1")
    variants = {str(k): dict(v) for k, v in variants.items()}
    timing = None
    if int(time_rounds) > 0:
        if time_baseline not in variants:
            raise ValueError(f"time_baseline must be one of the variants {list(variants)}, got {time_baseline!r}")
        labels = [str(x) for x in (time_labels if time_labels is not None else variants) if str(x) != time_baseline]
        unknown = [x for x in labels if x not in variants]
        if unknown:
            raise ValueError(f"time_labels names no variant: {unknown}")
        if int(time_repeats) < 1:
            raise ValueError("time_repeats must be at least 1")
        timing = {"rounds": int(time_rounds), "repeats": int(time_repeats), "base": time_baseline, "labels": labels}
    device = default_device()
    if fresh_process is None:
        fresh_process = not in_process()
    if fresh_process:  # the variants travel to the fresh processes as JSON; in this process any object will do
        try:
            json.dumps(variants)
        except (TypeError, ValueError) as e:
            raise TypeError(
                "the variants' arguments must be JSON-able (numbers, strings, lists, dicts) to reach a "
                f"fresh process: {e}"
            ) from None
    if fork is None:
        fork = sys.platform.startswith("linux") and hasattr(os, "fork")

    def time_here(peaks: dict) -> IsolatedMeasurements:
        """Build the timed steps again in this process (after the peaks: no model stays alive while a peak is
        measured) and time them in interleaved rounds."""
        if timing is None:
            return IsolatedMeasurements(peaks, {}, {})
        import tensorflow as tf

        steps = {}
        with tf.device(device):  # on the device measured, as the peaks were (_build_and_measure)
            for label in [timing["base"], *timing["labels"]]:
                built = make_step(**variants[label])
                steps[label] = _as_steps(built)
                for step in steps[label].values():
                    _block_all(step())  # tracing and compiling are not part of a step's time
            ratios, base_seconds = _interleaved_ratios(
                lambda label, key: time_fn(steps[label][key], repeats=timing["repeats"], warmup=1).median_s,
                timing["labels"],
                list(steps[timing["base"]]),
                timing["base"],
                timing["rounds"],
            )
        return IsolatedMeasurements(
            peaks, {k: Samples(v) for k, v in ratios.items()}, base_seconds, "in this process, steps built again"
        )

    if not fresh_process:
        return time_here(_measure_here_both_orders(module, name, variants, int(repeats), device))

    parallel = max(1, int(parallel))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="3")
    # An explicit inter-op pool: on one core (taskset -c 0) TensorFlow's default made the executor's op order differ
    # between processes, and lesson 07's recomputed step peaked at 4-11% below plain's in 3 of 5 processes and 35-40%
    # in the others; with the pool set (1 or 2 threads), 20-41% in all 15 readings, as on two cores.
    env.setdefault("TF_NUM_INTEROP_THREADS", str(processes.interop_threads()))
    env["PYTHONPATH"] = os.pathsep.join(p for p in [*sys.path, env.get("PYTHONPATH", "")] if p and os.path.isdir(p))
    results: dict[str, dict] = {}
    timed: dict = {}

    def read(lines: list[str], labels: list[str], stderr_tail: Callable[[], str], code: Any) -> None:
        for line in lines:
            if line.startswith("{"):
                reply = json.loads(line)
                if "error" in reply:
                    which = reply["label"] if reply["label"] is not None else ", ".join(labels)
                    raise RuntimeError(f"measuring {which!r} in a fresh process failed:\n{reply['error']}")
                if "timing" in reply:
                    timed.update(reply["timing"])
                else:
                    results[reply["label"]] = reply["result"]
        missing = [label for label in labels if label not in results]
        if missing:
            raise RuntimeError(f"measuring {missing[0]!r} in a fresh process failed (exit {code}):\n{stderr_tail()}")

    def too_long(labels: list[str]) -> RuntimeError:
        which = labels[0] if len(labels) == 1 else ", ".join(labels)
        return RuntimeError(f"measuring {which!r} in a fresh process took longer than {timeout} s per variant")

    labels = list(variants)
    if fork:
        global _forker
        waves = -(-len(labels) // parallel) + (1 if timing else 0)
        args = [module, name, list(variants.items()), int(repeats), int(reserve_mib), "CPU:0", parallel, True, timing]
        with _forker_lock:
            if _forker is not None and not _forker.alive(env):
                _stop_forker()
            if _forker is None:
                _forker = _Forker(env)
            try:
                lines = _forker.request(args, time.monotonic() + timeout * waves)
            except TimeoutError:
                _stop_forker()
                raise too_long(labels) from None
            except EOFError:
                tail, code = _forker.stderr_tail(), _forker.proc.poll()
                _stop_forker()
                raise RuntimeError(f"the measuring process ended (exit {code}):\n{tail}") from None
            except BaseException:  # e.g. KeyboardInterrupt: its answer would be out of step with the next request
                _stop_forker()
                raise
            read(lines, labels, _forker.stderr_tail, "see above")
        where = "forked from a process that only imported TensorFlow"
    else:
        code = (
            "import json, sys\n"
            "from course_utils import memory\n"
            "memory._measure_jobs(*json.loads(sys.argv[1]))\n"
            "import os; os._exit(0)  # skip TensorFlow's teardown (seconds): the results are out\n"
        )
        pending = list(variants.items())
        running: list[tuple[str, subprocess.Popen, float]] = []

        def stop(proc: subprocess.Popen) -> None:
            processes.kill_group(proc, signal.SIGKILL)  # it and whatever it started
            proc.communicate()

        try:
            while pending or running:
                while pending and len(running) < parallel:
                    label, kwargs = pending.pop(0)
                    args = json.dumps(
                        [module, name, [[label, kwargs]], int(repeats), int(reserve_mib), "CPU:0", 1, False, None]
                    )
                    running.append(
                        (
                            label,
                            processes.start(
                                [sys.executable, "-c", code, args],
                                env=env,
                                text=True,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE,
                            ),
                            time.monotonic() + timeout,
                        )
                    )
                label, proc, deadline = running.pop(0)
                try:
                    stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    stop(proc)
                    raise too_long([label]) from None
                read(stdout.splitlines(), [label], lambda: processes.tail(stderr), proc.returncode)
        finally:
            for _, proc, _ in running:  # after an error: stop the processes still running
                stop(proc)
        where = "started from scratch"
    reserved = f", {reserve_mib} MiB reserved first" if reserve_mib > 0 else ""
    peaks = {
        label + key: _median_peak(r["samples"], f"{r['method']}, in a fresh process ({where}{reserved})", r["device"])
        for label in variants
        for key, r in results[label].items()
    }
    if timing is None:
        return IsolatedMeasurements(peaks, {}, {})
    if not fork:
        return time_here(peaks)
    return IsolatedMeasurements(
        peaks,
        {k: Samples(v) for k, v in timed["ratios"].items()},
        timed["base_seconds"],
        "in the measuring processes, one at a time",
    )


def _measure_here_both_orders(module: str, name: str, variants: dict, repeats: int, device: str) -> dict:
    """:func:`measure_isolated` in this process (a TPU or GPU belongs to it). In one process a step's figure depends
    on what ran before it (the allocator keeps the blocks earlier work freed), so a fixed order would favour one
    variant: the first runs on a clean allocator, the last after every other. Several variants are therefore measured
    first to last, then last to first, and each one's readings pooled: ``samples`` holds the first pass's
    ``repeats`` readings, then the second's (reading i of two variants comes from the same pass); the method names
    both passes' medians."""
    import gc

    labels = list(variants)
    passes = [labels, labels[::-1]] if len(labels) > 1 else [labels]
    readings: dict[tuple, list] = {}
    for order in passes:
        for label in order:
            measured = _build_and_measure(module, name, variants[label], repeats, 0, device)[0]
            gc.collect()  # a tf.function and its model form reference cycles: free them before the next variant
            for key, r in measured.items():
                readings.setdefault((label, key), []).append(r)
    out = {}
    for label, key in sorted(readings, key=lambda lk: labels.index(lk[0])):  # the order asked for
        runs = readings[label, key]
        samples = [v for r in runs for v in r["samples"]]
        if len(runs) > 1:
            first, second = (statistics.median(r["samples"]) / MIB for r in runs)
            where = (
                f", in this process, in both orders (first to last: {first:.1f} MiB; last to first: "
                f"{second:.1f} MiB; pooled): what ran before can change the figure"
            )
        else:
            where = ", in this process (after what ran before it: the figure can depend on that)"
        out[label + key] = _median_peak(samples, runs[0]["method"] + where, runs[0]["device"])
    return out


def measure_peaks_isolated(
    make_step: Callable[..., Callable[[], Any]],
    variants: Mapping[str, Mapping[str, Any]],
    repeats: int = 3,
    reserve_mib: int = RESERVE_MIB,
    parallel: int = 4,
    fresh_process: bool | None = None,
    timeout: float = 300,
    fork: bool | None = None,
    processes: int = 1,
) -> dict[str, PeakMemory]:
    """Peak memory of one step per variant, each measured in its own fresh Python process:
    :func:`measure_isolated` without timing — ``{label (+ key): PeakMemory}``.

    ``processes`` > 1: each variant in that many fresh processes, ``repeats`` readings in each; ``samples`` holds
    every reading, process after process, and ``peak_bytes`` their median. Without XLA, TensorFlow's executor may
    order a step's ops differently from one process to the next, and a step's peak with it (measured: a Dense +
    LayerNorm stack saved 16-18% in most processes and 0% in one), so a verdict needs readings from several."""
    if int(processes) <= 1:
        return measure_isolated(
            make_step,
            variants,
            repeats=repeats,
            reserve_mib=reserve_mib,
            parallel=parallel,
            fresh_process=fresh_process,
            timeout=timeout,
            fork=fork,
        ).peaks
    copies = {f"{label}{_COPY}{i}": kwargs for i in range(int(processes)) for label, kwargs in variants.items()}
    peaks = measure_isolated(
        make_step,
        copies,
        repeats=repeats,
        reserve_mib=reserve_mib,
        parallel=parallel,
        fresh_process=fresh_process,
        timeout=timeout,
        fork=fork,
    ).peaks
    pooled: dict[str, list] = {}
    for label, peak in peaks.items():
        name, rest = label.split(_COPY, 1)
        key = name + rest.lstrip("0123456789")  # a step's own key (e.g. "|xla") follows the copy number
        pooled.setdefault(key, []).append(peak)
    out = {}
    for key, parts in pooled.items():
        readings = [v for p in parts for v in (p.samples or [p.peak_bytes])]
        out[key] = PeakMemory(int(statistics.median(readings)), parts[0].method, parts[0].device, samples=readings)
    return out


_COPY = " \u00b7copy "  # joins a variant's label and its process number (measure_peaks_isolated's processes)


def measure_peak_isolated(
    make_step: Callable[..., Callable[[], Any]],
    repeats: int = 3,
    reserve_mib: int = RESERVE_MIB,
    fresh_process: bool | None = None,
    timeout: float = 300,
    fork: bool | None = None,
    **kwargs: Any,
) -> PeakMemory:
    """:func:`measure_peaks_isolated` for one step: ``make_step(**kwargs)`` measured in a fresh process."""
    return measure_peaks_isolated(
        make_step,
        {"step": kwargs},
        repeats=repeats,
        reserve_mib=reserve_mib,
        fresh_process=fresh_process,
        timeout=timeout,
        fork=fork,
    )["step"]
