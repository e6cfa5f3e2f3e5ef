"""``python -m course_utils site``: the course as a static site that works offline — every lesson rendered with its
outputs and figures, and the report cards of several machines side by side.

::

    python -m course_utils site --out site/ [--mode smoke|full] [--data SOURCE] [--cards PATH …]

* Each notebook is executed top to bottom in a fresh kernel (nbclient, the engine of ``jupyter nbconvert
  --execute`` and nbval) in the mode asked for, one after another (the lessons time things: two at once would
  disturb each other). An executed copy is kept in ``DIR/.executed/`` with what it was run from — the notebook's
  bytes, ``course_utils``' source, the mode and the data — and reused while none of them changed.
* Each executed notebook is rendered with nbconvert's HTML exporter (JupyterLab's look, the figures inline as data
  URIs) through a template that drops the exporter's CDN scripts (require.js, MathJax, Mermaid: no lesson needs
  them) and adds the course's navigation, so ``DIR/index.html`` opens from disk with no network.
* ``DIR/index.html`` is the curriculum, read from the README's table; ``DIR/report-cards.html`` sets the claims of
  every card (a ``claims.json`` from ``python -m course_utils prove``) side by side, one column per machine, with a
  "not measured yet" column for a GPU and a TPU where no card has one.

A notebook that fails is reported with its cell and error, rendered up to the failure, and marked failed on the
index; the rest of the site is still built (exit status 1). Bad usage is one line and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import html
import json
import os
import pathlib
import re
import sys
import time
from typing import Any, Callable

from . import _repo
from . import config as _config
from . import report

LESSON_DIR = "lessons"
CARDS_PAGE = "report-cards.html"
EXECUTED_DIR = ".executed"  # hidden: GitHub Pages' upload leaves it out
CARDS_DIR = "report_cards"  # the committed cards: report_cards/<name>/claims.json
DEFAULT_TIMEOUT_S = 1800  # one cell; the longest full-mode cells (lesson 06's runs) take a few minutes
CURRICULUM_ROW = re.compile(r"^\|\s*(?P<id>\d\d)\s*\|\s*\[(?P<title>.+?)\]\((?P<notebook>notebooks/[^)\s]+\.ipynb)\)"
                            r"\s*\|\s*(?P<time>[^|]*?)\s*\|\s*(?P<measures>[^|]*?)\s*\|")


class SiteError(Exception):
    """Bad usage or input: one line, exit status 2."""


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
    lessons = [Lesson(m["id"], m["title"], m["notebook"], m["time"], m["measures"])
               for m in map(CURRICULUM_ROW.match, text.splitlines()) if m]
    if not lessons:
        raise SiteError(f"{readme} has no curriculum table (rows like '| 01 | [Title](notebooks/01_x.ipynb) | 25 min | "
                        "… | … |')")
    missing = [lesson.notebook for lesson in lessons if not (root / lesson.notebook).is_file()]
    if missing:
        raise SiteError(f"the README's curriculum names notebooks that do not exist: {', '.join(missing)}")
    return lessons


def load_card(path: str | os.PathLike) -> dict:
    """A claims.json written by ``prove``; :class:`SiteError` (one line) for anything else."""
    path = pathlib.Path(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as err:
        raise SiteError(f"--cards {path}: cannot read it ({err.strerror or err})") from None
    except ValueError as err:
        raise SiteError(f"--cards {path}: not a claims file (not JSON: {err}); give a claims.json written by "
                        "`python -m course_utils prove`") from None
    machine = data.get("machine") if isinstance(data, dict) else None
    lessons = data.get("lessons") if isinstance(data, dict) else None
    if not isinstance(machine, dict) or not isinstance(lessons, dict) or "accelerator" not in machine:
        raise SiteError(f"--cards {path}: not a claims file (it needs the 'machine' and 'lessons' that "
                        "`python -m course_utils prove` writes)")
    for lesson_id, entry in lessons.items():
        claims = entry.get("claims") if isinstance(entry, dict) else None
        if not isinstance(claims, list):
            raise SiteError(f"--cards {path}: not a claims file (lesson {lesson_id!r} has no list of claims)")
        for claim in claims:
            try:
                report.Claim.from_dict(claim)
            except (ValueError, TypeError) as err:
                raise SiteError(f"--cards {path}: not a claims file (lesson {lesson_id}: {err})") from None
    return data


def default_cards(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted((root / CARDS_DIR).glob("*/claims.json"))


def card_label(card: dict) -> str:
    """A short column heading: ``CPU · 2 cores · full · XLA``."""
    machine = card["machine"]
    acc, cpu = machine.get("accelerator", {}), machine.get("cpu", {})
    where = acc.get("kind", "?")
    if acc.get("name") and acc.get("name") != "none":
        where += f" ({acc['name']})"
    else:
        where += f" · {cpu.get('usable_cores') or cpu.get('cores') or '?'} cores"
    return f"{where} · {machine.get('mode', '?')} mode · {'with' if machine.get('xla') else 'without'} XLA"


# ----------------------------------------------------------------------------------------------
# Executing a notebook (or reusing its executed copy)
# ----------------------------------------------------------------------------------------------


def _code_fingerprint() -> str:
    from .proof import _code_fingerprint as fingerprint

    return fingerprint()


def execution_key(notebook: pathlib.Path, env: dict) -> str:
    """What an executed copy depends on: the notebook, course_utils' code and the settings it ran with."""
    digest = hashlib.sha256(notebook.read_bytes())
    digest.update(_code_fingerprint().encode())
    digest.update(json.dumps({k: env.get(k, "") for k in ("COURSE_SMOKE", "COURSE_DATA", "COURSE_JIT")},
                             sort_keys=True).encode())
    return digest.hexdigest()[:20]


def _failed_cell(nb) -> tuple[int, str]:
    """(index, "ErrorName: message") of the cell that stopped the run: the first error output in a cell that was not
    tagged raises-exception."""
    for index, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code" or "raises-exception" in cell.get("metadata", {}).get("tags", []):
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                message = str(output.get("evalue", "")).strip().splitlines()
                return index, f"{output.get('ename', 'Error')}: {message[0][:300] if message else ''}".rstrip(": ")
    return -1, ""


def execute(notebook: pathlib.Path, env: dict, cache_dir: pathlib.Path, timeout: float) -> tuple[Any, dict]:
    """Run ``notebook`` top to bottom (or reuse the copy in ``cache_dir`` made from the same notebook, code and
    settings). Returns the executed notebook and ``{"status", "seconds", "failure", "executed_at"}``."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    key = execution_key(notebook, env)
    cached = cache_dir / notebook.name
    if cached.is_file():
        try:
            nb = nbformat.read(cached, as_version=4)
            info = nb.metadata.get("course_site", {})
            if info.get("key") == key and not info.get("failure"):  # a failed run is tried again
                return nb, {**info, "status": "reused"}
        except Exception:  # noqa: BLE001 - a damaged copy is executed again
            pass
    nb = nbformat.read(notebook, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(notebook.parent)}})
    start = time.perf_counter()
    failure = ""
    try:
        client.execute(env=env)
    except CellTimeoutError as err:
        failure = f"a cell ran past the {timeout:g} s limit ({str(err).strip().splitlines()[0][:200]})"
    except DeadKernelError as err:
        failure = f"the kernel died ({str(err).strip()[:200]})"
    except CellExecutionError:
        index, error = _failed_cell(nb)
        failure = f"cell {index + 1} of {len(nb.cells)}: {error}" if index >= 0 else "a cell failed"
    except KeyboardInterrupt:
        raise
    except Exception as err:  # noqa: BLE001 - e.g. no kernel: reported, the site goes on
        failure = f"could not run ({type(err).__name__}: {str(err).strip().splitlines()[0][:200] if str(err).strip() else ''})"
    info = {"key": key, "seconds": round(time.perf_counter() - start, 1), "failure": failure,
            "executed_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "mode": "smoke" if env.get("COURSE_SMOKE") == "1" else "full"}
    nb.metadata["course_site"] = info
    cache_dir.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, cached)
    return nb, {**info, "status": "failed" if failure else "executed"}


# ----------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------

SITE_CSS = """
:root { --ink: #1f2328; --muted: #59636e; --line: #d0d7de; --accent: #0b5cad; --bad: #b42318; --bg-soft: #f6f8fa; }
.course-nav { position: sticky; top: 0; z-index: 10; display: flex; flex-wrap: wrap; gap: .4rem 1.2rem;
  align-items: center; padding: .6rem 1rem; background: #fff; border-bottom: 1px solid var(--line);
  font: 15px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
.course-nav a { color: var(--accent); text-decoration: none; }
.course-nav a:hover { text-decoration: underline; }
.course-nav .here { color: var(--muted); }
.course-banner { margin: 1rem; padding: .8rem 1rem; border-left: 4px solid var(--bad); background: #fef3f2;
  font: 15px/1.5 system-ui, sans-serif; color: var(--ink); overflow-wrap: anywhere; }
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
.verdict { display: block; margin-top: .25rem; font-weight: 600; }
.v-fails { color: var(--bad); }
.v-none { color: var(--muted); font-weight: 400; }
.status-failed { color: var(--bad); font-weight: 600; }
.muted { color: var(--muted); }
.machine { font-size: .8rem; font-weight: 400; color: var(--muted); display: block; margin-top: .3rem; }
@media (max-width: 600px) {
  .course-page { padding: .6rem; font-size: 15px; }
  table.course { font-size: .85rem; }
  table.course td.measured { min-width: 9rem; }
  table.cards td:first-child, table.cards thead th:first-child { min-width: 8rem; max-width: 10rem; }
  .course-nav { font-size: 14px; }
}
"""

LESSON_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{#- The lab template, offline: its CDN scripts (require.js, MathJax, Mermaid) are left out, the course's
    navigation and a failure banner added. -#}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block extra_css -%}<style type="text/css">{{ resources.course_css }}</style>{%- endblock extra_css -%}
{%- block body_header -%}
{{ super() }}
{{ resources.course_header }}
{%- endblock body_header -%}
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


REMOTE_IMAGE = re.compile(r"!\[(?P<alt>[^\]]*)\]\((?P<src>https?://[^)\s]+)\)")


def offline(nb):
    """A copy of ``nb`` whose Markdown loads nothing from the network: a remote image (the Colab badge) becomes its
    alt text, still inside its link."""
    import copy

    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.get("cell_type") == "markdown":
            cell.source = REMOTE_IMAGE.sub(lambda m: m["alt"] or "image", cell.source)
    return nb


TITLE_LITERAL = re.compile(r"""(?:\btitle\s*=\s*|\.set_title\(\s*|\.suptitle\(\s*|plt\.title\(\s*)f?(["'])(?P<text>(?:(?!\1).)+)\1""")
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
        titles = [re.sub(r"\{[^{}]*\}", "…", m["text"]).replace("\\n", " ") for m in TITLE_LITERAL.finditer(cell.source)]
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


def write_template(template_dir: pathlib.Path) -> pathlib.Path:
    """The course's nbconvert template (``course``, extending ``lab``) written under ``template_dir``."""
    (template_dir / "course").mkdir(parents=True, exist_ok=True)
    (template_dir / "course" / "index.html.j2").write_text(LESSON_TEMPLATE, encoding="utf-8")
    (template_dir / "course" / "conf.json").write_text(json.dumps({"base_template": "lab",
                                                                   "mimetypes": {"text/html": True}}), encoding="utf-8")
    return template_dir


def render_lesson(nb, lessons: list[Lesson], index: int, template_dir: pathlib.Path,
                  available: set[str] | None = None) -> str:
    """One lesson as a standalone HTML page (nbconvert's HTML exporter, the course template); the navigation links
    the lesson pages in ``available`` (default: all)."""
    from nbconvert import HTMLExporter

    lesson = lessons[index]
    header = _nav(lessons, index, "../", available)
    if lesson.failure:
        header += (f'<div class="course-banner" role="alert"><strong>This lesson failed to execute</strong> when the '
                   f'site was built ({html.escape(lesson.failure)}): it is shown up to that cell.</div>')
    exporter = HTMLExporter(template_name="course", extra_template_basedirs=[str(template_dir)],
                            exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(offline(nb), resources={
        "metadata": {"name": f"{lesson.id} · {re.sub(r'[*_`]', '', lesson.title)}"},
        "course_css": SITE_CSS, "course_header": header})
    return _with_alts(body, figure_alts(nb))


def _page(title: str, body: str, lessons: list[Lesson]) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1.0">\n<title>{html.escape(title)}</title>\n'
            f'<style>{SITE_CSS}</style>\n</head>\n<body>\n{_nav(lessons, None, "")}\n'
            f'<main class="course-page">\n{body}\n</main>\n</body>\n</html>\n')


def index_html(lessons: list[Lesson], mode: str, repo: str, ref: str, n_cards: int, built: set[str]) -> str:
    """The curriculum; ``built``: the lesson pages that exist in the site (a lesson not built has no link)."""
    from .notebooks import colab_url

    rows = []
    for lesson in lessons:
        if lesson.status == "failed":
            status = f'<span class="status-failed">failed</span> — {html.escape(lesson.failure)}'
        elif lesson.seconds is not None:
            status = f"executed in {lesson.seconds:.0f} s ({lesson.executed_at[:10]})"
        elif lesson.page in built:
            status = '<span class="muted">built earlier</span>'
        else:
            status = '<span class="muted">not built</span>'
        title = _markdown(lesson.title)
        link = f'<a href="{lesson.page}">{title}</a>' if lesson.page in built else title
        rows.append(
            f"<tr><td>{lesson.id}</td><td>{link}</td>"
            f"<td>{html.escape(lesson.time)}</td><td>{_markdown(lesson.measures)}</td><td>{status}</td>"
            f'<td><a href="{html.escape(colab_url(lesson.notebook, repo, ref))}">Open in Colab</a></td></tr>')
    body = f"""
<h1>Memory-efficient, fast TensorFlow on TPUs — and on GPUs and CPUs</h1>
<p>Every lesson below is shown with the outputs and figures of one run, top to bottom, in <strong>{mode} mode</strong>
on the machine that built this site — the <em>Claims vs. measured</em> table at the end of each lesson included. Run
it yourself in Colab (the last column) to get your own hardware's numbers. The
<a href="{CARDS_PAGE}">report cards</a> set the claims of {n_cards} measured machine(s) side by side.</p>
<div class="scroll"><table class="course">
<thead><tr><th>#</th><th>Lesson</th><th>Time</th><th>What you will measure</th><th>This build</th><th>Run it</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table></div>
<p class="muted">Built {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} by
<code>python -m course_utils site</code>. The course's source: <a href="https://github.com/{repo}">github.com/{repo}</a>.</p>
"""
    return _page("Memory-efficient, fast TensorFlow — course", body, lessons)


def _verdict_class(verdict: str) -> str:
    return {"holds": "v-holds", "does not hold": "v-fails", "not measurable here": "v-none"}.get(verdict, "v-other")


def cards_html(cards: list[tuple[str, dict]], lessons: list[Lesson]) -> str:
    """The report cards page: one column per card, one row per claim, grouped by lesson; a "not measured yet"
    column for each accelerator kind no card has."""
    icons = {report.WORDS[k]: k.split(" ", 1)[0] for k in report.WORDS}  # ✅ holds, ❌ does not hold, …
    kinds = {card["machine"]["accelerator"].get("kind") for _, card in cards}
    missing = [kind for kind in ("GPU", "TPU") if kind not in kinds]
    titles = {lesson.id: lesson.title for lesson in lessons}
    order: dict[str, list[str]] = {}
    found: dict[tuple[str, str], list[dict | None]] = {}
    for column, (_, card) in enumerate(cards):
        for lesson_id in sorted(card["lessons"]):
            entry = card["lessons"][lesson_id]
            for claim in entry.get("claims", []):
                key = (lesson_id, claim["claim"])
                if key not in found:
                    found[key] = [None] * len(cards)
                    order.setdefault(lesson_id, []).append(claim["claim"])
                found[key][column] = claim
    head = "".join(f'<th scope="col">{html.escape(card_label(card))}<span class="machine">'
                   f'{html.escape(_machine_line(card))}</span></th>' for _, card in cards)
    head += "".join(f'<th scope="col">{kind}<span class="machine">not measured yet</span></th>' for kind in missing)
    width = 1 + len(cards) + len(missing)
    rows = []
    for lesson_id in sorted(order):
        rows.append(f'<tr class="lesson" id="lesson-{lesson_id}"><th colspan="{width}">{lesson_id} · '
                    f'{_markdown(titles.get(lesson_id, ""))}</th></tr>')
        for text in order[lesson_id]:
            cells = found[(lesson_id, text)]
            verdicts = {c["verdict"] for c in cells if c is not None}
            tds = []
            for claim in cells:
                if claim is None:
                    tds.append('<td class="measured"><span class="muted">not in this card</span></td>')
                    continue
                reason = f' title="{html.escape(claim.get("reason", ""))}"' if claim.get("reason") else ""
                tds.append(f'<td class="measured">{html.escape(str(claim.get("measured", "")))}'
                           f'<span class="verdict {_verdict_class(claim["verdict"])}"{reason}>'
                           f'{icons.get(claim["verdict"], "")} {html.escape(claim["verdict"])}</span></td>')
            tds += ['<td class="measured"><span class="muted">—</span></td>'] * len(missing)
            differs = ' class="differs"' if len(verdicts) > 1 else ""
            rows.append(f"<tr{differs}><td>{html.escape(text)}</td>{''.join(tds)}</tr>")
    if missing:
        todo = (f"<p>No card from a {' or a '.join(missing)} yet: on one, run <code>python -m course_utils prove --mode "
                f"full --out report_cards/NAME</code> (and again with <code>--jit</code>) and commit the folder.</p>")
    else:
        todo = ""
    body = f"""
<h1>Report cards: the course's claims, measured on real hardware</h1>
<p>Every lesson ends with a <em>Claims vs. measured</em> table. Each column here is one machine's
<code>claims.json</code>, written by <code>python -m course_utils prove</code> — nothing on this page is typed by
hand. A row with a yellow edge reads differently on two machines: that is where hardware (or XLA) changes the
answer. Hover a verdict for its reason.</p>
{todo}
<div class="scroll"><table class="course cards">
<thead><tr><th scope="col">Claim</th>{head}</tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table></div>
<p class="muted">Cards: {", ".join(html.escape(name) for name, _ in cards) or "none"}.</p>
"""
    return _page("Report cards — claims vs. measured", body, lessons)


def _machine_line(card: dict) -> str:
    from .proof import machine_line

    try:
        line = machine_line(card["machine"])
    except (KeyError, TypeError):
        return ""
    code = card["machine"].get("course_utils")  # cards measured with other course code are not the same experiment
    return line + (f" · course_utils {code[:12]}" if isinstance(code, str) and code else "")


# ----------------------------------------------------------------------------------------------
# The build
# ----------------------------------------------------------------------------------------------


def _writable(out: pathlib.Path) -> None:
    from .proof import writable_problem

    problem = writable_problem(out)
    if problem:
        raise SiteError(f"cannot write to --out {str(out)!r}: {problem}")


def build(out: pathlib.Path, *, root: pathlib.Path, mode: str = "smoke", data: str | None = None,
          cards: list[pathlib.Path] | None = None, lessons: list[str] | None = None,
          timeout: float = DEFAULT_TIMEOUT_S, progress: Callable[[str], None] = print) -> list[Lesson]:
    """Execute (or reuse) and render every lesson, then the index and the report cards. Returns the lessons with
    their status; raises :class:`SiteError` for bad input before anything runs."""
    out = pathlib.Path(out)
    course = curriculum(root)
    if lessons:
        unknown = sorted(set(lessons) - {lesson.id for lesson in course})
        if unknown:
            raise SiteError(f"unknown lesson(s) {' '.join(unknown)}: the curriculum has "
                            f"{' '.join(lesson.id for lesson in course)}")
    card_paths = default_cards(root) if cards is None else [pathlib.Path(c) for c in cards]
    loaded = [(str(path.relative_to(root) if path.is_absolute() and root in path.parents else path), load_card(path))
              for path in card_paths]
    _writable(out)
    (out / LESSON_DIR).mkdir(exist_ok=True)
    template_dir = write_template(out / EXECUTED_DIR / "templates")
    env = dict(os.environ, COURSE_SMOKE="1" if mode == "smoke" else "0")
    if data:
        env["COURSE_DATA"] = data
    env.pop("COURSE_CLAIMS_DIR", None)  # nbval's: the site keeps no claims files
    repo, ref = _repo.REPO, _repo.REF
    wanted = [lesson for lesson in course if not lessons or lesson.id in lessons]
    available = {lesson.page for lesson in wanted} | {lesson.page for lesson in course if (out / lesson.page).is_file()}
    for n, lesson in enumerate(wanted, 1):
        notebook = root / lesson.notebook
        progress(f"[site] {n}/{len(wanted)} {notebook.stem} ({mode} mode) …")
        nb, info = execute(notebook, env, out / EXECUTED_DIR / mode, timeout)
        lesson.status, lesson.seconds = info["status"], info.get("seconds")
        lesson.failure, lesson.executed_at = info.get("failure", ""), info.get("executed_at", "")
        page = render_lesson(nb, course, course.index(lesson), template_dir, available)
        (out / lesson.page).write_text(page, encoding="utf-8")
        if lesson.status == "failed":
            progress(f"[site] {notebook.stem}: FAILED at {lesson.failure} — rendered up to that cell, marked failed")
        elif lesson.status == "reused":
            progress(f"[site] {notebook.stem}: reused the copy executed {lesson.executed_at} (notebook, code and "
                     "settings unchanged)")
        else:
            progress(f"[site] {notebook.stem}: executed in {lesson.seconds:.0f} s → {lesson.page}")
    built = {lesson.page for lesson in course if (out / lesson.page).is_file()}
    (out / "index.html").write_text(index_html(course, mode, repo, ref, len(loaded), built), encoding="utf-8")
    (out / CARDS_PAGE).write_text(cards_html(loaded, course), encoding="utf-8")
    progress(f"[site] index.html and {CARDS_PAGE} ({len(loaded)} card(s)) written to {out}")
    return course


def _parse(argv: list[str]) -> argparse.Namespace:
    class Parser(argparse.ArgumentParser):
        def error(self, message):  # one line, exit 2
            raise SiteError(message)

    parser = Parser(prog="python -m course_utils site", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the site (index.html at its top)")
    parser.add_argument("--mode", choices=("smoke", "full"), default="smoke",
                        help="execute the notebooks with tiny sizes (smoke, default) or the lessons' real ones (full)")
    parser.add_argument("--data", default=None, help="tfds | synthetic | npz:PATH (default: the mode's)")
    parser.add_argument("--cards", nargs="+", metavar="PATH",
                        help=f"claims.json files to set side by side (default: {CARDS_DIR}/*/claims.json)")
    parser.add_argument("--lessons", nargs="+", metavar="NN", help="build only these lessons' pages (default: all)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help="seconds one cell may run (default: %(default)s)")
    parser.add_argument("--root", default=None, help="the course's repository root (default: this checkout)")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        raise SiteError(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
    if args.data is not None:
        try:
            args.data = _config._parse_data(args.data)
        except _config.ConfigError as err:
            raise SiteError(str(err).replace("COURSE_DATA=", "--data ")) from None
    args.lessons = [raw.strip().zfill(2) for raw in args.lessons] if args.lessons else None
    return args


def main(argv: list[str] | None = None) -> int:
    from ._repo import __file__ as repo_file

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parse(argv)
        root = pathlib.Path(args.root) if args.root else pathlib.Path(repo_file).resolve().parent.parent
        start = time.perf_counter()
        course = build(pathlib.Path(args.out).expanduser(), root=root, mode=args.mode, data=args.data,
                       cards=args.cards, lessons=args.lessons, timeout=args.timeout)
    except SiteError as err:
        print(f"site: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nsite: interrupted; executed notebooks are kept and reused by the next build", file=sys.stderr)
        return 130
    failed = [lesson for lesson in course if lesson.status == "failed"]
    print(f"[site] done in {time.perf_counter() - start:.0f} s: open {pathlib.Path(args.out) / 'index.html'}")
    for lesson in failed:
        print(f"site: lesson {lesson.id} ({lesson.notebook}) failed at {lesson.failure}; the rest of the site is "
              "built", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
