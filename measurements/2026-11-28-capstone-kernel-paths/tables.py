#!/usr/bin/env python3
"""The sweep's figures as lesson 06 and the README quote them, from a folder of `sweep.py` runs:

    python measurements/2026-11-28-capstone-kernel-paths/tables.py runs/sweep [--jsonl OUT.jsonl]

Reads every run's summary.json (`<path>-<cores>c-<recipe>-<budget>s-<repeat>/`, whichever sweep.py process wrote
it), and prints ``DEV_SWEEP`` and ``DEV_SWEEP_UPDATES`` (course_utils/lessons/cifar10_capstone/experiments.py), the
README's table and lesson 06 §2's, and the validation medians beside them. Test accuracy is quoted, one read per
run at its end; validation accuracy is what every choice was made on. ``--jsonl``: the runs, one line each.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from sweep import KEEP  # noqa: E402

NAME = re.compile(r"(?P<path>.+)-(?P<cores>\d+)c-(?P<recipe>baseline|course)-(?P<budget>[\d.]+)s-(?P<repeat>\d+)$")
LABEL = {"onednn-bf16": "oneDNN, bfloat16 units", "onednn-fp32": "oneDNN, float32", "eigen": "TensorFlow's own (Eigen)"}


def rows(folder: pathlib.Path) -> list[dict]:
    out = []
    for summary_file in sorted(folder.glob("*/summary.json")):
        m = NAME.match(summary_file.parent.name)
        if not m:
            continue
        s = json.loads(summary_file.read_text(encoding="utf-8"))
        out.append({"run": m.group(0), "path": m["path"], "cores": int(m["cores"]), "recipe": m["recipe"],
                    "budget_s": float(m["budget"]), "repeat": int(m["repeat"]), **{k: s.get(k) for k in KEEP},
                    "cpu": s.get("hardware", {}).get("cpu_model")})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=pathlib.Path)
    p.add_argument("--jsonl", type=pathlib.Path)
    args = p.parse_args()
    runs = rows(args.folder)
    if args.jsonl:
        args.jsonl.write_text("".join(json.dumps(r) + "\n" for r in runs), encoding="utf-8")
    cell: dict = {}
    for r in runs:
        cell.setdefault((r["path"], r["cores"], r["budget_s"], r["recipe"]), []).append(r)
    paths = [p for p in LABEL if any(k[0] == p for k in cell)]
    sweep: dict = {}
    updates: dict = {}
    for (path, cores, budget, recipe), rs in cell.items():
        b = int(budget) if budget == int(budget) else budget
        rs.sort(key=lambda r: r["repeat"])
        sweep.setdefault(path, {}).setdefault(cores, {}).setdefault(recipe, {})[b] = [
            round(100 * r["test_accuracy"], 1) for r in rs]
        if recipe == "course":
            updates.setdefault(path, {}).setdefault(cores, {})[b] = round(statistics.median(  # updates of 128
                r["epochs"] * r["steps_per_epoch"] * (r.get("per_replica_batch") or 128) / 128 for r in rs))
    order = lambda d: {k: d[k] for k in sorted(d, key=lambda k: paths.index(k) if k in paths else k)}  # noqa: E731
    sweep = order({p: {c: {r: dict(sorted(v.items())) for r, v in sorted(by.items())}
                       for c, by in sorted(sweep[p].items(), reverse=True)} for p in sweep})
    updates = order({p: {c: dict(sorted(v.items())) for c, v in sorted(updates[p].items(), reverse=True)}
                     for p in updates})
    print("DEV_SWEEP =", repr(sweep))
    print("DEV_SWEEP_UPDATES =", repr(updates))
    budgets = sorted({k[2] for k in cell})
    # the median of the figures as DEV_SWEEP keeps them (one decimal), so that the tables agree with it to the digit
    med = lambda rs, key="test_accuracy": statistics.median(round(100 * r[key], 1) for r in rs)  # noqa: E731
    for style in ("readme", "lesson", "validation"):
        print(f"\n{style}:\n| kernel path, cores | " + " | ".join(f"{b:g} s" for b in budgets) + " |")
        print("|---|" + "---|" * len(budgets))
        for path in paths:
            for cores in sorted({k[1] for k in cell if k[0] == path}, reverse=True):
                out = []
                for b in budgets:
                    c, base = cell.get((path, cores, b, "course")), cell.get((path, cores, b, "baseline"))
                    key = "validation_accuracy" if style == "validation" else "test_accuracy"
                    if not c:
                        out.append("—")
                        continue
                    u = round(statistics.median(r["epochs"] * r["steps_per_epoch"] for r in c))
                    if not base:
                        out.append(f"{med(c, key):.1f}% (course; {len(c)} run{'s' * (len(c) > 1)}) · {u:,}")
                        continue
                    lead = f"{med(c, key) - med(base, key):+.1f}"
                    lead = f"**{lead}**" if style == "lesson" else lead
                    text = f"{med(c, key):.1f}% vs {med(base, key):.1f}% ({lead})"
                    if style != "readme":
                        text += f" · {u:,}"
                    out.append(text)
                print(f"| {LABEL[path]}, {cores} core{'s' * (cores > 1)} | " + " | ".join(out) + " |")
    print("\nplanning: the course's first epoch from process start (s, share of the budget), widths, TTA views")
    for (path, cores, budget, recipe), rs in sorted(cell.items()):
        print(f"{path:12s} {cores}c {budget:5g}s {recipe:9s} first epoch at "
              f"{[round(r['time_before_first_epoch_s'] or 0, 1) for r in rs]} "
              f"({max((r['time_before_first_epoch_s'] or 0) for r in rs) / budget:.0%} at most) "
              f"wall {[round(r['wall_time_s'], 1) for r in rs]} width {[r['width'] for r in rs]} "
              f"epochs {[r['epochs'] for r in rs]} views {[r['tta_views'] for r in rs]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
