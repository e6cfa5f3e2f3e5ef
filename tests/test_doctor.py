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
    monkeypatch.setattr(
        doctor, "_dataset_reachable", lambda timeout=3.0, progress=None: (False, "storage.googleapis.com: timeout")
    )
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


def test_unreachable_dataset_is_a_warning_naming_offline_options(monkeypatch, capsys):
    monkeypatch.setenv("COURSE_DATA", "tfds")  # the download is needed
    assert doctor.main([]) == 0
    out = capsys.readouterr().out
    assert "! Dataset: CIFAR-10 source not reachable (storage.googleapis.com: timeout)" in out
    assert "COURSE_DATA=synthetic" in out and "COURSE_DATA=npz:" in out


def test_unreachable_dataset_is_no_warning_where_the_data_is_not_downloaded(monkeypatch, capsys):
    """Smoke mode (generated data) or an npz needs no download: the quick start's doctor run had a warning to ignore."""
    monkeypatch.setenv("COURSE_DATA", "synthetic")
    assert doctor.main([]) == 0
    out = capsys.readouterr().out
    assert (
        "✔ Dataset: CIFAR-10 source not reachable (storage.googleapis.com: timeout); not needed with "
        "data=synthetic" in out
    )


def test_reachable_dataset_is_fine(monkeypatch, capsys):
    monkeypatch.setattr(
        doctor, "_dataset_reachable", lambda timeout=3.0, progress=None: (True, "storage.googleapis.com")
    )
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


def test_command_line_entry_point_exits_zero_here_in_ascii_and_shows_the_xla_setting():
    """One fresh process for the healthy path: the entry point exits 0, an ASCII terminal gets ASCII marks (not a
    UnicodeEncodeError), and the XLA setting is shown."""
    proc = _doctor({"COURSE_JIT": "1"}, encoding="ascii")
    out = proc.stdout.decode("ascii")  # raises if anything non-ASCII came out
    assert proc.returncode == 0 and "Traceback" not in proc.stderr.decode(errors="replace"), out
    assert "  ok Python:" in out and "Accelerator:" in out and "Result: the course can run here" in out
    assert "jit=on (XLA, as on a TPU)" in out


# -- issue 9 §2: the safety net must not fall ------------------------------------------------------

BAD_SETTINGS = [
    ("COURSE_SMOKE", "maybe"),
    ("COURSE_CPU_REPLICAS", "abc"),
    ("COURSE_CPU_REPLICAS", "0"),
    ("COURSE_CPU_REPLICAS", "1000"),
    ("COURSE_DEVICE", "typo"),
    ("COURSE_DATA", "bogus"),
    ("COURSE_DATA", "npz:"),
    ("COURSE_JIT", "perhaps"),
]


def _doctor(env_updates: dict, *args: str, encoding: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COURSE_")}
    env.update(env_updates, TF_CPP_MIN_LOG_LEVEL="3")
    if encoding:
        env["PYTHONIOENCODING"] = encoding
    return subprocess.run(
        [sys.executable, "-m", "course_utils", "doctor", "--offline", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=300,
    )


# every bad setting in this process (the doctor reads every setting the same way); the class in a fresh process, where
# a learner meets it: a course setting (a number out of range) and a data source
FRESH = [("COURSE_CPU_REPLICAS", "1000"), ("COURSE_DATA", "npz:")]


@pytest.mark.parametrize("name, value", BAD_SETTINGS, ids=[f"{n}={v}" for n, v in BAD_SETTINGS])
def test_each_bad_setting_is_one_problem_and_stops_the_accelerator_check(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    findings = doctor.run_checks(network=False)
    problems = [f for f in findings if f.level == "problem"]
    assert len(problems) == 1 and name in problems[0].detail and problems[0].fix, problems
    accelerator = [f for f in findings if f.name == "Accelerator"]
    assert [f.detail for f in accelerator] == ["not checked: fix the course setting above first"]


@pytest.mark.parametrize("name, value", FRESH, ids=[f"{n}={v}" for n, v in FRESH])
def test_each_kind_of_bad_setting_is_one_clear_problem_in_a_fresh_process(name, value):
    proc = _doctor({name: value})
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 1, out + err
    assert "Traceback" not in out + err
    problems = [line for line in out.splitlines() if line.strip().startswith("✘")]
    assert len(problems) == 1 and name in problems[0], out
    assert "not checked: fix the course setting above first" in out  # no detect() with a bad setting


def test_help_is_not_an_unknown_option():
    for flag in ("-h", "--help"):
        proc = subprocess.run(
            [sys.executable, "-m", "course_utils", "doctor", flag], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0 and "--offline" in proc.stdout and "unknown" not in proc.stderr


def _npz_cases(tmp_path):
    import zipfile

    import numpy as np

    good = dict(
        x_train=np.zeros((4, 32, 32, 3), "uint8"),
        y_train=np.zeros(4, "int64"),
        x_test=np.zeros((2, 32, 32, 3), "uint8"),
        y_test=np.zeros(2, "int64"),
    )
    cases = {}
    (tmp_path / "random.npz").write_bytes(os.urandom(2048))
    cases["random bytes"] = (tmp_path / "random.npz", "not a readable .npz")
    np.savez(tmp_path / "full.npz", **good)
    data = (tmp_path / "full.npz").read_bytes()
    (tmp_path / "truncated.npz").write_bytes(data[: len(data) // 2])
    cases["truncated zip"] = (tmp_path / "truncated.npz", "corrupt or truncated")
    np.save(tmp_path / "single.npy", good["x_train"])
    cases[".npy"] = (tmp_path / "single.npy", "single .npy array")
    np.savez(tmp_path / "objects.npz", **dict(good, y_train=np.array([{"a": 1}] * 4, dtype=object)))
    cases["object array"] = (tmp_path / "objects.npz", "y_train is an object array (pickled")
    np.savez(tmp_path / "missing.npz", x_train=good["x_train"])
    cases["missing members"] = (tmp_path / "missing.npz", "lacks the key(s) y_train, x_test, y_test")
    np.savez(tmp_path / "empty.npz", **dict(good, x_train=np.zeros((0, 32, 32, 3), "uint8")))
    cases["empty"] = (tmp_path / "empty.npz", "x_train has 0 images")
    with zipfile.ZipFile(tmp_path / "crc.npz", "w", zipfile.ZIP_STORED) as z:
        for k, v in good.items():
            import io

            buf = io.BytesIO()
            np.save(buf, v)
            z.writestr(k + ".npy", buf.getvalue())
    raw = bytearray((tmp_path / "crc.npz").read_bytes())
    raw[200] ^= 0xFF  # flip a byte inside the first member's data: CRC mismatch
    (tmp_path / "crc.npz").write_bytes(bytes(raw))
    cases["CRC broken"] = (tmp_path / "crc.npz", "corrupt or truncated in member x_train")
    cases["directory"] = (tmp_path, "not a file")
    np.savez(tmp_path / "labels.npz", **dict(good, y_test=np.full(2, 12, "int64")))
    cases["labels out of range"] = (tmp_path / "labels.npz", "labels from 12 to 12")  # "can run" before
    np.savez(tmp_path / "floats.npz", **dict(good, x_test=np.zeros((2, 32, 32, 3), "float32")))
    cases["float images"] = (tmp_path / "floats.npz", "x_test has dtype float32")
    return cases


def test_each_npz_defect_is_named(tmp_path):
    for what, (path, expected) in _npz_cases(tmp_path).items():
        problem = doctor._npz_problem(str(path))
        assert problem is not None and expected in problem, (what, problem)
        assert "allow_pickle" not in problem and "\n" not in problem, (what, problem)
    np = pytest.importorskip("numpy")
    ok = tmp_path / "ok.npz"
    np.savez(
        ok,
        x_train=np.zeros((4, 32, 32, 3), "uint8"),
        y_train=np.zeros(4, "int64"),
        x_test=np.zeros((2, 32, 32, 3), "uint8"),
        y_test=np.zeros(2, "int64"),
    )
    assert doctor._npz_problem(str(ok)) is None


@pytest.mark.extended  # a fresh-process scenario: .ci/run runs it after the README's pytest
def test_a_corrupt_npz_is_a_problem_in_a_fresh_process(tmp_path):
    (tmp_path / "bad.npz").write_bytes(b"not a zip at all")
    proc = _doctor({"COURSE_DATA": f"npz:{tmp_path / 'bad.npz'}"})
    out = proc.stdout.decode()
    assert proc.returncode == 1 and "Traceback" not in out + proc.stderr.decode()
    assert "✘ Dataset:" in out and "not a readable .npz" in out


def test_unreadable_tfds_folder_is_not_a_crash(tmp_path, monkeypatch):
    folder = tmp_path / "cifar10"
    folder.mkdir()
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(os, "listdir", lambda p: (_ for _ in ()).throw(PermissionError(13, "Permission denied")))
    assert doctor._tfds_has_cifar10() is None


def test_network_errors_in_plain_words():
    import socket

    assert "look up the host name" in doctor._plain_network_error(socket.gaierror(-2, "Name or service not known"))
    assert "no answer in time" in doctor._plain_network_error(socket.timeout("timed out"))
    assert "refused" in doctor._plain_network_error(ConnectionRefusedError(111, "Connection refused"))


def test_every_warning_has_a_fix_line(monkeypatch):
    from course_utils import config, runtime

    def no_tpu(resolver_factory=None):
        # TPUClusterResolver's own failure took 2 s to 32 s in this long-lived process (30 s once in a full run):
        # what is checked here is the doctor's wording, not TensorFlow's TPU probe
        raise ValueError("Please provide a TPU Name to connect to.")

    monkeypatch.setattr(runtime, "connect_tpu", no_tpu)
    monkeypatch.setenv("COURSE_DEVICE", "tpu")

    config.reload()
    try:
        findings = doctor.run_checks(network=True, reachable=lambda: (False, "storage.googleapis.com: no answer"))
    finally:
        monkeypatch.delenv("COURSE_DEVICE")
        config.reload()
    warnings = [f for f in findings if f.level == "warn"]
    assert warnings and all(f.fix for f in warnings), [f for f in warnings if not f.fix]
    assert any("COURSE_DEVICE=tpu" in f.detail for f in warnings)


def test_a_module_that_fails_to_import_is_a_finding_not_a_crash(monkeypatch):
    from google.protobuf.runtime_version import VersionError

    def version_of(module):
        if module == "tensorflow_datasets":
            raise VersionError(
                "Detected incompatible Protobuf Gencode/Runtime versions when loading "
                "tensorflow_metadata/proto/v0/schema.proto: gencode 6.31.1 runtime 5.29.5."
            )
        return doctor._version_of(module)

    findings = {f.name: f for f in doctor.run_checks(network=False, version_of=version_of)}
    tfds = findings["tensorflow-datasets"]
    assert tfds.level == "warn"
    assert tfds.detail.startswith("installed but fails to import (VersionError: Detected incompatible Protobuf")
    assert "pip install -U protobuf" in tfds.fix and "COURSE_DATA=npz:" in tfds.fix

    def broken_tf(module):
        if module == "tensorflow":
            raise ImportError("libcudart.so.12: cannot open shared object file")
        return doctor._version_of(module)

    findings = {f.name: f for f in doctor.run_checks(network=False, version_of=broken_tf)}
    tf = findings["TensorFlow"]
    assert tf.level == "problem" and tf.detail.startswith("installed but fails to import (ImportError: libcudart")
    assert 'pip install -U "tensorflow"' in tf.fix and "Accelerator" not in findings


@pytest.mark.extended  # a fresh-process scenario: .ci/run runs it after the README's pytest
@pytest.mark.parametrize("swallows", [False, True], ids=["raises", "swallows"])
def test_a_tfds_that_fails_to_import_in_a_fresh_process(tmp_path, swallows):
    """As on Colab when tensorflow-metadata's generated code is newer than the installed protobuf. tfds 4.9.10
    itself swallows the error in its __init__ (logs a traceback, leaves no `load`): both must be one warning."""
    package = tmp_path / "tensorflow_datasets"
    package.mkdir()
    failing = package / ("public_api.py" if swallows else "__init__.py")
    failing.write_text(
        "from google.protobuf.runtime_version import VersionError\n"
        "raise VersionError('Detected incompatible Protobuf Gencode/Runtime versions when loading "
        "tensorflow_metadata/proto/v0/schema.proto: gencode 6.31.1 runtime 5.29.5. Runtime version cannot be older "
        "than the linked gencode version.')\n"
    )
    if swallows:
        (package / "__init__.py").write_text(
            "try:\n    from tensorflow_datasets.public_api import *  # noqa\n"
            "except Exception:\n    from absl import logging\n    logging.exception('tfds failed to import')\n"
        )
    proc = _doctor({"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert "Traceback" not in out + err and proc.returncode == 0, out + err  # a warning: lessons 01-03 still run
    line = next(line for line in out.splitlines() if "tensorflow-datasets:" in line)
    assert line.strip().startswith(
        "! tensorflow-datasets: installed but fails to import (VersionError: Detected incompatible Protobuf"
    )
    assert "pip install -U protobuf" in out  # and no version claimed: the line starts with "installed but fails"


# -- importing TensorFlow kills the process (SIGILL on a CPU without AVX) -------------------------------------------


def _fake_tensorflow(tmp_path, signal_name: str):
    package = tmp_path / "tensorflow"
    package.mkdir()
    (package / "__init__.py").write_text(f"import os, signal\nos.kill(os.getpid(), signal.{signal_name})\n")
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}


def test_a_tensorflow_import_that_kills_the_process_is_one_line_in_a_fresh_process(tmp_path):
    """As on an old CPU without AVX: the TensorFlow wheel's first instruction it lacks is SIGILL, and the doctor
    died silently with it."""
    proc = _doctor(_fake_tensorflow(tmp_path, "SIGILL"))
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 1, (proc.returncode, out + err)
    assert "Traceback" not in out + err
    problems = [line.strip() for line in out.splitlines() if line.strip().startswith("✘")]
    assert len(problems) == 1, out
    assert problems[0].startswith(
        "✘ TensorFlow: importing TensorFlow killed the process (SIGILL: illegal instruction) "
        "— this CPU lacks instructions TensorFlow's wheel needs (AVX); use Colab or a newer "
        "machine"
    ), problems[0]
    assert "Result: cannot run the course yet — 1 problem(s): TensorFlow: importing TensorFlow killed" in out
    assert "Accelerator:" not in out  # nothing else tried to import it (which would have killed the doctor)


@pytest.mark.parametrize("signal_name, words", [("SIGSEGV", "segmentation fault"), ("SIGABRT", "aborted")])
def test_other_signals_on_import_are_named_too(signal_name, words):
    import signal

    detail, fix = doctor.describe_import_death(-getattr(signal, signal_name))
    assert f"importing TensorFlow killed the process ({signal_name}: {words})" in detail and fix
    assert "AVX" not in detail


def test_the_import_probe_reads_exit_statuses():
    import signal

    assert doctor.describe_import_death(0) is None and doctor.describe_import_death(1) is None  # an ImportError
    detail, _ = doctor.describe_import_death(-signal.SIGILL)
    assert "AVX" in detail
    detail, _ = doctor.describe_import_death(0xC000001D)  # Windows' STATUS_ILLEGAL_INSTRUCTION
    assert "illegal instruction" in detail


def test_the_module_entry_point_reads_its_own_arguments():
    """`python -m course_utils.doctor --bogus` exited 0 with no output (the fifth hostile pass): the module ran no
    main and read no argument. It now ends as `python -m course_utils doctor --bogus`: one line, exit 2."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "course_utils.doctor", "--bogus"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout)
    assert (
        proc.stderr.strip()
        == "doctor: unknown option(s) --bogus; usage: python -m course_utils doctor [--offline] [-h]"
    )


def test_a_reader_that_goes_away_ends_the_doctor_quietly():
    """`doctor | head -1` ended in a BrokenPipeError traceback (the fifth hostile pass). Its first line is printed
    before the slow checks; the reader closes the pipe after it, and the doctor's later lines find no reader: it
    stops quietly with 141 (128 + SIGPIPE, what a shell reports for such a writer), no traceback."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "course_utils", "doctor", "--offline"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    assert first.startswith("course_utils doctor"), first
    assert proc.returncode == 141 and "Traceback" not in err and "BrokenPipe" not in err, (proc.returncode, err)
