"""The capstone trainer (course_utils.capstone): CLI, recipes, budget, resume after SIGKILL, bad options.

Synthetic data in smoke sizes throughout. The synthetic classes are colour patterns that are *not* mirror
symmetric, so runs that must learn fast turn flip augmentation and flip TTA off (``--no-augment --no-tta``);
the course recipe's other parts (ResNet, policy, schedule, label smoothing) stay on.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from course_utils import capstone, data

ENV = dict(os.environ, COURSE_SMOKE="1", COURSE_CPU_REPLICAS="1", COURSE_DATA="synthetic")
ENV.pop("COURSE_JIT", None)
SMOKE = ["--data", "synthetic", "--train-examples", "1024", "--test-examples", "256", "--quiet"]
LEARNABLE = ["--no-augment", "--no-tta", "--width", "8", "--batch-size", "64"]


def cli(args, timeout=120):
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "course_utils.capstone", *args], env=ENV, capture_output=True,
                          text=True, timeout=timeout)
    return proc, time.perf_counter() - start


def read(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 3-epoch run of the course recipe: the CLI smoke run, and a finished run for --resume."""
    out = tmp_path_factory.mktemp("capstone") / "ref"
    proc, seconds = cli([*SMOKE, *LEARNABLE, "--epochs", "3", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, proc, seconds


def test_cli_smoke_run_learns_and_writes_its_files(reference):
    out, proc, seconds = reference
    assert seconds <= 60, f"smoke CLI run took {seconds:.1f} s"
    summary, metrics = read(out / "summary.json"), read(out / "metrics.json")
    assert [m["epoch"] for m in metrics] == [1, 2, 3]
    assert summary["test_accuracy"] >= 0.5, summary["test_accuracy"]  # chance is 0.1
    assert summary["recipe"] == "course" and summary["epochs"] == 3
    assert summary["data"] == "synthetic" and summary["train_examples"] == 1024
    for key in ("wall_time_s", "images_per_s_per_replica", "peak_memory_bytes", "peak_memory_method", "policy",
                "tf_version", "keras_version", "hardware", "options"):
        assert summary[key], key
    assert summary["options"]["width"] == 8 and summary["options"]["augment"] is False
    assert summary["peak_memory_bytes"] > 1 << 20
    assert 0 < metrics[-1]["elapsed_s"] <= summary["wall_time_s"]
    assert metrics[0]["elapsed_s"] < metrics[1]["elapsed_s"] < metrics[2]["elapsed_s"]
    # One line per epoch with elapsed s, train loss, test accuracy, images/s.
    lines = [line for line in proc.stdout.splitlines() if line.startswith("epoch ")]
    assert len(lines) == 3 and all("train loss" in x and "test acc" in x and "images/s" in x for x in lines)
    assert (out / "best.weights.h5").exists()
    assert not (out / "backup").exists()  # BackupAndRestore removes its backup after a finished run


def test_npz_data_baseline_and_tensorboard(tmp_path):
    path = str(tmp_path / "mini.npz")
    data.write_npz(path, *data.synthetic_cifar(1024, 128, seed=3))
    tb = tmp_path / "tb"
    proc, _ = cli(["--data", f"npz:{path}", "--recipe", "baseline", "--epochs", "4", "--quiet",
                   "--out", str(tmp_path / "out"), "--tensorboard", str(tb)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = read(tmp_path / "out" / "summary.json")
    assert summary["data"] == f"npz:{path}"
    assert (summary["train_examples"], summary["test_examples"]) == (1024, 128)
    assert summary["recipe"] == "baseline" and summary["policy"] == "float32" and summary["global_batch"] == 64
    assert summary["test_accuracy"] > 0.3
    assert glob.glob(str(tb / "train" / "events.out.tfevents.*"))
    assert glob.glob(str(tb / "train" / "plugins" / "profile" / "*" / "*.xplane.pb")), "no profile written"


BAD_OPTIONS = [
    (["--recipe", "fastest", "--epochs", "1"], "unknown recipe 'fastest'"),
    (["--time-budget", "0"], "--time-budget must be a positive number"),
    (["--time-budget", "-5"], "--time-budget must be a positive number"),
    (["--epochs", "1", "--batch-size", "30", "--cpu-replicas", "4"], "not divisible by replicas × accumulate = 4 × 1"),
    (["--epochs", "1", "--batch-size", "64", "--accumulate", "3"], "not divisible by replicas × accumulate = 1 × 3"),
    (["--epochs", "1", "--accumulate", "0"], "--accumulate must be at least 1"),
    (["--epochs", "1", "--data", "npz:/no/such/cifar.npz"], "'/no/such/cifar.npz' does not exist"),
    (["--epochs", "1", "--policy", "float8"], "unknown policy 'float8'"),
    (["--epochs", "1", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["--data", "synthetic"], "give exactly one of --time-budget SECONDS or --epochs N"),
]


@pytest.mark.parametrize("args,message", BAD_OPTIONS, ids=[m for _, m in BAD_OPTIONS])
def test_bad_option_one_line_exit_2_before_tensorflow(args, message):
    code = ("import sys; from course_utils import capstone; rc = capstone.main(sys.argv[1:]); "
            "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'; sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, *args], env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("capstone: error: ") and message in lines[0], proc.stderr


def test_bad_option_through_python_dash_m():
    proc, seconds = cli(["--recipe", "nope", "--epochs", "1"])
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "capstone: error: unknown recipe 'nope'; use --recipe course or --recipe baseline (see --help)"]
    assert proc.stdout == ""


def test_unreadable_data_is_a_data_error_not_synthetic(tmp_path):
    path = tmp_path / "broken.npz"
    np.savez(path, x_train=np.zeros((4, 32, 32, 3), np.uint8))  # lacks y_train, x_test, y_test
    proc, _ = cli(["--data", f"npz:{path}", "--epochs", "1", "--out", str(tmp_path / "o")])
    assert proc.returncode == 1
    assert "capstone: data error:" in proc.stderr and "lacks the key(s) y_train, x_test, y_test" in proc.stderr
    assert "Traceback" not in proc.stderr and "SYNTHETIC" not in proc.stdout


def test_tfds_failure_raises_data_source_error(monkeypatch, tmp_path):
    def fail(**kwargs):
        raise ConnectionError("no network here")

    monkeypatch.setattr(data, "_tfds_load", fail)
    with pytest.raises(data.DataSourceError, match="npz"):  # names the offline way out
        capstone.train(capstone.Options(data="tfds", epochs=1, out=str(tmp_path / "o"), verbose=-1))


def test_resume_of_a_finished_run_is_one_line_exit_2(reference):
    """Kill-and-resume itself runs once, in lesson 06 (its claim reads the trainer's own evidence: see
    test_lesson_claims_0406); a finished run has nothing to resume."""
    ref_out, args = reference[0], [*SMOKE, *LEARNABLE, "--epochs", "3", "--out", str(reference[0])]
    metrics = read(ref_out / "metrics.json")
    again, _ = cli([*args, "--resume"])
    assert again.returncode == 2 and "has finished (summary.json); nothing to resume" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1 and read(ref_out / "metrics.json") == metrics


def test_a_backup_cut_off_mid_write_is_repaired_on_resume(tmp_path):
    """A kill while BackupAndRestore writes leaves a file Keras cannot load (seen: 'bad object header version
    number' on --resume). repair_backup falls back to the previous complete pair, or starts over."""
    import h5py

    backup = tmp_path / "backup"

    def write_pair(suffix: str, epoch: int) -> None:
        with h5py.File(backup / f"latest.weights.h5{suffix}", "w") as f:
            f["layers/dense/vars/0"] = np.full((3, 2), float(epoch))
        (backup / f"training_metadata.json{suffix}").write_text(json.dumps({"epoch": epoch, "batch": 0}))

    backup.mkdir()
    write_pair("", 2)
    assert capstone.repair_backup(str(backup)) == ""  # complete: untouched
    assert capstone.repair_backup(str(tmp_path / "none")) == ""  # no backup at all: nothing to do

    write_pair(".bkp", 1)
    (backup / "latest.weights.h5").write_bytes((backup / "latest.weights.h5").read_bytes()[:300])  # cut off
    message = capstone.repair_backup(str(backup))
    assert "resuming from the one before it" in message
    with h5py.File(backup / "latest.weights.h5", "r") as f:
        assert f["layers/dense/vars/0"][0, 0] == 1.0
    assert json.loads((backup / "training_metadata.json").read_text())["epoch"] == 1

    write_pair("", 2)
    (backup / "training_metadata.json").write_text('{"epo')  # killed while writing the metadata
    assert "resuming from the one before it" in capstone.repair_backup(str(backup))
    assert json.loads((backup / "training_metadata.json").read_text())["epoch"] == 1

    for name in ("latest.weights.h5.bkp", "training_metadata.json.bkp", "training_metadata.json"):
        (backup / name).unlink()
    (backup / "latest.weights.h5").write_bytes(b"\x89HDF\r\n")  # the first save, cut off: nothing to fall back on
    assert "starts again from epoch 1" in capstone.repair_backup(str(backup))
    assert not backup.exists()


def test_budget_run_ends_within_one_epoch_of_budget(tmp_path):
    budget = 10  # 7-8 epochs of ~0.7 s here after ~4 s of setting up
    proc, seconds = cli([*SMOKE, *LEARNABLE, "--time-budget", str(budget), "--out", str(tmp_path / "b")])
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary, metrics = read(tmp_path / "b" / "summary.json"), read(tmp_path / "b" / "metrics.json")
    epoch = max(m["epoch_time_s"] for m in metrics)
    assert summary["budget_s"] == budget and summary["wall_time_s"] == summary["budget_used_s"]
    assert summary["wall_time_s"] <= budget + epoch, (summary["wall_time_s"], epoch)
    assert seconds <= budget + epoch + 3  # + the interpreter's start, before the clock starts
    assert summary["wall_time_s"] >= budget - 2 * epoch - 3, "the budget was not used"
    assert summary["epochs"] >= 2
    assert summary["test_accuracy"] > 0.3


def test_python_api_result_and_predictions(tmp_path):
    opts = capstone.Options(data="synthetic", epochs=1, out=str(tmp_path / "api"), width=4, train_examples=256,
                            test_examples=64, batch_size=64, verbose=-1)
    result = capstone.train(opts)
    assert result.summary == read(tmp_path / "api" / "summary.json")
    assert result.history == read(tmp_path / "api" / "metrics.json")
    preds = result.predict_test()
    assert preds.tta is True and preds.images.shape == (64, 32, 32, 3) and preds.images.dtype == np.uint8
    assert preds.predicted.shape == preds.labels.shape == (64,) and preds.probs.shape == (64, 10)
    assert preds.accuracy == pytest.approx(result.summary["test_accuracy"])
    plain = result.predict_test(tta=False)
    assert plain.accuracy == pytest.approx(result.summary["test_accuracy_no_tta"])
    assert result.summary["options"]["label_smoothing"] == 0.2 and result.summary["options"]["schedule"] == "onecycle"


def test_options_defaults_and_lr_rule():
    course, base = capstone.Options().resolved(), capstone.Options(recipe="baseline").resolved()
    assert (course.augment, course.tta, course.label_smoothing, course.schedule) == (True, True, 0.2, "onecycle")
    assert (base.augment, base.tta, base.label_smoothing, base.schedule, base.batch_size) == (
        False, False, 0.0, "constant", 64)
    assert capstone.peak_learning_rate(512) == pytest.approx(2 * capstone.peak_learning_rate(256))
    with pytest.raises(capstone.OptionsError, match="exactly one"):
        capstone.validate(capstone.Options(epochs=2, time_budget=10))


def test_tensorboard_missing_is_a_clear_options_error(monkeypatch, tmp_path):
    """TensorFlow 2.21 no longer installs tensorboard, which the TensorBoard callback's summaries need: --tensorboard
    without it is refused before training, with the install line (not a TBNotInstalledError mid-run)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(capstone.OptionsError, match="pip install tensorboard"):
        capstone.validate(capstone.Options(epochs=1, tensorboard=str(tmp_path)))
    capstone.validate(capstone.Options(epochs=1))  # without --tensorboard it is not needed
    monkeypatch.undo()
    assert capstone.tensorboard_installed()  # declared in requirements*.txt and the notebook extra


def test_schedule_warms_up_then_decays_to_zero():
    schedule = capstone._schedule_class()(0.4, "onecycle")
    schedule.set_plan(10, 100)
    values = [schedule.value(s) for s in range(100)]
    assert values[0] < 0.05 and max(values) == pytest.approx(0.4) and int(np.argmax(values)) == 9
    assert values[-1] == pytest.approx(0.4 / 90, rel=1e-3) and schedule.value(100) == 0.0
    assert all(a >= b for a, b in zip(values[9:], values[10:]))
    schedule.set_plan(10, 50)  # a shrunk plan: the decay now ends at step 50
    assert schedule.value(50) == 0.0 and schedule.value(30) == pytest.approx(0.4 * 20 / 40)


def test_steps_per_execution_under_mirrored_strategy_is_refused_clearly(tmp_path):
    # Keras 3 fails inside fit with "You must feed a value for placeholder tensor" (keras-team/keras#19246).
    proc, _ = cli([*SMOKE, "--epochs", "1", "--cpu-replicas", "2", "--steps-per-execution", "2",
                   "--out", str(tmp_path / "o")])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("capstone: error: --steps-per-execution 2 fails under MirroredStrategy")
    assert "Traceback" not in proc.stderr


def test_auto_width_rule():
    rule = capstone.AUTO_WIDTH
    enough = int(rule["min_epochs"] * rule["cost_of_doubling"]) + 1
    assert capstone.next_width(16, enough, [16]) == 32  # a doubled net still gets min_epochs
    assert capstone.next_width(16, enough - 2, [16]) is None
    assert capstone.next_width(32, enough, [16, 32]) == 64
    assert capstone.next_width(64, 10 * enough, [16, 32, 64]) is None  # the widest
    assert capstone.next_width(16, rule["narrow_below_epochs"] - 1, [16]) == 8
    assert capstone.next_width(32, 1, [16, 32]) is None  # never turns back after widening
    assert capstone.next_width(8, enough, [16, 8]) is None  # nor after narrowing


def _tiny_model_and_data(test_batch: int):
    """A compiled two-layer model, 8 training batches of 32 and 64 test examples in batches of ``test_batch``."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = np.random.rand(256, 8).astype("float32"), np.random.randint(0, 2, 256)
    train = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    test = tf.data.Dataset.from_tensor_slices((x[:64], y[:64])).batch(test_batch)
    return model, train, test


def test_warm_up_estimate_with_one_test_batch_excludes_compiling():
    # With a single test batch the first evaluate() call is all tracing and compiling; fit's evaluations reuse
    # the compiled function, so the estimate must come from a compiled call (it was the first call: a 10 s budget
    # then planned 1 epoch where 3 fitted).
    model, train, test = _tiny_model_and_data(test_batch=64)  # one test batch
    before = [v.numpy() for v in model.variables]
    est = capstone._warm_up(model, train, test, 1, 8, 1)
    start = time.perf_counter()
    model.evaluate(test, verbose=0)
    compiled = time.perf_counter() - start
    assert est["eval_step_s"] < 3 * compiled + 0.02, (est, compiled)
    assert est["compile_s"] > 5 * est["eval_step_s"], est
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, model.variables))  # weights put back


def test_warm_up_stops_after_the_compiling_step_when_told_the_budget_is_spent():
    model, train, test = _tiny_model_and_data(test_batch=32)  # two test batches
    before = [v.numpy() for v in model.variables]
    asked = []
    est = capstone._warm_up(model, train, test, 1, 8, 2, one_epoch_only=lambda: asked.append(1) or True)
    assert asked == [1]  # asked once, after the first (compiling) call
    assert est["compile_s"] > 0 and est["train_step_s"] is None and est["eval_epoch_s"] is None, est
    assert model.test_function is None  # no evaluation was run to time
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, model.variables))  # weights put back
    # not told: it times steps and an evaluation
    est = capstone._warm_up(model, train, test, 1, 8, 2, one_epoch_only=lambda: False)
    assert est["train_step_s"] > 0 and est["eval_step_s"] > 0 and model.test_function is not None


def test_a_budget_spent_by_compiling_plans_one_epoch_without_timing_steps(tmp_path, capsys):
    opts = capstone.Options(data="synthetic", time_budget=1.0, out=str(tmp_path / "tiny"), width=4,
                            train_examples=256, test_examples=64, batch_size=64, verbose=0)
    result = capstone.train(opts)
    out = capsys.readouterr().out
    assert "→ 1 epoch (no time left to time steps)" in out, out
    plan = read(tmp_path / "tiny" / "plan.json")
    assert plan["train_step_s"] is None and plan["compile_s"] > 0 and plan["width_trials"] == [[4, None, 1]]
    assert result.summary["epochs"] == 1 and len(result.history) == 1 and result.summary["test_accuracy"] >= 0
