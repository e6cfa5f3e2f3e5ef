"""Keras 3 on JAX with the course's pins (issue 50, lesson 09's ground): what carries over from lessons 01-06,
measured in a fresh process with ``KERAS_BACKEND=jax`` and 4 JAX host devices (``JAX_NUM_CPU_DEVICES``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = r"""
import json, os, sys
import jax, keras, numpy as np
from course_utils.capstone.models import resnet9

out = {"backend": keras.backend.backend(), "devices": len(jax.devices()), "tf_imported": "tensorflow" in sys.modules}
dist = keras.distribution.DataParallel(devices=jax.devices())
x = np.ones((32, 8), "float32")
out["shards"] = sorted({tuple(s.data.shape) for s in
                        keras.distribution.distribute_tensor(x, dist.get_data_layout(x.shape)).addressable_shards})

def param_bytes(model):
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.weights)

nets = {}
for policy in ("float32", "bfloat16", "mixed_bfloat16"):
    keras.config.set_dtype_policy(policy)
    nets[policy] = resnet9(width=4, mean=[0.0] * 3, variance=[1.0] * 3)
keras.config.set_dtype_policy("float32")
out["bytes"] = {k: param_bytes(m) for k, m in nets.items()}
conv = next(l for l in nets["mixed_bfloat16"].layers if isinstance(l, keras.layers.Conv2D))
out["mixed_conv"] = [conv.compute_dtype, conv.variable_dtype]
out["mixed_logits"] = str(nets["mixed_bfloat16"](np.zeros((2, 32, 32, 3), "float32")).dtype)

rng = np.random.default_rng(0)
X, Y = rng.normal(size=(32, 8)).astype("float32"), rng.normal(size=(32, 4)).astype("float32")

def trained(batch, **sgd):
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    m.compile(optimizer=keras.optimizers.SGD(0.1, **sgd), loss="mse")
    m.fit(X, Y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    return m.get_weights()[0]

big = trained(32)
out["accumulated_vs_big"] = float(np.abs(trained(8, gradient_accumulation_steps=4) - big).max())
out["small_vs_big"] = float(np.abs(trained(8) - big).max())
keras.distribution.set_distribution(dist)
out["data_parallel_vs_one_device"] = float(np.abs(trained(32) - big).max())
print("RESULT", json.dumps(out))
"""


@pytest.fixture(scope="module")
def probe():
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed (requirements.txt pins it)")
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_NUM_CPU_DEVICES="4", PYTHONPATH=ROOT)
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_keras_runs_on_jax_over_four_host_devices_without_tensorflow(probe):
    # the capstone's network module imports no TensorFlow: what Colab's TPU image (JAX, no TensorFlow) needs
    assert probe["backend"] == "jax" and probe["devices"] == 4 and not probe["tf_imported"]


def test_data_parallel_splits_the_global_batch_and_trains_as_one_device(probe):
    assert probe["shards"] == [[8, 8]]  # 32 rows over 4 devices: 8 each
    assert probe["data_parallel_vs_one_device"] < 1e-6


def test_bfloat16_parameters_take_exactly_half_the_bytes_mixed_keeps_float32_variables(probe):
    b = probe["bytes"]
    assert b["bfloat16"] * 2 == b["float32"] and b["mixed_bfloat16"] == b["float32"]
    assert probe["mixed_conv"] == ["bfloat16", "float32"] and probe["mixed_logits"] == "float32"


def test_gradient_accumulation_steps_equal_the_big_batch_on_jax(probe):
    assert probe["accumulated_vs_big"] < 1e-6
    assert probe["small_vs_big"] > 1e-2  # four plain updates of 8 are not one of 32: the check can tell them apart
