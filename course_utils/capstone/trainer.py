"""Training under a time budget: :func:`train` (the notebook and the command line call it) and what it returns."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import statistics
import sys
import time
from typing import Any, Callable

from .. import fileguard, processes
from .checks import CourseSettings, validate
from .models import whitening_kernel
from .options import COURSE, LOCK, MAX_EPOCHS, MAX_SCHEDULE_STEPS, PROG, Options, OptionsError, TensorFlowUnavailable
from .plan import (
    AUTO_WIDTH,
    BudgetPlan,
    PLANNING_MARGIN,
    PLANNING_SHARE,
    RECHOOSE_OFF_BY,
    TTA_CHOICES,
    TTA_SHIFTS,
    TTA_VIEWS,
    WARM_UP_PER_START_UP,
    WARM_UP_PER_START_UP_XLA,
    FINAL_EVAL_SHARE,
    start_width,
    small_batch,
    stem_hint,
    AUTO_STEM,
    auto_stem_applies,
    choose_stem,
    VALIDATION_SEED,
    WARM_UP_MIN_S,
    WARM_UP_STEPS,
    whole_batch_s,
    choose_width,
    target_epochs_for,
    validation_size,
)
from .recipes import MAX_LR_SCALING_BATCH, RECIPES, Recipe, choose_jit, choose_steps_per_execution, resolved
from .run_folder import RunFolder, backup_epoch, check_backup_fits, check_same_batch, read_resume_state, repair_backup
from .. import data as _data
from .. import hardware as _hardware
from .. import memory as _memory
from .. import runtime as _runtime


def progress_bar_wanted(stream: Any = None) -> bool:
    """Whether a progress bar that redraws its line suits ``stream`` (default stdout): a terminal or a notebook."""
    stream = sys.stdout if stream is None else stream
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or not a file
        tty = False
    if tty:
        return True
    ipython = sys.modules.get("IPython")  # a notebook's kernel (Jupyter, Colab) draws the bar in the cell's output
    try:
        shell = ipython.get_ipython() if ipython is not None else None
    except Exception:  # noqa: BLE001 - an odd IPython: no bar
        return False
    return shell is not None and hasattr(shell, "kernel")


SYNTHETIC_NOTE = (
    "These accuracies are on synthetic images (generated offline to be easy to learn), not CIFAR-10: "
    "they show the trainer works, not how well it learns real images (--data tfds or npz:PATH)."
)


@dataclasses.dataclass
class Predictions:
    """Test-set predictions: ``images`` uint8 [N,32,32,3], ``labels`` and ``predicted`` int [N], ``probs`` [N,10]."""

    images: Any
    labels: Any
    predicted: Any
    probs: Any
    tta: bool

    @property
    def accuracy(self) -> float:
        return float((self.predicted == self.labels).mean()) if len(self.labels) else float("nan")


@dataclasses.dataclass
class Result:
    """What :func:`train` returns: ``summary`` (= summary.json), ``history`` (= metrics.json), ``model``."""

    summary: dict
    history: list
    model: Any
    options: Options  # as asked, with the recipe's defaults (summary.json's "options"); what the run derived from
    # the hardware and the data (global batch, steps_per_execution, policy, XLA, width, …) is in the summary's own keys
    _test: Any = dataclasses.field(default=None, repr=False)
    _predictions: Any = dataclasses.field(default=None, repr=False)

    def predict_test(self, tta: bool | None = None) -> Predictions:
        """The trained model's predictions on the test split (with TTA if the recipe used it, or as asked)."""
        tta = self.options.tta if tta is None else tta
        if self._predictions is not None and self._predictions.tta == tta:
            return self._predictions
        x, y = self._test
        probs = _predict_probs(
            self.model, x, self.summary.get("tta_views", TTA_VIEWS) if tta else 1, self.summary["global_batch"]
        )
        return Predictions(x, y, probs.argmax(1), probs, tta)


def tta_views(x, views: int = TTA_VIEWS):
    """Test-time augmentation's views of images ``x`` [N,32,32,3], the unshifted image first: all :data:`TTA_VIEWS`
    — each image and its mirror, each of the two also shifted by one pixel in the four diagonal directions (the gap
    filled with zeros, as the training crops pad); 2 — each image and its mirror; 1 — the images alone."""
    import numpy as np

    if views not in TTA_CHOICES:
        raise ValueError(f"views must be one of {TTA_CHOICES}, got {views!r}")
    if views < TTA_VIEWS:
        return [x, x[:, :, ::-1]][:views]
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    h, w = x.shape[1:3]
    out = []
    for image, frame in ((x, padded), (x[:, :, ::-1], padded[:, :, ::-1])):
        out.append(image)
        out += [frame[:, 1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w] for dy, dx in TTA_SHIFTS]
    return out


def _predict_probs(model, x, views: int, batch_size: int, plain=None):
    """Class probabilities: the mean over ``views`` :func:`tta_views` (1: the images alone). `plain`: the unshifted
    images' probabilities if already computed. The images are padded to whole batches: one batch shape, so one compiled predict function
    (under XLA a last, smaller batch would compile another)."""
    import numpy as np
    import tensorflow as tf

    batch = max(batch_size, 256)

    def probs_of(images):
        n = len(images)
        padded = (
            np.concatenate([images, np.zeros((-n % batch, *images.shape[1:]), images.dtype)]) if n % batch else images
        )
        logits = model.predict(padded, batch_size=batch, verbose=0)[:n]
        return tf.nn.softmax(tf.cast(logits, tf.float32)).numpy()

    xf = x.astype(np.float32)
    p = plain if plain is not None else probs_of(xf)
    if views > 1:
        p = (p + sum(probs_of(np.ascontiguousarray(view)) for view in tta_views(xf, views)[1:])) / views
    return p


def _arrays(ds, batch: int = 4096):
    import numpy as np

    xs, ys = [], []
    for x, y in ds.batch(batch).as_numpy_iterator():
        xs.append(x)
        ys.append(y)
    if not xs:
        return np.zeros((0, 32, 32, 3), np.uint8), np.zeros(0, np.int64)
    return np.concatenate(xs).astype(np.uint8), np.concatenate(ys).astype(np.int64)


@dataclasses.dataclass
class Splits:
    """The three splits as uint8 images and int64 labels: ``train`` trains, ``validation`` (held out of the
    training images) is evaluated after every epoch and chooses the best checkpoint, ``test`` is evaluated once."""

    train: tuple
    validation: tuple
    test: tuple
    source: str


def split_validation(x, y, size: int):
    """``(x_train, y_train), (x_val, y_val)``: ``size`` images held out, chosen with :data:`VALIDATION_SEED` (not the
    run's seed: runs on the same data are compared on the same validation images)."""
    import numpy as np

    order = np.random.default_rng(VALIDATION_SEED).permutation(len(x))
    held, kept = np.sort(order[:size]), np.sort(order[size:])
    return (x[kept], y[kept]), (x[held], y[held])


def _load_splits(o: Options, settings: CourseSettings) -> Splits:
    """The run's splits from ``settings.data`` (``--data`` or the course config's): every image of the split, or on
    synthetic data the mode's sizes, unless ``--train-examples`` / ``--test-examples`` say otherwise."""
    synthetic = settings.data == "synthetic"
    n_train = o.train_examples if o.train_examples is not None else (settings.synthetic_train if synthetic else -1)
    n_test = o.test_examples if o.test_examples is not None else (settings.synthetic_test if synthetic else -1)
    d = _data.load_cifar10(settings.data, n_train=n_train, n_test=n_test, seed=o.seed, verbose=o.verbose >= 0)
    x, y = _arrays(d.train)
    size = validation_size(len(x), o.validation_examples)
    if size >= len(x):
        raise OptionsError(f"--validation-examples {size} leaves no training images of the {len(x)} loaded; use fewer")
    train, validation = split_validation(x, y, size)
    return Splits(train, validation, _arrays(d.test), d.source)


@contextlib.contextmanager
def _keras_without_pyplot(on: bool):
    """Keras' import loads matplotlib.pyplot for ``keras.visualization`` (0.3-0.5 s of its 2.4-2.7 s on one core of a
    2-core AMD EPYC VM, Keras 3.15.1); the command line plots nothing, and its budget counts the import. With ``on``
    (and matplotlib not imported yet) that import fails for the while (Keras keeps ``plt = None`` then) and is
    allowed again after: ``import matplotlib.pyplot`` works as before."""
    blocked = on and "matplotlib" not in sys.modules
    if blocked:
        sys.modules["matplotlib"] = None  # "import matplotlib" raises ImportError
    try:
        yield
    finally:
        if blocked and "matplotlib" in sys.modules and sys.modules["matplotlib"] is None:
            del sys.modules["matplotlib"]


class _Clock:
    """Wall time of the whole run, across restarts: time before this process + time in it."""

    def __init__(self, t0: float, before: float = 0.0):
        self.t0, self.before = t0, before

    def __call__(self) -> float:
        return self.before + time.perf_counter() - self.t0


def forward_s_per_image(net, images, rule: dict = AUTO_STEM) -> float:
    """Seconds per image of an eager forward pass of ``net`` over ``rule["probe_images"]`` of ``images`` — the
    fastest of ``rule["probes"]`` — after one over ``rule["warm_images"]`` (which builds the layers' calls): auto
    stem's measure (:func:`plan.choose_stem`)."""
    import numpy as np

    net(np.asarray(images[: rule["warm_images"]], "float32"), training=False)
    probe = np.asarray(images[: rule["probe_images"]], "float32")
    took = []
    for _ in range(rule["probes"]):
        started = time.perf_counter()
        net(probe, training=False)
        took.append(time.perf_counter() - started)
    return min(took) / len(probe)


def _fit_strategy(rt):
    """The strategy the trainer builds and fits under: the runtime's where it has several replicas or is a TPU; on one
    CPU or GPU device :meth:`runtime.Runtime.one_device_strategy` (TensorFlow's default strategy, same device), with
    :func:`_pipelines` built without autotuning — both are needed, each alone measured the same waits.

    Why: at every epoch's start Keras drops the iterator of the epoch before, and TensorFlow (2.20 and 2.21) destroys
    it by waiting for that iterator's tf.data autotuning thread. On one core the wait was an epoch's length: a small
    CNN on 20,000 images, ``taskset -c 0``: 5.5 s of training per epoch, 10–20 s per epoch in all; after the last
    epoch ``fit`` returned 4–15 s late, which made a budgeted run end past its budget."""
    if rt.strategy.num_replicas_in_sync == 1 and rt.kind in ("CPU", "GPU"):
        return rt.one_device_strategy()
    return rt.strategy


def _pipelines(o: Options, splits: Splits, replicas: int = 1, autotune: bool = True, *, batch: int):
    """The trainer's pipelines (lesson 04's order, with its faster augmentation): training images uint8-cached,
    shuffled every epoch, batched with the global batch, then augmented a whole batch per call
    (:func:`data.augment_batch`: each image its own flip and crop; lesson 04 measured this order faster than
    :func:`data.augment` per image before ``batch``); validation in batches of at least 256, the last one partial.
    ``autotune=False``: tf.data's autotuning off (:func:`data.without_autotune`), so that no iterator waits for an
    autotuning thread when it is destroyed (:func:`_fit_strategy`). ``batch``: the global batch the run derived
    (:meth:`Recipe.global_batch`)."""
    import tensorflow as tf

    def one_hot(x, y):
        return x, tf.one_hot(y, 10)

    (x_train, y_train), (x_val, y_val) = splits.train, splits.validation
    train_ds = _data.build_pipeline(
        tf.data.Dataset.from_tensor_slices((x_train, y_train)),
        batch,
        training=True,
        augment_fn=None,
        batch_augment_fn=_data.augment_batch if o.augment else None,
        shuffle_buffer=len(x_train),
        seed=o.seed,
        prefetch=False,
    )
    train_ds = train_ds.map(one_hot, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    val_ds = _data.build_pipeline(
        tf.data.Dataset.from_tensor_slices((x_val, y_val)),
        _eval_batch(batch, len(x_val), replicas),
        training=False,
        drop_remainder=False,
        prefetch=False,
    )
    val_ds = val_ds.map(one_hot).prefetch(tf.data.AUTOTUNE)
    if not autotune:
        train_ds, val_ds = _data.without_autotune(train_ds), _data.without_autotune(val_ds)
    return train_ds, val_ds


def _eval_batch(batch: int, n: int, replicas: int = 1) -> int:
    """The evaluation batch for ``n`` images: at least 256, and at least the training's global ``batch``. Smaller
    splits are one batch of a multiple of the replicas: under a strategy Keras builds the model from the first
    evaluation batch averaged across replicas (keras/src/backend/tensorflow/trainer.py, ``_maybe_symbolic_build``: ``strategy.reduce("MEAN", batch)``), which
    fails when that batch splits unevenly (102 images on 4 replicas: 26, 26, 26, 24)."""
    batch = -(-max(batch, 256) // replicas) * replicas  # whole batches split evenly too
    if n < batch:
        batch = max(n - n % replicas, min(n, replicas))
    return batch


def _normalization(splits: Splits, whiten: bool) -> tuple:
    """``(mean, variance, whitening kernel or None)`` of the training images: what every network a run builds starts
    with (0.3-0.4 s on one core: computed once per run, not per width or stem tried)."""
    x_train = splits.train[0]
    mean, var = x_train.reshape(-1, 3).mean(0), x_train.reshape(-1, 3).var(0)
    return mean, var, whitening_kernel(x_train, mean, var) if whiten else None


def _compiled_model(
    o: Options,
    recipe: Recipe,
    policy: str,
    jit_compile: bool,
    strategy,
    width: int,
    splits: Splits,
    *,
    batch: int,
    steps_per_execution: int,
    stem: str = "full",
    normalization: tuple | None = None,
):
    """``(net, model, schedule, peak_lr)``: the recipe's network, the model fit trains (wrapped for --accumulate)
    compiled with its optimizer, loss and schedule, all under ``policy`` and in ``strategy.scope()``; ``batch`` and
    ``steps_per_execution``: the values the run derived (the peak learning rate follows the global batch);
    ``normalization``: :func:`_normalization`'s figures, if already computed."""
    import keras
    import tensorflow as tf

    from .callbacks import BudgetSchedule

    mean, var, whiten = normalization or _normalization(splits, o.whiten)
    previous_policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        with strategy.scope():
            net = recipe.model(width, mean, var, whiten=whiten, stem=stem)
            peak = recipe.peak_learning_rate(batch)
            schedule = BudgetSchedule(peak, o.schedule)
            model = net
            # float16 on several replicas: Keras' LossScaleOptimizer decides to skip an overflowing step from the
            # first replica's gradients only (lesson 05 §6), so another replica's overflow would reach every
            # replica's weights; AccumulatingModel (even with one micro-batch) skips it on all of them
            if o.accumulate > 1 or (policy == "mixed_float16" and strategy.num_replicas_in_sync > 1):
                from .. import accumulation

                model = accumulation.AccumulatingModel(net, steps=o.accumulate)
                model(tf.zeros((1, 32, 32, 3)))
            model.compile(
                optimizer=recipe.optimizer(schedule, o.ema),
                loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=o.label_smoothing),
                metrics=[keras.metrics.CategoricalAccuracy(name="accuracy")],
                steps_per_execution=steps_per_execution,
                jit_compile=jit_compile,
            )
            model.optimizer.build(model.trainable_variables)
    finally:
        keras.config.set_dtype_policy(previous_policy)
    return net, model, schedule, peak


def train(
    options: Options, *, settings: CourseSettings | None = None, _t0: float | None = None, _command_line: bool = False
) -> Result:
    """Train one recipe (see :class:`Options`) and return a :class:`Result`. Writes ``options.out``. What the options
    leave open comes from ``settings`` (the course's mode: data, replicas, XLA, width cap, synthetic sizes), else from
    the course config, read once before the run (:func:`checks.course_settings`).

    Raises :class:`OptionsError` for a bad option (or an output folder / resume state to refuse) and
    :class:`course_utils.data.DataSourceError` when the data cannot be loaded (never a silent switch to synthetic
    data). Nothing in ``out`` changes before the options, the resume state and the data have been checked."""
    t0 = time.perf_counter() if _t0 is None else _t0
    settings = validate(options, settings)
    # One run at a time per folder: a second run into the same --out stops at once, naming the first (two runs there
    # both finished and both said "Done", each with the other's files). The folder made here for the lock is removed
    # again if the run stops before writing anything.
    created = not os.path.lexists(options.out)
    try:
        os.makedirs(options.out, exist_ok=True)
        with fileguard.folder_lock(options.out, "capstone run"):
            validate(options, settings)  # again, under the lock: another run may have written there in between
            return _train(options, settings, t0, lean_imports=_command_line)
    except (fileguard.FolderBusy, fileguard.UnsafePath) as exc:
        raise OptionsError(f"--out {options.out!r}: {exc}") from None
    finally:
        lock = os.path.join(options.out, LOCK)
        if created and os.path.isdir(options.out) and os.listdir(options.out) in ([], [LOCK]):
            if os.path.isfile(lock):
                os.remove(lock)
            os.rmdir(options.out)


def _train(options: Options, settings: CourseSettings, t0: float, lean_imports: bool = False) -> Result:
    # What was asked, with the recipe's defaults: never changed below. What the hardware and the data decide (the
    # global batch, steps_per_execution, the policy, XLA, the width) are values of their own, each with its reason.
    o = resolved(options)
    recipe = RECIPES[o.recipe]
    say = print if o.verbose >= 0 else (lambda *a, **k: None)
    run = RunFolder(o.out)
    state = read_resume_state(run, o) if o.resume else None
    clock = _Clock(t0, state.spent_s if state else 0.0)

    # the options and the folder are checked: now TensorFlow. A broken install is one line, an exception's or, where the
    # import kills the process (SIGILL on a CPU without AVX, SIGABRT from a mismatched library), the watcher's
    crashed = (
        f"{PROG}: error: importing TensorFlow killed this process (a crash in its native code, no Python error); "
        "python -m course_utils doctor says why"
    )
    try:
        with processes.crash_said(crashed), _keras_without_pyplot(lean_imports):
            import keras  # noqa: F401 - imports TensorFlow (Keras' backend) too
            import tensorflow  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - ImportError, or a RuntimeError from a library it loads
        last = (str(exc).strip().splitlines() or [""])[-1]
        raise TensorFlowUnavailable(
            f"TensorFlow could not be imported ({type(exc).__name__}: {last}); check the "
            "install: python -m course_utils doctor"
        ) from None
    # The hardware first: splitting the CPU into replicas must happen before TensorFlow starts (loading data starts
    # it). Then the data: a source that cannot deliver fails before anything is built or deleted.
    rt = _runtime.detect(cpu_replicas=settings.cpu_replicas)
    loading = clock()
    splits = _load_splits(o, settings)
    loading_s = clock() - loading  # (a warm-up's estimate leaves it out: warm_up_fits)

    import keras
    import tensorflow as tf

    from .callbacks import PlanProgbar, Progress

    tf.get_logger().setLevel("ERROR")
    strategy, replicas = _fit_strategy(rt), rt.strategy.num_replicas_in_sync
    kernels = _hardware.kernel_path() if rt.kind == "CPU" else None  # which CPU kernels run here, and why
    auto_width = recipe.sized_by_width and o.width is None and o.time_budget is not None
    # The global batch: --batch-size, or the recipe's (course: 128 per replica × the replicas found here; auto width
    # on a slow kernel path with a short budget: plan.small_batch)
    small = (
        small_batch(kernels[0] if kernels else None, o.time_budget) if auto_width and recipe.per_replica_batch else None
    )
    per_replica = None
    if small and small % o.accumulate == 0:
        per_replica = (
            small,
            f"auto width on CPU kernels {kernels[0]} with a {o.time_budget:g} s budget: "
            f"{small} rather than {recipe.batch_size} doubles the few updates it buys",
        )
    batch, batch_why = recipe.global_batch(o.batch_size, replicas, o.accumulate, len(splits.train[0]), per_replica)
    # The network's stem (models.STEMS): --stem, else the full one; a resumed run keeps the one it started with
    if state is not None:
        stem, stem_why = state.plan.stem, "the run's plan (resumed)"
        if o.stem is not None and o.stem != stem:
            raise OptionsError(
                f"--resume: {o.out} was started with --stem {stem}, not {o.stem}; resume with the "
                "same options or use another --out"
            )
    elif o.stem is not None:
        stem, stem_why = o.stem, "--stem"
    else:
        stem, stem_why = "full", "the course's"
    # auto stem (plan.AUTO_STEM): the full stem's epochs predicted from a forward pass of the network built below
    stem_auto = state is None and auto_stem_applies(kernels[0] if kernels else None, auto_width, o.stem)
    stem_probe = None
    if state is not None:
        check_same_batch(state.plan, batch, batch_why, o.out)
    if batch % (replicas * o.accumulate):
        raise OptionsError(
            f"--batch-size {batch} is not divisible by replicas × accumulate = "
            f"{replicas} × {o.accumulate} on this {rt.kind}; use a multiple of {replicas * o.accumulate}"
        )
    if o.steps_per_execution is not None and o.steps_per_execution > 1 and rt.strategy_name == "MirroredStrategy":
        raise OptionsError(
            f"--steps-per-execution {o.steps_per_execution} fails under MirroredStrategy ({replicas} replicas) in "
            f"Keras {keras.__version__} (keras-team/keras#19246: 'You must feed a value for placeholder tensor'); "
            "use --steps-per-execution 1 here (it pays on TPUs, which use TPUStrategy)"
        )
    if len(splits.validation[0]) % replicas:
        # every evaluation batch must split evenly over the replicas (a replica left with no image fails in the
        # model, and Keras' first-batch build averages the replicas' images: _eval_batch): leave out the last
        # few (fewer than the replicas) validation images
        keep = len(splits.validation[0]) - len(splits.validation[0]) % replicas
        splits = dataclasses.replace(splits, validation=tuple(a[:keep] for a in splits.validation))
    (x_train, _), (x_val, _), (x_test, y_test) = splits.train, splits.validation, splits.test
    steps_per_epoch = len(x_train) // batch
    if steps_per_epoch < 1:
        raise OptionsError(f"--batch-size {batch} is larger than the {len(x_train)} training images")
    if o.epochs is not None and o.epochs * steps_per_epoch > MAX_SCHEDULE_STEPS:
        raise OptionsError(
            f"--epochs {o.epochs} × {steps_per_epoch} steps is beyond the {MAX_SCHEDULE_STEPS:,} steps "
            "the float32 schedule counts exactly; use fewer epochs"
        )
    policy, policy_why = (o.policy, "chosen with --policy") if o.policy != "auto" else recipe.choose_policy(rt)
    jit_compile, xla, jit_why = choose_jit(o, rt.kind, settings.course_jit, replicas, kernels[0] if kernels else None)
    spe, spe_why = choose_steps_per_execution(o.steps_per_execution, rt.kind, replicas, steps_per_epoch)
    peak_lr = recipe.peak_learning_rate(batch)
    lr_why = recipe.learning_rate_rule()
    if state is None:
        run.start_afresh()  # only now: every input has been checked
    keras.utils.set_random_seed(o.seed)
    runtime_line = rt.summary().splitlines()[0]
    if strategy is not rt.strategy:  # the runtime line names the runtime's strategy: say which one fit runs under
        runtime_line += (
            "; the trainer fits under TensorFlow's default strategy on this one device (lesson 06 §2: no "
            "wait for the last epoch's iterator)"
        )
    say(runtime_line)
    if kernels:
        say(_hardware.kernel_path_line())
    micro = batch // replicas // o.accumulate
    say(f"Recipe {o.recipe}: policy {policy} ({policy_why}); XLA {'on' if xla else 'off'} ({jit_why})")
    say(
        f"Global batch {batch} ({batch_why}; each replica {micro} × {o.accumulate} accumulated); peak learning "
        f"rate {peak_lr:.4g} ({lr_why}); {steps_per_epoch} steps/epoch; steps_per_execution {spe} "
        f"({spe_why}); {len(x_train)} training, {len(x_val)} validation, {len(x_test)} test images"
    )

    def say_stem():
        at = "16×16 from 2×2 patches" if stem == "s2d" else "32×32"
        say(f"Stem {stem}: prep and layer1's first convolution at {at} ({stem_why})")

    if recipe.sized_by_width and stem != "full" and not stem_auto:  # asked for (or resumed): said before building
        say_stem()
    train_ds, val_ds = _pipelines(o, splits, replicas, autotune=strategy is rt.strategy, batch=batch)
    val_batch = _eval_batch(batch, len(x_val), replicas)
    val_sizes = [min(val_batch, len(x_val) - i) for i in range(0, len(x_val), val_batch)]  # the last may be partial
    val_steps, test_steps = len(val_sizes), math.ceil(len(x_test) / _eval_batch(batch, len(x_test), replicas))

    normalization = _normalization(splits, o.whiten)

    def build(width: int):
        return _compiled_model(
            o,
            recipe,
            policy,
            jit_compile,
            strategy,
            width,
            splits,
            batch=batch,
            steps_per_execution=spe,
            stem=stem,
            normalization=normalization,
        )

    # Width: --width, else the course default capped by the config's model width (smoke sizes: 8); with a time
    # budget, auto width: the warm-up times AUTO_WIDTH's start width and the plan chooses (_new_plan).
    start = start_width(kernels[0] if kernels else None, AUTO_WIDTH) if auto_width else COURSE["width"]
    width = state.plan.width if state else (o.width or min(start, settings.max_width))
    net, model, schedule, peak = build(width)
    if stem_auto:
        stem_probe = forward_s_per_image(net, x_train)
        stem, _, stem_why = choose_stem(stem_probe, len(x_train), o.time_budget, clock(), xla=xla)
        if stem != "full":  # the same seed as --stem s2d would build it with
            keras.utils.set_random_seed(o.seed)
            net, model, schedule, peak = build(width)
    if stem_auto:
        say_stem()
    if batch > MAX_LR_SCALING_BATCH and recipe.sized_by_width:
        say(f"Note: global batch {batch} > {MAX_LR_SCALING_BATCH}: the linear LR rule gets unreliable here")

    # Reset the allocator's peak so the figure is this run's (CPU with the BFC allocator, GPU, TPU).
    mem_device = _memory.default_device()
    try:
        tf.config.experimental.reset_memory_stats(mem_device)
        allocator_stats = True
    except Exception:  # noqa: BLE001 - this allocator keeps no statistics
        allocator_stats = False

    if state is None:
        plan, (net, model, schedule, peak) = _new_plan(
            o,
            steps_per_epoch,
            policy,
            width,
            clock,
            say,
            (train_ds, val_ds),
            val_sizes,
            test_steps,
            auto_width,
            build,
            (net, model, schedule, peak),
            batch=batch,
            steps_per_execution=spe,
            loading_s=loading_s,
            stem=stem,
            cpu_xla=xla and rt.kind == "CPU",
        )
        width = plan.width
        fileguard.write_json(run.plan, plan.to_dict())
    else:
        plan = state.plan
    schedule.set_plan(*plan.schedule_steps())

    # Resume: BackupAndRestore reloads weights + optimizer state; metrics.json continues after that epoch.
    done, history = 0, []
    if state is not None:
        repaired = repair_backup(run.backup)
        if repaired:
            say(repaired)
        done = backup_epoch(run.backup)
        check_backup_fits(run, model)
        history = [h for h in state.history if h["epoch"] <= done]
        if done > len(history):
            say(
                f"metrics.json lists {len(history)} of the {done} epochs in the backup: the records of the others "
                "were lost with the kill (their training was not)"
            )
        if plan.in_first_epoch and history:  # killed before its first epoch's plan was saved: that epoch's time
            plan.epoch_estimate_s = history[-1]["epoch_time_s"]
        say(
            f"Resuming after epoch {done} of {plan.epochs}; {clock():.1f} s already spent"
            + (f" of the {o.time_budget:g} s budget" if o.time_budget else "")
        )
    fileguard.write_json(run.metrics, history)

    def time_view(compile: bool) -> list[float]:
        """Seconds of a view of the test split as the final evaluation predicts it. ``compile``: first compile
        predict on one (padded) batch, the final evaluation's shape, so that it reuses it, and time two views (one
        view's time doubled now and then: 2 cores, 0.34 s where others took 0.18)."""
        if compile:
            _predict_probs(net, x_test[:1], 1, batch)
        times = []
        for _ in range(2 if compile else 1):
            started = time.perf_counter()
            _predict_probs(net, x_test, 1, batch)
            times.append(time.perf_counter() - started)
        return times

    def plan_first_epoch(
        train_ends: list, test_ends: list, t_epoch: float, t_test: float | None, done: int, cap: int
    ) -> str:
        warm = first_epoch_times(train_ends, test_ends, t_epoch, t_test, steps_per_epoch, val_sizes, batch)
        epoch_s, epochs = plan.plan_in_first_epoch(done, clock(), warm, len(val_sizes), test_steps, o.tta, cap)
        hint = stem_hint(plan.width, epochs, stem) if auto_width else None
        return (
            f"  (budget {o.time_budget:g} s: epoch {done} measured {warm['train_step_s'] * 1e3:.1f} ms/step "
            f"(compiling: {warm['compile_s']:.1f} s), ~{epoch_s:.1f} s/epoch with validation; {clock():.1f} s "
            f"used so far → {epochs} epoch{'s' * (epochs != 1)}{'; ' + hint if hint else ''})"
        )

    progress = Progress(
        o,
        plan,
        run,
        clock,
        history,
        schedule,
        steps_per_epoch,
        say,
        time_view,
        global_batch=batch,
        plan_first_epoch=plan_first_epoch if plan.in_first_epoch else None,
    )
    # The progress callback comes after every callback that saves: an epoch's time includes its checkpoint and
    # backup, and metrics.json lists an epoch only once the backup holds it (a kill in between resumes after it).
    callbacks = [
        keras.callbacks.ModelCheckpoint(run.best, monitor="val_accuracy", save_best_only=True, save_weights_only=True),
        keras.callbacks.BackupAndRestore(run.backup, double_checkpoint=True),
    ]
    if o.tensorboard:
        calls = math.ceil(steps_per_epoch / spe)  # the callback counts calls, not steps
        first = min(3, calls)
        callbacks.append(
            keras.callbacks.TensorBoard(o.tensorboard, profile_batch=(first, min(first + 4, calls)), write_graph=False)
        )
    callbacks.append(progress)
    if progress.first_epoch is not None:
        callbacks.insert(0, progress.first_epoch)  # its clock first, as the warm-up's
    if o.ema:
        # Evaluate with the averaged weights (swapped in for each evaluation and back), train and back up the raw
        # ones (+ the averages, which are optimizer variables); fit's end assigns the averages to the model.
        # (swap_on_epoch=True would leave the averages in the model across a kill/--resume, and with fit's
        # epoch cap above the plan its last-epoch fix-up would not run.)
        callbacks.insert(0, keras.callbacks.SwapEMAWeights(swap_on_epoch=False))
    # Keras' progress bar redraws its line with \r and \b (it assumes a terminal wherever "posix" is imported): in a
    # log file or a pipe that is noise, so there only the line per epoch is written
    bar = progress.bar = o.verbose >= 1 and progress_bar_wanted()
    if bar:
        callbacks.append(PlanProgbar(plan))

    if done < plan.epochs and plan.fits_another(done, clock()):
        # With a budget the plan may still grow (the warm-up over-estimated) or shrink (the machine got
        # slower): fit may run up to `cap` epochs and the progress callback stops it at the plan.
        # A plan still to be made in the first epoch may come out at any length.
        cap = plan.epochs if o.time_budget is None else max(2 * plan.epochs, plan.epochs + 5)
        if plan.in_first_epoch:
            cap = max(cap, min(MAX_EPOCHS, MAX_SCHEDULE_STEPS // steps_per_epoch))
        model.fit(train_ds, epochs=cap, validation_data=val_ds, callbacks=callbacks, verbose=1 if bar else 0)
    else:  # nothing left to train: load the last backup
        if os.path.exists(os.path.join(run.backup, "latest.weights.h5")):
            model.load_weights(os.path.join(run.backup, "latest.weights.h5"))
        shutil.rmtree(run.backup, ignore_errors=True)

    # The test split, once, with the last epoch's weights (counted in the wall time): plain and with TTA.
    t_final = time.perf_counter()
    views = plan.tta_views if o.tta else 1  # sized to the budget (BudgetPlan.views_from_view)
    probs_plain = _predict_probs(net, x_test, 1, batch)
    probs = _predict_probs(net, x_test, views, batch, plain=probs_plain) if views > 1 else probs_plain
    acc_plain = float((probs_plain.argmax(1) == y_test).mean())
    acc = float((probs.argmax(1) == y_test).mean())
    final_eval_s = time.perf_counter() - t_final
    wall = clock()
    trained_s = wall - final_eval_s  # the clock when training (and fit's teardown) had ended
    peak_bytes, peak_method = _peak_memory(mem_device if allocator_stats else None)

    history = progress.history
    # Throughput: the median epoch's, leaving out the first (it traces, compiles and fills the cache).
    steady = [h["images_per_s"] for h in (history[1:] if len(history) > 1 else history) if h["images_per_s"]]
    ips = statistics.median(steady) if steady else None  # of two epochs their mean, not the faster one
    best = max(history, key=lambda h: h["val_accuracy"], default=None)
    summary = {
        "recipe": o.recipe,
        "test_accuracy": acc,
        "test_accuracy_no_tta": acc_plain,
        "tta": o.tta,
        "tta_views": views,
        "validation_accuracy": history[-1]["val_accuracy"] if history else None,
        "best_validation_epoch": best["epoch"] if best else None,
        "best_validation_accuracy": best["val_accuracy"] if best else None,
        "epochs": len(history),
        "planned_epochs": plan.epochs,
        "initially_planned_epochs": plan.initial_epochs,
        "wall_time_s": wall,
        "budget_s": o.time_budget,
        "budget_used_s": wall if o.time_budget else None,
        "budget_used_fraction": wall / o.time_budget if o.time_budget else None,
        "time_before_first_epoch_s": history[0]["elapsed_s"] - history[0]["epoch_time_s"] if history else None,
        "trained_s": trained_s,
        "final_eval_s": final_eval_s,
        "resumed": bool(o.resume and done > 0),
        "resumed_after_epoch": done if o.resume else None,  # the backup's last epoch: 0 = it started over
        "images_per_s": ips,
        "images_per_s_per_replica": ips / replicas if ips else None,
        "replicas": replicas,
        "global_batch": batch,
        "per_replica_batch": batch // replicas,
        "micro_batch_per_replica": batch // replicas // o.accumulate,
        "global_batch_why": batch_why,
        "steps_per_epoch": steps_per_epoch,
        "steps_per_execution": spe,
        "steps_per_execution_why": spe_why,
        "peak_learning_rate": peak,
        "peak_learning_rate_why": lr_why,
        "policy": policy,
        "policy_why": policy_why,
        "jit_compile": jit_compile,
        "xla": xla,
        "xla_why": jit_why,
        "xla_chosen_by": "option"
        if o.jit is not None
        else ("COURSE_JIT" if settings.course_jit and rt.kind != "TPU" else "trainer"),
        "width": width if recipe.sized_by_width else None,
        "stem": stem if recipe.sized_by_width else None,
        "stem_why": stem_why if recipe.sized_by_width else None,
        "stem_forward_s_per_image": stem_probe,  # auto stem's forward pass (None: the stem was not chosen here)
        "width_trials": plan.width_trials,
        "parameters": int(net.count_params()),
        "peak_memory_bytes": peak_bytes,
        "peak_memory_method": peak_method,
        "data": splits.source,
        "train_examples": len(x_train),
        "validation_examples": len(x_val),
        "test_examples": len(x_test),
        "options": dataclasses.asdict(o),  # as asked, with the recipe's defaults; the derived values are above
        "hardware": dict(rt.as_dict(), cpu_count=os.cpu_count()),
        "kernel_path": kernels[0] if kernels else None,
        "kernel_path_why": kernels[1] if kernels else None,
        "tf_version": tf.__version__,
        "keras_version": keras.__version__,
        "python_version": sys.version.split()[0],
    }
    fileguard.write_json(run.summary, summary)
    fileguard.write_json(run.clock, {"elapsed_s": wall, "finished": True})
    say(
        f"Final test accuracy {100 * acc:.2f}%"
        + (f" with TTA, {views} views ({100 * acc_plain:.2f}% without)" if views > 1 else "")
        + (" (no time for TTA's views in this budget)" if o.tta and views == 1 else "")
        + f" (validation {100 * summary['validation_accuracy']:.2f}% after the last epoch)" * bool(history)
        + f"; {wall:.1f} s wall"
        + (f" of the {o.time_budget:g} s budget" if o.time_budget else "")
        + (f"\n{SYNTHETIC_NOTE}" if splits.source == "synthetic" else "")
    )
    if o.time_budget and wall > 1.1 * o.time_budget:
        say(
            f"Over the budget by {wall - o.time_budget:.1f} s ({wall / o.time_budget:.2f}×): planning took "
            f"{plan.planning_elapsed_s or 0:.1f} s, training {max(0.0, trained_s - (plan.planning_elapsed_s or 0)):.1f} s,"
            f" the test evaluation {final_eval_s:.1f} s"
        )
    preds = Predictions(x_test, y_test, probs.argmax(1), probs, o.tta)
    return Result(summary, history, net, o, (x_test, y_test), preds)


def _peak_memory(device: str | None) -> tuple[int, str]:
    """``(bytes, method)``: the allocator's peak on ``device`` since its reset, or where it keeps no statistics
    (``device`` None, or a failed reading) the process's peak RSS — with the method that measured it."""
    import tensorflow as tf

    if device is not None:
        try:
            peak = int(tf.config.experimental.get_memory_info(device)["peak"])
            if peak:
                return peak, f"{_memory.MEMORY_INFO}({device!r})['peak'] over this process's training"
        except Exception:  # noqa: BLE001 - no statistics after all
            pass
    return _memory.maxrss_bytes(), "process peak RSS (resource.getrusage ru_maxrss; whole process)"


def _new_plan(
    o: Options,
    steps_per_epoch: int,
    policy: str,
    width: int,
    clock: _Clock,
    say,
    datasets: tuple,
    val_sizes: list[int],
    test_steps: int,
    auto_width: bool,
    build: Callable,
    built: tuple,
    *,
    batch: int,
    steps_per_execution: int,
    loading_s: float = 0.0,
    stem: str = "full",
    cpu_xla: bool = False,
) -> tuple[BudgetPlan, tuple]:
    """A new run's plan and the model to train: ``--epochs``, or with a budget the epochs the warm-up says fit (auto
    width: the widths it tried, and the model of the one chosen)."""
    plan = BudgetPlan(
        options=dataclasses.asdict(o),
        global_batch=batch,
        steps_per_epoch=steps_per_epoch,
        policy=policy,
        width=width,
        stem=stem,
        epochs=o.epochs or 1,
        initial_epochs=o.epochs or 1,
        warmup_steps=0,
        budget_s=o.time_budget,
    )
    if (
        o.time_budget is not None
        and steps_per_execution == 1
        and not warm_up_fits(o.time_budget, clock(), loading_s, cpu_xla)
    ):
        # (several steps per call, a TPU's: the warm-up times whole calls; an epoch's last call may run fewer steps)
        # No room for a separate warm-up: the start width trains now; Progress times its first epoch's steps and
        # makes the plan from them (BudgetPlan.plan_in_first_epoch). Until then: the epochs auto width aims at
        budget, started = o.time_budget, clock()
        plan.epochs = plan.initial_epochs = target_epochs_for(budget, AUTO_WIDTH)
        plan.warm_up, plan.width_trials = {"in_first_epoch": True, "train_step_s": None}, [[width, None, None]]
        plan.planning_elapsed_s = started
        # the final evaluation's share of the budget at most (tta_views_for), until a view is timed after epoch 1
        plan.final_eval_estimate_s = FINAL_EVAL_SHARE * budget
        plan.warmup_steps = BudgetPlan.warmup_for(plan.epochs, steps_per_epoch)
        network = f"width {width}" if auto_width else "the network"
        say(
            f"Budget {budget:g} s: {started:.1f} s went to starting up (Python, TensorFlow, the data, the model; "
            f"{started / budget:.0%}), and a warm-up would take "
            f"~{warm_up_per_start_up(cpu_xla) * max(started - loading_s, 0.0):.1f} s more"
            f"{' (compiling with XLA)' if cpu_xla else ''} (over {PLANNING_SHARE:.0%} of the budget) → {network} "
            "trains now; its first epoch's steps set the plan"
        )
        return plan, built
    if o.time_budget is not None:
        budget = o.time_budget
        val_steps = len(val_sizes)
        warm_started = clock()

        def warm_up(model):
            return _warm_up(
                model,
                *datasets,
                steps_per_execution,
                steps_per_epoch,
                val_steps,
                one_epoch_only=lambda: BudgetPlan.no_time_to_time_steps(budget, clock()),
                eval_sizes=val_sizes,
            )

        warm = warm_up(built[1])
        warm_took, warms = clock() - warm_started, {width: warm}
        # what warm_up_fits decided from, and what the warm-up then took (its estimate: WARM_UP_PER_START_UP)
        warm["start_up_s"], warm["loading_s"], warm["took_s"] = warm_started, loading_s, warm_took
        if warm["train_step_s"] is None:  # compiling used the budget: nothing to measure, no width to choose
            epoch_s, final_s, epochs, views = 0.0, BudgetPlan.FINAL_EVAL_MIN_S, 1, 1
            tried = [[width, None, epochs]]
        else:
            epoch_s, final_s, views = BudgetPlan.estimates(warm, val_steps, test_steps, o.tta, budget)
            epochs = BudgetPlan.epochs_in(budget - clock() - final_s, epoch_s)
            tried = [[width, round(epoch_s, 2), epochs]]
            if auto_width:  # (a fixed network has no width to choose)
                # Past PLANNING_SHARE of the budget already (a slow machine, a short budget), no other width is
                # timed, but one is still chosen from the start width's timing: keeping the start width there cost
                # the most (TensorFlow's own kernels, 2 cores, 60 s: 5 epochs at width 8)
                if clock() > PLANNING_SHARE * budget:
                    say(
                        f"Budget {budget:g} s is short for this machine: compiling and timing the first steps took "
                        f"{clock():.1f} s ({clock() / budget:.0%} of it) → the width is chosen from that timing alone"
                    )
                timed, models = {width: epoch_s}, {width: built}
                while True:
                    # another width compiles again (about as long as this one did)
                    left = budget - clock() - final_s - warm["compile_s"]
                    new_width, new_epoch_s, new_epochs = choose_width(
                        epoch_s, width, left, AUTO_WIDTH, timed=timed, budget_s=budget
                    )
                    if new_width in timed:  # the current width (or one timed before, compiled already)
                        if new_width != width:
                            say(f"Budget {budget:g} s: back to width {new_width} (timed ~{new_epoch_s:.1f} s/epoch)")
                            built, width, warm = models[new_width], new_width, warms[new_width]
                            epoch_s, final_s, views = BudgetPlan.estimates(warm, val_steps, test_steps, o.tta, budget)
                            epochs = BudgetPlan.epochs_in(budget - clock() - final_s, epoch_s)
                            tried.append([width, round(epoch_s, 2), epochs])
                        break
                    scale = new_epoch_s / epoch_s
                    how = (
                        f"predicted ~{new_epoch_s:.1f} s/epoch"
                        if len(timed) == 1
                        else f"~{new_epoch_s:.1f} s/epoch on the line through widths {min(timed)} and {max(timed)}"
                    )
                    why = (
                        f"Budget {budget:g} s: ~{epoch_s:.1f} s/epoch at width {width} → width {new_width} "
                        f"({how}, {new_epochs} epochs: the widest that trains "
                        f"{target_epochs_for(budget, AUTO_WIDTH)}; lesson 06 §2)"
                    )
                    built = models[new_width] = build(new_width)
                    timing = (warm_took - warm["compile_s"]) * scale  # the timed steps, at the new width
                    # a quarter more than the last width's compile and steps: estimated from another width, it ran
                    # over (one core, 60 s: width 6 timed after width 8, the first epoch started at 6.0–6.05 s)
                    if clock() + PLANNING_MARGIN * (warm["compile_s"] + timing) <= PLANNING_SHARE * budget:
                        say(why + "; timing it too")
                        warm_started = clock()
                        new_warm = warm_up(built[1])
                        if new_warm["train_step_s"] is None:  # compiling it used the budget: keep the timed width
                            say(
                                f"Budget {budget:g} s: compiling width {new_width} took the time left for timing it "
                                f"→ back to width {width} (timed ~{epoch_s:.1f} s/epoch)"
                            )
                            built = models[width]
                            epochs = BudgetPlan.epochs_in(budget - clock() - final_s, epoch_s)
                            tried.append([width, round(epoch_s, 2), epochs])
                            break
                        warm = warms[new_width] = new_warm
                        warm_took = clock() - warm_started
                        epoch_s, final_s, views = BudgetPlan.estimates(warm, val_steps, test_steps, o.tta, budget)
                        epochs = BudgetPlan.epochs_in(budget - clock() - final_s, epoch_s)
                        tried.append([new_width, round(epoch_s, 2), epochs])
                        width, timed[new_width] = new_width, epoch_s
                        off = epoch_s / new_epoch_s
                        if len(timed) < 3 and max(off, 1 / off) > RECHOOSE_OFF_BY:
                            say(
                                f"Budget {budget:g} s: width {width} measured ~{epoch_s:.1f} s/epoch, not the "
                                f"~{new_epoch_s:.1f} s predicted → choosing again from the two widths timed"
                            )
                            continue
                    else:
                        # not timed: its first epoch compiles training and evaluation (the start width's times)
                        say(
                            why + "; not timed (planning stays within "
                            f"{PLANNING_SHARE:.0%} of the budget): the plan is corrected after each epoch"
                        )
                        warm = dict(
                            warm,
                            predicted_from_width=width,
                            train_step_s=warm["train_step_s"] * scale,
                            eval_step_s=warm["eval_step_s"] * scale,
                            train_epoch_s=warm["train_epoch_s"] * scale,
                            eval_epoch_s=warm["eval_epoch_s"] * scale,
                        )
                        epoch_s, final_s, views = BudgetPlan.estimates(warm, val_steps, test_steps, o.tta, budget)
                        epochs = BudgetPlan.epochs_in(budget - clock() - final_s - warm["compile_s"], epoch_s)
                        tried.append([new_width, round(epoch_s, 2), epochs])
                        width = new_width
                    break
        plan.width, plan.width_trials, plan.warm_up = width, tried, warm
        plan.epoch_estimate_s, plan.final_eval_estimate_s, plan.planning_elapsed_s = epoch_s, final_s, clock()
        plan.tta_views = views if o.tta else TTA_VIEWS  # corrected after the first epoch (Progress.on_epoch_end)
        plan.warm_up_epoch_s = epoch_s or None
        plan.epochs = plan.initial_epochs = epochs
        if warm["train_step_s"] is None:
            say(
                f"Budget {budget:g} s: the first step compiled in {warm['compile_s']:.1f} s; "
                f"{clock():.1f} s used so far → 1 epoch (no time left to time steps)"
            )
        else:
            measured = "predicted" if "predicted_from_width" in warm else "warm-up measured"
            say(
                f"Budget {budget:g} s: {measured} {warm['train_step_s'] * 1e3:.1f} ms/step "
                f"(compile excluded: {warm['compile_s']:.1f} s, counted), ~{epoch_s:.1f} s/epoch with validation; "
                f"{clock():.1f} s used so far → {epochs} epoch{'s' if epochs != 1 else ''}"
            )
        hint = stem_hint(width, epochs, stem) if auto_width else None
        if hint:
            say(f"Budget {budget:g} s: {hint}")
    plan.warmup_steps = BudgetPlan.warmup_for(plan.epochs, steps_per_epoch)
    return plan, built


def warm_up_per_start_up(cpu_xla: bool = False) -> float:
    """A separate warm-up's seconds per second of start-up: :data:`WARM_UP_PER_START_UP`, or
    :data:`WARM_UP_PER_START_UP_XLA` where the step compiles with XLA on a CPU."""
    return WARM_UP_PER_START_UP_XLA if cpu_xla else WARM_UP_PER_START_UP


def warm_up_fits(budget_s: float, elapsed_s: float, loading_s: float = 0.0, cpu_xla: bool = False) -> bool:
    """Whether a separate warm-up, estimated at :func:`warm_up_per_start_up` of the start-up it follows (the
    ``elapsed_s`` of the budget, less ``loading_s`` of loading the data: a download or a disk says nothing of how fast
    this machine compiles), ends within :data:`PLANNING_SHARE` of the budget; else the first epoch times itself."""
    return elapsed_s + warm_up_per_start_up(cpu_xla) * max(elapsed_s - loading_s, 0.0) <= PLANNING_SHARE * budget_s


def first_epoch_times(
    train: list,
    test: list,
    t_epoch: float,
    t_test: float | None,
    steps_per_epoch: int,
    eval_sizes: list[int],
    global_batch: int,
) -> dict:
    """A warm-up's figures (:func:`_warm_up`) from the first epoch of a process with one step per call:
    ``train``/``test``, ``(batch, perf_counter)`` at each call's end (:class:`~.callbacks.FirstEpochTimes`), the
    epoch's and its evaluation's start. The first call of each traced and compiled: left out. A training step: the
    median time between calls (a profiler's or a stall's call moves it little); the only call, compiling included, where
    there is one (an over-estimate the plan corrects after the next epoch). An evaluation step of one validation batch
    (its call compiled): a training step's time per image, a forward pass being at most that."""
    first_train = train[0][1] - t_epoch
    if len(train) > 1:
        train_step = statistics.median((b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(train, train[1:]))
    else:
        train_step = first_train / (train[0][0] + 1)
    per_image = train_step / global_batch
    if test and t_test is not None:
        first_eval = test[0][1] - t_test
        eval_step = whole_batch_s(test, eval_sizes) if len(test) > 1 else min(first_eval, per_image * eval_sizes[0])
    else:  # no evaluation ran in this epoch
        first_eval, eval_step = 0.0, per_image * eval_sizes[0]
    steps_before = train[0][0] + 1  # the steps the first call ran
    return {
        "train_step_s": train_step,
        "eval_step_s": eval_step,
        "compile_s": max(first_train - train_step * steps_before, 0.0) + max(first_eval - eval_step, 0.0),
        "timed_steps": train[-1][0] - train[0][0],
        "in_first_epoch": True,
        "predict_compile_estimate_s": max(first_eval - eval_step, 0.0),
        "train_epoch_s": train_step * steps_per_epoch,
        "eval_epoch_s": eval_step * len(eval_sizes),
    }


def _warm_up(
    model,
    train_ds,
    test_ds,
    spe: int,
    steps_per_epoch: int,
    test_steps: int,
    one_epoch_only: Callable[[], bool] = lambda: False,
    eval_sizes: list[int] | None = None,
) -> dict:
    """Time a few real steps (:data:`WARM_UP_STEPS`, and :data:`WARM_UP_MIN_S` at least, up to an epoch; the first
    call, which traces and compiles, is timed separately), then put the weights and optimizer state back as they were. If ``one_epoch_only()`` says so after the first call (the
    budget is spent), stop there: only ``compile_s`` is measured, every other figure is None.
    ``eval_sizes``: the images in each of ``test_ds``'s batches. ``eval_step_s`` is a whole (the first) batch's time,
    from the time per image of the batches timed: a last, partial batch is quicker (on the dev images the 151 images
    after 256 made a step look 40% shorter).
    Predict is not compiled here (it ran 0.35 s of a 60 s budget's planning on one core, and only the final
    evaluation uses it): ``predict_compile_estimate_s``, the evaluation's first call less a compiled step (the same
    forward pass, traced and compiled), is reserved for it in the final evaluation's estimate."""
    from .callbacks import WarmUpTimes

    snapshot = [v.numpy() for v in model.variables] + [v.numpy() for v in model.optimizer.variables]
    calls = max(4, math.ceil(min(WARM_UP_STEPS, steps_per_epoch) / spe)) + 1
    most = max(calls, math.ceil(steps_per_epoch / spe) + 1)  # timing WARM_UP_MIN_S: at most an epoch's calls
    t = WarmUpTimes(calls, WARM_UP_MIN_S, one_epoch_only)
    start = time.perf_counter()
    model.fit(train_ds.repeat().take(most * spe), epochs=1, verbose=0, callbacks=[t])
    first_train = t.train[0][1] - start

    def restore():
        for v, value in zip(list(model.variables) + list(model.optimizer.variables), snapshot):
            v.assign(value)

    if t.stopped:
        restore()
        return {
            "train_step_s": None,
            "eval_step_s": None,
            "compile_s": first_train,
            "train_epoch_s": None,
            "eval_epoch_s": None,
        }
    train_step = (t.train[-1][1] - t.train[0][1]) / (t.train[-1][0] - t.train[0][0])
    eval_calls = min(test_steps, 3)
    start = time.perf_counter()
    model.evaluate(test_ds.take(eval_calls), verbose=0, callbacks=[t])
    first_eval = t.test[0][1] - start
    if len(t.test) > 1:
        eval_step = whole_batch_s(t.test, eval_sizes)
    else:  # one test batch: its first call traced and compiled; time a compiled one (fit's evaluations reuse it)
        start = time.perf_counter()
        model.evaluate(test_ds.take(1), verbose=0)
        eval_step = time.perf_counter() - start
    restore()
    return {
        "train_step_s": train_step,
        "eval_step_s": eval_step,
        "compile_s": first_train + first_eval,
        "timed_steps": t.train[-1][0] - t.train[0][0],
        "predict_compile_estimate_s": max(first_eval - eval_step, 0.0),
        "train_epoch_s": train_step * steps_per_epoch,
        "eval_epoch_s": eval_step * test_steps,
    }
