"""``python -m course_utils site``: the course as a static site that works offline — every lesson rendered with its
outputs and figures, and the report cards of several machines side by side.

::

    python -m course_utils site --out site/ [--mode smoke|full] [--data SOURCE] [--cards PATH …]

* Everything given is checked first — the curriculum, the lessons asked for, every card (read as a regular file of
  bounded size, and rendered), the settings, ``--out`` — and ``--out`` is locked (two builds never share one); only
  then does a notebook run. Bad usage or input is one line and exit status 2.
* Each notebook is executed top to bottom in a fresh kernel (nbclient, the engine of ``jupyter nbconvert
  --execute`` and nbval) in the mode asked for, one after another (the lessons time things: two at once would
  disturb each other), with one progress line per cell (``[02] cell 14/57 (§3) 12.3 s``). Its working directory is
  a fresh scratch folder, ``DIR/.work/<notebook>/``, removed when it ends: what a lesson writes or deletes by a
  relative path (``runs/08``) stays there, never beside the notebooks. The site writes only inside ``DIR``,
  atomically, never through a symbolic link. An executed copy is kept in ``DIR/.executed/`` with what it was run
  from — the notebook's bytes, ``course_utils``' source, the mode and the data — and reused while none of them
  changed.
* Ctrl-C (SIGINT), SIGTERM or SIGHUP stops the kernel (its whole process group) and the build: the pages already
  built stay, the index is rewritten to match them, and the exit status is 130, 143 or 129.
* Each executed notebook is rendered with nbconvert's HTML exporter (JupyterLab's look, the figures inline as data
  URIs) through a template that drops the exporter's CDN scripts (require.js, MathJax, Mermaid: no lesson needs
  them) and adds the course's navigation — previous and next lesson, and the lesson's contents — so
  ``DIR/index.html`` opens from disk with no network. The claims tables stack into one block per claim on a phone,
  verdict and reason in view; paths of the machine that built the site are shown relative (``site-packages/…``).
* ``DIR/index.html`` is the curriculum, read from the README's table; ``DIR/report-cards.html`` sets the claims of
  every card (a ``claims.json`` from ``python -m course_utils prove``) side by side, one column per machine, with a
  "not measured yet" column for a GPU and a TPU where no card has one. Everything a card holds is shown as text.

A notebook that fails is reported with its cell and error, rendered up to the failure, and marked failed on the
index; the rest of the site is still built (exit status 1).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import hashlib
import html
import json
import math
import os
import pathlib
import re
import signal
import sys
import threading
import time
from typing import Any, Callable

from course_utils import _repo
from course_utils import config as _config
from course_utils import commandline, fileguard, notebook_run, processes, report
from course_utils.proof import code_fingerprint

LESSON_DIR = "lessons"
CARDS_PAGE = "report-cards.html"
EXECUTED_DIR = ".executed"  # hidden: GitHub Pages' upload leaves it out
WORK_DIR = ".work"  # the kernels' scratch folders, one per notebook while it runs
CARDS_DIR = "report_cards"  # the committed cards: report_cards/<name>/claims.json
DEFAULT_TIMEOUT_S = 1800  # one cell; the longest full-mode cells (lesson 06's runs) take a few minutes
CARD_LIMIT_BYTES = 16 << 20  # a claims.json is about 100 KB
EXECUTED_LIMIT_BYTES = 512 << 20  # an executed notebook, its figures inline: a few MB
STILL_RUNNING_EVERY_S = notebook_run.STILL_RUNNING_EVERY_S  # a progress line while one cell runs longer than this
from .notebooks import CURRICULUM_ROW  # noqa: E402 - the README's lesson table, as the lint reads it


class SiteError(Exception):
    """Bad usage or input: one line, exit status 2."""


def _say(line: str) -> None:
    """The default progress: a line on stdout, at once (a build prints for minutes; a pipe must not hold it)."""
    print(line, flush=True)


def lesson_page(notebook: str | os.PathLike) -> str:
    """The page of a notebook, relative to the site's root: ``lessons/01_tpu_initialization.html``."""
    return f"{LESSON_DIR}/{pathlib.PurePath(notebook).stem}.html"


# ----------------------------------------------------------------------------------------------
# The curriculum (from the README) and the report cards (from prove's claims.json)
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Lesson:
    id: str
    title: str  # Markdown, as in the README (may hold *Advanced:*)
    notebook: str  # notebooks/NN_name.ipynb, relative to the repository root
    time: str
    measures: str  # "What you will measure", Markdown
    status: str = "not built"  # executed | reused | failed
    seconds: float | None = None
    failure: str = ""  # "cell 12: ValueError: …"
    executed_at: str = ""

    @property
    def page(self) -> str:
        return lesson_page(self.notebook)


def curriculum(root: pathlib.Path) -> list[Lesson]:
    """The lessons of the README's curriculum table, in order."""
    readme = root / "README.md"
    try:
        text = readme.read_text(encoding="utf-8")
    except OSError as err:
        raise SiteError(f"cannot read {readme}: {err.strerror or err}") from None
    lessons = [
        Lesson(m["id"], m["title"], m["notebook"], m["time"], m["measures"])
        for m in map(CURRICULUM_ROW.match, text.splitlines())
        if m
    ]
    if not lessons:
        raise SiteError(
            f"{readme} has no curriculum table (rows like '| 01 | [Title](notebooks/01_x.ipynb) | 25 min | … | … |')"
        )
    missing = [lesson.notebook for lesson in lessons if not (root / lesson.notebook).is_file()]
    if missing:
        raise SiteError(f"the README's curriculum names notebooks that do not exist: {', '.join(missing)}")
    return lessons


SHOWN_MACHINE = {
    "accelerator": ("kind", "name", "replicas"),
    "cpu": ("model", "cores", "usable_cores", "max_isa", "onednn"),
}
SHOWN_MACHINE_TOP = ("memory_gib", "os", "python", "tensorflow", "keras", "course_utils", "mode", "data")


def _text(value: Any, what: str) -> str:
    """A card's field shown on the page: text, or a number shown as text; anything else is not a claims file."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"{what} is {type(value).__name__}, not text")


def _claim(raw: Any, lesson_id: str) -> dict:
    """One claim of a card as the page shows it: its fields as text, its verdict and reason worked out from
    ``holds`` by :class:`report.Claim` (as ``prove`` wrote them), never taken on trust."""
    claim = report.Claim.from_dict(raw)  # ValueError: not a claim
    for field in ("claim", "source", "expected", "measured", "note", "differs_here"):
        setattr(claim, field, _text(getattr(claim, field), f"its {field!r}"))
    if not claim.claim.strip():
        raise ValueError("a claim has no text")
    if isinstance(claim.holds, str) and claim.holds != "noise":
        raise ValueError(f"'holds' is {claim.holds!r} (true, false, null or \"noise\")")
    out = claim.to_dict()  # the verdict in words and its reason, from holds, note and differs_here
    out["lesson"] = lesson_id
    return out


def load_card(path: str | os.PathLike) -> dict:
    """A claims.json written by ``prove``, checked and normalised (every field the page shows is text, every
    verdict worked out from ``holds``); :class:`SiteError` (one line) for anything else. Only a regular file of at
    most 16 MiB is read: a FIFO, a device or a folder is refused at once."""
    path = pathlib.Path(path)
    where = f"--cards {path}"
    try:
        raw = fileguard.read_regular(path, CARD_LIMIT_BYTES)
    except fileguard.NotRegular as err:
        kind = "larger than 16 MiB" if "larger" in str(err) else "not a regular file (a folder, a pipe or a device)"
        raise SiteError(f"{where}: {kind}; give a claims.json written by `python -m course_utils prove`") from None
    except OSError as err:
        raise SiteError(f"{where}: cannot read it ({err.strerror or err})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise SiteError(f"{where}: not a claims file (not UTF-8 text)") from None
    except (ValueError, RecursionError) as err:
        why = str(err).splitlines()[0][:200] if isinstance(err, ValueError) else "nested too deeply"
        raise SiteError(
            f"{where}: not a claims file (not JSON: {why}); give a claims.json written by "
            "`python -m course_utils prove`"
        ) from None
    machine = data.get("machine") if isinstance(data, dict) else None
    lessons = data.get("lessons") if isinstance(data, dict) else None
    if not isinstance(machine, dict) or not isinstance(lessons, dict) or "accelerator" not in machine:
        raise SiteError(
            f"{where}: not a claims file (it needs the 'machine' and 'lessons' that "
            "`python -m course_utils prove` writes)"
        )
    try:
        machine = dict(machine)
        for key, fields in SHOWN_MACHINE.items():
            part = machine.get(key, {})
            if not isinstance(part, dict):
                raise ValueError(f"its machine's {key!r} is {type(part).__name__}, not an object")
            machine[key] = {**part, **{f: _text(part[f], f"machine {key}.{f}") for f in fields if f in part}}
        machine.update({f: _text(machine[f], f"machine {f}") for f in SHOWN_MACHINE_TOP if f in machine})
        machine["xla"] = bool(machine.get("xla"))
        machine["accelerator"].setdefault("kind", "?")
        clean = {}
        for lesson_id, entry in lessons.items():
            claims = entry.get("claims") if isinstance(entry, dict) else None
            if not isinstance(claims, list):
                raise ValueError(f"lesson {lesson_id!r} has no list of claims")
            try:
                clean[lesson_id] = {
                    "title": _text(entry.get("title"), "the title"),
                    "claims": [_claim(claim, lesson_id) for claim in claims],
                }
            except (ValueError, TypeError) as err:
                raise ValueError(f"lesson {lesson_id!r}: {err}") from None
    except (ValueError, TypeError) as err:
        raise SiteError(f"{where}: not a claims file ({str(err).splitlines()[0][:300]})") from None
    return {**data, "machine": machine, "lessons": clean}


def default_cards(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted((root / CARDS_DIR).glob("*/claims.json"))


def card_label(card: dict) -> str:
    """A short column heading: ``CPU · 2 cores · full · XLA``."""
    machine = card["machine"]
    acc, cpu = machine.get("accelerator", {}), machine.get("cpu", {})
    acc, cpu = acc if isinstance(acc, dict) else {}, cpu if isinstance(cpu, dict) else {}
    where = str(acc.get("kind", "?"))
    if acc.get("name") and acc.get("name") != "none":
        where += f" ({acc['name']})"
    else:
        where += f" · {cpu.get('usable_cores') or cpu.get('cores') or '?'} cores"
    return f"{where} · {machine.get('mode', '?')} mode · {'with' if machine.get('xla') else 'without'} XLA"


# ----------------------------------------------------------------------------------------------
# Executing a notebook (or reusing its executed copy)
# ----------------------------------------------------------------------------------------------


def execution_key(notebook: pathlib.Path, env: dict) -> str:
    """What an executed copy depends on: the notebook, course_utils' code and the settings it ran with."""
    digest = hashlib.sha256(notebook.read_bytes())
    digest.update(code_fingerprint().encode())
    digest.update(
        json.dumps({k: env.get(k, "") for k in ("COURSE_SMOKE", "COURSE_DATA", "COURSE_JIT")}, sort_keys=True).encode()
    )
    return digest.hexdigest()[:20]


def sections(nb) -> list[str]:
    """For each cell of ``nb``, the section it is in, short, for the progress lines: ``§3`` under a heading
    "## 3. …", the heading's first words under one without a number, "start" before the first."""
    out, here = [], "start"
    for cell in nb.cells:
        if cell.get("cell_type") == "markdown":
            for text in re.findall(r"^##\s+(.+?)\s*$", cell.get("source", ""), re.M):
                text = re.sub(r"[*_`]", "", text)
                number = re.match(r"(\d+(?:\.\d+)*)\.?\s", text)
                here = f"§{number.group(1)}" if number else (text if len(text) <= 24 else text[:23] + "…")
        out.append(here)
    return out


def _read_executed(cached: pathlib.Path, key: str):
    """The executed copy at ``cached`` and its record, if it was made from ``key`` and did not fail; else None."""
    import nbformat

    try:
        nb = nbformat.reads(
            fileguard.read_regular(cached, EXECUTED_LIMIT_BYTES, follow_links=False).decode("utf-8"), as_version=4
        )
        info = dict(nb.metadata.get("course_site", {}))
    except Exception:  # noqa: BLE001 - missing, damaged, not a file: executed again
        return None
    fine = (
        info.get("key") == key
        and info.get("failure") == ""
        and isinstance(info.get("executed_at"), str)
        and isinstance(info.get("seconds"), (int, float))
        and not isinstance(info.get("seconds"), bool)
        and math.isfinite(info["seconds"])
    )
    return (nb, info) if fine else None


def execute(
    notebook: pathlib.Path,
    env: dict,
    cache_dir: pathlib.Path,
    timeout: float,
    *,
    workdir: pathlib.Path | None = None,
    inside: pathlib.Path | None = None,
    progress: Callable[[str], None] | None = None,
    label: str = "",
    shown: Callable[[str], str] = lambda text: text,
) -> tuple[Any, dict]:
    """Run ``notebook`` top to bottom with ``workdir`` as its working directory (or reuse the copy in
    ``cache_dir`` made from the same notebook, code and settings), one ``progress`` line per cell. The copy is
    written inside ``inside`` only. Returns the executed notebook and ``{"status", "seconds", "failure",
    "executed_at"}``; a stop signal stops the kernel and raises KeyboardInterrupt (SIGINT) or
    :class:`processes.Stopped`, with no copy written."""
    import nbformat

    key = execution_key(notebook, env)
    cached = cache_dir / notebook.name
    reused = _read_executed(cached, key)
    if reused is not None:
        return reused[0], {**reused[1], "status": "reused"}
    try:
        nb = nbformat.read(notebook, as_version=4)
    except Exception as err:  # noqa: BLE001 - not JSON, not a notebook, unreadable: the reader's reason, in one line
        reason = " ".join(str(err).split())[:200] or type(err).__name__
        raise SiteError(
            f"{notebook} is not a notebook the site can read ({reason}); restore it (git checkout -- "
            f"{notebook.name}) or fix it"
        ) from None
    where = sections(nb)

    def report_cell(index: int, seconds: float, how: str) -> None:
        if progress is not None:
            extra = {"": "", "error": " — error"}.get(how, f" — {how}")
            progress(f"[{label}] cell {index + 1}/{len(nb.cells)} ({where[index]}) {seconds:.1f} s{extra}")

    # the kernel's own output (its warnings, a crash) goes to a log beside the executed copy, not to the terminal
    log_path = cache_dir / f"{notebook.stem}.kernel.log"
    seconds, failure = notebook_run.run(
        nb,
        env,
        workdir=workdir or notebook.parent,
        timeout=timeout,
        log_path=log_path,
        report_cell=report_cell,
        still_running_every_s=STILL_RUNNING_EVERY_S,
    )
    if failure.startswith("the kernel died"):
        failure = failure.replace(
            f"its output is in {log_path.name}", f"its output is in {EXECUTED_DIR}/{cache_dir.name}/{log_path.name}"
        )
    info = {
        "key": key,
        "seconds": seconds,
        "failure": shown(failure),
        "executed_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "mode": "smoke" if env.get("COURSE_SMOKE") == "1" else "full",
    }
    nb.metadata["course_site"] = info
    fileguard.write_text(cached, nbformat.writes(nb), inside=inside)
    return nb, {**info, "status": "failed" if failure else "executed"}


# ----------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------

SITE_CSS = """
:root { --ink: #1f2328; --muted: #59636e; --line: #d0d7de; --accent: #0b5cad; --bad: #b42318; --bg-soft: #f6f8fa; }
.course-nav { position: sticky; top: 0; z-index: 10; display: flex; flex-wrap: wrap; gap: .4rem 1.2rem;
  align-items: center; padding: .6rem 1rem; background: #fff; border-bottom: 1px solid var(--line);
  font: 15px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
.course-nav a, .course-toc a, .course-pager a { color: var(--accent); text-decoration: none; }
.course-nav a:hover, .course-toc a:hover, .course-pager a:hover { text-decoration: underline; }
.course-nav .here { color: var(--muted); }
.course-banner { margin: 1rem; padding: .8rem 1rem; border-left: 4px solid var(--bad); background: #fef3f2;
  font: 15px/1.5 system-ui, sans-serif; color: var(--ink); overflow-wrap: anywhere; }
.course-toc { margin: .6rem 0 1.2rem; padding: .7rem 1rem; border: 1px solid var(--line); border-radius: 6px;
  background: var(--bg-soft); font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color: var(--ink); }
.course-toc .course-toc-title { margin: 0 0 .3rem; font-weight: 600; }
.course-toc ol { margin: 0; padding-left: 0; list-style: none; columns: 2 22rem; column-gap: 2rem; }  /* the
  headings carry their own numbers */
.course-toc li { break-inside: avoid; margin: .1rem 0; }
.course-pager { display: flex; flex-wrap: wrap; gap: .6rem 1.5rem; justify-content: space-between;
  margin: 2rem 0 1rem; padding: 1rem 0 0; border-top: 1px solid var(--line);
  font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
.course-pager a { display: block; max-width: 24rem; }
.course-pager .label { display: block; font-size: .8rem; color: var(--muted); }
.course-pager .next { margin-left: auto; text-align: right; }
.course-page { max-width: 72rem; margin: 0 auto; padding: 1rem; font: 16px/1.55 system-ui, -apple-system,
  "Segoe UI", Roboto, sans-serif; color: var(--ink); }
.course-page h1 { font-size: 1.7rem; margin: .6rem 0 .4rem; }
.course-page p { max-width: 60rem; }
.course-page code { font-size: .9em; background: var(--bg-soft); padding: .1em .3em; border-radius: 4px; }
.scroll { overflow-x: auto; -webkit-overflow-scrolling: touch; }
table.course { border-collapse: collapse; margin: .8rem 0; font-size: .93rem; }
table.course th, table.course td { border: 1px solid var(--line); padding: .45rem .6rem; vertical-align: top;
  text-align: left; }
table.course th { background: var(--bg-soft); }
table.course td.measured { min-width: 12rem; }
table.course tr.lesson th { background: #eaeef2; font-size: 1rem; }
table.course tr.differs td:first-child { border-left: 4px solid #bf8700; }
table.cards td:first-child, table.cards thead th:first-child { position: sticky; left: 0; z-index: 1;
  background: #fff; }  /* the claim stays in view while the machines scroll past */
table.cards thead th:first-child { background: var(--bg-soft); }
table.cards td:first-child { min-width: 12rem; max-width: 22rem; }
table.course.cards .missing { min-width: 0; width: 6rem; }  /* a kind no card has: a dash per claim */
.verdict { display: block; margin-top: .25rem; font-weight: 600; }
.reason { display: block; margin-top: .15rem; font-size: .9em; font-weight: 400; color: var(--muted); }
.claim-id { display: block; margin-top: .15rem; font: .75rem ui-monospace, monospace; color: var(--muted); }
.v-fails { color: var(--bad); }
.v-differs { color: #9a6700; }
.v-none, .v-noise { color: var(--muted); font-weight: 400; }
.status-failed { color: var(--bad); font-weight: 600; }
.muted { color: var(--muted); }
.machine { font-size: .8rem; font-weight: 400; color: var(--muted); display: block; margin-top: .3rem; }
/* a lesson's "Claims vs. measured" table: left-aligned, the verdict in bold, its reason under it */
.jp-RenderedHTMLCommon table.course-claims { table-layout: auto; }
.jp-RenderedHTMLCommon table.course-claims td, .jp-RenderedHTMLCommon table.course-claims th { text-align: left;
  vertical-align: top; }
.jp-RenderedHTMLCommon table.course-claims td.claim-verdict { min-width: 10rem; }
.jp-MarkdownCell [id] { scroll-margin-top: 4.5rem; }  /* a heading reached from the contents, below the sticky bar */
@media (max-width: 600px) {
  .course-page { padding: .6rem; font-size: 15px; }
  .course-page h1 { font-size: 1.35rem; }
  table.course { font-size: .85rem; }
  table.course td.measured { min-width: 9rem; }
  .course-nav { font-size: 14px; }
  /* on a phone a claims table is one block per claim: the claim, then its verdict and reason, then the rest,
     each with its column's name; nothing to scroll sideways, nothing that needs a hover */
  .jp-RenderedHTMLCommon table.course-claims, .jp-RenderedHTMLCommon table.course-claims tbody { display: block;
    width: 100%; }
  .jp-RenderedHTMLCommon table.course-claims thead { display: none; }
  .jp-RenderedHTMLCommon table.course-claims tr { display: flex; flex-direction: column; padding: .5rem 0;
    border-top: 1px solid var(--line); }
  .jp-RenderedHTMLCommon table.course-claims td { display: block; padding: .1rem .2rem; order: 3;
    overflow-wrap: anywhere; min-width: 0; }
  .jp-RenderedHTMLCommon table.course-claims td.claim-text { order: 1; font-weight: 600; }
  .jp-RenderedHTMLCommon table.course-claims td.claim-verdict { order: 2; min-width: 0; }
  .jp-RenderedHTMLCommon table.course-claims td:not(.claim-text):not(.claim-verdict)::before {
    content: attr(data-label) ": "; color: var(--muted); }
  /* the report cards: one block per claim, one line per machine (named), verdict and reason under the value */
  table.cards, table.cards tbody, table.cards tr, table.cards td, table.cards th { display: block; }
  table.cards thead { display: none; }
  table.cards tr { padding: .4rem 0; border-bottom: 1px solid var(--line); }
  table.cards td, table.cards th { border: none; padding: .2rem .3rem; overflow-wrap: anywhere; }
  table.cards td:first-child { position: static; min-width: 0; max-width: none; font-weight: 600; }
  table.cards td.measured { min-width: 0; }
  table.cards td[data-label]::before { content: attr(data-label); display: block; font-size: .78rem;
    color: var(--muted); }
  table.course.cards tr.differs td:first-child { border-left: none; }
  table.cards tr.differs { border-left: 4px solid #bf8700; padding-left: .4rem; }
  table.course.cards td.missing { display: none; }  /* the text above says which kinds have no card yet */
  /* the curriculum: one block per lesson, its number and title first */
  table.curriculum, table.curriculum tbody, table.curriculum tr, table.curriculum td { display: block; }
  table.curriculum thead { display: none; }
  table.curriculum tr { padding: .5rem 0; border-bottom: 1px solid var(--line); }
  table.curriculum td { border: none; padding: .15rem .2rem; }
  table.curriculum td.number { float: left; margin-right: .4rem; font-weight: 600; }
  table.curriculum td.title { font-weight: 600; }
  table.curriculum td[data-label]::before { content: attr(data-label) ": "; color: var(--muted); }
}
"""

LESSON_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{#- The lab template, offline: its CDN scripts (require.js, MathJax, Mermaid) are left out, the course's
    navigation, a failure banner and the previous/next links added. -#}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block extra_css -%}<style type="text/css">{{ resources.course_css }}</style>{%- endblock extra_css -%}
{%- block body_header -%}
{{ super() }}
{{ resources.course_header }}
{%- endblock body_header -%}
{%- block body_footer -%}
{{ resources.course_footer }}
{{ super() }}
{%- endblock body_footer -%}
"""


def _markdown(text: str) -> str:
    """Inline Markdown (the README's cells) as HTML, without the wrapping paragraph."""
    from nbconvert.filters import markdown2html

    out = markdown2html(text).strip()
    return out[3:-4] if out.startswith("<p>") and out.endswith("</p>") and out.count("<p>") == 1 else out


def _nav(lessons: list[Lesson], here: int | None, up: str, available: set[str] | None = None) -> str:
    """The bar at the top of every page: home, report cards, and the previous and next lesson where their pages are
    ``available`` (default: all)."""
    links = [f'<a href="{up}index.html">Course home</a>', f'<a href="{up}{CARDS_PAGE}">Report cards</a>']
    if here is not None:
        if here > 0 and (available is None or lessons[here - 1].page in available):
            prev = lessons[here - 1]
            links.append(f'<a href="{up}{prev.page}" rel="prev">← {prev.id}</a>')
        links.append(f'<span class="here">{lessons[here].id} · {_markdown(lessons[here].title)}</span>')
        if here + 1 < len(lessons) and (available is None or lessons[here + 1].page in available):
            nxt = lessons[here + 1]
            links.append(f'<a href="{up}{nxt.page}" rel="next">{nxt.id} →</a>')
    return f'<nav class="course-nav" aria-label="course">{"".join(links)}</nav>'


def _pager(lessons: list[Lesson], here: int, up: str, available: set[str] | None = None) -> str:
    """The end of a lesson page: the previous and the next lesson, by number and title, where their pages are
    ``available`` (default: all), and the way back to this lesson's contents."""
    links = []
    if here > 0 and (available is None or lessons[here - 1].page in available):
        prev = lessons[here - 1]
        links.append(
            f'<a class="prev" href="{up}{prev.page}"><span class="label">← Previous lesson</span>'
            f"{prev.id} · {_markdown(prev.title)}</a>"
        )
    links.append('<a class="top" href="#course-contents"><span class="label">This lesson</span>Contents</a>')
    if here + 1 < len(lessons) and (available is None or lessons[here + 1].page in available):
        nxt = lessons[here + 1]
        links.append(
            f'<a class="next" href="{up}{nxt.page}"><span class="label">Next lesson →</span>'
            f"{nxt.id} · {_markdown(nxt.title)}</a>"
        )
    return f'<nav class="course-pager" aria-label="lessons">{"".join(links)}</nav>'


SITE_PACKAGES = re.compile(
    r"(?<![\w.~-])(?:[A-Za-z]:)?(?:[/\\][^\s/\\'\"<>|*?\x1b]+)*?[/\\]"
    r"(?P<name>site-packages|dist-packages)(?=[/\\])"
)


ANSI_ESCAPE = re.compile(r"(\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\))")


def shown_paths(*folders: tuple[str | os.PathLike, str]) -> Callable[[str], str]:
    """A function that rewrites the paths of the machine that builds the site as short relative ones:
    ``/work/venv/lib/python3.11/site-packages/keras/…`` → ``site-packages/keras/…``, the standard library →
    ``python3.11/…``, the temporary folder → ``tmp/…``, the home folder → ``~/…``, and each ``(folder, name)``
    given (the course's root → ``""``: relative to it; a scratch folder → ``""``)."""
    import sysconfig
    import tempfile

    names: dict[str, str] = {}
    stdlib = sysconfig.get_paths().get("stdlib") or ""
    known = [
        (stdlib, os.path.basename(stdlib)),
        (sys.prefix, os.path.basename(sys.prefix)),
        (tempfile.gettempdir(), "tmp"),
        (os.path.expanduser("~"), "~"),
        *folders,
    ]
    for folder, name in known:
        for form in {str(folder), os.path.realpath(folder)} if str(folder) else ():
            form = form.rstrip("/\\")
            if len(form) > 1 and form not in names:  # never "/" itself
                names[form] = name
    prefixes = sorted(names, key=len, reverse=True)  # the longest (most specific) first
    pattern = (
        re.compile(r"(?<![\w.~-])(?:" + "|".join(map(re.escape, prefixes)) + r")(?P<sep>[/\\]|(?![\w.-]))")
        if prefixes
        else None
    )

    def swap(match: re.Match) -> str:
        name = names[match.group(0)[: len(match.group(0)) - len(match.group("sep"))]]
        if match.group("sep"):
            return f"{name}/" if name else ""
        return name or "."

    def plain(text: str) -> str:
        text = SITE_PACKAGES.sub(lambda m: m.group("name"), text)
        return pattern.sub(swap, text) if pattern else text

    def shown(text: str) -> str:
        if not isinstance(text, str) or ("/" not in text and "\\" not in text):
            return text
        # a traceback's colours (ANSI escapes) sit right before its paths: the text between them is rewritten
        return "".join(
            piece if n % 2 and not piece.startswith("\x1b]") else plain(piece)  # a link's target too
            for n, piece in enumerate(ANSI_ESCAPE.split(text))
        )

    return shown


def _shown_outputs(nb, shown: Callable[[str], str]) -> None:
    """Rewrite the paths (:func:`shown_paths`) in ``nb``'s outputs, in place: tracebacks, printed text and warnings,
    plain-text results."""

    def each(value):
        return [shown(v) for v in value] if isinstance(value, list) else shown(value)

    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            kind = output.get("output_type")
            if kind == "error":
                output["evalue"] = each(output.get("evalue", ""))
                output["traceback"] = each(output.get("traceback", []))
            elif kind == "stream":
                output["text"] = each(output.get("text", ""))
            elif kind in ("execute_result", "display_data") and "text/plain" in output.get("data", {}):
                output["data"]["text/plain"] = each(output["data"]["text/plain"])


REMOTE_IMAGE = re.compile(r"!\[(?P<alt>[^\]]*)\]\((?P<src>https?://[^)\s]+)\)")


def offline(nb, shown: Callable[[str], str] | None = None):
    """A copy of ``nb`` whose Markdown loads nothing from the network: a remote image (the Colab badge) becomes its
    alt text, still inside its link; and whose outputs show the paths of the machine that built it relative
    (``shown``, default :func:`shown_paths`)."""
    import copy

    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.get("cell_type") == "markdown":
            cell.source = REMOTE_IMAGE.sub(lambda m: m["alt"] or "image", cell.source)
    _shown_outputs(nb, shown or shown_paths())
    return nb


TITLE_LITERAL = re.compile(
    r"""(?:\btitle\s*=\s*|\.set_title\(\s*|\.suptitle\(\s*|plt\.title\(\s*)f?(["'])(?P<text>(?:(?!\1).)+)\1"""
)
NBCONVERT_DEFAULT_ALT = "No description has been provided for this image"


def figure_alts(nb) -> list[str]:
    """Alt text for each figure (a PNG output) of ``nb``, in order: the titles its cell sets (``title=``,
    ``set_title``, ``suptitle``; an f-string's fields become "…", a title that is mostly fields is left out), else
    "A figure", and the section it is in."""
    alts, section = [], ""
    for cell in nb.cells:
        if cell.get("cell_type") == "markdown":
            headings = re.findall(r"^#{1,4}\s+(.+)$", cell.source, re.M)
            section = headings[-1].strip() if headings else section
            continue
        pngs = sum("image/png" in out.get("data", {}) for out in cell.get("outputs", []))
        if not pngs:
            continue
        titles = [
            re.sub(r"\{[^{}]*\}", "…", m["text"]).replace("\\n", " ") for m in TITLE_LITERAL.finditer(cell.source)
        ]
        titles = [t for t in titles if t.count("…") <= 2 and len(re.findall(r"[A-Za-z]", t)) >= 6]  # not "… → …"
        what = "Figure: " + "; ".join(dict.fromkeys(titles)) if titles else "A figure"
        where = re.sub(r"`|\*\*|(?<!\w)[*_]|[*_](?!\w)", "", section)
        alts += [f"{what}" + (f" (section “{where}”)" if where else "")] * pngs
    return alts


def _with_alts(page: str, alts: list[str]) -> str:
    """``page`` with nbconvert's placeholder alt text on its figures replaced by ``alts``, when they match one to one
    (otherwise unchanged: a wrong description is worse than the placeholder)."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(page, features="html.parser")
    images = soup.select("div.jp-RenderedImage img")
    if len(images) != len(alts) or any(img.get("alt") != NBCONVERT_DEFAULT_ALT for img in images):
        return page
    for img, alt in zip(images, alts):
        img["alt"] = alt
    return str(soup)


VERDICT_CLASSES = {
    report.HOLDS: "v-holds",
    report.FAILS: "v-fails",
    report.DIFFERS: "v-differs",
    report.NOISE: "v-noise",
    report.UNMEASURABLE: "v-none",
}
CLAIM_COLUMNS = {"Claim": "claim-text", "Verdict": "claim-verdict"}


def _readable(page: str) -> str:
    """A rendered lesson made easier to read: a contents list (the lesson's ``##`` headings) after its title, and
    each "Claims vs. measured" table marked up so that a phone shows it as one block per claim — every cell named
    by its column, the verdict in bold with its reason on a line under it."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(page, features="html.parser")
    for table in soup.select(".jp-RenderedHTMLCommon table"):
        heads = [th.get_text(" ", strip=True) for th in table.select("thead th")]
        if "Claim" not in heads or "Verdict" not in heads:
            continue
        table["class"] = [*table.get("class", []), "course-claims"]
        for row in table.select("tbody tr"):
            for head, td in zip(heads, row.find_all("td", recursive=False)):
                td["data-label"] = head
                column = CLAIM_COLUMNS.get(head, "claim-" + re.sub(r"\W+", "-", head.lower()))
                td["class"] = [*td.get("class", []), column]
                if head != "Verdict":
                    continue
                text = td.get_text().strip()
                status = next((s for s in VERDICT_CLASSES if text.startswith(s)), None)
                if status is None:
                    continue
                reason = text[len(status) :].strip().removeprefix("—").strip()
                td.clear()
                word = soup.new_tag("span", attrs={"class": f"verdict {VERDICT_CLASSES[status]}"})
                word.string = status
                td.append(word)
                if reason:
                    why = soup.new_tag("span", attrs={"class": "reason"})
                    why.string = reason
                    td.append(why)
    headings = soup.select(".jp-MarkdownCell h2[id]")
    if headings:
        toc = soup.new_tag(
            "nav", attrs={"class": "course-toc", "id": "course-contents", "aria-label": "Contents of this lesson"}
        )
        title = soup.new_tag("p", attrs={"class": "course-toc-title"})
        title.string = "Contents"
        items = soup.new_tag("ol")
        for heading in headings:
            text = "".join(
                piece.get_text() if hasattr(piece, "get_text") else str(piece)
                for piece in heading.contents
                if getattr(piece, "name", None) != "a" or "anchor-link" not in piece.get("class", [])
            ).strip()
            link = soup.new_tag("a", attrs={"href": f"#{heading['id']}"})
            link.string = text or heading["id"]
            item = soup.new_tag("li")
            item.append(link)
            items.append(item)
        toc.append(title)
        toc.append(items)
        first = soup.select_one(".jp-MarkdownCell h1")
        cell = first.find_parent(class_="jp-Cell") if first is not None else None
        if cell is not None:
            cell.insert_after(toc)
        elif soup.main is not None:
            soup.main.insert(0, toc)
    else:
        for link in soup.select('.course-pager a[href="#course-contents"]'):
            link.decompose()  # no contents list to go back to
    return str(soup)


def write_template(template_dir: pathlib.Path, inside: pathlib.Path | None = None) -> pathlib.Path:
    """The course's nbconvert template (``course``, extending ``lab``) written under ``template_dir`` (a folder
    inside ``inside``, never through a link, when given)."""
    folder = template_dir / "course"
    if inside is not None:
        fileguard.make_folder(folder, inside=inside)
    else:
        folder.mkdir(parents=True, exist_ok=True)
    fileguard.write_text(folder / "index.html.j2", LESSON_TEMPLATE, inside=inside)
    fileguard.write_text(
        folder / "conf.json", json.dumps({"base_template": "lab", "mimetypes": {"text/html": True}}), inside=inside
    )
    return template_dir


def render_lesson(
    nb,
    lessons: list[Lesson],
    index: int,
    template_dir: pathlib.Path,
    available: set[str] | None = None,
    shown: Callable[[str], str] | None = None,
) -> str:
    """One lesson as a standalone HTML page (nbconvert's HTML exporter, the course template): the navigation and
    the previous/next links lead to the lesson pages in ``available`` (default: all), a contents list follows the
    title, and the paths in the outputs are shown relative (``shown``, default :func:`shown_paths`)."""
    from nbconvert import HTMLExporter

    lesson = lessons[index]
    header = _nav(lessons, index, "../", available)
    if lesson.failure:
        header += (
            f'<div class="course-banner" role="alert"><strong>This lesson failed to execute</strong> when the '
            f"site was built ({html.escape(lesson.failure)}): it is shown up to that cell.</div>"
        )
    exporter = HTMLExporter(
        template_name="course",
        extra_template_basedirs=[str(template_dir)],
        exclude_input_prompt=True,
        exclude_output_prompt=True,
    )
    body, _ = exporter.from_notebook_node(
        offline(nb, shown),
        resources={
            "metadata": {"name": f"{lesson.id} · {re.sub(r'[*_`]', '', lesson.title)}"},
            "course_css": SITE_CSS,
            "course_header": header,
            "course_footer": _pager(lessons, index, "../", available),
        },
    )
    return _readable(_with_alts(body, figure_alts(nb)))


def _page(title: str, body: str, lessons: list[Lesson]) -> str:
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta name="viewport" content="width=device-width, initial-scale=1.0">\n<title>{html.escape(title)}</title>\n'
        f"<style>{SITE_CSS}</style>\n</head>\n<body>\n{_nav(lessons, None, '')}\n"
        f'<main class="course-page">\n{body}\n</main>\n</body>\n</html>\n'
    )


def index_html(lessons: list[Lesson], mode: str, repo: str, ref: str, n_cards: int, built: set[str]) -> str:
    """The curriculum; ``built``: the lesson pages that exist in the site (a lesson not built has no link)."""
    from .notebooks import colab_url

    rows = []
    for lesson in lessons:
        if lesson.status == "failed":
            status = f'<span class="status-failed">failed</span> — {html.escape(lesson.failure)}'
        elif lesson.seconds is not None:
            status = f"executed in {lesson.seconds:.0f} s ({html.escape(lesson.executed_at[:10])})"
        elif lesson.page in built:
            status = '<span class="muted">built earlier</span>'
        else:
            status = '<span class="muted">not built</span>'
        title = _markdown(lesson.title)
        link = f'<a href="{lesson.page}">{title}</a>' if lesson.page in built else title
        rows.append(
            f'<tr><td class="number">{lesson.id}</td><td class="title">{link}</td>'
            f'<td data-label="Time">{html.escape(lesson.time)}</td>'
            f'<td data-label="What you will measure">{_markdown(lesson.measures)}</td>'
            f'<td data-label="This build">{status}</td>'
            f'<td><a href="{html.escape(colab_url(lesson.notebook, repo, ref))}">Open in Colab</a></td></tr>'
        )
    body = f"""
<h1>Memory-efficient, fast TensorFlow on TPUs — and on GPUs and CPUs</h1>
<p>Every lesson below is shown with the outputs and figures of one run, top to bottom, in <strong>{html.escape(mode)} mode</strong>
on the machine that built this site — the <em>Claims vs. measured</em> table at the end of each lesson included. Run
it yourself in Colab (<em>Open in Colab</em>, each lesson's last link) to get your own hardware's numbers. The
<a href="{CARDS_PAGE}">report cards</a> set the claims of {n_cards} measured machine(s) side by side.</p>
<div class="scroll"><table class="course curriculum">
<thead><tr><th>#</th><th>Lesson</th><th>Time</th><th>What you will measure</th><th>This build</th><th>Run it</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table></div>
<p class="muted">Built {datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")} by
<code>python -m course_utils site</code>. The course's source: <a href="https://github.com/{html.escape(repo)}">github.com/{html.escape(repo)}</a>.</p>
"""
    return _page("Memory-efficient, fast TensorFlow — course", body, lessons)


def _verdict_class(verdict: str) -> str:
    return {
        "holds": "v-holds",
        "does not hold": "v-fails",
        "differs on this hardware": "v-differs",
        "inconclusive": "v-noise",
        "not measurable here": "v-none",
    }.get(verdict, "v-other")


def _slug(text: str, taken: set[str]) -> str:
    """An id made of letters, digits, ``-`` and ``_`` only, not in ``taken`` (then added to it)."""
    base = re.sub(r"[^A-Za-z0-9_-]+", "-", str(text)).strip("-")[:60] or "x"
    slug, n = base, 2
    while slug in taken:
        slug, n = f"{base}-{n}", n + 1
    taken.add(slug)
    return slug


def cards_html(cards: list[tuple[str, dict]], lessons: list[Lesson]) -> str:
    """The report cards page: one column per card, one row per claim, grouped by lesson; a "not measured yet"
    column for each accelerator kind no card has. Everything a card brings is escaped (ids made of safe letters);
    each verdict has its reason written under it (a phone cannot hover), and on a phone each claim is one block
    with one named line per machine."""
    esc = html.escape
    icons = {report.WORDS[k]: k.split(" ", 1)[0] for k in report.WORDS}  # ✅ holds, ❌ does not hold, …
    kinds = {card["machine"]["accelerator"].get("kind") for _, card in cards}
    missing = [kind for kind in ("GPU", "TPU") if kind not in kinds]
    titles = {lesson.id: _markdown(lesson.title) for lesson in lessons}
    order: dict[str, list[str]] = {}
    found: dict[tuple[str, str], list[dict | None]] = {}
    texts: dict[tuple[str, str], str] = {}  # a row's claim, as the first card that has it words it
    # a row per claim id; a card from before ids (format 1) joins the row whose claim reads the same
    id_of = {
        (lesson_id, claim["claim"]): claim["id"]
        for _, card in cards
        for lesson_id, entry in card["lessons"].items()
        for claim in entry.get("claims", [])
        if claim.get("id")
    }
    for column, (_, card) in enumerate(cards):
        for lesson_id in sorted(card["lessons"]):
            entry = card["lessons"][lesson_id]
            titles.setdefault(lesson_id, esc(entry.get("title") or ""))
            for claim in entry.get("claims", []):
                row = claim.get("id") or id_of.get((lesson_id, claim["claim"]), claim["claim"])
                key = (lesson_id, row)
                if key not in found:
                    found[key] = [None] * len(cards)
                    order.setdefault(lesson_id, []).append(row)
                    texts[key] = claim["claim"]
                found[key][column] = claim
    labels = [card_label(card) for _, card in cards] + [f"{kind}: not measured yet" for kind in missing]
    head = "".join(
        f'<th scope="col">{esc(card_label(card))}<span class="machine">{esc(_machine_line(card))}</span></th>'
        for _, card in cards
    )
    head += "".join(
        f'<th scope="col" class="missing">{kind}<span class="machine">not measured yet</span></th>' for kind in missing
    )
    width = 1 + len(cards) + len(missing)
    rows, taken = [], set()
    for lesson_id in sorted(order):
        rows.append(
            f'<tr class="lesson" id="lesson-{_slug(lesson_id, taken)}"><th colspan="{width}">'
            f"{esc(lesson_id)} · {titles.get(lesson_id, '')}</th></tr>"
        )
        for row in order[lesson_id]:
            cells, text = found[(lesson_id, row)], texts[(lesson_id, row)]
            verdicts = {c["verdict"] for c in cells if c is not None}
            tds = []
            for label, claim in zip(labels, cells):
                if claim is None:
                    tds.append(
                        f'<td class="measured" data-label="{esc(label)}"><span class="muted">not in this card'
                        "</span></td>"
                    )
                    continue
                reason = f'<span class="reason">{esc(claim["reason"])}</span>' if claim.get("reason") else ""
                tds.append(
                    f'<td class="measured" data-label="{esc(label)}">{esc(claim.get("measured", ""))}'
                    f'<span class="verdict {_verdict_class(claim["verdict"])}">'
                    f"{icons.get(claim['verdict'], '')} {esc(claim['verdict'])}</span>{reason}</td>"
                )
            tds += [
                f'<td class="measured missing" data-label="{esc(label)}"><span class="muted">—</span></td>'
                for label in labels[len(cards) :]
            ]
            differs = ' class="differs"' if len(verdicts) > 1 else ""
            named = f'<span class="claim-id">{esc(row)}</span>' if row != text else ""
            rows.append(f"<tr{differs}><td>{esc(text)}{named}</td>{''.join(tds)}</tr>")
    if missing:
        todo = (
            f"<p>No card from a {' or a '.join(missing)} yet: on one, run <code>python -m course_utils prove --mode "
            f"full --out report_cards/NAME</code> (and again with <code>--jit</code>) and commit the folder.</p>"
        )
    else:
        todo = ""
    body = f"""
<h1>Report cards: the course's claims, measured on real hardware</h1>
<p>Every lesson ends with a <em>Claims vs. measured</em> table. Each column here is one machine's
<code>claims.json</code>, written by <code>python -m course_utils prove</code> — nothing on this page is typed by
hand. A row with a yellow edge reads differently on two machines: that is where hardware (or XLA) changes the
answer. Under each verdict, its reason.</p>
{todo}
<div class="scroll"><table class="course cards">
<thead><tr><th scope="col">Claim</th>{head}</tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table></div>
<p class="muted">Cards: {", ".join(esc(name) for name, _ in cards) or "none"}.</p>
"""
    return _page("Report cards — claims vs. measured", body, lessons)


def _machine_line(card: dict) -> str:
    from course_utils.proof import machine_line

    try:
        line = machine_line(card["machine"])
    except (KeyError, TypeError, AttributeError, ValueError):
        return ""
    code = card["machine"].get("course_utils")  # cards measured with other course code are not the same experiment
    return line + (f" · course_utils {code[:12]}" if isinstance(code, str) and code else "")


# ----------------------------------------------------------------------------------------------
# The build
# ----------------------------------------------------------------------------------------------


def _absolute_data(value: str) -> str:
    """``npz:PATH`` with PATH made absolute: the kernels run in a scratch folder, not where the command was given."""
    if value.startswith("npz:"):
        return "npz:" + os.path.abspath(os.path.expanduser(value[4:].strip()))
    return value


@contextlib.contextmanager
def _signals_ignored():
    """SIGINT, SIGTERM and SIGHUP ignored while a stopped build puts its site in order (main thread only)."""
    old = {}
    if threading.current_thread() is threading.main_thread():
        for sig in notebook_run.stop_signals():
            old[sig] = signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def build(
    out: str | os.PathLike,
    *,
    root: pathlib.Path,
    mode: str = "smoke",
    data: str | None = None,
    cards: list[pathlib.Path] | None = None,
    lessons: list[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    progress: Callable[[str], None] = _say,
) -> list[Lesson]:
    """Execute (or reuse) and render every lesson, then the index and the report cards. Returns the lessons with
    their status. Everything given is checked, and ``out`` locked, before anything runs (:class:`SiteError`,
    one line); a stop signal stops the kernel and the build (KeyboardInterrupt or :class:`processes.Stopped`
    propagates) after the index is rewritten to match the pages there."""
    course = curriculum(root)
    if lessons:
        unknown = sorted(set(lessons) - {lesson.id for lesson in course})
        if unknown:
            raise SiteError(
                f"unknown lesson(s) {' '.join(unknown)}: the curriculum has {' '.join(lesson.id for lesson in course)}"
            )
    if not math.isfinite(timeout) or timeout <= 0:
        raise SiteError(f"--timeout must be a positive, finite number of seconds, got {timeout:g}")
    card_paths = default_cards(root) if cards is None else [pathlib.Path(c) for c in cards]
    loaded = [
        (str(path.relative_to(root) if path.is_absolute() and root in path.parents else path), load_card(path))
        for path in card_paths
    ]
    try:
        cards_page = cards_html(loaded, course)  # rendered now: a card that cannot be shown stops nothing midway
    except Exception as err:  # noqa: BLE001 - load_card's checks should leave nothing here; one line if not
        raise SiteError(f"--cards: the cards cannot be shown ({type(err).__name__}: {err})") from None
    problem = fileguard.folder_problem(out)
    if problem:
        raise SiteError(f"cannot write to --out {str(out)!r}: {problem}")
    out = pathlib.Path(out).expanduser()
    try:
        with fileguard.folder_lock(out, what="site build"):
            return _build(
                out,
                root=root,
                course=course,
                mode=mode,
                data=data,
                loaded=loaded,
                cards_page=cards_page,
                lessons=lessons,
                timeout=timeout,
                progress=progress,
            )
    except (fileguard.FolderBusy, fileguard.UnsafePath) as err:
        raise SiteError(str(err)) from None
    except OSError as err:  # a full disk, a folder made read-only meanwhile: one line
        where = f" ({err.filename})" if getattr(err, "filename", None) else ""
        raise SiteError(f"cannot write the site to {out}: {err.strerror or err}{where}") from None


def _build(
    out: pathlib.Path,
    *,
    root: pathlib.Path,
    course: list[Lesson],
    mode: str,
    data: str | None,
    loaded: list[tuple[str, dict]],
    cards_page: str,
    lessons: list[str] | None,
    timeout: float,
    progress: Callable[[str], None],
) -> list[Lesson]:
    """The build, once its input is checked and ``out`` locked."""
    import shutil

    def write(path: pathlib.Path, text: str) -> None:
        try:
            fileguard.write_text(path, text, inside=out)
        except fileguard.UnsafePath:
            raise
        except OSError as err:
            raise SiteError(f"cannot write {path}: {err.strerror or err}") from None

    fileguard.make_folder(out / LESSON_DIR, inside=out)
    cache = fileguard.make_folder(out / EXECUTED_DIR / mode, inside=out)
    work = fileguard.make_folder(out / WORK_DIR, inside=out)
    template_dir = write_template(out / EXECUTED_DIR / "templates", inside=out)
    env = dict(os.environ, COURSE_SMOKE="1" if mode == "smoke" else "0")
    if data:
        env["COURSE_DATA"] = data
    if env.get("COURSE_DATA", "").strip().startswith("npz:"):
        env["COURSE_DATA"] = _absolute_data(env["COURSE_DATA"].strip())
    if env.get("TFDS_DATA_DIR") and not os.path.isabs(env["TFDS_DATA_DIR"]):
        env["TFDS_DATA_DIR"] = os.path.abspath(env["TFDS_DATA_DIR"])
    env.pop("COURSE_CLAIMS_DIR", None)  # nbval's: the site keeps no claims files
    repo, ref = _repo.REPO, _repo.REF
    wanted = [lesson for lesson in course if not lessons or lesson.id in lessons]
    for path in [
        out / "index.html",
        out / CARDS_PAGE,
        *(out / lesson.page for lesson in wanted),
        *(cache / f"{pathlib.PurePath(lesson.notebook).stem}.ipynb" for lesson in wanted),
    ]:
        _replaceable(path)  # checked before a notebook runs for minutes, not after
    available = {lesson.page for lesson in wanted} | {lesson.page for lesson in course if (out / lesson.page).is_file()}
    rendered: dict[int, Any] = {}  # the pages made by this build: their executed notebooks
    shown_for = {
        lesson.id: shown_paths((work / pathlib.PurePath(lesson.notebook).stem, ""), (out, ""), (root, ""))
        for lesson in wanted
    }
    try:
        for n, lesson in enumerate(wanted, 1):
            notebook = root / lesson.notebook
            progress(f"[site] {n}/{len(wanted)} {notebook.stem} ({mode} mode) …")
            scratch = fileguard.make_folder(work / notebook.stem, inside=out, fresh=True)
            try:
                nb, info = execute(
                    notebook,
                    env,
                    cache,
                    timeout,
                    workdir=scratch,
                    inside=out,
                    progress=progress,
                    label=lesson.id,
                    shown=shown_for[lesson.id],
                )
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            lesson.status, lesson.seconds = info["status"], info.get("seconds")
            lesson.failure, lesson.executed_at = info.get("failure", ""), info.get("executed_at", "")
            index = course.index(lesson)
            write(out / lesson.page, render_lesson(nb, course, index, template_dir, available, shown_for[lesson.id]))
            rendered[index] = nb
            if lesson.status == "failed":
                progress(
                    f"[site] {notebook.stem}: FAILED at {lesson.failure} — rendered up to that cell, marked failed"
                )
            elif lesson.status == "reused":
                progress(
                    f"[site] {notebook.stem}: reused the copy executed {lesson.executed_at} (notebook, code and "
                    "settings unchanged)"
                )
            else:
                progress(f"[site] {notebook.stem}: executed in {lesson.seconds:.0f} s → {lesson.page}")
    except (KeyboardInterrupt, processes.Stopped):
        with _signals_ignored():  # a second Ctrl-C must not leave the index half done
            try:
                _after_a_stop(
                    out, course, rendered, template_dir, mode, repo, ref, loaded, cards_page, write, shown_for
                )
            except Exception as err:  # noqa: BLE001 - the stop is what is reported; this is said on the way
                progress(f"[site] stopped; the index could not be rewritten ({type(err).__name__}: {err})")
        raise
    with contextlib.suppress(OSError):
        os.rmdir(work)  # empty once every notebook ran
    built = {lesson.page for lesson in course if (out / lesson.page).is_file()}
    write(out / "index.html", index_html(course, mode, repo, ref, len(loaded), built))
    write(out / CARDS_PAGE, cards_page)
    progress(f"[site] index.html and {CARDS_PAGE} ({len(loaded)} card(s)) written to {out}")
    return course


def _replaceable(path: pathlib.Path) -> None:
    """:class:`fileguard.UnsafePath` unless ``path`` is missing or a regular file (not a link, a folder, a pipe)."""
    import stat

    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise fileguard.UnsafePath(f"{path} is a symbolic link; refusing to write through it (remove the link first)")
    if not stat.S_ISREG(mode):
        raise fileguard.UnsafePath(f"{path} exists and is not a regular file; refusing to replace it")


def _after_a_stop(out, course, rendered, template_dir, mode, repo, ref, loaded, cards_page, write, shown_for) -> None:
    """A stopped build leaves a consistent site: the pages it made link only to pages that exist (the lesson it
    was running has none unless an earlier build made one), and the index and the cards page match them."""
    built = {lesson.page for lesson in course if (out / lesson.page).is_file()}
    for index, nb in rendered.items():
        neighbours = [course[i].page for i in (index - 1, index + 1) if 0 <= i < len(course)]
        if any(page not in built for page in neighbours):
            write(
                out / course[index].page,
                render_lesson(nb, course, index, template_dir, built, shown_for.get(course[index].id)),
            )
    write(out / "index.html", index_html(course, mode, repo, ref, len(loaded), built))
    write(out / CARDS_PAGE, cards_page)
    with contextlib.suppress(OSError):
        os.rmdir(out / WORK_DIR)


class _Parser(commandline.ArgumentParser):
    error_class = SiteError


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = _Parser(prog="python -m course_utils site", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the site (index.html at its top)")
    parser.add_argument(
        "--mode",
        choices=("smoke", "full"),
        default="smoke",
        help="execute the notebooks with tiny sizes (smoke, default) or the lessons' real ones (full)",
    )
    parser.add_argument("--data", default=None, help="tfds | synthetic | npz:PATH (default: the mode's)")
    parser.add_argument(
        "--cards",
        nargs="+",
        metavar="PATH",
        help=f"claims.json files to set side by side (default: {CARDS_DIR}/*/claims.json)",
    )
    parser.add_argument("--lessons", nargs="+", metavar="NN", help="build only these lessons' pages (default: all)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help="seconds one cell may run (default: %(default)s)",
    )
    parser.add_argument("--root", default=None, help="the course's repository root (default: this checkout)")
    args = parser.parse_args(argv)
    if not math.isfinite(args.timeout) or args.timeout <= 0:  # nan, inf: no limit at all
        raise SiteError(f"--timeout must be a positive, finite number of seconds, got {args.timeout:g}")
    if args.data is not None:
        try:
            args.data = _absolute_data(_config.parse_data(args.data))
        except _config.ConfigError as err:
            raise SiteError(str(err).replace("COURSE_DATA=", "--data ")) from None
    args.lessons = [raw.strip().zfill(2) for raw in args.lessons] if args.lessons else None
    return args


def main(argv: list[str] | None = None) -> int:
    from course_utils._repo import __file__ as repo_file

    argv = list(sys.argv[1:] if argv is None else argv)

    def body() -> int:
        args = _parse(argv)
        root = pathlib.Path(args.root) if args.root else pathlib.Path(repo_file).resolve().parent.parent
        start = time.perf_counter()
        course = build(
            args.out,
            root=root,
            mode=args.mode,
            data=args.data,
            cards=args.cards,
            lessons=args.lessons,
            timeout=args.timeout,
            progress=_say,
        )
        failed = [lesson for lesson in course if lesson.status == "failed"]
        index = pathlib.Path(args.out).expanduser() / "index.html"
        print(f"[site] done in {time.perf_counter() - start:.0f} s: open {index}", flush=True)
        for lesson in failed:
            print(
                f"site: lesson {lesson.id} ({lesson.notebook}) failed at {lesson.failure}; the rest of the site is "
                "built",
                file=sys.stderr,
            )
        return 1 if failed else 0

    kept = (
        "the kernel is stopped; the pages built so far are kept, the index matches them, and the next build "
        "reuses the notebooks already executed"
    )
    return commandline.run("site", body, usage=(SiteError,), stopped=lambda what: f"{what}: {kept}")


if __name__ == "__main__":
    sys.exit(main())
