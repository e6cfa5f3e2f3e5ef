"""Which lines of ``course_utils`` a learner reaches (issue 49: "every line reached by a notebook or a learner's
command"): runs the learners' commands under coverage — ``prove`` (which executes every notebook), the capstone's
command line, ``doctor``, ``cluster`` — with every Python process they start measured too (the notebooks' kernels,
the fork server's children, the cluster's tasks: coverage's own ``a1_coverage.pth`` starts it wherever
``COVERAGE_PROCESS_START`` is set), and writes what was reached, per module::

    python -m devtools.coverage_map --out runs/coverage            # smoke mode: about 15 minutes on 2 cores
    python -m devtools.coverage_map --out runs/coverage --mode full --data synthetic

``OUT/coverage.json`` (coverage's own JSON report), ``OUT/map.md`` (one row per module: statements, reached,
missed, and the functions no command entered). A module none reaches is a candidate to move to ``devtools/`` or
``tests/`` or to delete; a missed branch may still be one a TPU, a GPU or full mode takes (the map says which
mode and shape it ran), so read it before cutting.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

RC = """\
[run]
source = course_utils
parallel = true
data_file = {data}
patch = fork, _exit, subprocess
"""


def commands(out: pathlib.Path, mode: str, data: str, jobs: int, shapes=()) -> list[tuple[str, list[str]]]:
    """The learners' commands the map runs, each ``(name, argv)``: what the README tells a learner to type; then
    ``prove`` once more per stand-in shape (a TPU's or a GPU's branches, run on this CPU). A name ending in
    ``(refused)`` is a mistake a learner makes, which must exit 2 with its message."""
    py = sys.executable
    prove = [py, "-m", "course_utils", "prove", "--mode", mode, "--data", data, "--jobs", str(jobs)]
    return [
        ("doctor", [py, "-m", "course_utils", "doctor", "--offline"]),
        ("help", [py, "-m", "course_utils", "--help"]),
        ("capstone --help", [py, "-m", "course_utils.capstone", "--help"]),
        (
            "capstone (budget)",
            [py, "-m", "course_utils.capstone", "--data", "synthetic", "--time-budget", "25", "--quiet"]
            + ["--out", str(out / "capstone"), "--overwrite"],
        ),
        (
            "capstone --resume of a finished run (refused)",
            [py, "-m", "course_utils.capstone", "--data", "synthetic", "--time-budget", "25", "--quiet"]
            + ["--out", str(out / "capstone"), "--resume"],
        ),
        (
            "cluster",
            [py, "-m", "course_utils", "cluster", "--workers", "2", "--module"]
            + ["course_utils.lessons.scaling_out.multiworker", "--", "--steps", "2", "--out", str(out / "mw")],
        ),
        (f"prove ({mode})", [*prove, "--out", str(out / "proof")]),
        *((f"prove --shape {s} ({mode})", [*prove, "--shape", s, "--out", str(out / f"proof-{s}")]) for s in shapes),
    ]


def functions_never_entered(path: pathlib.Path, executed: set[int]) -> list[str]:
    """The top-level functions and methods in ``path`` whose body no command ran (their first body line missed)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            body = node.body[1:] if isinstance(node.body[0], ast.Expr) and len(node.body) > 1 else node.body
            if not any(line in executed for n in body for line in range(n.lineno, (n.end_lineno or n.lineno) + 1)):
                names.append(node.name)
    return names


def write_map(out: pathlib.Path, report: dict, ran: list[dict], mode: str) -> str:
    rows = []
    files = report["files"]
    for name in sorted(files):
        f = files[name]
        summary = f["summary"]
        path = ROOT / name
        lines = len(path.read_text(encoding="utf-8").splitlines())
        never = functions_never_entered(path, set(f["executed_lines"]))
        rows.append((name, lines, summary["num_statements"], summary["covered_lines"], summary["missing_lines"], never))
    total_lines = sum(r[1] for r in rows)
    reached = sum(r[3] for r in rows)
    statements = sum(r[2] for r in rows)
    text = [
        f"# What the learners' commands reach in course_utils ({time.strftime('%Y-%m-%d')}, {mode} mode)",
        "",
        "Commands (each with every Python process it started measured):",
        "",
        *(f"- `{r['name']}`: exit {r['rc']}, {r['seconds']:.0f} s" for r in ran),
        "",
        f"{total_lines:,} lines, {statements:,} statements, {reached:,} reached ({reached / max(statements, 1):.0%}).",
        "",
        "| module | lines | statements | reached | missed | functions never entered |",
        "|---|---|---|---|---|---|",
    ]
    for name, lines, stmts, covered, missing, never in sorted(rows, key=lambda r: -r[4]):
        shown = ", ".join(never[:12]) + (f" (+{len(never) - 12})" if len(never) > 12 else "")
        text.append(f"| `{name}` | {lines} | {stmts} | {covered} | {missing} | {shown} |")
    (out / "map.md").write_text("\n".join(text) + "\n", encoding="utf-8")
    return "\n".join(text[: 10 + len(ran)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devtools.coverage_map", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/coverage"))
    p.add_argument("--mode", choices=("smoke", "full"), default="smoke")
    p.add_argument("--data", default="synthetic", help="prove's --data (default synthetic: offline)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--shapes", nargs="*", default=[], help="prove also in these stand-in shapes (prove --shape)")
    p.add_argument("--only", nargs="*", help="run only the commands whose names start with these")
    args = p.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data"
    data.mkdir(exist_ok=True)
    for old in data.glob(".coverage*"):
        old.unlink()
    rc = out / ".coveragerc"
    rc.write_text(RC.format(data=data / ".coverage"), encoding="utf-8")
    env = dict(os.environ, COVERAGE_PROCESS_START=str(rc), PYTHONPATH=str(ROOT))
    ran = []
    for name, argv_ in commands(out, args.mode, args.data, args.jobs, args.shapes):
        if args.only and not any(name.startswith(o) for o in args.only):
            continue
        start = time.perf_counter()
        print(f"--- {name}", flush=True)
        proc = subprocess.run(
            argv_, check=False, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        expected = 2 if name.endswith("(refused)") else 0
        ran.append({"name": name, "rc": proc.returncode, "ok": proc.returncode == expected})
        ran[-1]["seconds"] = time.perf_counter() - start
        if proc.returncode != expected:
            print(f"{name}: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    cov = [sys.executable, "-m", "coverage"]
    subprocess.run([*cov, "combine", "--quiet", f"--rcfile={rc}", str(data)], cwd=ROOT, check=True)
    subprocess.run(
        [*cov, "json", f"--rcfile={rc}", f"--data-file={data / '.coverage'}", "-o", str(out / "coverage.json")],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    report = json.loads((out / "coverage.json").read_text(encoding="utf-8"))
    print(write_map(out, report, ran, args.mode))
    print(f"the map: {out / 'map.md'}")
    return 0 if all(r["ok"] for r in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
