"""The GPU and TPU stand-ins (course_utils.standin): the accelerator's code paths over CPU devices, refusing what
TPUStrategy refuses — and the findings of issue 47 that only those paths hit, each run where a learner would meet it.

Each check runs in a fresh process: a stand-in splits the CPU when TensorFlow starts, as a GPU or TPU runtime is
fixed when the kernel starts."""

from __future__ import annotations

import json
import os
import sys

import pytest

from course_utils import config, processes, proof


def run_standin(which: str, replicas: int, lines: list[str], timeout: float = 240) -> dict:
    """Run ``lines`` in a fresh process under ``COURSE_STANDIN=which`` with ``replicas`` replicas; the last line of
    its output is ``print(json.dumps(result))``: return ``result``."""
    env = dict(
        os.environ,
        COURSE_STANDIN=which,
        COURSE_CPU_REPLICAS=str(replicas),
        COURSE_DEVICE="auto",
        TF_CPP_MIN_LOG_LEVEL="3",
        COURSE_SMOKE="1",
    )
    env.pop("COURSE_JIT", None)
    code = "\n".join(
        ["import json, course_utils", "rt = course_utils.detect()", "r = {}", *lines, "print(json.dumps(r))"]
    )
    proc = processes.run([sys.executable, "-c", code], fork=True, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# what a TPU's strategy refuses, and where XLA may run: each in a try, its exception's type and first words kept
TPU_RULES = [
    "import tensorflow as tf",
    "from course_utils import memory",
    "def outcome(fn):",
    "    try:",
    "        fn()",
    "        return 'ran'",
    "    except Exception as e:",
    "        return type(e).__name__ + ': ' + str(e)[:60]",
    "s = rt.strategy",
    "r['kind'], r['replicas'], r['devices'] = rt.kind, rt.num_replicas, list(rt.device_names)",
    "r['default_device'], r['in_process'], r['standin'] = memory.default_device(), memory.in_process(), rt.standin",
    "r['fallbacks'] = rt.fallbacks",
    "r['eager_run'] = outcome(lambda: s.run(lambda: tf.constant(1.0)))",
    "r['traced_run'] = outcome(tf.function(lambda: s.run(lambda: tf.constant(1.0))))",
    "r['jit_around_run'] = outcome(tf.function(lambda: s.run(lambda: tf.constant(1.0)), jit_compile=True))",
    "twice = tf.function(lambda x: 2 * x, jit_compile=True)",
    "r['host_jit'] = outcome(lambda: twice(tf.constant(1.0)))",
    "with tf.device(rt.device_names[0]):",
    "    r['core_jit'] = outcome(lambda: twice(tf.constant(1.0)))",
]


@pytest.mark.parametrize("cores", [1, 2])
def test_the_tpu_stand_in_refuses_what_tpu_strategy_refuses(cores):
    """A TPU with ``cores`` cores over CPU devices (CPU:0 its host): TPUStrategy.run of a plain function in eager mode
    raises TensorFlow's own NotImplementedError; a traced run works; jit_compile=True around run, or any XLA function
    left on the host, is refused (tensorflow#58934); XLA placed on a core runs. Memory is read in this process, on the
    first core."""
    r = run_standin("tpu", cores, TPU_RULES)
    assert (r["kind"], r["replicas"], r["standin"]) == ("TPU", cores, "tpu")
    assert r["devices"] == [f"/device:CPU:{i}" for i in range(1, cores + 1)]
    assert (r["default_device"], r["in_process"]) == ("CPU:1", True)
    assert r["eager_run"].startswith("NotImplementedError: TPUStrategy.run(fn, ...) does not support pure eager")
    assert r["traced_run"] == "ran"
    assert r["jit_around_run"].startswith("TPUStandInRefused: XLA compiled for the host")
    assert r["host_jit"].startswith("TPUStandInRefused: XLA compiled for the host")
    assert r["core_jit"] == "ran"


@pytest.mark.parametrize("replicas, kind", [(1, "GPU"), (2, "multi-GPU")])
def test_the_gpu_stand_in_answers_as_a_gpu_and_measures_in_process(replicas, kind):
    """One GPU, or several (MirroredStrategy), over CPU devices: nothing refused (a GPU runs eager code and compiles
    XLA where the ops are), memory read in this process as on a GPU."""
    r = run_standin("gpu", replicas, TPU_RULES)
    assert (r["kind"], r["replicas"], r["standin"]) == (kind, replicas, "gpu")
    assert (r["default_device"], r["in_process"]) == ("CPU:0", True)
    assert r["eager_run"] == r["traced_run"] == r["jit_around_run"] == r["host_jit"] == "ran", r
    # as on a real GPU, the TPU was looked for first: notebook 01 prints runtime.fallbacks[0] (an IndexError before)
    assert r["fallbacks"] and r["fallbacks"][0].startswith("TPU — none found"), r["fallbacks"]


def test_lesson_03_step_peaks_run_on_a_gpu_and_a_tpu():
    """Issue 47: lesson 03 §4 crashed on every GPU and TPU — training_step_peaks passes the strategy as a variant
    argument and measure_isolated JSON-encoded the variants before choosing where to measure ("Object of type
    OneDeviceStrategy is not JSON serializable"). In this process (a GPU's, a TPU's) any object will do; under XLA on a
    TPU the step is not wrapped in jit_compile=True (TPUStrategy compiles it; around run it would compile for the
    host). Both policies measured, in this process, on the accelerator's device."""
    lines = [
        "from course_utils.lessons.mixed_precision import experiments as e3",
        "peaks = e3.training_step_peaks(rt.strategy, ['float32', 'mixed_bfloat16'], repeats=1, batch=8, width=4,"
        " jit=True)",
        "r['peaks'] = {k: [p.peak_bytes, p.method, p.device] for k, p in peaks.items()}",
    ]
    for which, replicas, device in (("gpu", 1, "CPU:0"), ("tpu", 2, "CPU:1")):
        peaks = run_standin(which, replicas, lines)["peaks"]
        assert set(peaks) == {"float32", "mixed_bfloat16"}
        for peak_bytes, method, measured_on in peaks.values():
            assert peak_bytes > 0 and "in this process" in method and measured_on == device, peaks


def test_lesson_02_one_step_is_the_batch_mean_on_every_replica_count():
    """Issue 47: lesson 02 §4 handed strategy.run a plain function eagerly (TPUStrategy refuses) and gave every replica
    the whole batch, so the optimizer's sum made the step replicas × lr·g. Now: the same SGD update on 1 and 2
    replicas (and on the TPU stand-in), each equal to w − lr·∇(mean loss over the 64 images) computed by hand."""
    lines = [
        "import numpy as np, tensorflow as tf, keras",
        "from course_utils import models",
        "from course_utils.lessons.bfloat16_conversion import experiments as e2",
        "keras.utils.set_random_seed(0)",
        "def build(policy):",
        "    with rt.strategy.scope():",
        "        return models.build_under_policy(policy, width=4, num_classes=10)",
        "base = build('float32')",
        "def convert(model, policy):",
        "    new = build(policy)",
        "    new.set_weights(model.get_weights())",
        "    return new",
        "rng = np.random.default_rng(0)",
        "x = tf.constant(rng.integers(0, 256, (64, 32, 32, 3)).astype('uint8'))",
        "y = tf.constant(rng.integers(0, 10, 64))",
        "ref = convert(base, 'float32')",
        "with tf.GradientTape() as tape:",
        "    loss = keras.losses.SparseCategoricalCrossentropy()(y, ref(x, training=True))",
        "expected = [w - 1.0 * g for w, g in zip(ref.trainable_variables, tape.gradient(loss, ref.trainable_variables))]",
        "captured = {}",
        "def keep(model, policy):",
        "    captured['m'] = convert(model, policy)",
        "    return captured['m']",
        "changed, zeros = e2.fraction_changed(base, 'float32', lambda: keras.optimizers.SGD(1.0), x, y, keep,"
        " rt.strategy)",
        "got = captured['m'].trainable_variables",
        "moved = max(float(np.abs(e - w).max()) for e, w in zip(expected, ref.trainable_variables))",
        "r['diff'] = max(float(np.abs(e.numpy() - g.numpy()).max()) for e, g in zip(expected, got))",
        "r['moved'], r['changed'], r['zeros'] = moved, changed, zeros",
    ]
    for which, replicas in (("gpu", 1), ("gpu", 2), ("tpu", 2)):
        r = run_standin(which, replicas, lines)
        assert r["moved"] > 1e-3 and 0.5 < r["changed"] <= 1 and 0 <= r["zeros"] < 0.5, (which, replicas, r)
        assert r["diff"] < 1e-4 * r["moved"] + 1e-6, (which, replicas, r)  # not replicas × the step


@pytest.mark.parametrize("cores", [1, 2])
def test_lesson_05_builtin_accumulation_fails_where_the_lesson_says_on_a_tpu(cores):
    """Issue 47: on a TPU, lesson 05 §4 expected MirroredStrategy's "merge_call called while defining a new graph"
    from TPUStrategy, which merges in place: expect_failure would raise DemoDidNotFail and stop Run all. The demo runs
    on a MirroredStrategy (over the host's CPU on a TPU) and fails there as the lesson says, with one core (the stand-in
    merges in place) and several."""
    r = run_standin(
        "tpu",
        cores,
        [
            "from course_utils.lessons.gradient_accumulation import experiments as e5",
            "import tensorflow as tf",
            "m = e5.mirrored_strategy(rt.strategy)",
            "r['type'], r['devices'] = type(m).__name__, list(m.extended.worker_devices)",
            "r['outcome'] = e5.builtin_on_mirrored(rt.strategy, rt.kind, 4)",
        ],
    )
    assert r["type"] == "MirroredStrategy" and r["devices"][0].endswith("CPU:0"), r
    assert r["outcome"] == "RuntimeError (merge_call in Cond)", r


def test_a_bad_stand_in_is_one_clear_error():
    """COURSE_STANDIN is a setting: a value other than gpu or tpu is a ConfigError naming the choices."""
    with pytest.raises(config.ConfigError, match="COURSE_STANDIN='npu' is not one of gpu, tpu"):
        config.load({"COURSE_STANDIN": "npu"})
    assert config.load({"COURSE_STANDIN": " TPU "}).standin == "tpu"
    assert config.load({}).standin == ""


@pytest.mark.parametrize(
    "shape, standin, replicas", [("tpu", "tpu", "4"), ("gpu", "gpu", "1"), ("multi-gpu", "gpu", "2"), (None, None, "1")]
)
def test_prove_shapes_run_the_stand_ins(shape, standin, replicas, monkeypatch):
    """prove --shape tpu|gpu|multi-gpu runs every lesson under that stand-in; no --shape clears one left in the
    environment (a CPU proof is a CPU's)."""
    import argparse

    from course_utils import lessons

    monkeypatch.setenv("COURSE_STANDIN", "tpu")
    env = proof._child_env(argparse.Namespace(mode="smoke", jit=False, data=None, shape=shape), lessons.BY_ID["02"])
    assert env.get("COURSE_STANDIN") == standin and env["COURSE_CPU_REPLICAS"] == replicas
