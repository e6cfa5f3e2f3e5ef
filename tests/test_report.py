"""Claims verdicts from repeated measurements (issue 8 §2) and the helpers that produce the repeats."""

from __future__ import annotations

import time

import pytest

from course_utils import report


def test_samples_spread_is_min_max_below_five_and_middle_half_from_five():
    assert (report.Samples([3, 1, 2]).low, report.Samples([3, 1, 2]).high) == (1, 3)
    many = report.Samples([1.0, 1.3, 1.31, 1.32, 1.33, 1.34, 9.0])  # one outlier each side
    assert 1.3 <= many.low < many.median < many.high <= 1.34
    assert many.median == 1.32
    with pytest.raises(ValueError):
        report.Samples([])


@pytest.mark.parametrize(
    "values, verdict",
    [
        ([1.3, 1.4, 1.5], report.HOLDS),
        ([0.9, 1.0, 1.05], report.FAILS),
        ([1.1, 1.3, 1.5], report.NOISE),  # the spread straddles 1.2: never a coin flip
        ([1.25, 1.3, 1.2, 1.35, 1.3, 5.0, 0.1], report.HOLDS),  # middle half 1.2..1.3 > 1.15 despite outliers
    ],
)
def test_claim_from_samples_decides_from_the_spread(values, verdict):
    threshold = 1.15 if len(values) > 3 else 1.2
    claim = report.Claim.from_samples("faster", "§1", "> 1.2×", values, ">", threshold)
    assert claim.status == verdict
    assert "median of" in claim.measured


def test_operators_and_bad_operator():
    s = report.Samples([0.5, 0.6, 0.7])
    assert s.compare("<", 1.0) is True and s.compare(">=", 0.5) is True and s.compare("<=", 0.55) == "noise"
    with pytest.raises(ValueError):
        s.compare("==", 1.0)


def test_a_stated_hardware_difference_is_not_a_failure():
    plain = report.Claim("c", "s", "e", "m", False)
    differs = report.Claim("c", "s", "e", "m", False, differs_here="CPUs have no bf16 units")
    unmeasurable = report.Claim("c", "s", "e", "m", None, note="no TPU here")
    assert plain.verdict == report.FAILS
    assert differs.verdict.startswith(report.DIFFERS) and "bf16 units" in differs.verdict
    assert unmeasurable.verdict == f"{report.UNMEASURABLE} — no TPU here"
    table = report.ClaimsTable([plain, differs, unmeasurable])
    assert table.unexplained_failures == [plain]
    assert not table.all_hold
    assert report.ClaimsTable([differs, unmeasurable]).unexplained_failures == []
    # differs_here only explains a failure; a claim that holds still reads "holds"
    assert report.Claim("c", "s", "e", "m", True, differs_here="x").verdict == report.HOLDS


def test_invalid_holds_value_is_refused():
    with pytest.raises(ValueError):
        report.Claim("c", "s", "e", "m", "maybe").verdict


def test_speedup_samples_measures_the_ratio_interleaved():
    from course_utils import timing

    samples = timing.speedup_samples(lambda: time.sleep(0.004), lambda: time.sleep(0.001), rounds=3, repeats=2)
    assert len(samples.values) == 3
    assert samples.median > 1.8  # 4 ms vs 1 ms: about 4×, far from 1 even on a busy machine
    with pytest.raises(ValueError):
        timing.speedup_samples(lambda: None, lambda: None, rounds=0)


def test_verdicts_are_an_enum_whose_values_are_the_words_cards_write():
    from course_utils.report import Claim, Verdict

    cases = {True: Verdict.HOLDS, False: Verdict.FAILS, None: Verdict.UNMEASURABLE, "noise": Verdict.NOISE}
    for holds, verdict in cases.items():
        claim = Claim("c", "§1", "x", "y", holds, id="05.c")
        assert claim.outcome is verdict and claim.to_dict()["verdict"] == verdict.value
        assert claim.status == verdict.label and Claim.from_dict(claim.to_dict()).outcome is verdict
    assert Claim("c", "§1", "x", "y", False, differs_here="CPU").outcome is Verdict.DIFFERS
    assert Verdict.read("does not hold") is Verdict.FAILS
    with pytest.raises(ValueError, match="unknown verdict 'fails'"):
        Verdict.read("fails")


def test_claim_ids_round_trip_and_id_problems_names_each_fault():
    from course_utils.report import Claim, id_problems

    good = [Claim("a", "§1", "x", "y", True, id="05.first"), Claim("b", "§2", "x", "y", True, id="05.second")]
    assert [Claim.from_dict(c.to_dict()).id for c in good] == ["05.first", "05.second"]
    assert id_problems(good, "05") == []
    bad = good + [
        Claim("c", "§3", "x", "y", True, id="05.first"),
        Claim("d", "§4", "x", "y", True),
        Claim("e", "§5", "x", "y", True, id="04.other"),
        Claim("f", "§6", "x", "y", True, id="05.Bad Name"),
    ]
    problems = id_problems(bad, "05")
    assert len(problems) == 4 and "'05.first' is used twice" in problems[0], problems
    assert all("not 05.name" in p for p in problems[1:]), problems


def _declared():
    return report.LessonClaims(
        "02",
        [
            report.Declared("02.kernel_cast_raises", "casting a {what} raises", "§2", "an error", where=report.Samples),
            report.Declared(
                "02.speed",
                "{policy} is faster",
                "§3",
                "> {threshold}×",
                figure="speed",
                op=">",
                threshold=1.1,
                prose="more than {threshold}×",
            ),
            report.Declared("02.forward_peak_", "the forward peak is lower", "§4", "< 1×", where="notebook §4"),
        ],
    )


def test_a_declared_claim_takes_its_words_threshold_and_where_from_its_declaration():
    declared = _declared()
    claim = declared.judge("02.kernel_cast_raises", "TypeError", True, what="kernel")
    assert (claim.claim, claim.source, claim.expected) == ("casting a kernel raises", "§2", "an error")
    assert claim.lesson == "02"
    assert claim.where == "course_utils.report:Samples" and claim.figure == ""
    fast = declared.judge_samples("02.speed", [1.2, 1.3, 1.4], policy="mixed_bfloat16")
    assert (fast.claim, fast.expected, fast.holds) == ("mixed_bfloat16 is faster", "> 1.1×", True)
    assert fast.figure == "speed"
    assert fast.measured == report.Samples([1.2, 1.3, 1.4]).format(".2f", "×") and fast.samples == [1.2, 1.3, 1.4]
    assert declared.judge_samples("02.speed", [1.05, 1.06, 1.07], policy="p").holds is False  # against 1.1
    assert declared.judge_samples("02.speed", [1.05, 1.06, 1.07], threshold=1.0, policy="p").holds is True
    family = declared.judge("02.forward_peak_bfloat16", "0.5×", True)
    assert family.id == "02.forward_peak_bfloat16" and family.where == "notebook §4"
    assert declared.spec("02.speed").words("prose", {}) == "more than 1.1×"


def test_declared_claims_refuse_what_is_not_declared_judged_twice_or_left_out():
    declared = _declared()
    for undeclared in ("02.kernel_cast", "02.forward_peak_", "03.speed"):
        with pytest.raises(KeyError, match="not declared"):
            declared.judge(undeclared, "x", True)
    with pytest.raises(ValueError, match="declares no op"):
        declared.judge_samples("02.kernel_cast_raises", [1.0], what="x")
    one = declared.judge("02.kernel_cast_raises", "x", True, what="x")
    speed = declared.judge_samples("02.speed", [1.2], policy="p")
    peaks = [declared.judge(f"02.forward_peak_{p}", "x", True) for p in ("float32", "bfloat16")]
    assert declared.all([one, speed, *peaks]) == [one, speed, *peaks]
    with pytest.raises(ValueError, match="'02.speed' is declared but not judged"):
        declared.all([one, *peaks])
    with pytest.raises(ValueError, match="'02.forward_peak_' is declared but not judged"):
        declared.all([one, speed])
    with pytest.raises(ValueError, match="used twice"):
        declared.all([one, one, speed, *peaks])
    for bad, says in (
        (report.Declared("02.x", "a", "b", "c", figure="size"), "figure"),
        (report.Declared("03.x", "a", "b", "c"), "not 02.name"),
        (report.Declared("02.Bad", "a", "b", "c"), "not 02.name"),
    ):
        with pytest.raises(ValueError, match=says):
            report.LessonClaims("02", [bad])
    optional = report.LessonClaims(
        "02", [report.Declared("02.x", "a", "b", "c"), report.Declared("02.row.", "a", "b", "c", optional=True)]
    )
    x = optional.judge("02.x", "m", True)
    assert optional.all([x]) == [x] and optional.spec("02.row.gce_cpu").id == "02.row."
    with pytest.raises(ValueError, match="used twice"):
        optional.all([x, optional.judge("02.row.a", "m", True), optional.judge("02.row.a", "m", True)])
    with pytest.raises(ValueError, match="declared twice"):
        report.LessonClaims("02", [report.Declared("02.x", "a", "b", "c")] * 2)
