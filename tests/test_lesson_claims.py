"""Lessons' claims functions (``claims(results)``) on hand-made results: the verdicts follow the measurements, and a
measurement this hardware cannot make reads "not measurable here", never a pass or a failure."""

from __future__ import annotations

from claims_helpers import claim_by_id

from course_utils import report
from course_utils.lessons.scaling_out import experiments as scaling_out


def _lesson_08_results(rounds: int, naive_s: float) -> dict:
    times = {
        "one device": [1.0] * rounds,
        "split (naive)": [naive_s] * rounds,
        "split, 2 micro-batches": [0.9] * rounds,
        "stage 1 alone (worker 0)": [0.5] * rounds,
        "stage 2 alone (worker 1)": [0.5] * rounds,
    }
    return {
        "cluster_steps": 4,
        "global_batch": 16,
        "scaling_workers": [1, 2, 4],
        "diff_workers": 0.0,
        "diff_single": 1e-7,
        "local_examples": [32, 32],
        "fit_log": ["[worker 0] model.fit failed: ValueError: x"],
        "crash_message": "worker 1 exited",
        "committed": {0: [1, 2, 3, 4], 1: [1, 2, 3, 4]},
        "diff_resumed": 0.0,
        "notice_message": "worker 0 exited with code 42; the other tasks were stopped",
        "preempt_steps": {0: [1, 2, 3, 4], 1: [1, 2, 3, 4]},
        "preempt_resumed": {0: 3, 1: 3},
        "diff_preempted": 0.0,
        "platform_rows": [],
        "stall": {
            "no timeout": {
                "step_s": [0.1, 0.01, 4.01, 0.01],
                "error": None,
                "failed_step": None,
                "waited_s": None,
                "timeout_s": 0.0,
                "stall_s": 4.0,
                "stall_after": 2,
                "message": None,
            },
            "timeout": {
                "step_s": [0.1, 0.01],
                "error": "DeadlineExceededError",
                "failed_step": 3,
                "waited_s": 2.0,
                "timeout_s": 2.0,
                "stall_s": 4.0,
                "stall_after": 2,
                "message": "worker 0 exited with code 3; the other tasks were stopped",
            },
        },
        "ps": {
            "losses": [2.0, 1.8, 1.5, 1.2],
            "variable_devices": ["/job:ps/replica:0/task:0/device:CPU:0"],
            "fit": "ValueError: no",
            "evaluation": {
                "examples": 4,
                "batches": 2,
                "coordinator_correct": 3,
                "per-worker dataset": {"visits": [2, 2, 0, 0], "correct": 4},
                "one batch per step": {"visits": [1, 1, 1, 1], "correct": 3},
            },
        },
        "mp": {"times_s": times, "max_grad_diff": {"one device": 0.0}, "grad_scale": 1.0},
        "timings": {
            1: {"step_s": 0.001, "all_reduce_s": 0.0002},
            2: {"step_s": 0.003, "all_reduce_s": 0.001},
            4: {"step_s": 0.005, "all_reduce_s": 0.002},
        },
        "alone": {2: {"step_s": 0.0015}, 4: {"step_s": 0.002}},
    }


def test_lesson_08_timing_claims_need_three_rounds():
    naive = claim_by_id(
        scaling_out.claims(_lesson_08_results(rounds=2, naive_s=0.5)), "08.naive_model_parallel_not_faster"
    )
    assert naive.status == report.UNMEASURABLE and "2 timing rounds" in naive.note
    naive = claim_by_id(
        scaling_out.claims(_lesson_08_results(rounds=3, naive_s=0.5)), "08.naive_model_parallel_not_faster"
    )
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
    claim = claim_by_id(scaling_out.claims(r), "08.sharing_cores_not_the_cause")
    assert claim.status == report.HOLDS
    r["alone"][2]["step_s"] = 0.0029  # alone at once as slow as in the cluster: core sharing explains it
    claim = claim_by_id(scaling_out.claims(r), "08.sharing_cores_not_the_cause")
    assert claim.status == report.FAILS


def test_the_hand_made_results_of_lesson_08_have_the_notebooks_keys():
    from claims_helpers import notebook_dict_keys

    assert notebook_dict_keys("08_scaling_out.ipynb", "results") == set(_lesson_08_results(rounds=3, naive_s=1.0))


def test_lesson_08_preemption_claim_fails_on_a_lost_step_a_second_start_or_no_notice():
    name = "08.preemption_handler_off_cloud"
    r = _lesson_08_results(rounds=3, naive_s=1.0)
    assert claim_by_id(scaling_out.claims(r), name).status == report.HOLDS
    for change in (
        {"notice_message": None},
        {"notice_message": "worker 0 exited with code 1"},
        {"preempt_steps": {0: [1, 2, 3, 3, 4], 1: [1, 2, 3, 3, 4]}},  # a step repeated
        {"preempt_steps": {0: [1, 2, 4], 1: [1, 2, 4]}},  # a step lost
        {"preempt_resumed": {0: 0, 1: 0}},  # started over
        {"diff_preempted": 1e-3},
    ):
        changed = dict(r, **change)
        claim = claim_by_id(scaling_out.claims(changed), name)
        assert claim.status == report.FAILS, change


def test_lesson_08_hung_worker_claim_fails_when_a_wait_or_the_timeout_is_not_what_it_says():
    """Issue 21 (CommunicationOptions): the claim holds only when the step without a timeout lasted the whole stall
    and the step with one raised DeadlineExceededError about the timeout later, before the stall ended, exit code 3."""
    import copy

    from course_utils.lessons.scaling_out import multiworker

    assert scaling_out.COLLECTIVE_TIMEOUT_EXIT == multiworker.COLLECTIVE_TIMEOUT_EXIT
    assert scaling_out.PREEMPTED_EXIT == multiworker.PREEMPTED_EXIT
    name = "08.hung_worker_waits"
    r = _lesson_08_results(rounds=3, naive_s=1.0)
    assert claim_by_id(scaling_out.claims(r), name).status == report.HOLDS
    for run, change in (
        ("no timeout", {"step_s": [0.1, 0.01, 0.02, 0.01]}),  # nobody waited: no stall happened
        ("no timeout", {"error": "DeadlineExceededError", "failed_step": 3, "waited_s": 2.0, "step_s": [0.1, 0.01]}),
        (
            "timeout",
            {"error": None, "failed_step": None, "waited_s": None, "step_s": [0.1, 0.01, 4.0, 0.01], "message": None},
        ),  # the timeout did nothing
        ("timeout", {"failed_step": 1}),  # it fired at the first step (workers joined late)
        ("timeout", {"waited_s": 3.9}),  # it fired only as the stall ended
        ("timeout", {"waited_s": 1.0}),  # before the timeout
        ("timeout", {"error": "UnavailableError"}),
        ("timeout", {"message": "worker 0 exited with code 1; the other tasks were stopped"}),
    ):
        changed = copy.deepcopy(r)
        changed["stall"][run].update(change)
        claim = claim_by_id(scaling_out.claims(changed), name)
        assert claim.status == report.FAILS, (run, change)


def test_lesson_08_evaluation_claims_count_every_visit():
    import copy

    r = _lesson_08_results(rounds=3, naive_s=1.0)
    claims = scaling_out.claims(r)
    exact = claim_by_id(claims, "08.scheduled_evaluation_exact")
    per_worker = claim_by_id(claims, "08.per_worker_evaluation_repeats")
    assert exact.status == per_worker.status == report.HOLDS
    assert (
        "4 once, 0 more than once, 0 never" in exact.measured
        and "0 once, 2 more than once, 2 never" in per_worker.measured
    )
    for change in ({"visits": [1, 1, 2, 0]}, {"correct": 2}):  # an example twice, another never; a count off by one
        changed = copy.deepcopy(r)
        changed["ps"]["evaluation"]["one batch per step"].update(change)
        claim = claim_by_id(scaling_out.claims(changed), "08.scheduled_evaluation_exact")
        assert claim.status == report.FAILS, change
    changed = copy.deepcopy(r)
    changed["ps"]["evaluation"]["per-worker dataset"]["visits"] = [1, 1, 1, 1]  # one worker ran every step
    claim = claim_by_id(scaling_out.claims(changed), "08.per_worker_evaluation_repeats")
    assert claim.status == report.UNMEASURABLE and "exact by chance" in claim.note


def test_lesson_08_pipelining_on_one_core_is_not_measurable_and_on_two_it_is():
    """The two stages' workers pin themselves to a core each; with one usable core (taskset, prove --jobs 2 on 2
    cores) they take turns, and pipelining cannot overlap anything: that is no verdict on pipelining."""

    def pipelining_claim(stage_cores):
        results = _lesson_08_results(rounds=3, naive_s=1.0)
        name = next(n for n in results["mp"]["times_s"] if "micro-batches" in n)
        results["mp"]["times_s"][name] = [2.0, 2.0, 2.0]  # pipelined twice as slow as the naive split
        if stage_cores is not None:
            results["mp"]["stage_cores"] = stage_cores
        return claim_by_id(scaling_out.claims(results), "08.pipelining_beats_naive")

    one = pipelining_claim(1)
    assert one.status == report.UNMEASURABLE and "share one core" in one.note
    assert pipelining_claim(2).status == report.FAILS and pipelining_claim(None).status == report.FAILS
