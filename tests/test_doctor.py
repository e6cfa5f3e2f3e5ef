"""`python -m course_utils doctor`: exit codes and the exact fix lines. No network: the probe is replaced."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from course_utils import doctor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def no_network_and_no_tpu(monkeypatch):
    monkeypatch.setattr(doctor, "_dataset_reachable", lambda timeout=3.0: (False, "storage.googleapis.com: timeout"))
    monkeypatch.setattr(doctor, "tpu_hints", lambda: [])
    monkeypatch.setattr(doctor, "_tfds_has_cifar10", lambda: None)
    for var in ("COURSE_DATA", "COURSE_CPU_REPLICAS", "COURSE_DEVICE", "COURSE_OFFLINE"):
        monkeypatch.delenv(var, raising=False)


def _fake_versions(monkeypatch, **versions):
    real = doctor._version_of
    monkeypatch.setattr(doctor, "_version_of", lambda m: versions[m] if m in versions else real(m))


def test_cpu_machine_can_run_and_names_the_fallback(capsys):
    code = doctor.main([])
    out = capsys.readouterr().out
    assert code == 0
    assert "Accelerator: CPU, 1 replica(s). Fell back: TPU — none found" in out
    assert "GPU — none visible to TensorFlow" in out
    assert "Result: the course can run here" in out


def test_unreachable_dataset_is_a_warning_naming_offline_options(capsys):
    assert doctor.main([]) == 0
    out = capsys.readouterr().out
    assert "! Dataset: CIFAR-10 source not reachable (storage.googleapis.com: timeout)" in out
    assert "COURSE_DATA=synthetic" in out and "COURSE_DATA=npz:" in out


def test_reachable_dataset_is_fine(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "_dataset_reachable", lambda timeout=3.0: (True, "storage.googleapis.com"))
    assert doctor.main([]) == 0
    assert "✔ Dataset: CIFAR-10 source reachable (storage.googleapis.com)" in capsys.readouterr().out


def test_offline_flag_skips_the_probe(monkeypatch, capsys):
    def must_not_run(timeout=3.0):
        raise AssertionError("network probe ran despite --offline")

    monkeypatch.setattr(doctor, "_dataset_reachable", must_not_run)
    assert doctor.main(["--offline"]) == 0
    assert "source not checked (offline mode)" in capsys.readouterr().out


def test_missing_tensorflow_fails_with_the_install_line(monkeypatch, capsys):
    _fake_versions(monkeypatch, tensorflow=None)
    assert doctor.main([]) == 1
    out = capsys.readouterr().out
    assert "✘ TensorFlow: not installed" in out
    assert "fix: pip install -r requirements.txt" in out
    assert "Result: cannot run the course yet — 1 problem(s): TensorFlow: not installed" in out


def test_missing_tensorflow_on_a_tpu_machine_names_the_tpu_build(monkeypatch, capsys):
    _fake_versions(monkeypatch, tensorflow=None)
    monkeypatch.setattr(doctor, "tpu_hints", lambda: ["/dev/vfio/0 exists (TPU v5e/v6e device file)"])
    assert doctor.main([]) == 1
    assert 'fix: pip install "tensorflow-tpu==2.20.0"' in capsys.readouterr().out


def test_keras2_era_tensorflow_is_a_problem(monkeypatch, capsys):
    _fake_versions(monkeypatch, tensorflow="2.15.1")
    assert doctor.main([]) == 1
    assert "2.15.1 bundles Keras 2; the course needs Keras 3" in capsys.readouterr().out


def test_keras2_is_a_problem(monkeypatch, capsys):
    _fake_versions(monkeypatch, keras="2.15.0")
    assert doctor.main([]) == 1
    out = capsys.readouterr().out
    assert "✘ Keras: 2.15.0; the course needs Keras 3" in out and 'fix: pip install "keras>=3.10"' in out


def test_other_tensorflow_3x_is_a_warning_not_a_failure(monkeypatch, capsys):
    _fake_versions(monkeypatch, tensorflow="2.19.1")
    assert doctor.main([]) == 0
    assert "! TensorFlow: 2.19.1 (the course is tested on 2.20.x" in capsys.readouterr().out


def test_bad_setting_and_missing_npz_are_problems(monkeypatch, capsys):
    monkeypatch.setenv("COURSE_DATA", "npz:/nonexistent/cifar10.npz")
    assert doctor.main([]) == 1
    assert "COURSE_DATA points at /nonexistent/cifar10.npz, which does not exist" in capsys.readouterr().out
    monkeypatch.setenv("COURSE_SMOKE", "maybe")
    assert doctor.main([]) == 1
    assert "COURSE_SMOKE='maybe' is not a yes/no value" in capsys.readouterr().out


def test_unknown_option_is_a_usage_error(capsys):
    assert doctor.main(["--frobnicate"]) == 2
    assert "usage: python -m course_utils doctor [--offline]" in capsys.readouterr().err


def test_command_line_entry_point_exits_zero_here():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-m", "course_utils", "doctor", "--offline"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Accelerator:" in proc.stdout and "Result: the course can run here" in proc.stdout


def test_doctor_shows_the_xla_setting_in_a_fresh_process():
    env = dict(os.environ, COURSE_JIT="1")
    proc = subprocess.run([sys.executable, "-m", "course_utils", "doctor", "--offline"],
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "jit=on (XLA, as on a TPU)" in proc.stdout
