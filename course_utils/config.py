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
class Sizes:
    """Every size a lesson uses. Smoke sizes keep each notebook under 90 s on 2 CPU cores."""

    per_replica_batch: int  # examples per replica per step (TPUs like 128)
    train_examples: int
    test_examples: int
    epochs: int
    image_size: int  # CIFAR-10 is 32x32x3
    num_classes: int
    model_width: int  # filters of the first conv layer; later layers scale from it
    matmul_size: int  # square matrix side for throughput probes
    timing_repeats: int  # timed repeats after one warm-up; report the median
    # examples per step in memory demos: enough that activations dominate the peak, not the part of a
    # CPU step's peak that does not grow with the batch (conv scratch space, whole allocator blocks)
    memory_batch: int = 128
    # filters of the CNN in memory demos: at width 8 a step's peak (a few MiB of activations) moves by ±20% between
    # processes and repeats, as whole allocator blocks come and go; at 16 it is steady within a few percent
    memory_width: int = 16
    # lesson 06: wall-clock seconds per training run (each recipe, each ablation)
    capstone_budget_s: float = 120.0
    capstone_ablations: int = 4  # lesson 06: how many of its ablations run (each is one budgeted training run)
    # lesson 06 §2: the budgets of the accuracy-against-budget sweep (both recipes each; the run of §2 is reused at its
    # own budget); it trains on real images only
    capstone_sweep_budgets: tuple = (60.0, 120.0, 240.0)
    # lesson 06 §5: fresh processes per precision variant (3 short epochs each); a speed-up needs repeats: five, so
    # that the spread is the middle half (with three it is min-max, and one stalled process made it inconclusive)
    capstone_precision_repeats: int = 5
    # lesson 06 §5-6: training (and test) images of each short command-line run: the precision runs and the
    # kill-and-resume demo (they time epochs and check files, not accuracy)
    capstone_short_run_examples: int = 2048
    # lesson 07: the block net (tokens × width, `block_depth` residual MLP blocks) measured at `block_batch`
    block_width: int = 128
    block_depth: int = 4
    block_tokens: int = 64
    block_batch: int = 64
    # lesson 07: interleaved timing rounds of its fresh-process measurements (each round times every technique,
    # without and with XLA, against the plain step): 7 in full mode; 3 in smoke mode, where the spread is min-max
    isolated_rounds: int = 7
    # lesson 07 §4: fresh processes per LayerNorm variant (each one reading of its peak)
    isolated_processes: int = 3
    # lesson 07: logits rows × classes for the chunked cross-entropy
    logits_rows: int = 2048
    logits_classes: int = 4096
    # lesson 07: the few-bit GELU training run (a small CNN; images from the course's data source)
    gelu_epochs: int = 15
    gelu_width: int = 16
    gelu_train_examples: int = 4096
    gelu_seeds: int = 2  # pairs of runs (exact, few-bit), one per seed: one run's accuracy is noisy
    gelu_test_examples: int = 1024
    # lesson 08: local clusters (one TensorFlow process per task; each start costs seconds, not the model)
    cluster_steps: int = 6  # training steps of the 2-worker runs (the kill-and-resume demo kills after half)
    scaling_workers: tuple = (1, 2, 4)  # the step-time figure
    scaling_steps: int = 20  # steps per timed round (3 rounds)
    ps_steps: int = 20  # steps the parameter-server coordinator schedules
    pipeline_width: int = 512  # the model-parallel MLP: width, layers per stage, batch
    pipeline_layers: int = 4
    pipeline_batch: int = 256
    pipeline_rounds: int = 3


FULL_SIZES = Sizes(
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
    capstone_budget_s=120.0,  # 2 minutes on any hardware
    capstone_sweep_budgets=(60.0, 120.0, 240.0),  # real images only: 4 runs (10 minutes: 2 × 60 s + 2 × 240 s) besides §2's two
    capstone_short_run_examples=2048,  # 16 steps of 128 an epoch; 3 epochs of 4,000 took 45 s per run on one core
    block_width=128,
    block_depth=4,
    block_tokens=64,
    block_batch=64,
    isolated_rounds=7,
    isolated_processes=3,
    logits_rows=2048,
    logits_classes=4096,
    gelu_epochs=15,
    gelu_width=16,
    gelu_train_examples=4096,  # the dev file's size: 15 epochs take about a minute per run on 2 CPU cores
    gelu_seeds=2,
    gelu_test_examples=1024,  # the dev file has 1,017
    cluster_steps=6,
    scaling_workers=(1, 2, 4),
    scaling_steps=50,
    ps_steps=100,
    pipeline_width=512,
    pipeline_layers=4,
    pipeline_batch=1024,  # stages of ~30 ms: a micro-batch's dispatch (~3 ms) does not hide the overlap
    pipeline_rounds=5,
)

SMOKE_SIZES = Sizes(
    per_replica_batch=32,
    train_examples=1_024,
    test_examples=256,
    epochs=4,
    image_size=32,
    num_classes=10,
    model_width=8,
    matmul_size=512,
    timing_repeats=5,
    memory_batch=128,
    memory_width=16,
    capstone_budget_s=4.0,  # one epoch for the ResNet (compiling alone takes longer): the notebook says what that shows
    capstone_ablations=1,  # each run costs ~8 s of compiling and one epoch, and shows nothing at this budget
    capstone_precision_repeats=1,  # one process per variant (~5 s each): the table, not a verdict
    capstone_sweep_budgets=(4.0,),  # §2's own budget: nothing more to train
    capstone_short_run_examples=256,
    block_width=64,
    block_depth=2,
    block_tokens=32,
    block_batch=64,
    isolated_rounds=3,  # §1's cell took 42 s of the notebook's 108 with 5 (2-core AVX2 VM)
    isolated_processes=1,  # one reading per LayerNorm variant (2 fresh processes took 9 s)
    logits_rows=1024,
    logits_classes=2048,
    gelu_epochs=2,
    gelu_width=8,
    gelu_train_examples=512,
    gelu_seeds=1,
    gelu_test_examples=256,
    cluster_steps=6,
    scaling_workers=(1, 2),  # a 4-worker cluster takes ~15 s to start on 2 cores: full mode only
    scaling_steps=10,
    ps_steps=20,
    pipeline_width=384,
    pipeline_layers=3,
    pipeline_batch=192,
    pipeline_rounds=2,
)


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
