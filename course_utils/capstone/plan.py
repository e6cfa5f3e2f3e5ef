"""The budget arithmetic, without TensorFlow: how wide a network and how many epochs fit a time budget
(:func:`choose_width`), and :class:`BudgetPlan`, which keeps a run within its budget as epochs are measured."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, ClassVar

from .options import COURSE, MAX_SCHEDULE_STEPS, STEMS, is_int


# Auto width (the course recipe with a time budget and no --width): the widest base width in `widths` that the
# budget still trains for `target_epochs` epochs. Measured on real CIFAR-10 images (3,661 training images), 60 s:
# one core, widths 4 / 6 / 8 / 12 / 16 trained 36 / 25 / 21 / 13 / 9 epochs to 64.0 / 69.1 / 68.6 / 67.3 / 61.6%;
# 2 cores, widths 8 / 12 / 16: 29 / 19 / 15 epochs, 71.9 / 69.4 / 69.9%. The warm-up times the `start` width only;
# another width's epoch is predicted (predicted_epoch_s): the convolutions' work grows as the width squared
# (resnet9_macs), and a share `fixed_share` of the start width's epoch does not grow with it (the input pipeline,
# each step's calls, the epoch's checkpoints; 0.5–0.7 fitted to the epoch times above).
# Longer budgets want more epochs as well as a wider net: the target grows as the square root of the budget beyond
# `target_budget_s` (target_epochs_for). 600 s, 2 cores, fixed widths: 32 / 48 / 64 trained 75 / 44 / 28 epochs to
# 79.0 / 78.6 / 77.4% (flip TTA); the target of 63 there chooses 32.
AUTO_WIDTH = dict(
    widths=(4, 6, 8, 12, 16, 24, 32, 48, 64),
    start=8,
    target_epochs=20,
    target_budget_s=60.0,
    target_growth=0.5,
    fixed_share=0.6,
    start_by_kernels={"eigen": 4},
)

# `start_by_kernels`: the width the warm-up times first on a CPU kernel path where `start` is too wide to be kept. On
# TensorFlow's own kernels (`eigen`) a 60 s budget chose width 4 from width 8's timing on one core and on two, and
# compiling width 8 only to drop it cost the first epoch 4-5 s on one core (14.1 s from process start, 23% of it)


def start_width(kernels: str | None, rule: dict = AUTO_WIDTH) -> int:
    """The width auto width times first: ``rule["start_by_kernels"]`` for this CPU kernel path when it is one of
    ``rule["widths"]``, else ``rule["start"]``."""
    width = rule.get("start_by_kernels", {}).get(kernels)
    return width if width in rule["widths"] else rule["start"]


# The per-replica batch auto width trains with where a budget buys few updates: `per_replica` images instead of the
# recipe's 128 on the `kernels` paths, with a budget of at most `up_to_s`. On TensorFlow's own kernels (`eigen`) a 60 s
# budget bought width 4 only 392-616 updates of 128; halving the batch doubles the updates per epoch, and lifted the
# validation accuracy from a median 60.8 to 63.0% on one core (6 runs each) and from 63.4 to 65.6% on two (3 each); at
# 120 s (900-980 updates) it lowered it, 69.0 to 63.9% on one core (dev images, 2026-12-02). The peak learning rate
# follows the batch (the linear rule)
SMALL_BATCH = dict(kernels=("eigen",), per_replica=64, up_to_s=90.0)


def small_batch(kernels: str | None, budget_s: float | None, rule: dict = SMALL_BATCH) -> int | None:
    """The per-replica batch auto width trains with on CPU kernel path ``kernels`` under a ``budget_s`` budget:
    ``rule["per_replica"]`` on ``rule["kernels"]`` with a budget of at most ``rule["up_to_s"]``, else None (the
    recipe's own)."""
    if kernels in rule["kernels"] and budget_s is not None and budget_s <= rule["up_to_s"]:
        return rule["per_replica"]
    return None


# The stem (models.resnet9's `stem`): `--stem s2d` runs prep and layer1's first convolution at 16×16 from 2×2 patches.
# A train step on TensorFlow's own kernels (one core, width 4, 64 per replica): 111 ms with the full stem, 54 with s2d,
# 80 for the tutorial's CNN (an AVX2 EPYC); 116 and 66 ms on an AMX Xeon. On the dev images' validation split, Eigen,
# 60 s, medians of 3 unless said (2026-12-02): where the full stem fit 4-9 epochs s2d trained about twice as many and
# read higher — an AMX Xeon (family 6), one core: 54.5 vs 49.9 (4-6 → 10-12 epochs), two: 55.3 vs 54.5 (7-8 → 9-13);
# an AVX2 EPYC (two runs each): +2 to +4 (6-9 → 13-17); where it fit 11-20 s2d read lower — an AVX-512 EPYC, one
# core: 60.4 vs 62.4, two: 62.2 vs 62.7; the AVX2 EPYC at 120 s (15-23 epochs) tied or lost. So with auto width and no
# --stem, on the `kernels` paths, the trainer predicts the full stem's epochs before it builds the network to train:
# an eager forward pass of `probe_images` training images through the start width's network, the fastest of `probes`
# (one alone read 2× slow in 1 of 4 runs on one core of an AMX Xeon, 2026-12-03), after one of `warm_images` that
# builds it (0.1-0.15 s each on one core of the AMX Xeon), times `epoch_per_forward` (a later epoch's
# train and validation seconds over the forward pass's per training image: 1.87 and 2.03 on one core, 2.10 and 1.31 on
# two there, width 4, 60 s), into the budget left less `first_epoch_extra_s` (the first epoch's compiling and filling
# the cache: 3.0-5.5 s there) and the final evaluation's share, and takes s2d where fewer than `few_epochs` fit
# (choose_stem). Elsewhere the plan's line names --stem s2d where the narrowest width fits fewer than FEW_EPOCHS
# (stem_hint): s2d was not measured on oneDNN
FEW_EPOCHS = 10
AUTO_STEM = dict(
    kernels=("eigen",),
    few_epochs=FEW_EPOCHS,
    probe_images=128,
    probes=3,
    warm_images=8,
    epoch_per_forward=1.9,
    first_epoch_extra_s=5.0,
    # the same with the step compiled by XLA (recipes.EIGEN_XLA: the eager probe is not), its first epoch compiling
    # it: 1.26 (3.2 s epochs after 0.69 ms per image; one core of the AMX Xeon, width 4, 60 s), 4.6 s of compiling
    epoch_per_forward_xla=1.3,
    first_epoch_extra_s_xla=8.0,
)


def auto_stem_applies(kernels: str | None, auto_width: bool, stem: str | None, rule: dict = AUTO_STEM) -> bool:
    """Whether the trainer chooses the stem (:func:`choose_stem`): auto width, no ``--stem``, on a CPU kernel path in
    ``rule["kernels"]``."""
    return auto_width and stem is None and kernels in rule["kernels"]


def choose_stem(
    forward_s_per_image: float,
    train_images: int,
    budget_s: float,
    elapsed_s: float,
    rule: dict = AUTO_STEM,
    xla: bool = False,
) -> tuple[str, int, str]:
    """``(stem, predicted epochs, why)``: ``"s2d"`` where fewer than ``rule["few_epochs"]`` epochs of the full stem
    are predicted to fit what is left of ``budget_s`` after ``elapsed_s`` — an epoch ``forward_s_per_image`` ×
    ``rule["epoch_per_forward"]`` × ``train_images``, the first one ``rule["first_epoch_extra_s"]`` longer, the final
    evaluation's share kept — else ``"full"``. With ``xla`` (the step compiled: the eager probe is not) the
    ``_xla`` figures: a shorter epoch, a longer first one."""
    suffix = "_xla" if xla else ""
    epoch_s = forward_s_per_image * rule["epoch_per_forward" + suffix] * train_images
    left = budget_s * (1 - FINAL_EVAL_SHARE) - elapsed_s - rule["first_epoch_extra_s" + suffix]
    epochs = max(0, int(left // epoch_s)) if epoch_s > 0 else rule["few_epochs"]
    seen = (
        f"a forward pass took {forward_s_per_image * 1e3:.2f} ms per image: about {epochs} epochs of the full stem fit"
    )
    if epochs < rule["few_epochs"]:
        return "s2d", epochs, f"auto stem: {seen}, fewer than {rule['few_epochs']}; s2d trains about twice as many"
    return "full", epochs, f"auto stem: {seen}"


def stem_hint(width: int, epochs: int, stem: str, rule: dict = AUTO_WIDTH, few: int = FEW_EPOCHS) -> str | None:
    """The plan line's hint for auto width's ``width`` planned for ``epochs`` with ``stem``: ``--stem s2d`` where
    the narrowest of ``rule["widths"]`` fits fewer than ``few`` epochs with the full stem, else None."""
    if stem == "full" and width == min(rule["widths"]) and epochs < few:
        return (
            f"only {epochs} epoch{'s' * (epochs != 1)} of the narrowest network fit: --stem s2d runs its first "
            "layers at 16×16 and trains about twice as many, which read 1-5 validation points higher where 4-9 "
            "fit on TensorFlow's own kernels (lesson 06 §2)"
        )
    return None


# When the chosen width is timed too and its epoch is off the prediction by more than this factor (either way), the
# width is chosen again from the two timed widths (epoch = a + b·MACs through them, width_model), and timed again if
# planning still has room. The one-width prediction can be far off: on the 2-core AMX CPU width 48 was predicted at
# 27.5 s/epoch and measured at 12.6 s; on an H200 (Keras on JAX, measurements/2026-11-26-h200-keras-jax) width 64's
# epoch took 0.81 s where width 8's took 0.68 s
RECHOOSE_OFF_BY = 1.25

# Test-time augmentation (the course recipe): the mean prediction over each test image and its mirror, each also
# shifted by one pixel in these directions: 10 views. On the dev images (real CIFAR-10, 1,017 test images) it beat the
# mirror alone by +0.2 to +2.9 points (median +1.0; five 60 s runs and one 600 s, 2 cores); shifts of 2 pixels scored
# within a point of one pixel's (+0.6 on average at 60 s, -0.5 at 600 s)
TTA_SHIFTS = ((1, 1), (1, -1), (-1, 1), (-1, -1))

TTA_VIEWS = 2 * (1 + len(TTA_SHIFTS))

# With a time budget the views are sized to it: the most of TTA_CHOICES (all ten; each image and its mirror; the
# image alone) whose final evaluation is estimated within FINAL_EVAL_SHARE of the budget. With all ten views, a 60 s
# budget on one core of TensorFlow's own kernels kept 10.3 s of 60 for the final evaluation (1.7 epochs of training).
# The mirror alone added a median +1.5 points (-1.5 to +4.7, mean +1.3) over the plain images on the dev images'
# validation split, in 34 runs of 6-30 epochs (widths 4 and 8, one core, TensorFlow's kernels, 2026-11-28)
TTA_CHOICES = (TTA_VIEWS, 2, 1)

FINAL_EVAL_SHARE = 0.05

# At most this share of a time budget goes to starting up and planning (from the process's start to the first epoch:
# Python, TensorFlow's import, the data, the model, compiling and timing warm-up steps): the first warm-up runs only
# where it is expected to fit in it (WARM_UP_PER_START_UP), the chosen width is warmed up too only when that fits
# (else its first epoch compiles it, and the plan is corrected after each epoch), and a budget the first warm-up
# overran all the same is told so up front
PLANNING_SHARE = 0.10

PLANNING_MARGIN = 1.25  # another width's warm-up, estimated from the last one's, must fit with this factor

# A warm-up (compiling training and evaluation, timing a few steps, putting the weights back) took up to this share of
# the start-up before it — Python, TensorFlow's import, the model: both are mostly Python on one thread (loading the
# data is left out: a download says nothing of it). 0.48-0.78 from process start on a 2-core AMD EPYC VM (TF 2.20; one
# core and two, every kernel path, 60 s budgets, 2026-12-02). Where start-up plus this much would pass PLANNING_SHARE
# of the budget, there is no separate warm-up: the start width trains at once, and its first epoch's own steps set the
# plan (BudgetPlan.plan_in_first_epoch; the trainer's warm_up_fits decides). With a warm-up first, the first epoch
# had started at 5.3-6.9 s of 60 (10-12%), and a width other than the start width was chosen in 3 of 18 runs. On one
# core of an AMX Xeon VM (oneDNN in float32, two runs side by side, 2026-12-03) the warm-up took 0.93 and 1.03 × the
# start-up, and building the width it chose 0.1-0.3 s more: at 0.8 the first epoch started at 6.1-6.5 s of 60
WARM_UP_PER_START_UP = 1.1

# … where the step compiles with XLA on a CPU (TensorFlow's own kernels: recipes.EIGEN_XLA), whose compiling takes
# longer than the start-up before it: 4.6 s after ~4 s of start-up on one core of an AMX Xeon (TF 2.20, width 4),
# ~4 s after ~3 s on two (2026-12-03)
WARM_UP_PER_START_UP_XLA = 1.5

# Steps the warm-up times after its compiling one (fewer on a TPU, whose calls run steps_per_execution each): 6 cost
# 0.4 s of a 60 s budget on one core at width 8; the plan is corrected after each epoch anyway
WARM_UP_STEPS = 6

# … and for at least this long, up to an epoch: 6 short steps (the baseline's 12.5 ms on 2 cores) timed 30% slower
# than its epochs then ran (53 epochs planned, 77 trained at 60 s)
WARM_UP_MIN_S = 0.5

# The validation split: held out of the training images, the same ones for every run on the same data (its own
# seed), the usual 45,000 / 5,000 on CIFAR-10's 50,000
VALIDATION_FRACTION = 0.1

MAX_VALIDATION = 5_000

VALIDATION_SEED = 20_240_101


def resnet9_macs(width: int, stem: str = "full") -> int:
    """Multiply-accumulates of :func:`resnet9`'s convolutions per 32×32 image: 9·(3·1024·w + 10,240·w²) (width 8:
    6.1 M, 16: 24 M, 64: 380 M); the whitening convolution adds about 9·9·1024·w + 0.15 M (width 8: +0.8 M), left
    out: the width choice needs the growth, not the count. ``stem="s2d"``: 9·(3·256·w + 8,704·w²) (layer1's first
    convolution and prep, without whitening, at 16×16). The width choice grows epochs by the full stem's count: from
    width 4 to 64 the s2d count grows 5% more, within what the re-choice from a second timed width corrects."""
    if stem == "s2d":
        return 9 * (3 * 256 * width + 8_704 * width * width)
    return 9 * (3 * 1024 * width + 10_240 * width * width)


def predicted_epoch_s(epoch_s: float, width: int, at: int, fixed_share: float = AUTO_WIDTH["fixed_share"]) -> float:
    """An epoch's seconds at ``width``, from ``epoch_s`` measured at width ``at``: a ``fixed_share`` of it stays, the
    rest scales with :func:`resnet9_macs`."""
    return epoch_s * (fixed_share + (1 - fixed_share) * resnet9_macs(width) / resnet9_macs(at))


def width_model(timed: dict[int, float], fixed_share: float = AUTO_WIDTH["fixed_share"]) -> Callable[[int], float]:
    """Epoch seconds at any width, from the epochs timed at some widths (``{width: seconds}``): a timed width's own;
    with one timed width :func:`predicted_epoch_s`; with two or more the line ``a + b·resnet9_macs(width)`` through
    the narrowest and the widest of them, with ``a, b ≥ 0`` (on a GPU a wider net may take no longer: ``b = 0``; work
    growing faster than the MACs: the line through zero and the widest)."""
    timed = dict(timed)
    if len(timed) == 1:
        ((at, epoch_s),) = timed.items()
        return lambda width: timed.get(width, predicted_epoch_s(epoch_s, width, at, fixed_share))
    lo, hi = min(timed), max(timed)
    slope = max((timed[hi] - timed[lo]) / (resnet9_macs(hi) - resnet9_macs(lo)), 0.0)
    base = timed[lo] - slope * resnet9_macs(lo)
    if base < 0:
        base, slope = 0.0, timed[hi] / resnet9_macs(hi)
    return lambda width: timed.get(width, base + slope * resnet9_macs(width))


def target_epochs_for(budget_s: float | None, rule: dict = AUTO_WIDTH) -> int:
    """The epochs auto width aims at for a budget: ``rule["target_epochs"]`` up to ``rule["target_budget_s"]``, then
    growing as ``(budget / target_budget_s) ** target_growth`` (20, 28 at 120 s, 63 at 600 s, 155 at an hour)."""
    if budget_s is None:
        return rule["target_epochs"]
    return round(rule["target_epochs"] * max(1.0, budget_s / rule["target_budget_s"]) ** rule["target_growth"])


def choose_width(
    epoch_s: float,
    at: int,
    left_s: float,
    rule: dict = AUTO_WIDTH,
    timed: dict[int, float] | None = None,
    budget_s: float | None = None,
) -> tuple[int, float, int]:
    """Auto width: ``(width, predicted epoch seconds, epochs)`` — the widest of ``rule["widths"]`` whose predicted
    epochs in ``left_s`` seconds reach the target (:func:`target_epochs_for` the whole ``budget_s``); the narrowest
    when none does. ``epoch_s`` is the epoch the warm-up measured at width ``at``; ``timed``: other widths' measured
    epochs (:func:`width_model`)."""
    widths = sorted(rule["widths"])
    predict = width_model({**(timed or {}), at: epoch_s}, rule["fixed_share"])
    target = target_epochs_for(budget_s, rule)
    best = None
    for width in widths:
        e = predict(width)
        n = BudgetPlan.epochs_in(left_s, e)
        if best is None or n >= target:
            best = (width, e, n)
    return best


def tta_views_for(view_s: float, budget_s: float | None, fixed_s: float = 0.0, share: float = FINAL_EVAL_SHARE) -> int:
    """The test-time views the final evaluation can afford: without a budget all :data:`TTA_VIEWS`; with one the most
    of :data:`TTA_CHOICES` whose ``views × view_s + fixed_s`` (an estimate with its margins) is at most ``share`` of
    the budget, at least one."""
    if budget_s is None:
        return TTA_VIEWS
    for views in TTA_CHOICES:
        if views * view_s + fixed_s <= share * budget_s:
            return views
    return 1


def validation_size(n_train_images: int, requested: int | None = None) -> int:
    """How many of ``n_train_images`` the validation split holds: as requested, else :data:`VALIDATION_FRACTION`
    (at least 1, at most :data:`MAX_VALIDATION`)."""
    if requested is not None:
        return int(requested)
    return max(1, min(MAX_VALIDATION, round(VALIDATION_FRACTION * n_train_images)))


@dataclasses.dataclass
class BudgetPlan:
    """How many epochs the run trains, the learning-rate schedule's length, and — with a time budget — every
    estimate and margin that chose them. Saved as ``plan.json`` (a resumed run keeps it).

    With a budget: the warm-up's step times give an epoch's time (training + validation + :attr:`EPOCH_MIN_S`) and
    the final evaluation's (the test split, :data:`TTA_VIEWS` times with TTA, each × :attr:`FINAL_EVAL_SAFETY` +
    :attr:`FINAL_EVAL_VIEW_S`, + :attr:`FINAL_EVAL_MIN_S`); the epochs are the whole ones that fit in what is left.
    After the first epoch the final evaluation's time is measured (:meth:`final_eval_from_view`), and after every
    epoch :meth:`replan` refits the rest at the epoch time measured since."""

    # Margins (seconds or epochs), each with its reason
    # The final evaluation predicts each view of the test split once, cold: per image it took 1.0-2.3× the warm-up's
    # evaluation step (median 1.5; widths 6, 8, 16 on one core, 2 cores and AVX2, dev images, 10 views)
    FINAL_EVAL_SAFETY: ClassVar[float] = 1.6
    FINAL_EVAL_MIN_S: ClassVar[float] = 0.5  # + fixed costs of predict (softmax, copying to NumPy; compiling it is
    # estimated on its own: predict_compile_estimate_s)
    FINAL_EVAL_VIEW_S: ClassVar[float] = 0.05  # + each view's own predict call (setting it up, shifting and padding)
    # After the first epoch the final evaluation's estimate is measured instead: predict is compiled (the final
    # evaluation reuses it) and a view of the test split timed twice, and once more half-way; the fastest counts
    # (:meth:`final_eval_from_view`)
    VIEW_SAFETY: ClassVar[float] = 1.25  # the final evaluation's views took 0.77-1.46× the fastest of two each
    # (median 1.0; 60, 120 and 600 s runs, 2 cores, one core, AVX2, dev images)
    VIEW_MIN_S: ClassVar[float] = 0.1  # + making the shifted views, averaging them
    EPOCH_MIN_S: ClassVar[float] = 0.3  # an epoch's costs beyond its timed steps (callbacks, saving the backup)
    # An epoch may start if it ends at most a quarter epoch past the budget: what is left of an epoch is the margin
    # for what no estimate foresees (a shared machine stalls for seconds now and then; measured: 2-core VMs, 2026).
    LATE_TOLERANCE: ClassVar[float] = 0.25
    ROUND_UP: ClassVar[float] = 0.25  # a quarter epoch over still counts as fitting ("within one epoch")
    # grow only when more than this many epochs' time would go unused (a run ends within one epoch of its budget, on
    # the early side too: lesson 06's budget claim) …
    GROW_AFTER: ClassVar[float] = 0.75  # (less than an epoch: the estimates' errors need room within it)
    GROW_FRACTION: ClassVar[float] = 0.1  # … and more than this share of the time left
    # … and shrink only when it would end more than this share of the time left late (and a quarter epoch): far from
    # the end the mean epoch jitters by a few per cent, which over 40 short epochs is more than one epoch (the
    # baseline, 0.7 s epochs on 2 cores: re-planned 79 → 77 → 74 → 72 → 77 → 76 … in one run)
    SHRINK_FRACTION: ClassVar[float] = 0.05
    NO_GROW_LAST: ClassVar[int] = 2  # never grow in the last epochs: the LR has (almost) decayed to zero
    RECENT_EPOCHS: ClassVar[int] = 5  # replan at the mean of the last few epochs (the first left out) …
    # … and of more while those took less than this: the baseline's 0.7-0.9 s epochs (2 cores) moved the mean of five
    # by ±10%, and its plan by 10 epochs each way, several times in a run
    RECENT_S: ClassVar[float] = 10.0

    options: dict
    steps_per_epoch: int
    policy: str
    width: int | None
    epochs: int
    initial_epochs: int
    warmup_steps: int
    budget_s: float | None = None
    # the global batch the run derived (the recipe's per replica × the replicas, or --batch-size); ``options`` holds
    # what was asked. None: a plan from before it was kept here (its options hold the derived batch then)
    global_batch: int | None = None
    epoch_estimate_s: float = 0.0
    final_eval_estimate_s: float = 0.0
    warm_up_epoch_s: float | None = None  # the warm-up's estimate: a vote in replan until 3 epochs are measured
    planning_elapsed_s: float | None = None
    warm_up: dict | None = None  # the warm-up's figures (train_step_s, eval_step_s, compile_s, …)
    width_trials: list | None = None  # [width, epoch_s, epochs] per width the warm-up tried
    final_view_s: float | None = None  # one view of the test split, timed after the first epoch (None: not yet)
    tta_views: int = TTA_VIEWS  # the final evaluation's test-time views (1: none; sized to the budget)
    stem: str = "full"  # the network's stem (models.STEMS; plans from before it was kept: "full", the only one then)

    @staticmethod
    def warmup_for(epochs: int, steps_per_epoch: int) -> int:
        return round(COURSE["warmup_fraction"] * epochs * steps_per_epoch)

    @property
    def in_first_epoch(self) -> bool:
        """Whether the plan is still to be made from the first epoch's own steps (no separate warm-up ran)."""
        return bool(self.warm_up and self.warm_up.get("in_first_epoch") and self.warm_up.get("train_step_s") is None)

    def plan_in_first_epoch(
        self, done: int, elapsed_s: float, warm: dict, val_steps: int, test_steps: int, tta: bool, cap: int
    ) -> tuple[float, int]:
        """The plan from the step times of this process's first epoch (``warm``: as a warm-up's figures, its
        compiling calls left out), ``done`` epochs done and ``elapsed_s`` of the budget used, at most ``cap`` epochs:
        ``(epoch seconds, epochs)``, the final evaluation estimated as after a warm-up (:meth:`estimates`; it is
        measured after this epoch as after any first one)."""
        epoch_s, final_s, views = self.estimates(warm, val_steps, test_steps, tta, self.budget_s)
        self.final_eval_estimate_s = final_s
        if tta:
            self.tta_views = views
        left = self.budget_s - elapsed_s - final_s
        epochs = min(max(done + int(left / epoch_s + self.ROUND_UP), done), cap)
        self.warm_up, self.warm_up_epoch_s, self.epoch_estimate_s = warm, epoch_s, epoch_s
        self.width_trials = [[self.width, round(epoch_s, 2), epochs]]
        self.resize(done, epochs)
        self.initial_epochs = self.epochs
        return epoch_s, self.epochs

    def resize(self, done: int, epochs: int) -> None:
        """The plan's length set to ``epochs`` after ``done``: still in the learning rate's warm-up, the warm-up
        keeps its share of the new plan."""
        self.epochs = epochs
        step = done * self.steps_per_epoch
        if step < self.warmup_steps:
            self.warmup_steps = min(
                max(step, self.warmup_for(epochs, self.steps_per_epoch)), epochs * self.steps_per_epoch
            )

    @classmethod
    def no_time_to_time_steps(cls, budget_s: float, elapsed_s: float) -> bool:
        """After the first (compiling) step: less left than a final evaluation and two epochs at their least?
        Then the plan is one epoch, whatever the steps take."""
        return budget_s - elapsed_s < cls.FINAL_EVAL_MIN_S + 2 * cls.EPOCH_MIN_S

    @classmethod
    def estimates(
        cls, warm: dict, val_steps: int, test_steps: int, tta: bool, budget_s: float | None = None
    ) -> tuple[float, float, int]:
        """``(epoch_s, final_eval_s, views)`` from the warm-up's step times: the final evaluation's includes compiling
        predict, which the warm-up leaves to it (``predict_compile_estimate_s``); ``views``: the test-time views it
        predicts (:func:`tta_views_for` the budget with ``tta``, else 1)."""
        epoch_s = warm["train_epoch_s"] + warm["eval_step_s"] * val_steps + cls.EPOCH_MIN_S
        view_s = warm["eval_step_s"] * test_steps * cls.FINAL_EVAL_SAFETY + cls.FINAL_EVAL_VIEW_S
        fixed_s = cls.FINAL_EVAL_MIN_S + warm.get("predict_compile_estimate_s", 0.0)
        views = tta_views_for(view_s, budget_s, fixed_s) if tta else 1
        return epoch_s, view_s * views + fixed_s, views

    @classmethod
    def final_eval_from_view(cls, view_s: float, views: int) -> float:
        """The final evaluation's seconds from one view of the test split timed with predict compiled: each of its
        ``views`` × :attr:`VIEW_SAFETY`, + :attr:`VIEW_MIN_S`."""
        return view_s * views * cls.VIEW_SAFETY + cls.VIEW_MIN_S

    def views_from_view(self, view_s: float, tta: bool) -> int:
        """The test-time views the budget affords, from one view of the test split timed (1 without ``tta``)."""
        return tta_views_for(view_s * self.VIEW_SAFETY, self.budget_s, self.VIEW_MIN_S) if tta else 1

    def view_to_time(self, epochs_here: int, views_timed: int, done: int) -> str | None:
        """At the end of epoch ``done`` (the ``epochs_here``-th of this process), whether to time a view of the test
        split for the final evaluation's estimate: ``"first"`` (compile predict, time two) after this process's first
        epoch, ``"halfway"`` (one more) once half the plan is done — two timed right after compiling read 30% slow now
        and then (2 cores, 120 s: 0.33 s, the final evaluation's 0.26 s per view) — and None otherwise, without a
        budget, or when the plan ends before it could use the figure."""
        if self.budget_s is None:
            return None
        if epochs_here == 1 and done < self.epochs:
            return "first"
        if views_timed == 2 and 2 * done >= self.epochs and done < self.epochs - 1:
            return "halfway"
        return None

    @staticmethod
    def epochs_in(left_s: float, epoch_s: float) -> int:
        """Whole epochs in ``left_s`` seconds; at least one (a run always finishes an epoch)."""
        return max(1, int(left_s // epoch_s)) if epoch_s > 0 else 1

    def schedule_steps(self) -> tuple[int, int]:
        """``(warm-up steps, total steps)`` for the learning-rate schedule."""
        return self.warmup_steps, self.epochs * self.steps_per_epoch

    def fits_another(self, done: int, elapsed_s: float) -> bool:
        """Whether one more epoch (and the final evaluation) ends within the budget, up to :attr:`LATE_TOLERANCE`
        of an epoch late. The first epoch always fits."""
        if self.budget_s is None or done == 0:
            return True
        est = self.epoch_estimate_s
        return elapsed_s + est + self.final_eval_estimate_s <= self.budget_s + self.LATE_TOLERANCE * est

    def replan(self, done: int, elapsed_s: float, epoch_times: list[float], cap: int) -> tuple | None:
        """Fit the rest of the plan to the budget left at the epoch time measured in this process: the mean of the
        last :attr:`RECENT_EPOCHS`, more while they took less than :attr:`RECENT_S` together (``epoch_times``: wall
        time from one epoch's end to the next, so what happens between epochs counts too; the first epoch, which
        fills the cache and compiles the evaluation, only while it is all there is; the warm-up's estimate votes until
        3 are measured), leaving out the slowest of them (a stall is not yet a trend). The mean, not the median: what is left costs the *sum* of the epochs to come, and on a
        shared machine epochs do not scatter around one time — on a 2-core VM they alternated between 3.2 and 5.1 s
        (and now and then 10 s), and the median of three jumped from one to the other, re-planning 35 → 24 → 31 → 24
        → 30 → 25 epochs in one run and ending another 20 s early.
        Returns ``(old epochs, new epochs, seconds left, epoch seconds)`` when the plan changed, else None.

        Hysteresis: change only when the plan would end more than :attr:`LATE_TOLERANCE` of an epoch (and
        :attr:`SHRINK_FRACTION` of the time left) late, or leave
        more than :attr:`GROW_AFTER` epochs (and :attr:`GROW_FRACTION` of the time left) unused: short epochs
        jitter by ±30% on a shared machine, and re-planning for every jitter would only churn the schedule."""
        if self.budget_s is None or done >= cap or not epoch_times:
            return None
        measured = epoch_times[1:] or epoch_times
        recent = measured[-self.RECENT_EPOCHS :]
        while len(recent) < len(measured) and sum(recent) < self.RECENT_S:
            recent = measured[-len(recent) - 1 :]
        if len(recent) < 3 and self.warm_up_epoch_s:
            recent = recent + [self.warm_up_epoch_s]
        recent = sorted(recent)[:-1] or recent  # the slowest left out: one stall is not yet a trend
        epoch_s = sum(recent) / len(recent)
        self.epoch_estimate_s = epoch_s
        left = self.budget_s - elapsed_s - self.final_eval_estimate_s
        fits = done + max(0, int(left / epoch_s + self.ROUND_UP))
        fits = max(done, min(fits, cap))
        slack = left - (self.epochs - done) * epoch_s
        if (
            -max(self.LATE_TOLERANCE * epoch_s, self.SHRINK_FRACTION * left)
            <= slack
            <= max(self.GROW_AFTER * epoch_s, self.GROW_FRACTION * left)
        ):
            return None
        if fits > self.epochs and self.epochs - done < self.NO_GROW_LAST:
            return None
        if fits == self.epochs:
            return None
        old = self.epochs
        self.resize(done, fits)
        return old, fits, left, epoch_s

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> "BudgetPlan":
        """The plan in ``d`` (plan.json); ValueError with the reason when it is not one this trainer wrote."""
        if not isinstance(d, dict):
            raise ValueError(f"it holds {type(d).__name__}, not a plan")
        names = {f.name for f in dataclasses.fields(cls)}
        missing = sorted(
            n for n in ("options", "steps_per_epoch", "epochs", "initial_epochs", "warmup_steps") if n not in d
        )
        if missing:
            raise ValueError(f"it lacks {', '.join(missing)}")
        plan = cls(**{k: v for k, v in d.items() if k in names and k != "policy"}, policy=d.get("policy", ""))
        if not isinstance(plan.options, dict):
            raise ValueError("its options are not a mapping")
        for name in ("steps_per_epoch", "epochs", "initial_epochs"):
            value = getattr(plan, name)
            if not is_int(value) or not 1 <= value <= MAX_SCHEDULE_STEPS:
                raise ValueError(f"{name} is {value!r}, not a whole number from 1")
        if plan.global_batch is not None and (not is_int(plan.global_batch) or plan.global_batch < 1):
            raise ValueError(f"global_batch is {plan.global_batch!r}, not a whole number from 1")
        if not is_int(plan.warmup_steps) or not 0 <= plan.warmup_steps <= plan.epochs * plan.steps_per_epoch:
            raise ValueError(
                f"warmup_steps is {plan.warmup_steps!r}, not within the plan's "
                f"{plan.epochs * plan.steps_per_epoch} steps"
            )
        if plan.stem not in STEMS:
            raise ValueError(f"stem is {plan.stem!r}, not one of {STEMS}")
        if plan.tta_views not in TTA_CHOICES or isinstance(plan.tta_views, bool):
            raise ValueError(f"tta_views is {plan.tta_views!r}, not one of {TTA_CHOICES}")
        if plan.warm_up is not None and not isinstance(plan.warm_up, dict):
            raise ValueError(f"warm_up is {type(plan.warm_up).__name__}, not a mapping")
        for name in ("epoch_estimate_s", "final_eval_estimate_s"):
            value = getattr(plan, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ValueError(f"{name} is {value!r}, not a number of seconds")
        return plan


def whole_batch_s(ends: list[tuple[int, float]], sizes: list[int] | None) -> float:
    """A whole (the first) batch's seconds from ``ends``, ``(last step index, time)`` at the end of each call: the
    time after the first call, per image of the batches it ran (``sizes``: each batch's images; None: all alike)."""
    (first, t_first), (last, t_last) = ends[0], ends[-1]
    sizes = list(sizes) if sizes else [1] * (last + 1)
    images = sum(sizes[first + 1 : last + 1]) or (last - first) * sizes[0]
    return (t_last - t_first) / max(images, 1) * sizes[0]
