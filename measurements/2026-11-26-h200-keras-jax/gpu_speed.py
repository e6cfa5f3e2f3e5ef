"""The capstone's networks on an accelerator, Keras 3 on JAX (TensorFlow cannot travel to the device machine):
images/s per config, epochs 2.. timed (epoch 1 compiles). Writes $OUT/gpu_speed.json after each config."""
import json, os, sys, time
os.environ["KERAS_BACKEND"] = "jax"
import keras  # before course_utils, which would pin the TensorFlow backend
import jax
import numpy as np
sys.path.insert(0, os.getcwd())
from course_utils import capstone as cap

N = int(os.environ.get("N", 25_000))
EPOCHS = int(os.environ.get("EPOCHS", 4))
out = os.path.join(os.environ.get("OUT", "/tmp"), "gpu_speed.json")
rng = np.random.default_rng(0)
x = rng.integers(0, 256, (N, 32, 32, 3), dtype=np.uint8).astype("float32")
y = rng.integers(0, 10, N).astype("int32")
dev = jax.devices()[0]
meta = dict(device=str(getattr(dev, "device_kind", dev)), platform=dev.platform, jax=jax.__version__,
            keras=keras.__version__, images=N, timed_epochs=EPOCHS - 1)
print(meta, flush=True)
configs = [  # (model, width, policy, batch, steps_per_execution)
    ("tutorial_cnn", 0, "float32", 64, 1),
    ("resnet9", 8, "mixed_bfloat16", 128, 1),
    ("resnet9", 16, "mixed_bfloat16", 128, 1),
    ("resnet9", 16, "mixed_bfloat16", 128, 16),
    ("resnet9", 32, "mixed_bfloat16", 128, 1),
    ("resnet9", 64, "mixed_bfloat16", 128, 1),
    ("resnet9", 64, "float32", 128, 1),
    ("resnet9", 64, "mixed_bfloat16", 512, 1),
]
only = os.environ.get("ONLY")
rows = []
for i, (name, width, policy, batch, spe) in enumerate(configs):
    if only and str(i) not in only.split(","):
        continue
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(0)
    model = cap.tutorial_cnn() if name == "tutorial_cnn" else cap.resnet9(width)
    opt = (keras.optimizers.Adam(1e-3) if name == "tutorial_cnn" else
           keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True, weight_decay=5e-3))
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True,
                  steps_per_execution=spe)
    times = []

    class T(keras.callbacks.Callback):
        def on_epoch_begin(self, e, logs=None):
            self.t = time.perf_counter()

        def on_epoch_end(self, e, logs=None):
            times.append(time.perf_counter() - self.t)

    model.fit(x, y, batch_size=batch, epochs=EPOCHS, verbose=0, callbacks=[T()], shuffle=False)
    timed = sorted(times[1:])
    med = timed[len(timed) // 2]
    row = dict(model=name, width=width, macs=cap.resnet9_macs(width) if width else None, policy=policy, batch=batch,
               steps_per_execution=spe, params=model.count_params(), first_epoch_s=round(times[0], 2),
               epoch_s=[round(t, 3) for t in times[1:]], images_per_s=round(N / med))
    rows.append(row)
    print(f"{name:12} w{width:<3} {policy:15} b{batch:<4} spe{spe:<3} first {times[0]:6.1f}s  "
          f"epoch {med:6.3f}s  {N / med:10,.0f} img/s", flush=True)
    with open(out, "w") as f:
        json.dump(dict(meta, rows=rows), f, indent=1)
    keras.backend.clear_session()
