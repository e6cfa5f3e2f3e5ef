"""Lessons 04 and 06 as claims data: the hand-made results these tests use have the keys the notebook's final cell
hands ``claims``, ``claims`` gives one claim per row of the lesson's table (every one marked with its lesson), its
verdicts follow the measurements, and a claim this hardware or size cannot show says why instead of passing.

The measurements themselves run in the notebooks, which ``python -m course_utils prove`` executes."""

from __future__ import annotations

import json
import os
import pathlib
import types

import pytest

from claims_helpers import Recording, claim_by_id, notebook_dict_keys

from course_utils import processes, report
from course_utils.lessons.cifar10_capstone import experiments as capstone_exp
from course_utils.lessons.data_pipeline_sharding import experiments as pipeline

ROOT = pathlib.Path(__file__).resolve().parents[1]


_find = claim_by_id


# ----------------------------------------------------------------------------------------------
# Lesson 04
# ----------------------------------------------------------------------------------------------


def _results_04(replicas: int = 4, kind: str = "CPU", **changes) -> dict:
    per_replica, n = 32, 5 * 32 * 4 + 32 // 2 + 3
    global_batch = per_replica * replicas

    def check(api, drop):
        missing = n % 128 if drop else 0
        return {
            "api": api,
            "drop_remainder": drop,
            "replicas": 4,
            "examples": n,
            "global_batch": 128,
            "missing": missing,
            "duplicated": 0,
            "exactly_once": not drop,
        }

    results = dict(
        replicas=replicas,
        kind=kind,
        xla_label="without XLA",
        N=4,
        same_spec=True,
        download_error="… set COURSE_DATA=synthetic, or npz:PATH …",
        pipeline_speedup=report.Samples([1.5, 1.6, 1.7]),
        order_frozen=True,
        order_fresh=True,
        per_replica_batch=per_replica,
        global_batch=global_batch,
        shuffle_mixing=[
            {"buffer": 10, "order left": 0.9995, "classes in the first batch": 1, "largest id in the first batch": 40},
            {"buffer": 100, "order left": 0.945, "classes in the first batch": 2, "largest id in the first batch": 125},
            {
                "buffer": 1000,
                "order left": -0.005,
                "classes in the first batch": 8,
                "largest id in the first batch": 990,
            },
        ],
        buffer_memory={
            pipeline.BUFFER_CASES[0]: {"measured": 3_145_000, "counted": 3_153_920},
            pipeline.BUFFER_CASES[1]: {"measured": 12_586_000, "counted": 12_591_104},
            pipeline.BUFFER_CASES[2]: {"measured": 1_000, "counted": 3_153_920},
        },
        read_speedups={"local files": [0.8, 0.9, 1.0], "bucket": [4.8, 5.0, 5.2]},
        nondeterministic_speedup=[1.3, 1.5, 1.9],
        order_moved=1020,
        fused_moved={"fused (default)": 0, "fusion off": 253},
        vectorized_speedup=[1.9, 2.2, 3.5],
        usable_cores=2,
        crops={pipeline.CROP_CASES[0]: 9, pipeline.CROP_CASES[1]: 1},
        profile_shares={pipeline.PROFILE_CASES[0]: 0.47, pipeline.PROFILE_CASES[1]: 0.012},
        profile_stalls={name: "" for name in pipeline.PROFILE_CASES},
        profile_step_ms={pipeline.PROFILE_CASES[0]: 98.0, pipeline.PROFILE_CASES[1]: 11.0},
        shape_rows=[
            {"API": api, "global batch": global_batch, "per-replica shapes": [[per_replica]] * replicas}
            for api in pipeline.APIS
        ],
        real_global=per_replica,
        n_examples=n,
        checks=[check(api, drop) for api in pipeline.APIS for drop in (False, True)],
        split=[
            {"examples": e, "distribute_datasets_from_function": p, "predicted (dealt in turn)": p}
            for e, p in ((n, [19, 0, 0, 0]), (680, [32, 8, 0, 0]), (740, [32, 32, 32, 4]))
        ],
        remainder_dealt=True,
        traces_static=[[128]],
        traces_ragged=[[128], [None]],
        summary={"FILE": {"duplicated": 0}, "DATA": {"duplicated": 0}, "OFF": {"duplicated": 128}},
        file_policy_failed=True,
        shuffle_rows=[
            {"case": c, "count": 128, "duplicated": d, "missing": d} for c, d in zip(pipeline.SHUFFLE_CASES, (38, 0, 0))
        ],
        upstream_rows=[
            {"case": c, "count": 64, "duplicated": d, "missing": d}
            for c, d in zip(pipeline.UPSTREAM_CASES, (17, 0, 0, 0))
        ],
        bottleneck="training step",
        bottleneck_ratio=1.9,
        steps_per_epoch=8,
        calls_expected=2,
        calls_per_epoch_n=2,
        spe_speedups={"tiny model": [1.2, 1.3, 1.4], "small CNN": [1.3, 1.5, 1.9]},
        spe_auto="TypeError",
        spe_mirrored={
            "replicas": 4,
            "outcome": "InvalidArgumentError",
            "error": "You must feed a value for placeholder",
            "where": "a fresh process with 4 CPU replicas",
        },
        several_mirrored=replicas > 1 and kind != "TPU",
        prefetch_sim=[1.2, 1.25, 1.3],
        prefetch_default=[1.0, 1.02, 1.04],
    )
    results.update(changes)
    return results


def test_lesson_04_claims_one_per_row_every_key_read():
    results = Recording(_results_04())
    claims = pipeline.claims(results)
    assert len(claims) == 27 and {c.lesson for c in claims} == {"04"}
    assert results.read == set(results), set(results) - results.read
    assert all(c.holds is True for c in claims), [c.verdict for c in claims if c.holds is not True]
    timed = [c for c in claims if c.samples is not None]
    assert len(timed) == 8 and all(len(c.samples) == 3 for c in timed)  # the repeats are kept


def test_the_hand_made_results_of_lesson_04_have_the_notebooks_keys():
    assert notebook_dict_keys("04_data_pipeline_sharding.ipynb", "results") == set(_results_04())


def test_lesson_04_verdicts_follow_the_measurements():
    failing = {
        "04.auto_shard_policies": dict(
            summary={"FILE": {"duplicated": 0}, "DATA": {"duplicated": 0}, "OFF": {"duplicated": 0}}
        ),
        "04.unseeded_shuffle_before_shard": dict(
            shuffle_rows=[{"case": c, "count": 128, "duplicated": 0, "missing": 0} for c in pipeline.SHUFFLE_CASES]
        ),
        "04.data_shard_after_unseeded_shuffle": dict(
            upstream_rows=[{"case": c, "count": 64, "duplicated": 0, "missing": 0} for c in pipeline.UPSTREAM_CASES]
        ),
        "04.spe_fails_on_mirrored": dict(
            spe_mirrored={
                "replicas": 4,
                "outcome": "fit ran",
                "error": "",
                "where": "a fresh process with 4 CPU replicas",
            }
        ),
        "04.spe_auto_fails": dict(spe_auto="fit ran"),
        "04.input_bound_check": dict(bottleneck="input pipeline"),
        "04.autotune_injects_prefetch": dict(prefetch_default=[1.5, 1.6, 1.7]),
        "04.interleave_overlaps_waits": dict(read_speedups={"local files": [1.0] * 3, "bucket": [0.9, 0.95, 0.97]}),
        "04.nondeterministic_interleave_faster": dict(nondeterministic_speedup=[0.8, 0.9, 0.95]),
        "04.nondeterministic_order": dict(fused_moved={"fused (default)": 30, "fusion off": 253}),
        "04.batch_before_map_faster": dict(vectorized_speedup=[0.7, 0.8, 0.9]),
        "04.small_shuffle_buffer": dict(
            shuffle_mixing=[  # a buffer of 1000 that left the order
                {
                    "buffer": 10,
                    "order left": 0.9995,
                    "classes in the first batch": 1,
                    "largest id in the first batch": 40,
                },
                {
                    "buffer": 1000,
                    "order left": 0.9,
                    "classes in the first batch": 2,
                    "largest id in the first batch": 90,
                },
            ]
        ),
        "04.shuffle_buffer_memory": dict(
            buffer_memory={  # float32 buffer as small as uint8's
                pipeline.BUFFER_CASES[0]: {"measured": 3_145_000, "counted": 3_153_920},
                pipeline.BUFFER_CASES[1]: {"measured": 3_145_000, "counted": 12_591_104},
                pipeline.BUFFER_CASES[2]: {"measured": 1_000, "counted": 3_153_920},
            }
        ),
        "04.batch_random_crop_one_offset": dict(crops={pipeline.CROP_CASES[0]: 1, pipeline.CROP_CASES[1]: 1}),
        "04.profile_shows_wait": dict(
            profile_shares={pipeline.PROFILE_CASES[0]: 0.05, pipeline.PROFILE_CASES[1]: 0.01}
        ),
    }
    for claim_id, change in failing.items():
        claim = _find(pipeline.claims(_results_04(**change)), claim_id)
        assert claim.holds is False and claim.fails, (claim_id, claim.verdict)
    # the same claim's second half: FILE sharding a shuffled file list loses and repeats files
    file_list_shuffled = [
        {"case": c, "count": 64, "duplicated": d, "missing": d} for c, d in zip(pipeline.UPSTREAM_CASES, (17, 0, 5, 0))
    ]
    claim = _find(
        pipeline.claims(_results_04(upstream_rows=file_list_shuffled)), "04.data_shard_after_unseeded_shuffle"
    )
    assert claim.holds is False and claim.fails, claim.verdict
    for order_moved, fused in (
        (0, {"fused (default)": 0, "fusion off": 253}),
        (1020, {"fused (default)": 0, "fusion off": 0}),
    ):
        claim = _find(
            pipeline.claims(_results_04(order_moved=order_moved, fused_moved=fused)), "04.nondeterministic_order"
        )
        assert claim.holds is False, (order_moved, fused)
    slower_than_memory = {pipeline.PROFILE_CASES[0]: 0.3, pipeline.PROFILE_CASES[1]: 0.4}
    assert (
        _find(pipeline.claims(_results_04(profile_shares=slower_than_memory)), "04.profile_shows_wait").holds is False
    )
    noisy = _find(
        pipeline.claims(_results_04(spe_speedups={"tiny model": [0.9, 1.2, 1.3], "small CNN": [1.3, 1.5, 1.9]})),
        "04.spe_faster_tiny_model",
    )
    assert noisy.holds == "noise"


def test_lesson_04_small_cnn_gain_of_about_1x_differs_every_time_it_is_measured_so():
    """Six proves of unchanged code on a 2-core CPU measured the small CNN's steps_per_execution gain at medians of
    1.01-1.08x, middle halves from 0.98x to 1.16x: tested against 1.0x the verdict flipped between holds and
    inconclusive. Against a clear gain (> 1.2x) each of those reads "differs on this hardware", with the reason."""
    measured = (
        [1.03, 1.05, 1.08, 1.12, 1.15],
        [1.05, 1.05, 1.06, 1.14, 1.16],
        [0.99, 0.99, 1.02, 1.05, 1.07],
        [0.98, 0.99, 1.01, 1.04, 1.07],
        [1.02, 1.02, 1.02, 1.03, 1.03],
        [1.02, 1.03, 1.04, 1.08, 1.10],
    )
    for samples in measured:
        claim = _find(
            pipeline.claims(_results_04(spe_speedups={"tiny model": [1.2, 1.3, 1.4], "small CNN": samples})),
            "04.spe_faster_small_cnn",
        )
        assert claim.holds is False and claim.status == report.DIFFERS and "about 1×" in claim.differs_here, samples
    assert {report.Samples(samples).compare(">", 1.0) for samples in measured} == {True, "noise"}  # the old coin flip
    straddles = _find(
        pipeline.claims(_results_04(spe_speedups={"tiny model": [1.2, 1.3, 1.4], "small CNN": [1.1, 1.25, 1.3]})),
        "04.spe_faster_small_cnn",
    )
    assert straddles.holds == "noise"
    assert _find(pipeline.claims(_results_04()), "04.spe_faster_small_cnn").holds is True  # 1.5x: a clear gain


def test_lesson_04_batch_before_map_slower_on_one_core_differs_there_and_fails_on_two():
    """Measured: on one usable core batch → map ran at 0.6-1.0x of map → batch (two tf.data steps taking turns), on
    two at 2x and more. Slower on one core is a stated hardware difference; slower on two is a real failure."""
    slower = [0.62, 0.64, 0.66]
    one = _find(pipeline.claims(_results_04(vectorized_speedup=slower, usable_cores=1)), "04.batch_before_map_faster")
    two = _find(pipeline.claims(_results_04(vectorized_speedup=slower, usable_cores=2)), "04.batch_before_map_faster")
    assert one.status == report.DIFFERS and "one usable core" in one.differs_here and not one.fails, one.verdict
    assert two.fails and not two.differs_here, two.verdict
    faster = _find(
        pipeline.claims(_results_04(vectorized_speedup=[1.2, 1.3, 1.4], usable_cores=1)), "04.batch_before_map_faster"
    )
    assert faster.holds is True, faster.verdict


def test_lesson_04_a_buffer_past_its_reach_or_copied_from_the_cache_does_not_hold():
    """§2's shuffle buffer: the k-th element out is one of the first k + buffer − 1 in, and over a filled in-memory
    cache the buffer only references the cache's tensors."""
    results = _results_04()
    beyond = [dict(row) for row in results["shuffle_mixing"]]
    beyond[0]["largest id in the first batch"] = 60  # > 32 + 10 − 2: not what a buffer of 10 can give
    assert _find(pipeline.claims(_results_04(shuffle_mixing=beyond)), "04.small_shuffle_buffer").holds is False
    copied = {**results["buffer_memory"], pipeline.BUFFER_CASES[2]: {"measured": 3_145_000, "counted": 3_153_920}}
    assert _find(pipeline.claims(_results_04(buffer_memory=copied)), "04.shuffle_buffer_memory").holds is False
    silent = {case: {"measured": None, "counted": 1} for case in pipeline.BUFFER_CASES}
    claim = _find(pipeline.claims(_results_04(buffer_memory=silent)), "04.shuffle_buffer_memory")
    assert claim.holds is None and "no statistics" in claim.note


def test_lesson_04_what_one_replica_or_an_accelerator_cannot_show_says_why():
    one = pipeline.claims(_results_04(replicas=1, real_global=32))
    for words in ("04.per_replica_batching_shrinks", "04.spe_fails_on_mirrored"):
        claim = _find(one, words)
        assert claim.holds is None and claim.note, claim.verdict
    tpu = _find(pipeline.claims(_results_04(kind="TPU", bottleneck="input pipeline")), "04.input_bound_check")
    assert tpu.holds is None and "accelerator" in tpu.note


def test_lesson_04_a_profile_whose_loop_paused_on_every_try_is_not_measurable():
    """The loop paused before the profiled steps: the slow pipeline filled its buffers and fed them, so the share
    (here 2%) says nothing about waiting — neither a false ❌ nor a ✅."""
    why = (
        "the training loop paused between two profiled steps in each of 3 profiled runs (812 ms in the last: a "
        "busy machine)"
    )
    stalls = {pipeline.PROFILE_CASES[0]: why, pipeline.PROFILE_CASES[1]: ""}
    for shares in (
        {pipeline.PROFILE_CASES[0]: 0.02, pipeline.PROFILE_CASES[1]: 0.01},
        {pipeline.PROFILE_CASES[0]: 0.47, pipeline.PROFILE_CASES[1]: 0.012},
    ):
        claim = _find(
            pipeline.claims(_results_04(profile_shares=shares, profile_stalls=stalls)), "04.profile_shows_wait"
        )
        assert claim.holds is None and why in claim.note and "fed from its buffers" in claim.note, claim.verdict
        assert "2% waiting" in claim.measured or "47% waiting" in claim.measured


def test_lesson_04_a_step_slower_than_the_buckets_read_is_not_measurable():
    """On one core of a 2-core AVX2 VM (Eigen kernels, full mode) the in-memory step took 120 ms and the bucket's
    batch of 128 waits 64 ms: the pipeline kept up, both read 0% waiting, and the claim said ❌ — a slow CPU, not a
    wrong lesson. A step just under the read is still measured."""
    read = pipeline.bucket_batch_ms(128)
    assert read == pytest.approx(8 * pipeline.BUCKET_REQUEST_S * 1e3)  # 128 records: 8 requests of 16
    shares = {pipeline.PROFILE_CASES[0]: 0.0, pipeline.PROFILE_CASES[1]: 0.0}
    slow = _find(
        pipeline.claims(
            _results_04(
                profile_shares=shares,
                profile_step_ms={pipeline.PROFILE_CASES[0]: 121.0, pipeline.PROFILE_CASES[1]: 120.0},
            )
        ),
        "04.profile_shows_wait",
    )
    assert slow.holds is None and "120 ms" in slow.note and f"{read:.0f} ms" in slow.note, slow.verdict
    fast = _find(
        pipeline.claims(
            _results_04(
                profile_shares=shares,
                profile_step_ms={pipeline.PROFILE_CASES[0]: 70.0, pipeline.PROFILE_CASES[1]: read - 1},
            )
        ),
        "04.profile_shows_wait",
    )
    assert fast.holds is False and not fast.note  # a fast step and no wait: a real ❌


# ----------------------------------------------------------------------------------------------
# Lesson 06
# ----------------------------------------------------------------------------------------------


def _summary(
    recipe, accuracy, epochs, steps, wall, before=2.0, final=0.5, no_tta=None, policy="float32", ips=900.0, jit=False
):
    return {
        "recipe": recipe,
        "test_accuracy": accuracy,
        "test_accuracy_no_tta": accuracy if no_tta is None else no_tta,
        "epochs": epochs,
        "steps_per_epoch": steps,
        "wall_time_s": wall,
        "time_before_first_epoch_s": before,
        "final_eval_s": final,
        "policy": policy,
        "images_per_s_per_replica": ips,
        "initially_planned_epochs": epochs,
        "jit_compile": jit,
        "xla": jit,
        "peak_memory_bytes": 50 << 20,
        "peak_memory_method": "allocator",
    }


def _resume(**changes) -> dict:
    """kill_and_resume's evidence from a run killed in epoch 2 with epoch 1 saved, resumed right."""
    return {
        "command": ["python", "-m", "course_utils.capstone"],
        "killed_returncode": -9,
        "finished_at_kill": 1,
        "backed_up_at_kill": 1,
        "returncode": 0,
        "last_line": "done",
        "resumed_after": 1,
        "epochs": [1, 2, 3],
        "first_epoch_kept": True,
        "time_counted": True,
        "plan_kept": True,
        **changes,
    }


def _results_06(smoke: bool = False, data: str = "npz:cifar10.npz", chosen: str = "mixed_bfloat16", **changes):
    if smoke:
        budget = 4.0
        summary = {
            "baseline": _summary("baseline", 0.14, 1, 16, 2.7, before=1.5, final=0.3),
            "course": _summary("course", 0.133, 1, 8, 4.7, before=3.5, final=0.8, no_tta=0.117, policy=chosen),
        }
        history = {"baseline": [{"epoch_time_s": 0.6}], "course": [{"epoch_time_s": 0.8}]}
    else:
        budget = 120.0
        summary = {
            "baseline": _summary("baseline", 0.53, 22, 63, 118.3),
            "course": _summary("course", 0.74, 22, 31, 125.0, no_tta=0.72, policy=chosen),
        }
        history = {
            "baseline": [{"epoch_time_s": 5.0, "elapsed_s": 108.0}, {"epoch_time_s": 5.3, "elapsed_s": 113.3}],
            "course": [{"epoch_time_s": 5.1, "elapsed_s": 117.0}, {"epoch_time_s": 6.0, "elapsed_s": 123.0}],
        }
    repeats = 1 if smoke else 3
    speeds = {"float32": (900.0, False), chosen: (1200.0, False), f"{chosen}, XLA on": (700.0, True)}
    precision = {
        label: [
            _summary("course", 0.3, 3, 10, 9.0, policy=label.split(",")[0], ips=ips + 10 * i, jit=jit)
            for i in range(repeats)
        ]
        for label, (ips, jit) in speeds.items()
    }
    sweep = {recipe: {budget: s} for recipe, s in summary.items()}
    if not smoke:  # two more budgets, the lead growing with the budget
        sweep["baseline"].update(
            {60.0: _summary("baseline", 0.52, 11, 63, 59.0), 240.0: _summary("baseline", 0.53, 44, 63, 239.0)}
        )
        sweep["course"].update(
            {
                60.0: _summary("course", 0.68, 20, 31, 60.0),  # 620 updates: ≥ LEAD_MIN_UPDATES
                240.0: _summary("course", 0.77, 44, 31, 240.0),
            }
        )
    results = dict(
        budget_s=budget,
        data=data,
        kind="CPU",
        summary=summary,
        history=history,
        precision=precision,
        resume=_resume(),
        sweep=sweep,
    )
    results.update(changes)
    return results


def test_lesson_06_claims_one_per_row_every_key_read():
    results = Recording(_results_06())
    claims = capstone_exp.claims(results)
    assert len(claims) == 9 and {c.lesson for c in claims} == {"06"}
    assert results.read == set(results), set(results) - results.read
    assert all(c.holds is True for c in claims), [c.verdict for c in claims if c.holds is not True]


def test_the_hand_made_results_of_lesson_06_have_the_notebooks_keys():
    notebook = notebook_dict_keys("06_cifar10_capstone.ipynb", "measured")  # `results` is §2's runs there
    assert notebook == set(_results_06())


def test_lesson_06_smoke_sizes_and_synthetic_images_say_why_they_cannot_show_a_claim():
    claims = capstone_exp.claims(_results_06(smoke=True, data="synthetic"))
    unmeasurable = [c for c in claims if c.holds is None]
    assert {c.id for c in unmeasurable} >= {"06.course_beats_tutorial", "06.tutorial_cnn_learns", "06.resnet_learns"}
    assert all(c.note for c in unmeasurable), [c.id for c in unmeasurable if not c.note]
    assert not any(c.fails for c in claims), [c.verdict for c in claims if c.fails]
    no_plan = _results_06(smoke=True)
    no_plan["summary"]["course"]["wall_time_s"] = 6.0  # 4 s budget, 0.8 s epoch: setting up took the rest
    no_room = _find(capstone_exp.claims(no_plan), "06.budget_kept")
    assert no_room.holds is None and "only the one epoch every run trains" in no_room.note
    only_float32 = _find(capstone_exp.claims(_results_06(chosen="float32")), "06.policy_faster_than_float32")
    assert only_float32.holds is None and only_float32.note  # not measurable, and says why
    for name in (
        "06.policy_faster_than_float32",
        "06.xla_choice_not_slower",
    ):  # one fresh process per variant: a ratio, never a verdict
        claim = _find(claims, name)
        assert claim.holds is None and "a speed-up needs repeats" in claim.note and "(1 run each)" in claim.measured
    tpu = _results_06()
    del tpu["precision"]["mixed_bfloat16, XLA on"]  # a TPU compiles every step: no XLA-off run
    tpu["kind"] = "TPU"
    assert "a TPU compiles every step" in _find(capstone_exp.claims(tpu), "06.xla_choice_not_slower").note


def test_lesson_06_sweep_claim_needs_the_lead_at_every_budget_on_real_images():
    claim = _find(capstone_exp.claims(_results_06()), "06.course_leads_15_points")
    assert claim.holds is True and claim.measured == "60 s: +16.0; 120 s: +21.0; 240 s: +24.0", claim.measured
    short = _results_06()
    short["sweep"]["course"][60.0]["test_accuracy"] = 0.66  # +14 at one budget of three
    assert _find(capstone_exp.claims(short), "06.course_leads_15_points").holds is False
    synthetic = _find(capstone_exp.claims(_results_06(data="synthetic")), "06.course_leads_15_points")
    assert synthetic.holds is None and "synthetic images" in synthetic.note
    few = _results_06()
    few["sweep"]["course"][60.0]["epochs"] = 2  # 62 updates: smoke-sized
    claim = _find(capstone_exp.claims(few), "06.course_leads_15_points")
    assert claim.holds is None and f"fewer than the {capstone_exp.LEAD_MIN_UPDATES} updates" in claim.note
    assert "60 s: 62" in claim.note, claim.note  # the updates each budget bought
    # a halved batch (capstone.small_batch) makes twice the updates of the same images: counted in updates of 128
    halved = _results_06()
    halved["sweep"]["course"][60.0].update(steps_per_epoch=62, per_replica_batch=64)  # 1,240 updates of 64: 620
    assert capstone_exp.updates_of_128(halved["sweep"]["course"][60.0]) == 620
    assert _find(capstone_exp.claims(halved), "06.course_leads_15_points").holds is True
    halved["sweep"]["course"][60.0]["epochs"] = 12  # 744 updates of 64: 372 of 128, below the threshold
    claim = _find(capstone_exp.claims(halved), "06.course_leads_15_points")
    assert claim.holds is None and "60 s: 372" in claim.note, claim.note
    slow = _results_06()  # the run's own budget bought too few updates for the 10-point claim: not measured to hold
    slow["summary"]["course"]["epochs"] = 5
    slow["summary"]["course"]["test_accuracy"] = 0.55
    beats = _find(capstone_exp.claims(slow), "06.course_beats_tutorial")
    assert (
        beats.holds is None
        and f"fewer than the {capstone_exp.LEAD_MIN_UPDATES} where the lead was measured to hold" in beats.note
    )
    slow["summary"]["course"].update(per_replica_batch=64, steps_per_epoch=62)  # 310 of 64: 155 of 128
    beats = _find(capstone_exp.claims(slow), "06.course_beats_tutorial")
    assert beats.holds is None and "in this budget: 155 (310 of 64), fewer than the" in beats.note, beats.note


def test_lesson_06_reference_sweep_is_what_the_readme_and_the_lesson_quote():
    """The development images' sweep (drawn in §2's figure, a panel per kernel path) and the lead tables in the README
    and in §2 are one set of figures: each table cell is the median of the reference runs, course vs baseline, and the
    lead their difference; and the lead claims' update threshold agrees with it: every cell where the course made
    LEAD_MIN_UPDATES or more led by LEAD_POINTS or more."""
    import statistics

    from course_utils import hardware

    root = pathlib.Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text(encoding="utf-8")
    lesson = "".join(
        "".join(c["source"])
        for c in json.loads((root / "notebooks" / "06_cifar10_capstone.ipynb").read_text(encoding="utf-8"))["cells"]
    )
    assert set(capstone_exp.DEV_SWEEP) == set(hardware.KERNEL_PATHS)
    cells = 0
    for path, by_cores in capstone_exp.DEV_SWEEP.items():
        for cores, runs in by_cores.items():
            for budget in sorted(runs["course"]):
                course = statistics.median(runs["course"][budget])
                updates = capstone_exp.DEV_SWEEP_UPDATES[path][cores][budget]
                if budget not in runs["baseline"]:  # the course alone (600 s): its median and updates
                    assert f"{course:.1f}%" in readme and f"{course:.1f}%" in lesson, (path, cores, budget)
                    continue
                base = statistics.median(runs["baseline"][budget])
                cell = f"{course:.1f}% vs {base:.1f}% ({course - base:+.1f})"
                assert cell in readme, (path, cores, budget, cell)
                assert cell.replace(" (", " (**").replace(")", "**)") + f" · {updates:,}" in lesson, (
                    path,
                    cores,
                    budget,
                    cell,
                )
                if updates >= capstone_exp.LEAD_MIN_UPDATES:
                    assert course - base >= capstone_exp.LEAD_POINTS, (path, cores, budget, updates)
                cells += 1
    assert cells >= 12  # three paths × two core counts × 60 and 120 s
    assert f"buys the ResNet {capstone_exp.LEAD_MIN_UPDATES} updates or more" in " ".join(lesson.split())
    assert f"tested from {capstone_exp.LEAD_MIN_UPDATES} updates" in " ".join(readme.split())


def test_lesson_06_sweep_figure_puts_this_run_in_its_kernel_paths_panel():
    """§2's figure: a panel per kernel path of the reference, its runs as thin lines (2 cores solid, one dashed); this
    run's stars only in the panel of the kernel path its summaries say it took, and in every panel when it took none
    (a GPU or TPU run: kernel_path None)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reference = {
        path: {
            2: {"baseline": {60: [50.0, 52.0, 51.0]}, "course": {60: [70.0, 71.0, 69.0]}},
            1: {"baseline": {60: [49.0]}, "course": {60: [66.0]}},
        }
        for path in ("onednn-bf16", "onednn-fp32", "eigen")
    }

    def run(path):
        return {
            recipe: {60.0: dict(_summary(recipe, acc, 10, 28, 60.0), kernel_path=path)}
            for recipe, acc in (("baseline", 0.5), ("course", 0.7))
        }

    def stars(fig):
        return [sum(1 for line in ax.get_lines() if line.get_marker() == "*") for ax in fig.axes]

    fig = capstone_exp.plot_sweep(run("eigen"), reference=reference)
    assert len(fig.axes) == 3 and stars(fig) == [0, 0, 2]
    assert fig.axes[2].get_title() == "eigen (this machine)" and fig.axes[0].get_title() == "onednn-bf16"
    styles = sorted({line.get_linestyle() for line in fig.axes[0].get_lines() if line.get_marker() == "."})
    assert styles == ["-", "--"]  # 2 cores and one
    assert stars(capstone_exp.plot_sweep(run(None), reference=reference)) == [2, 2, 2]
    assert stars(capstone_exp.plot_sweep(run("onednn-bf16"), reference=reference)) == [2, 0, 0]
    plt.close("all")


def test_lesson_06_budget_sweep_reuses_reads_back_resumes_and_trains(monkeypatch, tmp_path):
    from course_utils import capstone

    calls = []
    out = tmp_path / "sweep"

    def train(options):
        calls.append(options)
        if options.resume and options.out == str(out / "course-120s"):
            raise capstone.OptionsError(f"--resume: {options.out} was started with --data synthetic, not npz:x.npz")
        return types.SimpleNamespace(summary=_summary(options.recipe, 0.5, 2, 10, options.time_budget))

    def finished_run(folder, recipe, budget, data, accuracy):
        folder.mkdir(parents=True)
        summary = dict(
            _summary(recipe, accuracy, 9, 31, budget - 1),
            budget_s=budget,
            data=data,
            options={"recipe": recipe, "data": data, "time_budget": budget},
        )
        (folder / "summary.json").write_text(json.dumps(summary))

    monkeypatch.setattr(capstone, "train", train)
    finished_run(out / "course-60s", "course", 60.0, "npz:x.npz", 0.61)  # read back
    finished_run(out / "baseline-120s", "baseline", 120.0, "synthetic", 0.99)  # other data: trained again
    for started in (out / "baseline-240s", out / "course-120s"):  # killed mid-run: resumed, not restarted ...
        started.mkdir()
        (started / capstone.MARKER).write_text("{}")  # ... unless the trainer refuses to resume it
    done = {"course": {240.0: _summary("course", 0.7, 20, 31, 239.0)}}
    lines = []
    rows = capstone_exp.budget_sweep((240, 60, 120), str(out), done=done, data="npz:x.npz", progress=lines.append)
    assert [(o.recipe, o.time_budget, o.resume, o.overwrite) for o in calls] == [
        ("baseline", 60.0, False, True),
        ("baseline", 120.0, False, True),
        ("course", 120.0, True, False),
        ("course", 120.0, False, True),
        ("baseline", 240.0, True, False),
    ]
    assert all(o.out == str(out / f"{o.recipe}-{o.time_budget:g}s") and o.data == "npz:x.npz" for o in calls)
    assert rows["course"][60.0]["test_accuracy"] == 0.61 and rows["course"][240.0] is done["course"][240.0]
    assert rows["baseline"][120.0]["test_accuracy"] == 0.5  # not the other data's 0.99
    assert sorted(rows["baseline"]) == sorted(rows["course"]) == [60.0, 120.0, 240.0]
    assert lines == [
        "baseline recipe, 60 s budget",
        f"baseline recipe, 120 s budget (the run in {out / 'baseline-120s'} trained on 'synthetic': trained again)",
        "course recipe, 120 s budget (resumed)",
        f"course recipe, 120 s budget: not resumed (--resume: {out / 'course-120s'} was started with --data "
        "synthetic, not npz:x.npz): trained again",
        "baseline recipe, 240 s budget (resumed)",
    ]
    assert capstone_exp.sweep_leads(rows) == pytest.approx({60.0: 11.0, 120.0: 0.0, 240.0: 20.0})


def test_lesson_06_a_resume_that_started_over_does_not_hold():
    """Issue 21: a run killed after metrics.json listed epoch 1 but before the backup saved it starts over and
    still ends with epochs [1, 2, 3]; the trainer's own word (resumed after epoch 0) makes the claim fail."""
    started_over = _find(capstone_exp.claims(_results_06(resume=_resume(resumed_after=0))), "06.resume_after_kill")
    assert started_over.holds is False and started_over.fails and "after epoch 0" in started_over.measured
    for early in ({"backed_up_at_kill": 0}, {"killed_returncode": 0, "finished_at_kill": 3, "backed_up_at_kill": 3}):
        claim = _find(capstone_exp.claims(_results_06(resume=_resume(**early))), "06.resume_after_kill")
        assert claim.holds is None and "did not land inside epoch 2" in claim.note, early  # says why, never a pass


def test_lesson_06_tta_claim_is_not_measurable_when_the_budget_left_one_view():
    one_view = _results_06()
    one_view["summary"]["course"].update(tta_views=1, test_accuracy=0.72, test_accuracy_no_tta=0.72)
    claim = _find(capstone_exp.claims(one_view), "06.tta_does_not_hurt")
    assert claim.holds is None and "no time for a second test-time view" in claim.note
    hurt = _results_06()
    hurt["summary"]["course"].update(tta_views=2, test_accuracy=0.70, test_accuracy_no_tta=0.72)
    assert _find(capstone_exp.claims(hurt), "06.tta_does_not_hurt").holds is False


def test_lesson_06_verdicts_follow_the_measurements():
    behind = _results_06()
    behind["summary"]["course"]["test_accuracy"] = 0.55
    assert _find(capstone_exp.claims(behind), "06.course_beats_tutorial").holds is False
    for wrong in (
        {"epochs": [1, 3]},
        {"returncode": 1},
        {"first_epoch_kept": False},
        {"time_counted": False},
        {"plan_kept": False},
    ):
        assert (
            _find(capstone_exp.claims(_results_06(resume=_resume(**wrong))), "06.resume_after_kill").holds is False
        ), wrong
    late = _results_06()
    late["summary"]["baseline"].update(wall_time_s=140.0, trained_s=139.5)
    claim = _find(capstone_exp.claims(late), "06.budget_kept")
    assert claim.holds is False and "last epoch ended at 113.3 s, training at 139.5 s" in claim.measured
    # "one epoch" is the longest wall time between two epochs' ends: a stall between epochs counts in it
    stalled = _results_06()
    stalled["summary"]["baseline"]["wall_time_s"] = 127.0  # 7 s past the budget, every epoch ≤ 5.3 s on its own
    stalled["history"]["baseline"][1]["elapsed_s"] = 116.0  # but 8 s passed between the two epochs' ends
    claim = _find(capstone_exp.claims(stalled), "06.budget_kept")
    assert claim.holds is True and "baseline: 127.0 s (longest epoch 8.0 s)" in claim.measured
    assert "last epoch ended" not in claim.measured
    slower = _results_06()
    for run in slower["precision"]["mixed_bfloat16"]:
        run["images_per_s_per_replica"] = 700.0
    claim = _find(capstone_exp.claims(slower), "06.policy_faster_than_float32")
    assert claim.holds is False and claim.differs_here and not claim.fails  # a CPU: differs, with the reason
    assert len(claim.samples) == 3  # repeat by repeat, each pair from fresh processes
    xla_faster = _results_06()
    for run in xla_faster["precision"]["mixed_bfloat16, XLA on"]:
        run["images_per_s_per_replica"] = 1500.0
    claim = _find(capstone_exp.claims(xla_faster), "06.xla_choice_not_slower")
    assert claim.holds is False and claim.fails  # the trainer's default would be the wrong one here
    forced = _results_06()  # COURSE_JIT=1 (prove --jit): XLA on for every run, 0.53x as fast as off on a 2-core CPU
    forced["summary"]["course"].update(jit_compile=True, xla=True, xla_chosen_by="COURSE_JIT")
    for run in forced["precision"]["mixed_bfloat16"]:
        run["images_per_s_per_replica"] = 500.0
    claim = _find(capstone_exp.claims(forced), "06.xla_choice_not_slower")
    assert claim.holds is None and "COURSE_JIT=1 set XLA on for every run" in claim.note and "×" in claim.measured
    assert not claim.fails
    # float32 chosen (TensorFlow's own kernels): precision_variants gives two rows, float32 and float32 with XLA on;
    # the XLA claim compares them (it read "nothing to compare" while it looked for a third row)
    on_eigen = _results_06(chosen="float32")
    variants = capstone_exp.precision_variants(on_eigen["summary"]["course"], "CPU")
    assert list(variants) == ["float32", "float32, XLA on"]
    on_eigen["precision"] = {label: on_eigen["precision"][label] for label in variants}
    claim = _find(capstone_exp.claims(on_eigen), "06.xla_choice_not_slower")
    assert claim.holds is True and "median of 3" in claim.measured, claim
    # there XLA's compiled epochs ran faster (full mode: off at 0.77x of on): a slower default differs on Eigen, with
    # the reason, and fails on oneDNN's kernels
    for run in on_eigen["precision"]["float32, XLA on"]:
        run["images_per_s_per_replica"] = 1600.0  # float32 without XLA: 1,200-1,220 (0.75x)
    for path, differs in (("eigen", True), ("onednn-fp32", False)):
        on_eigen["summary"]["course"]["kernel_path"] = path
        claim = _find(capstone_exp.claims(on_eigen), "06.xla_choice_not_slower")
        assert claim.holds is False and claim.fails is not differs, (path, claim)
        assert ("try --jit" in claim.differs_here) is differs, (path, claim.differs_here)
    noisy = _results_06()
    for run, ips in zip(noisy["precision"]["mixed_bfloat16"], (1300.0, 1000.0, 800.0)):
        run["images_per_s_per_replica"] = ips
    assert _find(capstone_exp.claims(noisy), "06.policy_faster_than_float32").holds == "noise"


@pytest.mark.parametrize("jit", [False, True])
def test_lesson_06_policy_gain_of_about_1x_under_xla_on_a_cpu_differs_with_the_reason(jit):
    """Under XLA a CPU computes the bfloat16 convolutions in float32: proves measured 0.93-0.99x (spreads up to 1.03x),
    and against 1.0x the verdict flipped between differs and inconclusive. There a gain must exceed 1.1x; without XLA
    (1.11-1.29x measured) 1.0x stays the line."""
    results = _results_06()
    results["summary"]["course"].update(jit_compile=jit, xla=jit)
    for i, run in enumerate(results["precision"]["mixed_bfloat16"]):
        run["images_per_s_per_replica"] = 950.0 + 10 * i  # 1.05x float32's, repeat by repeat
    claim = _find(capstone_exp.claims(results), "06.policy_faster_than_float32")
    if jit:
        assert claim.status == report.DIFFERS and "float32" in claim.differs_here, claim.verdict
        assert f"> {report.NOTICEABLE_GAIN}×" in claim.expected
    else:
        assert claim.holds is True and claim.expected.startswith("> 1.0×"), claim.verdict
    tpu = _results_06(kind="TPU")
    tpu["summary"]["course"].update(jit_compile=True, xla=True)
    for i, run in enumerate(tpu["precision"]["mixed_bfloat16"]):
        run["images_per_s_per_replica"] = 950.0 + 10 * i
    assert _find(capstone_exp.claims(tpu), "06.policy_faster_than_float32").holds is True  # a TPU: 1.0x stays the line


def test_lesson_06_precision_variants_per_hardware():
    cpu = capstone_exp.precision_variants({"policy": "mixed_bfloat16", "jit_compile": False}, "CPU")
    assert cpu == {
        "float32": {"policy": "float32", "jit": False},
        "mixed_bfloat16": {"policy": "mixed_bfloat16", "jit": False},
        "mixed_bfloat16, XLA on": {"policy": "mixed_bfloat16", "jit": True},
    }
    gpu = capstone_exp.precision_variants({"policy": "mixed_float16", "jit_compile": True}, "GPU")
    assert list(gpu) == ["float32", "mixed_float16", "mixed_float16, XLA off"] and gpu["float32"]["jit"] is True
    assert list(capstone_exp.precision_variants({"policy": "mixed_bfloat16", "jit_compile": False}, "TPU")) == [
        "float32",
        "mixed_bfloat16",
    ]
    # several replicas (a multi-GPU box, CPU replicas): fit cannot be compiled (keras-team/keras#19005), no XLA row
    for kind in ("CPU", "multi-GPU"):
        assert list(
            capstone_exp.precision_variants({"policy": "mixed_bfloat16", "jit_compile": False, "replicas": 2}, kind)
        ) == ["float32", "mixed_bfloat16"]
    claim = capstone_exp._xla_choice_claim("CPU", False, "trainer", {}, "mixed_bfloat16", None, 1, replicas=4)
    assert claim.holds is None and "4 replicas: fit cannot be compiled with XLA there" in claim.note
    # smoke mode leaves the XLA run out (sizes.capstone_precision_xla = 0): no row, and the claim says why
    smoke = capstone_exp.precision_variants({"policy": "mixed_bfloat16", "jit_compile": False}, "CPU", False)
    assert list(smoke) == ["float32", "mixed_bfloat16"]
    claim = capstone_exp._xla_choice_claim("CPU", False, "trainer", {}, "mixed_bfloat16", None, 1)
    assert claim.holds is None and "no run with XLA on in this mode" in claim.note


def _spawning(cls, **extra):
    """A fake ``processes.start`` for §5's runs: ``cls(argv, **extra)``, argv as ``python -m`` would get it."""
    import subprocess
    import sys

    def start(argv, fork=False, **kwargs):
        assert fork and argv[:3] == [sys.executable, "-m", "course_utils.capstone"]
        # stdout discarded, stderr kept apart: its last line says why a run failed
        assert kwargs["stdout"] == subprocess.DEVNULL and kwargs["stderr"] == subprocess.PIPE
        return cls(list(argv), **extra)

    return start


def test_lesson_06_precision_runs_are_fresh_processes_taking_turns(monkeypatch, tmp_path):
    """Each repeat of each variant is its own command-line process; repeat i of every variant runs before repeat
    i + 1 of any, one process at a time (with one repeat, smoke mode, all at once); only the chosen policy's first run
    writes the profile; a failed run says which and why."""

    commands, alive, most = [], [], [0]

    class Process:
        def __init__(self, cli, stdout=None, stderr=None, text=None, returncode=0):
            commands.append(cli)
            alive.append(self)
            most[0] = max(most[0], len(alive))
            self.returncode, self.cli = returncode, cli

        def communicate(self, timeout=None):
            out = self.cli[self.cli.index("--out") + 1]
            os.makedirs(out)
            with open(os.path.join(out, "summary.json"), "w") as f:
                json.dump({"policy": self.cli[self.cli.index("--policy") + 1]}, f)
            alive.remove(self)
            return "", "x\nboom" if self.returncode else ""

        def poll(self):  # every fake run has ended once communicate() returned
            return None if self in alive else self.returncode

        def kill(self):
            alive.remove(self)
            self.returncode = -9

        def wait(self, timeout=None):
            return self.returncode

    monkeypatch.setattr(processes, "start", _spawning(Process))
    variants = capstone_exp.precision_variants({"policy": "mixed_bfloat16", "jit_compile": False}, "CPU")
    runs = capstone_exp.precision_runs("synthetic", variants, 2, 256, str(tmp_path / "p"), tensorboard="tb")
    assert [len(v) for v in runs.values()] == [2, 2, 2] and runs["float32"][1] == {"policy": "float32"}
    assert most[0] == 1  # timed: one process at a time
    flags = [(c[c.index("--policy") + 1], "--jit" in c) for c in commands]
    assert flags == [("float32", False), ("mixed_bfloat16", False), ("mixed_bfloat16", True)] * 2
    assert [("--tensorboard" in c) for c in commands] == [False, True, False, False, False, False]
    assert all(
        c[1:3] == ["-m", "course_utils.capstone"] and "--no-tta" in c and c[c.index("--epochs") + 1] == "3"
        for c in commands
    )
    most[0] = 0
    capstone_exp.precision_runs("synthetic", variants, 1, 256, str(tmp_path / "s"))
    assert most[0] == 3  # one repeat: no verdict to protect, the variants run at once

    monkeypatch.setattr(processes, "start", _spawning(Process, returncode=1))
    with pytest.raises(RuntimeError, match="§5 run 'float32' exited with 1: boom"):
        capstone_exp.precision_runs("synthetic", variants, 1, 256, str(tmp_path / "q"))
    assert alive == []  # the two variants started beside it were stopped


def test_lesson_06_precision_run_past_its_timeout_is_one_message_and_stops_the_others(monkeypatch, tmp_path):
    """Issue 21: a §5 run that hangs raised a raw TimeoutExpired after 900 s and left the other variants running
    (smoke mode starts them together). Now: one RuntimeError naming the run and the limit; every process stopped."""
    import subprocess

    procs = []

    class Hanging:
        def __init__(self, cli, **_kwargs):
            self.cli, self.returncode, self.killed = cli, None, False
            procs.append(self)

        def communicate(self, timeout=None):
            raise subprocess.TimeoutExpired(self.cli, timeout)

        def poll(self):
            return self.returncode

        def kill(self):
            self.killed, self.returncode = True, -9

        def wait(self, timeout=None):
            return self.returncode

    monkeypatch.setattr(processes, "start", _spawning(Hanging))
    variants = capstone_exp.precision_variants({"policy": "mixed_bfloat16", "jit_compile": False}, "CPU")
    with pytest.raises(RuntimeError, match=r"§5 run 'float32' did not finish within 0\.5 s and was stopped"):
        capstone_exp.precision_runs("synthetic", variants, 1, 256, str(tmp_path / "t"), timeout=0.5)
    assert len(procs) == 3 and all(p.killed for p in procs)


def test_lesson_04_a_steps_per_execution_check_that_hung_holds_with_the_reason():
    hung = {
        "replicas": 4,
        "outcome": "hung",
        "error": "no result in 15 s: the process was stopped",
        "where": "a fresh process with 4 CPU replicas",
    }
    claim = _find(pipeline.claims(_results_04(spe_mirrored=hung)), "04.spe_fails_on_mirrored")
    assert claim.holds is True and "hung" in claim.note and "hung" in claim.measured, claim.verdict
    failed = dict(hung, outcome="process failed", error="ImportError: no TensorFlow here")
    claim = _find(pipeline.claims(_results_04(spe_mirrored=failed)), "04.spe_fails_on_mirrored")
    assert claim.holds is False and claim.fails, claim.verdict  # a check that never ran proves nothing
    one = {"replicas": 1, "outcome": "fit ran", "error": "", "where": "this notebook's strategy"}
    claim = _find(
        pipeline.claims(_results_04(replicas=1, real_global=32, spe_mirrored=one)), "04.spe_fails_on_mirrored"
    )
    assert claim.holds is None and "2 replicas" in claim.note, claim.verdict
