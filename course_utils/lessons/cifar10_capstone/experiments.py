"""Lesson 06's experiments and claims: what the capstone notebook runs beside the trainer (the accuracy-against-budget
sweep, short runs per precision policy and XLA setting in fresh processes, a run killed and resumed on the command
line), and :func:`claims`, which turns the notebook's results into the lesson's table. The trainer itself is
:mod:`course_utils.capstone`."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

from ... import capstone, memory, processes, report
from ... import config as _config
from ...capstone import BudgetPlan, TTA_VIEWS
from ...runtime import whole_step_compiles

RECIPES = ("baseline", "course")  # §2, in the notebook's order
CLI = "course_utils.capstone"  # the trainer's command line: `python -m course_utils.capstone`, each run a new process
# forked from one that has imported TensorFlow and run nothing (course_utils.processes, fork=True: seconds sooner, on Linux)


def kill_and_resume(source: str, out: str, examples: int, epochs: int = 3, timeout: float = 600.0) -> dict:
    """§6: the trainer's command line (``epochs`` epochs of ``examples`` training and test images from ``source``,
    into ``out``: new, empty or an earlier run's) killed with SIGKILL once its first epoch is in ``metrics.json`` *and* in
    the ``BackupAndRestore`` checkpoint (the progress callback writes metrics.json first: killed between the two,
    the resumed run would start over), then the same command with ``--resume``.

    Returns the evidence: ``command``; ``killed_returncode`` (−9 when the kill landed); ``finished_at_kill`` (epochs
    in metrics.json then) and ``backed_up_at_kill`` (the backup's epoch); ``returncode`` and ``last_line`` of the
    resumed run; from its files ``resumed_after`` (the epoch the trainer says it resumed after: 0 = started over),
    ``epochs`` (in metrics.json), ``first_epoch_kept`` (epoch 1's record unchanged), ``time_counted`` (the
    resumed run's wall time includes the time spent before the kill) and ``plan_kept`` (plan.json — epochs, warm-up
    and schedule length — as the killed run chose it)."""
    import signal
    import time

    args = [
        "--data",
        source,
        "--epochs",
        str(epochs),
        "--out",
        out,
        "--quiet",
        "--train-examples",
        str(examples),
        "--test-examples",
        str(examples),
    ]
    cli = [sys.executable, "-m", CLI, *args]
    first_args = args + ["--overwrite"]  # the demo starts afresh (a notebook run again replaces its own run)

    problem = capstone.out_problem(out)  # the run starts afresh there, deleting only an earlier run's own files
    if problem:
        raise ValueError(problem)

    def read(name, default=None):
        try:
            with open(os.path.join(out, name)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return default

    def backed_up():
        meta = read(os.path.join("backup", "training_metadata.json"), {})  # written after the weights
        return int(meta.get("epoch", 0)) if isinstance(meta, dict) else 0

    first = processes.start(
        [sys.executable, "-m", CLI, *first_args], fork=True, env=dict(os.environ), stdout=subprocess.DEVNULL
    )
    deadline = time.monotonic() + timeout
    try:
        while (
            first.poll() is None
            and time.monotonic() < deadline
            and (len(read("metrics.json", [])) < 1 or backed_up() < 1)
        ):
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)  # epoch 2 has just started
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    history, plan = read("metrics.json", []), read("plan.json")
    spent = (read("clock.json", {}) or {}).get("elapsed_s", 0.0)
    r = {
        "command": cli,
        "killed_returncode": first.returncode,
        "finished_at_kill": len(history),
        "backed_up_at_kill": backed_up(),
    }
    try:
        resumed = processes.run(
            [sys.executable, "-m", CLI, *args, "--resume"], fork=True, env=dict(os.environ), timeout=timeout
        )
    except subprocess.TimeoutExpired:  # run() has killed its group
        raise RuntimeError(
            f"the resumed run did not finish within {timeout:g} s and was stopped; its files are in {out}"
        ) from None
    after = read("metrics.json", [])
    summary = read("summary.json", {}) or {}
    lines = resumed.stdout.strip().splitlines() or resumed.stderr.strip().splitlines() or [""]
    return {
        **r,
        "returncode": resumed.returncode,
        "last_line": lines[-1],
        "resumed_after": summary.get("resumed_after_epoch"),
        "epochs": [row.get("epoch") for row in after if isinstance(row, dict)],
        "first_epoch_kept": bool(history) and bool(after) and after[0] == history[0],
        "time_counted": summary.get("wall_time_s", 0.0) >= spent > 0,
        "plan_kept": plan is not None and read("plan.json") == plan,
    }


def budget_sweep(
    budgets, out: str, done: dict | None = None, data: str | None = None, progress=print
) -> dict[str, dict[float, dict]]:
    """§2's sweep: both recipes at each of ``budgets`` (seconds), ``{recipe: {budget: summary}}``. Runs in ``done``
    (the same shape, e.g. §2's at its own budget) are reused; each other run trains into ``out/<recipe>-<budget>s``. A
    finished run there is read back when it trained on the same data (``data``, else ``COURSE_DATA``), an unfinished
    one resumed after its last finished epoch (an interrupted sweep loses at most one epoch: run the cell again); a
    run there on other data, or one that cannot be resumed, is trained again, and the line says why."""
    rows: dict[str, dict[float, dict]] = {recipe: dict((done or {}).get(recipe, {})) for recipe in RECIPES}
    for budget in sorted(float(b) for b in budgets):
        for recipe in RECIPES:
            if budget in rows[recipe]:
                continue
            folder = os.path.join(out, f"{recipe}-{budget:g}s")
            what = f"{recipe} recipe, {budget:g} s budget"
            options = capstone.Options(
                recipe=recipe,
                time_budget=budget,
                out=folder,
                verbose=-1,
                overwrite=True,
                **({"data": data} if data else {}),
            )
            summary = (
                capstone.load_result(folder)["summary"]
                if os.path.exists(os.path.join(folder, "summary.json"))
                else None
            )
            if summary is not None:
                stored = summary.get("options") or {}
                same = stored.get("data") == data if data else summary.get("data") == _config.get().data
                if same and stored.get("recipe") == recipe and summary.get("budget_s") == budget:
                    rows[recipe][budget] = summary
                    continue
                progress(f"{what} (the run in {folder} trained on {summary.get('data')!r}: trained again)")
            elif os.path.exists(os.path.join(folder, capstone.MARKER)):
                progress(f"{what} (resumed)")
                try:
                    rows[recipe][budget] = capstone.train(
                        dataclasses.replace(options, resume=True, overwrite=False)
                    ).summary
                    continue
                except capstone.OptionsError as exc:  # another run's, or state the trainer did not write
                    progress(f"{what}: not resumed ({exc}): trained again")
            else:
                progress(what)
            rows[recipe][budget] = capstone.train(options).summary
    return rows


# §2's reference sweep: each run's test accuracy (%) on the development file of real CIFAR-10 images (4,068 training
# images, 407 of them held out for validation; 1,017 test), by CPU kernel path (hardware.KERNEL_PATHS), cores, recipe
# and budget (seconds). The protocol: the recipe's learning rate and test-time views were chosen, and its width rule
# and whitening layer checked, on the validation split (the epoch targets of budgets over a minute are older, chosen
# on the test split: lesson 06 §1); each run read the test split once, at its end, and nothing read there chose
# anything. Three runs per cell (600 s: one; the lesson quotes their median), each a fresh
# `python -m course_utils.capstone --data npz:FILE --recipe R --time-budget B` on one core (taskset) or two
# (measurements/2026-11-28-capstone-kernel-paths/sweep.py). DEV_SWEEP_UPDATES: the course's updates of 128 images
# (updates_of_128) in each cell, the median of its runs. 120 and 600 s: 2026-12-01; 60 s: 2026-12-02, with the trainer
# that starts training at once where start-up leaves no room for a warm-up (the machine ran 20-25% fewer images/s that
# day); Eigen's 60 s cells: 2026-12-03, with 64 per replica there (capstone.small_batch) and the stem chosen by a
# timed forward pass (capstone.AUTO_STEM: 4 runs of 6 kept the full stem), both recipes, one-core runs alone.
DEV_SWEEP_MACHINE = "2-core AMD EPYC VM (KVM, family 26), AVX-512 bfloat16, no AMX, TensorFlow 2.20.0, December 2026"
DEV_SWEEP = {
    "onednn-bf16": {
        2: {
            "baseline": {60: [52.6, 51.7, 51.3], 120: [52.3, 52.4, 52.5]},
            "course": {60: [73.4, 72.1, 74.7], 120: [78.9, 79.0, 80.7], 600: [83.7]},
        },
        1: {
            "baseline": {60: [52.6, 52.6, 52.5], 120: [52.1, 52.1, 52.0]},
            "course": {60: [72.3, 73.1, 74.1], 120: [78.6, 78.6, 77.8]},
        },
    },
    "onednn-fp32": {
        2: {
            "baseline": {60: [51.9, 50.9, 50.4], 120: [53.7, 54.1, 53.7]},
            "course": {60: [74.3, 70.8, 71.7], 120: [77.7, 76.4, 77.7]},
        },
        1: {
            "baseline": {60: [51.2, 54.0, 52.9], 120: [53.0, 53.4, 53.3]},
            "course": {60: [69.1, 71.1, 72.1], 120: [76.2, 76.2, 76.6]},
        },
    },
    "eigen": {
        2: {
            "baseline": {60: [52.3, 51.1, 51.0], 120: [51.1, 51.2, 50.9]},
            "course": {60: [66.1, 66.7, 67.1], 120: [78.8, 78.3, 75.4]},
        },
        1: {
            "baseline": {60: [51.2, 53.2, 52.1], 120: [52.3, 51.9, 52.3]},
            "course": {60: [65.2, 62.6, 65.4], 120: [71.3, 69.8, 69.1]},
        },
    },
}
DEV_SWEEP_UPDATES = {
    "onednn-bf16": {2: {60: 616, 120: 1204, 600: 2324}, 1: {60: 728, 120: 1008}},
    "onednn-fp32": {2: {60: 560, 120: 756}, 1: {60: 532, 120: 1204}},
    "eigen": {2: {60: 656, 120: 1344}, 1: {60: 484, 120: 1092}},
}


def plot_sweep(rows: dict[str, dict[float, dict]], reference: dict = DEV_SWEEP, label: str = "this run"):
    """Test accuracy against budget, a panel per CPU kernel path: ``reference``'s runs as thin lines (solid: 2 cores,
    dashed: one; the median of each budget's runs, the spread as a bar), ``rows`` (:func:`budget_sweep`) as large
    stars joined by a thick line — in the panel of the kernel path its runs took (their summaries' ``kernel_path``),
    or in every panel where they took none of them (a GPU or TPU). Returns the figure."""
    import statistics

    import matplotlib.pyplot as plt

    colors = {"baseline": "#1f77b4", "course": "#ff7f0e"}
    taken = {s.get("kernel_path") for by_budget in rows.values() for s in by_budget.values()}
    here = taken.pop() if len(taken) == 1 else None
    fig, axes = plt.subplots(1, len(reference), figsize=(4 * len(reference), 4), sharey=True, squeeze=False)
    ticks = sorted(
        {
            b
            for by_cores in reference.values()
            for by_recipe in by_cores.values()
            for runs in by_recipe.values()
            for b in runs
        }
        | {b for r in rows.values() for b in r}
    )
    for ax, (path, by_cores) in zip(axes[0], reference.items()):
        for cores, by_recipe in sorted(by_cores.items(), reverse=True):
            for recipe, runs in by_recipe.items():
                budgets = sorted(runs)
                med = [statistics.median(runs[b]) for b in budgets]
                err = [
                    [m - min(runs[b]) for b, m in zip(budgets, med)],
                    [max(runs[b]) - m for b, m in zip(budgets, med)],
                ]
                ax.errorbar(
                    budgets,
                    med,
                    yerr=err,
                    color=colors[recipe],
                    ls="-" if cores > 1 else "--",
                    lw=1,
                    marker=".",
                    capsize=2,
                    alpha=0.6,
                    label=f"{recipe}, {cores} core{'s' if cores > 1 else ''}",
                )
        if here == path or here not in reference:
            for recipe, by_budget in rows.items():
                budgets = sorted(by_budget)
                ax.plot(
                    budgets,
                    [100 * by_budget[b]["test_accuracy"] for b in budgets],
                    color=colors[recipe],
                    lw=2.5,
                    marker="*",
                    ms=14,
                    label=f"{recipe}, {label}",
                )
        ax.set_xscale("log")
        ax.set_xticks(ticks, [f"{b:g}" for b in ticks])
        ax.minorticks_off()
        ax.axhline(10, color="grey", lw=0.8, ls=":")
        ax.set(xlabel="time budget (s), log scale", title=path + (" (this machine)" if path == here else ""))
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("test accuracy (%)")
    fig.suptitle(f"Accuracy against budget, per CPU kernel path (thin lines: {DEV_SWEEP_MACHINE})", fontsize=9)
    fig.tight_layout()
    return fig


def sweep_leads(rows: dict[str, dict[float, dict]]) -> dict[float, float]:
    """The course recipe's lead over the baseline, in test-accuracy points, at each budget both ran."""
    both = sorted(set(rows["course"]) & set(rows["baseline"]))
    return {b: 100 * (rows["course"][b]["test_accuracy"] - rows["baseline"][b]["test_accuracy"]) for b in both}


PRECISION_EPOCHS = 3  # §5's short runs: the first epoch compiles and fills the cache; the median of the rest counts


def precision_variants(course_summary: dict, kind: str, xla_variant: bool = True) -> dict:
    """§5's variants, ``label → {"policy", "jit"}``: float32 and the policy the trainer chose (§2's course run), each
    with the trainer's XLA default for this hardware, and the chosen policy with XLA the other way round — except on
    a TPU, which compiles every step whatever it is told, on several replicas elsewhere, where fit cannot be
    compiled (keras-team/keras#19005: ``runtime.fit_jit_compile``), and where ``xla_variant`` is false (the
    lesson's ``capstone_precision_xla`` size, 0 in smoke mode, where its run, compiling on a CPU, took half of §5)."""
    chosen, jit = course_summary["policy"], bool(course_summary["jit_compile"])
    variants = {label: {"policy": p, "jit": jit} for label, p in (("float32", "float32"), (chosen, chosen))}
    if xla_variant and xla_comparable(kind, int(course_summary.get("replicas", 1))):
        variants[f"{chosen}, XLA {'off' if jit else 'on'}"] = {"policy": chosen, "jit": not jit}
    return variants


def precision_runs(
    source: str,
    variants: dict,
    repeats: int,
    examples: int,
    out: str,
    tensorboard: str | None = None,
    progress=None,
    timeout: float = 900.0,
) -> dict:
    """§5: each variant (:func:`precision_variants`) trained for :data:`PRECISION_EPOCHS` short epochs of ``examples``
    images by the trainer's command line — each run in its own fresh process, ``repeats`` times, the variants taking
    turns (a machine that slows down slows all alike), one at a time. With one repeat (smoke mode: no verdict comes
    from it) the variants run at the same time. Returns ``label → [summary.json of each repeat]``. A run that
    fails, or runs past ``timeout`` seconds, raises RuntimeError saying so, and the runs still going are stopped.
    ``tensorboard``: the chosen policy's first run writes its profile there (a few steps of its first epoch, which
    the throughput figure leaves out)."""
    runs: dict = {label: [] for label in variants}
    started: list = []
    try:
        _precision_runs(source, variants, repeats, examples, out, tensorboard, progress, timeout, runs, started)
    finally:  # one run failed or timed out, or Ctrl-C: stop the runs still going (smoke mode starts them together)
        for _label, _folder, proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return runs


def _precision_runs(source, variants, repeats, examples, out, tensorboard, progress, timeout, runs, started) -> None:
    for i in range(int(repeats)):
        started.clear()
        for n, (label, v) in enumerate(variants.items()):
            folder = os.path.join(out, f"{n}-{v['policy']}-{'xla' if v['jit'] else 'noxla'}-{i}")
            cli = [
                "--data",
                source,
                "--epochs",
                str(PRECISION_EPOCHS),
                "--policy",
                v["policy"],
                "--jit" if v["jit"] else "--no-jit",
                "--no-tta",
                "--quiet",
                "--train-examples",
                str(examples),
                "--test-examples",
                str(examples),
                "--out",
                folder,
                "--overwrite",
            ]  # a notebook run again replaces its own runs
            if tensorboard and i == 0 and n == 1:
                cli += ["--tensorboard", tensorboard]
            if progress:
                progress(
                    f"§5 {label}: run {i + 1} of {repeats}, a fresh process"
                    + (" (all variants at once: one run each is no verdict)" if repeats == 1 else "")
                )
            proc = processes.start(
                [sys.executable, "-m", CLI, *cli],
                fork=True,
                env=dict(os.environ),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            started.append((label, folder, proc))
            if repeats > 1:  # timed runs one at a time: a speed-up needs cores to itself
                _finish(*started.pop(), runs, timeout)
        for entry in started:  # one repeat (smoke mode): the variants ran at the same time
            _finish(*entry, runs, timeout)


def _finish(label: str, folder: str, proc, runs: dict, timeout: float) -> None:
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise RuntimeError(
            f"§5 run {label!r} did not finish within {timeout:g} s and was stopped: a busy or slow "
            "machine? Run the cell again, or lower sizes.capstone_precision_repeats"
        ) from None
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if proc.returncode != 0:
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"§5 run {label!r} exited with {proc.returncode}: {last}")
    runs[label].append(capstone.load_result(folder)["summary"])


def precision_table(runs: dict) -> list[dict]:
    """One row per variant: images/s per replica and peak memory, median and spread over its fresh processes."""
    rows = []
    for label, summaries in runs.items():
        ips = report.Samples([s["images_per_s_per_replica"] for s in summaries])
        peak = report.Samples([s["peak_memory_bytes"] for s in summaries])
        spread = "" if len(summaries) == 1 else (f" ({memory.format_bytes(peak.low)}–{memory.format_bytes(peak.high)})")
        rows.append(
            {
                "variant": label,
                "XLA": "on" if summaries[0]["xla"] else "off",
                "images/s/replica": ips.format(".0f", ""),
                "peak memory": memory.format_bytes(peak.median) + spread,
                "measured by": summaries[0]["peak_memory_method"],
            }
        )
    return rows


def _pairwise(runs: dict, top: str, bottom: str, key: str) -> list[float]:
    """``top / bottom`` of ``key``, repeat by repeat (repeat i of each ran one after the other)."""
    return [a[key] / b[key] for a, b in zip(runs[top], runs[bottom])]


def _longest_epoch(history: list[dict]) -> float:
    """The longest epoch of a run, as the budget sees it: wall time from one epoch's end to the next (what happens
    between epochs included), the first epoch's own time."""
    ends = [h["elapsed_s"] for h in history if "elapsed_s" in h]
    gaps = [b - a for a, b in zip(ends, ends[1:])]
    return max([h["epoch_time_s"] for h in history[:1]] + gaps)


def _budget_end(recipe: str, summary: dict, history: list[dict], budget: float, epoch_s: float) -> str:
    """``baseline: 118.3 s (longest epoch 5.1 s)``; past budget + one epoch, where the time went; short of budget − one
    epoch, what the plan was."""
    wall = summary["wall_time_s"]
    text = f"{recipe}: {wall:.1f} s (longest epoch {epoch_s:.1f} s)"
    if wall > budget + epoch_s and history and summary.get("trained_s") is not None:
        text += (
            f" — last epoch ended at {history[-1]['elapsed_s']:.1f} s, training at {summary['trained_s']:.1f} "
            f"s, then the test evaluation took {summary['final_eval_s']:.1f} s"
        )
    elif wall < budget - epoch_s - _early_margin(summary):
        text += (
            f" — stopped early: {summary['epochs']} epochs (first plan {summary.get('initially_planned_epochs')}, "
            f"last {summary.get('planned_epochs', summary['epochs'])}), {budget - wall:.1f} s of the budget unused"
        )
    return text


def _early_margin(summary: dict) -> float:
    """What the plan keeps back for the final evaluation beyond its estimate (:class:`capstone.BudgetPlan`: its safety
    factor over the evaluation steps, a fixed cost, and one per test-time view): time a run may leave unused on purpose,
    besides the part of an epoch that no longer fits. Where an epoch takes less than a second (a TPU) it is larger
    than the epoch."""
    views = summary.get("tta_views", TTA_VIEWS) if summary.get("tta") else 1  # sized to the budget
    return (
        BudgetPlan.FINAL_EVAL_MIN_S
        + BudgetPlan.FINAL_EVAL_VIEW_S * views
        + (BudgetPlan.FINAL_EVAL_SAFETY - 1) * float(summary.get("final_eval_s") or 0.0)
    )


def _ended_on_budget(summary: dict, budget: float, epoch_s: float) -> bool:
    """Within one (the longest) epoch of the budget on both sides: not late, and not stopped early (on the early side
    also the final evaluation's margin, :func:`_early_margin`)."""
    return budget - epoch_s - _early_margin(summary) <= summary["wall_time_s"] <= budget + epoch_s


# The lead claims hold where the budget buys the course's ResNet this many updates of 128 images per replica
# (updates_of_128: the training bought, whatever the batch), between the most
# where the lead was measured short of them and the fewest where it held (test split, medians of 3 at 60 s; the
# recipe's choices made on the validation split). On a 2-core AVX2 AMD EPYC (2026-11-28): TensorFlow's own kernels
# bought 140 updates on one core and 224-252 on two and led by -1.1 and +2.5 points, oneDNN in float32 280-308 and
# 364-420, +8.2 and +9.6 (measurements/2026-11-28-capstone-kernel-paths). On DEV_SWEEP's machine every cell with
# 532 updates or more led by 15 or more (oneDNN in float32, one core, 60 s: 532, +18.2); Eigen on one core at 60 s
# bought 420 on 2026-12-02 and led by +10.4 (532 and +15.3 the day before), and 456 of 128 (912 of 64) with the
# halved batch later that day, +10.6.
LEAD_MIN_UPDATES = 500


def updates_of_128(summary: dict) -> int:
    """A course run's training counted in updates of the recipe's 128 images per replica (epochs × steps × its
    per-replica batch / 128): its updates where it trained 128 per replica, half of them where auto width halved the
    batch (capstone.small_batch) — the same images seen, so the same training bought, whatever the batch."""
    per = summary.get("per_replica_batch") or capstone.COURSE["batch_size"]  # (a summary from before it was kept)
    return round(summary["epochs"] * summary["steps_per_epoch"] * per / capstone.COURSE["batch_size"])


BEATS_POINTS, LEAD_POINTS = 10, 15  # the course recipe's lead over the tutorial's, in points: one budget; every budget
LEARNED = 0.30  # test accuracy that says a network learned (chance: 10%)

# Every claim of the lesson, declared once: its words, threshold and the function that measures it (claims.json's
# "where": a report card's row leads to the code). A "speed" figure is judged on the accelerator's own speed: under a
# GPU or TPU stand-in a CPU measures it, so one that does not hold there is marked, not failed.
CLAIMS = report.LessonClaims(
    "06",
    [
        report.Declared(
            "06.course_beats_tutorial",
            "On real images, under one budget, the course recipe beats the tutorial's by ≥ {threshold} points",
            "§2",
            "≥ {threshold} points ahead on the test split",
            where=budget_sweep,
            figure="speed",
            threshold=BEATS_POINTS,
        ),
        report.Declared(
            "06.course_leads_15_points",
            "On real images the course recipe leads by ≥ {threshold} points at every budget measured",
            "§2",
            "≥ {threshold} points ahead at each budget of the sweep",
            where=budget_sweep,
            figure="speed",
            threshold=LEAD_POINTS,
        ),
        report.Declared(
            "06.tutorial_cnn_learns",
            "The tutorial's small CNN learns in the same budget",
            "§2",
            "> {threshold:.0%} from 100 updates (chance: 10%)",
            where="course_utils.capstone:train",
            threshold=LEARNED,
        ),
        report.Declared(
            "06.resnet_learns",
            "The ResNet learns once the budget buys it a few hundred updates",
            "§2",
            "> {threshold:.0%} from 300 updates",
            where="course_utils.capstone:train",
            threshold=LEARNED,
        ),
        report.Declared(
            "06.budget_kept",
            "A budgeted run ends within one epoch of its budget: not late, and not early",
            "§2",
            "{budget:g} s ± one epoch (early: + the final evaluation's margin)",
            where="course_utils.capstone:train",
            figure="speed",
        ),
        report.Declared(
            "06.resume_after_kill",
            "A run killed mid-epoch resumes after its last saved epoch: none "
            "repeated, none lost, the time before the kill counted",
            "§6",
            "resumed after epoch 1; epochs [1, 2, 3]",
            where=kill_and_resume,
        ),
        report.Declared(
            "06.policy_faster_than_float32",
            "The policy chosen for this hardware trains faster than float32",
            "§5; lesson 03",
            f"> {{threshold}}× (a CPU under XLA: about 1×, tested at > {report.NOTICEABLE_GAIN}×)",
            where=precision_runs,
            figure="speed",
            op=">",
            threshold=1.0,
            prose=f"more than {report.NOTICEABLE_GAIN}×",
        ),
        report.Declared(
            "06.xla_choice_not_slower",
            "The trainer's XLA choice for a {kind} (XLA {on}) trains at least as fast as the other",
            "§5; lesson 01",
            "> {threshold}× (the other way round within 5%, or slower)",
            where=precision_runs,
            figure="speed",
            op=">",
            threshold=0.95,
        ),
        report.Declared(
            "06.tta_does_not_hurt",
            "Test-time augmentation (mirrored and one-pixel-shifted copies) does not cost accuracy",
            "§4",
            "≥ −1 point",
            where="course_utils.capstone:train",
        ),
    ],
)


def claims(r: dict) -> list:
    """Lesson 06's claims from the notebook's results: ``summary`` and
    ``history`` map each recipe to its run's summary and per-epoch history; ``precision`` maps each variant of §5
    to its runs' summaries (:func:`precision_runs`)."""
    from ... import report

    budget = r["budget_s"]
    summary, history, precision = r["summary"], r["history"], r["precision"]
    base, course = summary["baseline"], summary["course"]
    gap = course["test_accuracy"] - base["test_accuracy"]
    epoch_s = {recipe: _longest_epoch(history[recipe]) for recipe in summary}
    # A run trains at least one epoch, whatever it takes: the budget claim tests the trainer's plan, so it is testable
    # only where the budget bought a plan of two epochs or more. With less (smoke mode's seconds: compiling and the
    # final evaluation take most of them) the one epoch every run trains is all there is, and setting up decides
    # where the run ends (beside a busy core a 4 s budget ended 0.8 s past "budget + one epoch" that way).
    room_for_an_epoch = all(s["initially_planned_epochs"] >= 2 for s in summary.values())
    real_images = r["data"] != "synthetic"
    sweep = r["sweep"]
    leads = sweep_leads(sweep)
    sweep_updates = {b: updates_of_128(s) for b, s in sweep["course"].items()}
    sweep_learned = all(n >= LEAD_MIN_UPDATES for n in sweep_updates.values())
    updates = {"baseline": base["epochs"] * base["steps_per_epoch"], "course": updates_of_128(course)}
    per = course.get("per_replica_batch") or capstone.COURSE["batch_size"]
    raw = "" if per == capstone.COURSE["batch_size"] else f" ({course['epochs'] * course['steps_per_epoch']} of {per})"
    few_updates = (
        f"the ResNet's updates (of 128 images) in this budget: {updates['course']}{raw}, fewer than the "
        f"{LEAD_MIN_UPDATES} where the "
        "lead was measured to hold (a slow machine, TensorFlow's own kernels, a short budget: §2 gives "
        "the leads measured there); longer budgets test it"
    )
    learned = course["test_accuracy_no_tta"] > 0.30
    tta_ran = course.get("tta_views", 10) > 1  # a budgeted run may keep one view only (capstone.FINAL_EVAL_SHARE)
    chosen, jit = course["policy"], bool(course["jit_compile"])
    # on a CPU under XLA, which computes bfloat16 convolutions in float32, the lesson expects about 1x: a gain must be
    # one a learner notices (at 1.0x the verdict flipped between runs of the same code)
    about_one = r["kind"] == "CPU" and jit
    policy_note = (
        ""
        if r["kind"] != "CPU"
        else (
            (
                "XLA on a CPU computes the bfloat16 convolutions in float32 (lesson 03): about 1×, not the "
                f"{report.NOTICEABLE_GAIN}× a gain needs"
                if about_one
                else "on a CPU bf16 is faster only with AVX512-BF16 or AMX, which most laptops lack"
            )
            + "; on a TPU or an Ampere-or-newer GPU expect a clear gain"
        )
    )
    repeats = min(len(v) for v in precision.values())
    # the chosen policy with XLA the other way round (precision_variants' label; where float32 was chosen, the float32
    # row is the chosen one, and this run is the second row, not the third)
    xla_other = next((label for label in precision if label.startswith(f"{chosen}, XLA ")), None)
    resume = r["resume"]
    # the kill must land inside epoch 2, with epoch 1 saved: else nothing was interrupted (or nothing was saved)
    killed_mid_run = (
        resume["killed_returncode"] == -9 and resume["finished_at_kill"] == resume["backed_up_at_kill"] == 1
    )
    resumed_right = (
        resume["resumed_after"] == 1
        and resume["epochs"] == [1, 2, 3]
        and resume["first_epoch_kept"]
        and resume["time_counted"]
        and resume["plan_kept"]
        and resume["returncode"] == 0
    )
    return CLAIMS.all(
        [
            CLAIMS.judge(
                "06.course_beats_tutorial",
                f"{course['test_accuracy']:.1%} vs {base['test_accuracy']:.1%} ({gap * 100:+.1f} points)",
                gap * 100 >= BEATS_POINTS if real_images and updates["course"] >= LEAD_MIN_UPDATES else None,
                ("" if updates["course"] >= LEAD_MIN_UPDATES else few_updates)
                if real_images
                else "synthetic images: run with COURSE_DATA=tfds or npz:PATH to test it (§2 says which runs on real "
                "images back it)",
            ),
            CLAIMS.judge(
                "06.course_leads_15_points",
                "; ".join(f"{b:g} s: {lead:+.1f}" for b, lead in leads.items()),
                all(lead >= LEAD_POINTS for lead in leads.values()) if real_images and sweep_learned else None,
                (
                    ""
                    if sweep_learned
                    else "a budget of the sweep bought the ResNet fewer than the "
                    f"{LEAD_MIN_UPDATES} updates of 128 images where the lead was measured to hold "
                    f"({', '.join(f'{b:g} s: {n}' for b, n in sweep_updates.items())}; smoke mode's seconds, a slow "
                    "machine, TensorFlow's own kernels): longer budgets test it"
                )
                if real_images
                else "synthetic images: run with COURSE_DATA=tfds or npz:PATH to test it (the figure of §2 shows "
                "the development images' sweep)",
            ),
            CLAIMS.judge(
                "06.tutorial_cnn_learns",
                f"{base['test_accuracy']:.1%} after {updates['baseline']} updates",
                base["test_accuracy"] > LEARNED if updates["baseline"] >= 100 else None,
                ""
                if updates["baseline"] >= 100
                else (
                    "this budget bought fewer than 100 updates (smoke mode's "
                    "seconds, or a slow machine): a longer --time-budget tests "
                    "it"
                ),
            ),
            CLAIMS.judge(
                "06.resnet_learns",
                f"{course['test_accuracy']:.1%} after {updates['course']} updates of 128",
                course["test_accuracy"] > LEARNED if updates["course"] >= 300 else None,
                ""
                if updates["course"] >= 300
                else (
                    "this budget bought fewer than 300 updates (smoke mode's "
                    "seconds, or a slow machine): a longer --time-budget tests "
                    "it"
                ),
            ),
            CLAIMS.judge(
                "06.budget_kept",
                "; ".join(
                    _budget_end(recipe, s, history[recipe], budget, epoch_s[recipe]) for recipe, s in summary.items()
                ),
                all(_ended_on_budget(s, budget, epoch_s[recipe]) for recipe, s in summary.items())
                if room_for_an_epoch
                else None,
                ""
                if room_for_an_epoch
                else "the budget bought only the one epoch every run trains: "
                "no plan to end on time (smoke mode's seconds, or a slow machine)",
                budget=budget,
            ),
            CLAIMS.judge(
                "06.resume_after_kill",
                f"killed with {resume['finished_at_kill']} epoch(s) saved; resumed after epoch "
                f"{resume['resumed_after']}; epochs {resume['epochs']}",
                resumed_right if killed_mid_run else None,
                ""
                if killed_mid_run
                else f"the kill did not land inside epoch 2 with epoch 1 saved (exit code {resume['killed_returncode']},"
                f" {resume['finished_at_kill']} epoch(s) in metrics.json, backup at epoch "
                f"{resume['backed_up_at_kill']})",
            ),
            _speed_claim(
                "06.policy_faster_than_float32",
                precision,
                chosen,
                "float32",
                repeats,
                policy_note,
                None if chosen != "float32" else "the trainer chose float32 on this hardware: nothing to compare",
                threshold=report.NOTICEABLE_GAIN if about_one else None,
            ),
            _xla_choice_claim(
                r["kind"],
                jit,
                course.get("xla_chosen_by", "trainer"),
                precision,
                chosen,
                xla_other,
                repeats,
                int(course.get("replicas", 1)),
                course.get("kernel_path"),
            ),
            CLAIMS.judge(
                "06.tta_does_not_hurt",
                f"{(course['test_accuracy'] - course['test_accuracy_no_tta']) * 100:+.1f} points",
                course["test_accuracy"] - course["test_accuracy_no_tta"] >= -0.01 if learned and tta_ran else None,
                "the model is near chance here: nothing for TTA to keep"
                if not learned
                else ""
                if tta_ran
                else "the budget left no time for a second test-time view (the trainer keeps at most 5% of it for "
                "the final evaluation): nothing was averaged",
            ),
        ]
    )


def xla_comparable(kind: str, replicas: int) -> bool:
    """Whether §5 can compare XLA on with off here: not on a TPU (it compiles every step), not on several replicas
    elsewhere (fit cannot be compiled there)."""
    return kind != "TPU" and whole_step_compiles(kind, replicas)


def _xla_choice_claim(
    kind: str,
    jit: bool,
    chosen_by: str,
    precision: dict,
    chosen: str,
    xla_other: str | None,
    repeats: int,
    replicas: int = 1,
    kernel_path: str | None = None,
):
    """The trainer's XLA default against the other setting. Where COURSE_JIT=1 or --jit/--no-jit set XLA for every
    run, the trainer chose nothing: the ratio is shown, the claim is not measurable (prove --jit measured 0.53× for
    the forced XLA-on against off on a 2-core CPU with oneDNN — the reason the trainer's default is off there). On
    TensorFlow's own kernels XLA's epochs ran faster once compiled (float32, full mode: off at 0.77× of on, the
    AVX-512 EPYC; 1.36× the images/s on one core of an AMX Xeon, 2026-12-03), so the trainer turns it on there — on
    x86-64 Linux, where it was measured (``recipes.eigen_xla_measured``); elsewhere an XLA-off default that is slower
    differs, with the reason."""
    eigen = kind == "CPU" and kernel_path == "eigen" and not jit
    claim = _speed_claim(
        "06.xla_choice_not_slower",
        precision,
        chosen,
        xla_other,
        repeats,
        "on TensorFlow's own kernels XLA fuses the step's elementwise ops, and once compiled its epochs run faster; "
        "the trainer turns it on there on x86-64 Linux, where that was measured, and not with --accumulate: "
        "try --jit"
        if eigen
        else "",
        None
        if xla_other
        else "a TPU compiles every step: there is no XLA-off run to compare"
        if kind == "TPU"
        else f"{replicas} replicas: fit cannot be compiled with XLA there "
        "(keras-team/keras#19005), so there is no XLA-on run to compare"
        if not xla_comparable(kind, replicas)
        else f"no run with XLA {'off' if jit else 'on'} in this mode (sizes.capstone_precision_xla: smoke mode "
        "leaves it out; full mode runs it)",
        kind=kind,
        on="on" if jit else "off",
    )
    if chosen_by != "trainer" and claim.holds is not None:
        what = "COURSE_JIT=1" if chosen_by == "COURSE_JIT" else "--jit/--no-jit"
        claim.holds, claim.differs_here = None, ""
        claim.note = (
            f"{what} set XLA {'on' if jit else 'off'} for every run, so the trainer chose nothing: run "
            "without it to test the trainer's own choice"
        )
    return claim


def _speed_claim(
    claim_id: str,
    precision: dict,
    top: str,
    bottom: str | None,
    repeats: int,
    differs_here: str,
    unmeasurable: str | None,
    threshold: float | None = None,
    **values,
):
    """``top``'s images/s per replica over ``bottom``'s, repeat by repeat (each pair from fresh processes), judged
    against the declared threshold (or ``threshold``)."""
    if unmeasurable:
        return CLAIMS.judge(claim_id, "nothing to compare", None, unmeasurable, **values)
    if repeats < 2:
        ratio = precision[top][0]["images_per_s_per_replica"] / precision[bottom][0]["images_per_s_per_replica"]
        return CLAIMS.judge(
            claim_id,
            f"{ratio:.2f}× (1 run each)",
            None,
            "one process per variant: a speed-up needs repeats (full mode runs 5)",
            **values,
        )
    return CLAIMS.judge_samples(
        claim_id,
        _pairwise(precision, top, bottom, "images_per_s_per_replica"),
        note=f"{top} vs {bottom}",
        differs_here=differs_here,
        threshold=threshold,
        **values,
    )
