"""`python -m course_utils site`: a course root's notebooks executed and rendered offline, a failing notebook marked
with its cell while the rest is built, executed copies reused only while nothing changed, the report cards side by
side with "not measured yet" columns, and bad input as one line. The tests that start Jupyter kernels are marked
extended (.ci/run runs them after the README's pytest); the headless-browser check is in test_site_browser.py."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import nbformat
import pytest

from course_utils import fileguard, report
from devtools import site
from devtools.notebooks import pages_url

README = """# A course

## Curriculum

| # | Lesson | Time | What you will measure | Open |
|---|---|---|---|---|
| 01 | [First](notebooks/01_first.ipynb) | 5 min | a figure and a `table` | colab |
| 02 | [*Advanced:* second](notebooks/02_second.ipynb) | 5 min | an error | colab |
"""


def _notebook(path: pathlib.Path, cells: list) -> None:
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def _course(tmp_path: pathlib.Path) -> pathlib.Path:
    root = tmp_path / "course"
    (root / "notebooks").mkdir(parents=True)
    (root / "README.md").write_text(README)
    figure = (
        "import base64, IPython.display as d\n"
        "png = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAYAAABytg0kAAAAEklEQVR4nGP4z8DwHwQZYAwAkNwL9TpM"
        "oEcAAAAASUVORK5CYII=')\n"
        "d.display(d.Image(png))\n"
    )
    _notebook(
        root / "notebooks" / "01_first.ipynb",
        [
            nbformat.v4.new_markdown_cell(
                "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
                "(https://colab.research.google.com/github/o/n/blob/main/notebooks/01_first.ipynb)"
                "\n# 01 · First"
            ),
            nbformat.v4.new_code_cell("import os\nprint('smoke' if os.environ.get('COURSE_SMOKE') == '1' else 'full')"),
            nbformat.v4.new_code_cell(figure),
        ],
    )
    broken = nbformat.v4.new_code_cell("1 / 0  # fails on purpose")
    broken.metadata["tags"] = ["raises-exception"]
    _notebook(
        root / "notebooks" / "02_second.ipynb",
        [
            nbformat.v4.new_markdown_cell("# 02 · Second"),
            broken,
            nbformat.v4.new_code_cell("raise ValueError('the lesson is broken here')"),
            nbformat.v4.new_code_cell("print('never runs')"),
        ],
    )
    return root


def _card(kind="CPU", xla=False, verdict="holds", holds=True, measured="1.5×", lesson="04") -> dict:
    claim = report.Claim(
        "prefetch overlaps input", "guide", "> 1×", measured, holds if verdict != "inconclusive" else "noise"
    )
    claim.lesson = lesson
    machine = {
        "accelerator": {"kind": kind, "name": "none" if kind == "CPU" else f"{kind} 1", "replicas": 1},
        "cpu": {"model": "AMD EPYC", "cores": 2, "usable_cores": 2, "max_isa": "", "onednn": "default"},
        "memory_gib": 23.5,
        "os": "Linux",
        "python": "3.11.7",
        "tensorflow": "2.20.0",
        "keras": "3.15.1",
        "course_utils": "abc",
        "xla": xla,
        "mode": "full",
        "data": "synthetic",
    }
    return {
        "format": 1,
        "machine": machine,
        "lessons": {lesson: {"title": "Pipelines", "claims": [claim.to_dict()], "seconds": 9.0}},
    }


PNG = "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAYAAABytg0kAAAAEklEQVR4nGP4z8DwHwQZYAwAkNwL9TpMoEcAAAAASUVORK5CYII="


def test_each_figure_gets_alt_text_from_its_titles_and_section(tmp_path):
    figure = nbformat.v4.new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure size 640x480>"})
    plot = nbformat.v4.new_code_cell(
        'fig, ax = plt.subplots()\nax.set(ylabel="MiB", title=f"Peak, batch {n}")\n'
        'fig.suptitle("Memory of steps_per_execution")\nplt.show()',
        outputs=[figure],
    )
    unnamed = nbformat.v4.new_code_cell("plt.imshow(x)", outputs=[figure, figure])
    fields = nbformat.v4.new_code_cell('ax.set_title(f"{a} → {b}")', outputs=[figure])
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("# 01 · First\n## 2. Memory: `steps_per_execution` and **prefetch**"),
            plot,
            nbformat.v4.new_markdown_cell("Some text, no heading"),
            unnamed,
            fields,
        ]
    )
    where = " (section “2. Memory: steps_per_execution and prefetch”)"
    assert site.figure_alts(nb) == [
        "Figure: Peak, batch …; Memory of steps_per_execution" + where,
        "A figure" + where,
        "A figure" + where,
        "A figure" + where,
    ]
    lessons = [site.Lesson("01", "First", "notebooks/01_first.ipynb", "5 min", "a figure")]
    page = site.render_lesson(nb, lessons, 0, site.write_template(tmp_path / "templates"))
    assert re.findall(r'<img[^>]*alt="([^"]*)"', page) == site.figure_alts(nb)
    # only nbconvert's placeholders are replaced, and only where the figures and the outputs match one to one
    assert site._with_alts(page, ["a"] * 4) == page and site._with_alts(page, ["a"]) == page


@pytest.mark.extended  # starts Jupyter kernels: .ci/run's extended step
def test_builds_the_lessons_marks_a_failed_one_with_its_cell_and_reuses_unchanged_copies(tmp_path, capsys):
    root, out = _course(tmp_path), tmp_path / "site"
    lines: list[str] = []
    course = site.build(out, root=root, mode="smoke", cards=[], progress=lines.append)
    first, second = course
    assert first.status == "executed" and second.status == "failed", (first, second)
    assert second.failure == "cell 3 of 4: ValueError: the lesson is broken here"  # not the raises-exception one
    assert any("FAILED at cell 3 of 4" in line for line in lines)
    assert len([line for line in lines if line.startswith("[site]")]) == 2 * 2 + 1
    cells = [line for line in lines if not line.startswith("[site]")]  # one progress line per code cell run
    assert all(re.fullmatch(r"\[0[12]\] cell \d/\d \(start\) \d+\.\d s( — error)?", line) for line in cells), cells
    assert [line.split(" (")[0] for line in cells] == [
        "[01] cell 2/3",
        "[01] cell 3/3",
        "[02] cell 2/4",
        "[02] cell 3/4",
    ]
    assert cells[2].endswith("— error") and cells[3].endswith("— error") and not cells[0].endswith("error")

    page = (out / "lessons" / "01_first.html").read_text()
    assert "smoke" in page and re.search(r'<img[^>]+src="data:image/png;base64,', page)  # outputs and figure inline
    assert not re.search(r'<(script|link|img)[^>]+(src|href)="https?://', page)  # offline: nothing from a CDN
    assert re.search(
        r'<a href="https://colab\.research\.google\.com/github/o/n/blob/main/notebooks/01_first\.ipynb">'
        r"Open In Colab</a>",
        page,
    )  # the badge image became its text, still a link
    assert 'href="../lessons/02_second.html" rel="next"' in page and 'href="../index.html"' in page
    broken = (out / "lessons" / "02_second.html").read_text()
    assert "This lesson failed to execute" in broken and "cell 3 of 4: ValueError" in broken
    assert "never runs" in broken and "the lesson is broken here" in broken  # shown up to the failure
    index = (out / "index.html").read_text()
    assert 'href="lessons/01_first.html"' in index and 'href="lessons/02_second.html"' in index
    assert "failed</span> — cell 3 of 4: ValueError" in index and "<em>Advanced:</em> second" in index
    assert (out / site.CARDS_PAGE).is_file()

    again = site.build(out, root=root, mode="smoke", cards=[], progress=lines.append)
    assert [lesson.status for lesson in again] == ["reused", "failed"]  # the good copy reused, the failed one rerun
    capsys.readouterr()
    assert site.main(["--out", str(out), "--root", str(root)]) == 1  # the command: exit 1, one line per failure
    err = capsys.readouterr().err
    assert err == (
        "site: lesson 02 (notebooks/02_second.ipynb) failed at cell 3 of 4: ValueError: the lesson is broken "
        "here; the rest of the site is built\n"
    ), err
    nb = nbformat.read(root / "notebooks" / "01_first.ipynb", as_version=4)
    nb.cells[1].source += "\nprint('changed')"
    nbformat.write(nb, root / "notebooks" / "01_first.ipynb")
    third = site.build(out, root=root, mode="full", cards=[], progress=lines.append)
    assert third[0].status == "executed" and "full" in (out / "lessons" / "01_first.html").read_text()


@pytest.mark.extended  # starts Jupyter kernels: .ci/run's extended step
def test_a_partial_build_links_only_pages_that_exist(tmp_path):
    root, out = _course(tmp_path), tmp_path / "site"
    site.build(out, root=root, lessons=["01"], cards=[], progress=lambda line: None)
    index = (out / "index.html").read_text()
    assert 'href="lessons/01_first.html"' in index and 'href="lessons/02_second.html"' not in index
    assert "not built" in index
    assert 'rel="next"' not in (out / "lessons" / "01_first.html").read_text()


def test_report_cards_side_by_side_with_columns_for_what_is_not_measured(tmp_path):
    cards = [
        ("cpu", _card()),
        ("cpu-xla", _card(xla=True, verdict="inconclusive", measured="1.0×")),
        ("gpu", _card(kind="GPU", measured="1.9×")),
    ]
    page = site.cards_html(cards, site.curriculum(pathlib.Path(__file__).resolve().parent.parent))
    heads = re.findall(r'<th scope="col"[^>]*>([^<]*)', page)
    assert heads == [
        "Claim",
        "CPU · 2 cores · full mode · without XLA",
        "CPU · 2 cores · full mode · with XLA",
        "GPU (GPU 1) · full mode · without XLA",
        "TPU",
    ]
    assert "not measured yet" in page and "prove --mode full" in page
    assert page.count("· course_utils abc</span>") == 3  # which course code measured each card
    row = re.search(r'<tr class="differs"><td>prefetch overlaps input</td>(.*?)</tr>', page).group(1)
    assert row.count('<td class="measured') == 4 and "1.9×" in row and "inconclusive" in row
    assert "04 · Data pipelines and sharding" in page
    one = site.cards_html([("gpu", _card(kind="GPU")), ("tpu", _card(kind="TPU"))], [])
    assert "not measured yet" not in one


def test_cards_line_up_claims_by_id_and_a_card_from_before_ids_by_its_wording(tmp_path):
    """Rewording a claim keeps its row (the id is the same); a format-1 card (no ids) joins the row whose claim reads
    as its own does; each row names its id, the way into the code."""
    new = _card()
    new["lessons"]["04"]["claims"][0].update(id="04.prefetch_overlaps")
    reworded = _card(measured="1.2×")
    reworded["lessons"]["04"]["claims"][0].update(id="04.prefetch_overlaps", claim="prefetch overlaps the input")
    old = _card(measured="1.7×")  # before ids: no "id", the first card's wording
    page = site.cards_html(
        [
            ("new", site.load_card(_write(tmp_path / "a.json", new))),
            ("reworded", site.load_card(_write(tmp_path / "b.json", reworded))),
            ("old", site.load_card(_write(tmp_path / "c.json", old))),
        ],
        [],
    )
    rows = re.findall(r"<tr(?: class=\"differs\")?><td>(.*?)</tr>", page, re.S)
    assert len(rows) == 1, rows
    assert rows[0].startswith('prefetch overlaps input<span class="claim-id">04.prefetch_overlaps</span>')
    assert all(m in rows[0] for m in ("1.5×", "1.2×", "1.7×")) and "not in this card" not in rows[0]


def _write(path: pathlib.Path, card: dict) -> pathlib.Path:
    path.write_text(json.dumps(card))
    return path


@pytest.mark.parametrize(
    "content, words",
    [
        ("{not json", "not JSON"),
        (json.dumps({"lessons": {}}), "needs the 'machine' and 'lessons'"),
        (json.dumps([1, 2]), "needs the 'machine' and 'lessons'"),
        (json.dumps({"machine": {"accelerator": {}}, "lessons": {"04": {"claims": "x"}}}), "no list of claims"),
        (json.dumps({"machine": {"accelerator": {}}, "lessons": {"04": {"claims": [{"claim": "c"}]}}}), "not a claim"),
    ],
)
def test_a_cards_file_that_is_not_a_claims_file_is_one_line(tmp_path, content, words):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(site.SiteError, match=re.escape(words)) as err:
        site.load_card(bad)
    assert "\n" not in str(err.value) and "not a claims file" in str(err.value)


def test_bad_cards_and_a_missing_file_in_a_fresh_process_are_one_line_exit_2(tmp_path):
    (tmp_path / "notes.json").write_text('{"hello": 1}')
    for cards, words in (("notes.json", "not a claims file"), ("missing.json", "cannot read it")):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "course_utils",
                "site",
                "--out",
                str(tmp_path / "s"),
                "--cards",
                str(tmp_path / cards),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and done.stdout == "", done
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("site: --cards ") and words in done.stderr
    assert not (tmp_path / "s").exists()  # nothing written before the input is checked


def test_an_unwritable_out_is_one_line(tmp_path, monkeypatch, capsys):
    root = _course(tmp_path)
    real_mkdir = pathlib.Path.mkdir

    def refuse(self, *args, **kwargs):
        if "locked" in str(self):
            raise PermissionError(13, "Permission denied")
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", refuse)
    code = site.main(["--out", str(tmp_path / "locked" / "site"), "--root", str(root)])
    err = capsys.readouterr().err
    assert (
        code == 2 and err == f"site: cannot write to --out {str(tmp_path / 'locked' / 'site')!r}: Permission denied\n"
    )


def test_bad_settings_are_one_line(tmp_path, capsys):
    root = _course(tmp_path)
    for argv, words in (
        (["--mode", "fast"], "invalid choice: 'fast'"),
        (["--timeout", "0"], "positive, finite number"),
        (["--lessons", "09"], "unknown lesson(s) 09"),
        (["--data", "ftp:x"], "--data "),
    ):
        code = site.main(["--out", str(tmp_path / "s"), "--root", str(root), *argv])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("site: ") and err.count("\n") == 1 and words in err, (argv, err)
    (root / "README.md").write_text("# no table\n")
    assert site.main(["--out", str(tmp_path / "s"), "--root", str(root)]) == 2
    assert "no curriculum table" in capsys.readouterr().err


def test_the_readme_curriculum_is_the_sites_and_links_the_published_pages():
    root = pathlib.Path(__file__).resolve().parent.parent
    course = site.curriculum(root)
    assert [lesson.id for lesson in course] == [f"{n:02d}" for n in range(1, 9)]
    readme = (root / "README.md").read_text()
    base = pages_url()
    for lesson in course:
        assert f"]({base}{lesson.page})" in readme, lesson.page
    assert f"]({base}{site.CARDS_PAGE})" in readme


def test_the_pages_workflow_is_valid_yaml_with_pinned_actions_and_the_readmes_command():
    import yaml

    root = pathlib.Path(__file__).resolve().parent.parent
    workflow = yaml.safe_load((root / ".github" / "workflows" / "pages.yml").read_text())
    triggers = workflow.get(True, workflow.get("on"))  # YAML 1.1 reads the key `on` as True
    assert "push" in triggers and "workflow_dispatch" in triggers
    steps = [step for job in workflow["jobs"].values() for step in job["steps"]]
    uses = [step["uses"] for step in steps if "uses" in step]
    assert len(uses) == 4 and all(re.fullmatch(r"actions/[a-z-]+@[0-9a-f]{40}", u) for u in uses), uses
    build = next(step["run"] for step in steps if "course_utils site" in step.get("run", ""))
    assert build in (root / "README.md").read_text()  # the README gives the command the workflow runs
    out = build.split("--out ")[1].split()[0]
    upload = next(step for step in steps if step.get("uses", "").startswith("actions/upload-pages-artifact"))
    assert upload["with"]["path"] == out and site.EXECUTED_DIR.startswith(".")  # the cache stays out of the upload
    assert workflow["jobs"]["deploy"]["permissions"] == {"pages": "write", "id-token": "write"}
    assert workflow["jobs"]["deploy"]["needs"] == "build"


# ----------------------------------------------------------------------------------------------
# Reliability: what a card brings is text, the build writes only inside --out, stops on a signal, checks its input
# before it runs anything, and says what is wrong in one line
# ----------------------------------------------------------------------------------------------

EVIL = '"><script>alert(1)</script><img src=x onerror=alert(2)>'


def _never_execute(monkeypatch) -> list:
    """site.execute replaced by one that fails the test: for checks that must stop before any notebook runs."""
    calls: list = []

    def never(*args, **kwargs):
        calls.append(args)
        raise AssertionError(f"a notebook was executed before the input was checked: {args[:1]}")

    monkeypatch.setattr(site, "execute", never)
    return calls


def _fake_execute(monkeypatch) -> list:
    """site.execute replaced by one that returns the notebook as it is, as if executed: the build goes on without
    starting a kernel."""
    calls: list = []

    def fake(notebook, *args, **kwargs):
        calls.append(notebook)
        nb = nbformat.read(notebook, as_version=4)
        return nb, {"status": "executed", "seconds": 1.0, "failure": "", "executed_at": "2026-01-01T00:00:00+00:00"}

    monkeypatch.setattr(site, "execute", fake)
    return calls


def _one_line_exit_2(code: int, err: str, words: str) -> None:
    assert code == 2 and err.startswith("site: ") and err.count("\n") == 1 and words in err, (code, err)
    assert "Traceback" not in err


def test_the_report_cards_page_escapes_everything_a_card_brings(tmp_path):
    from bs4 import BeautifulSoup

    card = _card(lesson=EVIL)
    claim = card["lessons"][EVIL]["claims"][0]
    claim.update(claim=EVIL, measured=EVIL, source=EVIL, expected=EVIL, note=EVIL, reason=EVIL)
    card["machine"].update(os=EVIL, mode=EVIL, course_utils=EVIL, data=EVIL, python=EVIL)
    card["machine"]["cpu"]["model"] = EVIL
    card["machine"]["accelerator"].update(kind=EVIL, name=EVIL)
    path = tmp_path / "claims.json"
    path.write_text(json.dumps(card))
    page = site.cards_html([(EVIL, site.load_card(path))], [])
    soup = BeautifulSoup(page, "html.parser")
    assert not soup.find_all("script") and not soup.select("[onerror]") and "<script" not in page
    ids = [element["id"] for element in soup.find_all(id=True)]
    assert ids and all(re.fullmatch(r"[A-Za-z0-9_-]+", i) for i in ids), ids
    text = soup.get_text()
    assert text.count(EVIL) >= 5  # shown as text: the lesson, the claim, its value, its reason, the card's name


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda card: card["machine"].update(accelerator="GPU"), "'accelerator'"),
        (lambda card: card["machine"].update(cpu=["AMD"]), "'cpu'"),
        (lambda card: card["lessons"]["04"]["claims"][0].update(claim=["a", "list"]), "claim"),
        (lambda card: card["lessons"]["04"]["claims"][0].update(measured={"a": 1}), "measured"),
        (lambda card: card["lessons"]["04"]["claims"][0].update(holds="maybe"), "holds"),
    ],
)
def test_a_card_that_cannot_be_shown_stops_the_build_before_any_notebook_runs(
    tmp_path, monkeypatch, capsys, mutate, words
):
    root, card = _course(tmp_path), _card()
    mutate(card)
    path = tmp_path / "claims.json"
    path.write_text(json.dumps(card))
    calls = _never_execute(monkeypatch)
    code = site.main(["--out", str(tmp_path / "s"), "--root", str(root), "--cards", str(path)])
    _one_line_exit_2(code, capsys.readouterr().err, words)
    assert not calls and not (tmp_path / "s").exists()


def test_a_card_without_a_verdict_gets_its_verdict_from_holds(tmp_path):
    card = _card()
    del card["lessons"]["04"]["claims"][0]["verdict"]
    path = tmp_path / "claims.json"
    path.write_text(json.dumps(card))
    page = site.cards_html([("cpu", site.load_card(path))], [])
    assert "✅ holds" in page


def _site_process(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """`python -m course_utils site ARGV` with at most 3 GiB of memory (a file read without limit fails, not the
    machine) and a time limit."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    return subprocess.run(
        [sys.executable, "-m", "course_utils", "site", *argv],
        capture_output=True,
        text=True,
        preexec_fn=limit,
        **{"timeout": 60, **kwargs},
    )


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder"])
def test_a_card_that_is_not_a_regular_file_is_one_line_not_a_hang(tmp_path, kind):
    if kind == "fifo":
        card = tmp_path / "claims.json"
        os.mkfifo(card)
    elif kind == "dev-zero":
        card = pathlib.Path("/dev/zero")
    else:
        card = tmp_path
    done = _site_process(["--out", str(tmp_path / "s"), "--cards", str(card)])
    assert done.returncode == 2 and done.stdout == "", done
    assert (
        done.stderr.count("\n") == 1
        and done.stderr.startswith(f"site: --cards {card}: ")
        and "not a regular file" in done.stderr
    ), done.stderr
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "0", "1e999"])
def test_a_timeout_that_is_no_limit_is_refused(tmp_path, monkeypatch, capsys, value):
    root = _course(tmp_path)
    calls = _never_execute(monkeypatch)
    code = site.main(["--out", str(tmp_path / "s"), "--root", str(root), f"--timeout={value}"])
    _one_line_exit_2(code, capsys.readouterr().err, "--timeout must be a positive, finite number of seconds")
    assert not calls


@pytest.mark.parametrize(
    "kind, words",
    [
        ("empty", "the folder name is empty"),
        ("file", "not a folder"),
        ("under-a-file", "Not a directory"),
        ("fifo", "not a folder"),
    ],
)
def test_an_out_that_cannot_be_a_site_folder_is_one_line(tmp_path, monkeypatch, capsys, kind, words):
    root = _course(tmp_path)
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)  # an empty --out must not mean "this folder"
    (tmp_path / "a-file").write_text("keep me")
    if kind == "fifo":
        os.mkfifo(tmp_path / "a-fifo")
    out = {
        "empty": "",
        "file": str(tmp_path / "a-file"),
        "under-a-file": str(tmp_path / "a-file" / "site"),
        "fifo": str(tmp_path / "a-fifo"),
    }[kind]
    calls = _never_execute(monkeypatch)
    code = site.main(["--out", out, "--root", str(root)])
    err = capsys.readouterr().err
    _one_line_exit_2(code, err, words)
    assert "cannot write to --out" in err
    assert not calls and list(here.iterdir()) == [] and (tmp_path / "a-file").read_text() == "keep me"


@pytest.mark.parametrize("link", ["lessons", ".executed", ".work"])
def test_a_link_inside_out_is_never_written_through(tmp_path, monkeypatch, capsys, link):
    root, out, elsewhere = _course(tmp_path), tmp_path / "site", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "01_first").mkdir()  # what rmtree through .work/ would delete
    (out / link).symlink_to(elsewhere, target_is_directory=True)
    calls = _never_execute(monkeypatch)
    code = site.main(["--out", str(out), "--root", str(root)])
    _one_line_exit_2(code, capsys.readouterr().err, "symbolic link")
    assert not calls and [p.name for p in elsewhere.iterdir()] == ["01_first"]


@pytest.mark.parametrize("target", ["index.html", "lessons/01_first.html", ".executed/smoke/01_first.ipynb"])
def test_a_page_that_is_a_link_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys, target):
    root, out, elsewhere = _course(tmp_path), tmp_path / "site", tmp_path / "elsewhere.html"
    elsewhere.write_text("the learner's file")
    (out / target).parent.mkdir(parents=True)
    (out / target).symlink_to(elsewhere)
    calls = _never_execute(monkeypatch)
    code = site.main(["--out", str(out), "--root", str(root), "--lessons", "01"])
    _one_line_exit_2(code, capsys.readouterr().err, "symbolic link")
    assert not calls and elsewhere.read_text() == "the learner's file"


def test_two_builds_cannot_share_one_out(tmp_path, monkeypatch, capsys):
    root, out = _course(tmp_path), tmp_path / "site"
    out.mkdir()
    calls = _never_execute(monkeypatch)
    with fileguard.folder_lock(out, what="site build"):  # another build holds it
        code = site.main(["--out", str(out), "--root", str(root)])
    _one_line_exit_2(code, capsys.readouterr().err, f"another site build is writing to {out} (pid {os.getpid()})")
    assert not calls


def test_a_full_disk_while_writing_the_pages_is_one_line(tmp_path, monkeypatch, capsys):
    root, out = _course(tmp_path), tmp_path / "site"
    calls = _fake_execute(monkeypatch)
    real = fileguard.write_bytes

    def full(path, data, **kwargs):
        if str(path).endswith(".html"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data, **kwargs)

    monkeypatch.setattr(fileguard, "write_bytes", full)
    code = site.main(["--out", str(out), "--root", str(root), "--lessons", "01"])
    err = capsys.readouterr().err
    _one_line_exit_2(code, err, "No space left on device")
    assert len(calls) == 1 and "01_first.html" in err  # the notebook ran; its page could not be written


def test_a_relative_npz_data_path_is_made_absolute_for_the_kernels(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = site._parse(["--out", "s", "--data", "npz:cifar/small.npz"])
    assert args.data == f"npz:{tmp_path / 'cifar' / 'small.npz'}"  # the kernels run in a scratch folder


@pytest.mark.extended  # starts a Jupyter kernel
def test_a_notebook_runs_in_a_scratch_folder_inside_out_and_deletes_nothing_beside_it(tmp_path):
    root, out = _course(tmp_path), tmp_path / "site"
    mine = root / "notebooks" / "runs" / "08"  # a learner's own results, beside the notebooks
    mine.mkdir(parents=True)
    (mine / "results.json").write_text("the learner's")
    _notebook(
        root / "notebooks" / "01_first.ipynb",
        [
            nbformat.v4.new_markdown_cell("# 01 · First"),
            nbformat.v4.new_code_cell(
                "import os, pathlib, shutil\nshutil.rmtree('runs/08', ignore_errors=True)  # as "
                "lesson 08 does\npathlib.Path('runs/08').mkdir(parents=True)\n"
                "pathlib.Path('runs/08/new.txt').write_text('x')\nprint('cwd=' + os.getcwd())"
            ),
        ],
    )
    course = site.build(out, root=root, lessons=["01"], cards=[], progress=lambda line: None)
    assert course[0].status == "executed", course[0].failure
    assert (mine / "results.json").read_text() == "the learner's" and not (mine / "new.txt").exists()
    executed = nbformat.read(out / site.EXECUTED_DIR / "smoke" / "01_first.ipynb", as_version=4)
    cwd = pathlib.Path(re.search(r"cwd=(\S+)", executed.cells[1].outputs[0]["text"]).group(1))
    assert cwd == (out / site.WORK_DIR / "01_first").resolve(), cwd
    assert not cwd.exists()  # the scratch folder goes with the run
    assert str(cwd) not in (out / "lessons" / "01_first.html").read_text()  # the page shows paths relative


@pytest.mark.extended  # starts a Jupyter kernel
def test_a_long_cell_says_it_is_still_running(tmp_path, monkeypatch):
    root, out = _course(tmp_path), tmp_path / "site"
    _notebook(
        root / "notebooks" / "01_first.ipynb",
        [
            nbformat.v4.new_markdown_cell("# 01 · First\n## 3. Waiting"),
            nbformat.v4.new_code_cell("import time\ntime.sleep(3.5)"),
        ],
    )
    monkeypatch.setattr(site, "STILL_RUNNING_EVERY_S", 1.0)
    lines: list[str] = []
    site.build(out, root=root, lessons=["01"], cards=[], progress=lines.append)
    still = [line for line in lines if "still running" in line]
    assert len(still) >= 2 and all(
        re.fullmatch(r"\[01\] cell 2/2 \(§3\) \d\.\d s — still running", line) for line in still
    ), lines
    assert re.fullmatch(r"\[01\] cell 2/2 \(§3\) 3\.\d s", lines[lines.index(still[-1]) + 1]), lines


@pytest.mark.extended  # starts a Jupyter kernel
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_stops_the_kernel_and_the_build_and_leaves_a_consistent_site(tmp_path, sig, code):
    root, out = _course(tmp_path), tmp_path / "site"
    started = tmp_path / "kernel.pid"
    _notebook(
        root / "notebooks" / "01_first.ipynb",
        [
            nbformat.v4.new_markdown_cell("# 01 · First"),
            nbformat.v4.new_code_cell(
                f"import os, pathlib, time\npathlib.Path({str(started)!r}).write_text(str(os.getpid()))"
                "\ntime.sleep(300)"
            ),
        ],
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "course_utils", "site", "--out", str(out), "--root", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert started.exists(), proc.communicate(timeout=30)
        time.sleep(0.5)
        kernel = int(started.read_text())
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, (proc.returncode, stdout, stderr)
    assert "Traceback" not in stderr and stderr.strip().count("\n") == 0 and "site: " in stderr, stderr
    assert "02_second" not in stdout, stdout  # the build stopped: lesson 02 never started

    def alive(pid: int) -> bool:
        try:
            return pathlib.Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] not in "ZX"
        except OSError:
            return False

    deadline = time.monotonic() + 15
    while alive(kernel) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(kernel), "the kernel outlived the build"
    assert (out / "index.html").is_file() and "not built" in (out / "index.html").read_text()
    assert not (out / "lessons" / "01_first.html").exists()  # never half a page, nor one of a half run
    assert not (out / site.WORK_DIR / "01_first").exists()
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    with fileguard.folder_lock(out, what="site build"):  # released
        pass


# ----------------------------------------------------------------------------------------------
# The pages are good to read: progress while building, contents and previous/next on each lesson, claims readable
# on a phone, no paths of the machine that built the site
# ----------------------------------------------------------------------------------------------


def _claims_output() -> dict:
    table = report.ClaimsTable(
        [
            report.Claim("bf16 halves the weights", "guide; §2", "0.5×", "0.50×", True),
            report.Claim("XLA is faster here", "§4", "> 1×", "0.9×", False, differs_here="a CPU gains little from XLA"),
            report.Claim("TPU only", "§5", "yes", "no TPU", None, note="run on a TPU runtime"),
        ],
        save=False,
    )
    return nbformat.v4.new_output(
        "execute_result", data={"text/markdown": table._repr_markdown_(), "text/plain": str(table)}, execution_count=1
    )


def _lesson_nb():
    return nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("# 02 · Second\nIntro."),
            nbformat.v4.new_markdown_cell("## 1. What `bf16` is\ntext\n### A detail"),
            nbformat.v4.new_code_cell("x = 1"),
            nbformat.v4.new_markdown_cell("## 2. Colab's runtimes → today"),
            nbformat.v4.new_markdown_cell("## Claims vs. measured on your hardware"),
            nbformat.v4.new_code_cell("ClaimsTable(...)", outputs=[_claims_output()]),
        ]
    )


def test_sections_name_each_cell_for_the_progress_lines():
    assert site.sections(_lesson_nb()) == [
        "start",
        "§1",
        "§1",
        "§2",
        "Claims vs. measured on …",
        "Claims vs. measured on …",
    ]


def test_a_lesson_page_has_its_contents_and_the_previous_and_next_lessons(tmp_path):
    from bs4 import BeautifulSoup

    lessons = [
        site.Lesson(f"0{n}", title, f"notebooks/0{n}_x{n}.ipynb", "5 min", "")
        for n, title in ((1, "First"), (2, "*Advanced:* second"), (3, "Third"))
    ]
    page = site.render_lesson(_lesson_nb(), lessons, 1, site.write_template(tmp_path / "templates"))
    soup = BeautifulSoup(page, "html.parser")
    toc = soup.select("nav.course-toc a")
    assert [a.get_text() for a in toc] == [
        "1. What bf16 is",
        "2. Colab's runtimes → today",
        "Claims vs. measured on your hardware",
    ]  # the ## headings, no "¶"
    assert all(soup.find(id=a["href"][1:]) is not None for a in toc)  # each leads to its heading
    title_cell = soup.select_one(".jp-MarkdownCell h1").find_parent(class_="jp-Cell")
    assert title_cell.find_next_sibling() is soup.select_one("nav.course-toc")  # right under the title
    pager = soup.select_one("nav.course-pager")
    assert pager.select_one("a.prev")["href"] == "../lessons/01_x1.html" and "01 · First" in pager.get_text()
    assert pager.select_one("a.next")["href"] == "../lessons/03_x3.html" and "03 · Third" in pager.get_text()
    assert pager.select_one('a[href="#course-contents"]') and soup.find(id="course-contents")
    assert pager.find_parent("main") is not None  # at the end of the lesson, inside its main content
    first = site.render_lesson(
        _lesson_nb(), lessons, 0, site.write_template(tmp_path / "templates"), available={lessons[0].page}
    )  # nothing before it, and the next page is not built
    pager = BeautifulSoup(first, "html.parser").select_one("nav.course-pager")
    assert not pager.select("a.prev") and not pager.select("a.next")


def test_a_claims_table_names_each_cell_and_writes_each_verdicts_reason_under_it(tmp_path):
    from bs4 import BeautifulSoup

    lessons = [site.Lesson("02", "Second", "notebooks/02_x.ipynb", "5 min", "")]
    soup = BeautifulSoup(
        site.render_lesson(_lesson_nb(), lessons, 0, site.write_template(tmp_path / "t")), "html.parser"
    )
    table = soup.select_one("table.course-claims")
    rows = table.select("tbody tr")
    assert [td["data-label"] for td in rows[0].find_all("td")] == [
        "Claim",
        "Source",
        "Expected",
        "Measured here",
        "Verdict",
    ]
    verdicts = [
        (
            td.select_one(".verdict").get_text(),
            td.select_one(".reason").get_text() if td.select_one(".reason") else None,
        )
        for td in table.select("td.claim-verdict")
    ]
    assert verdicts == [
        (report.HOLDS, None),
        (report.DIFFERS, "a CPU gains little from XLA"),
        (report.UNMEASURABLE, "run on a TPU runtime"),
    ]
    assert (
        "@media (max-width: 600px)" in site.SITE_CSS and "table.course-claims thead { display: none; }" in site.SITE_CSS
    )
    cards = site.cards_html([("cpu", _card(verdict="inconclusive", holds="noise"))], [])
    cell = BeautifulSoup(cards, "html.parser").select_one("table.cards td.measured")
    assert cell["data-label"] == "CPU · 2 cores · full mode · without XLA"  # named on a phone, where the head hides
    assert not BeautifulSoup(cards, "html.parser").select("[title]")  # nothing only a hover shows


def test_the_paths_of_the_machine_that_built_the_site_are_shown_relative(tmp_path):
    import sysconfig
    import tempfile

    purelib, stdlib = sysconfig.get_paths()["purelib"], sysconfig.get_paths()["stdlib"]
    work = tmp_path / "site" / ".work" / "02_x"
    traceback = [
        f"\x1b[0;31mValueError\x1b[0m  Traceback (most recent call last)",
        f"File \x1b[0;32m{purelib}/keras/src/utils/traceback_utils.py:122\x1b[0m, in \x1b[0;36merror_handler\x1b[0m",
        f"File \x1b[0;32m{stdlib}/json/decoder.py:337\x1b[0m, in \x1b[0;36mdecode\x1b[0m",
        f"File \x1b[0;32m/opt/other/lib/python3.12/site-packages/numpy/core.py:7\x1b[0m",
        f"File \x1b[0;32m{tempfile.gettempdir()}/ipykernel_4242/1234.py:1\x1b[0m",
    ]
    nb = _lesson_nb()
    nb.cells[2].outputs = [
        nbformat.v4.new_output("stream", name="stderr", text=f"{purelib}/keras/src/backend.py:12: UserWarning: x\n"),
        nbformat.v4.new_output("stream", name="stdout", text=f"wrote {work}/runs/06/metrics.json\n"),
        nbformat.v4.new_output(
            "error", ename="ValueError", evalue=f"bad file {purelib}/keras/x.py", traceback=traceback
        ),
    ]
    lessons = [site.Lesson("02", "Second", "notebooks/02_x.ipynb", "5 min", "")]
    shown = site.shown_paths((work, ""), (tmp_path / "site", ""), (tmp_path / "course", ""))
    page = site.render_lesson(nb, lessons, 0, site.write_template(tmp_path / "t"), shown=shown)
    for gone in (purelib, stdlib, "/opt/other", str(work), tempfile.gettempdir() + "/ipykernel"):
        assert gone not in page, gone
    for kept in (
        "site-packages/keras/src/utils/traceback_utils.py",
        f"{os.path.basename(stdlib)}/json/decoder.py",
        "site-packages/numpy/core.py",
        "tmp/ipykernel_4242/1234.py",
        "site-packages/keras/src/backend.py",
        "wrote runs/06/metrics.json",
    ):
        assert kept in page, kept
    site._shown_outputs(nb, shown)  # the error's message too (the index and the banner quote it)
    assert nb.cells[2].outputs[2]["evalue"] == "bad file site-packages/keras/x.py"
    assert shown("see https://example.org/a/b and /usr/bin/env") == "see https://example.org/a/b and /usr/bin/env"


@pytest.mark.parametrize("content", [b"{ not json", b"\xff\xfe not UTF-8", b'{"cells": 3}'])
def test_a_notebook_that_cannot_be_read_is_one_line_naming_it(tmp_path, content):
    """`site --root` whose notebook was not JSON ended in nbformat's NotJSONError traceback (the fifth hostile pass):
    it is a SiteError (one line, exit 2) that names the file and how to get it back."""
    notebook = tmp_path / "01_broken.ipynb"
    notebook.write_bytes(content)
    with pytest.raises(
        site.SiteError,
        match=r"01_broken\.ipynb is not a notebook the site can read \(.+\); restore it "
        r"\(git checkout -- 01_broken\.ipynb\) or fix it",
    ) as raised:
        site.execute(notebook, dict(os.environ), tmp_path / "cache", 60)
    assert "\n" not in str(raised.value)
