"""runtime.run_with_replicas: an experiment, called by function, here or in a fresh N-replica process."""

from __future__ import annotations

import pytest

from course_utils import runtime
from course_utils.lessons.gradient_accumulation import experiments as exp


def test_runs_here_when_the_strategy_has_that_many_replicas():
    import tensorflow as tf

    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    result = runtime.run_with_replicas(1, one, exp.loss_averaging_effect)
    assert result["where"] == "this notebook's strategy" and result["replicas"] == 1
    assert result["update_ratio"] == pytest.approx(1.0, rel=1e-4)  # reduce_mean is right on 1 replica


def test_runs_in_a_fresh_process_with_n_cpu_replicas():
    import tensorflow as tf

    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    result = runtime.run_with_replicas(2, one, exp.loss_averaging_effect, per_replica_batch=4)
    assert result["where"] == "a fresh process with 2 CPU replicas"
    assert result["replicas"] == 2 and result["global_batch"] == 8  # the kwargs arrived
    assert result["update_ratio"] == pytest.approx(2.0, rel=1e-3)


def test_refuses_what_a_fresh_process_cannot_import():
    def local(strategy):
        return {}

    with pytest.raises(TypeError, match="module-level"):
        runtime.run_with_replicas(2, None, local)
    with pytest.raises(TypeError, match="module-level"):
        runtime.run_with_replicas(2, None, "loss_averaging_effect")


def test_lesson_02_forward_step_runs_where_it_is_placed():
    """Issue 22: lesson 02 read a TPU's peak while its forward pass ran unplaced (a TPU gets only ops placed on it).
    The step places its images, weights and calls on the device asked for: on 2 CPU devices, the second one."""
    out = runtime.run_on_cpu_replicas(
        2,
        "\n".join(
            [
                "import course_utils",
                "from course_utils.lessons.bfloat16_conversion import experiments as conversion",
                "assert course_utils.detect().num_replicas == 2  # the CPU split into 2 devices",
                "for device in ('/CPU:1', None):",
                "    step = conversion.forward_step('float32', width=8, batch=4, device=device)",
                "    print(step().device)",
            ]
        ),
    )
    placed, default = out.strip().splitlines()[-2:]
    assert placed.endswith("device:CPU:1") and default.endswith("device:CPU:0"), out


def test_lesson_02_convolution_probe_and_lesson_05_training_step_run_where_they_are_placed():
    """Issue 32: lesson 02's XLA convolution-dtype probe and lesson 05's training step (its memory claim) ran unplaced
    while the notebook named the accelerator (a TPU gets only ops placed on it). Both place their inputs, weights and
    calls on the device asked for — default: memory.default_device(), the one the label names. On 2 CPU devices: the
    second one when asked, CPU:0 (the default device) otherwise."""
    out = runtime.run_on_cpu_replicas(
        2,
        "\n".join(
            [
                "import course_utils",
                "from course_utils import memory",
                "from course_utils.lessons.bfloat16_conversion import experiments as conversion",
                "from course_utils.lessons.gradient_accumulation import experiments as accumulation",
                "assert course_utils.detect().num_replicas == 2 and memory.default_device() == 'CPU:0'",
                "for device in ('/CPU:1', None):",
                "    probe = conversion.xla_convolution_dtypes('bfloat16', width=4, batch=2, device=device)",
                "    step = accumulation.training_step(8, width=4, device=device)",
                "    logs = step()",
                "    optimizer = step.model.optimizer",
                "    print('|'.join([probe.device, logs['loss'].device, step.model.weights[0].value.device,",
                "                    optimizer.variables[-1].value.device]))",
            ]
        ),
    )
    placed, default = (line.split("|") for line in out.strip().splitlines()[-2:])
    assert all(d.endswith("device:CPU:1") for d in placed), out
    assert all(d.endswith("device:CPU:0") for d in default), out
