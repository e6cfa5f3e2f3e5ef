#!/usr/bin/env python3
"""The capstone's recipes on every CPU kernel path (issue 48): each run is the README's own command,
``python -m course_utils.capstone --data npz:FILE --recipe R --time-budget B``, in a fresh process, on a kernel path
(``course_utils.hardware.KERNEL_PATHS``: its environment) and on one core (``taskset``) or all.

    python measurements/2026-11-28-capstone-kernel-paths/sweep.py --data ../shared/data/cifar10_real_dev.npz \\
        --paths eigen onednn-fp32 onednn-bf16 --cores 1 2 --budgets 60 120 --repeats 3 --out runs/sweep

Every run writes ``OUT/<path>-<cores>c-<recipe>-<budget>s-<repeat>/`` (the capstone's folder) and one line of
``OUT/runs.jsonl``; a run whose summary.json exists is not run again (an interrupted sweep goes on). The table
printed reads **validation** accuracy (the capstone's validation split: 10% of the training images, its own seed):
what every choice is made on. ``--test`` prints the test split's instead — for the figures quoted once the choices
are made, never to choose.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from course_utils import hardware  # noqa: E402  (no TensorFlow)

KEEP = ("test_accuracy", "test_accuracy_no_tta", "validation_accuracy", "best_validation_accuracy", "epochs",
        "width", "policy", "wall_time_s", "time_before_first_epoch_s", "final_eval_s", "images_per_s",
        "kernel_path", "kernel_path_why", "width_trials", "train_examples", "validation_examples", "test_examples",
        "steps_per_epoch", "tta_views", "budget_used_s", "stem", "global_batch", "per_replica_batch", "stem_why",
        "stem_forward_s_per_image")


def run_one(args, path: str, cores: int, recipe: str, budget: float, repeat: int) -> dict:
    name = f"{path}-{cores}c-{recipe}-{budget:g}s-{repeat}"
    folder = args.out / name
    summary_file = folder / "summary.json"
    if not summary_file.exists():
        env = dict(os.environ, **hardware.KERNEL_PATHS[path]["env"], PYTHONUNBUFFERED="1")
        if path != "onednn-fp32":
            env.pop("ONEDNN_MAX_CPU_ISA", None)
        command = [sys.executable, "-m", "course_utils.capstone", "--data", f"npz:{args.data}", "--recipe", recipe,
                   "--time-budget", f"{budget:g}", "--out", str(folder), "--quiet", "--overwrite", *args.extra]
        if cores < (os.cpu_count() or 1):
            cpus = range(args.first_core, args.first_core + cores)
            command = ["taskset", "-c", ",".join(str(c) for c in cpus), *command]
        start = time.perf_counter()
        proc = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
        (args.out / f"{name}.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
        if proc.returncode != 0:
            raise SystemExit(f"{name}: exit {proc.returncode}; see {args.out / (name + '.log')}")
        print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)
    summary = json.loads(summary_file.read_text(encoding="utf-8"))
    row = {"run": name, "path": path, "cores": cores, "recipe": recipe, "budget_s": budget, "repeat": repeat,
           **{k: summary.get(k) for k in KEEP}, "cpu": summary.get("hardware", {}).get("cpu_model")}
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="the .npz of real CIFAR-10 images (train and test splits)")
    p.add_argument("--paths", nargs="+", default=list(hardware.KERNEL_PATHS), choices=list(hardware.KERNEL_PATHS))
    p.add_argument("--cores", nargs="+", type=int, default=[2])
    p.add_argument("--budgets", nargs="+", type=float, default=[60.0])
    p.add_argument("--recipes", nargs="+", default=["baseline", "course"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--first-core", type=int, default=0, help="the first CPU a run with fewer cores than the machine's "
                   "is pinned to (two one-core sweeps side by side: 0 and 1)")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/sweep"))
    p.add_argument("--test", action="store_true", help="print the test split's accuracy (quote it; never choose by it)")
    p.add_argument("extra", nargs="*", help="after --: more capstone options (e.g. -- --width 4)")
    args = p.parse_args()
    args.data = str(pathlib.Path(args.data).resolve())
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for repeat in range(args.repeats):
        for path in args.paths:
            for cores in args.cores:
                for budget in args.budgets:
                    for recipe in args.recipes:
                        rows.append(run_one(args, path, cores, recipe, budget, repeat))
    with open(args.out / "runs.jsonl", "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    key = "test_accuracy" if args.test else "validation_accuracy"
    print(f"\nmedian {key} (%), epochs, width; first epoch at (s)")
    groups: dict = {}
    for row in rows:
        groups.setdefault((row["path"], row["cores"], row["budget_s"], row["recipe"]), []).append(row)
    for (path, cores, budget, recipe), runs in sorted(groups.items()):
        acc = statistics.median(100 * r[key] for r in runs)
        print(f"{path:12s} {cores}c {budget:5g}s {recipe:9s} {acc:5.1f}  "
              f"[{', '.join(f'{100 * r[key]:.1f}' for r in runs)}]  epochs {[r['epochs'] for r in runs]} "
              f"width {[r['width'] for r in runs]} first epoch at {[round(r['time_before_first_epoch_s'] or 0, 1) for r in runs]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
