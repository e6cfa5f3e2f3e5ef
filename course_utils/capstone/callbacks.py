"""The Keras objects a capstone run hands to ``fit``: the budget's learning-rate schedule, the warm-up's clock, the
plan's progress bar and the line per epoch that keeps ``metrics.json``, ``clock.json`` and the plan up to date.

This module imports Keras: :mod:`.trainer` loads it when a run starts, after the options and the output folder were
checked (``import course_utils.capstone`` stays without TensorFlow)."""

from __future__ import annotations

import time
from typing import Callable

import keras
import tensorflow as tf

from .. import fileguard
from .options import Options
from .plan import BudgetPlan
from .run_folder import RunFolder


class BudgetSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to ``peak``, then linear decay to zero at ``total_steps`` ("onecycle"), or ``peak``
    throughout ("constant"). The step counts are variables, so the plan can change after compiling."""

    def __init__(self, peak: float, kind: str = "onecycle"):
        self.kind = kind
        self.peak = tf.Variable(float(peak), trainable=False, dtype=tf.float32, name="peak_lr")
        self.warmup_steps = tf.Variable(1.0, trainable=False, dtype=tf.float32, name="warmup_steps")
        self.total_steps = tf.Variable(2.0, trainable=False, dtype=tf.float32, name="total_steps")

    def set_plan(self, warmup_steps: float, total_steps: float) -> None:
        self.total_steps.assign(max(float(total_steps), 1.0))
        self.warmup_steps.assign(min(max(float(warmup_steps), 1.0), max(float(total_steps) - 1, 1.0)))

    def __call__(self, step):
        if self.kind == "constant":
            return tf.identity(self.peak)
        step = tf.cast(step, tf.float32)
        up = self.peak * (step + 1.0) / self.warmup_steps
        down = (
            self.peak * tf.maximum(self.total_steps - step, 0.0) / tf.maximum(self.total_steps - self.warmup_steps, 1.0)
        )
        return tf.minimum(up, down)

    def value(self, step: int) -> float:
        return float(self(step))

    def get_config(self):
        return {"peak": float(self.peak.numpy()), "kind": self.kind}


class WarmUpTimes(keras.callbacks.Callback):
    """The warm-up's clock: when each training and test batch ended (``.train``, ``.test``: ``(batch, seconds)``).
    Stops fit after ``calls`` calls once they span ``min_s`` seconds, or after the first call when
    ``one_epoch_only()`` says the budget is spent (``.stopped``)."""

    def __init__(self, calls: int, min_s: float, one_epoch_only: Callable[[], bool]):
        super().__init__()
        self.calls, self.min_s, self.one_epoch_only = calls, min_s, one_epoch_only
        self.train, self.test = [], []
        self.stopped = False

    def on_train_batch_end(self, batch, logs=None):
        self.train.append((batch, time.perf_counter()))
        if len(self.train) == 1 and self.one_epoch_only():
            self.model.stop_training = self.stopped = True
        elif len(self.train) >= self.calls and self.train[-1][1] - self.train[0][1] >= self.min_s:
            self.model.stop_training = True

    def on_test_batch_end(self, batch, logs=None):
        self.test.append((batch, time.perf_counter()))


class FirstEpochTimes(keras.callbacks.Callback):
    """When each training and test call of an epoch ended (``.train``, ``.test``: ``(batch, perf_counter)``), for
    :class:`Progress` to plan from its process's first epoch; Progress empties them at each epoch's end. (A callback
    of its own: one that has ``on_test_batch_end`` turns Keras' asynchronous evaluation calls off.)"""

    def __init__(self):
        super().__init__()
        self.train, self.test = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.train.append((batch, time.perf_counter()))

    def on_test_batch_end(self, batch, logs=None):
        self.test.append((batch, time.perf_counter()))


class PlanProgbar(keras.callbacks.ProgbarLogger):
    """Keras' progress bar, showing the current plan's epoch count ("Epoch 3/17") rather than fit's cap."""

    def __init__(self, plan: BudgetPlan):
        super().__init__()
        self.plan = plan

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs = self.plan.epochs
        super().on_epoch_begin(epoch, logs)


class Progress(keras.callbacks.Callback):
    """One line per epoch, metrics.json after every epoch, clock.json every few seconds, the plan refitted to
    the budget after every epoch (:meth:`BudgetPlan.replan`)."""

    def __init__(
        self,
        o: Options,
        plan: BudgetPlan,
        run: RunFolder,
        clock,
        history,
        schedule,
        steps_per_epoch: int,
        say,
        time_view: Callable[..., list[float]] | None = None,
        *,
        global_batch: int,
        plan_first_epoch: Callable[..., str] | None = None,
    ):
        super().__init__()
        # With no separate warm-up (plan.in_first_epoch): the first epoch's call ends (FirstEpochTimes, which the
        # trainer puts before the callbacks that save) make the plan, through plan_first_epoch
        self.plan_first_epoch = plan_first_epoch
        self.first_epoch = FirstEpochTimes() if plan_first_epoch is not None else None
        self.cap: int | None = None  # the plan's cap once made in the first epoch (else fit's epochs)
        self.o, self.plan, self.run, self.clock, self.history = o, plan, run, clock, list(history)
        self.global_batch = global_batch
        self.schedule, self.steps_per_epoch, self.say = schedule, steps_per_epoch, say
        self.time_view, self.view_times = time_view, []
        self.last_tick = 0.0
        self.pending: list[str] = []
        self.epoch_times: list[float] = []

    def _flush(self):
        for line in self.pending:
            self.say(line, flush=True)
        self.pending = []

    def on_train_end(self, logs=None):
        self._flush()

    def on_epoch_begin(self, epoch, logs=None):
        self._flush()
        self.t_epoch = time.perf_counter()
        self.t_test = None

    def on_test_begin(self, logs=None):
        self.t_test = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        if now - self.last_tick > 2.0:
            self.last_tick = now
            fileguard.write_json(self.run.clock, {"elapsed_s": self.clock()})

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        step = int(self.model.optimizer.iterations.numpy())
        lr = self.schedule.value(max(step - 1, 0))  # the rate the epoch's last step ran at
        planned = None
        timed = self.first_epoch
        if timed is not None and timed.train and self.plan.in_first_epoch and not self.epoch_times:
            # the plan, from this epoch's own steps (no warm-up ran before it), saved at once: a kill from here on
            # resumes with it
            fit_cap = self.params.get("epochs") or self.plan.epochs
            planned = self.plan_first_epoch(timed.train, timed.test, self.t_epoch, self.t_test, epoch + 1, fit_cap)
            self.cap = min(fit_cap, max(2 * self.plan.epochs, self.plan.epochs + 5))  # as fit's cap after a warm-up
            self.schedule.set_plan(*self.plan.schedule_steps())
            fileguard.write_json(self.run.plan, self.plan.to_dict())
        if timed is not None:
            timed.train, timed.test = [], []
        view_line = None
        due = (
            self.plan.view_to_time(len(self.epoch_times) + 1, len(self.view_times), epoch + 1)
            if self.time_view is not None
            else None
        )
        if due:
            # measure the final evaluation rather than estimate it; counted in this epoch's time (the first
            # compiles anyway; the plan leaves out the first epoch once others are measured, and the slowest)
            self.view_times += self.time_view(compile=due == "first")
            before = self.plan.final_eval_estimate_s
            view_s = self.plan.final_view_s = min(self.view_times)
            views = self.plan.tta_views = self.plan.views_from_view(view_s, self.o.tta)
            self.plan.final_eval_estimate_s = BudgetPlan.final_eval_from_view(view_s, views)
            view_line = (
                f"  (final evaluation: a view of the test split took {view_s:.2f} s "
                f"(the fastest of {len(self.view_times)}) → {views} view{'s' * (views > 1)}, "
                f"{self.plan.final_eval_estimate_s:.1f} s kept for it, was {before:.1f} s)"
            )
        now = time.perf_counter()
        train_s = (self.t_test or now) - self.t_epoch
        images = self.steps_per_epoch * self.global_batch
        entry = {
            "epoch": epoch + 1,
            "elapsed_s": self.clock(),
            "epoch_time_s": now - self.t_epoch,
            "train_time_s": train_s,
            "images": images,
            "train_loss": float(logs.get("loss", float("nan"))),
            "train_accuracy": float(logs.get("accuracy", float("nan"))),
            "val_loss": float(logs.get("val_loss", float("nan"))),
            "val_accuracy": float(logs.get("val_accuracy", float("nan"))),
            "images_per_s": images / train_s if train_s > 0 else None,
            "lr": lr,
            "planned_epochs": self.plan.epochs,
        }
        # For the plan: wall time since the previous epoch's end in this process (what happens between
        # epochs costs budget too); an epoch's own time for the first one here.
        previous = self.history[-1]["elapsed_s"] if self.epoch_times else None
        self.history.append(entry)
        self.epoch_times.append(entry["elapsed_s"] - previous if previous is not None else entry["epoch_time_s"])
        fileguard.write_json(self.run.metrics, self.history)
        fileguard.write_json(self.run.clock, {"elapsed_s": entry["elapsed_s"]})
        # Printed at the next epoch's start / the end: Keras' progress bar finishes its line after us.
        self.pending.append(
            f"epoch {epoch + 1}/{self.plan.epochs} · {entry['elapsed_s']:.1f} s · train loss "
            f"{entry['train_loss']:.4f} · val acc {100 * entry['val_accuracy']:.2f}% · "
            f"{entry['images_per_s']:.0f} images/s"
        )
        if planned:
            self.pending.append(planned)
        if view_line:
            self.pending.append(view_line)
        if self.o.verbose < 1 or not getattr(self, "bar", False):  # no bar to finish its line first
            self._flush()
        cap = self.cap or self.params.get("epochs") or self.plan.epochs
        changed = self.plan.replan(epoch + 1, self.clock(), self.epoch_times, cap)
        if changed or due:  # the new plan, or the final evaluation's measured views and estimate
            fileguard.write_json(self.run.plan, self.plan.to_dict())
        if changed:
            old, new, left, epoch_s = changed
            self.schedule.set_plan(*self.plan.schedule_steps())
            decay = "; the LR decay now ends there" if self.o.schedule == "onecycle" else ""
            self.pending.append(
                f"  (budget: {left:.0f} s left at {epoch_s:.1f} s/epoch: plan {old} -> {new} epochs{decay})"
            )
        if epoch + 1 >= self.plan.epochs:
            self.model.stop_training = True
