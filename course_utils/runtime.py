"""Find the best hardware and the ``tf.distribute`` strategy for it, never raising on missing hardware.

The chain (COURSE_DESIGN §1, §7):

1. **TPU** — ``TPUClusterResolver(tpu="local")`` → ``experimental_connect_to_cluster`` →
   ``initialize_tpu_system`` → ``TPUStrategy``. Tried only where a TPU is plausible (device files or
   PCI ids of a TPU, or ``TPU_*`` variables), or when asked for; any failure falls through.
2. **Several GPUs** — ``MirroredStrategy``.
3. **One GPU** — ``OneDeviceStrategy("/gpu:0")``.
4. **CPU** — ``OneDeviceStrategy("/cpu:0")``, or split into N logical devices
   (``COURSE_CPU_REPLICAS=N``) so that ``MirroredStrategy`` has N real replicas.

Every step that was skipped or failed is recorded in ``Runtime.fallbacks`` with the reason, and
``Runtime.summary()`` says it in a few lines.

GPU and CPU strategies are created lazily (on first use of ``runtime.strategy``), so a lesson may
still ask for another CPU split with ``detect(cpu_replicas=4)`` after the setup cell ran, as long
as no TensorFlow op has run yet.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import subprocess
import sys
from typing import Any, Callable

from . import config as _config

# TPU PCI ids, as JAX's hardware_utils lists them (vendor 0x1ae0 = Google).
GOOGLE_PCI_VENDOR = "0x1ae0"
TPU_PCI_DEVICE_IDS = {
    "0x0027": "TPU v2/v3",
    "0x005e": "TPU v4",
    "0x0062": "TPU v5p",
    "0x0063": "TPU v5e",
    "0x006f": "TPU v6e",
}
TPU_ENV_VARS = ("TPU_NAME", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_ID", "TPU_SKIP_MDS_QUERY")
TPU_INSTALL_FIX = 'pip install "tensorflow-tpu==2.20.0"   (then restart the runtime)'


def in_colab() -> bool:
    """True inside a Google Colab kernel."""
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def tpu_hints(pci_root: str = "/sys/bus/pci/devices", dev_root: str = "/dev") -> list[str]:
    """Evidence that this machine has a TPU attached, without importing TensorFlow or using the network."""
    hints = []
    accel = sorted(glob.glob(os.path.join(dev_root, "accel[0-9]*")))
    if accel:
        hints.append(f"{accel[0]} exists (TPU v2-v4 device file)")
    if os.path.exists(os.path.join(dev_root, "vfio", "0")):
        hints.append(f"{os.path.join(dev_root, 'vfio', '0')} exists (TPU v5e/v6e device file)")
    for dev in sorted(glob.glob(os.path.join(pci_root, "*"))):
        try:
            with open(os.path.join(dev, "vendor")) as f:
                vendor = f.read().strip()
            with open(os.path.join(dev, "device")) as f:
                device = f.read().strip()
        except OSError:
            continue
        if vendor == GOOGLE_PCI_VENDOR and device in TPU_PCI_DEVICE_IDS:
            hints.append(f"PCI device {vendor}:{device} ({TPU_PCI_DEVICE_IDS[device]})")
            break
    hints += [f"{name}={os.environ[name]}" for name in TPU_ENV_VARS if os.environ.get(name)]
    return hints


@dataclasses.dataclass
class Runtime:
    """What :func:`detect` found. ``strategy`` is created on first use (TPU: at detection)."""

    kind: str  # "TPU" | "multi-GPU" | "GPU" | "CPU"
    strategy_name: str
    num_replicas: int
    device_names: tuple[str, ...]
    fallbacks: list[str]  # what was tried or skipped before this kind, and why
    notes: list[str]
    in_colab: bool
    tf_version: str
    keras_version: str
    keras_backend: str
    config: _config.CourseConfig
    tpu_resolver: Any = None
    _strategy: Any = dataclasses.field(default=None, repr=False)
    _factory: Callable[[], Any] | None = dataclasses.field(default=None, repr=False)

    @property
    def strategy(self):
        """The ``tf.distribute.Strategy`` to build models under (``with runtime.strategy.scope():``)."""
        if self._strategy is None:
            self._strategy = self._factory()
            actual = self._strategy.num_replicas_in_sync
            if actual != self.num_replicas:  # pragma: no cover - defensive: tell, don't hide
                self.notes.append(f"expected {self.num_replicas} replicas, the strategy has {actual}")
                self.num_replicas = actual
        return self._strategy

    @property
    def fell_back(self) -> bool:
        return bool(self.fallbacks)

    def summary(self) -> str:
        names = ", ".join(n.split("device:")[-1] for n in self.device_names)
        plural = "replica" if self.num_replicas == 1 else "replicas"
        lines = [
            f"Runtime: {self.kind} · {self.num_replicas} {plural} ({self.strategy_name}) · devices: {names}",
            f"TensorFlow {self.tf_version} · Keras {self.keras_version} (backend: {self.keras_backend})"
            f" · Colab: {'yes' if self.in_colab else 'no'} · mode: {self.config.mode}",
        ]
        if self.fallbacks:
            lines.append("Fell back: " + "; ".join(self.fallbacks))
        lines += [f"Note: {n}" for n in self.notes]
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "strategy_name": self.strategy_name,
            "num_replicas": self.num_replicas,
            "device_names": list(self.device_names),
            "fallbacks": list(self.fallbacks),
            "notes": list(self.notes),
            "in_colab": self.in_colab,
            "tf_version": self.tf_version,
            "keras_version": self.keras_version,
            "keras_backend": self.keras_backend,
            "mode": self.config.mode,
        }


def _first_line(exc: BaseException, limit: int = 160) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def connect_tpu(resolver_factory: Callable[..., Any] | None = None):
    """The TPU recipe for today's TPU VMs. Returns ``(resolver, TPUStrategy)``; raises if there is no TPU.

    This is the whole recipe the lesson teaches — four calls::

        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="local")
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
    """
    import tensorflow as tf

    factory = resolver_factory or tf.distribute.cluster_resolver.TPUClusterResolver
    resolver = factory(tpu="local")
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return resolver, tf.distribute.TPUStrategy(resolver)


def _split_cpu(tf, n: int) -> tuple[int, str | None]:
    """Configure n logical CPU devices; returns (replicas obtained, problem or None)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    wanted = [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
    try:
        current = tf.config.get_logical_device_configuration(cpu)
        if (current and len(current) == n) or (not current and n == 1):
            return n, None
        tf.config.set_logical_device_configuration(cpu, wanted if n > 1 else None)
        return n, None
    except RuntimeError:
        have = len(tf.config.list_logical_devices("CPU"))
        if have == n:
            return n, None
        return have, (
            f"could not split the CPU into {n} replicas because TensorFlow already started with {have}; "
            f"restart the kernel and run the setup cell first (or set COURSE_CPU_REPLICAS={n} before starting)"
        )


_CACHE: dict[tuple, Runtime] = {}


def detect(
    cpu_replicas: int | None = None,
    device: str | None = None,
    *,
    probe_tpu: bool | None = None,
    resolver_factory: Callable[..., Any] | None = None,
    use_cache: bool = True,
) -> Runtime:
    """Detect the hardware and return a :class:`Runtime` with the right strategy. Never raises on
    missing hardware; raises :class:`course_utils.config.ConfigError` only for invalid settings.

    cpu_replicas: logical CPU devices when running on CPU (default: ``COURSE_CPU_REPLICAS`` or 1).
    device: ``auto`` | ``tpu`` | ``gpu`` | ``cpu`` (default ``COURSE_DEVICE`` or auto) — skip faster kinds.
    probe_tpu: try the TPU recipe even without evidence of a TPU (tests use this); False skips it.
    resolver_factory: replaces ``TPUClusterResolver`` (tests make it fail).
    """
    cfg = _config.get()
    n = cfg.cpu_replicas if cpu_replicas is None else int(cpu_replicas)
    if not 1 <= n <= _config.MAX_CPU_REPLICAS:
        raise _config.ConfigError(f"cpu_replicas={n} is out of range: use 1 to {_config.MAX_CPU_REPLICAS}.")
    device = (device or cfg.device).lower()
    if device not in _config.DEVICE_CHOICES:
        raise _config.ConfigError(f"device={device!r} is not one of {', '.join(_config.DEVICE_CHOICES)}.")
    key = (n, device, probe_tpu, resolver_factory)
    if use_cache and key in _CACHE:
        return _CACHE[key]
    # A TPU system is initialized once per process: reuse it whatever the CPU settings.
    for rt in _CACHE.values():
        if rt.kind == "TPU" and use_cache:
            return rt

    import tensorflow as tf
    import keras

    fallbacks: list[str] = []
    notes: list[str] = []
    common = dict(
        in_colab=in_colab(),
        tf_version=tf.__version__,
        keras_version=keras.__version__,
        keras_backend=keras.backend.backend(),
        config=cfg,
    )
    if common["keras_backend"] != "tensorflow":
        notes.append(
            f"Keras uses the {common['keras_backend']!r} backend; this course needs 'tensorflow'. "
            "Restart the runtime and run the setup cell before importing keras (it sets KERAS_BACKEND)."
        )
    if device != "auto":
        notes.append(f"device={device!r} requested (COURSE_DEVICE): faster kinds were not tried")

    # 1. TPU
    if device in ("auto", "tpu"):
        hints = tpu_hints()
        should_try = probe_tpu if probe_tpu is not None else (bool(hints) or device == "tpu")
        if should_try:
            try:
                resolver, strategy = connect_tpu(resolver_factory)
                devices = tuple(d for d in strategy.extended.worker_devices)
                rt = Runtime(
                    kind="TPU",
                    strategy_name="TPUStrategy",
                    num_replicas=strategy.num_replicas_in_sync,
                    device_names=devices,
                    fallbacks=fallbacks,
                    notes=notes,
                    tpu_resolver=resolver,
                    _strategy=strategy,
                    **common,
                )
                _CACHE[key] = rt
                return rt
            except Exception as exc:  # noqa: BLE001 - any failure means "no usable TPU"
                seen = f" ({hints[0]})" if hints else ""
                fix = ""
                if hints and "tensorflow-tpu" not in sys.modules and not tf.config.list_physical_devices("TPU"):
                    fix = f". If this is a TPU runtime, this TensorFlow may lack TPU support: {TPU_INSTALL_FIX}"
                fallbacks.append(f"TPU{seen} did not connect — {_first_line(exc)}{fix}")
        else:
            fallbacks.append("TPU — none found (no /dev/accel*, /dev/vfio/0, TPU PCI device or TPU_* variable)")

    # 2./3. GPU
    if device in ("auto", "gpu"):
        gpus = tf.config.list_physical_devices("GPU")
        for gpu in gpus:  # let memory grow instead of grabbing it all (friendlier, and peaks are readable)
            try:
                tf.config.experimental.set_memory_growth(gpu, True)
            except RuntimeError:
                pass
        if len(gpus) > 1:
            names = tuple(f"/device:GPU:{i}" for i in range(len(gpus)))
            rt = Runtime(
                kind="multi-GPU",
                strategy_name="MirroredStrategy",
                num_replicas=len(gpus),
                device_names=names,
                fallbacks=fallbacks,
                notes=notes,
                _factory=lambda: tf.distribute.MirroredStrategy(),
                **common,
            )
            _CACHE[key] = rt
            return rt
        if len(gpus) == 1:
            rt = Runtime(
                kind="GPU",
                strategy_name="OneDeviceStrategy",
                num_replicas=1,
                device_names=("/device:GPU:0",),
                fallbacks=fallbacks,
                notes=notes,
                _factory=lambda: tf.distribute.OneDeviceStrategy("/gpu:0"),
                **common,
            )
            if n > 1:
                notes.append(f"cpu_replicas={n} ignored: a GPU was found (set COURSE_DEVICE=cpu to split the CPU)")
            _CACHE[key] = rt
            return rt
        fallbacks.append("GPU — none visible to TensorFlow")

    # 4. CPU
    got, problem = _split_cpu(tf, n)
    if problem:
        fallbacks.append(f"CPU split — {problem}")
    names = tuple(f"/device:CPU:{i}" for i in range(got))
    if got > 1:
        strategy_name = "MirroredStrategy"
        factory = lambda: tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(got)])  # noqa: E731
    else:
        strategy_name = "OneDeviceStrategy"
        factory = lambda: tf.distribute.OneDeviceStrategy("/cpu:0")  # noqa: E731
    rt = Runtime(
        kind="CPU",
        strategy_name=strategy_name,
        num_replicas=got,
        device_names=names,
        fallbacks=fallbacks,
        notes=notes,
        _factory=factory,
        **common,
    )
    # Drop cached CPU runtimes with another split: their strategy would no longer match the devices.
    for k in [k for k, v in _CACHE.items() if v.kind == "CPU" and v.num_replicas != got and v._strategy is None]:
        del _CACHE[k]
    _CACHE[key] = rt
    return rt


def resolver_recipes() -> list[dict]:
    """Run the three TPU resolver recipes seen in tutorials and report what each does *here*.

    Returns rows ``{"recipe", "era", "outcome"}``. The ``tpu="local"`` recipe is only connected when a
    TPU is plausibly present (connecting on a machine without one changes TensorFlow's state).
    """
    import tensorflow as tf

    Resolver = tf.distribute.cluster_resolver.TPUClusterResolver
    rows = []
    for recipe, era, build in [
        ('TPUClusterResolver(tpu="grpc://" + os.environ["COLAB_TPU_ADDR"])', "TPU Node (retired)",
         lambda: Resolver(tpu="grpc://" + os.environ["COLAB_TPU_ADDR"])),
        ("TPUClusterResolver()", "TPU Node / Cloud TPU name", lambda: Resolver()),
    ]:
        try:
            build()
            outcome = "constructed (a TPU name or address is configured here)"
        except Exception as exc:  # noqa: BLE001
            outcome = "raises " + _first_line(exc, 90)
        rows.append({"recipe": recipe, "era": era, "outcome": outcome})
    if tpu_hints():
        rt = detect()
        outcome = (
            f"connected: {rt.num_replicas} replica(s)" if rt.kind == "TPU" else "failed: " + rt.fallbacks[0]
        )
    else:
        Resolver(tpu="local")
        outcome = "constructed; not connected — no TPU on this machine, so the course falls back"
    rows.append({"recipe": 'TPUClusterResolver(tpu="local")', "era": "TPU VM (today)", "outcome": outcome})
    return rows


def _preview_split(per_replica_batch: int, image_shape=(32, 32, 3)) -> dict:
    """Runs inside a fresh process: distribute one global batch and report each replica's shape."""
    import numpy as np
    import tensorflow as tf

    rt = detect(device="cpu")
    strategy = rt.strategy
    global_batch = per_replica_batch * strategy.num_replicas_in_sync
    images = np.zeros((global_batch * 2, *image_shape), dtype="float32")
    ds = tf.data.Dataset.from_tensor_slices(images).batch(global_batch, drop_remainder=True)
    first = next(iter(strategy.experimental_distribute_dataset(ds)))
    shapes = [list(t.shape) for t in strategy.experimental_local_results(first)]
    return {
        "replicas": strategy.num_replicas_in_sync,
        "global_batch": global_batch,
        "per_replica_shapes": shapes,
        "devices": [str(d) for d in strategy.extended.worker_devices],
    }


def run_on_cpu_replicas(replicas: int, code: str, timeout: float = 180) -> str:
    """Run Python ``code`` in a fresh process whose CPU is split into ``replicas`` devices; return its stdout.

    TensorFlow fixes its device list when it starts, so a notebook that already runs on one device
    cannot become a 4-replica machine — but a fresh process can. Inside ``code``,
    ``course_utils.detect().strategy`` is a ``MirroredStrategy`` over ``replicas`` CPU devices.
    """
    env = dict(os.environ, COURSE_CPU_REPLICAS=str(replicas), COURSE_DEVICE="cpu", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"the {replicas}-replica process failed:\n{tail}")
    return proc.stdout


def run_with_replicas(replicas: int, strategy, fn: Callable[..., Any], timeout: float = 300, **kwargs) -> dict:
    """``fn(strategy, **kwargs)`` on a strategy with ``replicas`` replicas: here when ``strategy`` has that
    many, else in a fresh process whose CPU is split into ``replicas`` devices (:func:`run_on_cpu_replicas`).

    ``fn`` is a module-level function that returns a JSON-able dict (the lessons' experiments are);
    ``kwargs`` must be JSON-able too. Returns ``fn``'s dict plus ``"where"`` (which of the two ran it).
    """
    import importlib
    import json

    if not callable(fn) or "<" in getattr(fn, "__qualname__", "<"):
        raise TypeError(f"fn must be a module-level function, got {fn!r}")
    if strategy is not None and strategy.num_replicas_in_sync == replicas:
        return dict(fn(strategy, **kwargs), where="this notebook's strategy")
    module, name = fn.__module__, fn.__qualname__
    if getattr(importlib.import_module(module), name, None) is not fn:
        raise TypeError(f"{module}.{name} is not importable in a fresh process")
    code = (
        "import importlib, json, course_utils\n"
        f"fn = getattr(importlib.import_module({module!r}), {name!r})\n"
        f"print(json.dumps(fn(course_utils.detect().strategy, **json.loads({json.dumps(json.dumps(kwargs))}))))"
    )
    out = run_on_cpu_replicas(replicas, code, timeout=timeout)
    return dict(json.loads(out.strip().splitlines()[-1]), where=f"a fresh process with {replicas} CPU replicas")


def preview_on_cpu_replicas(replicas: int, per_replica_batch: int, timeout: float = 180) -> dict:
    """How ``experimental_distribute_dataset`` splits one global batch on ``replicas`` CPU replicas.

    Returns ``{"replicas", "global_batch", "per_replica_shapes", "devices"}`` from a fresh process.
    """
    code = (
        "import json, course_utils.runtime as r\n"
        f"print(json.dumps(r._preview_split({int(per_replica_batch)})))"
    )
    return json.loads(run_on_cpu_replicas(replicas, code, timeout).strip().splitlines()[-1])


def _main(argv: list[str]) -> int:
    """``python -m course_utils.runtime [--json] [--fit]``: print the runtime (used by tests)."""
    rt = detect()
    result = rt.as_dict()
    if "--fit" in argv:
        import numpy as np
        import keras

        with rt.strategy.scope():
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
            model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        rng = np.random.default_rng(0)
        x = rng.normal(size=(256, 8)).astype("float32")
        y = (x[:, 0] > 0).astype("int32")
        hist = model.fit(x, y, batch_size=16 * rt.num_replicas, epochs=2, verbose=0)
        result["fit_losses"] = [float(v) for v in hist.history["loss"]]
        result["strategy_replicas"] = rt.strategy.num_replicas_in_sync
    if "--json" in argv or "--fit" in argv:
        print(json.dumps(result))
    else:
        print(rt.summary())
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
