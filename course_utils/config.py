"""One config object for the whole course: mode (full/smoke), CPU replicas, data source, sizes.

Every notebook takes its sizes from here (``course_utils.config.get().sizes``), so the same cells
run in both modes and no cell needs an ``if smoke:``.

Environment variables (all optional):

==========================  ==================================================================
``COURSE_SMOKE``            ``1`` = tiny sizes and offline data (the test suite sets it)
``COURSE_CPU_REPLICAS``     split the CPU into N logical devices (1-8) for ``MirroredStrategy``
``COURSE_DATA``             ``tfds`` | ``synthetic`` | ``npz:PATH`` (smoke default: ``synthetic``)
``COURSE_DEVICE``           ``auto`` (default) | ``tpu`` | ``gpu`` | ``cpu``: skip faster kinds
``COURSE_JIT``              ``1`` = the lessons' measured steps compile with XLA (``jit_compile=True``),
                            as every step on a TPU does; ``0`` (default) = plain graph mode
``COURSE_STANDIN``          ``gpu`` | ``tpu``: run the course's GPU or TPU code paths over CPU devices
                            (:mod:`course_utils.standin`; CI's ``prove --shape gpu|multi-gpu|tpu``)
==========================  ==================================================================
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping

TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"", "0", "false", "no", "off"}
DEVICE_CHOICES = ("auto", "tpu", "gpu", "cpu")
STANDIN_CHOICES = ("gpu", "tpu")  # COURSE_STANDIN: the accelerator kinds emulated over CPU devices
MAX_CPU_REPLICAS = 8


class ConfigError(ValueError):
    """A course setting has a value the course cannot use; the message says which and how to fix it."""


@dataclasses.dataclass(frozen=True)
class CommonSizes:
    """The sizes several lessons share. Smoke sizes keep each notebook under 90 s on 2 CPU cores. A lesson's own sizes
    are in its manifest (``[sizes]`` in ``course_utils/lessons/<name>/lesson.toml``); :data:`Sizes` holds both."""

    per_replica_batch: int  # examples per replica per step (TPUs like 128)
    train_examples: int
    test_examples: int
    epochs: int
    image_size: int  # CIFAR-10 is 32x32x3
    num_classes: int
    model_width: int  # filters of the first conv layer; later layers scale from it
    matmul_size: int  # square matrix side for throughput probes
    # timed repeats after one warm-up; report the median. Smoke: 3 (lessons 04 and 05 took 81-87 s of their 90 with 4
    # on CI's 2-vCPU AVX2 VM; smoke timings show the table, the verdicts are full mode's)
    timing_repeats: int
    # examples per step in memory demos: enough that activations dominate the peak, not the part of a
    # CPU step's peak that does not grow with the batch (conv scratch space, whole allocator blocks)
    memory_batch: int
    # filters of the CNN in memory demos: at width 8 a step's peak (a few MiB of activations) moves by ±20% between
    # processes and repeats, as whole allocator blocks come and go; at 16 it is steady within a few percent
    memory_width: int


_COMMON = {
    "full": CommonSizes(
        per_replica_batch=128,
        train_examples=20_000,
        test_examples=4_000,
        epochs=5,
        image_size=32,
        num_classes=10,
        model_width=32,
        matmul_size=2048,
        timing_repeats=20,
        memory_batch=256,
        memory_width=32,
    ),
    "smoke": CommonSizes(
        per_replica_batch=32,
        train_examples=1_024,
        test_examples=256,
        epochs=4,
        image_size=32,
        num_classes=10,
        model_width=8,
        matmul_size=512,
        timing_repeats=3,
        memory_batch=128,
        memory_width=16,
    ),
}


def _lesson_sizes() -> list[tuple[str, object, object, str]]:
    """(name, full, smoke, lesson id) of every size a lesson's manifest declares; a name declared twice, or one that
    is a common size, is an error."""
    from .manifests import LESSONS, ManifestError

    seen = {f.name: "config.CommonSizes" for f in dataclasses.fields(CommonSizes)}
    out = []
    for lesson in LESSONS:
        for name, full, smoke in lesson.sizes:
            if name in seen:
                raise ManifestError(f"lesson {lesson.id}'s manifest declares sizes.{name}, which {seen[name]} has")
            seen[name] = f"lesson {lesson.id}'s manifest"
            out.append((name, full, smoke, lesson.id))
    return out


_LESSON_SIZES = _lesson_sizes()
Sizes = dataclasses.make_dataclass(
    "Sizes",
    [(f.name, f.type) for f in dataclasses.fields(CommonSizes)] + [(n, type(full)) for n, full, _, _ in _LESSON_SIZES],
    frozen=True,
)
Sizes.__module__ = __name__  # (make_dataclass's module= is Python 3.12's): pickles and prints as config.Sizes
Sizes.__doc__ = (
    "Every size a lesson uses, in one mode: :class:`CommonSizes` and each lesson manifest's [sizes] "
    "(``config.get().sizes.block_width``)."
)


def _sizes(mode: str) -> Sizes:
    lesson = {name: (full if mode == "full" else smoke) for name, full, smoke, _ in _LESSON_SIZES}
    return Sizes(**dataclasses.asdict(_COMMON[mode]), **lesson)


FULL_SIZES = _sizes("full")
SMOKE_SIZES = _sizes("smoke")


@dataclasses.dataclass(frozen=True)
class CourseConfig:
    smoke: bool
    cpu_replicas: int
    device: str
    data: str  # "tfds" | "synthetic" | "npz:PATH"
    data_reason: str  # why this data source was chosen, shown to the learner
    sizes: Sizes
    seed: int = 42
    jit: bool = False  # compile the lessons' measured steps with XLA (how a TPU always runs them)
    standin: str = ""  # "gpu" | "tpu": the accelerator's code paths over CPU devices (course_utils.standin)

    @property
    def mode(self) -> str:
        return "smoke" if self.smoke else "full"

    def describe(self) -> str:
        return (
            f"mode={self.mode} (sizes: batch/replica={self.sizes.per_replica_batch}, "
            f"train={self.sizes.train_examples}, epochs={self.sizes.epochs}), "
            f"data={self.data} ({self.data_reason}), cpu_replicas={self.cpu_replicas}, device={self.device}, "
            f"jit={'on (XLA, as on a TPU)' if self.jit else 'off'}"
            + (f", stand-in={self.standin} (its code paths over CPU devices)" if self.standin else "")
        )


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise ConfigError(f"{name}={raw!r} is not a yes/no value. Use {name}=1 (on) or {name}=0 (off).")


def _parse_replicas(raw: str) -> int:
    try:
        n = int(raw.strip())
    except ValueError:
        raise ConfigError(
            f"COURSE_CPU_REPLICAS={raw!r} is not a whole number. Use e.g. COURSE_CPU_REPLICAS=4."
        ) from None
    if not 1 <= n <= MAX_CPU_REPLICAS:
        raise ConfigError(
            f"COURSE_CPU_REPLICAS={n} is out of range: use 1 to {MAX_CPU_REPLICAS} "
            "(4 is plenty to see sharding; more replicas on 2 cores only get slower)."
        )
    return n


def parse_data(raw: str) -> str:
    value = raw.strip()
    if value in ("tfds", "synthetic"):
        return value
    if value.startswith("npz:") and value[4:].strip():
        return "npz:" + os.path.expanduser(value[4:].strip())  # npz:~/cifar10.npz works as in a shell
    raise ConfigError(
        f"COURSE_DATA={raw!r} is not a data source. Use COURSE_DATA=tfds (real CIFAR-10), "
        "COURSE_DATA=synthetic (offline, generated) or COURSE_DATA=npz:/path/to/cifar10.npz "
        "(a pre-downloaded copy)."
    )


def load(env: Mapping[str, str] | None = None) -> CourseConfig:
    """Build the config from environment variables (``env`` defaults to ``os.environ``)."""
    env = os.environ if env is None else env
    smoke = _parse_bool("COURSE_SMOKE", env.get("COURSE_SMOKE", ""))
    cpu_replicas = _parse_replicas(env.get("COURSE_CPU_REPLICAS", "1") or "1")
    device = (env.get("COURSE_DEVICE", "auto") or "auto").strip().lower()
    if device not in DEVICE_CHOICES:
        raise ConfigError(
            f"COURSE_DEVICE={device!r} is not one of {', '.join(DEVICE_CHOICES)}. "
            "Leave it unset to use the fastest device found."
        )
    jit = _parse_bool("COURSE_JIT", env.get("COURSE_JIT", ""))
    standin = (env.get("COURSE_STANDIN", "") or "").strip().lower()
    if standin and standin not in STANDIN_CHOICES:
        raise ConfigError(
            f"COURSE_STANDIN={env['COURSE_STANDIN']!r} is not one of {', '.join(STANDIN_CHOICES)}. "
            "Leave it unset on real hardware: a stand-in runs a GPU's or TPU's code paths over CPU devices."
        )
    if env.get("COURSE_DATA", "").strip():
        data, reason = parse_data(env["COURSE_DATA"]), "set by COURSE_DATA"
    elif smoke:
        data, reason = "synthetic", "smoke mode uses offline data; set COURSE_DATA=tfds for real CIFAR-10"
    else:
        data, reason = "tfds", "default: real CIFAR-10 via tensorflow-datasets"
    return CourseConfig(
        smoke=smoke,
        cpu_replicas=cpu_replicas,
        device=device,
        data=data,
        data_reason=reason,
        sizes=SMOKE_SIZES if smoke else FULL_SIZES,
        jit=jit,
        standin=standin,
    )


_CURRENT: CourseConfig | None = None


def get() -> CourseConfig:
    """The config of this process (read once from the environment, then cached)."""
    global _CURRENT
    if _CURRENT is None:
        _CURRENT = load()
    return _CURRENT


def reload() -> CourseConfig:
    """Re-read the environment (after changing ``os.environ`` in a notebook or test)."""
    global _CURRENT
    _CURRENT = load()
    return _CURRENT
