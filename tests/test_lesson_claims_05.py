"""Lesson 05 as claims data. Its 4-replica scenarios and its step peaks run once, in the notebook (README
``pytest``, smoke mode) and in ``prove``; no unit test runs them again (CONTRIBUTING.md §8). So the claims must be
as strict as the unit tests they replaced: here made-up results, right ones and each known way of being wrong, and
the verdict each must get."""

from __future__ import annotations

import copy

import pytest

from claims_helpers import claim_by_id as _claim, notebook_dict_keys

from course_utils import report
from course_utils.lessons.gradient_accumulation import experiments as exp
from course_utils.memory import PeakMemory

MIB = 2**20


def _peak(*mib):
    return PeakMemory(
        int(sorted(mib)[len(mib) // 2] * MIB),
        "tf.config.experimental.get_memory_info('CPU:0')",
        "CPU:0",
        samples=[int(m * MIB) for m in mib],
    )


def _run(where, policy, diff=1e-8, moved=0.05, updates=2):
    tolerance = exp.TOLERANCE[policy]
    result = {
        "max_abs_diff": {"fit": diff, "loop": diff},
        "updates_acc": {"fit": updates, "loop": updates},
        "updates_big": 2,
        "micro_steps": 8,
        "moved": moved,
        "replicas": 4,
        "steps": 4,
        "policy": policy,
    }
    return {
        "where": where,
        "policy": policy,
        "result": result,
        "within_tolerance": diff <= tolerance and moved > 20 * tolerance,
    }


def _results() -> dict:
    """Results as a correct run on 4 CPU replicas gives them (figures of a real smoke run)."""
    return dict(
        k=4,
        jit=False,
        replicas=4,
        kind="CPU",
        peaks={
            "1·B": _peak(10, 10.5, 11, 10, 10.2),
            "4·B": _peak(38, 40, 41, 39, 40),
            "4 × B accumulated": _peak(11, 11.5, 12, 11, 11.2),
        },
        sgd={"without /k": {"ratio": 4.0}, "with /k": {"diff": 1e-8}},
        adam_ratio=1.0,
        averaging={"diff_vs_fit_right": 0.0, "update_ratio": 4.0, "replicas": 4, "loss_right": 2.3, "loss_wrong": 9.2},
        builtin={"max_abs_diff": 1.5e-8},
        builtin_on_mirrored="RuntimeError (merge_call in Cond)",
        runs=[_run("1 replica", "float32"), _run("4 replicas", "float32"), _run("4 replicas", "mixed_bfloat16", 5e-5)],
        ragged={
            "replicas": 4,
            "dataset_unbatched_size": "… use .batch(n, drop_remainder=True) …",
            "arrays_dropped": {"updates": 3, "warning": "AccumulatingModel: dropping the last 20 of 404 examples"},
            "accumulator_ragged": "GradientAccumulator: a micro-batch of 35 examples, expected global_micro_batch=32",
        },
        bn={"updates": 1, "moving_mean_moved_acc": 0.0226, "moving_mean_moved_big": 0.0057, "trainable_diff": 1.4e-2},
        units={"Keras built-in": {"schedule_step": 8}, "AccumulatingModel": {"schedule_step": 2}},
        fp16={
            "mixed_float16, no loss scaling": {"vanished": 0.41},
            "mixed_float16 + LossScaleOptimizer": {"vanished": 0.0},
            "mixed_bfloat16": {"vanished": 0.0},
        },
        scaling={
            "replicas": 4,
            "accumulator": {"updates": 2, "max_abs_diff": 0.0, "moved": 0.05},
            "train_step": {"updates": 2, "max_abs_diff": 0.0},
            "overflow": {
                "applied": False,
                "iterations": 0,
                "scale_before": 32768.0,
                "scale_after": 16384.0,
                "replicas_unchanged": [True] * 4,
                "next_applied": True,
                "replicas_equal_after_next": True,
            },
            "overflow_fit": {
                "finite": True,
                "scale_before": 32768.0,
                "scale_after": 16384.0,
                "iterations": 0,
                "optimizer": "LossScaleOptimizer",
            },
            "keras": {
                how: {"finite": False, "scale_before": 32768.0, "scale_after": 32768.0, "iterations": 1}
                for how in ("custom_loop", "fit")
            },
        },
    )


def _verdict(results, claim_id):
    return _claim(exp.claims(results), claim_id).holds


def test_the_hand_made_results_of_lesson_05_have_the_notebooks_keys():
    assert notebook_dict_keys("05_gradient_accumulation.ipynb", "results") == set(_results())


def test_a_correct_run_holds_everywhere_and_every_claim_is_lesson_05():
    claims = exp.claims(_results())
    assert [c.id for c in claims if c.holds is not True] == []
    assert {c.lesson for c in claims} == {"05"} and len(claims) == 16


def _set(path, value):
    def change(r):
        target = r
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def _run_changed(index, **kwargs):
    def change(r):
        r["runs"][index] = _run(r["runs"][index]["where"], r["runs"][index]["policy"], **kwargs)

    return change


WRONG = {  # what a bug would produce -> the claim that must then read "does not hold"
    "bf16 4 replicas off by 1e-2": (_run_changed(2, diff=1e-2), "05.accumulation_equals_big_batch"),
    "weights never moved (equality proves nothing)": (_run_changed(1, moved=1e-5), "05.accumulation_equals_big_batch"),
    "one update too few": (_run_changed(1, updates=1), "05.iterations_count_updates"),
    "reduce_mean's loss not 4x": (_set(("averaging", "loss_wrong"), 2.3), "05.reduce_mean_per_replica"),
    "update 2x, not 4x": (_set(("averaging", "update_ratio"), 2.0), "05.reduce_mean_per_replica"),
    "ragged arrays without the warning": (
        _set(("ragged", "arrays_dropped", "warning"), ""),
        "05.ragged_batches_refused",
    ),
    "ragged micro-batch trained": (_set(("ragged", "accumulator_ragged"), "trained"), "05.ragged_batches_refused"),
    "overflow counted as an update": (
        _set(("scaling", "overflow", "iterations"), 1),
        "05.loss_scale_optimizer_in_tools",
    ),
    "one replica updated on overflow": (
        _set(("scaling", "overflow", "replicas_unchanged"), [True, True, True, False]),
        "05.loss_scale_optimizer_in_tools",
    ),
    "replicas differ after the next group": (
        _set(("scaling", "overflow", "replicas_equal_after_next"), False),
        "05.loss_scale_optimizer_in_tools",
    ),
    "loss-scaled loop never trained": (
        _set(("scaling", "accumulator", "moved"), 0.0),
        "05.loss_scale_optimizer_in_tools",
    ),
    "AccumulatingModel let another replica's overflow through": (
        _set(("scaling", "overflow_fit", "finite"), False),
        "05.loss_scale_optimizer_in_tools",
    ),
    "AccumulatingModel kept the scale on an overflow": (
        _set(("scaling", "overflow_fit", "scale_after"), 32768.0),
        "05.loss_scale_optimizer_in_tools",
    ),
    "accumulated step peaks like k·B (issue 8's unrolled loop under XLA)": (
        _set(("peaks", "4 × B accumulated"), _peak(37, 39, 40, 38, 39)),
        "05.accumulated_peak",
    ),
    "builtin ran under MirroredStrategy": (_set(("builtin_on_mirrored",), "ran"), "05.builtin_crashes_mirrored"),
    "Keras' own LossScaleOptimizer saw the other replica's overflow (a fixed Keras)": (
        _set(("scaling", "keras", "fit", "finite"), True),
        "05.keras_loss_scale_first_replica",
    ),
    "Keras' own LossScaleOptimizer lowered the scale": (
        _set(("scaling", "keras", "custom_loop", "scale_after"), 16384.0),
        "05.keras_loss_scale_first_replica",
    ),
}


def test_keras_loss_scaling_on_one_replica_or_another_strategy_is_not_measurable():
    results = copy.deepcopy(_results())
    results["scaling"]["keras"] = None  # keras_loss_scaling_overflow: not a MirroredStrategy with several replicas
    claim = _claim(exp.claims(results), "05.keras_loss_scale_first_replica")
    assert claim.holds is None and "≥ 2 replicas" in claim.note


@pytest.mark.parametrize("case", list(WRONG))
def test_each_known_bug_reads_does_not_hold(case):
    change, words = WRONG[case]
    results = copy.deepcopy(_results())
    assert _verdict(results, words) is True
    change(results)
    assert _verdict(results, words) is False, case


def test_no_peak_to_read_is_not_measurable_never_a_pass():
    results = _results()
    results["peaks"] = {label: PeakMemory(0, "none", "CPU:0") for label in results["peaks"]}
    claims = [c for c in exp.claims(results) if c.id in ("05.peak_grows_with_batch", "05.accumulated_peak")]
    assert len(claims) == 2 and all(
        c.holds is None and c.status == report.UNMEASURABLE and "no peak" in c.verdict for c in claims
    )


def test_smoke_modes_two_replicas_expect_twice_not_four_times():
    """Smoke mode measures the several-replica facts on sizes.replicas = 2: reduce_mean per replica is then 2x too
    large, and 2x holds there, 4x does not; on a one-replica runtime the note names the 2-CPU process."""
    results = copy.deepcopy(_results())
    results["replicas"] = 1
    results["averaging"].update(replicas=2, update_ratio=2.0, loss_wrong=4.6)
    claim = _claim(exp.claims(results), "05.reduce_mean_per_replica")
    assert (
        claim.holds is True
        and claim.expected.startswith("2.00× on 2 replicas")
        and "fresh 2-CPU process: this runtime has 1 replica(s)" in claim.note
    )
    results["averaging"].update(update_ratio=4.0, loss_wrong=9.2)
    assert _verdict(results, "05.reduce_mean_per_replica") is False
    results["averaging"].update(replicas=1, update_ratio=1.0, loss_wrong=2.3)  # one replica shows no error at all
    assert _verdict(results, "05.reduce_mean_per_replica") is False
    results["replicas"] = 4  # a runtime with more replicas (the 4-core TPU stand-in in smoke mode): said too
    results["averaging"].update(replicas=2, update_ratio=2.0, loss_wrong=4.6)
    claim = _claim(exp.claims(results), "05.reduce_mean_per_replica")
    assert claim.holds is True and "fresh 2-CPU process: this runtime has 4 replica(s)" in claim.note


def test_equivalence_runs_refuses_a_bfloat16_replica_count_it_does_not_run():
    with pytest.raises(ValueError, match="bf16_replicas must be 1 or replicas"):
        exp.equivalence_runs(None, replicas=2, bf16_replicas=4)
