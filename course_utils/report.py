"""The "Claims vs. measured on your hardware" table every lesson ends with.

Each row: the claim as the lesson states it, where it comes from, what to expect, what this
notebook measured here, and a verdict: holds / does not hold here / not measurable here (with why).
"""

from __future__ import annotations

import dataclasses

VERDICTS = {True: "✅ holds", False: "❌ does not hold here", None: "➖ not measurable here"}


@dataclasses.dataclass
class Claim:
    claim: str
    source: str
    expected: str
    measured: str
    holds: bool | None  # None: this hardware cannot test it (say why in `note`)
    note: str = ""

    @property
    def verdict(self) -> str:
        return VERDICTS[self.holds] + (f" — {self.note}" if self.note else "")


class Table:
    """A small table: Markdown in a notebook (last expression of a cell), aligned text in logs."""

    def __init__(self, rows: list[dict] | list[tuple], columns: tuple[str, ...] | None = None):
        rows = list(rows)
        if rows and isinstance(rows[0], dict):
            columns = columns or tuple(rows[0])
            rows = [tuple(r.get(c, "") for c in columns) for r in rows]
        self.columns = tuple(columns or ())
        self._rows = [tuple(str(v) for v in r) for r in rows]

    def rows(self) -> list[tuple[str, ...]]:
        return self._rows

    def _repr_markdown_(self) -> str:
        def esc(s: str) -> str:
            return str(s).replace("|", "\\|").replace("\n", " ")

        lines = ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(esc(v) for v in row) + " |" for row in self.rows()]
        return "\n".join(lines)

    def __str__(self) -> str:
        widths = [max(len(c), *(len(r[i]) for r in self.rows())) if self.rows() else len(c) for i, c in enumerate(self.columns)]
        line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
        return "\n".join([line(self.columns), line(["-" * w for w in widths])] + [line(r) for r in self.rows()])

    __repr__ = __str__


class ClaimsTable(Table):
    """The lesson's claims with what was measured here; Markdown in a notebook, numbered text in logs."""

    columns = ("Claim", "Source", "Expected", "Measured here", "Verdict")

    def __init__(self, claims: list[Claim]):
        self.claims = list(claims)

    def rows(self) -> list[tuple[str, ...]]:
        return [(c.claim, c.source, c.expected, c.measured, c.verdict) for c in self.claims]

    def __str__(self) -> str:
        out = []
        for i, (claim, source, expected, measured, verdict) in enumerate(self.rows(), 1):
            out.append(f"{i}. {claim}\n   source: {source}\n   expected: {expected}\n   measured: {measured}\n   verdict: {verdict}")
        return "\n".join(out)

    __repr__ = __str__

    @property
    def all_hold(self) -> bool:
        """No claim measured false here (rows that cannot be measured do not count against it)."""
        return all(c.holds is not False for c in self.claims)
