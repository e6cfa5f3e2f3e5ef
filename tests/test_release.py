"""Releases hold: the tag every setup cell installs provides what the notebooks use (devtools/release.py)."""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from devtools import notebooks as nbl
from devtools import release

ROOT = Path(__file__).resolve().parents[1]


def test_the_notebooks_use_only_what_the_release_they_pin_provides():
    """The issue's failure: main's notebooks imported course_utils.lessons, which the tag their setup cells install
    did not have; in Colab they failed at their first import. A notebook that needs a new helper needs a release."""
    assert release.release_problems(ROOT) == []


def test_the_record_is_of_the_release_the_notebooks_pin():
    import tomllib

    record = release.read_record(ROOT)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert record["version"] == version and nbl.REF == f"v{version}"
    # a record of the real package, not an empty one that lets everything through
    assert "course_utils.lessons" in record["modules"] and "setup" in record["modules"]["course_utils"]
    assert len(record["modules"]) >= 40


def _nb(*cells: str) -> dict:
    return {
        "cells": [
            {"cell_type": "code", "source": c, "metadata": {}, "outputs": [], "execution_count": None} for c in cells
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def _uses(tmp_path: Path, *cells: str) -> list[release.Use]:
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(_nb(*cells)))
    return release.notebook_uses(path)


def test_notebook_uses_follow_imports_aliases_and_scopes(tmp_path):
    uses = _uses(
        tmp_path,
        "import course_utils\nfrom course_utils import data as d, exercises\n"
        "from course_utils.demo import expect_failure as ef\nimport numpy as np",
        "cfg = course_utils.config.get()\nd.load(name='x', **opts)\nef(ValueError, match='y')\nnp.zeros(3)",
        "def f(d):\n    return d.shape\nd.cifar10(batch=2)\nexercises = None\nexercises.check()",
        "!pip install x",  # not Python: skipped
    )
    got = [(u.dotted, u.keywords) for u in uses]
    assert got == [
        ("course_utils", None),
        ("course_utils.data", None),
        ("course_utils.exercises", None),
        ("course_utils.demo.expect_failure", None),
        ("course_utils.config.get", ()),
        ("course_utils.data.load", ("name",)),
        ("course_utils.demo.expect_failure", ("match",)),
        ("course_utils.data.cifar10", ("batch",)),  # the parameter d shadowed the alias inside f only
    ]
    assert uses[4].where == "code cell 2, line 1"


RECORD = {
    "package": "course_utils",
    "version": "2026.11.1",
    "modules": {
        "course_utils": {
            "__version__": None,
            "data": "module",
            "setup": ["device", "**"],
            "config": "module",
            "runtime": "module",
        },
        "course_utils.runtime": {"install_tensorflow": []},
        "course_utils.data": {
            "load": ["name", "split"],
            "SIZES": None,
            "Loader": {"call": ["path"], "attrs": {"read": ["self", "n"], "rows": None}},
        },
        "course_utils.config": {"get": []},
    },
}


@pytest.mark.parametrize(
    "dotted, keywords, problem",
    [
        ("course_utils.data.load", ("name",), None),
        ("course_utils.data.load", ("name", "shuffle"), "course_utils.data.load() takes no shuffle there"),
        ("course_utils.data.missing", None, "course_utils.data has no missing"),
        ("course_utils.lessons.x.experiments", None, "course_utils has no lessons"),
        ("course_utils.setup", ("anything",), None),  # **kwargs
        ("course_utils.data.SIZES.smoke", None, None),  # an attribute of a value: not recorded
        ("course_utils.data.Loader.read", ("n",), None),
        ("course_utils.data.Loader.write", None, "course_utils.data.Loader has no attribute write"),
        ("course_utils.data.Loader", ("path", "mode"), "course_utils.data.Loader() takes no mode there"),
        ("keras.layers", None, "keras.layers: no module keras"),
    ],
)
def test_use_problem_names_what_the_release_lacks(dotted, keywords, problem):
    assert release.use_problem(release.Use(dotted, "cell 1", keywords), RECORD) == problem


def _package(root: Path, body: str) -> None:
    pkg = root / "fakepkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "1.0"\nfrom . import sub\n')
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "tools.py").write_text(textwrap.dedent(body))
    (pkg / "__main__.py").write_text("raise SystemExit('a __main__ must not be imported')\n")


def test_record_api_lists_modules_names_and_parameters(tmp_path):
    _package(
        tmp_path,
        """
        import os
        from os.path import join

        LIMIT = 3

        def run(a, b=1, *args, key=None, **kw):
            pass

        class Tool(Exception):
            def __init__(self, path):
                self.path = path
            def go(self, n):
                pass
            def _private(self):
                pass
        """,
    )
    code = (
        f"import sys, json; sys.path[:0] = [{str(tmp_path)!r}, {str(ROOT)!r}]\n"
        "from devtools.release import record_api; print(json.dumps(record_api('fakepkg')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    record = json.loads(out.stdout)
    assert record["version"] == "1.0" and sorted(record["modules"]) == ["fakepkg", "fakepkg.sub", "fakepkg.sub.tools"]
    tools = record["modules"]["fakepkg.sub.tools"]
    assert tools["run"] == ["a", "b", "key", "**"]
    assert tools["LIMIT"] is None and tools["os"] == "module" and tools["join"] is None  # another library's
    assert tools["Tool"] == {"call": ["path"], "attrs": {"go": ["self", "n"]}}  # Exception's own attributes left out
    assert record["modules"]["fakepkg"]["sub"] == "module"


def _release_root(tmp_path: Path) -> Path:
    root = tmp_path / "course"
    (root / "course_utils").mkdir(parents=True)
    (root / "devtools").mkdir()
    (root / "notebooks").mkdir()
    shutil.copy2(ROOT / nbl.REPO_FILE, root / nbl.REPO_FILE)
    version = nbl.REF[1:]
    (root / "course_utils" / "__init__.py").write_text(f'"""x"""\n__version__ = "{version}"\n')
    (root / "pyproject.toml").write_text(f'[project]\nname = "course-utils"\nversion = "{version}"\n')
    (root / "CITATION.cff").write_text(f'cff-version: 1.2.0\nversion: "{version}"\ndate-released: "2026-11-25"\n')
    (root / "CHANGELOG.md").write_text(
        f"# Changelog\n\n## Unreleased\n\n- new: data.load\n\n## {version} (2026-11-25)\n\n- first\n"
    )
    (root / "README.md").write_text(
        f"# Course\n\n{nbl.binder_badge_markdown()}\n\n"
        f"git clone https://github.com/{nbl.REPO} && cd {nbl.REPO.split('/')[1]}\n"
    )
    return root


def test_cut_release_bumps_every_version_dates_the_notes_and_records_the_api(tmp_path):
    root = _release_root(tmp_path)
    changed = release.cut_release(
        "2026.12.0", root, today=datetime.date(2026, 12, 1), record=json.loads(json.dumps(RECORD))
    )
    assert 'version = "2026.12.0"' in (root / "pyproject.toml").read_text()
    assert '__version__ = "2026.12.0"' in (root / "course_utils" / "__init__.py").read_text()
    cff = (root / "CITATION.cff").read_text()
    assert 'version: "2026.12.0"' in cff and 'date-released: "2026-12-01"' in cff
    log = (root / "CHANGELOG.md").read_text()
    assert log.index("## Unreleased\n\n## 2026.12.0 (2026-12-01)\n\n- new: data.load") < log.index("- first")
    assert nbl.read_repo_settings(root) == (nbl.REPO, "v2026.12.0")
    assert "v2026.12.0" in (root / "README.md").read_text()
    assert release.read_record(root)["version"] == "2026.12.0"
    assert any(line.startswith("README.md") for line in changed)
    assert release.release_problems(root) == [] and nbl.consistency_problems(root) == []


@pytest.mark.parametrize(
    "version, says",
    [
        ("2026.11", "expected YYYY.MM.N"),
        ("2026.13.0", "expected YYYY.MM.N"),
        ("v2026.12.0", "expected YYYY.MM.N"),
        ("2026.11.0", "not newer than"),
        ("2025.12.9", "not newer than"),
    ],
)
def test_cut_release_refuses_a_bad_or_old_version_and_changes_nothing(tmp_path, version, says):
    root = _release_root(tmp_path)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match=says):
        release.cut_release(version, root, record={})
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_cut_release_refuses_when_nothing_is_unreleased(tmp_path):
    root = _release_root(tmp_path)
    log = root / "CHANGELOG.md"
    log.write_text(log.read_text().replace("- new: data.load\n", ""))
    with pytest.raises(ValueError, match="nothing to release"):
        release.cut_release("2026.12.0", root, record={})


def test_the_release_command_says_a_bad_version_in_one_line(tmp_path):
    root = _release_root(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "course_utils", "release", "2026.99.1", "--root", str(root)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("release: ") and "YYYY.MM.N" in done.stderr


def test_a_notebook_using_a_helper_newer_than_its_release_is_reported(tmp_path):
    root = _release_root(tmp_path)
    (root / release.API_FILE).write_text(release.dump_record({**RECORD, "version": nbl.REF[1:]}))
    nb = _nb(nbl.setup_cell_source(), "from course_utils import data\ndata.load(name='a')\ndata.stream()")
    nb["cells"].insert(
        0, {"cell_type": "markdown", "metadata": {}, "source": nbl.badge_markdown("notebooks/01_x.ipynb")}
    )
    (root / "notebooks" / "01_x.ipynb").write_text(json.dumps(nb))
    problems = release.release_problems(root)
    assert len(problems) == 1 and problems[0].startswith(
        f"notebooks/01_x.ipynb (code cell 2, line 3): course_utils.data has no stream in {nbl.REF}"
    )


def test_set_repo_rewrites_the_folder_a_clone_is_entered_by(tmp_path):
    root = _release_root(tmp_path)
    assert nbl.consistency_problems(root) == []
    nbl.set_repo("a-user/my-course", nbl.REF, root)
    assert "git clone https://github.com/a-user/my-course && cd my-course\n" in (root / "README.md").read_text()
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("cd my-course", "cd memory-efficient-tf"))
    assert nbl.consistency_problems(root) == [
        "README.md: line 5: `cd memory-efficient-tf` after cloning a-user/my-course, whose folder is my-course "
        "(run `python -m course_utils set-repo`)"
    ]


def test_the_setup_cell_says_when_the_installed_course_utils_is_not_its_release(tmp_path):
    """Run the canonical setup cell's check with an older course_utils installed (a runtime that imported it
    before, a stale pip install): it says so before later cells fail on a missing name."""
    src = nbl.setup_cell_source()
    check = src[src.index("import course_utils\n") : src.index("runtime = course_utils.setup()")]
    fake = tmp_path / "course_utils"
    fake.mkdir()
    (fake / "__init__.py").write_text('__version__ = "2026.10.0"\n')
    code = f'COURSE_REF = "{nbl.REF}"\n' + check
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith(
        f"course_utils 2026.10.0 is installed, but this notebook was written for {nbl.REF}: "
    )
    same = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert same.returncode == 0 and same.stdout == ""


def test_a_notebook_that_is_not_json_is_one_problem_not_a_traceback(tmp_path):
    root = _release_root(tmp_path)
    (root / release.API_FILE).write_text(release.dump_record({**RECORD, "version": nbl.REF[1:]}))
    (root / "notebooks" / "01_x.ipynb").write_bytes(b"\xff{not json")
    assert release.release_problems(root) == ["notebooks/01_x.ipynb: cannot read it as a notebook (UnicodeDecodeError)"]
