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


@pytest.mark.parametrize("values, verdict", [
    ([1.3, 1.4, 1.5], report.HOLDS),
    ([0.9, 1.0, 1.05], report.FAILS),
    ([1.1, 1.3, 1.5], report.NOISE),  # the spread straddles 1.2: never a coin flip
    ([1.25, 1.3, 1.2, 1.35, 1.3, 5.0, 0.1], report.HOLDS),  # middle half 1.2..1.3 > 1.15 despite outliers
])
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
    bad = good + [Claim("c", "§3", "x", "y", True, id="05.first"), Claim("d", "§4", "x", "y", True),
                  Claim("e", "§5", "x", "y", True, id="04.other"), Claim("f", "§6", "x", "y", True, id="05.Bad Name")]
    problems = id_problems(bad, "05")
    assert len(problems) == 4 and "'05.first' is used twice" in problems[0], problems
    assert all("not 05.name" in p for p in problems[1:]), problems
