#!/usr/bin/env python3
"""Training images per second of the capstone's networks on this process's CPU kernel path (issue 48): the tutorial's
CNN at its batch (32, float32) and the course's ResNet-9 at a few widths (batch 128, the policy the course recipe
chooses here), each a Keras ``fit`` over random images, the first epoch (compiling) left out.

    TF_ENABLE_ONEDNN_OPTS=0 taskset -c 0 python measurements/2026-11-28-capstone-kernel-paths/throughput.py

Prints one JSON line per network: the kernel path, images/s (median of the timed epochs), the policy.
"""

from __future__ import annotations

import json
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

import course_utils  # noqa: E402
from course_utils import capstone, hardware  # noqa: E402


def images_per_s(make, batch: int, policy: str, n: int = 2048, epochs: int = 4) -> list[float]:
    import keras

    keras.config.set_dtype_policy(policy)
    try:
        model = make()
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9, nesterov=True),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    finally:
        keras.config.set_dtype_policy("float32")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (n, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, n)
    times = []

    class Clock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.t = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.t)

    model.fit(x, y, batch_size=batch, epochs=epochs, verbose=0, callbacks=[Clock()])
    return [n // batch * batch / t for t in times[1:]]


def main() -> int:
    course_utils.setup()
    path, why = hardware.kernel_path()
    import types
    policy = capstone.RECIPES["course"].choose_policy(types.SimpleNamespace(kind="CPU"))[0]
    mean, var = np.full(3, 120.0), np.full(3, 4000.0)
    white = np.eye(12, dtype="float32").reshape(2, 2, 3, 12)
    nets = {"tutorial_cnn b32 float32": (capstone.tutorial_cnn, 32, "float32")}
    for w in (4, 6, 8, 12, 16):
        nets[f"resnet9 w{w} b128 {policy}"] = (lambda w=w: capstone.resnet9(w, mean=mean, variance=var, whiten=white),
                                              128, policy)
    for name, (make, batch, pol) in nets.items():
        ips = images_per_s(make, batch, pol)
        print(json.dumps({"kernel_path": path, "net": name, "images_per_s": round(statistics.median(ips)),
                          "epochs_timed": [round(v) for v in ips]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
