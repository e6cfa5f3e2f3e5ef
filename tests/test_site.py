"""`python -m course_utils site`: a course root's notebooks executed and rendered offline, a failing notebook marked
with its cell while the rest is built, executed copies reused only while nothing changed, the report cards side by
side with "not measured yet" columns, and bad input as one line. The tests that start Jupyter kernels are marked
extended (.ci/run runs them after the README's pytest); the headless-browser check is in test_site_browser.py."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import nbformat
import pytest

from course_utils import report, site
from course_utils.notebooks import pages_url

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
    figure = ("import base64, IPython.display as d\n"
              "png = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAYAAABytg0kAAAAEklEQVR4nGP4z8DwHwQZYAwAkNwL9TpM"
              "oEcAAAAASUVORK5CYII=')\n"
              "d.display(d.Image(png))\n")
    _notebook(root / "notebooks" / "01_first.ipynb", [
        nbformat.v4.new_markdown_cell("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
                                      "(https://colab.research.google.com/github/o/n/blob/main/notebooks/01_first.ipynb)"
                                      "\n# 01 · First"),
        nbformat.v4.new_code_cell("import os\nprint('smoke' if os.environ.get('COURSE_SMOKE') == '1' else 'full')"),
        nbformat.v4.new_code_cell(figure),
    ])
    broken = nbformat.v4.new_code_cell("1 / 0  # fails on purpose")
    broken.metadata["tags"] = ["raises-exception"]
    _notebook(root / "notebooks" / "02_second.ipynb", [
        nbformat.v4.new_markdown_cell("# 02 · Second"),
        broken,
        nbformat.v4.new_code_cell("raise ValueError('the lesson is broken here')"),
        nbformat.v4.new_code_cell("print('never runs')"),
    ])
    return root


def _card(kind="CPU", xla=False, verdict="holds", holds=True, measured="1.5×", lesson="04") -> dict:
    claim = report.Claim("prefetch overlaps input", "guide", "> 1×", measured, holds if verdict != "inconclusive"
                         else "noise")
    claim.lesson = lesson
    machine = {"accelerator": {"kind": kind, "name": "none" if kind == "CPU" else f"{kind} 1", "replicas": 1},
               "cpu": {"model": "AMD EPYC", "cores": 2, "usable_cores": 2, "max_isa": "", "onednn": "default"},
               "memory_gib": 23.5, "os": "Linux", "python": "3.11.7", "tensorflow": "2.20.0", "keras": "3.15.1",
               "course_utils": "abc", "xla": xla, "mode": "full", "data": "synthetic"}
    return {"format": 1, "machine": machine, "lessons": {lesson: {"title": "Pipelines", "claims": [claim.to_dict()],
                                                                  "seconds": 9.0}}}


PNG = "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAYAAABytg0kAAAAEklEQVR4nGP4z8DwHwQZYAwAkNwL9TpMoEcAAAAASUVORK5CYII="


def test_each_figure_gets_alt_text_from_its_titles_and_section(tmp_path):
    figure = nbformat.v4.new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure size 640x480>"})
    plot = nbformat.v4.new_code_cell('fig, ax = plt.subplots()\nax.set(ylabel="MiB", title=f"Peak, batch {n}")\n'
                                     'fig.suptitle("Memory of steps_per_execution")\nplt.show()', outputs=[figure])
    unnamed = nbformat.v4.new_code_cell("plt.imshow(x)", outputs=[figure, figure])
    fields = nbformat.v4.new_code_cell('ax.set_title(f"{a} → {b}")', outputs=[figure])
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 01 · First\n## 2. Memory: `steps_per_execution` and **prefetch**"), plot,
        nbformat.v4.new_markdown_cell("Some text, no heading"), unnamed, fields])
    where = " (section “2. Memory: steps_per_execution and prefetch”)"
    assert site.figure_alts(nb) == ["Figure: Peak, batch …; Memory of steps_per_execution" + where,
                                    "A figure" + where, "A figure" + where, "A figure" + where]
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
    assert any("FAILED at cell 3 of 4" in line for line in lines) and len(lines) == 2 * 2 + 1

    page = (out / "lessons" / "01_first.html").read_text()
    assert "smoke" in page and re.search(r'<img[^>]+src="data:image/png;base64,', page)  # outputs and figure inline
    assert not re.search(r'<(script|link|img)[^>]+(src|href)="https?://', page)  # offline: nothing from a CDN
    assert re.search(r'<a href="https://colab\.research\.google\.com/github/o/n/blob/main/notebooks/01_first\.ipynb">'
                     r'Open In Colab</a>', page)  # the badge image became its text, still a link
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
    assert err == ("site: lesson 02 (notebooks/02_second.ipynb) failed at cell 3 of 4: ValueError: the lesson is broken "
                   "here; the rest of the site is built\n"), err
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
    cards = [("cpu", _card()), ("cpu-xla", _card(xla=True, verdict="inconclusive", measured="1.0×")),
             ("gpu", _card(kind="GPU", measured="1.9×"))]
    page = site.cards_html(cards, site.curriculum(pathlib.Path(__file__).resolve().parent.parent))
    heads = re.findall(r'<th scope="col">([^<]*)', page)
    assert heads == ["Claim", "CPU · 2 cores · full mode · without XLA", "CPU · 2 cores · full mode · with XLA",
                     "GPU (GPU 1) · full mode · without XLA", "TPU"]
    assert "not measured yet" in page and "prove --mode full" in page
    assert page.count("· course_utils abc</span>") == 3  # which course code measured each card
    row = re.search(r'<tr class="differs"><td>prefetch overlaps input</td>(.*?)</tr>', page).group(1)
    assert row.count('<td class="measured">') == 4 and "1.9×" in row and "inconclusive" in row
    assert '04 · Data pipelines and sharding' in page
    one = site.cards_html([("gpu", _card(kind="GPU")), ("tpu", _card(kind="TPU"))], [])
    assert "not measured yet" not in one


@pytest.mark.parametrize("content, words", [
    ("{not json", "not JSON"),
    (json.dumps({"lessons": {}}), "needs the 'machine' and 'lessons'"),
    (json.dumps([1, 2]), "needs the 'machine' and 'lessons'"),
    (json.dumps({"machine": {"accelerator": {}}, "lessons": {"04": {"claims": "x"}}}), "no list of claims"),
    (json.dumps({"machine": {"accelerator": {}}, "lessons": {"04": {"claims": [{"claim": "c"}]}}}),
     "not a claim"),
])
def test_a_cards_file_that_is_not_a_claims_file_is_one_line(tmp_path, content, words):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(site.SiteError, match=re.escape(words)) as err:
        site.load_card(bad)
    assert "\n" not in str(err.value) and "not a claims file" in str(err.value)


def test_bad_cards_and_a_missing_file_in_a_fresh_process_are_one_line_exit_2(tmp_path):
    (tmp_path / "notes.json").write_text('{"hello": 1}')
    for cards, words in (("notes.json", "not a claims file"), ("missing.json", "cannot read it")):
        done = subprocess.run([sys.executable, "-m", "course_utils", "site", "--out", str(tmp_path / "s"), "--cards",
                               str(tmp_path / cards)], capture_output=True, text=True, timeout=120)
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
    assert code == 2 and err == f"site: cannot write to --out {str(tmp_path / 'locked' / 'site')!r}: Permission denied\n"


def test_bad_settings_are_one_line(tmp_path, capsys):
    root = _course(tmp_path)
    for argv, words in ((["--mode", "fast"], "invalid choice: 'fast'"), (["--timeout", "0"], "positive number"),
                        (["--lessons", "09"], "unknown lesson(s) 09"), (["--data", "ftp:x"], "--data ")):
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
