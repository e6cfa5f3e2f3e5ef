"""Lesson 06: the CIFAR-10 capstone — a headless trainer that gets the best accuracy a time budget allows.

Command line (the notebook calls the same code through :func:`train`)::

    python -m course_utils.capstone --data npz:cifar10.npz --recipe course --time-budget 120 --out runs/c120

Two recipes:

``course``    everything lessons 01-05 teach, plus the field's fast-CIFAR tricks (David Page's ResNet-9 /
              DAWNBench; airbench): a ResNet-9-style network for 32×32 images, the hardware's precision
              policy, a tf.data pipeline that augments whole batches (random crop, pad 4, + flip per image with
              ``data.augment_batch`` after ``batch``: the order lesson 04 measured faster), per-channel
              normalization, SGD with Nesterov momentum and decoupled weight decay, label smoothing 0.2, a
              warm-up then a linear decay to zero shaped to end exactly at the budget, a batch of 128 *per
              replica* (the global batch grows with the replicas, as lesson 08's TPU table) with the peak
              learning rate scaled linearly with that global batch, ``steps_per_execution`` 32 on a TPU
              (lesson 04), test-time augmentation (mirror, one-pixel shifts), optional weight averaging (EMA)
              and gradient accumulation (lesson 05).
``baseline``  exactly the popular TensorFlow CNN tutorial: Conv32-pool-Conv64-pool-Conv64-Flatten-Dense64,
              Adam (1e-3), a global batch of 32 whatever the replicas (the tutorial's: Keras' default; the comparison),
              pixels /255, no augmentation, float32 — under the same budget rules.

Budgeted training (``--time-budget S``): the wall time counts everything — start-up, data loading, building,
compiling, a short timed warm-up, every epoch's validation and the final (TTA) test evaluation. The warm-up
runs a few real training and evaluation steps (weights and optimizer state are restored afterwards),
measures the step time *without* the first call (which traces and compiles; its time is still counted
against the budget because it has already been spent), and chooses the number of epochs that fits in
what is left. The learning-rate schedule is stretched to end at that epoch. After every epoch the plan
is checked against the measured epoch time (:class:`BudgetPlan` owns that arithmetic and its margins).

Splits: a validation split is held out of the training images (:data:`VALIDATION_FRACTION`, at most
:data:`MAX_VALIDATION`, the same images for every run on the same data); each epoch is evaluated on it, the best
checkpoint is chosen on it, and ablations and exercises compare runs on it. The test split is evaluated once,
at the end, with the last epoch's weights: ``summary.json`` reports both.

Fault tolerance: ``keras.callbacks.BackupAndRestore`` saves the weights and optimizer state after every
epoch; a run killed mid-epoch and restarted with ``--resume`` continues after the last finished epoch
with the same plan (``plan.json``), counts the time already spent (``clock.json``, updated every few
seconds) against the budget and continues ``metrics.json``. State that is not what the trainer wrote is
refused with the reason; finished work is never discarded silently.

The output folder: a run writes only into a folder that is new, empty, or a capstone run already (its marker
file :data:`MARKER`); anything else is refused before anything is written, and starting again there deletes only
the trainer's own files, after the options and the data have been checked.

Import this module without TensorFlow loading: bad options are rejected before TensorFlow starts.

The package, one module per part, each importing only those listed before it: :mod:`.options` (what a run may be
asked, and the recipes' constants), :mod:`.models`, :mod:`.recipes`, :mod:`.plan` (the budget arithmetic, without
TensorFlow), :mod:`.run_folder` (the output folder, resuming), :mod:`.checks` (:func:`validate`), :mod:`.trainer`
(:func:`train`; it loads :mod:`.callbacks`, the Keras schedule and callbacks, when a run starts) and
:mod:`.cli`. This module hands on the names a notebook or another module uses.
"""

from __future__ import annotations

from .options import (
    CLASSES,
    POLICIES,
    SCHEDULES,
    PROG,
    COURSE,
    BASELINE,
    MAX_EPOCHS,
    MAX_SCHEDULE_STEPS,
    MAX_BUDGET_S,
    MAX_BATCH,
    MAX_WIDTH,
    MAX_STEPS_PER_EXECUTION,
    MAX_SEED,
    MARKER,
    LOCK,
    RUN_FILES,
    RUN_FOLDERS,
    BACKUP_FILES,
    tensorboard_installed,
    OptionsError,
    RunStateError,
    Options,
    is_int,
    own_name,
    own_backup_name,
    folder_problem,
    out_problem,
    divisor_below,
    bounded,
    STEMS,
)
from .models import whitening_kernel, resnet9, tutorial_cnn
from .recipes import (
    TPU_STEPS_PER_EXECUTION,
    MAX_LR_SCALING_BATCH,
    RECIPE_TABLE,
    Recipe,
    RECIPES,
    resolved,
    choose_steps_per_execution,
    choose_jit,
    peak_learning_rate,
)
from .plan import (
    AUTO_WIDTH,
    start_width,
    SMALL_BATCH,
    small_batch,
    FEW_EPOCHS,
    AUTO_STEM,
    auto_stem_applies,
    choose_stem,
    stem_hint,
    RECHOOSE_OFF_BY,
    TTA_CHOICES,
    TTA_SHIFTS,
    TTA_VIEWS,
    FINAL_EVAL_SHARE,
    tta_views_for,
    PLANNING_SHARE,
    PLANNING_MARGIN,
    WARM_UP_STEPS,
    WARM_UP_MIN_S,
    VALIDATION_FRACTION,
    MAX_VALIDATION,
    VALIDATION_SEED,
    resnet9_macs,
    predicted_epoch_s,
    width_model,
    target_epochs_for,
    choose_width,
    validation_size,
    BudgetPlan,
    whole_batch_s,
)
from .run_folder import (
    earlier_run,
    repair_backup,
    load_result,
    RunFolder,
    ResumeState,
    backup_epoch,
    read_resume_state,
    check_same_batch,
    check_backup_fits,
)
from .checks import CourseSettings, course_settings, validate
from .trainer import (
    progress_bar_wanted,
    SYNTHETIC_NOTE,
    Predictions,
    Result,
    tta_views,
    Splits,
    split_validation,
    train,
)
from .cli import build_parser, parse_args, main, in_cli_words
