"""Find the best hardware and the ``tf.distribute`` strategy for it, never raising on missing hardware.

The chain (CONTRIBUTING.md §1, §7):

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
import sys
from typing import Any, Callable
from urllib.parse import urlparse

from . import config as _config
from . import processes
from .processes import usable_cores  # noqa: F401 - the toolkit's name for it: runtime.usable_cores()


# TPU PCI ids, as JAX's hardware_utils lists them (vendor 0x1ae0 = Google).
GOOGLE_PCI_VENDOR = "0x1ae0"
TPU_PCI_DEVICE_IDS = {
    "0x0027": "TPU v2/v3",
    "0x005e": "TPU v4",
    "0x0062": "TPU v5p",
    "0x0063": "TPU v5e",
    "0x006f": "TPU v6e",
}
# (not TPU_SKIP_MDS_QUERY: importing JAX sets it to 1 where it finds no TPU chips, jax/_src/cloud_tpu_init.py, and
# importing TensorFlow imports JAX wherever JAX is installed, tensorflow.lite.python.util: with JAX 0.10.2 beside
# TensorFlow 2.20 every CPU machine read as a TPU that did not connect)
TPU_ENV_VARS = ("TPU_NAME", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_ID")
# The TPU build of TensorFlow, installed as Colab documents it (googlecolab/colabtools#5164, #5228):
# with --find-links to Google's libtpu release index. 2.20.0 is the newest TensorFlow with a TPU build.
TF_VERSION = "2.20.0"
# The libtpu TensorFlow 2.20.0's TPU build names: its wheel's metadata asks for libtpu~=0.0.14, and TensorFlow's
# setup.py pins a TPU release to the libtpu of its day (LATEST_RELEASE_LIBTPU_VERSION). ~= also accepts every later
# 0.0.x, but a later one is untested with it: libtpu 0.0.23 left TensorFlow 2.20 with "No TPU platform found"
# (Kaggle/docker-python#1499), and Colab's TPU image pins its own for its JAX (0.0.21.1 with JAX 0.7.2,
# googlecolab/backend-info). So the setup installs this one with TensorFlow, up front; it costs the image's JAX.
LIBTPU_FOR_TF = "0.0.14"
LIBTPU_TF_INDEX = "https://storage.googleapis.com/libtpu-tf-releases/index.html"
TPU_PIP_ARGS = (f"tensorflow-tpu=={TF_VERSION}", f"libtpu=={LIBTPU_FOR_TF}", f"--find-links={LIBTPU_TF_INDEX}")
CPU_GPU_PIP_ARGS = (f"tensorflow=={TF_VERSION}",)
TPU_INSTALL_FIX = (
    f'pip install "tensorflow-tpu=={TF_VERSION}" "libtpu=={LIBTPU_FOR_TF}" '
    f"--find-links={LIBTPU_TF_INDEX}   (then restart the runtime)"
)
LIBTPU_DISTRIBUTIONS = ("libtpu", "libtpu-nightly")


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


def _dist_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (pip's name), or None."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _dist_requires(name: str) -> list[str]:
    """The requirements distribution ``name`` declares ([] when it is not installed)."""
    from importlib import metadata

    try:
        return list(metadata.requires(name) or [])
    except metadata.PackageNotFoundError:
        return []


def _untested_libtpu(tf_version: str, req, got: str) -> list[str]:
    """A libtpu that ``tensorflow-tpu``'s declared range accepts but newer than the one its release names.

    TensorFlow's TPU wheel names one libtpu (2.20.0's metadata: ``Requires-Dist: libtpu~=0.0.14``), and ``~=0.0.14``
    also accepts every later 0.0.x. Whether a later one works, package metadata cannot tell: this says so instead
    of calling it satisfied (Kaggle stopped preinstalling tensorflow-tpu when libtpu 0.0.23 left TensorFlow 2.20 with
    "No TPU platform found": Kaggle/docker-python#1499). The course's setup installs the named one
    (:data:`LIBTPU_FOR_TF`); this fires where something else put a newer one in place."""
    from packaging.version import Version

    built = [spec.version for spec in req.specifier if spec.operator in ("~=", "==", ">=")]
    if not built or Version(got) <= Version(built[0].rstrip(".*")):
        return []
    return [
        f"untested libtpu: tensorflow-tpu {tf_version} names {req.name} {built[0]} ({req.name}{req.specifier}); "
        f"{got} is newer. The range accepts it, but nothing says TensorFlow was tested with it (libtpu 0.0.23 "
        'left TensorFlow 2.20 with "No TPU platform found", Kaggle/docker-python#1499). Nothing to do while '
        "TensorFlow sees the TPU (the setup line names TPU replicas). If it does not: "
        f"pip install {req.name}=={built[0]} and restart the runtime."
    ]


def _jax_libtpu_note(jax_version: str, req, got: str | None) -> str:
    """What JAX's ``tpu`` extra names, next to the libtpu in place. Not a problem either way: the plain ``jax`` an
    image installs asks for no libtpu (Colab's TPU image pins its own, older than its JAX's extra names, and JAX runs
    there); only where TensorFlow's libtpu replaced a newer one is JAX's TPU start in doubt."""
    from packaging.version import Version

    note = f"JAX {jax_version}'s jax[tpu] extra names {req.name}{req.specifier}"
    pinned = [spec.version.rstrip(".*") for spec in req.specifier if spec.operator == "=="]
    if got and pinned and Version(got) <= Version(LIBTPU_FOR_TF) < Version(pinned[0]):
        note += (
            f"; with {req.name} {got}, TensorFlow's, JAX may no longer start on the TPU in this runtime "
            "(run JAX on a runtime of its own)"
        )
    return note


def libtpu_check(
    version: Callable[[str], str | None] | None = None, requires: Callable[[str], list[str]] | None = None
) -> tuple[str, list[str]]:
    """Which libtpu is installed, and whether TensorFlow's TPU build accepts it.

    ``tensorflow-tpu`` 2.20.0 asks for ``libtpu~=0.0.14``; Colab's TPU image ships JAX and pins a libtpu of its own
    (0.0.21.1 with JAX 0.7.2), older than JAX's ``tpu`` extra names (0.0.23): the image's choice, not a mismatch, so
    JAX's pin is said, never counted. Both frameworks load the same installed libtpu. Returns ``(summary,
    problems)``: one line saying what is installed and who asks for what, and one plain sentence per problem for
    TensorFlow. Reads package metadata only (no TensorFlow, no JAX import). On the untouched image (no TensorFlow)
    it finds no problem.
    """
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pragma: no cover - packaging comes with pip, TensorFlow and JAX
        return "libtpu: cannot check (the 'packaging' module is missing)", []

    version, requires = version or _dist_version, requires or _dist_requires
    installed = {name: version(name) for name in LIBTPU_DISTRIBUTIONS}
    have = [f"{n} {v}" for n, v in installed.items() if v]
    parts = ["libtpu installed: " + (", ".join(have) if have else "none")]
    problems = []
    if len(have) > 1:
        problems.append(
            f"two libtpu packages are installed ({' and '.join(have)}); keep the one "
            "tensorflow-tpu asks for (pip uninstall the other), then restart the runtime."
        )
    for owner in ("tensorflow-tpu", "jax"):
        owner_version = version(owner)
        if not owner_version:
            continue
        for line in requires(owner):
            req = Requirement(line)
            if req.name not in LIBTPU_DISTRIBUTIONS or (req.marker and not req.marker.evaluate({"extra": "tpu"})):
                continue
            got = installed.get(req.name)
            if owner == "jax":  # an extra, not a requirement of the installed JAX: said, never a problem
                parts.append(_jax_libtpu_note(owner_version, req, got))
                continue
            ok = got is not None and req.specifier.contains(got, prereleases=True)
            parts.append(
                f"tensorflow-tpu {owner_version} asks for {req.name}{req.specifier} "
                f"({'satisfied' if ok else 'NOT satisfied'})"
            )
            if ok:
                problems.extend(_untested_libtpu(owner_version, req, got))
            else:
                problems.append(
                    f"libtpu mismatch: tensorflow-tpu {owner_version} needs {req.name}{req.specifier}, but "
                    f"{req.name} {got or 'is not installed'}{' is installed' if got else ''}: TensorFlow "
                    f"cannot be expected to start the TPU. Reinstall with: {TPU_INSTALL_FIX}"
                )
    if installed["libtpu"] is None and installed["libtpu-nightly"] is None and version("tensorflow-tpu"):
        problems.append(
            f"no libtpu is installed, so tensorflow-tpu cannot reach the TPU. Reinstall with: {TPU_INSTALL_FIX}"
        )
    return "; ".join(parts), problems


def _pip_install(args: tuple[str, ...]) -> tuple[int, str, list[str]]:
    """``python -m pip install -q ARGS``: returns (exit code, last line pip printed, notes): a note when a
    ``--find-links`` page could not be reached (pip warns, retries, and goes on with the package index)."""
    proc = processes.run([sys.executable, "-m", "pip", "install", "-q", *args])  # Ctrl-C stops pip and its builds
    text = proc.stdout + "\n" + proc.stderr
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    last = next((ln for ln in reversed(lines) if not _unreachable_link(ln)), "(pip printed nothing)")
    return proc.returncode, last, unreachable_links_note(text, args)


def _unreachable_link(line: str) -> bool:
    return ("Retrying" in line or "Could not fetch URL" in line) and (
        "connection" in line.lower() or "Name or service" in line or "timed out" in line.lower()
    )


def unreachable_links_note(pip_output: str, args: tuple[str, ...]) -> list[str]:
    """One sentence when pip could not reach a ``--find-links`` page (it warns "Retrying … connection", then goes on
    without it): which page, and that the packages came from the package index instead."""
    links = [a.split("=", 1)[1] for a in args if a.startswith("--find-links=")]
    pages = [
        link
        for link in links
        if any(
            _unreachable_link(ln) and (urlparse(link).path.rsplit("/", 2)[-2] in ln or urlparse(link).netloc in ln)
            for ln in pip_output.splitlines()
        )
    ]
    return [
        f"pip could not reach {page} (it retried a few times): it went on with the package index, which has "
        f"tensorflow-tpu {TF_VERSION} and libtpu {LIBTPU_FOR_TF} too"
        for page in pages
    ]


TPU_CHECK_TIMEOUT_S = 240  # connecting and initializing a TPU from a fresh process: tens of seconds on a TPU VM
_TPU_CHECK = """
import tensorflow as tf
resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="local")
tf.config.experimental_connect_to_cluster(resolver)
tf.tpu.experimental.initialize_tpu_system(resolver)
print("TPU cores:", len(tf.config.list_logical_devices("TPU")))
"""


def tpu_reachable_in_fresh_process() -> tuple[bool, str]:
    """``(reached, why)``: whether the TensorFlow just installed reaches the TPU, tried in a fresh Python process
    (lesson 01's recipe) so that this kernel imports TensorFlow only after the answer, and the TPU is free again when
    that process exits. ``why`` is the last line it printed."""
    try:
        proc = processes.run([sys.executable, "-c", _TPU_CHECK], timeout=TPU_CHECK_TIMEOUT_S, what="the TPU check")
    except processes.TimedOut as exc:
        return False, str(exc)
    lines = [ln.strip() for ln in (proc.stdout + "\n" + proc.stderr).splitlines() if ln.strip()]
    cores = next((ln for ln in reversed(lines) if ln.startswith("TPU cores:")), "")
    if proc.returncode == 0 and cores and cores != "TPU cores: 0":
        return True, cores
    said = [ln.split("] ", 1)[-1] for ln in lines]  # without TensorFlow's log prefix ("I0000 … file.cc:78] ")
    return False, next(
        (ln for ln in said if "No TPU platform found" in ln),
        next((ln for ln in reversed(said) if "Error" in ln), said[-1] if said else f"exit code {proc.returncode}"),
    )


def _pip_uninstall(names: tuple[str, ...]) -> tuple[int, str]:
    """``python -m pip uninstall -y NAMES``: returns (exit code, last line pip printed)."""
    proc = processes.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", *names])
    lines = [ln.strip() for ln in (proc.stdout + "\n" + proc.stderr).splitlines() if ln.strip()]
    return proc.returncode, (lines[-1] if lines else "(pip printed nothing)")


class InstallFailed(RuntimeError):
    """The setup cell could not install TensorFlow: it stops the notebook (nothing after it can run), and a notebook
    shows only its message, what to do included — IPython draws an exception with ``_render_traceback_`` that way,
    with no traceback into the course's code."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


def install_tensorflow(
    on_tpu: bool | None = None,
    pip: Callable[[tuple[str, ...]], tuple] = _pip_install,
    check: Callable[[], tuple[str, list[str]]] | None = None,
    version: Callable[[str], str | None] | None = None,
    reach_tpu: Callable[[], tuple[bool, str]] = tpu_reachable_in_fresh_process,
    pip_uninstall: Callable[[tuple[str, ...]], tuple[int, str]] = _pip_uninstall,
) -> list[str]:
    """Install TensorFlow where it is missing (Colab's TPU runtimes ship without it); print what happened.

    Nothing happens when TensorFlow is importable. On a machine with a TPU (:func:`tpu_hints`, or
    ``on_tpu=True``) it runs Colab's documented command with the libtpu TensorFlow names (:data:`TPU_PIP_ARGS`:
    ``pip install tensorflow-tpu==2.20.0 libtpu==0.0.14 --find-links=<Google's libtpu release index>``), says what
    that costs the image's JAX (its libtpu is replaced), checks libtpu (:func:`libtpu_check`), and then whether
    TensorFlow reaches the TPU, in a fresh process (:func:`tpu_reachable_in_fresh_process`). If it does not ("No TPU
    platform found": Kaggle/docker-python#1499), the TPU build is worse than none: it cannot compile XLA for the CPU
    ("could not find registered transfer manager for platform Host"), and Keras' ``jit_compile="auto"``, seeing its
    TPU_SYSTEM device, asks for XLA in every ``fit`` — so it is replaced by the CPU/GPU build and the image's libtpu is
    put back. If the install fails, or there is no TPU, it installs ``tensorflow==2.20.0`` (CPU/GPU). Every failure
    names the pip command, its exit code and pip's last line; an unreachable ``--find-links`` page is said, and the
    install goes on without it. Returns the printed lines; raises ``RuntimeError`` only when no TensorFlow could be
    installed.
    """
    import importlib
    import importlib.util

    if importlib.util.find_spec("tensorflow") is not None:
        return []
    version = version or _dist_version
    on_tpu = bool(tpu_hints()) if on_tpu is None else on_tpu
    out: list[str] = []

    def say(line: str) -> None:
        out.append(line)
        print(line, flush=True)

    def command(args: tuple[str, ...]) -> str:
        return "pip install " + " ".join(args)

    def install(args: tuple[str, ...]) -> tuple[int, str]:
        code, last, *notes = pip(args)
        for note in notes[0] if notes else []:
            say(note)
        return code, last

    if on_tpu:
        jax, image_libtpu = version("jax"), version("libtpu")
        say(f"TensorFlow is missing on this TPU runtime: running `{command(TPU_PIP_ARGS)}` (a minute or two)…")
        if image_libtpu and image_libtpu != LIBTPU_FOR_TF:
            say(
                f"It replaces this image's libtpu {image_libtpu}"
                + (f" (chosen for its JAX {jax})" if jax else "")
                + f" with {LIBTPU_FOR_TF}, the one TensorFlow {TF_VERSION} names: TensorFlow comes first in this "
                "course. "
                + (
                    "JAX may then no longer start on the TPU in this runtime: run JAX notebooks on a "
                    "runtime of their own. "
                    if jax
                    else ""
                )
                + "A fresh runtime (Runtime → Disconnect and delete runtime) brings the image back."
            )
        code, last = install(TPU_PIP_ARGS)
        if code == 0:
            importlib.invalidate_caches()
            summary, problems = (check or libtpu_check)()
            say(f"Installed the TPU build. {summary}")
            for problem in problems:
                say("⚠️ " + problem)
            say("Checking that TensorFlow reaches the TPU, in a fresh process (up to a minute)…")
            reached, why = reach_tpu()
            if reached:
                say(f"TensorFlow reaches the TPU: {why}.")
                return out
            say(
                f"⚠️ TensorFlow's TPU build does not reach the TPU here: {why}. Without the TPU that build is worse "
                "than the CPU one: it cannot compile XLA for the CPU, and Keras' jit_compile='auto' asks for XLA in "
                "every fit. Replacing it with the CPU/GPU build: this notebook will run on the TPU VM's CPU."
            )
            undo = pip_uninstall(("tensorflow-tpu",))
            if undo[0] != 0:
                raise InstallFailed(
                    f"`pip uninstall -y tensorflow-tpu` exited with code {undo[0]}: {undo[1]}. Restart "
                    "the runtime (Runtime → Disconnect and delete runtime) and run the setup cell again."
                )
            if image_libtpu and image_libtpu != LIBTPU_FOR_TF:
                back = install((f"libtpu=={image_libtpu}",))
                say(
                    f"Put back this image's libtpu {image_libtpu}" + (f" for its JAX {jax}." if jax else ".")
                    if back[0] == 0
                    else f"Could not put back libtpu {image_libtpu} (pip: {back[1]}): JAX may not "
                    "start on the TPU in this runtime."
                )
        else:
            say(f"The TPU build did not install: `{command(TPU_PIP_ARGS)}` exited with code {code}: {last}")
            say("Falling back to the CPU/GPU build: this notebook will run on the TPU VM's CPU, not the TPU.")
    say(f"Running `{command(CPU_GPU_PIP_ARGS)}`…")
    code, last = install(CPU_GPU_PIP_ARGS)
    if code != 0:
        raise InstallFailed(
            f"`{command(CPU_GPU_PIP_ARGS)}` exited with code {code}: {last}. No TensorFlow is "
            "installed: check the connection, then restart the runtime and run the setup cell again."
        )
    importlib.invalidate_caches()
    say(f"Installed tensorflow=={TF_VERSION} (CPU/GPU build).")
    return out


MULTI_REPLICA_XLA = (
    "Keras' fit compiles its whole step — strategy.run over every replica, all-reduce included — as one XLA cluster "
    "(keras/src/backend/tensorflow/trainer.py, _make_function), and under MirroredStrategy that cluster cannot reach "
    "the other replicas' variables (InvalidArgumentError '... located in device CPU:1 from device CPU:0'; "
    "keras-team/keras#19005)"
)


def whole_step_compiles(kind: str, replicas: int) -> bool:
    """Whether one replicated training step compiles as a whole: on one replica, as
    ``tf.function(lambda: strategy.run(step), jit_compile=True)``; on a TPU, as a plain ``tf.function`` around
    ``strategy.run`` — TPUStrategy compiles the replicas and their all-reduce together itself, and ``jit_compile=True``
    around it would ask XLA to compile for the TPU VM's host (``course_utils.standin.RUN_UNDER_XLA``). Several
    replicas under MirroredStrategy: no (:data:`MULTI_REPLICA_XLA`) — compile each replica's forward and backward pass
    instead, and reduce and apply the gradients outside XLA (:func:`replica_gradients`)."""
    return kind == "TPU" or replicas <= 1


def fit_jit_compile(kind: str, course_jit: bool = False, replicas: int = 1) -> tuple[bool, bool, str]:
    """``(jit_compile, compiled, why)`` for a Keras model built in a strategy's scope on hardware ``kind`` with
    ``replicas`` replicas: what to pass ``compile(jit_compile=...)``, whether its steps then run under XLA, and why.
    Keras resolves ``jit_compile="auto"`` to False on a machine without a GPU or TPU *and* for any model built under
    a tf.distribute strategy (keras/src/trainers/trainer.py, "Disable XLA with tf.distribute"), so "auto" never
    compiles a course model: the choice is made here. On several replicas (a multi-GPU box, CPU replicas) ``fit``
    cannot be compiled (:data:`MULTI_REPLICA_XLA`): it runs without XLA, and says why."""
    if kind == "TPU":
        return False, True, "TPU: TPUStrategy compiles every step with XLA, whatever compile() is told"
    if replicas > 1:
        return (
            False,
            False,
            (
                f"{replicas} replicas: fit runs without XLA — {MULTI_REPLICA_XLA}; a custom loop can "
                "compile each replica's forward and backward pass (runtime.replica_gradients)"
            ),
        )
    if course_jit:
        return True, True, "COURSE_JIT=1 asks for XLA"
    if kind in ("GPU", "multi-GPU"):
        return (
            True,
            True,
            (
                "GPU: XLA fuses the step's small ops; Keras' jit_compile='auto' would leave it off under "
                "tf.distribute, so it is asked for"
            ),
        )
    return False, False, "CPU: Keras' jit_compile='auto' leaves XLA off on a CPU-only machine; COURSE_JIT=1 turns it on"


def replica_gradients(gradients: Callable, jit: bool) -> Callable:
    """``gradients`` — one replica's forward and backward pass, returning what the step needs (loss, gradients) — as
    the course compiles it under MirroredStrategy: with XLA when ``jit``, per replica, so that the all-reduce and the
    optimizer's update (MirroredStrategy's ``merge_call``) run outside the compiled cluster. Call the result from a
    plain replica function that you hand ``strategy.run``. Handed to ``strategy.run`` itself, a ``jit_compile=True``
    function runs per replica only when every device is a GPU; on other devices (CPU replicas)
    ``mirrored_run.call_for_each_replica`` re-wraps it, with its ``jit_compile``, around every replica at once — the
    failing cluster again. The plain wrapper works on both. Under TPUStrategy do not use it: the strategy compiles the
    whole step (:func:`whole_step_compiles`), as it does on one replica."""
    import tensorflow as tf

    return tf.function(gradients, jit_compile=True) if jit else gradients


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
    standin: str = ""  # "gpu" | "tpu": this kind stood in for by CPU devices (course_utils.standin); "" = real
    _strategy: Any = dataclasses.field(default=None, repr=False)
    _factory: Callable[[], Any] | None = dataclasses.field(default=None, repr=False)
    _stale: str = dataclasses.field(default="", repr=False)  # why this object no longer matches the devices

    @property
    def strategy(self):
        """The ``tf.distribute.Strategy`` to build models under (``with runtime.strategy.scope():``)."""
        if self._stale and self._strategy is None:
            raise RuntimeError(f"this Runtime is out of date: {self._stale}")
        if self._strategy is None:
            self._strategy = self._factory()
            actual = self._strategy.num_replicas_in_sync
            if actual != self.num_replicas:  # pragma: no cover - defensive: tell, don't hide
                self.notes.append(f"expected {self.num_replicas} replicas, the strategy has {actual}")
                self.num_replicas = actual
        return self._strategy

    def one_device_strategy(self):
        """A strategy with one replica on this runtime's first device, for work that must not be split across replicas
        (single-device timings, a one-device trainer): on a TPU the runtime's strategy where it has one core, else
        ``OneDeviceStrategy`` on the first core; on a CPU or GPU TensorFlow's default strategy, whose ops go to the
        same first device (GPU:0 when there is a GPU, else CPU:0).

        Why not ``OneDeviceStrategy`` there: it feeds the device through per-device datasets that always run tf.data's
        autotuning, and TensorFlow (2.20, 2.21) destroys an iterator only once that autotuning thread wakes from a sleep
        that grows while the iterator lives. Keras drops an iterator at every epoch's start and when ``fit`` returns,
        so each ``fit`` ended idle for up to an epoch on one core — inside whatever was being timed. Under the default
        strategy the pipeline is iterated as built: build it with :func:`course_utils.data.without_autotune` too (each
        alone measured the same waits)."""
        if self.kind == "TPU":
            if self.num_replicas == 1:
                return self.strategy
            import tensorflow as tf

            return tf.distribute.OneDeviceStrategy(self.device_names[0])
        import tensorflow as tf

        return tf.distribute.get_strategy()

    @property
    def xla(self) -> bool:
        """Do the lessons' measured steps run under XLA here? ``COURSE_JIT=1`` asks for it; a TPU compiles every step
        with XLA whatever a function or ``compile()`` is told. The one definition every lesson labels its figures by."""
        return bool(self.config.jit or self.kind == "TPU")

    @property
    def xla_label(self) -> str:
        """'with XLA' or 'without XLA' (:attr:`xla`), for printed figures and claims."""
        return "with XLA" if self.xla else "without XLA"

    def fit_jit_compile(self) -> tuple[bool, bool, str]:
        """:func:`fit_jit_compile` for this runtime's hardware, replicas and ``COURSE_JIT``."""
        return fit_jit_compile(self.kind, self.config.jit, self.num_replicas)

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
        if self._stale:
            lines.append(f"OUT OF DATE: {self._stale}")
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
            "standin": self.standin,
        }


def _shorten(text: str, limit: int) -> str:
    """``text`` if it fits in ``limit`` characters, else cut at a word boundary (or a sentence end that keeps
    most of it) and marked with "…" — never in the middle of a word."""
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    sentence_end = max(head.rfind(". "), head.rfind("; "))
    if sentence_end >= limit * 0.75:  # a whole sentence (or clause) that keeps most of the text
        return head[: sentence_end + 1] + " …"
    space = head.rfind(" ")
    cut = head[:space] if space >= limit // 2 else head  # one very long token (a path): cut it
    return cut.rstrip(" ,;:") + "…"


def _first_line(exc: BaseException, limit: int = 400) -> str:
    """``TypeName: first line of the message``, shortened to about ``limit`` characters at a word boundary.

    400 characters keep the part of a TPU error that says what to do (e.g. "…your TPU runtime version does
    not match the TensorFlow version", "The TPU is already in use by process with pid …")."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    text = _shorten(lines[0], limit) if lines else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def describe_import_failure(package: str, exc: BaseException) -> tuple[str, str]:
    """An import of ``package`` (pip name) that failed: ``(what happened, the fix)``, one line each.

    The common case on Colab: a package's generated protobuf code is newer than the installed protobuf
    runtime (``google.protobuf.runtime_version.VersionError``), which leaves the package half-imported —
    only a restart clears it after the fix."""
    what = f"{package} is installed but fails to import ({_first_line(exc, 240)})"
    text = f"{type(exc).__name__} {exc}".lower()
    if "protobuf" in text or type(exc).__name__ == "VersionError":
        fix = (
            "pip install -U protobuf   (then restart the runtime/kernel: the failed import stays half-done until then)"
        )
    elif isinstance(exc, ModuleNotFoundError) and exc.name and not exc.name.startswith(package.replace("-", "_")):
        fix = f"pip install {exc.name.split('.')[0]}   (a missing dependency; then restart the runtime/kernel)"
    else:
        fix = f'pip install -U "{package}"   (then restart the runtime/kernel)'
    return what, fix


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


def _split_cpu(tf, n: int | None) -> tuple[int, str | None]:
    """Configure n logical CPU devices (``None``: keep whatever split this process already has);
    returns (replicas obtained, problem or None). Never lists devices before configuring them:
    listing starts TensorFlow, after which the split cannot change."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu) or []
    configured = max(1, len(current))
    if n is None or n == configured:
        return configured, None
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
        return n, None
    except RuntimeError:  # TensorFlow already started with `configured` devices
        return configured, (
            f"could not split the CPU into {n} replica(s): this process already started TensorFlow with "
            f"{configured}; restart the kernel and run the setup cell first"
            + ("" if _config.get().cpu_replicas == n else f" (or set COURSE_CPU_REPLICAS={n} before starting)")
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
    explicit = cpu_replicas is not None
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
    if cfg.standin and probe_tpu is None and resolver_factory is None:  # a probe asks for the real chain
        rt = _standin_runtime(tf, cfg.standin, n, fallbacks, notes, common)
        _CACHE[key] = rt
        return rt

    # 1. TPU
    if device in ("auto", "tpu"):
        hints = tpu_hints()
        # A TensorFlow without TPU support (the CPU/GPU build: what the setup installs where the TPU build did not
        # reach the TPU) cannot connect; trying anyway starts TensorFlow's runtime, after which the CPU can no longer
        # be split into replicas (lesson 05's 4 CPU replicas failed that way on a TPU VM).
        tpu_support = bool(
            _dist_version("tensorflow-tpu")
            or tf.config.list_physical_devices("TPU")
            or tf.config.list_physical_devices("TPU_SYSTEM")
        )
        should_try = probe_tpu if probe_tpu is not None else ((bool(hints) and tpu_support) or device == "tpu")
        if hints and _dist_version("tensorflow-tpu"):  # say a libtpu/JAX mismatch before it bites
            notes.extend(libtpu_check()[1])
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
                if use_cache:  # a probe with use_cache=False (a test's fake TPU) must not become every later answer
                    _CACHE[key] = rt
                return rt
            except Exception as exc:  # noqa: BLE001 - any failure means "no usable TPU"
                seen = f" ({hints[0]})" if hints else ""
                fix = ""
                if hints and not _dist_version("tensorflow-tpu") and not tf.config.list_physical_devices("TPU"):
                    fix = f". If this is a TPU runtime, this TensorFlow may lack TPU support: {TPU_INSTALL_FIX}"
                fallbacks.append(f"TPU{seen} did not connect — {_first_line(exc)}{fix}")
        elif hints and not tpu_support and probe_tpu is None:
            fallbacks.append(
                f"TPU ({hints[0]}) not tried: this TensorFlow has no TPU support (the CPU/GPU build). "
                f"If this is a TPU runtime and you want the TPU: {TPU_INSTALL_FIX}"
            )
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

    # 4. CPU. Re-running the setup cell (no explicit cpu_replicas) keeps the split this process has:
    # after detect(cpu_replicas=4) TensorFlow cannot go back to one device anyway.
    keep = not explicit and n == cfg.cpu_replicas and _cpu_split_in_use(tf)
    got, problem = _split_cpu(tf, None if keep else n)
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
    # Cached CPU runtimes with another split no longer match the devices: drop them, and make any
    # Runtime object a notebook still holds say so instead of silently reporting the old split.
    for k in [k for k, v in _CACHE.items() if v.kind == "CPU" and v.num_replicas != got]:
        _CACHE.pop(k)._stale = f"the CPU is now split into {got} device(s) by a later detect(); call detect() again"
    _CACHE[key] = rt
    return rt


def _standin_runtime(tf, which: str, n: int, fallbacks: list, notes: list, common: dict) -> Runtime:
    """The GPU or TPU stand-in (:mod:`course_utils.standin`): that kind's runtime over CPU devices."""
    from . import standin

    if which == "tpu":  # CPU:0 is the TPU VM's host, CPU:1 … CPU:n its cores
        got, problem = _split_cpu(tf, n + 1)
        if problem:
            raise _config.ConfigError(f"COURSE_STANDIN=tpu: {problem}")
        cores = tuple(f"/device:CPU:{i}" for i in range(1, got))
        standin.refuse_host_xla(cores)
        from . import standin_strategies  # imports TensorFlow

        strategy = standin_strategies.tpu_strategy(list(cores))
        notes.append(
            f"stand-in: a TPU with {len(cores)} core(s) over CPU devices (COURSE_STANDIN=tpu); CPU:0 is its "
            "host. It refuses what TPUStrategy refuses; it is a CPU, not faster"
        )
        return Runtime(
            kind="TPU",
            strategy_name="TPUStrategy (stand-in)",
            num_replicas=len(cores),
            device_names=cores,
            fallbacks=fallbacks,
            notes=notes,
            _strategy=strategy,
            standin="tpu",
            **common,
        )
    got, problem = _split_cpu(tf, n)
    if problem:
        raise _config.ConfigError(f"COURSE_STANDIN=gpu: {problem}")
    fallbacks.append("TPU — none found (a GPU stand-in: COURSE_STANDIN=gpu)")  # as detect() records on a real GPU
    names = tuple(f"/device:CPU:{i}" for i in range(got))
    notes.append(
        f"stand-in: {got} GPU(s) over CPU devices (COURSE_STANDIN=gpu): memory is read in this process, as "
        "on a GPU; it is a CPU, not faster"
    )
    if got > 1:
        return Runtime(
            kind="multi-GPU",
            strategy_name="MirroredStrategy",
            num_replicas=got,
            device_names=names,
            fallbacks=fallbacks,
            notes=notes,
            standin="gpu",
            _factory=lambda: tf.distribute.MirroredStrategy(list(names)),
            **common,
        )
    return Runtime(
        kind="GPU",
        strategy_name="OneDeviceStrategy",
        num_replicas=1,
        device_names=names,
        fallbacks=fallbacks,
        notes=notes,
        standin="gpu",
        _factory=lambda: tf.distribute.OneDeviceStrategy(names[0]),
        **common,
    )


def _cpu_split_in_use(tf) -> bool:
    cpu = tf.config.list_physical_devices("CPU")[0]
    return len(tf.config.get_logical_device_configuration(cpu) or []) > 1


def run_on_cpu_replicas(replicas: int, code: str, timeout: float = 180) -> str:
    """Run Python ``code`` in a fresh process whose CPU is split into ``replicas`` devices; return its stdout.

    TensorFlow fixes its device list when it starts, so a notebook that already runs on one device
    cannot become a 4-replica machine — but a fresh process can. Inside ``code``,
    ``course_utils.detect().strategy`` is a ``MirroredStrategy`` over ``replicas`` CPU devices.
    """
    env = dict(os.environ, COURSE_CPU_REPLICAS=str(replicas), COURSE_DEVICE="cpu", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("COURSE_STANDIN", None)  # CPU replicas, as asked: not a GPU's or TPU's stand-in
    # forked from a process that has imported TensorFlow and run nothing (course_utils.processes, fork=True; Linux):
    # a new process and TensorFlow runtime all the same, started seconds sooner
    proc = processes.run(
        [sys.executable, "-c", code], fork=True, env=env, timeout=timeout, what=f"the {replicas}-replica process"
    )
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


def _main(argv: list[str]) -> int:
    """``python -m course_utils.runtime [--json] [--fit]``: print the runtime (used by tests)."""
    rt = detect()
    result = rt.as_dict()
    if "--fit" in argv:
        import numpy as np
        import keras

        with rt.strategy.scope():
            model = keras.Sequential(
                [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)]
            )
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
