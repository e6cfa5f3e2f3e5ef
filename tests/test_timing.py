"""Matmul throughput: the chain really runs N matmuls, the FLOPs are counted right, time grows with N,
and XLA follows the course config."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from course_utils import config, timing
from course_utils.lessons.tpu_initialization import experiments as tpu
from course_utils.report import Samples


def _numpy_chain(n: int, matmuls: int, seed: int = 0) -> float:
    x, b = (a.astype(np.float64) for a in timing.matmul_operands(n, seed=seed))
    for _ in range(matmuls):
        x = x @ b
    return float(x[0, 0])


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
def test_chain_runs_exactly_n_matmuls_and_returns_one_scalar(jit):
    import tensorflow as tf

    chain = timing.matmul_chain(jit)
    x, b = (tf.constant(a) for a in timing.matmul_operands(6, seed=1))
    for k in (1, 3, 5):
        out = chain(x, b, tf.constant(k))
        assert out.shape == ()  # the timer waits for one scalar, not an n×n copy
        assert out.numpy() == pytest.approx(_numpy_chain(6, k, seed=1), rel=1e-4)
    # the check can tell N from N-1: the values of neighbouring chain lengths differ
    assert abs(_numpy_chain(6, 5, seed=1) - _numpy_chain(6, 4, seed=1)) > 1e-2
    assert chain._jit_compile is jit


def test_flop_accounting_and_the_timed_result():
    rate = timing.matmul_tflops(32, "float32", repeats=3, jit=False, matmuls=7)
    assert (rate.n, rate.matmuls, len(rate.timing.times_s)) == (32, 7, 3)
    assert rate.flops_per_call == 2 * 32**3 * 7
    assert rate.samples.values == pytest.approx([2 * 32**3 * 7 / t / 1e12 for t in rate.timing.times_s])
    assert rate.tflops == pytest.approx(rate.samples.median)
    assert rate.result == pytest.approx(_numpy_chain(32, 7), rel=1e-4)  # what was timed is the 7-matmul chain


def test_time_grows_with_the_chain_length():
    """Four times the matmuls per call must take clearly longer: the loop is not dropped or cut short,
    and the timer waits for the work (a timer that measured only dispatch would see about 1×).
    Three interleaved rounds, the fastest call of each length: on CI's 2-vCPU VM, beside a notebook on the other
    worker, every call of one round can land in a slow window (one round read 1.96×)."""
    short_s, long_s = [], []
    for _ in range(3):
        short_s += timing.matmul_tflops(256, "float32", repeats=5, jit=False, matmuls=6).timing.times_s
        long_s += timing.matmul_tflops(256, "float32", repeats=5, jit=False, matmuls=24).timing.times_s
    ratio = min(long_s) / min(short_s)
    assert 2.0 < ratio < 8.0, ratio


def test_calibration_chains_at_least_two_matmuls():
    rate = timing.matmul_tflops(16, "float32", repeats=2, jit=False, target_s=0.01)
    assert rate.matmuls >= 2
    assert rate.result == pytest.approx(_numpy_chain(16, rate.matmuls), rel=1e-3)


@pytest.mark.parametrize("jit", [False, True])
def test_xla_follows_the_course_config(monkeypatch, jit):
    monkeypatch.setattr(config, "_CURRENT", dataclasses.replace(config.load({}), jit=jit))
    rate = timing.matmul_tflops(16, "float32", repeats=1, matmuls=2)
    assert rate.jit is jit
    assert rate.xla_label == ("with XLA" if jit else "without XLA")
    assert rate.xla_label in str(rate)


def test_compare_matmul_dtypes_interleaves_and_counts_bytes():
    out = tpu.compare_matmul_dtypes(32, repeats=3, jit=False, target_s=0.005)
    f32, bf16 = out["rates"]["float32"], out["rates"]["bfloat16"]
    assert f32.matmuls == bf16.matmuls == out["matmuls"] >= 2
    assert len(f32.timing.times_s) == len(bf16.timing.times_s) == 3
    assert out["bytes"] == {"float32": 32 * 32 * 4, "bfloat16": 32 * 32 * 2}
    assert f32.result == pytest.approx(_numpy_chain(32, out["matmuls"]), rel=1e-4)
    assert out["speed_vs_first"]["float32"].values == [1.0, 1.0, 1.0]
    expected = [a / b for a, b in zip(f32.timing.times_s, bf16.timing.times_s)]
    assert out["speed_vs_first"]["bfloat16"].values == pytest.approx(expected)


@pytest.mark.parametrize(
    "values, verdict",
    [([0.9, 1.0, 1.2], True), ([0.2, 0.3, 0.4], False), ([2.5, 3.0], False), ([0.4, 0.6, 0.7], "noise")],
)
def test_a_within_claim_decides_from_the_spread(values, verdict):
    assert Samples(values).within(0.5, 2.0) == verdict
    claim = tpu.bfloat16_speed_claim(Samples(values), "without XLA", "TPU", "")  # judged within its declared range
    assert claim.holds == verdict and tpu.CLAIMS.spec(claim.id).threshold == (0.5, 2.0)
