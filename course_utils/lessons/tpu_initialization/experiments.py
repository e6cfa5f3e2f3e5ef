"""Lesson 01's experiments: what the TPU resolver recipes do here, how one global batch splits across
replicas, and how fast this hardware multiplies matrices in float32 and bfloat16; and the lesson's claims
(:func:`claims` turns what the notebook measured into the table).

The tools themselves (detection, the TPU recipe, timing) are in :mod:`course_utils.runtime` and
:mod:`course_utils.timing`.
"""

from __future__ import annotations

import os
import statistics
import time

import keras
import numpy as np
import tensorflow as tf

from ... import runtime
from ...report import Claim, Samples
from ...timing import MatmulRate, Timing, matmul_chain, matmul_operands, time_fn
from ... import models, report


class EpochTimer(keras.callbacks.Callback):
    """A Keras callback that records each epoch's wall time in ``.epoch_s``.

    The first epoch includes tracing and compilation; compare later epochs (``.steady_s``: their median)."""

    def __init__(self):
        super().__init__()
        self.epoch_s: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        self._t0 = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_s.append(time.perf_counter() - self._t0)

    @property
    def steady_s(self) -> float:
        later = self.epoch_s[1:] or self.epoch_s
        return statistics.median(later)


def resolver_recipes() -> list[dict]:
    """Run the three TPU resolver recipes seen in tutorials and report what each does *here*.

    Returns rows ``{"recipe", "era", "outcome"}``. The ``tpu="local"`` recipe is only connected when a
    TPU is plausibly present (connecting on a machine without one changes TensorFlow's state).
    """
    Resolver = tf.distribute.cluster_resolver.TPUClusterResolver
    rows = []
    for recipe, era, build in [
        (
            'TPUClusterResolver(tpu="grpc://" + os.environ["COLAB_TPU_ADDR"])',
            "TPU Node (retired)",
            lambda: Resolver(tpu="grpc://" + os.environ["COLAB_TPU_ADDR"]),
        ),
        ("TPUClusterResolver()", "TPU Node / Cloud TPU name", lambda: Resolver()),
    ]:
        try:
            build()
            outcome = "constructed (a TPU name or address is configured here)"
        except Exception as exc:  # noqa: BLE001
            outcome = "raises " + runtime._first_line(exc, 90)
        rows.append({"recipe": recipe, "era": era, "outcome": outcome})
    if runtime.tpu_hints():
        rt = runtime.detect()
        outcome = f"connected: {rt.num_replicas} replica(s)" if rt.kind == "TPU" else "failed: " + rt.fallbacks[0]
    else:
        Resolver(tpu="local")
        outcome = "constructed; not connected — no TPU on this machine, so the course falls back"
    rows.append({"recipe": 'TPUClusterResolver(tpu="local")', "era": "TPU VM (today)", "outcome": outcome})
    return rows


def split_one_batch(strategy, per_replica_batch: int, image_shape=(32, 32, 3)) -> dict:
    """Distribute one global batch with ``experimental_distribute_dataset``; report each replica's slice.

    Each example carries its index, so the result shows *which* examples each replica got:
    ``{"replicas", "global_batch", "per_replica_shapes", "per_replica_ids", "devices"}``.
    Run it on N CPU replicas with ``runtime.run_with_replicas(N, strategy, split_one_batch, ...)``.
    """
    global_batch = per_replica_batch * strategy.num_replicas_in_sync
    ids = np.arange(global_batch * 2)
    images = np.zeros((len(ids), *image_shape), dtype="float32")
    ds = tf.data.Dataset.from_tensor_slices((images, ids)).batch(global_batch, drop_remainder=True)
    first_images, first_ids = next(iter(strategy.experimental_distribute_dataset(ds)))
    return {
        "replicas": strategy.num_replicas_in_sync,
        "global_batch": global_batch,
        "per_replica_shapes": [list(t.shape) for t in strategy.experimental_local_results(first_images)],
        "per_replica_ids": [t.numpy().tolist() for t in strategy.experimental_local_results(first_ids)],
        "devices": [str(d) for d in strategy.extended.worker_devices],
    }


def compare_matmul_dtypes(
    n: int,
    repeats: int,
    device: str | None = None,
    jit: bool = False,
    dtypes: tuple[str, ...] = ("float32", "bfloat16"),
    target_s: float = 0.05,
    seed: int = 0,
) -> dict:
    """TFLOP/s of chained ``n×n`` matmuls in each dtype, timed call by call in turn (interleaved).

    Every dtype runs the same chain length (calibrated on the first dtype to last about ``target_s``
    per call) inside one ``tf.function`` (:func:`course_utils.timing.matmul_chain`); round ``i`` times one
    call of each dtype, so a drift of the machine hits all of them alike. Returns ``{"rates": {dtype:
    MatmulRate}, "speed_vs_first": {dtype: Samples of (first dtype's time / this dtype's time) per round},
    "bytes": {dtype: bytes of one n×n matrix}}``.
    """
    x_np, b_np = matmul_operands(n, seed=seed)
    chain = matmul_chain(jit)  # one tf.function: each dtype is its own trace
    with tf.device(device) if device else _Null():
        ops = {}
        for dt in dtypes:
            x, b = tf.cast(tf.constant(x_np), dt), tf.cast(tf.constant(b_np), dt)
            chain(x, b, tf.constant(1)).numpy()  # trace + compile, not timed
            ops[dt] = (x, b)
        x0, b0 = ops[dtypes[0]]
        one = time_fn(lambda: chain(x0, b0, tf.constant(1)), repeats=1, warmup=0).median_s
        matmuls = int(min(10_000, max(2, round(target_s / max(one, 1e-6)))))
        k = tf.constant(matmuls)
        calls = {dt: (lambda x=x, b=b: chain(x, b, k)) for dt, (x, b) in ops.items()}
        warm = {dt: time_fn(fn, repeats=1, warmup=0).median_s for dt, fn in calls.items()}  # untimed warm-up
        times = {dt: [] for dt in dtypes}
        for _ in range(repeats):
            for dt, fn in calls.items():
                times[dt].append(time_fn(fn, repeats=1, warmup=0).median_s)
        results = {dt: float(fn().numpy()) for dt, fn in calls.items()}
        nbytes = {dt: int(tf.size(x).numpy()) * x.dtype.size for dt, (x, _) in ops.items()}
    rates = {
        dt: MatmulRate(
            n,
            dt,
            matmuls,
            jit,
            device or "default",
            Timing(statistics.median(times[dt]), times[dt], warm[dt]),
            results[dt],
        )
        for dt in dtypes
    }
    first = dtypes[0]
    speed = {dt: Samples([a / b for a, b in zip(times[first], times[dt])]) for dt in dtypes}
    return {"rates": rates, "speed_vs_first": speed, "bytes": nbytes, "matmuls": matmuls}


V5E_PEAK_TFLOPS = 197.0  # §1: one TPU v5e chip's peak bfloat16 matmul rate


# §7, pitfall 2 on 4 replicas: the code the notebook runs in a 4-CPU process (keep the two the same)
def batches(x, y, global_batch: int, shuffle: bool, seed: int):
    """§5: ``x, y`` as a dataset of global batches — the strategy splits each across its replicas — all of one shape
    (``drop_remainder=True``: a TPU compiles for each new shape), prefetched; shuffled each epoch when ``shuffle``."""
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if shuffle:
        ds = ds.shuffle(len(x), seed=seed)
    return ds.batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)  # static shapes for TPUs


# §7: a model built OUTSIDE the scope, compiled inside it, fit on 4 replicas (run in a process with 4 CPU devices)
OUTSIDE_SCOPE_ON_4 = """
import keras, numpy as np, course_utils
strategy = course_utils.detect().strategy
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])  # built OUTSIDE the scope
with strategy.scope():
    model.compile(optimizer="sgd", loss="mse")
try:
    model.fit(np.zeros((16, 4)), np.zeros((16, 2)), verbose=0)
    print("fit ran")
except Exception as e:
    print(f"fit raised {type(e).__name__}: {str(e)[:100] or '(no message)'}")
"""


def fit_in_scope(strategy, sizes, train_ds, jit_compile, callbacks=(), verbose=0):
    """§5: small_cnn and its optimizer created inside ``strategy.scope()``, then trained with ``fit`` (which may run
    outside the scope: the model remembers its strategy). Returns ``(model, history)``."""
    with strategy.scope():
        model = models.small_cnn(num_classes=sizes.num_classes, width=sizes.model_width)
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
            jit_compile=jit_compile,
        )
    history = model.fit(train_ds, epochs=sizes.epochs, callbacks=list(callbacks), verbose=verbose)
    return model, history


def model_built_outside_scope(strategy, sizes):
    """§7, pitfall 2: small_cnn built OUTSIDE ``strategy.scope()`` and compiled inside it."""
    model_c = models.small_cnn(num_classes=sizes.num_classes, width=sizes.model_width)  # built OUTSIDE the scope
    with strategy.scope():
        model_c.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model_c


def optimizer_outside_scope(strategy, make_optimizer, global_batch: int) -> str:
    """§7, pitfall 1 on a fresh tiny model: an optimizer from ``make_optimizer()`` created outside
    ``strategy.scope()``, the model built and compiled inside it, one ``fit`` on one global batch. Returns
    "fit ran" or the name of the exception ``fit`` raised (whatever it is: the claim records it)."""
    optimizer = make_optimizer()  # outside the scope
    with strategy.scope():
        tiny = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        tiny.compile(optimizer=optimizer, loss="mse")
    try:
        tiny.fit(np.zeros((global_batch, 4)), np.zeros((global_batch, 2)), batch_size=global_batch, verbose=0)
        return "fit ran"
    except Exception as e:  # noqa: BLE001 - record whatever happens, expected or not
        return type(e).__name__


def fit_xla_on_replicas(strategy, steps: int = 4, batch: int = 16) -> dict:
    """XLA and ``fit`` on several replicas (MirroredStrategy; run it with ``runtime.run_with_replicas(2, ...)``): a tiny
    model fitted with ``compile(jit_compile=True)`` — Keras then compiles ``strategy.run`` over every replica as one
    XLA cluster — and with what ``runtime.fit_jit_compile`` returns here; then a custom loop that compiles each
    replica's forward and backward pass (``runtime.replica_gradients``) against the same loop without XLA.
    Returns ``replicas``, ``jit_true`` ("trained" or the error's type and first line), ``rule`` (jit_compile,
    compiled), ``rule_trained``, and ``custom_loop_max_diff`` (largest weight difference, XLA vs not)."""
    replicas = strategy.num_replicas_in_sync
    rng = np.random.default_rng(0)
    x, y = rng.random((steps * batch, 8), dtype=np.float32), rng.random((steps * batch, 2), dtype=np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)

    def build(jit_compile=False):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(2)])
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=jit_compile)
        return model

    out: dict = {"replicas": replicas}
    try:
        build(True).fit(ds, epochs=1, verbose=0)
        out["jit_true"] = "trained"
    except Exception as e:  # noqa: BLE001 - what fails, and how, is the result
        import re

        line = next((ln for ln in str(e).splitlines() if "located in device" in ln), str(e).strip().split("\n")[0])
        out["jit_true"] = (
            f"{type(e).__name__}: " + re.sub(r" \(defined @ [^)]*\)|/job:[^ ]*device:", "", line).strip()[:200]
        )
    kind = "TPU" if isinstance(strategy, tf.distribute.TPUStrategy) else "CPU"
    jit_compile, compiled, _ = runtime.fit_jit_compile(kind, True, replicas)  # as under COURSE_JIT=1
    out["rule"], out["kind"] = [jit_compile, compiled], kind
    build(jit_compile).fit(ds, epochs=1, verbose=0)
    out["rule_trained"] = True

    def custom_loop(jit: bool) -> list:
        model = build()

        def gradients(xb, yb):
            with tf.GradientTape() as tape:
                per_example = tf.reduce_mean((model(xb, training=True) - yb) ** 2, axis=-1)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch)
            return tape.gradient(loss, model.trainable_variables)

        grads = runtime.replica_gradients(gradients, jit)  # XLA per replica; all-reduce and update outside it

        @tf.function
        def step(batch_xy):
            def replica(xb, yb):
                model.optimizer.apply_gradients(zip(grads(xb, yb), model.trainable_variables))

            strategy.run(replica, args=batch_xy)

        for batch_xy in strategy.experimental_distribute_dataset(ds):
            step(batch_xy)
        return [v.numpy() for v in model.trainable_variables]

    plain, with_xla = custom_loop(False), custom_loop(True)
    start = [v.numpy() for v in build().trainable_variables]
    out["custom_loop_max_diff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(plain, with_xla))
    out["custom_loop_moved"] = max(float(np.max(np.abs(a - b))) for a, b in zip(plain, start))
    return out


# Every claim of the lesson, declared once: its words, threshold and the function that measures it (claims.json's
# "where": a report card's row leads to the code). A "speed" figure is judged on the accelerator's own speed: under a
# GPU or TPU stand-in a CPU measures it, so one that does not hold there is marked, not failed.
CPU_SHARE_OF_V5E = 0.01  # a CPU's float32 matmul rate against one v5e chip's peak: below this share
TPU_MIN_TFLOPS = 1.0  # a TPU's bfloat16 matmul rate in this lesson's probe: above this
BF16_SPEED_RANGE = (0.5, 2.0)  # bfloat16 ÷ float32 matmul speed on a TPU: about 1×
CLAIMS = report.LessonClaims(
    "01",
    [
        report.Declared(
            "01.old_recipes_fail",
            "Old recipes (grpc:// + COLAB_TPU_ADDR; no-argument resolver) fail on today's runtimes",
            "TPU VM docs; §3",
            "both raise on a TPU VM",
            where=resolver_recipes,
        ),
        report.Declared(
            "01.local_resolver_recipe",
            'TPUClusterResolver(tpu="local") → connect → initialize gives a TPUStrategy on a TPU VM',
            "TF TPU guide; §3",
            "TPUStrategy, 1 replica on v5e-1",
            where=runtime.detect,
        ),
        report.Declared(
            "01.detection_never_raises",
            "Detection never raises on missing or broken hardware; it falls back and says why",
            "course_utils; §4",
            "falls back, reason recorded",
            where=runtime.detect,
        ),
        report.Declared(
            "01.global_batch_split",
            "Global batch = per-replica batch × num_replicas_in_sync, split evenly",
            "tf.distribute guide; §5-6",
            "4 × {per_replica} = {global_batch}",
            where=split_one_batch,
        ),
        report.Declared(
            "01.fit_in_scope_trains",
            "A model built in strategy.scope() trains with fit on whatever hardware was found",
            "§5",
            "accuracy well above chance ({chance:.0%})",
            where=fit_in_scope,
        ),
        report.Declared(
            "01.optimizer_outside_scope",
            "An optimizer with state (Adam) created outside the scope makes fit fail; plain SGD() happens to run",
            "Keras 3 behaviour; §7",
            "Adam: RuntimeError; SGD: fit ran",
            where=optimizer_outside_scope,
        ),
        report.Declared(
            "01.model_outside_scope",
            "A model built outside the scope silently ignores a 1-replica strategy and fails under 4 replicas",
            "Keras 3 behaviour; §7",
            "ignored on 1; error on 4",
            where=model_built_outside_scope,
        ),
        report.Declared(
            "01.fit_xla_on_replicas",
            "On several replicas, fit(jit_compile=True) fails (keras#19005); the course's rule trains, and a "
            "custom loop compiles each replica's step",
            "Keras source (trainer.py); §5",
            "jit_compile=True raises; rule: trains without XLA; custom loop ≈",
            where=fit_xla_on_replicas,
        ),
        report.Declared(
            "01.tpu_faster_than_cpu",
            "One v5e chip (197 bf16 TFLOP/s) is far faster at matmuls than a CPU",
            "TPU v5e spec; §1",
            "CPU: < {threshold:g} TFLOP/s (1% of 197); TPU: > 1 TFLOP/s",
            where=compare_matmul_dtypes,
            figure="speed",
            op="<",
            threshold=CPU_SHARE_OF_V5E * V5E_PEAK_TFLOPS,
            fmt=".3f",
        ),
        report.Declared(
            "01.bfloat16_matmul_speed",
            "bfloat16 matmuls are not several times faster than float32: on a "
            "TPU float32 already multiplies in bfloat16",
            "Cloud TPU docs (bfloat16); §1",
            "TPU: about 1× (0.5–2×); Ampere+ GPU: up to ~2× (TF32)",
            where=compare_matmul_dtypes,
            figure="speed",
            op="within",
            threshold=BF16_SPEED_RANGE,
        ),
        report.Declared(
            "01.bfloat16_halves_bytes",
            "bfloat16 halves the bytes of every matrix (the gain you can count on, on any hardware)",
            "bfloat16 format; §1",
            "2.00×",
            where=compare_matmul_dtypes,
        ),
    ],
)


def claims(r: dict) -> list:
    """Lesson 01's claims from the notebook's results."""
    standin = r["standin"]  # CPU devices answering as a GPU or TPU: its code paths run, its hardware does not
    on_tpu = r["kind"] == "TPU" and not standin
    recipes, split, matmul = r["recipes"], r["split"], r["matmul"]
    per_replica_batch = r["per_replica_batch"]
    chance = 1 / r["num_classes"]
    old_recipes_fail = all(row["outcome"].startswith("raises") for row in recipes[:2])
    f32, bf16 = matmul["rates"]["float32"], matmul["rates"]["bfloat16"]
    bytes_ratio = matmul["bytes"]["float32"] / matmul["bytes"]["bfloat16"]
    matmul_id = "01.tpu_faster_than_cpu"
    if standin:
        matmul_claim = CLAIMS.judge(
            matmul_id,
            f"{bf16.tflops:.2f} TFLOP/s bfloat16 on CPU devices",
            None,
            f"a {standin.upper()} stand-in: CPU devices answering as one, not its hardware",
        )
    elif r["kind"] == "CPU":
        matmul_claim = CLAIMS.judge_samples(matmul_id, f32.samples, unit=f" TFLOP/s float32 on CPU, {f32.xla_label}")
    elif on_tpu:
        matmul_claim = CLAIMS.judge_samples(
            matmul_id,
            bf16.samples,
            op=">",
            threshold=TPU_MIN_TFLOPS,
            fmt=".2f",
            unit=f" TFLOP/s bfloat16 on TPU, {bf16.xla_label}",
        )
    else:
        matmul_claim = CLAIMS.judge(
            matmul_id,
            f"{f32.tflops:.2f} TFLOP/s float32 on {r['kind']}",
            None,
            "neither a CPU nor a TPU: compare with your GPU's datasheet",
        )
    return CLAIMS.all(
        [
            CLAIMS.judge(
                "01.old_recipes_fail",
                "; ".join(row["outcome"] for row in recipes[:2]),
                old_recipes_fail if on_tpu else None,
                ""
                if on_tpu
                else "no TPU VM here: what they do on this machine says nothing about one "
                "(the no-argument resolver even constructs wherever TPU_NAME is set)",
            ),
            CLAIMS.judge(
                "01.local_resolver_recipe",
                f"{r['strategy_name']}, {r['replicas']} replica(s)" if on_tpu else "no TPU on this machine",
                (r["strategy_name"] == "TPUStrategy") if on_tpu else None,
                "" if on_tpu else "run on a Colab TPU runtime to test it",
            ),
            CLAIMS.judge(
                "01.detection_never_raises",
                r["demo_fallback"][:70] + "…",
                r["demo_kind"] != "TPU" and "simulated" in r["demo_fallback"],
            ),
            CLAIMS.judge(
                "01.global_batch_split",
                f"{split['global_batch']} → {[s[0] for s in split['per_replica_shapes']]}",
                split["global_batch"] == 4 * per_replica_batch
                and all(s[0] == per_replica_batch for s in split["per_replica_shapes"]),
                per_replica=per_replica_batch,
                global_batch=4 * per_replica_batch,
            ),
            CLAIMS.judge(
                "01.fit_in_scope_trains",
                f"{r['test_acc']:.1%} on {r['kind']} ({r['fit_xla']})",
                r["test_acc"] > 2 * chance,
                chance=chance,
            ),
            CLAIMS.judge(
                "01.optimizer_outside_scope",
                f"Adam: {r['adam_outside']}; SGD: {r['sgd_outside']}",
                r["adam_outside"] == "RuntimeError" and r["sgd_outside"] == "fit ran",
            ),
            CLAIMS.judge(
                "01.model_outside_scope",
                f"uses strategy: {r['model_c_uses_strategy']}; 4 replicas: {r['outside_scope_on_4'][:40]}",
                (not r["model_c_uses_strategy"] or r["replicas"] > 1) and "raised" in r["outside_scope_on_4"],
            ),
            xla_on_replicas_claim(r["xla_replicas"]),
            matmul_claim,
            bfloat16_speed_claim(matmul["speed_vs_first"]["bfloat16"], bf16.xla_label, r["kind"], standin),
            CLAIMS.judge(
                "01.bfloat16_halves_bytes",
                f"{matmul['bytes']['float32'] / 2**20:.2f} MiB vs {matmul['bytes']['bfloat16'] / 2**20:.2f} MiB = "
                f"{bytes_ratio:.2f}×",
                bytes_ratio == 2.0,
            ),
        ]
    )


def cpu_bf16_speed_note(speed: Samples, xla_label: str) -> str:
    """What a CPU's bfloat16 ÷ float32 matmul speed says about it (lesson 01 §1): measured on the course's machines,
    2-core AMD EPYC (Zen 4, AVX512-BF16): 1.79× without XLA, 0.92–0.99× with XLA."""
    median = speed.median
    if "with XLA" in xla_label:
        what = "XLA on a CPU ran them at about the same speed (measured 0.92–0.99× on an AVX512-BF16 CPU)"
    elif median >= 1.3:
        what = (
            "this CPU has bfloat16 matrix instructions its float32 path lacks (AVX512-BF16: about 2×, "
            "1.79× on an AMD Zen 4; AMX: several times)"
        )
    elif median < 0.8:
        what = "this CPU converts bfloat16 in software (no bfloat16 matrix instructions): slower"
    else:
        what = "this CPU ran them at about the same speed"
    return f"a TPU's and a GPU's claim; on this CPU {speed.format('.2f', '×')}: {what}"


def bfloat16_speed_claim(speed: Samples, xla_label: str, kind: str, standin: str) -> Claim:
    """§1: bfloat16 ÷ float32 matmul speed, judged on a TPU (about 1×) or a GPU (up to ~2×, TF32); on a CPU or a
    stand-in not measurable — a CPU's ratio says what its instructions do, not what a TPU does."""
    if kind == "CPU" or standin:
        note = (
            cpu_bf16_speed_note(speed, xla_label)
            if not standin
            else f"a {standin.upper()} stand-in: CPU devices answering as one, not its hardware; "
            + cpu_bf16_speed_note(speed, xla_label)
        )
        return CLAIMS.judge(
            "01.bfloat16_matmul_speed", speed.format(".2f", f"× ({xla_label})"), None, note, samples=list(speed.values)
        )
    return CLAIMS.judge_samples(
        "01.bfloat16_matmul_speed",
        speed,
        unit=f"× ({xla_label})",
        differs_here={
            "GPU": "float32 runs as TF32 on Ampere+ GPUs, whose peak is half of bfloat16's: up to ~2× there",
            "multi-GPU": "float32 runs as TF32 on Ampere+ GPUs: up to ~2× there",
        }.get(kind, ""),
    )


def xla_on_replicas_claim(x: dict | None):
    """fit with jit_compile=True fails on several MirroredStrategy replicas; the course's rule trains; a custom loop
    compiled per replica matches the same loop without XLA."""
    claim_id = "01.fit_xla_on_replicas"
    if not x:
        return CLAIMS.judge(claim_id, "not measured", None, "the notebook did not run the 2-replica check")
    if x["replicas"] < 2 or x.get("kind") == "TPU":  # TPUStrategy compiles across replicas itself
        return CLAIMS.judge(
            claim_id,
            f"{x['replicas']} replica(s): {x['jit_true']}",
            None,
            "TPUStrategy compiles every step across its replicas: this MirroredStrategy failure cannot happen there",
        )
    same = x["custom_loop_max_diff"] <= 1e-5 and x["custom_loop_moved"] > 1e-4
    return CLAIMS.judge(
        claim_id,
        f"{x['replicas']} replicas: {x['jit_true'][:60]}; rule {x['rule']} trained; custom loop Δ "
        f"{x['custom_loop_max_diff']:.1e}",
        x["jit_true"].startswith("InvalidArgumentError") and x["rule_trained"] and not x["rule"][0] and same,
    )


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


__all__ = [
    "resolver_recipes",
    "split_one_batch",
    "fit_xla_on_replicas",
    "xla_on_replicas_claim",
    "compare_matmul_dtypes",
    "optimizer_outside_scope",
    "claims",
    "V5E_PEAK_TFLOPS",
    "OUTSIDE_SCOPE_ON_4",
]
