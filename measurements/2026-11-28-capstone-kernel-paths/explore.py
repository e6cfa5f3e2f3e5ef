"""Recipe exploration harness (issue 48): train a variant for E epochs on the dev images' training split minus the
capstone's validation split (the same 407 images, `capstone.split_validation`); print validation accuracy (plain and
with the mirror) and training seconds, and append a line to explore_runs.jsonl. It never reads the test split.

    TF_ENABLE_ONEDNN_OPTS=0 taskset -c 0 python measurements/2026-11-28-capstone-kernel-paths/explore.py \
        --data ../shared/data/cifar10_real_dev.npz --width 4 --epochs 15 --lr256 0.8

explore_runs.jsonl holds the runs that chose the learning rate (one core each, two at a time on a 2-core AVX2 VM,
TensorFlow's own kernels, 2026-11-28; `tag` tp: 3-epoch throughput probes)."""
import argparse, json, os, pathlib, sys, time
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
t_start = time.perf_counter()
p = argparse.ArgumentParser()
p.add_argument("--arch", default="resnet9")
p.add_argument("--width", type=int, default=8)
p.add_argument("--batch", type=int, default=128)
p.add_argument("--lr256", type=float, default=0.2)
p.add_argument("--epochs", type=int, default=10)
p.add_argument("--ls", type=float, default=0.2)
p.add_argument("--wd", type=float, default=5e-3)
p.add_argument("--warm", type=float, default=0.2)
p.add_argument("--whiten", type=int, default=1)
p.add_argument("--seed", type=int, default=42)
p.add_argument("--bnmom", type=float, default=0.9)
p.add_argument("--scale", type=float, default=0.125)
p.add_argument("--act", default="relu")
p.add_argument("--policy", default="float32")
p.add_argument("--tag", default="")
p.add_argument("--data", default="../shared/data/cifar10_real_dev.npz", help="the dev .npz (train and test splits)")
a = p.parse_args()
import numpy as np
import tensorflow as tf, keras
from keras import layers
from course_utils.capstone.trainer import split_validation, _pipelines
from course_utils.capstone.models import whitening_kernel, resnet9
from course_utils.capstone.options import Options
from course_utils.capstone.callbacks import BudgetSchedule
keras.utils.set_random_seed(a.seed)
d = np.load(a.data)
x, y = d["x_train"], d["y_train"]
(xt, yt), (xv, yv) = split_validation(x, y, 407)
mean, var = xt.reshape(-1, 3).mean(0), xt.reshape(-1, 3).var(0)
W = whitening_kernel(xt, mean, var) if a.whiten else None
keras.config.set_dtype_policy(a.policy)

def act():
    return layers.ReLU() if a.act == "relu" else layers.Activation("gelu")

def cbr(x, f, pool=False):
    x = layers.Conv2D(f, 3, padding="same", use_bias=False)(x)
    if pool:
        x = layers.MaxPooling2D()(x)
    x = layers.BatchNormalization(momentum=a.bnmom)(x)
    return act()(x)

def head(inputs, x):
    x = layers.GlobalMaxPooling2D()(x)
    x = layers.Dense(10, use_bias=False)(x)
    x = layers.Rescaling(a.scale, dtype="float32")(x)
    return keras.Model(inputs, x)

def stem():
    inputs = keras.Input((32, 32, 3))
    x = layers.Normalization(mean=mean, variance=var)(inputs)
    if W is not None:
        wl = layers.Conv2D(W.shape[-1], 2, padding="same", use_bias=False, trainable=False)
        x = wl(x); wl.set_weights([W])
    return inputs, x

w = a.width
if a.arch == "resnet9":
    model = resnet9(w, mean=mean, variance=var, whiten=W, logit_scale=a.scale)
elif a.arch == "air":  # airbench-style groups: conv, pool, BN, act, conv, BN, act
    inputs, x = stem()
    for f in (2 * w, 4 * w, 8 * w):
        x = cbr(x, f, pool=True); x = cbr(x, f)
    model = head(inputs, x)
elif a.arch == "airres":  # groups with a residual second conv
    inputs, x = stem()
    for f in (2 * w, 4 * w, 8 * w):
        x = cbr(x, f, pool=True); x = layers.Add()([x, cbr(x, f)])
    model = head(inputs, x)
elif a.arch == "air3":  # 3 convs per group (airbench96-ish)
    inputs, x = stem()
    for f in (2 * w, 4 * w, 8 * w):
        x = cbr(x, f, pool=True); x = cbr(x, f); x = cbr(x, f)
    model = head(inputs, x)
else:
    raise SystemExit(a.arch)

o = Options(batch_size=a.batch, augment=True, seed=a.seed)
class S: pass
sp = S(); sp.train = (xt, yt); sp.validation = (xv, yv)
train_ds, val_ds = _pipelines(o, sp, 1, autotune=False)
spe = len(xt) // a.batch
sched = BudgetSchedule(a.lr256 * a.batch / 256)
sched.set_plan(a.warm * a.epochs * spe, a.epochs * spe)
model.compile(optimizer=keras.optimizers.SGD(sched, momentum=0.9, nesterov=True, weight_decay=a.wd),
              loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=a.ls),
              metrics=["accuracy"], jit_compile=False)
t_ready = time.perf_counter()
times = []
class T(keras.callbacks.Callback):
    def on_epoch_end(self, e, logs=None):
        times.append(time.perf_counter())
model.fit(train_ds, epochs=a.epochs, verbose=0, callbacks=[T()])
t_end = time.perf_counter()
def acc(xs):
    p = model.predict(xs, batch_size=512, verbose=0)
    return p
pv = tf.nn.softmax(acc(xv)).numpy(); pf = tf.nn.softmax(acc(xv[:, :, ::-1])).numpy()
r = dict(**vars(a), macs=int(sum(np.prod(l.kernel.shape) * np.prod(l.output.shape[1:3]) for l in model.layers if isinstance(l, layers.Conv2D))),
         params=model.count_params(), val=float((pv.argmax(1) == yv).mean()), val_flip=float(((pv + pf).argmax(1) == yv).mean()),
         ready_s=round(t_ready - t_start, 1), train_s=round(t_end - t_ready, 1),
         epoch_s=round(float(np.median(np.diff([t_ready] + times)[1:])) if len(times) > 1 else t_end - t_ready, 2),
         first_epoch_s=round(times[0] - t_ready, 2))
print(json.dumps(r), flush=True)
with open(HERE / "explore_runs.jsonl", "a") as f:
    f.write(json.dumps(r) + "\n")
