"""Lessons 01 and 03 as claims data: the hand-made results these tests use have the keys the notebook's final cell
hands ``claims``, ``claims`` gives one claim per row of the lesson's table, and each verdict follows the
measurements (the notebooks, which ``prove`` executes, measure them for real)."""

from __future__ import annotations

import dataclasses
import json
import pathlib

from claims_helpers import Recording, claim_by_id, notebook_dict_keys

from course_utils import report
from course_utils.lessons.mixed_precision import experiments as precision
from course_utils.lessons.tpu_initialization import experiments as tpu_exp
from course_utils.memory import PeakMemory
from course_utils.timing import MatmulRate, Timing

ROOT = pathlib.Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------
# Lesson 01
# ----------------------------------------------------------------------------------------------


def _results_01(kind="CPU") -> dict:
    def rate(dtype, seconds):
        return MatmulRate(512, dtype, 10, False, "CPU:0", Timing(seconds, [seconds] * 3, seconds), 1.0)

    rates = {"float32": rate("float32", 0.02), "bfloat16": rate("bfloat16", 0.012)}
    return dict(
        kind=kind,
        strategy_name="OneDeviceStrategy",
        replicas=1,
        num_classes=10,
        standin="",
        matmul={
            "rates": rates,
            "speed_vs_first": {"float32": report.Samples([1.0] * 3), "bfloat16": report.Samples([1.6, 1.7, 1.8])},
            "bytes": {"float32": 512 * 512 * 4, "bfloat16": 512 * 512 * 2},
            "matmuls": 10,
        },
        recipes=[
            {"recipe": "grpc", "era": "node", "outcome": "raises KeyError: 'COLAB_TPU_ADDR'"},
            {"recipe": "none", "era": "node", "outcome": "raises ValueError: Please provide a TPU Name"},
            {"recipe": "local", "era": "vm", "outcome": "constructed; not connected"},
        ],
        demo_kind="CPU",
        demo_fallback="TPU did not connect — ConnectionError: simulated: no TPU answered at 'local'",
        test_acc=0.9,
        fit_xla="without XLA",
        per_replica_batch=32,
        split={"replicas": 4, "global_batch": 128, "per_replica_shapes": [[32, 32, 32, 3]] * 4},
        adam_outside="RuntimeError",
        sgd_outside="fit ran",
        model_c_uses_strategy=False,
        outside_scope_on_4="fit raised AssertionError: (no message)",
        xla_replicas={
            "replicas": 2,
            "kind": "CPU",
            "rule": [False, False],
            "rule_trained": True,
            "custom_loop_max_diff": 3e-8,
            "custom_loop_moved": 0.19,
            "where": "a fresh process with 2 CPU replicas",
            "jit_true": "InvalidArgumentError: Trying to access resource sequential/dense/kernel/replica_1/3 "
            "located in device CPU:1 from device CPU:0",
        },
    )


def test_lesson_01_claims_one_per_row_all_lesson_01():
    results, on_tpu = Recording(_results_01()), Recording(_results_01("TPU"), model_c_uses_strategy=True)
    claims = tpu_exp.claims(results)
    tpu_exp.claims(on_tpu)
    assert len(claims) == 11 and {c.lesson for c in claims} == {"01"}
    assert results.read | on_tpu.read == set(results), set(results) - results.read - on_tpu.read  # all used
    verdicts = [c.status for c in claims]
    assert verdicts[:2] == [report.UNMEASURABLE] * 2  # TPU claims on a CPU
    assert verdicts[2:9] + verdicts[10:] == [report.HOLDS] * 8
    assert verdicts[9] == report.UNMEASURABLE  # bfloat16's matmul speed: a TPU's and a GPU's claim
    wrong = tpu_exp.claims(dict(_results_01(), adam_outside="fit ran"))
    assert wrong[5].status == report.FAILS
    # XLA on several replicas: a Keras that trains with jit_compile=True, or a custom loop that moved apart, fails it
    for change in ({"jit_true": "trained"}, {"custom_loop_max_diff": 0.01}, {"rule": [True, True]}):
        bad = dict(_results_01(), xla_replicas=dict(_results_01()["xla_replicas"], **change))
        assert tpu_exp.claims(bad)[7].status == report.FAILS, change
    tpu_shaped = dict(
        _results_01("TPU"), xla_replicas=dict(_results_01()["xla_replicas"], rule=[False, True], kind="TPU")
    )
    assert tpu_exp.claims(tpu_shaped)[7].status == report.UNMEASURABLE


def test_lesson_01_tpu_claims_are_measured_on_a_tpu():
    claims = tpu_exp.claims(dict(_results_01("TPU"), strategy_name="TPUStrategy"))
    assert claims[0].status == report.HOLDS and claims[1].status == report.HOLDS
    assert "TPU" in claims[8].expected  # the TPU's own matmul rate, not the CPU's


def test_lesson_01_tpu_claims_on_a_stand_in_are_not_measurable():
    """A TPU stand-in (CPU devices answering as a TPU) runs the TPU's code paths, not its hardware: the TPUStrategy
    recipe and the TPU's matmul rate read "not measurable here", naming the stand-in; on a real TPU they are judged."""
    claims = tpu_exp.claims(dict(_results_01("TPU"), strategy_name="TPUStrategy (stand-in)", standin="tpu"))
    by_id = {c.id: c for c in claims}
    for claim_id in ("01.local_resolver_recipe", "01.tpu_faster_than_cpu", "01.old_recipes_fail"):
        assert by_id[claim_id].status == report.UNMEASURABLE, claim_id
    assert "stand-in" in by_id["01.tpu_faster_than_cpu"].note


def test_lesson_01_bfloat16_speed_is_judged_on_a_tpu_or_gpu_and_explained_on_a_cpu():
    """A CPU's bfloat16 ÷ float32 matmul ratio says what its instructions do (1.79x read "holds" on an AVX512-BF16
    CPU, by accident of the TPU's 0.5-2x range): on a CPU the claim is not measurable, its note says why the CPU did
    what it did; on a TPU the range is judged."""

    def speed_claim(kind, speeds, xla=False, standin=""):
        results = _results_01(kind)
        results["matmul"]["speed_vs_first"]["bfloat16"] = report.Samples(speeds)
        if xla:
            results["matmul"]["rates"]["bfloat16"] = dataclasses.replace(
                results["matmul"]["rates"]["bfloat16"], jit=True
            )
        return claim_by_id(tpu_exp.claims(dict(results, standin=standin)), "01.bfloat16_matmul_speed")

    fast, slow, same = (
        speed_claim("CPU", [1.7, 1.8, 1.9]),
        speed_claim("CPU", [0.4, 0.5, 0.45]),
        speed_claim("CPU", [0.95, 0.98, 0.99], xla=True),
    )
    for claim in (fast, slow, same):
        assert claim.status == report.UNMEASURABLE and claim.samples
    assert "AVX512-BF16" in fast.note and "software" in slow.note and "XLA" in same.note
    assert speed_claim("TPU", [0.9, 1.0, 1.1]).status == report.HOLDS
    assert speed_claim("TPU", [3.0, 3.2, 3.1]).status == report.FAILS
    stood_in = speed_claim("TPU", [1.7, 1.8, 1.9], standin="tpu")
    assert stood_in.status == report.UNMEASURABLE and "stand-in" in stood_in.note


def test_notebook_01_hands_claims_what_measure_returns():
    assert notebook_dict_keys("01_tpu_initialization.ipynb", "results") == set(_results_01())


def test_notebook_01_pitfall_2_is_the_code_prove_runs():
    """The notebook shows and runs the very program ``measure`` runs (``tpu_exp.OUTSIDE_SCOPE_ON_4``), not a copy."""
    nb = json.loads((ROOT / "notebooks" / "01_tpu_initialization.ipynb").read_text(encoding="utf-8"))
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "rt_lib.run_on_cpu_replicas(4, tpu_exp.OUTSIDE_SCOPE_ON_4)" in code
    assert "show_code(tpu_exp.OUTSIDE_SCOPE_ON_4)" in code
    assert "model.fit(np.zeros((16, 4))" not in code  # the program's text lives in course_utils only


def test_optimizer_outside_scope_records_what_fit_does():
    import keras
    import tensorflow as tf

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    assert tpu_exp.optimizer_outside_scope(strategy, keras.optimizers.Adam, 8) == "RuntimeError"
    assert tpu_exp.optimizer_outside_scope(strategy, keras.optimizers.SGD, 8) == "fit ran"


# ----------------------------------------------------------------------------------------------
# Lesson 03
# ----------------------------------------------------------------------------------------------


def _peaks(f32_mib=(100, 102, 101), mixed_mib=(60, 61, 59), method="fresh process") -> dict:
    def peak(mib):
        values = [int(m * 2**20) for m in mib]
        return PeakMemory(sorted(values)[len(values) // 2], method, "CPU:0", samples=values)

    return {"float32": peak(f32_mib), "mixed_bfloat16": peak(mixed_mib)}


def _results_03(**changes) -> dict:
    stat = dict(
        ones=0.17, zero_grad=1, loss_med=0.009, loss_max=7.0, grad_med=0.01, distinct=3, confident=1300, sum_err=0.003
    )
    stats = {
        "reference: float32 logits and softmax": dict(stat, ones=0.0, loss_med=0.0, loss_max=0.0, distinct=1286),
        "bfloat16 softmax": stat,
        "bfloat16 logits, float32 softmax": dict(stat, ones=0.0, loss_max=0.07, distinct=1286, sum_err=1e-7),
        "bfloat16 logits, from_logits=True": dict(stat, ones=0.0, loss_max=0.07, distinct=1286, sum_err=1e-7),
    }
    results = dict(
        kind="CPU",
        jit=False,
        hidden_dtypes=[("bfloat16", "float32")] * 6,
        stats=stats,
        loss_at_one_min=9.5e-7,
        zero_rows=1,
        zero_at_one=0.0014,
        zero_ref_loss=1.2e-7,
        same_as_logits=True,
        model_uses_logits=True,
        wrapped={
            "float32": "Adam",
            "mixed_bfloat16": "Adam",
            "mixed_float16": "LossScaleOptimizer(Adam)",
            precision.COMPILE_CASES[0]: "Adam",
            precision.COMPILE_CASES[1]: "Adam",
            precision.COMPILE_CASES[2]: "LossScaleOptimizer(Adam)",
        },
        zero_unscaled=1.0,
        zero_scaled=0.0,
        scaled_err=0.0006,
        upstream_zero=1.0,
        up32_median=8e-10,
        updates={"apply": 0.5, "apply_gradients": 0.5},
        mixed_policy="mixed_bfloat16",
        cpu_bf16=False,
        mem_batch=256,
        peaks=_peaks(),
        act_ratio=0.57,
        state_equal=True,
        xla_upcasts=False,
        speedup=report.Samples([0.5, 0.52, 0.48, 0.5, 0.51]),
        time_batch=32,
        step_xla="none",
    )
    results.update(changes)
    return results


def test_lesson_03_claims_one_per_row_all_lesson_03():
    results = Recording(_results_03())
    claims = precision.claims(results)
    assert len(claims) == 13 and {c.lesson for c in claims} == {"03"}
    assert results.read == set(results), set(results) - results.read
    assert [c.status for c in claims[:11]] == [report.HOLDS] * 11
    assert claims[11].status == report.DIFFERS and "software" in claims[11].differs_here  # slower on this CPU
    assert claims[12].status == report.UNMEASURABLE
    assert claims[10].samples and len(claims[10].samples) == 3  # from repeats: the samples are kept


def test_lesson_03_peak_claim_is_not_measurable_without_a_peak_never_a_pass():
    """The notebook passed [0.0] as the samples when the runtime reports no peak: '0.00× < 0.95' read 'holds'."""
    claim = precision.claims(_results_03(peaks=_peaks((0, 0, 0), (0, 0, 0))))[10]
    assert claim.status == report.UNMEASURABLE and "no peak memory" in claim.note


def test_lesson_03_peak_claim_under_xla_on_a_cpu_differs_with_the_reason():
    claims = precision.claims(_results_03(jit=True, xla_upcasts=True, peaks=_peaks(mixed_mib=(100, 101, 102))))
    assert claims[10].status == report.DIFFERS and "float32" in claims[10].differs_here
    assert "with XLA" in claims[10].note and "with XLA" in claims[11].note


def test_lesson_03_speed_under_xla_on_a_cpu_asks_for_a_noticeable_gain():
    """XLA on a CPU computes the bfloat16 convolutions in float32: proves measured 0.92-1.05x there, and against 1.0x
    the verdict flipped between differs and holds. Under that upcast a gain must exceed 1.1x; elsewhere 1.0x."""
    about_one = report.Samples([1.02, 1.03, 1.05, 1.05, 1.07])
    upcast = claim_by_id(
        precision.claims(_results_03(jit=True, xla_upcasts=True, cpu_bf16=True, speedup=about_one)),
        "03.policy_faster_on_accelerator",
    )
    assert upcast.status == report.DIFFERS and "computes the bfloat16 convolutions in float32" in upcast.differs_here
    assert f"tested at > {report.NOTICEABLE_GAIN}×" in upcast.expected
    gain = report.Samples([1.6, 1.7, 1.8, 1.8, 1.9])  # this CPU's bf16 instructions without XLA
    assert (
        claim_by_id(precision.claims(_results_03(cpu_bf16=True, speedup=gain)), "03.policy_faster_on_accelerator").holds
        is True
    )
    gpu = claim_by_id(
        precision.claims(_results_03(kind="GPU", jit=True, speedup=about_one)), "03.policy_faster_on_accelerator"
    )
    assert gpu.holds is True  # no upcast on a GPU: 1.0x stays the line


def test_lesson_03_compile_claim_fails_where_compile_would_wrap_a_per_layer_model_or_wrap_twice():
    """Issue 32: compile wraps only a model constructed under the global mixed_float16 policy, and never twice."""
    good = _results_03()["wrapped"]
    for case, other in (
        (precision.COMPILE_CASES[0], "LossScaleOptimizer(Adam)"),
        (precision.COMPILE_CASES[1], "LossScaleOptimizer(Adam)"),
        (precision.COMPILE_CASES[2], "LossScaleOptimizer(LossScaleOptimizer(Adam))"),
    ):
        claim = claim_by_id(
            precision.claims(_results_03(wrapped={**good, case: other})), "03.compile_wraps_loss_scale_optimizer"
        )
        assert claim.holds is False, case


def test_the_hand_made_results_of_lesson_03_have_the_notebooks_keys():
    assert notebook_dict_keys("03_mixed_precision.ipynb", "results") == set(_results_03())
