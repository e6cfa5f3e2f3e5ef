"""Tests of course_utils.memory: exact variable bytes, exact estimate terms, measured peaks that scale."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import psutil
import pytest

from course_utils import hardware, memory


pytestmark = pytest.mark.usefixtures("float32_policy")  # conftest.py


def _dense(policy="float32", units=1000, inputs=1000):
    import keras

    return keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(units, dtype=policy)])


def _mlp():
    import keras

    return keras.Sequential(
        [
            keras.Input((20,)),
            keras.layers.Dense(30, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(5),
            keras.layers.Activation("softmax", dtype="float32"),
        ]
    )


def test_dense_1000x1000_float32_vs_bfloat16_exact():
    f32 = memory.variable_bytes(_dense("float32"))
    bf16 = memory.variable_bytes(_dense("bfloat16"))
    assert f32.total == 4_004_000 and f32.by_dtype == {"float32": 4_004_000}
    assert bf16.total == 2_002_000 and bf16.by_dtype == {"bfloat16": 2_002_000}
    assert f32.count == bf16.count == 2
    mixed = memory.variable_bytes(_dense("mixed_bfloat16"))
    assert mixed.by_dtype == {"float32": 4_004_000}  # mixed precision keeps float32 variables


def test_variable_bytes_accepts_lists_layers_and_counts_shared_once():
    import keras
    import tensorflow as tf

    model = _dense(units=10, inputs=10)
    layer = model.layers[0]
    assert memory.variable_bytes(layer).total == 440
    assert memory.variable_bytes([layer.kernel, layer.kernel, layer.bias]).total == 440
    assert memory.variable_bytes(tf.Variable(tf.zeros((3, 3), tf.float16))).by_dtype == {"float16": 18}
    bn = keras.layers.BatchNormalization()
    bn.build((None, 7))  # gamma, beta trainable; moving mean/variance not: all count
    assert memory.variable_bytes(bn).total == 4 * 7 * 4


@pytest.mark.parametrize(
    "name, factory",
    [
        ("adam", lambda k: k.optimizers.Adam()),
        ("sgd", lambda k: k.optimizers.SGD()),
        ("sgd_momentum", lambda k: k.optimizers.SGD(momentum=0.9)),
        (None, lambda k: k.optimizers.Adam(amsgrad=True)),
        (None, lambda k: k.optimizers.RMSprop(momentum=0.5, centered=True)),
        (None, lambda k: k.optimizers.AdamW()),
    ],
)
def test_estimate_parameter_gradient_optimizer_terms_exact(name, factory):
    import keras

    model = _mlp()
    optimizer = factory(keras)
    est = memory.estimate_training_memory(model, 8, optimizer=name or optimizer)
    params = 20 * 30 + 30 + 4 * 30 + 30 * 5 + 5
    trainable = params - 2 * 30  # BatchNorm moving mean/variance are not trained
    assert est.parameters == params * 4
    assert est.gradients == trainable * 4
    optimizer.build(model.trainable_variables)  # the real optimizer state, counted by dtype
    assert est.optimizer_slots == memory.variable_bytes(optimizer.variables).total
    assert est.total == est.parameters + est.gradients + est.optimizer_slots + est.activations


def test_estimate_known_values_adam_and_sgd():
    model = _dense()
    adam = memory.estimate_training_memory(model, 32, optimizer="adam")
    sgd = memory.estimate_training_memory(model, 32, optimizer="sgd")
    assert (adam.parameters, adam.gradients, adam.optimizer_slots) == (4_004_000, 4_004_000, 8_008_000 + 12)
    assert (sgd.parameters, sgd.gradients, sgd.optimizer_slots) == (4_004_000, 4_004_000, 12)
    assert adam.activations == sgd.activations == 32 * (1000 + 1000) * 4  # input + Dense output
    text = str(adam)
    assert "parameters" in text and "optimizer slots" in text and "4,004,000" in text
    assert "| part |" in adam._repr_markdown_()


def test_estimate_under_policies():
    model = _mlp()
    f32 = memory.estimate_training_memory(model, 16, "adam")
    pure = memory.estimate_training_memory(model, 16, "adam", policy="bfloat16")
    mixed = memory.estimate_training_memory(model, 16, "adam", policy="mixed_bfloat16")
    # pure bf16: every float variable halves (the optimizer's own scalars do not)
    assert pure.parameters * 2 == f32.parameters and pure.gradients * 2 == f32.gradients
    assert pure.optimizer_slots - 12 == (f32.optimizer_slots - 12) // 2
    # mixed: variables, gradients, slots stay float32; layer outputs (not the input batch) halve
    assert (mixed.parameters, mixed.gradients, mixed.optimizer_slots) == (
        f32.parameters,
        f32.gradients,
        f32.optimizer_slots,
    )
    input_bytes = 16 * 20 * 4
    assert mixed.activations == input_bytes + (f32.activations - input_bytes) // 2
    assert mixed.variable_dtype == "float32" and mixed.compute_dtype == "bfloat16"


def test_estimate_of_a_model_built_under_mixed_policy_is_exact_per_layer():
    import keras

    keras.config.set_dtype_policy("mixed_bfloat16")
    model = _mlp()  # its softmax is explicitly float32
    keras.config.set_dtype_policy("float32")
    est = memory.estimate_training_memory(model, 16, "adam")
    assert est.policy == "mixed_bfloat16/float32 (as built)" and est.compute_dtype == "bfloat16/float32"
    input_bytes, softmax_bytes = 16 * 20 * 4, 16 * 5 * 4
    bf16_outputs = 16 * (30 + 30 + 5) * 2  # Dense, BatchNorm, Dense in bfloat16
    assert est.activations == input_bytes + bf16_outputs + softmax_bytes
    assert est.parameters == memory.variable_bytes(model).total
    assert memory.variable_bytes(model).by_dtype == {"float32": est.parameters}


def test_estimate_rejects_unknown_optimizer():
    with pytest.raises(ValueError, match="unknown optimizer"):
        memory.estimate_training_memory(_dense(units=2, inputs=2), 4, optimizer="lbfgs")


def _matmul_fn():
    import tensorflow as tf

    w = tf.random.normal((512, 512))

    @tf.function
    def fn(batch):
        x = tf.random.normal((batch, 512))
        return tf.reduce_sum(tf.nn.relu(x @ w) @ w)

    return fn


def test_measure_peak_larger_batch_larger_peak_names_method():
    fn = _matmul_fn()
    fn(64), fn(4096)  # trace both shapes first
    small = memory.measure_peak(fn, 64)
    large = memory.measure_peak(fn, 4096)
    assert large.peak_bytes > small.peak_bytes > 0
    assert large.method and large.method == small.method
    assert str(large).startswith("peak ") and large.method in str(large)
    assert large.result is not None
    if memory.default_device() == "CPU:0":
        import tensorflow.python.util._pywrap_util_port as port

        if port.IsMklEnabled():  # oneDNN on: the CPU allocator reports statistics
            assert large.method == memory.MEMORY_INFO and large.device == "CPU:0"
            # x, relu(x @ w) in float32: at least 2 × 4096 × 512 × 4 bytes
            assert large.peak_bytes >= 2 * 4096 * 512 * 4


def test_measure_peak_accepts_strategy_and_kwargs():
    import tensorflow as tf

    fn = _matmul_fn()
    fn(256)
    peak = memory.measure_peak(fn, batch=256, device=tf.distribute.OneDeviceStrategy("/cpu:0"))
    assert peak.device in ("CPU:0", "process (asked for CPU:0)") and peak.peak_bytes > 0


def test_measure_peak_falls_back_to_rss_when_allocator_is_silent():
    code = (
        "from course_utils import memory\n"
        "import numpy as np, tensorflow as tf\n"
        "fn = lambda n: tf.constant(np.ones((n, 1024), np.float32)) * 2.0\n"
        "p = memory.measure_peak(fn, 64 * 1024)\n"  # 256 MiB
        "print(p.method, '|', p.peak_bytes)\n"
    )
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    method, peak = out.stdout.strip().splitlines()[-1].split(" | ")
    if method == memory.MEMORY_INFO:
        pytest.skip("this CPU build reports allocator statistics even without oneDNN")
    assert method.startswith("process peak RSS growth")
    assert int(peak) > 200 * 2**20


def test_format_bytes():
    assert memory.format_bytes(512) == "512 B"
    assert memory.format_bytes(1536) == "1.5 KiB"
    assert memory.format_bytes(3 * 2**20) == "3.0 MiB"


@pytest.mark.parametrize(
    "kind, cc, policy",
    [
        ("TPU", None, "mixed_bfloat16"),
        ("CPU", None, "mixed_bfloat16"),
        ("GPU", (7, 5), "mixed_float16"),  # T4 (Colab's free GPU)
        ("GPU", (7, 0), "mixed_float16"),  # V100
        ("GPU", (8, 0), "mixed_bfloat16"),  # A100
        ("multi-GPU", (9, 0), "mixed_bfloat16"),  # H100
        ("GPU", (8, 9), "mixed_bfloat16"),  # L4
    ],
)
def test_recommended_policy(kind, cc, policy):
    chosen, why = hardware.recommended_policy(kind, gpu_compute_capability=cc)
    assert chosen == policy and why
    if cc is not None:
        assert f"{cc[0]}.{cc[1]}" in why


def test_recommended_policy_unknown_gpu_and_runtime_objects(monkeypatch):
    import types

    monkeypatch.setattr(hardware, "detect_gpu_compute_capability", lambda gpu=None: None)
    chosen, why = hardware.recommended_policy("GPU")
    assert chosen == "mixed_float16" and "unknown" in why
    monkeypatch.setattr(hardware, "detect_gpu_compute_capability", lambda gpu=None: (8, 6))
    assert hardware.recommended_policy(types.SimpleNamespace(kind="GPU"))[0] == "mixed_bfloat16"
    assert hardware.recommended_policy(types.SimpleNamespace(kind="TPU"))[0] == "mixed_bfloat16"
    with pytest.raises(ValueError, match="unknown runtime kind"):
        hardware.recommended_policy("IPU")


def test_detect_gpu_compute_capability_is_none_without_gpu():
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        assert hardware.detect_gpu_compute_capability() is None


_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) CPU
flags\t\t: fpu vme sse sse2 avx avx2 avx512f {extra}

processor\t: 1
flags\t\t: fpu vme sse sse2 avx avx2 avx512f {extra}
"""


def test_cpu_bf16_support_from_fake_cpuinfo():
    assert hardware.cpu_bf16_support(_CPUINFO.format(extra="")) == (False, [])
    assert hardware.cpu_bf16_support(_CPUINFO.format(extra="avx512_bf16")) == (True, ["avx512_bf16"])
    assert hardware.cpu_bf16_support(_CPUINFO.format(extra="amx_tile amx_bf16 avx512_bf16")) == (
        True,
        ["avx512_bf16", "amx_bf16"],
    )
    assert hardware.cpu_bf16_support("no flags here") == (None, [])
    supported, found = hardware.cpu_bf16_support()  # this machine: any answer, consistent
    assert supported in (True, False, None) and (supported is True) == bool(found)


def test_build_under_policy_builds_in_scope_and_restores_the_policy():
    import keras
    import tensorflow as tf

    from course_utils import models

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    model = models.build_under_policy("bfloat16", strategy=strategy, num_classes=10, width=4)
    assert {w.dtype for w in model.weights} == {"bfloat16"}
    assert all(strategy.extended.variable_created_in_scope(w.value) for w in model.weights)
    assert keras.config.dtype_policy().name == "float32"

    def broken():
        raise ValueError("builder failed")

    with pytest.raises(ValueError, match="builder failed"):
        models.build_under_policy("mixed_bfloat16", broken)
    assert keras.config.dtype_policy().name == "float32"  # restored even when the builder raises


# ----------------------------------------------------------------------------------------------
# Peak memory in a fresh process
# ----------------------------------------------------------------------------------------------

MIB = 2**20


def allocating_step(mib: int):
    """A step whose only large tensor is ``mib`` MiB of float32 (module-level: fresh processes import it)."""
    import tensorflow as tf

    n = mib * MIB // 4
    return tf.function(lambda: tf.reduce_sum(tf.random.uniform([n])))


def holding_step(mib: int):
    """A step over a ``mib`` MiB float32 variable that lives as long as the step does."""
    import tensorflow as tf

    v = tf.Variable(tf.zeros([mib * MIB // 4]))
    return tf.function(lambda: tf.reduce_sum(v))


def failing_step(mib: int):
    raise ValueError(f"cannot build a {mib} MiB step")


def test_isolated_peak_is_the_steps_own_size_in_fresh_processes():
    peaks = memory.measure_peaks_isolated(
        allocating_step, {"40 MiB": {"mib": 40}, "100 MiB": {"mib": 100}}, repeats=2, fresh_process=True
    )
    assert list(peaks) == ["40 MiB", "100 MiB"]  # the order asked for
    for label, mib in (("40 MiB", 40), ("100 MiB", 100)):
        p = peaks[label]
        assert len(p.samples) == 2 and p.peak_bytes == int(sum(p.samples) / 2)  # the median of two
        assert "fresh process" in p.method and "1024 MiB reserved" in p.method
        if p.method.startswith(memory.MEMORY_INFO):
            # exact: the tensor plus at most 1 MiB of small buffers, not a power-of-two region (64, 128 MiB)
            assert mib * MIB <= p.peak_bytes <= (mib + 1) * MIB, (label, p.samples)
        else:  # an allocator without statistics: resident-memory growth, coarser
            assert p.peak_bytes >= 0.8 * mib * MIB


def test_isolated_without_reserve_shows_the_region_rounding_it_avoids():
    unreserved = memory.measure_peak_isolated(allocating_step, repeats=1, reserve_mib=0, fresh_process=True, mib=40)
    if not unreserved.method.startswith(memory.MEMORY_INFO):
        pytest.skip("this allocator reports no statistics")
    # TensorFlow's BFC allocator grows in power-of-two regions and does not split a free chunk for a request
    # of more than half of it: 40 MiB is counted as the 64 MiB region it landed in.
    assert unreserved.peak_bytes >= 64 * MIB and "reserved" not in unreserved.method


def test_isolated_in_this_process_and_errors():
    here = memory.measure_peaks_isolated(allocating_step, {"a": {"mib": 8}}, repeats=3, fresh_process=False)["a"]
    assert len(here.samples) == 3 and here.peak_bytes >= 8 * MIB * 0.8 and "in this process" in here.method
    with pytest.raises(TypeError, match="module-level"):
        memory.measure_peaks_isolated(lambda mib: None, {"a": {"mib": 1}})
    with pytest.raises(RuntimeError, match="cannot build a 3 MiB step"):
        memory.measure_peak_isolated(failing_step, repeats=1, fresh_process=True, mib=3)


def hanging_step(seconds: float):
    time.sleep(seconds)  # builds nothing for this long: the caller's timeout must stop it


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "from scratch"])
def test_isolated_peaks_and_time_ratios_forked_or_not(fork):
    """Both ways give the step's own peak; the 100 MiB step takes longer than the 20 MiB one it is timed against."""
    got = memory.measure_isolated(
        allocating_step,
        {"20 MiB": {"mib": 20}, "100 MiB": {"mib": 100}},
        repeats=1,
        fork=fork,
        fresh_process=True,
        time_rounds=5,
        time_repeats=3,
        time_baseline="20 MiB",
    )
    assert ("forked" in got.peaks["20 MiB"].method) == fork
    if got.peaks["20 MiB"].method.startswith(memory.MEMORY_INFO):
        for label, mib in (("20 MiB", 20), ("100 MiB", 100)):
            assert mib * MIB <= got.peaks[label].peak_bytes <= (mib + 1) * MIB, (label, got.peaks[label].samples)
    # five rounds, against a step 5× smaller (measured 4.3-4.9×): the median survives two noisy rounds
    # (CI once got 1.66 and 1.04 from two rounds of 100 vs 40 MiB: median 1.35)
    assert list(got.time_ratios) == ["100 MiB"] and len(got.time_ratios["100 MiB"].values) == 5
    assert got.time_ratios["100 MiB"].median > 1.5, got.time_ratios  # 5× the random numbers to draw and sum
    assert len(got.baseline_seconds[""]) == 5 and all(t > 0 for t in got.baseline_seconds[""])
    assert got.timed == ("in the measuring processes, one at a time" if fork else "in this process, steps built again")


def test_forking_process_is_reused_survives_a_failing_step_and_stops():
    if not sys.platform.startswith("linux"):
        pytest.skip("forking is used on Linux only")
    memory.measure_peaks_isolated(allocating_step, {"a": {"mib": 4}}, repeats=1, fresh_process=True)
    pid = memory._forker.proc.pid
    with pytest.raises(RuntimeError, match="cannot build a 3 MiB step"):
        memory.measure_peak_isolated(failing_step, repeats=1, fresh_process=True, mib=3)
    memory.measure_peaks_isolated(allocating_step, {"a": {"mib": 4}}, repeats=1, fresh_process=True)
    assert memory._forker.proc.pid == pid  # one TensorFlow import served all three
    assert memory.stop_measuring_process()
    assert not psutil.pid_exists(pid)  # killed and reaped
    assert not memory.stop_measuring_process()  # nothing left to stop


def slow_step(mib: int, seconds: float):
    """allocating_step, built only after ``seconds``: still building when a faster sibling has failed."""
    time.sleep(seconds)
    return allocating_step(mib)


@pytest.mark.extended  # a 5 s race scenario: .ci/run
def test_a_failing_step_beside_one_still_building_reports_its_error_and_leaves_the_helper_clean():
    """The failing variant's error comes back at once; its sibling, still building, exits instead of carrying on
    as a copy of the forking process (it would then hang the call until the timeout)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("forking is used on Linux only")
    memory.stop_measuring_process()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="cannot build a 3 MiB step"):
        memory.measure_isolated(failing_step, {"fails": {"mib": 3}}, fresh_process=True, repeats=1)  # warm helper
    with pytest.raises(RuntimeError, match="cannot build a 3 MiB step"):
        memory.measure_isolated(
            _either_step,
            {"fails": {"mib": 3, "seconds": -1}, "slow": {"mib": 4, "seconds": 1}},
            fresh_process=True,
            repeats=1,
            parallel=2,
            timeout=30,
        )
    assert time.monotonic() - t0 < 25
    helper = psutil.Process(memory._forker.proc.pid)
    time.sleep(2)  # the slow sibling (1 s) has finished building and met the closed pipe
    assert [p for p in helper.children(recursive=True) if not _is_zombie(p.pid)] == []
    ok = memory.measure_peaks_isolated(allocating_step, {"a": {"mib": 4}}, repeats=1, fresh_process=True, timeout=30)
    assert memory._forker.proc.pid == helper.pid and ok["a"].peak_bytes > 0
    memory.stop_measuring_process()


def _either_step(mib: int, seconds: float):
    """failing_step when ``seconds`` < 0, else slow_step."""
    return failing_step(mib) if seconds < 0 else slow_step(mib, seconds)


def _is_zombie(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "from scratch"])
def test_isolated_timeout_stops_every_process(fork):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    kept = memory._forker  # a forking process an earlier test in this worker left (or None)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="took longer than 2 s"):
        memory.measure_peak_isolated(hanging_step, repeats=1, fresh_process=True, timeout=2, fork=fork, seconds=120)
    assert time.monotonic() - t0 < 60
    time.sleep(0.5)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and not _is_zombie(p.pid)]
    assert not left, left
    # forked: the forking process (it hung in its child) is stopped; from scratch: it was not involved
    assert memory._forker is (None if fork else kept)


def test_isolated_in_this_process_times_after_the_peaks():
    """On a TPU/GPU the steps are measured here; the timed ones are built again afterwards, so no model is alive
    while another's peak is measured: the second peak is the 20 MiB step's own, not 20 + 100 MiB."""
    got = memory.measure_isolated(
        holding_step,
        {"100 MiB": {"mib": 100}, "20 MiB": {"mib": 20}},
        repeats=1,
        fresh_process=False,
        time_rounds=5,
        time_repeats=3,
        time_baseline="20 MiB",
    )
    assert "in this process" in got.peaks["20 MiB"].method
    if got.peaks["20 MiB"].method.startswith(memory.MEMORY_INFO):
        assert got.peaks["20 MiB"].peak_bytes < 100 * MIB, got.peaks["20 MiB"].samples
    # 5× the floats to sum (measured 4.9-5.3×); the median of five rounds (CI once got 1.66 and 1.04 from two
    # rounds of 100 vs 40 MiB: median 1.35)
    assert got.time_ratios["100 MiB"].median > 1.5, got.time_ratios
    assert len(got.time_ratios["100 MiB"].values) == 5 and got.timed == "in this process, steps built again"


def test_isolated_bad_timing_arguments():
    with pytest.raises(ValueError, match="time_baseline must be one of"):
        memory.measure_isolated(allocating_step, {"a": {"mib": 1}}, time_rounds=1, time_baseline="b")
    with pytest.raises(ValueError, match="names no variant"):
        memory.measure_isolated(allocating_step, {"a": {"mib": 1}}, time_rounds=1, time_baseline="a", time_labels=["c"])
    with pytest.raises(TypeError, match="must be JSON-able"):
        memory.measure_isolated(allocating_step, {"a": {"mib": object()}})


def test_a_module_that_runs_an_op_at_import_is_refused(tmp_path, monkeypatch):
    if not sys.platform.startswith("linux"):
        pytest.skip("forking is used on Linux only")
    (tmp_path / "eager_at_import.py").write_text(
        "import tensorflow as tf\nONE = tf.constant(1.0)  # an op at import time\n\n"
        "def make_step(mib):\n    return tf.function(lambda: ONE * mib)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import eager_at_import

    with pytest.raises(RuntimeError, match="ran a TensorFlow op"):
        memory.measure_peak_isolated(eager_at_import.make_step, repeats=1, fresh_process=True, mib=1)
    # the forking process went away rather than fork from a TensorFlow that has threads; the next call starts one
    assert memory.measure_peak_isolated(allocating_step, repeats=1, fresh_process=True, mib=4).peak_bytes > 0


def test_tensorflow_has_run_an_op_reads_the_eager_context_in_a_fresh_process():
    """The fork-based measurements rely on TensorFlow's private eager-context flag (processes.tensorflow_has_run_an_op):
    False after importing TensorFlow, True once an op ran. A release that changes it fails here, loudly."""
    code = (
        "import tensorflow as tf\nfrom course_utils import processes\nbefore = processes.tensorflow_has_run_an_op()\n"
        "tf.constant(1) + 1\nprint(before, processes.tensorflow_has_run_an_op())"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "True"], proc.stdout


def test_peaks_from_several_processes_pool_every_reading():
    from course_utils.lessons.bfloat16_conversion import experiments as conversion

    peaks = memory.measure_peaks_isolated(
        conversion.forward_step, {"f32": dict(policy="float32", width=8, batch=16)}, repeats=2, processes=3
    )
    assert list(peaks) == ["f32"]
    assert len(peaks["f32"].samples) == 6  # 3 processes × 2 readings
    assert peaks["f32"].peak_bytes == int(statistics.median(peaks["f32"].samples))
    assert peaks["f32"].method.startswith("tf.config.experimental.get_memory_info")


def interop_checking_step(mib: int, expected: str):
    """allocating_step, built only where the measuring process has TensorFlow's inter-op pool set as expected."""
    import os

    got = os.environ.get("TF_NUM_INTEROP_THREADS")
    if got != expected:
        raise RuntimeError(f"TF_NUM_INTEROP_THREADS={got!r} in the measuring process, expected {expected!r}")
    return allocating_step(mib)


def test_measuring_processes_get_an_explicit_inter_op_pool(monkeypatch):
    """On one core TensorFlow's default pool let the executor's op order differ between processes (lesson 07's
    recomputed step: 4-11% saved in 3 of 5 processes, 35-40% in the others); an explicit pool made it 20-41% in all."""
    from course_utils import processes

    monkeypatch.delenv("TF_NUM_INTEROP_THREADS", raising=False)
    memory.stop_measuring_process()  # a helper started before this test has its own environment
    expected = str(processes.interop_threads())
    got = memory.measure_peaks_isolated(
        interop_checking_step, {"a": {"mib": 2, "expected": expected}}, repeats=1, fresh_process=True, timeout=60
    )
    assert got["a"].peak_bytes > 0
    memory.stop_measuring_process()


_BUILT: list = []


def recording_step(mib: int):
    """:func:`allocating_step`, recording the order in which the variants were built."""
    _BUILT.append(mib)
    return allocating_step(mib)


def test_isolated_in_this_process_measures_both_orders_and_pools_them():
    """Issue 32: in one process a step's peak depends on what ran before it, and a fixed order (the first variant on a
    clean allocator) biases the comparison. In this process (a TPU or GPU's path, forced here on the CPU) the variants
    are measured first to last, then last to first; each variant's readings from both passes are pooled, and the
    method names both passes' medians."""
    _BUILT.clear()
    peaks = memory.measure_peaks_isolated(
        recording_step, {"a": {"mib": 8}, "b": {"mib": 16}, "c": {"mib": 4}}, repeats=2, fresh_process=False
    )
    assert _BUILT == [8, 16, 4, 4, 16, 8]  # both orders
    assert list(peaks) == ["a", "b", "c"]  # the order asked for
    for label, mib in (("a", 8), ("b", 16), ("c", 4)):
        p = peaks[label]
        assert len(p.samples) == 4 and p.peak_bytes >= 0.8 * mib * MIB, (label, p.samples)
        assert "in both orders (first to last:" in p.method and "last to first:" in p.method, p.method
    _BUILT.clear()
    one = memory.measure_peaks_isolated(recording_step, {"a": {"mib": 8}}, repeats=2, fresh_process=False)["a"]
    assert _BUILT == [8] and len(one.samples) == 2 and "in this process" in one.method  # one variant: one pass


def test_kernel_path_follows_tensorflows_own_rule_for_turning_onednn_on():
    """hardware.kernel_path: which CPU kernels TensorFlow takes — TF_ENABLE_ONEDNN_OPTS when set, else TensorFlow's
    default (port.cc DefaultOneDnnPolicy: Linux x86 only with VNNI or AMX, x86 Windows always, macOS never), then the
    oneDNN cap and the CPU's bfloat16 units. Each case would read another path if one rule were missing."""
    from course_utils import hardware

    amx = "flags: fpu avx2 avx512f avx512_vnni avx512_bf16 amx_tile amx_bf16"
    vnni = "flags: fpu avx2 avx512f avx512_vnni"
    laptop = "flags: fpu avx2 fma"
    cases = [
        ({}, amx, "linux", "x86_64", "onednn-bf16"),
        ({}, vnni, "linux", "x86_64", "onednn-fp32"),  # Cascade Lake: oneDNN on, no bfloat16 units
        ({}, laptop, "linux", "x86_64", "eigen"),  # an AVX2 laptop: TensorFlow leaves oneDNN off
        ({"TF_ENABLE_ONEDNN_OPTS": "1"}, laptop, "linux", "x86_64", "onednn-fp32"),
        ({"TF_ENABLE_ONEDNN_OPTS": "0"}, amx, "linux", "x86_64", "eigen"),
        ({"TF_ENABLE_ONEDNN_OPTS": "1", "ONEDNN_MAX_CPU_ISA": "AVX2"}, amx, "linux", "x86_64", "onednn-fp32"),
        ({}, "", "win32", "AMD64", "onednn-fp32"),  # on by default; bfloat16 units unread
        ({}, amx, "darwin", "arm64", "eigen"),
        ({"TF_ENABLE_ONEDNN_OPTS": "1"}, amx, "darwin", "arm64", "eigen"),  # no oneDNN in the macOS build
        ({}, "Features: fp asimd bf16", "linux", "aarch64", "eigen"),
    ]
    for environ, cpuinfo, platform, machine, expected in cases:
        path, why = hardware.kernel_path(environ, cpuinfo, platform, machine)
        assert path == expected, (environ, cpuinfo, platform, path, why)
        assert why and path in hardware.KERNEL_PATHS
    for name, path in hardware.KERNEL_PATHS.items():  # each path's own settings make it, on an AMX CPU
        assert hardware.kernel_path(path["env"], amx, "linux", "x86_64")[0] == name
