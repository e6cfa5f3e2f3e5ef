"""Lessons' claims functions (``claims(results)``) on hand-made results: the verdicts follow the measurements, and a
measurement this hardware cannot make reads "not measurable here", never a pass or a failure."""

from __future__ import annotations

from course_utils import report
from course_utils.experiments import scaling_out


def _lesson_08_results(rounds: int, naive_s: float) -> dict:
    times = {"one device": [1.0] * rounds, "split (naive)": [naive_s] * rounds,
             "split, 2 micro-batches": [0.9] * rounds, "stage 1 alone (worker 0)": [0.5] * rounds,
             "stage 2 alone (worker 1)": [0.5] * rounds}
    return {"cluster_steps": 4, "global_batch": 16, "scaling_workers": [1, 2, 4], "diff_workers": 0.0,
            "diff_single": 1e-7, "local_examples": [32, 32], "fit_log": ["[worker 0] model.fit failed: ValueError: x"],
            "crash_message": "worker 1 exited", "committed": {0: [1, 2, 3, 4], 1: [1, 2, 3, 4]}, "diff_resumed": 0.0,
            "ps": {"losses": [2.0, 1.8, 1.5, 1.2], "variable_devices": ["/job:ps/replica:0/task:0/device:CPU:0"],
                   "fit": "ValueError: no"},
            "mp": {"times_s": times, "max_grad_diff": {"one device": 0.0}, "grad_scale": 1.0},
            "timings": {1: {"step_s": 0.001}, 2: {"step_s": 0.003}, 4: {"step_s": 0.005}}}


def test_lesson_08_timing_claims_need_three_rounds():
    by_claim = {c.claim: c for c in scaling_out.claims(_lesson_08_results(rounds=2, naive_s=0.5))}
    naive = by_claim["Naive model parallelism is not meaningfully faster than one device"]
    assert naive.status == report.UNMEASURABLE and "2 timing rounds" in naive.note
    by_claim = {c.claim: c for c in scaling_out.claims(_lesson_08_results(rounds=3, naive_s=0.5))}
    naive = by_claim["Naive model parallelism is not meaningfully faster than one device"]
    assert naive.status == report.FAILS and naive.samples == [0.5, 0.5, 0.5]  # twice as fast: the claim is false
    claims = scaling_out.claims(_lesson_08_results(rounds=3, naive_s=1.0))
    assert all(c.lesson == "08" for c in claims)
    assert [c.status for c in claims].count(report.HOLDS) == len(claims), [c.verdict for c in claims]
