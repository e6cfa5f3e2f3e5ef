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
            "notice_message": "worker 0 exited with code 42; the other tasks were stopped",
            "preempt_steps": {0: [1, 2, 3, 4], 1: [1, 2, 3, 4]}, "preempt_resumed": {0: 3, 1: 3}, "diff_preempted": 0.0,
            "ps": {"losses": [2.0, 1.8, 1.5, 1.2], "variable_devices": ["/job:ps/replica:0/task:0/device:CPU:0"],
                   "fit": "ValueError: no"},
            "mp": {"times_s": times, "max_grad_diff": {"one device": 0.0}, "grad_scale": 1.0},
            "timings": {1: {"step_s": 0.001, "all_reduce_s": 0.0002}, 2: {"step_s": 0.003, "all_reduce_s": 0.001},
                        4: {"step_s": 0.005, "all_reduce_s": 0.002}},
            "alone": {2: {"step_s": 0.0015}, 4: {"step_s": 0.002}}}


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


def test_lesson_08_step_parts_and_the_core_sharing_claim():
    """Issue 21: the 2-worker step split into what was measured — the 1-worker step, core sharing (the same processes
    alone at once), the all-reduce beyond one worker's, and the rest — and a claim that fails when the cluster adds
    nothing beyond sharing the cores."""
    r = _lesson_08_results(rounds=3, naive_s=1.0)
    parts = scaling_out.step_parts(r["timings"], r["alone"])
    assert list(parts) == [2, 4]
    two = parts[2]
    assert two["one_worker"] + two["core_sharing"] + two["all_reduce"] + two["rest"] == __import__("pytest").approx(3.0)
    assert (round(two["core_sharing"], 6), round(two["all_reduce"], 6), round(two["rest"], 6)) == (0.5, 0.8, 0.7)
    claim = {c.claim.split(":")[0]: c for c in scaling_out.claims(r)}["Sharing the cores does not explain the 2-worker step"]
    assert claim.status == report.HOLDS
    r["alone"][2]["step_s"] = 0.0029  # alone at once as slow as in the cluster: core sharing explains it
    claim = {c.claim.split(":")[0]: c for c in scaling_out.claims(r)}["Sharing the cores does not explain the 2-worker step"]
    assert claim.status == report.FAILS


def test_lessons_07_and_08_notebooks_and_measure_hand_claims_the_same_keys():
    from claims_helpers import measure_keys, notebook_dict_keys

    from course_utils.experiments import activation_memory

    assert notebook_dict_keys("07_activation_memory.ipynb", "results") == measure_keys(activation_memory)
    notebook_08 = notebook_dict_keys("08_scaling_out.ipynb", "results")
    assert notebook_08 == measure_keys(scaling_out) == set(_lesson_08_results(rounds=3, naive_s=1.0))


def test_lesson_08_preemption_claim_fails_on_a_lost_step_a_second_start_or_no_notice():
    name = "PreemptionCheckpointHandler"
    r = _lesson_08_results(rounds=3, naive_s=1.0)
    assert next(c for c in scaling_out.claims(r) if c.claim.startswith(name)).status == report.HOLDS
    for change in ({"notice_message": None}, {"notice_message": "worker 0 exited with code 1"},
                   {"preempt_steps": {0: [1, 2, 3, 3, 4], 1: [1, 2, 3, 3, 4]}},  # a step repeated
                   {"preempt_steps": {0: [1, 2, 4], 1: [1, 2, 4]}},  # a step lost
                   {"preempt_resumed": {0: 0, 1: 0}},  # started over
                   {"diff_preempted": 1e-3}):
        changed = dict(r, **change)
        claim = next(c for c in scaling_out.claims(changed) if c.claim.startswith(name))
        assert claim.status == report.FAILS, change
