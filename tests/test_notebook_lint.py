"""Notebook lint: every lesson follows the skeleton (CONTRIBUTING.md §4), and the linter really
rejects what it should. Fast: no kernel is started, nothing is executed."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils._repo import REF, REPO
from devtools import notebooks as nbl

ROOT = Path(__file__).resolve().parent.parent
REAL_NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
NAME = "01_example_lesson.ipynb"


# ----------------------------------------------------------------------------------------------
# A correct notebook, built from the canonical pieces
# ----------------------------------------------------------------------------------------------


def _md(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text.splitlines(keepends=True)}


def _code(text: str, tags: list[str] | None = None) -> dict:
    cell = {
        "cell_type": "code",
        "execution_count": None,
        "metadata": {},
        "outputs": [],
        "source": text.splitlines(keepends=True),
    }
    if tags:
        cell["metadata"]["tags"] = tags
    return cell


def good_notebook(relpath: str = f"notebooks/{NAME}", repo: str = REPO, ref: str = REF) -> dict:
    nb = {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {"language_info": {"name": "python"}},
        "cells": [
            _md(
                "# An example lesson\n\nOne line that promises something.\n\n" + nbl.badge_markdown(relpath, repo, ref)
            ),
            _md(
                "## You will learn\n\n- one thing\n- another\n\n**Time:** 20 min. **Prerequisites:** none.\n"
                "**Runtime:** TPU if you can get one; GPU or CPU work too."
            ),
            _code(nbl.setup_cell_source(repo, ref)),
            _md("## A section\n\nProse."),
            _code("x = 1 + 1\nassert x == 2", tags=["parameters"]),
            _md("The next cell fails on purpose: Keras 3 layers have no `kernel` setter."),
            _code("with expect_failure(AttributeError):\n    raise AttributeError('no setter')"),
            _md("## Exercises\n\nTry it."),
            _code("print('exercise')"),
            _md("## Claims vs. measured on your hardware\n\n| claim | measured |"),
            _code("print('table')"),
            _md("## Summary\n\nDone. Next: lesson 2."),
        ],
    }
    return nbl.apply_metadata(nb)


def write_nb(path: Path, nb: dict) -> Path:
    """Write ``nb`` the way `lint --fix` would (nbfmt + preserved keys), so only the mutation differs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(nbl.nbfmt_bytes(nb, path))
    return path


@pytest.fixture
def repo_root(tmp_path: Path) -> Path:
    (tmp_path / "notebooks").mkdir()
    return tmp_path


def lint(root: Path, nb: dict, name: str = NAME) -> list[str]:
    path = write_nb(root / "notebooks" / name, nb)
    return nbl.lint_notebook(path, REPO, REF, root=root)


def assert_only(problems: list[str], *patterns: str) -> None:
    """At least one problem, and every problem matches one of the patterns (no collateral noise)."""
    assert problems, "the linter accepted a broken notebook"
    for p in problems:
        assert any(re.search(pat, p) for pat in patterns), f"unexpected problem: {p}\nall: {problems}"


# ----------------------------------------------------------------------------------------------
# The real notebooks, and the linter accepting a correct one
# ----------------------------------------------------------------------------------------------


_SETUP_LINES = len(nbl.setup_cell_source().splitlines())


@pytest.mark.parametrize(
    "path",
    REAL_NOTEBOOKS
    or [
        pytest.param(
            None, marks=pytest.mark.skip(reason="no notebooks yet; test_correct_notebook_lints_clean covers the linter")
        )
    ],
    ids=lambda p: p.name if isinstance(p, Path) else "none",
)
def test_real_notebook_lints_clean(path: Path) -> None:
    problems = nbl.lint_notebook(path)
    assert not problems, "\n".join([f"{path.name}:"] + problems + ["fix: python -m course_utils lint --fix"])


def test_correct_notebook_lints_clean(repo_root: Path) -> None:
    assert lint(repo_root, good_notebook()) == []


def test_canonical_pieces() -> None:
    assert nbl.badge_markdown("notebooks/01_tpu_initialization.ipynb", "a/b", "dev") == (
        "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        "(https://colab.research.google.com/github/a/b/blob/dev/notebooks/01_tpu_initialization.ipynb)"
    )
    src = nbl.setup_cell_source("a/b", "dev")
    assert 'COURSE_REPO, COURSE_REF = "a/b", "dev"\n' in src
    assert src.endswith("runtime = course_utils.setup()")
    compile(src, "<setup cell>", "exec")  # valid Python
    nb = nbl.apply_metadata({"metadata": {"colab": {"name": "x"}, "other": 1}})
    assert nb["metadata"] == {
        "accelerator": "TPU",
        "colab": {"name": "x", "gpuType": "V5E1"},
        "kernelspec": {"name": "python3"},
        "other": 1,
    }


def test_course_nbfmt_is_stock_nbfmt_plus_preserved_keys(tmp_path: Path) -> None:
    """Stock nbfmt drops colab.gpuType and cell tags; ours is byte-for-byte nbfmt except those keys."""
    from tensorflow_docs.tools.nbfmt import __main__ as nbfmt

    nb = good_notebook()
    path = tmp_path / NAME
    stock = json.loads(nbfmt.clean_notebook(copy.deepcopy(nb), json.dumps(nb), path, False, 2))
    ours = json.loads(nbl.nbfmt_bytes(nb, path))
    assert ours["metadata"]["colab"].pop("gpuType") == "V5E1"
    assert ours["metadata"]["accelerator"] == "TPU" == stock["metadata"]["accelerator"]
    assert [c["metadata"].pop("tags", None) for c in ours["cells"]].count(["parameters"]) == 1
    assert ours == stock
    # Idempotent: formatting formatted output changes nothing.
    once = nbl.nbfmt_bytes(nb, path)
    assert nbl.nbfmt_bytes(json.loads(once), path, once.decode()) == once


# ----------------------------------------------------------------------------------------------
# One mutation each: the linter must fail, with the right message
# ----------------------------------------------------------------------------------------------


def test_outputs_are_rejected(repo_root: Path) -> None:
    nb = good_notebook()
    cell = nb["cells"][4]
    cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["2\n"]}]
    cell["execution_count"] = 3
    assert_only(lint(repo_root, nb), r"cell 4: code cell has saved outputs", r"cell 4: execution_count is 3")


@pytest.mark.parametrize(
    "relpath, repo",
    [(f"notebooks/{NAME}", "someone-else/fork"), ("notebooks/02_other_lesson.ipynb", REPO)],
    ids=["other-repo", "other-notebook"],
)
def test_wrong_badge_is_rejected(repo_root: Path, relpath: str, repo: str) -> None:
    nb = good_notebook()
    nb["cells"][0] = good_notebook(relpath, repo)["cells"][0]
    problems = lint(repo_root, nb)
    assert_only(problems, r"cell 0: badge URL is .*expected " + re.escape(nbl.colab_url(f"notebooks/{NAME}")))


def test_missing_badge_is_rejected(repo_root: Path) -> None:
    nb = good_notebook()
    nb["cells"][0] = _md("# An example lesson\n\nNo badge here.")
    assert_only(lint(repo_root, nb), r"cell 0: no Open-in-Colab badge")


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda md: md.pop("accelerator"), r"metadata\.accelerator missing, expected 'TPU'"),
        (lambda md: md.update(accelerator="GPU"), r"metadata\.accelerator is 'GPU'"),
        (lambda md: md["colab"].pop("gpuType"), r"metadata\.colab\.gpuType missing, expected 'V5E1'"),
        (lambda md: md["colab"].update(gpuType="T4"), r"metadata\.colab\.gpuType is 'T4'"),
        (lambda md: md.pop("colab"), r"metadata\.colab\.gpuType missing"),
    ],
    ids=["no-accelerator", "gpu-accelerator", "no-gpuType", "T4-gpuType", "no-colab"],
)
def test_wrong_colab_metadata_is_rejected(repo_root: Path, mutate, message: str) -> None:
    nb = good_notebook()
    mutate(nb["metadata"])
    assert_only(lint(repo_root, nb), message)


def test_stock_nbfmt_output_is_rejected(repo_root: Path) -> None:
    """Running bare nbfmt on a lesson drops gpuType: the linter must notice."""
    from tensorflow_docs.tools.nbfmt import __main__ as nbfmt

    path = write_nb(repo_root / "notebooks" / NAME, good_notebook())
    assert nbfmt.format_nb(notebooks=[str(path)]) == nbfmt.Status.PASS
    problems = nbl.lint_notebook(path, REPO, REF, root=repo_root)
    assert any("metadata.colab.gpuType missing" in p for p in problems), problems


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda s: s.replace("install_tensorflow()", "install_tensorflow(on_tpu=True)"),
            r"line 16 is 'install_tensorflow\(on_tpu=True\)",
        ),
        (lambda s: s + "\nprint('extra')", rf"has {_SETUP_LINES + 1} lines, expected {_SETUP_LINES}"),
        (lambda s: s.replace(REPO, "someone-else/fork"), r"setup cell points at .*someone-else/fork"),
    ],
    ids=["changed-install-call", "extra-line", "other-repo"],
)
def test_modified_setup_cell_is_rejected(repo_root: Path, edit, message: str) -> None:
    nb = good_notebook()
    nb["cells"][2] = _code(edit(nbl.setup_cell_source()))
    assert_only(lint(repo_root, nb), r"cell 2: .*" + message)


def test_setup_cell_must_be_first_code_cell(repo_root: Path) -> None:
    nb = good_notebook()
    nb["cells"].insert(2, _code("import numpy as np"))
    problems = lint(repo_root, nb)
    assert_only(problems, r"cell 2: first code cell is not the canonical setup cell")


def test_missing_exercises_is_rejected(repo_root: Path) -> None:
    nb = good_notebook()
    nb["cells"][7] = _md("## Practice\n\nTry it.")
    assert_only(lint(repo_root, nb), r"missing section heading '## Exercises'")


def test_sections_out_of_order_are_rejected(repo_root: Path) -> None:
    nb = good_notebook()
    summary = nb["cells"].pop(11)
    nb["cells"].insert(7, summary)  # Summary before Exercises
    assert_only(
        lint(repo_root, nb), r"sections out of order: '## Summary' \(cell 7\) comes before '## Claims vs\. measured'"
    )
    nb = good_notebook()
    nb["cells"][7], nb["cells"][9] = nb["cells"][9], nb["cells"][7]  # Claims before Exercises
    assert_only(
        lint(repo_root, nb), r"sections out of order: '## Claims vs\. measured' \(cell 7\) comes before '## Exercises'"
    )


def test_you_will_learn_needs_time_prerequisites_runtime(repo_root: Path) -> None:
    nb = good_notebook()
    nb["cells"][1] = _md("## You will learn\n\n- things\n\nRuntime: any.")  # "Runtime" is not "Time"
    assert_only(lint(repo_root, nb), r"cell 1: .*must also state Time, Prerequisites")
    nb["cells"].pop(1)
    assert_only(lint(repo_root, nb), r"no markdown cell with '## You will learn'")


def test_title_must_be_h1(repo_root: Path) -> None:
    nb = good_notebook()
    nb["cells"][0]["source"] = ["## Not a title\n", "\n", nbl.badge_markdown(f"notebooks/{NAME}")]
    assert_only(lint(repo_root, nb), r"cell 0: the first cell must be markdown starting with '# '")


def test_unexplained_failure_on_purpose_is_rejected(repo_root: Path) -> None:
    nb = good_notebook()
    nb["cells"][5] = _code("y = 2")  # the explanation was the markdown cell before it
    nb["cells"].insert(7, _code("z = 3"))
    assert_only(lint(repo_root, nb), r"cell 6: fails on purpose, but no markdown cell")


@pytest.mark.parametrize("mark", ["tag", "nbval-tag", "comment"])
def test_a_cell_marked_to_raise_is_rejected(repo_root: Path, mark: str) -> None:
    """Colab's Run all stops at a cell that raises whatever its tags: the failure must run inside expect_failure."""
    nb = good_notebook()
    if mark == "comment":
        nb["cells"][6] = _code("# NBVAL_RAISES_EXCEPTION\nraise AttributeError('no setter')")
    else:
        nb["cells"][6] = _code(
            "raise AttributeError('no setter')",
            tags=["raises-exception" if mark == "tag" else "nbval-raises-exception"],
        )
    assert_only(lint(repo_root, nb), r"cell 6: marked to raise .* Colab's Run all stops .*expect_failure")


def test_private_keras_imports_are_rejected(repo_root: Path) -> None:
    nb = good_notebook()
    nb["cells"][4] = _code("from keras.src.backend.tensorflow import core\nprint(core.remat)")
    assert_only(lint(repo_root, nb), r"cell 4: imports Keras' private modules \(keras\.src;")


def test_unformatted_json_is_rejected(repo_root: Path) -> None:
    path = write_nb(repo_root / "notebooks" / NAME, good_notebook())
    data = json.loads(path.read_text())
    path.write_text(json.dumps(data, indent=1))
    assert_only(nbl.lint_notebook(path, REPO, REF, root=repo_root), r"not nbfmt-clean")


def test_top_level_cell_ids_in_nbformat_4_0_are_rejected(repo_root: Path) -> None:
    """nbfmt writes nbformat 4.0 but keeps 4.5-style top-level cell ids: invalid for Jupyter/nbval."""
    nb = good_notebook()
    nb["cells"][3]["id"] = "a-section"
    assert_only(lint(repo_root, nb), r"invalid nbformat .*'id' was unexpected")


def test_bad_file_name_is_rejected(repo_root: Path) -> None:
    name = "Lesson-1.ipynb"
    assert_only(lint(repo_root, good_notebook(f"notebooks/{name}"), name), r"does not match NN_snake_name")


def test_links_to_missing_notebooks_are_rejected(repo_root: Path) -> None:
    nb = good_notebook()
    nb["cells"][11] = _md("## Summary\n\nNext: [lesson 2](" + nbl.colab_url("notebooks/02_next.ipynb") + ")")
    assert_only(lint(repo_root, nb), r"cell 11: Colab link points to notebooks/02_next\.ipynb, which does not exist")


# ----------------------------------------------------------------------------------------------
# --fix
# ----------------------------------------------------------------------------------------------


def test_fix_turns_a_messy_notebook_clean(repo_root: Path, capsys) -> None:
    nb = good_notebook(repo="someone-else/fork", ref="old")  # badge + setup cell of a fork
    nb["nbformat_minor"] = 5
    for i, cell in enumerate(nb["cells"]):
        cell["id"] = f"cell-{i}"  # nbformat 4.5 top-level ids
    nb["cells"][4]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["2\n"]}]
    nb["cells"][4]["execution_count"] = 7
    nb["cells"][2]["execution_count"] = 1
    nb["metadata"]["accelerator"] = "GPU"
    nb["metadata"]["colab"] = {"gpuType": "T4", "provenance": []}
    nb["metadata"]["widgets"] = {"state": {}}
    path = repo_root / "notebooks" / NAME
    path.write_text(json.dumps(nb, indent=1))  # not nbfmt layout either
    assert nbl.lint_notebook(path, REPO, REF, root=repo_root)

    assert nbl.lint_main(["--fix", str(path)]) == 0
    out = capsys.readouterr().out
    assert "stripped outputs" in out and "1 notebook(s) clean" in out
    assert nbl.lint_notebook(path, REPO, REF, root=repo_root) == []
    fixed = json.loads(path.read_text())
    assert fixed["cells"][4]["metadata"]["tags"] == ["parameters"]  # kept through nbfmt
    before = path.read_bytes()
    assert nbl.lint_main(["--fix", str(path)]) == 0
    assert path.read_bytes() == before


def test_lint_main_reports_and_exits_1(repo_root: Path, capsys) -> None:
    nb = good_notebook()
    nb["metadata"].pop("accelerator")
    path = write_nb(repo_root / "notebooks" / NAME, nb)
    assert nbl.lint_main([str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}: metadata.accelerator missing" in out
    assert "1 problem(s) in 1 of 1 notebook(s)" in out


# ----------------------------------------------------------------------------------------------
# Repo consistency and set-repo
# ----------------------------------------------------------------------------------------------


def test_real_repo_is_consistent() -> None:
    assert nbl.consistency_problems(ROOT) == []


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """The parts of the repo that name the GitHub slug, plus one correct lesson and a README row."""
    root = tmp_path / "repo"
    (root / "course_utils").mkdir(parents=True)
    shutil.copy2(ROOT / "course_utils" / "_repo.py", root / "course_utils" / "_repo.py")
    if (ROOT / "notebooks").is_dir():
        shutil.copytree(ROOT / "notebooks", root / "notebooks")
    write_nb(root / "notebooks" / NAME, good_notebook())
    readme = (ROOT / "README.md").read_text() if (ROOT / "README.md").is_file() else "# Course\n"
    readme += (
        f"\n| 01 | example | [![Open In Colab]({nbl.COLAB_BADGE_SVG})]({nbl.colab_url(f'notebooks/{NAME}')}) |\n"
        "| 99 | not written yet | |\n"
        f"\n[![Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/{REPO}/{REF})\n"
        f"\n    git clone https://github.com/{REPO}.git\n"
        f"\nSee https://github.com/{REPO}. Unrelated: https://github.com/{REPO}-extras\n"
    )
    (root / "README.md").write_text(readme)
    assert nbl.consistency_problems(root) == []
    return root


def test_set_repo_rewrites_everything(repo_copy: Path, capsys) -> None:
    new_repo, new_ref = "my-user/memory.efficient_tf", "dev"
    assert nbl.set_repo_main([new_repo, "--ref", new_ref, "--root", str(repo_copy)]) == 0
    out = capsys.readouterr().out
    assert "course_utils/_repo.py" in out and f"notebooks/{NAME}" in out and "README.md" in out

    assert nbl.consistency_problems(repo_copy) == []
    assert nbl.read_repo_settings(repo_copy) == (new_repo, new_ref)
    repo_py = (repo_copy / "course_utils" / "_repo.py").read_text()
    assert f'REPO = "{new_repo}"' in repo_py and f'REF = "{new_ref}"' in repo_py
    nb_path = repo_copy / "notebooks" / NAME
    nb = json.loads(nb_path.read_text())
    assert nbl.badge_markdown(f"notebooks/{NAME}", new_repo, new_ref) in nbl.cell_source(nb["cells"][0])
    assert nbl.cell_source(nb["cells"][2]) == nbl.setup_cell_source(new_repo, new_ref)
    readme = (repo_copy / "README.md").read_text()
    assert nbl.colab_url(f"notebooks/{NAME}", new_repo, new_ref) in readme
    assert f"https://mybinder.org/v2/gh/{new_repo}/{new_ref}" in readme
    assert f"git clone https://github.com/{new_repo}.git" in readme
    assert f"See https://github.com/{new_repo}. Unrelated: https://github.com/{REPO}-extras" in readme
    # Every rewritten notebook is still fully lint-clean (nbfmt layout kept) against the new slug.
    for path in sorted((repo_copy / "notebooks").glob("*.ipynb")):
        assert nbl.lint_notebook(path, new_repo, new_ref, root=repo_copy) == [], path.name

    # Idempotent.
    snapshot = {p: p.read_bytes() for p in repo_copy.rglob("*") if p.is_file()}
    assert nbl.set_repo_main([new_repo, "--ref", new_ref, "--root", str(repo_copy)]) == 0
    assert "nothing changed" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in repo_copy.rglob("*") if p.is_file()} == snapshot

    # And back: the original bytes return.
    assert nbl.set_repo_main([REPO, "--ref", REF, "--root", str(repo_copy)]) == 0
    assert nbl.consistency_problems(repo_copy) == []
    assert nb_path.read_bytes() == nbl.nbfmt_bytes(good_notebook(), nb_path)


@pytest.mark.parametrize("slug", ["not a slug", "owner", "owner/name/extra", "owner/na me", "https://github.com/a/b"])
def test_set_repo_rejects_invalid_slug(repo_copy: Path, capsys, slug: str) -> None:
    before = (repo_copy / "course_utils" / "_repo.py").read_bytes()
    assert nbl.set_repo_main([slug, "--root", str(repo_copy)]) == 2
    assert "expected OWNER/NAME" in capsys.readouterr().err
    assert (repo_copy / "course_utils" / "_repo.py").read_bytes() == before


@pytest.mark.parametrize(
    "args",
    [
        ["evil/name\n"],
        ["../.."],
        ["./fork"],
        ["owner/.."],
        ["a-user/fork", "--ref", "main\n"],
        ["a-user/fork", "--ref", "."],
        ["a-user/fork", "--ref", ".hidden"],
        ["a-user/fork", "--ref", "topic.lock"],
        ["a-user/fork", "--ref", "release/"],
    ],
)
def test_set_repo_refuses_a_name_or_ref_that_is_none_and_changes_no_file(repo_copy: Path, capsys, args) -> None:
    """A trailing newline passed the old patterns (their $ matches before it) and left _repo.py with an unterminated
    string, after which nothing imported; "../.." pointed every badge at github.com/../..; --ref . rewrote 10 files,
    then exited 1. Each is refused before any file changes, in one line, and the checkout still imports."""
    snapshot = {p: p.read_bytes() for p in repo_copy.rglob("*") if p.is_file()}
    assert nbl.set_repo_main([*args, "--root", str(repo_copy)]) == 2
    err = capsys.readouterr().err
    assert "invalid" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert {p: p.read_bytes() for p in repo_copy.rglob("*") if p.is_file()} == snapshot


def test_set_repo_writes_all_or_nothing_when_a_notebook_cannot_be_read(repo_copy: Path, capsys) -> None:
    broken = repo_copy / "notebooks" / "99_broken.ipynb"
    broken.write_text("{ not json")
    snapshot = {p: p.read_bytes() for p in repo_copy.rglob("*") if p.is_file()}
    assert nbl.set_repo_main(["a-user/fork", "--root", str(repo_copy)]) == 2
    err = capsys.readouterr().err
    assert "99_broken.ipynb is not a notebook" in err and "nothing was changed" in err, err
    assert {p: p.read_bytes() for p in repo_copy.rglob("*") if p.is_file()} == snapshot


def test_consistency_catches_a_stale_readme_and_setup_cell(repo_copy: Path) -> None:
    readme = repo_copy / "README.md"
    readme.write_text(
        readme.read_text()
        + f"\n[02]({nbl.colab_url('notebooks/02_missing.ipynb')})\n"
        + nbl.colab_url(f"notebooks/{NAME}", "old/fork", "main")
        + "\n"
    )
    nb_path = repo_copy / "notebooks" / NAME
    nb = good_notebook()
    nb["cells"][2] = _code(nbl.setup_cell_source("old/fork", REF))
    write_nb(nb_path, nb)
    problems = nbl.consistency_problems(repo_copy)
    assert any("02_missing.ipynb, which does not exist" in p for p in problems), problems
    assert any("README.md: line" in p and "old/fork@main" in p for p in problems), problems
    assert any(f"notebooks/{NAME}: setup cell lacks" in p for p in problems), problems


def test_notebooks_follow_googles_docs_style():
    """tensorflow-docs' nblint, Google style: second person (no "we"), inclusive language (no "native")."""
    import re
    import subprocess
    import sys

    notebooks = sorted(str(p) for p in (ROOT / "notebooks").glob("*.ipynb"))
    proc = subprocess.run(
        [sys.executable, "-m", "tensorflow_docs.tools.nblint", "--styles=google", *notebooks],
        capture_output=True,
        text=True,
        timeout=300,
    )
    plain = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)
    found = [line for line in plain.splitlines() if "Found:" in line]
    assert proc.returncode == 0, "nblint (google style) found:\n" + "\n".join(found[:20])


def test_the_course_agrees_with_its_one_list_of_lessons():
    assert nbl.lessons_problems(ROOT) == []


def _course_copy(tmp_path: Path) -> Path:
    """A copy of the course's notebooks, README, _repo.py and lesson manifests (what lessons_problems reads)."""
    for manifest in (ROOT / "course_utils" / "lessons").glob("*/lesson.toml"):
        target = tmp_path / manifest.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(manifest, target)
    (tmp_path / "course_utils" / "lessons" / "__init__.py").write_text("")
    shutil.copy2(ROOT / "course_utils" / "_repo.py", tmp_path / "course_utils" / "_repo.py")
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks", ignore=shutil.ignore_patterns("runs"))
    shutil.copy2(ROOT / "README.md", tmp_path / "README.md")
    return tmp_path


def test_lessons_problems_names_a_notebook_off_the_list_one_without_its_lesson_and_a_wrong_readme_row(tmp_path):
    root = _course_copy(tmp_path)
    readme = root / "README.md"
    readme.write_text(
        readme.read_text(encoding="utf-8").replace("| 05 | [Gradient accumulation]", "| 05 | [Accumulation]"),
        encoding="utf-8",
    )
    (root / "notebooks" / "09_extra.ipynb").write_text("{}")
    (root / "notebooks" / "08_scaling_out.ipynb").unlink()
    seven = root / "notebooks" / "07_activation_memory.ipynb"
    seven.write_text(
        seven.read_text(encoding="utf-8").replace(
            "from course_utils.lessons import activation_memory as lesson", "from course_utils.lessons import x"
        ),
        encoding="utf-8",
    )
    three = root / "course_utils" / "lessons" / "mixed_precision" / "lesson.toml"
    three.write_text(three.read_text().replace("minutes = 30", "minutes = 50"))
    problems = nbl.lessons_problems(root)
    assert problems[:4] == [
        "notebooks/09_extra.ipynb: no lesson manifest declares it (course_utils/lessons/<name>/lesson.toml)",
        "notebooks/08_scaling_out.ipynb: declared by course_utils/lessons/scaling_out/lesson.toml, but there is no "
        "such notebook",
        "notebooks/03_mixed_precision.ipynb: its '**Time:** about N minutes' line says [30]; its manifest says 50",
        "notebooks/07_activation_memory.ipynb: no code cell imports its own lesson "
        "(`from course_utils.lessons import activation_memory as lesson`)",
    ], problems
    assert len(problems) == 5 and "rows for 03, 05 differ" in problems[4] and "lint --fix" in problems[4], problems
    assert nbl.fix_curriculum(root) and not nbl.fix_curriculum(root)
    text = readme.read_text(encoding="utf-8")
    assert "| 05 | [Gradient accumulation](notebooks/05_gradient_accumulation.ipynb) | 35 min |" in text
    assert "| 03 | [Mixed precision](notebooks/03_mixed_precision.ipynb) | 50 min |" in text
    assert nbl.lessons_problems(root / "notebooks") == []  # not the course's own root: nothing to check


def test_a_manifest_that_cannot_be_read_is_one_line_naming_file_and_field(tmp_path):
    from course_utils.lessons import ManifestError, discover, read_manifest

    folder = tmp_path / "x_topic"
    folder.mkdir()
    manifest = folder / "lesson.toml"
    for text, says in [
        ('id = "09"\ntitle = "X"\nminutes = "forty"', "minutes must be a whole number, not 'forty'"),
        ('id = "9"\ntitle = "X"', "id must be two digits, like \"09\", not '9'"),
        ('title = "X"', "no id"),
        ('id = "09"\ntitle = "X"\ncolour = 1', "unknown field(s) colour"),
        ('id = "09"\ntitle = "X"\n[run]\nci_shapes = ["tpu"]', "ci_shapes ['tpu'] are not among"),
        ('id = "09"\ntitle = "X"\n[run]\nall_cores = 1', "all_cores must be true or false, not 1"),
        ('id = "09"\ntitle = "X"\n[run]\ncost = 0', "cost must be at least 1, not 0"),
        ('id = "09" title', "cannot read it as TOML"),
        ('id = "09"\ntitle = "X"\n[sizes]\nsteps = 3', "sizes.steps must be { full = ..., smoke = ... }, not 3"),
        ('id = "09"\ntitle = "X"\n[sizes]\nsteps = { full = 3 }', "sizes.steps must be { full = ..., smoke"),
        ('id = "09"\ntitle = "X"\n[sizes]\nsteps = { full = 3, smoke = 1.5 }', "are of different kinds"),
        (
            'id = "09"\ntitle = "X"\n[sizes]\nsteps = { full = true, smoke = false }',
            "sizes.steps.full must be a number or a list of numbers, not True",
        ),
        ('id = "09"\ntitle = "X"\n[sizes]\nsteps = { full = [], smoke = [1] }', "sizes.steps.full must be a number"),
        ('id = "09"\ntitle = "X"\n[sizes]\nStepCount = { full = 3, smoke = 1 }', "lower_case_with_underscores"),
    ]:
        manifest.write_text(text)
        with pytest.raises(ManifestError, match=re.escape(says)) as err:
            read_manifest(manifest)
        assert str(err.value).startswith(str(manifest)) and "\n" not in str(err.value)
    manifest.write_text('id = "09"\ntitle = "X"')
    (tmp_path / "y_topic").mkdir()
    (tmp_path / "y_topic" / "lesson.toml").write_text('id = "09"\ntitle = "Y"')
    with pytest.raises(ManifestError, match="lesson id\\(s\\) 09 declared by more than one manifest"):
        discover(tmp_path)


def test_adding_a_lesson_is_its_folder_and_its_notebook(tmp_path):
    """A new lesson touches its folder and its notebook only: the lint writes its curriculum row, and the lesson
    list, CI's stand-in lists, conftest's all-cores list and pytest's XLA list take it from its manifest."""
    root = tmp_path / "course"
    for name in ("course_utils", "devtools", "notebooks"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("runs", "__pycache__", "*.egg-info"))
    for name in ("README.md", "conftest.py", "CONTRIBUTING.md", "CHANGELOG.md", "pyproject.toml"):
        shutil.copy2(ROOT / name, root / name)
    folder = root / "course_utils" / "lessons" / "keras_on_jax"
    folder.mkdir()
    (folder / "__init__.py").write_text('"""Lesson 09."""\n')
    (folder / "lesson.toml").write_text(
        'id = "09"\ntitle = "Keras on JAX"\nadvanced = true\nminutes = 45\nmeasures = "the same model on JAX"\n'
        '[run]\nxla_notebook = true\nall_cores = true\nci_shapes = ["gpu"]\n'
        "[sizes]\njax_steps = { full = 100, smoke = 5 }\njax_batches = { full = [64, 128], smoke = [8] }\n"
    )
    nb = (ROOT / "notebooks" / "08_scaling_out.ipynb").read_text(encoding="utf-8")
    (root / "notebooks" / "09_keras_on_jax.ipynb").write_text(
        nb.replace(
            "from course_utils.lessons import scaling_out as lesson",
            "from course_utils.lessons import keras_on_jax as lesson",
        ).replace("**Time:** about 40 minutes", "**Time:** about 45 minutes"),
        encoding="utf-8",
    )
    code = (
        "import conftest, json\nfrom course_utils import config, lessons\nfrom tests import test_notebook_modes as m\n"
        "print(json.dumps([[l.id for l in lessons.LESSONS], list(conftest.ALL_CORES_NOTEBOOKS), m.XLA_LESSONS,"
        " [config.FULL_SIZES.jax_steps, config.SMOKE_SIZES.jax_batches, config.get().sizes.block_width]]))"
    )
    (root / "tests").mkdir()
    (root / "tests" / "__init__.py").write_text("")
    shutil.copy2(ROOT / "tests" / "test_notebook_modes.py", root / "tests" / "test_notebook_modes.py")
    env = {**os.environ, "PYTHONPATH": str(root)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=300)

    lint = run("-m", "course_utils", "lint")
    assert lint.returncode == 1 and "rows for 09 differ" in lint.stdout, lint.stdout + lint.stderr
    fixed = run("-m", "course_utils", "lint", "--fix")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "README.md: fixed: the curriculum table" in fixed.stdout
    row = next(line for line in (root / "README.md").read_text().splitlines() if line.startswith("| 09 |"))
    assert row.startswith(
        "| 09 | [*Advanced:* Keras on JAX](notebooks/09_keras_on_jax.ipynb) | 45 min | the same "
        "model on JAX | [![Open In Colab]"
    ), row
    assert run("-m", "course_utils.lessons", "--ci-shape", "gpu").stdout.split() == [
        "01",
        "02",
        "03",
        "04",
        "05",
        "06",
        "09",
    ]
    assert run("-m", "course_utils.lessons", "--ci-shape", "tpu-1").stdout.split()[-1] == "07"
    listed = json.loads(run("-c", code).stdout)
    assert listed[0][-1] == "09" and listed[1][-1] == "09_keras_on_jax.ipynb" and listed[2][-1] == "09_"
    assert listed[3] == [100, [8], 64]  # its sizes, beside lesson 07's (smoke mode: conftest sets it)


def test_a_lesson_size_that_another_manifest_or_the_common_sizes_declare_is_refused(monkeypatch):
    from course_utils import config, lessons, manifests

    mine = lessons.Lesson("09", "X", "course_utils.lessons.x", sizes=(("memory_batch", 1, 1),))
    monkeypatch.setattr(manifests, "LESSONS", (*lessons.LESSONS, mine))  # what the config reads
    with pytest.raises(
        lessons.ManifestError, match="lesson 09's manifest declares sizes.memory_batch, which config.CommonSizes has"
    ):
        config._lesson_sizes()
    mine = lessons.Lesson("09", "X", "course_utils.lessons.x", sizes=(("block_width", 1, 1),))
    monkeypatch.setattr(manifests, "LESSONS", (*lessons.LESSONS, mine))
    with pytest.raises(lessons.ManifestError, match="sizes.block_width, which lesson 07's manifest has"):
        config._lesson_sizes()


def _code_lines(text: str) -> list[str]:
    """Lines as compared for copies: stripped, without blank lines and whole-line comments."""
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def shared_runs(notebooks: list[Path], package: Path, run: int = 6) -> list[str]:
    """Each notebook code cell that shares ``run`` or more consecutive lines with a module of ``package``."""
    runs: dict[tuple[str, ...], str] = {}
    for module in sorted(package.rglob("*.py")):
        lines = _code_lines(module.read_text(encoding="utf-8"))
        for i in range(len(lines) - run + 1):
            runs.setdefault(tuple(lines[i : i + run]), module.relative_to(package.parent).as_posix())
    found = []
    for path in notebooks:
        for n, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            lines = _code_lines(nbl.cell_source(cell)) if cell["cell_type"] == "code" else []
            for i in range(len(lines) - run + 1):
                if tuple(lines[i : i + run]) in runs:
                    found.append(
                        f"{path.name} cell {n} shares {run}+ lines with {runs[tuple(lines[i : i + run])]}, "
                        f"from `{lines[i]}`"
                    )
                    break
    return found


def test_no_notebook_cell_retypes_course_utils_code():
    """One copy of every measurement: a notebook shows the lesson's code (``show_code``) and calls it, so the report
    card proves the lines the learner runs, never a copy of them."""
    assert shared_runs(REAL_NOTEBOOKS, ROOT / "course_utils") == []


def test_the_copy_check_finds_a_retyped_function(tmp_path):
    from course_utils.lessons.bfloat16_conversion import experiments

    import inspect

    retyped = good_notebook()
    retyped["cells"].append(_code("# pasted from the lesson\n" + inspect.getsource(experiments.fraction_changed)))
    path = tmp_path / NAME
    path.write_text(json.dumps(retyped))
    (found,) = shared_runs([path], ROOT / "course_utils")
    assert found.startswith(
        f"{NAME} cell {len(retyped['cells']) - 1} shares 6+ lines with "
        "course_utils/lessons/bfloat16_conversion/experiments.py"
    ), found


def test_lint_checks_the_python_sources_with_the_formatter_and_fix_formats_them(tmp_path, monkeypatch) -> None:
    assert nbl.python_format_problems(ROOT) == []  # this checkout: formatted
    messy = "x = [1,\n 2]\ny=( 3 )\n"
    bad = tmp_path / "pkg" / "bad.py"
    bad.parent.mkdir()
    bad.write_text(messy)
    kept = tmp_path / "measurements" / "as_it_ran.py"  # the measurements' scripts stay as they ran
    kept.parent.mkdir()
    kept.write_text(messy)
    problems = nbl.python_format_problems(tmp_path)
    assert len(problems) == 1 and problems[0].endswith(
        "bad.py: not formatted (python -m course_utils lint --fix, or ruff format)"
    ), problems
    assert nbl.python_format_problems(tmp_path, fix=True) == []
    assert bad.read_text() == "x = [1, 2]\ny = 3\n" and kept.read_text() == messy
    bad.write_text("def broken(:\n")
    assert nbl.python_format_problems(tmp_path)[0].startswith("ruff format failed: ")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ruff" else real(name, *a))
    assert nbl.python_format_problems(tmp_path) == [
        "ruff is not installed, so the Python sources were not checked: pip install -r requirements-dev.txt"
    ]
