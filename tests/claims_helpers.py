"""Helpers for the tests of lessons' claims functions (tests/test_lesson_claims*.py)."""

from __future__ import annotations

import ast
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def notebook_dict_keys(notebook: str, name: str) -> set[str]:
    """The keywords of ``name = dict(...)`` in the notebook (its claims cell)."""
    nb = json.loads((ROOT / "notebooks" / notebook).read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        for node in ast.walk(ast.parse("".join(cell["source"]))):
            if (
                isinstance(node, ast.Assign)
                and [getattr(t, "id", None) for t in node.targets] == [name]
                and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", None) == "dict"
            ):
                return {kw.arg for kw in node.value.keywords}
    raise AssertionError(f"{notebook} has no `{name} = dict(...)` cell")


def notebook_prose(notebook: str) -> str:
    """The notebook's markdown cells, joined (what a learner reads)."""
    nb = json.loads((ROOT / "notebooks" / notebook).read_text(encoding="utf-8"))
    return "\n".join("".join(cell["source"]) for cell in nb["cells"] if cell["cell_type"] == "markdown")


class Recording(dict):
    """A results dict that records which keys ``claims`` reads."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def claim_by_id(claims, claim_id: str):
    """The one claim with id ``claim_id`` ("05.accumulated_peak"), after checking every id of the lesson."""
    from course_utils import report

    claims = list(claims)
    lesson = claim_id.split(".")[0]
    assert report.id_problems(claims, lesson) == [], report.id_problems(claims, lesson)
    found = [c for c in claims if c.id == claim_id]
    assert len(found) == 1, (claim_id, [c.id for c in claims])
    return found[0]
