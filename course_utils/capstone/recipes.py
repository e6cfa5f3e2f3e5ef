"""The two recipes, one object each (:class:`Recipe`: the course's and the popular tutorial's), and the choices that
follow from the hardware (``steps_per_execution``, XLA, the learning rate for a global batch)."""

from __future__ import annotations

import dataclasses

from .. import hardware, standin
from .models import resnet9, tutorial_cnn
from .options import BASELINE, COURSE, Options, OptionsError
from ..runtime import MULTI_REPLICA_XLA, fit_jit_compile, whole_step_compiles


# steps_per_execution on a TPU (lesson 04 §7: each call into the compiled function costs a host round trip, which a
# TPU's short steps feel most; 32 or more is common there), at most the steps of an epoch. Elsewhere 1: off a TPU a
# step of this ResNet is long next to the call, and under MirroredStrategy more crash (keras#19246).
TPU_STEPS_PER_EXECUTION = 32

# Goyal et al. 2017 scaled linearly to 8k on ImageNet with a 5-epoch warm-up; CIFAR-10 under a minutes budget has
# too few steps for that warm-up, so the course warns from ~1k examples per update
MAX_LR_SCALING_BATCH = 1024

RECIPE_TABLE = [
    {
        "choice": "ResNet-9-style network (conv-BN-ReLU prep, 2 residual blocks, global max pooling)",
        "lesson": "capstone",
        "source": "D. Page, 'How to train your ResNet' (DAWNBench 2018); airbench (K. Jordan 2024)",
    },
    {
        "choice": "with a time budget, the widest network width that still trains 20 epochs (more for budgets over a "
        "minute; timed at width 8, the others predicted, chosen again if the chosen width's timing is off)",
        "lesson": "capstone",
        "source": "capstone.choose_width; lesson 06 §2",
    },
    {
        "choice": "a fixed first convolution that whitens 2×2 patches (its filters computed once from the training "
        "images; learning starts faster)",
        "lesson": "capstone",
        "source": "airbench (K. Jordan 2024); capstone.whitening_kernel",
    },
    {
        "choice": "the s2d stem (the first layers at 16×16 from 2×2 patches, about twice the epochs) where a budget "
        "fits fewer than 10 epochs of the full one on TensorFlow's own kernels (timed before training); --stem sets it",
        "lesson": "capstone",
        "source": "capstone.resnet9(stem=...), capstone.choose_stem, capstone.stem_hint; lesson 06 §2",
    },
    {
        "choice": "precision policy of the hardware (bf16 on TPU/Ampere+/AMX CPUs, fp16 + loss scaling on T4)",
        "lesson": "03",
        "source": "hardware.recommended_policy",
    },
    {
        "choice": "tf.data pipeline: cache → shuffle → batch → augment whole batches → prefetch (one call per batch, "
        "not per image)",
        "lesson": "04",
        "source": "data.build_pipeline(batch_augment_fn=data.augment_batch)",
    },
    {
        "choice": "random crop (pad 4) + horizontal flip, each image its own; per-channel normalization",
        "lesson": "04",
        "source": "data.augment_batch; Page",
    },
    {
        "choice": "a batch of 128 per replica: the global batch is 128 × replicas (auto width on TensorFlow's own CPU "
        "kernels with a budget of 90 s or less: 64, twice the few updates such a budget buys)",
        "lesson": "08",
        "source": "lesson 08 §6; capstone.Recipe.global_batch, capstone.small_batch",
    },
    {
        "choice": "SGD, Nesterov momentum 0.9, decoupled weight decay",
        "lesson": "capstone",
        "source": "Page; Loshchilov & Hutter 2019 (decoupled weight decay)",
    },
    {"choice": "label smoothing 0.2", "lesson": "capstone", "source": "Szegedy et al. 2016; airbench"},
    {
        "choice": "warm-up then linear decay to zero, stretched to end at the budget",
        "lesson": "capstone",
        "source": "Page (one-cycle); budgeted training (Li et al. 2020)",
    },
    {
        "choice": f"peak LR linear in the global batch ({COURSE['lr_per_256']:g} per 256: 4× Page's, for budgets of a few "
        "hundred updates; warned above ~1k)",
        "lesson": "capstone, 08",
        "source": "Goyal et al. 2017; Page; capstone.peak_learning_rate",
    },
    {
        "choice": "test-time augmentation: the mean over each image and its mirror, each also shifted one pixel "
        "diagonally (10 views); under a time budget only as many views as fit in 5% of it (10, 2 or 1)",
        "lesson": "capstone",
        "source": "Page; airbench; capstone.tta_views, capstone.FINAL_EVAL_SHARE",
    },
    {"choice": "optional EMA of the weights (SGD use_ema)", "lesson": "capstone", "source": "Page; Keras optimizers"},
    {
        "choice": "optional gradient accumulation (--accumulate K)",
        "lesson": "05",
        "source": "accumulation.AccumulatingModel",
    },
    {
        "choice": f"steps_per_execution: {TPU_STEPS_PER_EXECUTION} steps per call on a TPU, 1 elsewhere",
        "lesson": "04",
        "source": "Keras compile(); capstone.choose_steps_per_execution",
    },
    {"choice": "BackupAndRestore + best checkpoint; --resume", "lesson": "capstone", "source": "Keras callbacks"},
]


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One recipe: its defaults for the options left at None, its precision policy, model and optimizer."""

    name: str
    batch_size: int  # per replica when per_replica_batch, else global
    per_replica_batch: bool  # the global batch grows with the replicas (course) or stays as written (baseline)
    augment: bool
    label_smoothing: float
    schedule: str
    tta: bool
    whiten: bool  # a fixed 2×2 patch-whitening first convolution (course)
    sized_by_width: bool  # --width applies (and auto width with a budget)
    # the options that shape this recipe's network (the course's ResNet); validate refuses them for a recipe whose
    # network is fixed (the tutorial's CNN), where they would change nothing
    network_options: tuple[str, ...] = ()

    def fill_defaults(self, o: Options) -> Options:
        o = dataclasses.replace(o)
        for name in ("augment", "label_smoothing", "schedule", "tta", "whiten"):
            if getattr(o, name) is None:
                setattr(o, name, getattr(self, name))
        if o.batch_size is None and not self.per_replica_batch:
            o.batch_size = self.batch_size
        if o.ema is None:
            o.ema = False
        return o

    def global_batch(
        self,
        asked: int | None,
        replicas: int,
        accumulate: int = 1,
        train_images: int | None = None,
        per_replica: tuple[int, str] | None = None,
    ) -> tuple[int, str]:
        """``(global batch per update, why)``. ``asked`` (``--batch-size``) is the global batch as given. Else the
        baseline keeps its global batch (the tutorial's, on any number of replicas), and the course recipe gives
        each replica :attr:`batch_size` (128) — so the global batch, and with it the peak learning rate
        (:func:`peak_learning_rate`), grows with the replicas: 128 on one, 1,024 on a v5e-8 (lesson 08 §6). Only
        where that global batch is larger than ``train_images`` (an epoch would have no whole step) is the
        per-replica batch halved until one step fits, and the reason says so. ``per_replica``: ``(images, why)`` in
        place of :attr:`batch_size` (auto width's :func:`~course_utils.capstone.plan.small_batch`)."""
        if asked is not None:
            return asked, "--batch-size"
        if not self.per_replica_batch:
            return self.batch_size, f"the {self.name} recipe's, on any number of replicas"
        first, per_why = per_replica or (self.batch_size, "")
        per = first
        while (
            train_images is not None and per * replicas > train_images and per % 2 == 0 and (per // 2) % accumulate == 0
        ):
            per //= 2
        why = f"{per} per replica × {replicas} replica{'s' if replicas != 1 else ''}"
        if per_why:
            why += f" ({per_why})"
        if per != first:
            why += f" ({first} per replica would make one step larger than the {train_images} training images)"
        return per * replicas, why

    def choose_policy(self, rt) -> tuple[str, str]:  # pragma: no cover - each recipe says
        raise NotImplementedError

    def peak_learning_rate(self, global_batch: int) -> float:  # pragma: no cover
        raise NotImplementedError

    def learning_rate_rule(self) -> str:  # pragma: no cover - how peak_learning_rate scales, in words
        raise NotImplementedError

    def model(self, width: int, mean, variance, whiten=None, stem: str = "full"):  # pragma: no cover - whiten: a
        # whitening_kernel; stem: models.STEMS
        raise NotImplementedError

    def optimizer(self, schedule, ema: bool):  # pragma: no cover
        raise NotImplementedError


class _Course(Recipe):
    def choose_policy(self, rt) -> tuple[str, str]:
        policy, why = hardware.recommended_policy(rt)
        if rt.kind == "CPU" and policy == "mixed_bfloat16":
            path, kernels_why = hardware.kernel_path()  # which CPU kernels TensorFlow runs here, and why
            if path == "eigen":
                # measured on a 2-core AVX512-BF16 CPU: 207 ms a step under mixed_bfloat16, 38 ms under float32
                return "float32", (
                    f"CPU kernels eigen ({kernels_why}): TensorFlow's own kernels run bfloat16 several "
                    "times slower than float32"
                )
            if path == "onednn-fp32":
                return "float32", f"CPU kernels onednn-fp32 ({kernels_why}): no bfloat16 units, float32 is faster"
            return "mixed_bfloat16", f"CPU kernels onednn-bf16 ({kernels_why})"
        return policy, why

    def peak_learning_rate(self, global_batch: int) -> float:
        return peak_learning_rate(global_batch)

    def learning_rate_rule(self) -> str:
        return f"the linear rule: {COURSE['lr_per_256']:g} per 256 examples per update"

    def model(self, width, mean, variance, whiten=None, stem="full"):
        return resnet9(width, mean=mean, variance=variance, whiten=whiten, stem=stem)

    def optimizer(self, schedule, ema):
        import keras

        return keras.optimizers.SGD(
            schedule, momentum=COURSE["momentum"], nesterov=True, weight_decay=COURSE["weight_decay"], use_ema=ema
        )


class _Baseline(Recipe):
    def choose_policy(self, rt) -> tuple[str, str]:
        return "float32", "baseline: float32, as the tutorial"

    def peak_learning_rate(self, global_batch: int) -> float:
        return BASELINE["learning_rate"] * global_batch / BASELINE["batch_size"]

    def learning_rate_rule(self) -> str:
        return f"Adam's {BASELINE['learning_rate']:g} at the tutorial's {BASELINE['batch_size']}, linear in the batch"

    def model(self, width, mean, variance, whiten=None, stem="full"):
        return tutorial_cnn()

    def optimizer(self, schedule, ema):
        import keras

        return keras.optimizers.Adam(schedule, use_ema=ema)


RECIPES: dict[str, Recipe] = {
    "course": _Course(
        "course",
        batch_size=COURSE["batch_size"],
        per_replica_batch=True,
        augment=True,
        label_smoothing=COURSE["label_smoothing"],
        schedule="onecycle",
        tta=True,
        whiten=True,
        sized_by_width=True,
        network_options=("width", "stem", "whiten"),
    ),
    "baseline": _Baseline(
        "baseline",
        batch_size=BASELINE["batch_size"],
        per_replica_batch=False,
        augment=False,
        label_smoothing=0.0,
        schedule="constant",
        tta=False,
        whiten=False,
        sized_by_width=False,
    ),
}


def resolved(o: Options) -> Options:
    """A copy of ``o`` with every recipe default filled in that the hardware does not decide. Left None until
    :func:`train` knows the replicas and the data: the course recipe's ``batch_size`` (per replica: see
    :meth:`Recipe.global_batch`) and ``steps_per_execution`` (:func:`choose_steps_per_execution`)."""
    return RECIPES[o.recipe].fill_defaults(o)


def choose_steps_per_execution(asked: int | None, kind: str, replicas: int, steps_per_epoch: int) -> tuple[int, str]:
    """``(steps_per_execution, why)``: ``asked`` (``--steps-per-execution``) as given; on a TPU
    :data:`TPU_STEPS_PER_EXECUTION`, at most an epoch's steps (lesson 04 §7: a call into the compiled function costs
    a host round trip, and a TPU's steps are short); elsewhere 1 — a CPU or GPU step of this ResNet is long next to
    the call, and under MirroredStrategy with several replicas ``fit`` with more crashes ("You must feed a value for
    placeholder tensor", keras-team/keras#19246; lesson 04 §7 measures it)."""
    if asked is not None:
        return asked, "--steps-per-execution"
    if kind == "TPU" and replicas > 1 and standin.active() == "tpu":
        return 1, (
            f"TPU stand-in: its {replicas} cores run on MirroredStrategy, where fit with more than 1 "
            f"crashes (keras-team/keras#19246); a TPU takes {TPU_STEPS_PER_EXECUTION}"
        )
    if kind == "TPU":
        n = max(1, min(TPU_STEPS_PER_EXECUTION, steps_per_epoch))
        bound = f", bounded by the {steps_per_epoch} steps of an epoch" if n < TPU_STEPS_PER_EXECUTION else ""
        return n, f"TPU: {n} steps per call into the compiled function, one host round trip for them all{bound}"
    if replicas > 1:
        return 1, (
            f"{replicas} replicas under MirroredStrategy: fit with more than 1 crashes there (keras-team/keras#19246)"
        )
    return 1, f"{kind}: a step of this ResNet is long next to a call, so several per call pay off only on a TPU"


# On TensorFlow's own kernels (Eigen) XLA runs the same Eigen convolutions and fuses the batch norms, ReLUs and adds
# around them: the course's ResNet-9 (width 4, 64 per replica, float32) trained 1,240 images/s with XLA and 910
# without on one core of an AMX Xeon, and 60 s budgets ended 3 points higher there despite ~3.5 s of compiling (dev
# images, 2026-12-03; measurements/2026-11-28-capstone-kernel-paths); lesson 06 §5 had measured XLA off at 0.77× of
# on (an AVX-512 EPYC). On oneDNN XLA gives up oneDNN's convolutions: 0.53× (prove --jit, 2 cores)
EIGEN_XLA = "XLA fuses the step's elementwise ops around the same Eigen convolutions: its epochs run ~1.3× faster"


def eigen_xla_measured(platform: str | None = None, machine: str | None = None) -> bool:
    """Whether :data:`EIGEN_XLA` was measured on this platform: x86-64 Linux (not macOS, not Arm)."""
    import platform as _platform
    import sys

    platform = sys.platform if platform is None else platform
    machine = (_platform.machine() if machine is None else machine).lower()
    return platform.startswith("linux") and machine in ("x86_64", "amd64")


def choose_jit(
    o: Options, kind: str, course_jit: bool = False, replicas: int = 1, kernels: str | None = None
) -> tuple[bool, bool, str]:
    """``(jit_compile, compiled, why)``: what to pass Keras' ``compile(jit_compile=...)``, whether the step really
    runs under XLA, and why. Keras resolves ``jit_compile="auto"`` to False whenever the model was built under a
    tf.distribute strategy (keras/src/trainers/trainer.py, "Disable XLA with tf.distribute") — as the trainer's is on
    several replicas and a TPU, not on one device (:func:`_fit_strategy`) — and on a machine without an accelerator,
    so the choice is made here, explicitly, the same wherever the trainer runs:

    - ``--jit`` / ``--no-jit`` (``Options.jit``): as asked;
    - TPU: TPUStrategy compiles every step with XLA whatever Keras is told (nothing to choose);
    - ``COURSE_JIT=1``: on, as every lesson's measured steps;
    - GPU: on — XLA fuses the step's elementwise ops (BN, ReLU, casts) into the convolutions' neighbours;
    - CPU on TensorFlow's own kernels (``kernels`` ``"eigen"``), one replica, x86-64 Linux, no ``--accumulate``: on
      — XLA calls the same Eigen convolutions and fuses the step's elementwise ops around them (:data:`EIGEN_XLA`;
      an accumulated step under XLA ran more than ten times slower on a CPU: lesson 06 §5);
    - any other CPU: off — oneDNN's convolutions are faster than the Eigen ones XLA would hand them to (lesson 06 §5
      measures it)."""
    if o.jit and not whole_step_compiles(kind, replicas):
        raise OptionsError(
            f"--jit fails on {replicas} replicas: {MULTI_REPLICA_XLA}; leave --jit out (fit then runs "
            "without XLA) or train on one replica (--cpu-replicas 1)"
        )
    if o.jit is not None:
        return bool(o.jit), bool(o.jit) or kind == "TPU", "chosen with --jit" if o.jit else "chosen with --no-jit"
    jit, compiled, why = fit_jit_compile(kind, course_jit, replicas)  # the rule every lesson's fit follows
    if not compiled and replicas <= 1 and kernels == "eigen":
        if o.accumulate > 1:
            return (
                jit,
                compiled,
                (
                    "CPU kernels eigen with --accumulate: an accumulated step under XLA ran more than ten times slower "
                    "on a CPU (lesson 06 §5); --jit to try"
                ),
            )
        if eigen_xla_measured():
            return True, True, f"CPU kernels eigen: {EIGEN_XLA}; --no-jit to compare"
        return jit, compiled, "CPU kernels eigen: XLA sped this step up on x86 Linux, not measured here; --jit to try"
    if not compiled and replicas <= 1:  # a CPU on oneDNN: lesson 06 measured it for this model
        why = "CPU with oneDNN: XLA would run this step's convolutions on slower kernels (lesson 06 §5 measures it)"
    return jit, compiled, why


def peak_learning_rate(global_batch: int, lr_per_256: float = COURSE["lr_per_256"]) -> float:
    """The linear scaling rule: the peak LR grows in proportion to the global batch (per update).

    Twice the batch averages the gradient over twice the examples, halving its noise; taking twice the step
    keeps the distance travelled per epoch the same (Goyal et al. 2017). It holds while the step is small
    next to the curvature: beyond roughly 1k examples per update (and without warm-up) it breaks down,
    so the trainer warns above :data:`MAX_LR_SCALING_BATCH`. Accumulation counts: the batch here is the
    batch per *update* (micro-batch × K × replicas)."""
    return lr_per_256 * global_batch / 256
