"""Install paths: pinned requirements (the learner's, and the test tools on top), a course_utils that never pins
TensorFlow, Binder and its badge, CI = README and the GitHub workflow that runs it, the licences and the citation."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from course_utils import lessons

ROOT = Path(__file__).resolve().parents[1]
TF_FAMILY = {"tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tf-nightly", "keras", "tf-keras"}
# What the tests and the maintainers need and a learner does not: requirements-dev.txt, never requirements.txt.
DEV_TOOLS = {"pytest", "pytest-xdist", "nbval", "pyyaml", "playwright", "tensorflow-docs", "nox", "ruff"}
# SHA-256 of the Apache License 2.0 as apache.org publishes it (https://www.apache.org/licenses/LICENSE-2.0.txt).
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
LICENSE_FILES = ["LICENSE", "LICENSE-CONTENT.md"]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; @]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_course_utils_never_pins_or_pulls_tensorflow():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        deps += extra
    assert deps, "expected some dependencies"
    assert not {_name(d) for d in deps} & TF_FAMILY, "installing course_utils in Colab must keep Colab's TensorFlow"


def _lines(name: str) -> list[str]:
    return [l.split("#")[0].strip() for l in (ROOT / name).read_text().splitlines() if l.split("#")[0].strip()]


def _pins(name: str) -> dict[str, str]:
    """name -> version of every `name==version` line (the includes and `-e .` left out); fails on any other line."""
    reqs = [l for l in _lines(name) if not l.startswith(("-e", "-r"))]
    unpinned = [r for r in reqs if "==" not in r]
    assert not unpinned, f"{name}: unpinned: {unpinned}"
    return {_name(r): r.split("==", 1)[1] for r in reqs}


def test_requirements_pin_exact_versions_of_the_course_stack():
    pins = _pins("requirements.txt")
    assert pins["tensorflow"].startswith("2.20.")
    assert pins["keras"].startswith("3.")
    assert pins["tensorflow-datasets"].startswith("4.9.")
    # what a learner runs: the notebooks in JupyterLab, TensorBoard and its profile tab, the course site
    for need in (
        "jupyterlab",
        "ipykernel",
        "matplotlib",
        "psutil",
        "setproctitle",
        "tensorboard",
        "tensorboard-plugin-profile",
        "nbformat",
        "nbclient",
        "nbconvert",
        "setuptools",
    ):
        assert need in pins, need
    assert not DEV_TOOLS & pins.keys(), f"test tools belong in requirements-dev.txt: {sorted(DEV_TOOLS & pins.keys())}"
    assert "-e ." in _lines("requirements.txt"), "requirements.txt installs course_utils from the checkout"


def test_requirements_dev_is_the_learners_pins_plus_the_test_tools_pinned():
    lines = _lines("requirements-dev.txt")
    assert lines[0] == "-r requirements.txt", "requirements-dev.txt starts from the learner's pins"
    pins = _pins("requirements-dev.txt")
    assert set(pins) == DEV_TOOLS, sorted(set(pins) ^ DEV_TOOLS)
    assert not set(pins) & set(_pins("requirements.txt")), "a package pinned twice can drift apart"
    assert re.fullmatch(r"\d{4}\.\d{1,2}\.\d{1,2}", pins["nox"]), pins["nox"]  # nox's CalVer: an exact release
    # the nox sessions: `pinned` is what CI installs; Colab's and the newest stack bring the same test tools
    noxfile = (ROOT / "noxfile.py").read_text()
    assert '_suite(session, "requirements-dev.txt")' in noxfile
    colab = _pins("requirements-colab.txt")
    learner_tools = {"jupyterlab", "ipykernel", "nbclient", "nbconvert"}
    for tool in (DEV_TOOLS - {"nox"}) | learner_tools:
        assert tool in colab, f"requirements-colab.txt lacks {tool}: `nox -s colab` runs pytest with it"
        assert colab[tool] == {**_pins("requirements.txt"), **pins}[tool], f"{tool}: requirements-colab.txt differs"
    latest = {_name(l) for l in _lines("requirements-latest.txt")}
    assert (DEV_TOOLS - {"nox"}) | learner_tools <= latest, sorted(((DEV_TOOLS - {"nox"}) | learner_tools) - latest)


def test_the_wheel_ships_every_module_including_the_lessons(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("course_utils-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n for n in names if n.endswith((".py", "lesson.toml"))}  # the lessons' manifests: LESSONS reads them
    expected = {
        p.relative_to(ROOT).as_posix()
        for pattern in ("*.py", "lesson.toml")
        for p in (ROOT / "course_utils").rglob(pattern)
    }
    assert expected - shipped == set(), f"missing from the wheel: {sorted(expected - shipped)}"
    assert not [n for n in names if n.startswith("devtools/")], "the maintainer tools ship in the learners' wheel"
    # the lessons' notebooks, as course_utils/notebooks: an installed prove executes them, found there
    notebooks = {p.name: p.read_bytes() for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert {n: zipfile.ZipFile(wheel).read(f"course_utils/notebooks/{n}") for n in notebooks} == notebooks
    installed = tmp_path / "installed"
    zipfile.ZipFile(wheel).extractall(installed)
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            "from course_utils import lessons, proof; "
            "print('\\n'.join(str(proof.lesson_notebook(l)) for l in lessons.LESSONS))",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(installed)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.split() == [str(installed / "course_utils" / lesson.notebook) for lesson in lessons.LESSONS], (
        found.stdout
    )
    # PEP 639: the licence files in .dist-info/licenses/, named in METADATA, as they are in the checkout
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    dist_info = metadata.rsplit("/", 1)[0]
    _assert_lists_the_licences(zipfile.ZipFile(wheel).read(metadata).decode())
    for name in LICENSE_FILES:
        assert zipfile.ZipFile(wheel).read(f"{dist_info}/licenses/{name}") == (ROOT / name).read_bytes(), name


def _assert_lists_the_licences(metadata: str) -> None:
    assert "License-Expression: Apache-2.0" in metadata.splitlines(), metadata[:600]
    listed = re.findall(r"^License-File: (.+)$", metadata, re.M)
    assert listed == LICENSE_FILES, listed


def test_the_sdist_ships_the_licences_and_lists_them(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", f"from setuptools import build_meta; print(build_meta.build_sdist({str(tmp_path)!r}))"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (sdist,) = tmp_path.glob("course_utils-*.tar.gz")
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        _assert_lists_the_licences(tar.extractfile(f"{top}/PKG-INFO").read().decode())
        for name in LICENSE_FILES:
            assert tar.extractfile(f"{top}/{name}").read() == (ROOT / name).read_bytes(), name


def test_the_code_is_apache_2_and_the_content_cc_by_4():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == LICENSE_FILES
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    assert hashlib.sha256((ROOT / "LICENSE").read_bytes()).hexdigest() == APACHE_2_SHA256, (
        "LICENSE is not the Apache License 2.0 text as apache.org publishes it, byte for byte"
    )
    content = (ROOT / "LICENSE-CONTENT.md").read_text(encoding="utf-8")
    assert "Creative Commons Attribution 4.0 International" in content
    assert "https://creativecommons.org/licenses/by/4.0/legalcode" in content
    for covered in ("notebooks/", "README.md", "instructors/"):
        assert covered in content, f"LICENSE-CONTENT.md does not say whether {covered} is covered"


def test_the_citation_file_is_cff_1_2_with_pyprojects_version():
    yaml = pytest.importorskip("yaml")

    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    required = {"cff-version", "message", "title", "authors"}  # CFF 1.2.0's required keys
    assert required <= cff.keys(), sorted(required - cff.keys())
    assert cff["cff-version"] == "1.2.0"
    authors = cff["authors"]
    assert authors and all(isinstance(a, dict) and (a.get("name") or a.get("family-names")) for a in authors)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert str(cff["version"]) == project["version"]
    licences = cff["license"] if isinstance(cff["license"], list) else [cff["license"]]
    assert project["license"] in licences and "CC-BY-4.0" in licences
    assert cff["repository-code"] == "https://github.com/tpu-course/memory-efficient-tf"


def test_binder_uses_the_same_pins_and_runs_on_cpu():
    assert "-r ../requirements.txt" in (ROOT / "binder" / "requirements.txt").read_text()
    start = ROOT / "binder" / "start"
    assert os.access(start, os.X_OK)
    text = start.read_text()
    assert "export COURSE_DEVICE=cpu" in text and text.rstrip().endswith('exec "$@"')
    assert re.fullmatch(r"python-3\.1[1-3]\s*", (ROOT / "binder" / "runtime.txt").read_text())
    assert "export COURSE_SMOKE=1" in text  # full mode would be near Binder's memory limit


TEST_COMMAND = "pip install -r requirements-dev.txt && pytest"


def _bash_commands(markdown: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", markdown, re.S)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]


def test_readme_set_up_installs_the_learners_pins_and_ci_runs_the_readmes_test_command():
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Quick start", 1)[1]
    first_block = re.search(r"```bash\n(.*?)```", setup, re.S).group(1).strip().splitlines()
    commands = [line.split("#")[0].strip() for line in first_block]
    assert commands[0].startswith("git clone ") and "&& cd " in commands[0]  # every later command runs in the clone
    assert "-m venv" in commands[1]
    assert "pip install -r requirements.txt" in commands, commands
    assert TEST_COMMAND in _bash_commands(readme) or f"`{TEST_COMMAND}`" in readme, f"no `{TEST_COMMAND}` in the README"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install --quiet -r requirements-dev.txt" in ci
    assert re.search(r'^(step "[^"]+" )?(run_)?pytest\s*(#.*)?$', ci, re.M), (
        ".ci/run must run the README's test command as it is"
    )
    # the slower proofs the README says CI runs: prove in full mode and under XLA
    readme_slow = re.findall(r"`prove ([^`]+)`", readme)
    assert len(readme_slow) >= 2 and all(f"prove {args}" in ci for args in readme_slow), readme_slow
    assert "jupyter lab notebooks/" in readme


def test_readme_lists_every_notebook_with_its_badge():
    from devtools import notebooks

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
    files = [
        *root.glob("course_utils/**/*.py"),
        *root.glob("tests/*.py"),
        root / "conftest.py",
        root / "README.md",
        *root.glob("notebooks/*.ipynb"),
        *root.glob("instructors/*.md"),
        *root.glob("requirements*.txt"),
        root / "pyproject.toml",
        root / "noxfile.py",
        root / ".ci" / "run",
        *root.glob("binder/*"),
    ]
    cited = set()
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert "COURSE" + "_DESIGN" not in text, path
        for group in re.findall(r"CONTRIBUTING\.md ((?:§\d+(?:, )?)+)", text):
            cited |= set(re.findall(r"§(\d+)", group))
    assert cited and cited <= headings, (cited, headings)


def test_no_doc_runs_the_tests_on_the_learners_pins_alone():
    """pytest, nbval and nbfmt are in requirements-dev.txt: `pip install -r requirements.txt && pytest` fails."""
    for path in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "instructors").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"pip install -r requirements\.txt\s*&&\s*pytest", text), (
            f"{path.relative_to(ROOT)}: the test command is `{TEST_COMMAND}`"
        )


def test_the_test_workflow_runs_ci_on_push_and_pull_requests_with_pinned_actions():
    yaml = pytest.importorskip("yaml")

    workflows = ROOT / ".github" / "workflows"
    workflow = yaml.safe_load((workflows / "test.yml").read_text())
    triggers = workflow.get(True, workflow.get("on"))  # YAML 1.1 reads the key `on` as True
    assert "push" in triggers and "pull_request" in triggers
    (job,) = workflow["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest" and job["timeout-minutes"] == 90
    uses = [step["uses"] for step in job["steps"] if "uses" in step]
    assert [u.split("@")[0] for u in uses] == ["actions/checkout", "actions/setup-python"], uses
    assert all(re.fullmatch(r"actions/[a-z-]+@[0-9a-f]{40}", u) for u in uses), uses
    # the same releases as pages.yml, each SHA with its version in a comment
    text = (workflows / "test.yml").read_text()
    pages = (workflows / "pages.yml").read_text()
    for action in uses:
        assert re.search(rf"uses: {re.escape(action)}  # v\d+(\.\d+)*\n", text), action
        assert f"uses: {action}  #" in pages, f"{action}: not the release pages.yml pins"
    setup = next(step for step in job["steps"] if step.get("uses", "").startswith("actions/setup-python"))
    assert str(setup["with"]["python-version"]) == "3.11"
    runs = [step["run"].strip() for step in job["steps"] if "run" in step]
    assert runs == ["bash .ci/run"], runs  # all of CI is .ci/run, so CI here and there are the same
    assert workflow["permissions"] == {"contents": "read"}


def test_gitignore_keeps_what_the_courses_commands_write_out_of_git():
    lines = (ROOT / ".gitignore").read_text().splitlines()
    for folder in ("/proof/", "/site/", "/_site/"):  # prove --out proof/, site --out site/, pages.yml's --out _site
        assert folder in lines, folder
    assert "runs/" in lines  # the capstone's and prove's defaults, also under notebooks/ (Jupyter's working folder)
    pages = (ROOT / ".github" / "workflows" / "pages.yml").read_text()
    assert "--out _site" in pages


# Binder: the README's badge and set-repo


def _binder_root(tmp_path: Path, readme: str) -> Path:
    """A course root with what set-repo reads for Binder: _repo.py, a README, instructors/README.md, notebooks/
    (empty: no notebook to reformat)."""
    from devtools.notebooks import REPO_FILE

    root = tmp_path / "course"
    (root / "course_utils").mkdir(parents=True)
    shutil.copy2(ROOT / REPO_FILE, root / REPO_FILE)
    (root / "notebooks").mkdir()
    (root / "instructors").mkdir()
    (root / "README.md").write_text(readme)
    (root / "instructors" / "README.md").write_text(f"Binder: {readme}")
    return root


def test_set_repo_rewrites_the_binder_badge(tmp_path, capsys):
    from devtools import notebooks as nbl

    badge = nbl.binder_badge_markdown()
    assert badge == (
        f"[![Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/{nbl.REPO}/"
        f"{nbl.REF}?urlpath=lab/tree/notebooks)"
    )
    root = _binder_root(tmp_path, f"# Course\n\n{badge}\n")
    assert nbl.consistency_problems(root) == []

    assert nbl.set_repo_main(["a-user/fork.of-course", "--ref", "release/2026-11", "--root", str(root)]) == 0
    assert "README.md" in capsys.readouterr().out
    expected = (
        "[![Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/a-user/fork.of-course/"
        "release%2F2026-11?urlpath=lab/tree/notebooks)"
    )  # mybinder.org wants "/" in a ref URL-encoded
    assert nbl.binder_badge_markdown("a-user/fork.of-course", "release/2026-11") == expected
    assert (root / "README.md").read_text() == f"# Course\n\n{expected}\n"
    assert (root / "instructors" / "README.md").read_text() == f"Binder: # Course\n\n{expected}\n"
    assert nbl.consistency_problems(root) == []

    # and back, byte for byte
    assert nbl.set_repo_main([nbl.REPO, "--ref", nbl.REF, "--root", str(root)]) == 0
    assert (root / "README.md").read_text() == f"# Course\n\n{badge}\n"


@pytest.mark.parametrize(
    "url, says",
    [
        ("https://mybinder.org/v2/gh/someone/else/main?urlpath=lab/tree/notebooks", "uses someone/else@main"),
        ("https://mybinder.org/v2/gh/{repo}/old-tag?urlpath=lab/tree/notebooks", "@old-tag, expected"),
        ("https://mybinder.org/v2/gh/{repo}?urlpath=lab/tree/notebooks", "@(the default branch), expected"),
        ("https://mybinder.org/v2/gh/{repo}/{ref}?urlpath=lab/tree/lessons", "opens lessons, which does not exist"),
    ],
)
def test_a_binder_badge_that_disagrees_with_repo_py_is_reported(tmp_path, capsys, url, says):
    from devtools import notebooks as nbl

    url = url.format(repo=nbl.REPO, ref=nbl.REF)
    root = _binder_root(tmp_path, f"# Course\n\n[![Binder]({nbl.BINDER_BADGE_SVG})]({url})\n")
    problems = nbl.consistency_problems(root)
    assert any(p.startswith("README.md: line 3: Binder link") and says in p for p in problems), problems
    assert any(p.startswith("instructors/README.md: line 3: Binder link") for p in problems), problems
    if "does not exist" not in says:  # set-repo repairs the repository and ref, not a path that is gone
        assert nbl.set_repo_main([nbl.REPO, "--ref", nbl.REF, "--root", str(root)]) == 0
        assert nbl.binder_badge_markdown() in (root / "README.md").read_text()
        assert nbl.consistency_problems(root) == []


def test_set_repo_without_nbfmt_says_to_install_the_dev_tools_and_changes_nothing(tmp_path, capsys, monkeypatch):
    from devtools import notebooks as nbl

    root = _binder_root(tmp_path, f"# Course\n\n{nbl.binder_badge_markdown()}\n")
    (root / "notebooks" / "01_x.ipynb").write_text("{}")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    monkeypatch.setitem(sys.modules, "tensorflow_docs.tools.nbfmt", None)  # importing it now raises ImportError
    assert nbl.set_repo_main(["a-user/fork", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("set-repo: ") and "pip install -r requirements-dev.txt" in err and err.count("\n") == 1
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_the_readme_has_the_binder_badge():
    from devtools import notebooks as nbl

    assert nbl.binder_badge_markdown() in (ROOT / "README.md").read_text(), (
        f"the README has no Binder badge: {nbl.binder_badge_markdown()}"
    )


def test_badges_and_setup_cells_point_at_this_versions_release_tag():
    """A learner's saved Colab copy must keep working: the setup cells install course_utils at the release tag of
    this version (set-repo --ref vVERSION), and the changelog names the version."""
    import tomllib

    from course_utils import _repo

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert _repo.REF == f"v{version}", f"_repo.REF is {_repo.REF!r}: run set-repo --ref v{version} (CONTRIBUTING)"
    assert f"## {version} (" in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


def test_the_lessons_prove_and_the_lint_import_without_tensorflow():
    """`import course_utils.lessons` (the lesson list), prove, the capstone (its options, plan and command line) and the
    notebook lint stay free of TensorFlow and Keras at import: the lint and prove's parent process must start in a
    fraction of a second, bad capstone options are refused before TensorFlow starts, and a learner's setup cell sets
    TensorFlow's environment before TensorFlow starts. A lesson's two parts load TensorFlow, on first use."""
    code = (
        "import sys, course_utils, course_utils.lessons, course_utils.proof, course_utils.capstone.plan, "
        "course_utils.capstone.cli, devtools.notebooks\n"
        "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))\n"
        "lesson = course_utils.lessons.BY_ID['05']\n"
        "print(lesson.experiments.__name__, lesson.module.exercises.__name__, 'tensorflow' in sys.modules)\n"
        "try:\n    lesson.module.measure\nexcept AttributeError as e:\n    print(e)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-1500:]
    assert done.stdout.splitlines() == [
        "[]",
        "course_utils.lessons.gradient_accumulation.experiments course_utils.lessons.gradient_accumulation.exercises"
        " True",
        "module 'course_utils.lessons.gradient_accumulation' has no attribute 'measure'",
    ], done.stdout


def test_no_class_is_built_inside_a_function():
    """A class is defined at module level, in a module that imports what it needs (Keras classes live in modules that
    import Keras at the top): documented, picklable, one class however often it is used."""
    import ast

    inside = []
    for path in sorted((ROOT / "course_utils").rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inside += [
                    f"{path.relative_to(ROOT)}: {fn.name} defines {c.name}"
                    for c in ast.walk(fn)
                    if isinstance(c, ast.ClassDef)
                ]
    assert not inside, inside


def test_a_lesson_part_that_fails_to_import_says_so_not_missing(monkeypatch):
    """An AttributeError raised while a lesson's part is imported (a TensorFlow without a name the part uses) reaches
    the learner as an ImportError naming the part, not as "no attribute" (which exercises.load's getattr would take
    for a package without exercises, and answer with the wrong message)."""
    from course_utils import exercises
    from course_utils.lessons import _parts

    def broken(name):
        raise AttributeError("module 'tensorflow' has no attribute 'gone'")

    monkeypatch.setattr(_parts.importlib, "import_module", broken)
    part = _parts.on_first_use("course_utils.lessons.nowhere")
    with pytest.raises(ImportError, match=r"importing course_utils\.lessons\.nowhere\.exercises failed: .*'gone'"):
        part("exercises")
    with pytest.raises(AttributeError, match="has no attribute 'measure'"):
        part("measure")

    class Lesson:  # a package whose exercises part fails to import
        __getattr__ = staticmethod(part)

    with pytest.raises(ImportError, match="failed"):
        exercises.load(Lesson())
