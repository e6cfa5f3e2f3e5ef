"""Maintainer tooling for the course notebooks: the canonical pieces, the linter, and `set-repo`.

    python -m course_utils lint [NOTEBOOK ...] [--fix]       # default: every notebooks/*.ipynb
    python -m course_utils set-repo OWNER/NAME [--ref REF]   # point badges + setup cells at a fork

Every notebook follows the skeleton in CONTRIBUTING.md §4. The pieces that must be identical
everywhere (Open-in-Colab badge, setup cell, Colab metadata) are *generated* here from
``course_utils._repo`` (REPO, REF), so a fork changes one place and runs ``set-repo``.

nbfmt and the Colab metadata
----------------------------
tensorflow-docs' ``nbfmt`` is the formatter (JSON layout, key order, cell ids, Colab defaults), called
in-process. Stock nbfmt *deletes* two things the course needs:

* ``metadata.colab.gpuType`` -- it keeps only ``colab.{collapsed_sections,name,toc_visible}``, but
  ``"gpuType": "V5E1"`` is what makes Colab open the notebook on a v5e-1 TPU runtime
  (``"accelerator": "TPU"`` alone is kept by nbfmt);
* cell ``metadata.tags`` -- it keeps only ``id``/``cellView``/``colab``; the course's cells carry none today
  (a ``raises-exception`` tag is refused: Colab's *Run all* stops at a cell that raises, whatever its tags, so
  failures on purpose run inside ``course_utils.demo.expect_failure``), but a tag a maintainer adds is kept.

So "nbfmt-clean" here means: exactly the bytes nbfmt writes, with those two keys put back (see
:data:`NBFMT_PRESERVED`). Format with ``python -m course_utils lint --fix``, not with bare nbfmt;
bare nbfmt would drop them (the linter then reports it, and ``--fix`` restores ``gpuType``, but lost
tags must be re-added by hand).

No TensorFlow import in this module: it is plain-JSON tooling.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from course_utils import commandline
from course_utils._repo import REF, REPO

# ----------------------------------------------------------------------------------------------
# Constants
# ----------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
"""The repository root this package lives in (the default for ``root`` everywhere)."""

NOTEBOOK_DIR = "notebooks"
REPO_FILE = Path("course_utils") / "_repo.py"
MARKDOWN_DOCS = ("README.md", "instructors/**/*.md", "docs/**/*.md")
"""Markdown files whose Colab/Binder links `set-repo` rewrites and `consistency_problems` checks."""

SLUG_RE = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
REF_RE = re.compile(r"^(?!-)(?!.*\.\.)[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*$")
NOTEBOOK_NAME_RE = re.compile(r"^\d\d_[a-z0-9]+(?:_[a-z0-9]+)*\.ipynb$")

COLAB_BADGE_SVG = "https://colab.research.google.com/assets/colab-badge.svg"
# https://colab.research.google.com/github/OWNER/NAME/blob/REF/notebooks/NN_name.ipynb
COLAB_URL_RE = re.compile(
    r"https://colab\.research\.google\.com/github/"
    r"(?P<repo>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)/blob/(?P<ref>[A-Za-z0-9_./-]+?)/"
    r"(?P<path>notebooks/[A-Za-z0-9_.-]+\.ipynb)"
)
BINDER_BADGE_SVG = "https://mybinder.org/badge_logo.svg"
BINDER_URLPATH = "lab/tree/notebooks"  # the Binder badge opens JupyterLab on the lessons folder
# https://mybinder.org/v2/gh/OWNER/NAME/REF[?urlpath=lab/tree/PATH]. mybinder.org wants a REF with "/" URL-encoded
# (feature%2Fx); an unencoded one is matched whole, so set-repo replaces all of it. A ref never ends in "." or "/":
# a full stop after a bare URL is prose. No REF at all: Binder builds the default branch (flagged, then rewritten).
BINDER_URL_RE = re.compile(
    r"https://mybinder\.org/v2/gh/(?P<repo>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)"
    r"(?:/(?P<ref>[A-Za-z0-9_%-](?:[A-Za-z0-9_.%/-]*[A-Za-z0-9_%-])?))?"
    r"(?:\?urlpath=(?P<urlpath>[^\s()<>\"'&#]*))?"
)
CLONE_CD_RE = re.compile(  # `git clone https://github.com/OWNER/NAME && cd NAME`, the cd on the same line or the next
    r"git clone\s+(?:-\S+\s+)*https://github\.com/(?P<repo>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+?)(?:\.git)?"
    r"(?P<sep>[ \t]*(?:&&|;|\n)\s*)cd\s+(?P<dir>[A-Za-z0-9_.-]+)"
)
"""A clone followed by a ``cd`` into the folder it made: that folder is the repository's name, which `set-repo`
rewrites with the URL (it used to leave ``cd memory-efficient-tf`` after a fork's clone)."""
PAGES_URL_RE = re.compile(  # the course site (`python -m course_utils site`, published by .github/workflows/pages.yml)
    r"https://(?P<owner>[A-Za-z0-9-]+)\.github\.io/(?P<name>[A-Za-z0-9_.-]+)/(?P<path>[A-Za-z0-9_./-]*)"
)
SETUP_REPO_LINE_RE = re.compile(r'^COURSE_REPO, COURSE_REF = "[^"\n]*", "[^"\n]*"$', re.M)

REQUIRED_METADATA: dict[str, Any] = {
    "accelerator": "TPU",
    "colab": {"gpuType": "V5E1"},  # Colab's id for the v5e-1 TPU runtime (free tier)
    "kernelspec": {"name": "python3"},
}
"""Notebook-level metadata every lesson must carry (nested dicts: these keys, other keys allowed)."""

NBFMT_PRESERVED = ("metadata.colab.gpuType", "cells[].metadata.tags")
"""Keys stock nbfmt deletes that the course formatter puts back (see the module docstring)."""

RAISES_TAGS = ("raises-exception", "nbval-raises-exception")
SECTION_ORDER = ("## Exercises", "## Claims vs. measured", "## Summary")

_SETUP_TEMPLATE = """\
# Course setup: the same cell in every notebook. In Colab it installs course_utils, then, on a TPU
# runtime that has no TensorFlow, the TPU build (course_utils.runtime.install_tensorflow says what it
# ran and what failed); elsewhere it only imports. Then it prints what hardware this notebook will use.
import subprocess, sys

COURSE_REPO, COURSE_REF = "@@REPO@@", "@@REF@@"
if "google.colab" in sys.modules:
    _url = f"course_utils @ git+https://github.com/{COURSE_REPO}@{COURSE_REF}"
    _pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", _url], capture_output=True, text=True)
    if _pip.returncode != 0:
        raise RuntimeError(f"`pip install {_url}` exited with code {_pip.returncode}: "
                           f"{(_pip.stderr.strip().splitlines() or ['no output'])[-1]}. "
                           "Check the repository name and your connection, then run this cell again.")
    from course_utils.runtime import install_tensorflow

    install_tensorflow()  # only where TensorFlow is missing (Colab's TPU runtimes); lesson 01 explains

import course_utils

if COURSE_REF.startswith("v") and COURSE_REF != f"v{course_utils.__version__}":  # a release tag, another installed
    print(f"course_utils {course_utils.__version__} is installed, but this notebook was written for {COURSE_REF}: "
          "later cells may fail. Restart the runtime and run this cell again (in a checkout: pip install -e .).")
runtime = course_utils.setup()"""


# ----------------------------------------------------------------------------------------------
# Canonical pieces
# ----------------------------------------------------------------------------------------------


def colab_url(notebook_relpath: str, repo: str = REPO, ref: str = REF) -> str:
    """The Colab URL that opens ``notebook_relpath`` (e.g. ``notebooks/01_x.ipynb``) from GitHub."""
    return f"https://colab.research.google.com/github/{repo}/blob/{ref}/{notebook_relpath}"


def pages_url(path: str = "", repo: str = REPO) -> str:
    """The course site's address on GitHub Pages (``https://OWNER.github.io/NAME/PATH``): GitHub lowercases the
    owner in the host name."""
    owner, name = repo.split("/", 1)
    return f"https://{owner.lower()}.github.io/{name}/{path}"


def _site_pages(root: Path) -> set[str]:
    """What the site has: its index, the report cards and one page per notebook (``lessons/NN_name.html``)."""
    return {"", "index.html", "report-cards.html"} | {f"lessons/{p.stem}.html" for p in list_notebooks(root)}


def badge_markdown(notebook_relpath: str, repo: str = REPO, ref: str = REF) -> str:
    """The Open-in-Colab badge (markdown) for a notebook path relative to the repo root."""
    return f"[![Open In Colab]({COLAB_BADGE_SVG})]({colab_url(notebook_relpath, repo, ref)})"


def binder_url(repo: str = REPO, ref: str = REF, urlpath: str | None = BINDER_URLPATH) -> str:
    """The mybinder.org URL that builds (repo, ref) with ``binder/`` and opens ``urlpath`` (default: JupyterLab on
    ``notebooks/``; None: no ``?urlpath``). The ref is URL-encoded (``feature/x`` -> ``feature%2Fx``), as
    mybinder.org requires."""
    url = f"https://mybinder.org/v2/gh/{repo}/{quote(ref, safe='')}"
    return url if urlpath is None else f"{url}?urlpath={urlpath}"


def binder_badge_markdown(repo: str = REPO, ref: str = REF) -> str:
    """The Launch-Binder badge (markdown) the README carries: JupyterLab on the lessons folder."""
    return f"[![Binder]({BINDER_BADGE_SVG})]({binder_url(repo, ref)})"


def _binder_target(urlpath: str) -> str | None:
    """The repository path a Binder ``urlpath`` opens (``lab/tree/notebooks`` -> ``notebooks``), or None when it
    opens no file or folder (``lab``, ``voila/render/...``)."""
    path = unquote(urlpath).lstrip("/")
    for prefix in ("lab/tree/", "doc/tree/", "tree/", "notebooks/tree/"):
        if path.startswith(prefix):
            return path[len(prefix) :].strip("/")
    return None


def setup_cell_source(repo: str = REPO, ref: str = REF) -> str:
    """The source of the setup cell: identical in every notebook except for (repo, ref)."""
    return _SETUP_TEMPLATE.replace("@@REPO@@", repo).replace("@@REF@@", ref)


def _setup_repo_line(repo: str, ref: str) -> str:
    return f'COURSE_REPO, COURSE_REF = "{repo}", "{ref}"'


def apply_metadata(nb: dict) -> dict:
    """Set :data:`REQUIRED_METADATA` on a notebook dict in place (other keys kept); returns it."""

    def merge(target: dict, required: dict) -> None:
        for key, value in required.items():
            if isinstance(value, dict):
                if not isinstance(target.get(key), dict):
                    target[key] = {}
                merge(target[key], value)
            else:
                target[key] = value

    if not isinstance(nb.get("metadata"), dict):
        nb["metadata"] = {}
    merge(nb["metadata"], REQUIRED_METADATA)
    return nb


def _metadata_problems(metadata: Any) -> list[str]:
    problems = []

    def walk(actual: Any, required: dict, prefix: str) -> None:
        for key, want in required.items():
            name = f"{prefix}.{key}"
            have = actual.get(key) if isinstance(actual, dict) else None
            if isinstance(want, dict):
                walk(have, want, name)
            elif have != want:
                what = "missing" if have is None else f"is {have!r}"
                problems.append(f"{name} {what}, expected {want!r}")

    walk(metadata, REQUIRED_METADATA, "metadata")
    return problems


# ----------------------------------------------------------------------------------------------
# Reading notebooks and repo settings
# ----------------------------------------------------------------------------------------------


def cell_source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _set_source(cell: dict, text: str) -> None:
    cell["source"] = text.splitlines(keepends=True)


def read_repo_settings(root: str | os.PathLike = ROOT) -> tuple[str, str]:
    """(REPO, REF) as written in ``ROOT/course_utils/_repo.py`` (parsed, not imported)."""
    text = (Path(root) / REPO_FILE).read_text(encoding="utf-8")
    repo = re.search(r'^REPO = "([^"\n]*)"$', text, re.M)
    ref = re.search(r'^REF = "([^"\n]*)"$', text, re.M)
    if not (repo and ref):
        raise ValueError(f'{Path(root) / REPO_FILE}: no `REPO = "..."` / `REF = "..."` lines')
    return repo.group(1), ref.group(1)


def notebook_relpath(path: str | os.PathLike, root: str | os.PathLike = ROOT) -> str:
    """Path of a notebook relative to the repo root, POSIX style (what the badge URL ends with).

    A notebook outside ``root`` (a scratch copy) is treated as ``notebooks/<its file name>``.
    """
    path = Path(path).resolve()
    try:
        return path.relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return f"{NOTEBOOK_DIR}/{path.name}"


def list_notebooks(root: str | os.PathLike = ROOT) -> list[Path]:
    return sorted((Path(root) / NOTEBOOK_DIR).glob("*.ipynb"))


# ----------------------------------------------------------------------------------------------
# nbfmt, in-process
# ----------------------------------------------------------------------------------------------

_STASH = "__course_nbfmt_preserved__"


def nbfmt_bytes(nb: dict, filepath: str | os.PathLike, nb_source: str | None = None) -> bytes:
    """What tensorflow-docs' nbfmt writes for ``nb`` at ``filepath``, plus :data:`NBFMT_PRESERVED`.

    Runs nbfmt's own ``clean_notebook`` (JSON layout, key order, ids, Colab defaults); then, only if
    the notebook has a ``colab.gpuType`` or cell tags, puts those back and serialises the result
    exactly as nbfmt does (this is checked: if nbfmt's serialisation ever changes, it raises).
    ``nb`` is not modified.
    """
    try:
        from tensorflow_docs.tools.nbfmt import __main__ as nbfmt
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise RuntimeError("tensorflow-docs (nbfmt) is not installed: pip install -r requirements.txt") from err

    data = copy.deepcopy(nb)
    if nb_source is None:
        nb_source = json.dumps(nb)
    colab = data.get("metadata", {}).get("colab")
    gpu_type = colab.get("gpuType") if isinstance(colab, dict) else None
    any_tags = False
    for cell in data.get("cells", []):
        tags = cell.get("metadata", {}).get("tags") if isinstance(cell.get("metadata"), dict) else None
        if tags:
            cell[_STASH] = tags  # nbfmt leaves unknown cell-level keys alone
            any_tags = True

    out = nbfmt.clean_notebook(data, nb_source, Path(filepath), False, 2)
    if gpu_type is None and not any_tags:
        return out

    def dump(obj: Any) -> bytes:
        return (json.dumps(obj, sort_keys=True, ensure_ascii=False, indent=2) + "\n").encode("utf-8")

    parsed = json.loads(out)
    if dump(parsed) != out:
        raise RuntimeError("nbfmt's JSON serialisation changed; update devtools.notebooks.nbfmt_bytes to match")
    if gpu_type is not None:
        parsed["metadata"].setdefault("colab", {})["gpuType"] = gpu_type
    for cell in parsed["cells"]:
        tags = cell.pop(_STASH, None)
        if tags:
            cell.setdefault("metadata", {})["tags"] = tags
    return dump(parsed)


def _first_difference(actual: bytes, expected: bytes) -> str:
    a = actual.decode("utf-8", "replace").splitlines()
    b = expected.decode("utf-8", "replace").splitlines()
    for i, (x, y) in enumerate(zip(a, b), start=1):
        if x != y:
            return f"line {i}: {x.strip()[:70]!r}, nbfmt writes {y.strip()[:70]!r}"
    if len(a) != len(b):
        return f"file has {len(a)} lines, nbfmt writes {len(b)}"
    return "whitespace/encoding differs"


# ----------------------------------------------------------------------------------------------
# Lint
# ----------------------------------------------------------------------------------------------


def _is_markdown(cell: dict) -> bool:
    return cell.get("cell_type") == "markdown"


def _demonstrates_failure(cell: dict) -> bool:
    return "expect_failure(" in cell_source(cell)


def _raises_exception(cell: dict) -> bool:
    tags = cell.get("metadata", {}).get("tags") or []
    if any(t in RAISES_TAGS for t in tags):
        return True
    return any(
        line.strip().lstrip("#").strip() == "NBVAL_RAISES_EXCEPTION"
        for line in cell_source(cell).splitlines()
        if line.strip().startswith("#")
    )


def _url_problems(text: str, where: str, repo: str, ref: str, root: Path | None) -> list[str]:
    """Colab/Binder links in ``text`` must use (repo, ref); Colab links must name a real notebook."""
    problems = []
    for m in COLAB_URL_RE.finditer(text):
        if (m["repo"], m["ref"]) != (repo, ref):
            problems.append(
                f"{where}: Colab link to {m['path']} uses {m['repo']}@{m['ref']}, expected {repo}@{ref} "
                "(run `python -m course_utils set-repo`)"
            )
        if root is not None and not (root / m["path"]).is_file():
            problems.append(f"{where}: Colab link points to {m['path']}, which does not exist")
    for m in BINDER_URL_RE.finditer(text):
        binder_ref = unquote(m["ref"]) if m["ref"] else "(the default branch)"
        if (m["repo"], binder_ref) != (repo, ref):
            problems.append(
                f"{where}: Binder link uses {m['repo']}@{binder_ref}, expected {repo}@{ref} "
                "(run `python -m course_utils set-repo`)"
            )
        elif m["ref"] != quote(ref, safe=""):
            problems.append(
                f"{where}: Binder link names the ref as {m['ref']}, mybinder.org needs it URL-encoded: "
                f"{quote(ref, safe='')} (run `python -m course_utils set-repo`)"
            )
        target = _binder_target(m["urlpath"]) if m["urlpath"] else None
        if root is not None and target is not None and not (root / target).exists():
            problems.append(f"{where}: Binder link opens {target}, which does not exist")
    for m in PAGES_URL_RE.finditer(text):
        if not m.group(0).startswith(pages_url("", repo)):
            problems.append(
                f"{where}: site link {m.group(0)} is not under {pages_url('', repo)} "
                "(run `python -m course_utils set-repo`)"
            )
        elif root is not None and m["path"] not in _site_pages(root):
            problems.append(
                f"{where}: site link to {m['path']}, which the site does not have (a lesson page is "
                "lessons/NN_name.html for notebooks/NN_name.ipynb)"
            )
    return problems


def _setup_cell_problem(src: str, repo: str, ref: str) -> str | None:
    expected = setup_cell_source(repo, ref)
    if src == expected:
        return None
    m = SETUP_REPO_LINE_RE.search(src)
    if m and src.replace(m.group(0), _setup_repo_line(repo, ref)) == expected:
        return (
            f"setup cell points at `{m.group(0)}`, expected `{_setup_repo_line(repo, ref)}` "
            "(run `python -m course_utils set-repo` or `lint --fix`)"
        )
    a, b = src.splitlines(), expected.splitlines()
    for i, (x, y) in enumerate(zip(a, b), start=1):
        if x != y:
            detail = f"line {i} is {x.strip()[:60]!r}, expected {y.strip()[:60]!r}"
            break
    else:
        detail = f"it has {len(a)} lines, expected {len(b)}"
    return f"first code cell is not the canonical setup cell (devtools.notebooks.setup_cell_source()): {detail}"


def lint_data(nb: Any, relpath: str, repo: str = REPO, ref: str = REF, root: Path | None = None) -> list[str]:
    """All skeleton/metadata/output problems of a parsed notebook (no nbfmt, no file name check)."""
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        return ["not a notebook: no list of cells"]
    cells = nb["cells"]
    problems: list[str] = []

    # Outputs stripped.
    for i, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        if cell.get("outputs"):
            problems.append(f"cell {i}: code cell has saved outputs (strip them: `lint --fix`)")
        if cell.get("execution_count") is not None:
            problems.append(f"cell {i}: execution_count is {cell['execution_count']!r}, expected null (`lint --fix`)")
        if _PRIVATE_KERAS.search(_source(cell)):
            problems.append(
                f"cell {i}: imports Keras' private modules ({_PRIVATE_KERAS_NAME}; they move between releases): "
                "show public names (keras.*, tf.*) instead (CONTRIBUTING.md §3)"
            )

    # Metadata.
    problems += _metadata_problems(nb.get("metadata"))

    # 1. Title + badge.
    badge = badge_markdown(relpath, repo, ref)
    first = cells[0] if cells else {}
    first_src = cell_source(first)
    if not (_is_markdown(first) and first_src.startswith("# ")):
        problems.append("cell 0: the first cell must be markdown starting with '# ' (the H1 title)")
    if badge not in first_src:
        found = [m.group(0) for m in COLAB_URL_RE.finditer(first_src)]
        if found:
            problems.append(
                f"cell 0: badge URL is {found[0]}, expected {colab_url(relpath, repo, ref)} "
                "(this notebook's own path; `lint --fix` rewrites it)"
            )
        else:
            problems.append(f"cell 0: no Open-in-Colab badge; expected: {badge}")

    # Every other Colab/Binder link in markdown: same repo/ref, existing notebook.
    for i, cell in enumerate(cells):
        if _is_markdown(cell) and i != 0:
            problems += _url_problems(cell_source(cell), f"cell {i}", repo, ref, root)

    # 2. "You will learn" before the setup cell; 3. setup cell = first code cell.
    code_idx = [i for i, c in enumerate(cells) if c.get("cell_type") == "code"]
    setup_idx = code_idx[0] if code_idx else len(cells)
    learn_idx = next(
        (i for i, c in enumerate(cells[:setup_idx]) if _is_markdown(c) and "## You will learn" in cell_source(c)),
        None,
    )
    if learn_idx is None or learn_idx == 0:
        problems.append("no markdown cell with '## You will learn' between the title cell and the setup cell")
    else:
        text = cell_source(cells[learn_idx])
        missing = [w for w in ("Time", "Prerequisites", "Runtime") if not re.search(rf"\b{w}\b", text, re.I)]
        if missing:
            problems.append(
                f"cell {learn_idx}: the 'You will learn' cell must also state {', '.join(missing)} "
                "(time estimate, prerequisites, runtime advice)"
            )
    if not code_idx:
        problems.append("no code cell: the first code cell must be the setup cell")
    else:
        problem = _setup_cell_problem(cell_source(cells[setup_idx]), repo, ref)
        if problem:
            problems.append(f"cell {setup_idx}: {problem}")

    # 5-7. Exercises -> Claims vs. measured -> Summary, after the setup cell, in that order.
    found: dict[str, tuple[int, int]] = {}
    for i, cell in enumerate(cells):
        if not _is_markdown(cell):
            continue
        for j, line in enumerate(cell_source(cell).splitlines()):
            for heading in SECTION_ORDER:
                if line.strip().startswith(heading) and heading not in found:
                    found[heading] = (i, j)
    for heading in SECTION_ORDER:
        if heading not in found:
            problems.append(f"missing section heading '{heading}' (CONTRIBUTING.md §4)")
        elif found[heading][0] <= setup_idx:
            problems.append(f"cell {found[heading][0]}: '{heading}' comes before the setup cell")
    present = [h for h in SECTION_ORDER if h in found]
    for a, b in zip(present, present[1:]):
        if found[a] > found[b]:
            problems.append(
                f"sections out of order: '{b}' (cell {found[b][0]}) comes before '{a}' (cell {found[a][0]}); "
                "expected " + " -> ".join(SECTION_ORDER)
            )

    # Colab's Run all stops at any cell that raises: a failure on purpose runs inside expect_failure, and is
    # explained next to the cell.
    for i, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        if _raises_exception(cell):
            problems.append(
                f"cell {i}: marked to raise (raises-exception / NBVAL_RAISES_EXCEPTION), but Colab's Run all stops at "
                "any cell that raises: run the failing lines inside `with expect_failure(ErrorType):` "
                "(course_utils.demo) and drop the mark"
            )
        if _raises_exception(cell) or _demonstrates_failure(cell):
            neighbours = [cells[k] for k in (i - 1, i + 1) if 0 <= k < len(cells)]
            if not any(_is_markdown(c) and cell_source(c).strip() for c in neighbours):
                problems.append(
                    f"cell {i}: fails on purpose, but no markdown cell right before or after it says what fails and why"
                )
    return problems


def _schema_problems(nb: Any) -> list[str]:
    """The notebook must be valid nbformat (e.g. no nbformat-4.5 top-level cell ids in a 4.0 file,
    which is what nbfmt writes; nbval and Jupyter read it with this validator)."""
    import warnings

    import nbformat

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            nbformat.validate(copy.deepcopy(nb))
        except nbformat.ValidationError as err:
            return [f"invalid nbformat (`lint --fix` repairs cell ids): {str(err.message)[:200]}"]
        except Exception as err:  # e.g. an unknown nbformat version
            return [f"invalid nbformat: {type(err).__name__}: {str(err)[:200]}"]
    return []


_PRIVATE_KERAS_NAME = "keras" + ".src"  # spelled in two parts so the course's own import scan does not flag the linter
_PRIVATE_KERAS = re.compile(r"\bkeras\.src\b")


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def lint_notebook(
    path: str | os.PathLike, repo: str = REPO, ref: str = REF, root: str | os.PathLike = ROOT
) -> list[str]:
    """Human-readable problems of one notebook file (empty list = clean)."""
    path = Path(path)
    root = Path(root)
    problems: list[str] = []
    if not NOTEBOOK_NAME_RE.match(path.name):
        problems.append(f"file name {path.name!r} does not match NN_snake_name.ipynb (e.g. 01_tpu_setup.ipynb)")
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
        nb = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return problems + [f"cannot read notebook JSON: {err}"]
    problems += lint_data(nb, notebook_relpath(path, root), repo, ref, root)
    problems += _schema_problems(nb)
    if isinstance(nb, dict) and isinstance(nb.get("cells"), list):
        try:
            expected = nbfmt_bytes(nb, path, text)
        except Exception as err:  # nbfmt chokes on odd notebooks (e.g. string sources)
            problems.append(f"nbfmt failed on this notebook: {type(err).__name__}: {err}")
        else:
            if expected != raw:
                problems.append(
                    "not nbfmt-clean (format with `python -m course_utils lint --fix`, not bare nbfmt, "
                    f"which drops colab.gpuType and cell tags): {_first_difference(raw, expected)}"
                )
    return problems


def _looks_like_setup(src: str) -> bool:
    return "course_utils" in src and ("setup(" in src or "COURSE_REPO" in src)


def fix_notebook(
    path: str | os.PathLike, repo: str = REPO, ref: str = REF, root: str | os.PathLike = ROOT
) -> list[str]:
    """Rewrite a notebook towards clean: strip outputs, set metadata, canonical badge and setup cell,
    nbfmt. Returns what it changed. Skeleton problems that need prose (missing sections) stay."""
    path = Path(path)
    raw = path.read_bytes()
    nb = json.loads(raw.decode("utf-8"))
    changes: list[str] = []
    cells = nb.setdefault("cells", [])

    stripped = 0
    for cell in cells:
        if isinstance(cell.get("source"), str):
            _set_source(cell, cell["source"])
        cell.pop("id", None)  # nbformat 4.5 top-level id; nbfmt writes 4.0 and keeps ids in metadata
        if cell.get("cell_type") == "code":
            if cell.get("outputs") or cell.get("execution_count") is not None:
                stripped += 1
            cell["outputs"], cell["execution_count"] = [], None
    if stripped:
        changes.append(f"stripped outputs of {stripped} cell(s)")

    if _metadata_problems(nb.get("metadata")):
        apply_metadata(nb)
        changes.append("set Colab/kernel metadata")

    relpath = notebook_relpath(path, root)
    if cells and _is_markdown(cells[0]) and cell_source(cells[0]).startswith("# "):
        src = cell_source(cells[0])
        own = colab_url(relpath, repo, ref)
        new = COLAB_URL_RE.sub(own, src, count=1)
        if new == src and badge_markdown(relpath, repo, ref) not in src:
            new = src.rstrip("\n") + "\n\n" + badge_markdown(relpath, repo, ref)
        if new != src:
            _set_source(cells[0], new)
            changes.append("rewrote the Colab badge")
    for cell in cells[1:]:
        if _is_markdown(cell):
            src = cell_source(cell)
            new = COLAB_URL_RE.sub(lambda m: colab_url(m["path"], repo, ref), src)
            if new != src:
                _set_source(cell, new)
                changes.append("rewrote Colab links")

    code_idx = [i for i, c in enumerate(cells) if c.get("cell_type") == "code"]
    canonical = setup_cell_source(repo, ref)
    if code_idx and _looks_like_setup(cell_source(cells[code_idx[0]])):
        if cell_source(cells[code_idx[0]]) != canonical:
            _set_source(cells[code_idx[0]], canonical)
            changes.append("rewrote the setup cell")
    else:
        at = code_idx[0] if code_idx else len(cells)
        cells.insert(
            at,
            {
                "cell_type": "code",
                "execution_count": None,
                "metadata": {},
                "outputs": [],
                "source": canonical.splitlines(keepends=True),
            },
        )
        changes.append(f"inserted the setup cell at cell {at}")

    out = nbfmt_bytes(nb, path)
    if out != raw:
        path.write_bytes(out)
        if not changes:
            changes.append("nbfmt")
    return changes


CURRICULUM_ROW = re.compile(
    r"^\|\s*(?P<id>\d\d)\s*\|\s*\[(?P<title>.+?)\]\((?P<notebook>notebooks/[^)\s]+\.ipynb)\)"
    r"\s*\|\s*(?P<time>[^|]*?)\s*\|\s*(?P<measures>[^|]*?)\s*\|"
)


def _root_lessons(root: Path) -> tuple:
    """The lessons whose manifests are under ``root``'s ``course_utils/lessons`` (the checkout being linted)."""
    from course_utils.lessons import discover

    return discover(root / "course_utils" / "lessons")


def curriculum_row(lesson: Any, repo: str = REPO, ref: str = REF) -> str:
    """The README's curriculum row of a lesson, from its manifest: number, title, time, what it measures, links."""
    return (
        f"| {lesson.id} | [{lesson.curriculum_title}]({lesson.notebook}) | {lesson.minutes} min | {lesson.measures} "
        f"| {badge_markdown(lesson.notebook, repo, ref)} · [read it with outputs]"
        f"({pages_url(f'lessons/{Path(lesson.notebook).stem}.html', repo)}) |"
    )


def _curriculum_lines(readme: str) -> list[int]:
    return [n for n, line in enumerate(readme.splitlines()) if CURRICULUM_ROW.match(line)]


def fix_curriculum(root: str | os.PathLike = ROOT) -> bool:
    """Write the README's curriculum rows from the manifests (in place of the rows there); True if it changed."""
    root = Path(root)
    repo, ref = read_repo_settings(root)
    path = root / "README.md"
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    rows = _curriculum_lines(text)
    if not rows:
        raise ValueError("README.md has no curriculum table to rewrite (rows like '| 01 | [Title](notebooks/...) |')")
    new_rows = [curriculum_row(lesson, repo, ref) + "\n" for lesson in _root_lessons(root)]
    new = "".join(lines[: rows[0]] + new_rows + [ln for n, ln in enumerate(lines[rows[0] :], rows[0]) if n not in rows])
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


TIME_LINE = re.compile(r"\*\*Time:\*\* about (\d+) minutes")


def lessons_problems(root: str | os.PathLike = ROOT) -> list[str]:
    """Where the course's notebooks and README disagree with the lessons' manifests (``course_utils/lessons/*/
    lesson.toml``, read as :data:`course_utils.lessons.LESSONS`): a notebook no manifest declares (or a manifest whose
    notebook is missing), a notebook that does not import its own lesson (``from course_utils.lessons import <name>
    as lesson``) or states another time, a README curriculum row that is not the one the manifest makes (``lint --fix``
    writes them). Empty for a root that is not the course's own (no ``course_utils/lessons/``)."""
    root = Path(root)
    if not (root / "course_utils" / "lessons" / "__init__.py").is_file():
        return []
    from course_utils.lessons import ManifestError

    try:
        lessons = _root_lessons(root)
    except ManifestError as err:
        return [str(err)]
    problems = []
    listed = {lesson.notebook: lesson for lesson in lessons}
    present = {notebook_relpath(p, root) for p in list_notebooks(root)}
    problems += [
        f"{nb}: no lesson manifest declares it (course_utils/lessons/<name>/lesson.toml)"
        for nb in sorted(present - set(listed))
    ]
    problems += [
        f"{nb}: declared by course_utils/lessons/{listed[nb].name}/lesson.toml, but there is no such notebook"
        for nb in sorted(set(listed) - present)
    ]
    for notebook in sorted(present & set(listed)):
        lesson = listed[notebook]
        wanted = f"from course_utils.lessons import {lesson.name} as lesson"
        try:
            cells = json.loads((root / notebook).read_text(encoding="utf-8"))["cells"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # lint_notebook says what is wrong with it
        if not any(wanted in cell_source(c).splitlines() for c in cells if c.get("cell_type") == "code"):
            problems.append(f"{notebook}: no code cell imports its own lesson (`{wanted}`)")
        times = [int(m[1]) for c in cells if _is_markdown(c) for m in TIME_LINE.finditer(cell_source(c))]
        if times != [lesson.minutes]:
            problems.append(
                f"{notebook}: its '**Time:** about N minutes' line says {times or 'nothing'}; its manifest "
                f"says {lesson.minutes}"
            )
    try:
        readme = (root / "README.md").read_text(encoding="utf-8")
        repo, ref = read_repo_settings(root)
    except OSError as err:
        return problems + [f"README.md: cannot read it ({err.strerror or err})"]
    lines = readme.splitlines()
    rows = [lines[n] for n in _curriculum_lines(readme)]
    expected = [curriculum_row(lesson, repo, ref) for lesson in lessons]
    if rows != expected:
        ids = [m["id"] + " " + m["notebook"] for m in map(CURRICULUM_ROW.match, rows)]
        wrong = [e.split(" | ")[0].strip("| ") for e in expected if e not in rows]
        problems.append(
            f"README.md: the curriculum table ({', '.join(ids)}) is not the one the lesson manifests make "
            f"(rows for {', '.join(wrong) or 'no lesson'} differ): `python -m course_utils lint --fix` "
            "writes it"
        )
    return problems


def lint_main(argv: list[str] | None = None) -> int:
    """``python -m course_utils lint``: 0 clean, 1 problems found, 2 bad usage, 130 Ctrl-C (commandline.run)."""
    return commandline.run("lint", lambda: _lint(argv))


def _lint(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_utils lint",
        description="Check notebooks against the course skeleton (CONTRIBUTING.md §4).",
    )
    parser.add_argument("paths", nargs="*", help="notebooks (default: every notebooks/*.ipynb)")
    parser.add_argument(
        "--fix", action="store_true", help="strip outputs, set metadata, canonical badge + setup cell, nbfmt; then lint"
    )
    parser.add_argument("--root", default=str(ROOT), help="repository root (default: %(default)s)")
    args = parser.parse_args(argv)
    root = Path(args.root)
    try:
        repo, ref = read_repo_settings(root)
    except OSError:  # a root without course_utils/_repo.py: use this package's settings
        repo, ref = REPO, REF
    paths = [Path(p) for p in args.paths] or list_notebooks(root)
    if not paths:
        print(f"no notebooks under {root / NOTEBOOK_DIR}")
        return 0

    if args.fix:
        for path in paths:
            try:
                changes = fix_notebook(path, repo, ref, root)
            except (OSError, ValueError) as err:  # unreadable file or broken JSON: lint reports it
                print(f"{path}: cannot fix: {err}")
                continue
            print(f"{path}: fixed: {'; '.join(changes)}" if changes else f"{path}: nothing to fix")
        if not args.paths and lessons_problems(root):
            try:
                if fix_curriculum(root):
                    print(f"{root / 'README.md'}: fixed: the curriculum table, from the lesson manifests")
            except (OSError, ValueError) as err:
                print(f"{root / 'README.md'}: cannot fix: {err}")

    n_problems, bad = 0, 0
    if not args.paths:  # the whole course: its notebooks and README against the one list of lessons, its Python
        for problem in lessons_problems(root) + python_format_problems(root, fix=args.fix):
            print(problem)
            n_problems += 1
    for path in paths:
        problems = lint_notebook(path, repo, ref, root)
        for problem in problems:
            print(f"{path}: {problem}")
        n_problems += len(problems)
        bad += bool(problems)
    if n_problems:
        print(f"\n{n_problems} problem(s) in {bad} of {len(paths)} notebook(s).")
        return 1
    print(f"{len(paths)} notebook(s) clean." + ("" if args.paths else " The Python sources are formatted (ruff)."))
    return 0


def python_format_problems(root: Path, fix: bool = False) -> list[str]:
    """The Python files under ``root`` that ruff would reformat, one line each, with the settings of this checkout's
    pyproject.toml (``[tool.ruff]``: the width, and what is left out: the notebooks, which nbfmt formats, and the
    measurements' scripts, kept as they ran); with ``fix``, ruff reformats them first. Ruff missing is one problem."""
    import importlib.util
    import subprocess

    if importlib.util.find_spec("ruff") is None:
        return ["ruff is not installed, so the Python sources were not checked: pip install -r requirements-dev.txt"]
    command = [sys.executable, "-m", "ruff", "format", "--config", str(ROOT / "pyproject.toml"), "--force-exclude"]
    if fix:
        subprocess.run([*command, str(root)], cwd=root, capture_output=True, text=True, check=False)
    proc = subprocess.run(
        [*command, "--check", "--output-format", "concise", str(root)],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode == 0:
        return []
    # "PATH:1:1: unformatted: File would be reformatted" (ruff 0.17, concise); "Would reformat: PATH" before
    lines = [
        m[1] or m[2]
        for m in re.finditer(r"^(?:(.+?):\d+:\d+: unformatted\b.*|Would reformat: (.+))$", proc.stdout, re.M)
    ]
    if not lines:  # ruff itself failed (a syntax error, a bad setting): its own words
        return [f"ruff format failed: {(proc.stderr or proc.stdout).strip()[:500]}"]
    return [f"{line}: not formatted (python -m course_utils lint --fix, or ruff format)" for line in lines]


# ----------------------------------------------------------------------------------------------
# set-repo and consistency
# ----------------------------------------------------------------------------------------------


def _markdown_docs(root: Path) -> list[Path]:
    out: list[Path] = []
    for pattern in MARKDOWN_DOCS:
        out += [p for p in sorted(root.glob(pattern)) if p.is_file()]
    return out


def _rewrite_links(text: str, repo: str, ref: str, old_repo: str | None) -> str:
    text = COLAB_URL_RE.sub(lambda m: colab_url(m["path"], repo, ref), text)
    text = BINDER_URL_RE.sub(lambda m: binder_url(repo, ref, m["urlpath"]), text)  # keeps what it opens
    text = PAGES_URL_RE.sub(lambda m: pages_url(m["path"], repo), text)
    if old_repo and old_repo != repo:  # clone URLs etc.: github.com/OLD -> github.com/NEW
        end = r"(?=\.git\b|\.?(?:[^A-Za-z0-9_.-]|$))"  # the whole name: not a-b/c-d-extras
        text = re.sub(rf"github\.com/{re.escape(old_repo)}{end}", f"github.com/{repo}", text, flags=re.M)
    return CLONE_CD_RE.sub(lambda m: m[0][: m.start("dir") - m.start()] + m["repo"].split("/")[1], text)


def _clone_problems(text: str, rel: str) -> list[str]:
    """A ``cd`` after a clone of the course must enter the folder the clone makes (the repository's name)."""
    problems = []
    for m in CLONE_CD_RE.finditer(text):
        name = m["repo"].split("/")[1]
        if m["dir"] != name:
            line = text.count("\n", 0, m.start("dir")) + 1
            problems.append(
                f"{rel}: line {line}: `cd {m['dir']}` after cloning {m['repo']}, whose folder is {name} "
                "(run `python -m course_utils set-repo`)"
            )
    return problems


def set_repo(repo: str, ref: str = REF, root: str | os.PathLike = ROOT) -> list[str]:
    """Point _repo.py, every notebook's badge/setup cell/Colab links and the docs' Colab/Binder links
    at (repo, ref). Returns one line per file changed. Raises ValueError for a bad slug or ref."""
    # fullmatch, not match: a pattern's $ also matches before a final newline, and a name ending in one left _repo.py
    # with an unterminated string (then nothing imported, set-repo included). "." and ".." are no GitHub names, and
    # no git ref has a component starting with "." or ending in ".lock" (git check-ref-format).
    if not (isinstance(repo, str) and SLUG_RE.fullmatch(repo)) or any(not part.strip(".") for part in repo.split("/")):
        raise ValueError(f"invalid repository {repo!r}: expected OWNER/NAME, e.g. my-user/memory-efficient-tf")
    if (
        not (isinstance(ref, str) and REF_RE.fullmatch(ref))
        or ref.endswith((".", "/"))
        or any(part.startswith(".") or part.endswith(".lock") for part in ref.split("/"))
    ):
        raise ValueError(f"invalid ref {ref!r}: expected a branch or tag name, e.g. main")
    root = Path(root)
    repo_file = root / REPO_FILE
    old_repo, old_ref = read_repo_settings(root)
    changed: list[str] = []
    if list_notebooks(root):  # they are written back through nbfmt: stop before changing any file where it is missing
        try:
            from tensorflow_docs.tools.nbfmt import __main__ as _nbfmt  # noqa: F401
        except ImportError as err:
            raise RuntimeError(
                "the notebooks are formatted with tensorflow-docs' nbfmt, which is not installed: "
                "pip install -r requirements-dev.txt"
            ) from err

    # Every file's new content first, each written only once all are known: a notebook that cannot be read stops
    # the command before any file changed (it used to stop half-way, _repo.py already rewritten).
    writes: list[tuple[Path, bytes]] = []
    text = repo_file.read_text(encoding="utf-8")
    new = re.sub(r'^REPO = "[^"\n]*"$', f'REPO = "{repo}"', text, flags=re.M)
    new = re.sub(r'^REF = "[^"\n]*"$', f'REF = "{ref}"', new, flags=re.M)
    if new != text:
        writes.append((repo_file, new.encode("utf-8")))
        changed.append(f"{REPO_FILE.as_posix()}: {old_repo}@{old_ref} -> {repo}@{ref}")

    for path in list_notebooks(root):
        raw = path.read_bytes()
        try:
            nb = json.loads(raw.decode("utf-8"))
        except ValueError as err:  # not UTF-8, not JSON
            raise ValueError(
                f"{path.relative_to(root).as_posix()} is not a notebook this command can read ({err}); "
                "nothing was changed"
            ) from None
        touched = []
        for cell in nb.get("cells", []):
            src = cell_source(cell)
            if _is_markdown(cell):
                new_src = _rewrite_links(src, repo, ref, None)
                what = "Colab links"
            elif cell.get("cell_type") == "code":
                new_src = SETUP_REPO_LINE_RE.sub(_setup_repo_line(repo, ref), src)
                what = "setup cell"
            else:
                continue
            if new_src != src:
                _set_source(cell, new_src)
                touched.append(what)
        if touched:
            out = nbfmt_bytes(nb, path)
            if out != raw:
                writes.append((path, out))
                changed.append(f"{path.relative_to(root).as_posix()}: {', '.join(sorted(set(touched)))}")

    for path in _markdown_docs(root):
        text = path.read_text(encoding="utf-8")
        new = _rewrite_links(text, repo, ref, old_repo)
        if new != text:
            writes.append((path, new.encode("utf-8")))
            n = sum(a != b for a, b in zip(text.splitlines(), new.splitlines()))
            changed.append(f"{path.relative_to(root).as_posix()}: {n} line(s) of links")
    for path, content in writes:
        path.write_bytes(content)
    return changed


def set_repo_main(argv: list[str] | None = None) -> int:
    """``python -m course_utils set-repo OWNER/NAME``: 0 done, 1 still inconsistent, 2 bad usage (a bad name, an
    unreadable file), 130 Ctrl-C (commandline.run)."""
    return commandline.run("set-repo", lambda: _set_repo(argv))


def _set_repo(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_utils set-repo",
        description="Point every badge, setup cell and README link at another GitHub repository (a fork).",
    )
    parser.add_argument("repo", metavar="OWNER/NAME")
    parser.add_argument("--ref", default=None, help="branch or tag (default: keep the current one)")
    parser.add_argument("--root", default=str(ROOT), help="repository root (default: %(default)s)")
    args = parser.parse_args(argv)
    root = Path(args.root)
    try:
        ref = args.ref if args.ref is not None else read_repo_settings(root)[1]
        changed = set_repo(args.repo, ref, root)
    except (ValueError, OSError, RuntimeError) as err:
        raise commandline.UsageError(err) from None
    if changed:
        for line in changed:
            print(f"changed {line}")
    else:
        print(f"already pointing at {args.repo}@{ref}; nothing changed")
    problems = consistency_problems(root)
    for problem in problems:
        print(f"still inconsistent: {problem}", file=sys.stderr)
    return 1 if problems else 0


def consistency_problems(root: str | os.PathLike = ROOT) -> list[str]:
    """Every notebook's badge + setup cell + Colab links, and every Colab/Binder link in the docs,
    agree with ``course_utils/_repo.py`` and point at notebooks that exist."""
    root = Path(root)
    try:
        repo, ref = read_repo_settings(root)
    except (OSError, ValueError) as err:
        return [str(err)]
    problems: list[str] = []
    for path in list_notebooks(root):
        rel = path.relative_to(root).as_posix()
        try:
            nb = json.loads(path.read_text(encoding="utf-8"))
            cells = nb["cells"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            problems.append(f"{rel}: cannot read: {err}")
            continue
        if not cells or badge_markdown(rel, repo, ref) not in cell_source(cells[0]):
            problems.append(f"{rel}: cell 0 has no badge {badge_markdown(rel, repo, ref)}")
        for i, cell in enumerate(cells):
            src = cell_source(cell)
            if _is_markdown(cell):
                problems += [f"{rel}: {p}" for p in _url_problems(src, f"cell {i}", repo, ref, root)]
        setup = next((c for c in cells if c.get("cell_type") == "code"), None)
        if setup is None or _setup_repo_line(repo, ref) not in cell_source(setup).splitlines():
            problems.append(f"{rel}: setup cell lacks `{_setup_repo_line(repo, ref)}`")
    for path in _markdown_docs(root):
        rel = path.relative_to(root).as_posix()
        problems += _clone_problems(path.read_text(encoding="utf-8"), rel)
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            problems += [f"{rel}: {p}" for p in _url_problems(line, f"line {n}", repo, ref, root)]
    return problems


__all__ = [
    "REQUIRED_METADATA",
    "apply_metadata",
    "badge_markdown",
    "binder_badge_markdown",
    "binder_url",
    "colab_url",
    "consistency_problems",
    "fix_notebook",
    "lint_main",
    "lint_notebook",
    "nbfmt_bytes",
    "pages_url",
    "set_repo",
    "set_repo_main",
    "setup_cell_source",
]
