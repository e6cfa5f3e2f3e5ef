"""The "Claims vs. measured on your hardware" table every lesson ends with.

Each row: the claim as the lesson states it, where it comes from, what to expect, what this
notebook measured here, and a verdict:

- ✅ holds;
- ❌ does not hold here — a real failure of the claim on this hardware;
- ⚠️ differs on this hardware — it does not hold here, for a stated hardware reason (``differs_here``:
  e.g. mixed precision is slower on a CPU); the lesson says what to expect on a TPU/GPU;
- 〰️ inconclusive here (noise) — repeated measurements straddle the threshold;
- ➖ not measurable here — this hardware cannot test it (say why in ``note``).

Measured ratios (speed-ups, memory ratios) should come from repeats: :meth:`Claim.from_samples`
takes the repeats, prints median and spread, and decides from the spread, never from one run.

Each claim has a stable ``id`` ("05.accumulated_peak": the lesson's number, a dot, a name) that tests, ``prove``
and the site key on, so rewording a claim changes nothing else; compare verdicts as :class:`Verdict`\ s
(``claim.outcome``), never as words.

Claims are data: :meth:`Claim.to_dict` / :meth:`Claim.from_dict` give the JSON form that
``python -m course_utils prove`` writes to ``claims.json`` (verdict in words, its reason, the samples
where the claim came from repeats). A notebook's table also saves itself there when
``COURSE_CLAIMS_DIR`` is set (the test suite sets it and reads the files, never the printed output).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
import statistics
from typing import Iterable

from . import fileguard

HOLDS, FAILS, DIFFERS, NOISE, UNMEASURABLE = (
    "✅ holds",
    "❌ does not hold here",
    "⚠️ differs on this hardware",
    "〰️ inconclusive here (noise)",
    "➖ not measurable here",
)
VERDICTS = {True: HOLDS, False: FAILS, None: UNMEASURABLE}
# The verdicts in words, as claims.json writes them
WORDS = {
    HOLDS: "holds",
    FAILS: "does not hold",
    DIFFERS: "differs on this hardware",
    NOISE: "inconclusive",
    UNMEASURABLE: "not measurable here",
}
ID_PATTERN = re.compile(r"(\d\d)\.[a-z0-9_.]+")  # a claim's id: the lesson's number, a dot, a name
# The least speed-up a claim that something is "faster" asks for where the lesson itself expects about 1x (a CPU
# under XLA, which computes bfloat16 in float32). Ratios of about 1x moved by up to 0.1x between runs of unchanged
# code on one machine, further than their middle halves reached: tested against 1.0x, such a claim read "holds" in
# one run and "inconclusive" or "differs" in the next. Against 1.1x every one of those runs reads "differs on this
# hardware", with the lesson's reason.
NOTICEABLE_GAIN = 1.1


class Verdict(str, enum.Enum):
    """A claim's verdict; its value is the word claims.json writes ("does not hold"), :attr:`label` the table's."""

    HOLDS = "holds"
    FAILS = "does not hold"
    DIFFERS = "differs on this hardware"
    NOISE = "inconclusive"
    UNMEASURABLE = "not measurable here"

    @property
    def label(self) -> str:
        return {word: label for label, word in WORDS.items()}[self.value]

    @classmethod
    def read(cls, word: object) -> "Verdict":
        """The verdict a card's word names; ValueError (one line) for any other value."""
        try:
            return cls(word)
        except ValueError:
            known = ", ".join(v.value for v in cls)
            raise ValueError(f"unknown verdict {str(word)[:40]!r} (one of: {known})") from None


CLAIMS_DIR_VARIABLE = "COURSE_CLAIMS_DIR"


@dataclasses.dataclass
class Samples:
    """Repeated measurements of one quantity: median and spread.

    The spread is min–max for up to 4 values and the interquartile range (middle half) from 5 on,
    so one outlier among many repeats does not make every verdict inconclusive."""

    values: list[float]

    def __post_init__(self):
        self.values = [float(v) for v in self.values]
        if not self.values:
            raise ValueError("no measurements: repeat the measurement at least once")

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def _spread(self) -> tuple[float, float]:
        if len(self.values) < 5:
            return min(self.values), max(self.values)
        q1, _, q3 = statistics.quantiles(self.values, n=4, method="inclusive")
        return q1, q3

    @property
    def low(self) -> float:
        return self._spread()[0]

    @property
    def high(self) -> float:
        return self._spread()[1]

    @property
    def spread_name(self) -> str:
        return "min–max" if len(self.values) < 5 else "middle half"

    def format(self, fmt: str = ".2f", unit: str = "") -> str:
        if len(self.values) == 1:
            return f"{self.median:{fmt}}{unit} (1 run)"
        return (
            f"{self.median:{fmt}}{unit} (median of {len(self.values)}; {self.spread_name} "
            f"{self.low:{fmt}}–{self.high:{fmt}})"
        )

    def compare(self, op: str, threshold: float) -> bool | str:
        """True when the whole spread satisfies ``op threshold``, False when none of it does, else
        "noise" (the spread straddles the threshold)."""
        if op not in (">", ">=", "<", "<="):
            raise ValueError(f"op must be one of > >= < <=, got {op!r}")
        test = {
            ">": lambda v: v > threshold,
            ">=": lambda v: v >= threshold,
            "<": lambda v: v < threshold,
            "<=": lambda v: v <= threshold,
        }[op]
        results = [test(self.low), test(self.median), test(self.high)]
        if all(results):
            return True
        if not any(results):
            return False
        return "noise"

    def within(self, low: float, high: float) -> bool | str:
        """True when the whole spread lies in ``[low, high)``, False when it lies wholly outside on one side, else
        "noise" (the spread crosses a bound)."""
        above, below = self.compare(">=", low), self.compare("<", high)
        if above is True and below is True:
            return True
        if above is False or below is False:
            return False
        return "noise"


@dataclasses.dataclass
class Claim:
    claim: str
    source: str
    expected: str
    measured: str
    holds: bool | None | str  # True / False / None (not measurable here) / "noise" (inconclusive)
    note: str = ""
    differs_here: str = ""  # a stated hardware reason why the claim is not expected to hold on this machine
    samples: list | None = None  # the repeated measurements the verdict came from (from_samples)
    lesson: str = ""  # "05": set by the lesson's claims function
    id: str = ""  # stable across rewordings: "05.accumulated_peak" (the lesson's number, then a name)
    where: str = (
        ""  # the function that measured it: "course_utils.lessons.gradient_accumulation.experiments:step_peaks"
    )
    figure: str = ""  # "speed" | "memory": judged on the accelerator's speed or memory (FIGURE_KINDS); "" otherwise

    def __post_init__(self):
        if self.holds is not None and not isinstance(self.holds, str):
            self.holds = bool(self.holds)  # numpy's bool_ from a comparison: a plain bool (JSON)
        if self.samples is not None:
            self.samples = [float(v) for v in self.samples]

    @classmethod
    def from_samples(
        cls,
        claim: str,
        source: str,
        expected: str,
        samples: Samples | Iterable[float],
        op: str,
        threshold: float,
        fmt: str = ".2f",
        unit: str = "×",
        note: str = "",
        differs_here: str = "",
        id: str = "",
    ) -> "Claim":
        """A claim about a repeated measurement: holds when every repeat is on the right side of
        ``threshold``, does not hold when none is, and is inconclusive (noise) otherwise."""
        samples = samples if isinstance(samples, Samples) else Samples(list(samples))
        return cls(
            claim,
            source,
            expected,
            samples.format(fmt, unit),
            samples.compare(op, threshold),
            note=note,
            differs_here=differs_here,
            samples=list(samples.values),
            id=id,
        )

    @property
    def status(self) -> str:
        if self.holds == "noise":
            return NOISE
        if self.holds is False and self.differs_here:
            return DIFFERS
        if self.holds not in VERDICTS:
            raise ValueError(f"holds must be True, False, None or 'noise', got {self.holds!r}")
        return VERDICTS[self.holds]

    @property
    def outcome(self) -> Verdict:
        """The verdict as a :class:`Verdict` (compare these, not words or labels)."""
        return Verdict(WORDS[self.status])

    @property
    def reason(self) -> str:
        why = [self.differs_here] if self.status == DIFFERS else []
        why += [self.note] if self.note else []
        return "; ".join(why)

    @property
    def verdict(self) -> str:
        return self.status + (f" — {self.reason}" if self.reason else "")

    @property
    def fails(self) -> bool:
        """Does not hold here, with no stated hardware reason: a bug in the lesson, the code or the claim."""
        return self.status == FAILS

    def to_dict(self) -> dict:
        """The JSON form (claims.json): the verdict in words (holds / does not hold / differs on this hardware /
        inconclusive / not measurable here), its reason, and the samples where the claim came from repeats."""
        return {
            "id": self.id,
            "where": self.where,
            "lesson": self.lesson,
            "claim": self.claim,
            "source": self.source,
            "expected": self.expected,
            "measured": self.measured,
            "verdict": WORDS[self.status],
            "reason": self.reason,
            "holds": self.holds,
            "note": self.note,
            "differs_here": self.differs_here,
            "samples": None if self.samples is None else [float(v) for v in self.samples],
            "figure": self.figure,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Claim":
        if not isinstance(d, dict) or not {"claim", "holds"} <= set(d):
            raise ValueError(f"not a claim (needs at least 'claim' and 'holds'): {str(d)[:120]}")
        return cls(
            d["claim"],
            d.get("source", ""),
            d.get("expected", ""),
            d.get("measured", ""),
            d["holds"],
            note=d.get("note", ""),
            differs_here=d.get("differs_here", ""),
            samples=d.get("samples"),
            lesson=d.get("lesson", ""),
            id=d.get("id", "") or "",
            where=d.get("where", "") or "",
            figure=d.get("figure", "") or "",
        )


def function_name(fn) -> str:
    """``module:qualname`` of a function (a string is taken as already that): what a claim's ``where`` holds."""
    return fn if isinstance(fn, str) else f"{fn.__module__}:{fn.__qualname__}"


def where_label(where: str) -> str:
    """A claim's ``where`` as a maintainer opens it: ``lessons/gradient_accumulation/experiments.py: step_peaks``."""
    module, _, name = where.partition(":")
    if not name:
        return where
    path = module.removeprefix("course_utils.").replace(".", "/") + ".py"
    return f"{path}: {name}"


FIGURE_KINDS = ("speed", "memory")


def _by_id(table: dict, claim_id: str):
    """``table``'s entry for ``claim_id``: its own key, else the longest key ending in "_" or "." that it begins."""
    keys = [k for k in table if claim_id == k or (k.endswith(("_", ".")) and claim_id.startswith(k))]
    return table[max(keys, key=len)] if keys else None


def placed(claims: list["Claim"], lesson: str, measured_by: dict, figures: dict | None = None) -> list["Claim"]:
    """Lesson ``lesson``'s claims, each with its ``lesson``, its ``where``: the function that measured it, from
    ``measured_by`` (claim id -> function, or its ``module:name``, or ``"notebook §3"``: the notebook's own cells in that
    section; None for a claim nothing here measures), and its
    ``figure`` from ``figures`` (claim id -> "speed" or "memory": the claims judged on how fast the accelerator
    runs or how much of its memory a step takes). A key ending in "_" or "." stands for every id it begins
    (``"02.forward_peak_"``: one claim per policy). The claims are changed in place and returned.

    Under a GPU or TPU stand-in (:mod:`course_utils.standin`) a figure is a CPU's, judged as the accelerator's: one
    that does not hold there says so (``differs_here``) instead of failing. Every other claim — values, errors,
    what runs where — is judged as anywhere else: the stand-in runs the accelerator's code."""
    from . import standin

    kind = standin.active()
    for claim in claims:
        claim.lesson = lesson
        fn = _by_id(measured_by, claim.id)
        claim.where = function_name(fn) if fn is not None else ""
        claim.figure = _by_id(figures or {}, claim.id) or ""
        if claim.figure not in ("",) + FIGURE_KINDS:
            raise ValueError(f"{claim.id}: figure {claim.figure!r} is not one of {', '.join(FIGURE_KINDS)}")
        if kind and claim.figure and claim.holds is False and not claim.differs_here:
            claim.differs_here = (
                f"a {kind.upper()} stand-in: this {claim.figure} figure is a CPU's, judged as the "
                f"{kind.upper()}'s (run it on one)"
            )
    return claims


@dataclasses.dataclass(frozen=True)
class Declared:
    """One claim, declared once, in its lesson's :class:`LessonClaims`: everything about it that is not measured.

    ``id``: "03.mixed_policy_dtypes" (an id ending in "_" or "." declares a family: ``"02.forward_peak_"`` + a suffix
    per policy). ``claim``, ``source`` and ``expected``: the table's words; ``{threshold}`` in them is the threshold, and
    ``{name}`` a value the claims function passes when it judges (``policy="mixed_bfloat16"``). ``where``: the
    function that measures it (or its ``module:name``), ``"notebook §3"`` for the notebook's own cells in that
    section, None for nothing here. ``figure``: "speed" or "memory" (:data:`FIGURE_KINDS`) for a figure judged on
    the accelerator's speed or memory. ``op`` and ``threshold``: how repeats are judged (:meth:`Samples.compare`;
    ``op="within"`` with ``threshold=(low, high)``: :meth:`Samples.within`), ``fmt`` and ``unit`` how they print.
    ``prose``: words the lesson's notebook states to a learner (tested), with ``{threshold}`` filled in.
    ``optional``: results measured before the claim existed leave it out (judged when they have it)."""

    id: str
    claim: str
    source: str
    expected: str
    where: object = None
    figure: str = ""
    op: str = ""
    threshold: float | tuple[float, float] | None = None
    fmt: str = ".2f"
    unit: str = "×"
    prose: str = ""
    optional: bool = False

    @property
    def family(self) -> bool:
        return self.id.endswith(("_", "."))

    def words(self, field: str, values: dict) -> str:
        """``claim``, ``source``, ``expected`` or ``prose`` with ``{threshold}`` and ``values`` filled in."""
        return getattr(self, field).format_map({"threshold": self.threshold, **values})


class LessonClaims:
    """A lesson's claims, each declared once (:class:`Declared`): the lesson's ``claims(results)`` judges them by id
    with :meth:`judge` or :meth:`judge_samples`, passing only what was measured and the verdict, and returns
    :meth:`all` of them. What a card says of a claim besides the measurement — its words, its threshold, the
    function that measured it (``where``), whether it is a speed or memory figure — comes from its declaration."""

    def __init__(self, lesson: str, declared: Iterable[Declared]):
        self.lesson, self.declared = lesson, {}
        for spec in declared:
            if not ID_PATTERN.fullmatch(spec.id.rstrip("_.")) or not spec.id.startswith(f"{lesson}."):
                raise ValueError(f"claim id {spec.id!r} is not {lesson}.name")
            if spec.id in self.declared:
                raise ValueError(f"claim {spec.id!r} is declared twice")
            if spec.figure not in ("",) + FIGURE_KINDS:
                raise ValueError(f"{spec.id}: figure {spec.figure!r} is not one of {', '.join(FIGURE_KINDS)}")
            self.declared[spec.id] = spec

    def __iter__(self):
        return iter(self.declared.values())

    def spec(self, claim_id: str) -> Declared:
        """The declaration of ``claim_id`` (a family's for "02.forward_peak_bfloat16"); KeyError if undeclared."""
        found = _by_id(self.declared, claim_id)
        if found is None or (found.family and claim_id == found.id):
            raise KeyError(f"claim {claim_id!r} is not declared in lesson {self.lesson}'s claims")
        return found

    def judge(
        self,
        claim_id: str,
        measured: str,
        holds,
        note: str = "",
        differs_here: str = "",
        samples: list | None = None,
        **values,
    ) -> Claim:
        """Claim ``claim_id`` as measured: ``holds`` True / False / None (not measurable here) / "noise"."""
        spec = self.spec(claim_id)
        claim = Claim(
            spec.words("claim", values),
            spec.words("source", values),
            spec.words("expected", values),
            measured,
            holds,
            note=note,
            differs_here=differs_here,
            samples=samples,
            id=claim_id,
        )
        return placed([claim], self.lesson, {claim_id: spec.where}, {claim_id: spec.figure})[0]

    def judge_samples(
        self,
        claim_id: str,
        samples: Samples | Iterable[float],
        note: str = "",
        differs_here: str = "",
        threshold=None,
        op: str = "",
        fmt: str = "",
        unit: str | None = None,
        **values,
    ) -> Claim:
        """Claim ``claim_id`` from repeats, judged by its declared ``op`` against its ``threshold`` — or, where the
        lesson's line moves with the machine (a TPU's against a CPU's), the ``op``, ``threshold``, ``fmt`` and
        ``unit`` given here."""
        spec = self.spec(claim_id)
        op, line = op or spec.op, spec.threshold if threshold is None else threshold
        if not op:
            raise ValueError(f"{claim_id} declares no op: judge it with judge()")
        samples = samples if isinstance(samples, Samples) else Samples(list(samples))
        holds = samples.within(*line) if op == "within" else samples.compare(op, line)
        measured = samples.format(fmt or spec.fmt, spec.unit if unit is None else unit)
        return self.judge(
            claim_id, measured, holds, note=note, differs_here=differs_here, samples=list(samples.values), **values
        )

    def all(self, claims: Iterable[Claim]) -> list[Claim]:
        """``claims``, checked: each declared claim judged once (a family at least once; an optional one at most
        once), nothing else."""
        claims = list(claims)
        problems = id_problems(claims, self.lesson)
        judged = {c.id for c in claims}
        problems += [
            f"claim {spec.id!r} is declared but not judged"
            for spec in self
            if not spec.optional
            and not (any(i.startswith(spec.id) for i in judged) if spec.family else spec.id in judged)
        ]
        if problems:
            raise ValueError(f"lesson {self.lesson}'s claims: " + "; ".join(problems))
        return claims


def id_problems(claims: Iterable["Claim"], lesson: str) -> list[str]:
    """What is wrong with lesson ``lesson``'s claim ids ("05"): each needs one, ``05.name`` (:data:`ID_PATTERN`),
    used once. An empty list when all is well."""
    problems, seen = [], set()
    for claim in claims:
        match = ID_PATTERN.fullmatch(claim.id or "")
        if not match or match.group(1) != lesson:
            problems.append(f"claim {claim.claim[:60]!r} has id {claim.id!r}, not {lesson}.name")
        elif claim.id in seen:
            problems.append(f"id {claim.id!r} is used twice")
        seen.add(claim.id)
    return problems


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
        widths = [
            max(len(c), *(len(r[i]) for r in self.rows())) if self.rows() else len(c)
            for i, c in enumerate(self.columns)
        ]
        line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
        return "\n".join([line(self.columns), line(["-" * w for w in widths])] + [line(r) for r in self.rows()])

    __repr__ = __str__


class ClaimsTable(Table):
    """The lesson's claims with what was measured here; Markdown in a notebook, numbered text in logs."""

    columns = ("Claim", "Source", "Expected", "Measured here", "Verdict")

    def __init__(self, claims: list[Claim], save: bool = True):
        self.claims = list(claims)
        if save and os.environ.get(CLAIMS_DIR_VARIABLE, "").strip():
            self.save(os.environ[CLAIMS_DIR_VARIABLE])

    def save(self, directory: str) -> str:
        """Write the claims as JSON to ``directory/claims-<lesson>.json`` (the lessons the claims name, else
        ``claims-notebook.json``); the test suite reads these files instead of the notebook's printed output."""
        lessons = sorted({c.lesson for c in self.claims if c.lesson}) or ["notebook"]
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"claims-{'-'.join(lessons)}.json")

        fileguard.write_json(path, [c.to_dict() for c in self.claims])
        return path

    def rows(self) -> list[tuple[str, ...]]:
        return [(c.claim, c.source, c.expected, c.measured, c.verdict) for c in self.claims]

    def __str__(self) -> str:
        out = []
        for i, (claim, source, expected, measured, verdict) in enumerate(self.rows(), 1):
            out.append(
                f"{i}. {claim}\n   source: {source}\n   expected: {expected}\n   measured: {measured}\n   verdict: {verdict}"
            )
        return "\n".join(out)

    __repr__ = __str__

    @property
    def all_hold(self) -> bool:
        """No claim measured false here (rows that cannot be measured do not count against it)."""
        return all(c.holds is not False for c in self.claims)

    @property
    def unexplained_failures(self) -> list[Claim]:
        """Claims that do not hold here with no stated hardware reason: a bug in the lesson or the code."""
        return [c for c in self.claims if c.fails]
