"""Lesson 06's claims: :func:`measure` runs what the capstone notebook measures (the baseline and course recipes
under one budget, a run killed and resumed on the command line, a short run per precision policy) and
:func:`claims` turns the results into the lesson's table. The trainer itself is :mod:`course_utils.capstone`."""

from __future__ import annotations

import json
import os

RECIPES = ("baseline", "course")  # §2, in the notebook's order


def kill_and_resume(source: str, out: str, examples: int, epochs: int = 3) -> dict:
    """§6, as the notebook's cell runs it: the trainer's command line (``epochs`` epochs of ``examples`` training
    and test images from ``source``, into ``out``) killed with SIGKILL just after its first epoch is saved (at the
    start of the second, as a disconnect does), then the same command with ``--resume``. Returns
    ``{"killed_returncode", "finished_at_kill", "epochs" (the epochs in metrics.json after the resume),
    "returncode" (the resumed run's), "last_line" (its last line of output)}``."""
    import signal
    import subprocess
    import sys
    import time

    cli = [sys.executable, "-m", "course_utils.capstone", "--data", source, "--epochs", str(epochs), "--out", out,
           "--quiet", "--train-examples", str(examples), "--test-examples", str(examples)]
    metrics_path = os.path.join(out, "metrics.json")
    if os.path.exists(metrics_path):
        os.remove(metrics_path)  # a run from before: start clean
    first = subprocess.Popen(cli, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def finished_epochs():
        try:
            with open(metrics_path) as f:
                return len(json.load(f))
        except (OSError, ValueError):
            return 0

    while first.poll() is None and finished_epochs() < 1:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)  # epoch 2 has just started: what a Colab disconnect does
    first.wait()
    killed = {"killed_returncode": first.returncode, "finished_at_kill": finished_epochs()}
    resumed = subprocess.run(cli + ["--resume"], capture_output=True, text=True)
    try:
        with open(metrics_path) as f:
            epochs_seen = [row["epoch"] for row in json.load(f)]
    except (OSError, ValueError):
        epochs_seen = []
    lines = resumed.stdout.strip().splitlines() or resumed.stderr.strip().splitlines() or [""]
    return {**killed, "epochs": epochs_seen, "returncode": resumed.returncode, "last_line": lines[-1]}


def measure(lab) -> dict:
    """Everything lesson 06's claims need, measured the way the notebook measures it (``lab``: a
    :class:`course_utils.proof.Lab` — config, runtime and progress lines), with one progress line per training run:

    - §2: the baseline and the course recipe, each for the config's budget (``sizes.capstone_budget_s``: 2 minutes
      in full mode) — their summaries and per-epoch histories;
    - §5: three short epochs of the course recipe under float32 and under the policy the trainer chose (one run
      where it chose float32), without the notebook's TensorBoard profile: no claim reads the profile (§7), and it
      records a few steps of the first epoch, which the throughput figure leaves out;
    - §6: the command line killed after its first epoch and resumed.

    The ablation runs of §4 are skipped: no claim reads them (the flip-TTA claim comes from the course run of §2,
    which reports its accuracy with and without TTA), and each would cost one more budget. Runs write to a
    temporary folder, removed at the end. The notebook passes its own runs to :func:`claims` under the same keys."""
    import shutil
    import tempfile

    from .. import capstone

    sizes, budget = lab.sizes, lab.sizes.capstone_budget_s
    out_dir = tempfile.mkdtemp(prefix="course-06-")
    r: dict = {"budget_s": budget, "data": lab.cfg.data, "kind": lab.runtime.kind, "summary": {}, "history": {}}
    try:
        for recipe in RECIPES:
            lab.progress(f"§2 the {recipe} recipe, {budget:g} s budget")
            run = capstone.train(capstone.Options(recipe=recipe, time_budget=budget, out=f"{out_dir}/{recipe}",
                                                  verbose=-1))
            r["summary"][recipe], r["history"][recipe] = run.summary, run.history

        chosen = r["summary"]["course"]["policy"]
        r["throughput"] = {}
        for policy in dict.fromkeys(["float32", chosen]):  # once each
            lab.progress(f"§5 three short epochs under {policy}")
            run = capstone.train(capstone.Options(recipe="course", epochs=3, policy=policy, tta=False, verbose=-1,
                                                  train_examples=sizes.test_examples,  # a short run
                                                  out=f"{out_dir}/policy_{policy}"))
            r["throughput"][policy] = run.summary

        lab.progress("§6 the command line killed after its first epoch, then resumed")
        resume = kill_and_resume(lab.cfg.data, f"{out_dir}/cli", sizes.test_examples)
        r["resume_epochs"], r["resume_returncode"] = resume["epochs"], resume["returncode"]
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    return r


def claims(r: dict) -> list:
    """Lesson 06's claims from :func:`measure`'s results (or the notebook's, under the same keys): ``summary`` and
    ``history`` map each recipe to its run's summary and per-epoch history; ``throughput`` maps each policy of §5
    to its run's summary."""
    from .. import report

    budget = r["budget_s"]
    summary, history, throughput = r["summary"], r["history"], r["throughput"]
    base, course = summary["baseline"], summary["course"]
    gap = course["test_accuracy"] - base["test_accuracy"]
    epoch_s = {recipe: max(h["epoch_time_s"] for h in history[recipe]) for recipe in summary}
    # a run trains at least one epoch: the budget claim is testable only where setting up (compiling, the warm-up)
    # and the final evaluation left the budget room for it
    room_for_an_epoch = all(s["time_before_first_epoch_s"] + s["final_eval_s"] <= budget for s in summary.values())
    real_images = r["data"] != "synthetic"
    updates = {recipe: s["epochs"] * s["steps_per_epoch"] for recipe, s in summary.items()}
    learned = course["test_accuracy_no_tta"] > 0.30
    policy_note = "" if r["kind"] != "CPU" else ("on a CPU bf16 is often no faster, even with AMX or AVX512-BF16; "
                                                  "on a TPU or an Ampere-or-newer GPU expect a clear gain")
    mixed = [p for p in throughput if p != "float32"]
    speedup = (throughput[mixed[0]]["images_per_s_per_replica"] / throughput["float32"]["images_per_s_per_replica"]
               if mixed else None)
    epochs = r["resume_epochs"]
    out = [
        report.Claim("On real images, under one budget, the course recipe beats the tutorial's by ≥ 10 points", "§2",
                     "≥ 10 points ahead (dev set, 2 min, 2 CPU cores: about 20)",
                     f"{course['test_accuracy']:.1%} vs {base['test_accuracy']:.1%} ({gap * 100:+.1f} points)",
                     gap >= 0.10 if real_images else None,
                     "" if real_images else "synthetic images: run with COURSE_DATA=tfds or npz:PATH to test it"),
        report.Claim("The tutorial's small CNN learns in the same budget", "§2",
                     "> 30% from 100 updates (chance: 10%)",
                     f"{base['test_accuracy']:.1%} after {updates['baseline']} updates",
                     base["test_accuracy"] > 0.30 if updates["baseline"] >= 100 else None,
                     "" if updates["baseline"] >= 100 else "this budget bought fewer than 100 updates (smoke mode)"),
        report.Claim("The ResNet learns once the budget buys it a few hundred updates", "§2", "> 30% from 300 updates",
                     f"{course['test_accuracy']:.1%} after {updates['course']} updates",
                     course["test_accuracy"] > 0.30 if updates["course"] >= 300 else None,
                     "" if updates["course"] >= 300 else "this budget bought fewer than 300 updates (smoke mode)"),
        report.Claim("A budgeted run ends within one epoch of its budget", "§2", f"≤ {budget:g} s + one epoch",
                     "; ".join(f"{recipe}: {s['wall_time_s']:.1f} s (epoch {epoch_s[recipe]:.1f} s)"
                               for recipe, s in summary.items()),
                     all(s["wall_time_s"] <= budget + epoch_s[recipe] for recipe, s in summary.items())
                     if room_for_an_epoch else None,
                     "" if room_for_an_epoch else "setting up and the final evaluation alone took longer than the "
                                                  "budget: a run trains at least one epoch"),
        report.Claim("A run killed mid-epoch and resumed neither repeats nor loses an epoch", "§6", "epochs [1, 2, 3]",
                     f"{epochs}", epochs == [1, 2, 3] and r["resume_returncode"] == 0),
        report.Claim("The policy chosen for this hardware trains faster than float32", "§5; lesson 03", "> 1.0×",
                     f"{speedup:.2f}× ({mixed[0]})" if speedup else "float32 chosen: nothing to compare",
                     (speedup > 1.0) if speedup else None,
                     "" if speedup else "the trainer chose float32 on this hardware: no other policy to compare",
                     differs_here=policy_note),
        report.Claim("Flip test-time augmentation does not cost accuracy (mirror-symmetric classes)", "§4",
                     "≥ −1 point",
                     f"{(course['test_accuracy'] - course['test_accuracy_no_tta']) * 100:+.1f} points",
                     course["test_accuracy"] - course["test_accuracy_no_tta"] >= -0.01 if learned else None,
                     "" if learned else "the model is near chance here: nothing for TTA to keep"),
    ]
    for claim in out:
        claim.lesson = "06"
    return out
