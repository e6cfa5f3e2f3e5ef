"""Install paths: pinned requirements, a course_utils that never pins TensorFlow, Binder, CI = README."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TF_FAMILY = {"tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tf-nightly", "keras", "tf-keras"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; @]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_course_utils_never_pins_or_pulls_tensorflow():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        deps += extra
    assert deps, "expected some dependencies"
    assert not {_name(d) for d in deps} & TF_FAMILY, "installing course_utils in Colab must keep Colab's TensorFlow"


def test_requirements_pin_exact_versions_of_the_course_stack():
    lines = [l.split("#")[0].strip() for l in (ROOT / "requirements.txt").read_text().splitlines()]
    reqs = [l for l in lines if l and not l.startswith("-e")]
    unpinned = [r for r in reqs if "==" not in r]
    assert not unpinned, f"unpinned: {unpinned}"
    pins = dict(r.split("==") for r in reqs)
    assert pins["tensorflow"].startswith("2.20.")
    assert pins["keras"].startswith("3.")
    assert pins["tensorflow-datasets"].startswith("4.9.")
    for tool in ("nbval", "pytest", "jupyterlab", "matplotlib", "tensorflow-docs"):
        assert tool in pins, tool
    assert "-e ." in lines, "requirements.txt installs course_utils from the checkout"


def test_the_wheel_ships_every_module_including_exercise_banks(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("course_utils-*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py")}
    expected = {p.relative_to(ROOT).as_posix() for p in (ROOT / "course_utils").rglob("*.py")}
    assert expected - shipped == set(), f"missing from the wheel: {sorted(expected - shipped)}"


def test_binder_uses_the_same_pins_and_runs_on_cpu():
    assert "-r ../requirements.txt" in (ROOT / "binder" / "requirements.txt").read_text()
    start = ROOT / "binder" / "start"
    assert os.access(start, os.X_OK)
    text = start.read_text()
    assert "export COURSE_DEVICE=cpu" in text and text.rstrip().endswith('exec "$@"')
    assert re.fullmatch(r"python-3\.1[1-3]\s*", (ROOT / "binder" / "runtime.txt").read_text())
    assert "export COURSE_SMOKE=1" in text  # full mode would be near Binder's memory limit


def test_readme_set_up_is_two_commands_and_ci_runs_the_same_test_command():
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set up", 1)[1]
    first_block = re.search(r"```bash\n(.*?)```", setup, re.S).group(1).strip().splitlines()
    commands = [line.split("#")[0].strip() for line in first_block]
    assert commands[-2:] == ["pip install -r requirements.txt", "pytest"], commands
    assert "-m venv" in commands[0]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install --quiet -r requirements.txt" in ci
    assert re.search(r'^(step "[^"]+" )?(run_)?pytest\s*(#.*)?$', ci, re.M), ".ci/run must run the README's test command as it is"
    # the slower proofs the README says CI runs: prove in full mode and under XLA
    readme_slow = re.findall(r"`prove ([^`]+)`", readme)
    assert len(readme_slow) >= 2 and all(f"prove {args}" in ci for args in readme_slow), readme_slow
    assert "jupyter lab notebooks/" in readme


def test_readme_lists_every_notebook_with_its_badge():
    from course_utils import notebooks

    readme = (ROOT / "README.md").read_text()
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        rel = nb.relative_to(ROOT).as_posix()
        assert notebooks.badge_markdown(rel) in readme, f"README has no badge for {rel}"


def test_the_rules_code_cites_are_in_the_repository():
    """Code, tests and linter messages cite CONTRIBUTING.md by section; every cited section exists, and nothing
    cites a design document that is not in the repository."""
    root = Path(__file__).resolve().parents[1]
    headings = set(re.findall(r"^## (\d+)\. ", (root / "CONTRIBUTING.md").read_text(encoding="utf-8"), re.M))
    assert {"4", "5", "6", "7"} <= headings
    files = [*root.glob("course_utils/**/*.py"), *root.glob("tests/*.py"), root / "conftest.py", root / "README.md",
             *root.glob("notebooks/*.ipynb"), *root.glob("instructors/*.md"), *root.glob("requirements*.txt"),
             root / "pyproject.toml", root / "noxfile.py", root / ".ci" / "run", *root.glob("binder/*")]
    cited = set()
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert "COURSE" + "_DESIGN" not in text, path
        for group in re.findall(r"CONTRIBUTING\.md ((?:§\d+(?:, )?)+)", text):
            cited |= set(re.findall(r"§(\d+)", group))
    assert cited and cited <= headings, (cited, headings)
