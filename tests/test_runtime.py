"""Runtime detection: the strategy for 1 and 4 CPU replicas, the TPU path and its fallbacks."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import types

import pytest

from course_utils import runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _runtime_in_fresh_process(replicas: int) -> dict:
    """TensorFlow fixes its devices at start-up, so each CPU split needs its own process."""
    env = dict(os.environ, COURSE_CPU_REPLICAS=str(replicas), COURSE_DEVICE="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, "-m", "course_utils.runtime", "--fit"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "replicas, strategy_name",
    [
        (1, "OneDeviceStrategy"),
        pytest.param(4, "MirroredStrategy", marks=pytest.mark.extended),
    ],  # a fresh 4-replica process: .ci/run
)
def test_cpu_strategy_has_the_requested_replicas_and_fit_works(replicas, strategy_name):
    info = _runtime_in_fresh_process(replicas)
    assert info["kind"] == "CPU"
    assert info["strategy_name"] == strategy_name
    assert info["num_replicas"] == replicas
    assert info["strategy_replicas"] == replicas  # the real strategy agrees with the summary
    assert info["device_names"] == [f"/device:CPU:{i}" for i in range(replicas)]
    assert len(info["fit_losses"]) == 2 and all(math.isfinite(v) for v in info["fit_losses"])
    assert any("device='cpu' requested" in n for n in info["notes"])  # it says why it is on CPU


def test_one_global_batch_splits_evenly_across_replicas():
    from course_utils.lessons.tpu_initialization.experiments import split_one_batch

    split = runtime.run_with_replicas(2, None, split_one_batch, per_replica_batch=8)
    assert split["where"] == "a fresh process with 2 CPU replicas"
    assert split["replicas"] == 2
    assert split["global_batch"] == 16
    assert split["per_replica_shapes"] == [[8, 32, 32, 3], [8, 32, 32, 3]]
    assert split["per_replica_ids"] == [list(range(8)), list(range(8, 16))]  # consecutive slices, no overlap
    assert [d.split(":")[-1] for d in split["devices"]] == ["0", "1"]


def test_one_device_strategy_is_one_replica_on_the_first_device_beside_a_mirrored_strategy():
    """Lesson 04's single-device timings and the capstone's one-device trainer: on a CPU split into 2 replicas the
    runtime's strategy has 2, one_device_strategy 1, and what is built and fitted under it lives on CPU:0 — under
    TensorFlow's default strategy, not OneDeviceStrategy (whose per-device datasets always autotune: the
    iterator-teardown wait that test_capstone's epoch-start test measures)."""
    code = """
import json
import keras, numpy as np, tensorflow as tf
from course_utils import runtime
rt = runtime.detect()
one = rt.one_device_strategy()
with one.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
model.fit(np.ones((8, 4)), np.ones((8, 1)), verbose=0)
print(json.dumps({"runtime": rt.strategy.num_replicas_in_sync, "one": one.num_replicas_in_sync,
                  "default": one is tf.distribute.get_strategy(), "kernel": model.layers[0].kernel.value.device}))
"""
    got = json.loads(runtime.run_on_cpu_replicas(2, code).strip().splitlines()[-1])
    assert got["runtime"] == 2 and got["one"] == 1 and got["default"], got
    assert got["kernel"].endswith("CPU:0"), got


def test_run_on_cpu_replicas_reports_a_failing_snippet_clearly():
    with pytest.raises(RuntimeError, match=r"(?s)2-replica process failed.*ZeroDivisionError: division by zero"):
        runtime.run_on_cpu_replicas(2, "1 / 0")


def test_no_tpu_evidence_means_tpu_is_skipped_with_a_reason(monkeypatch):
    monkeypatch.setattr(runtime, "tpu_hints", lambda: [])
    called = []
    rt = runtime.detect(resolver_factory=lambda **kw: called.append(kw), use_cache=False)
    assert called == []  # no TPU evidence: the resolver is not even constructed
    assert rt.kind in ("CPU", "GPU", "multi-GPU")
    assert rt.fallbacks[0].startswith("TPU — none found")


def test_tpu_resolver_failure_falls_back_and_records_why():
    def broken_resolver(tpu):
        raise ConnectionError(f"simulated: nothing at {tpu}")

    rt = runtime.detect(probe_tpu=True, resolver_factory=broken_resolver, use_cache=False)
    assert rt.kind != "TPU"
    assert "ConnectionError: simulated: nothing at local" in rt.fallbacks[0]
    assert "Fell back: TPU did not connect" in rt.summary()
    assert rt.strategy.num_replicas_in_sync == rt.num_replicas  # the fallback strategy is usable


def test_tpu_initialize_failure_falls_back(monkeypatch):
    import tensorflow as tf

    def failing_init(resolver):
        raise tf.errors.NotFoundError(None, None, "TPUs not found in the cluster")

    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda resolver: None)
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", failing_init)
    rt = runtime.detect(probe_tpu=True, resolver_factory=lambda tpu: object(), use_cache=False)
    assert rt.kind != "TPU"
    assert "NotFoundError: TPUs not found in the cluster" in rt.fallbacks[0]


def test_tpu_path_runs_the_four_calls_in_order(monkeypatch):
    """With a (fake) TPU that answers, detect uses resolver(tpu="local") → connect → initialize → TPUStrategy."""
    import tensorflow as tf

    calls = []
    resolver = object()

    def factory(tpu):
        calls.append(("resolver", tpu))
        return resolver

    class FakeTPUStrategy:
        def __init__(self, r):
            calls.append(("strategy", r is resolver))
            self.num_replicas_in_sync = 1
            self.extended = types.SimpleNamespace(worker_devices=("/job:worker/replica:0/task:0/device:TPU:0",))

    monkeypatch.setattr(
        tf.config, "experimental_connect_to_cluster", lambda r: calls.append(("connect", r is resolver))
    )
    monkeypatch.setattr(
        tf.tpu.experimental, "initialize_tpu_system", lambda r: calls.append(("initialize", r is resolver))
    )
    monkeypatch.setattr(tf.distribute, "TPUStrategy", FakeTPUStrategy)
    rt = runtime.detect(probe_tpu=True, resolver_factory=factory, use_cache=False)
    assert calls == [("resolver", "local"), ("connect", True), ("initialize", True), ("strategy", True)]
    assert (rt.kind, rt.num_replicas, rt.strategy_name, rt.fallbacks) == ("TPU", 1, "TPUStrategy", [])
    assert rt.tpu_resolver is resolver
    assert "TPU · 1 replica (TPUStrategy) · devices: TPU:0" in rt.summary()
    # issue 22: a TPU compiles every step: the label every lesson prints says so without COURSE_JIT
    assert rt.config.jit is False and rt.xla is True and rt.xla_label == "with XLA"
    assert rt.fit_jit_compile()[:2] == (False, True)  # nothing to ask compile() for: TPUStrategy compiles anyway


def test_tpu_hints_read_pci_ids_and_device_files(tmp_path, monkeypatch):
    for name in runtime.TPU_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    pci, dev = tmp_path / "pci", tmp_path / "dev"
    (pci / "0000:00:04.0").mkdir(parents=True)
    (pci / "0000:00:04.0" / "vendor").write_text("0x1ae0\n")
    (pci / "0000:00:04.0" / "device").write_text("0x0063\n")
    (pci / "0000:00:05.0").mkdir()
    (pci / "0000:00:05.0" / "vendor").write_text("0x8086\n")  # an Intel device: not a TPU
    (pci / "0000:00:05.0" / "device").write_text("0x0063\n")
    dev.mkdir()
    assert runtime.tpu_hints(str(pci), str(dev)) == ["PCI device 0x1ae0:0x0063 (TPU v5e)"]
    (dev / "vfio").mkdir()
    (dev / "vfio" / "0").write_text("")
    assert runtime.tpu_hints(str(tmp_path / "none"), str(dev))[0].endswith("(TPU v5e/v6e device file)")
    assert runtime.tpu_hints(str(tmp_path / "none"), str(tmp_path / "none")) == []
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-1")
    assert runtime.tpu_hints(str(tmp_path / "none"), str(tmp_path / "none")) == ["TPU_ACCELERATOR_TYPE=v5litepod-1"]


def test_jaxs_no_tpu_marker_is_no_tpu_hint(tmp_path, monkeypatch):
    # JAX sets TPU_SKIP_MDS_QUERY=1 on import where it finds no TPU chips, and TensorFlow's import imports JAX
    for name in runtime.TPU_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")
    assert runtime.tpu_hints(str(tmp_path / "none"), str(tmp_path / "none")) == []


def test_cpu_split_after_tensorflow_started_is_reported_not_raised():
    import tensorflow as tf

    tf.constant(1.0).numpy()  # TensorFlow has started in this process with its CPU devices fixed
    have = len(tf.config.list_logical_devices("CPU"))
    wanted = have + 1
    rt = runtime.detect(cpu_replicas=wanted, device="cpu", use_cache=False)
    assert rt.num_replicas == have
    assert any(f"could not split the CPU into {wanted} replica(s)" in f and "restart" in f for f in rt.fallbacks)


def test_invalid_settings_are_clear_errors():
    from course_utils.config import ConfigError

    with pytest.raises(ConfigError, match="cpu_replicas=0 is out of range"):
        runtime.detect(cpu_replicas=0)
    with pytest.raises(ConfigError, match="device='npu' is not one of auto, tpu, gpu, cpu"):
        runtime.detect(device="npu")


def test_device_cpu_skips_faster_kinds_and_says_so():
    rt = runtime.detect(device="cpu", use_cache=False)
    assert rt.kind == "CPU"
    assert any("device='cpu' requested" in n for n in rt.notes)
    assert not any(f.startswith("TPU") for f in rt.fallbacks)  # not tried, so not a fallback


def test_setup_prints_the_summary(capsys):
    import course_utils

    rt = course_utils.setup()
    out = capsys.readouterr().out
    assert out.startswith(f"Runtime: {rt.kind} · {rt.num_replicas} replica")
    assert f"TensorFlow {rt.tf_version} · Keras {rt.keras_version} (backend: tensorflow)" in out
    assert "Config: mode=" in out


# --- Installing TensorFlow on a Colab TPU runtime, and the libtpu check (fakes: no pip, no TPU) ---

JAX_REQUIRES = ['jaxlib<=0.10.2,>=0.10.2; extra == "tpu"', 'libtpu==0.0.42.*; extra == "tpu"']
JAX_072_REQUIRES = ["jaxlib<=0.7.2,>=0.7.2", 'libtpu==0.0.23; extra == "tpu"', 'requests; extra == "tpu"']
TF_TPU_REQUIRES = ["numpy>=1.26.0", "libtpu~=0.0.14", 'nvidia-nccl-cu12<3.0; extra == "and-cuda"']


def _metadata(jax_requires=JAX_REQUIRES, **versions):
    names = {k.replace("_", "-"): v for k, v in versions.items()}
    requires = {"jax": jax_requires, "tensorflow-tpu": TF_TPU_REQUIRES}
    return names.get, lambda name: requires.get(name, []) if names.get(name) else []


def test_libtpu_check_says_nothing_false_on_colabs_untouched_tpu_image():
    """Colab's TPU image (googlecolab/backend-info, a724079): JAX 0.7.2, whose jax[tpu] extra names libtpu 0.0.23,
    with libtpu 0.0.21.1 pinned by the image, and no TensorFlow. JAX runs there: the check warned "libtpu mismatch
    ... installing tensorflow-tpu can replace JAX's libtpu" before anything was installed."""
    summary, problems = runtime.libtpu_check(*_metadata(JAX_072_REQUIRES, libtpu="0.0.21.1", jax="0.7.2"))
    assert problems == []
    assert summary == "libtpu installed: libtpu 0.0.21.1; JAX 0.7.2's jax[tpu] extra names libtpu==0.0.23"


def test_libtpu_check_after_the_setup_says_what_it_cost_jax_and_nothing_else():
    summary, problems = runtime.libtpu_check(
        *_metadata(JAX_072_REQUIRES, libtpu=runtime.LIBTPU_FOR_TF, jax="0.7.2", tensorflow_tpu="2.20.0")
    )
    assert problems == []  # the release's own libtpu
    assert "tensorflow-tpu 2.20.0 asks for libtpu~=0.0.14 (satisfied)" in summary
    assert "with libtpu 0.0.14, TensorFlow's, JAX may no longer start on the TPU in this runtime" in summary


def test_libtpu_check_says_a_libtpu_newer_than_tensorflows_release_is_untested():
    """Issue 22: `libtpu~=0.0.14` accepts 0.0.42 — satisfied on paper, never tested with TensorFlow 2.20."""
    summary, problems = runtime.libtpu_check(*_metadata(libtpu="0.0.42", jax="0.10.2", tensorflow_tpu="2.20.0"))
    assert "libtpu installed: libtpu 0.0.42" in summary
    assert "tensorflow-tpu 2.20.0 asks for libtpu~=0.0.14 (satisfied)" in summary
    assert "JAX 0.10.2's jax[tpu] extra names libtpu==0.0.42.*" in summary and "may no longer" not in summary
    assert len(problems) == 1 and problems[0].startswith(
        "untested libtpu: tensorflow-tpu 2.20.0 names libtpu 0.0.14 (libtpu~=0.0.14); 0.0.42 is newer"
    )
    assert "pip install libtpu==0.0.14" in problems[0] and "Kaggle/docker-python#1499" in problems[0]
    _, problems = runtime.libtpu_check(*_metadata(libtpu="0.0.14", tensorflow_tpu="2.20.0"))
    assert problems == []  # the release's own libtpu: nothing to say


def test_libtpu_check_never_counts_jaxs_extra_as_a_problem():
    _, problems = runtime.libtpu_check(*_metadata(libtpu="0.0.14", jax="0.10.2", tensorflow_tpu="2.20.0"))
    assert problems == []


def test_libtpu_check_names_a_tensorflow_mismatch_and_the_fix():
    _, problems = runtime.libtpu_check(*_metadata(libtpu="0.0.13", tensorflow_tpu="2.20.0"))
    assert len(problems) == 1
    assert "tensorflow-tpu 2.20.0 needs libtpu~=0.0.14, but libtpu 0.0.13 is installed" in problems[0]
    assert runtime.LIBTPU_TF_INDEX in problems[0]


def test_libtpu_check_flags_two_libtpus_and_a_missing_one():
    _, problems = runtime.libtpu_check(*_metadata(libtpu="0.0.42", libtpu_nightly="0.1.dev20231213"))
    assert problems and "two libtpu packages are installed" in problems[0]
    _, problems = runtime.libtpu_check(*_metadata(tensorflow_tpu="2.20.0", jax="0.10.2"))
    assert any("no libtpu is installed" in p for p in problems)
    assert not any("JAX" in p for p in problems)


def test_detect_on_a_tpu_machine_notes_a_libtpu_mismatch(monkeypatch):
    version, requires = _metadata(libtpu="0.0.13", tensorflow_tpu="2.20.0")
    monkeypatch.setattr(runtime, "tpu_hints", lambda: ["/dev/vfio/0 exists (TPU v5e/v6e device file)"])
    monkeypatch.setattr(runtime, "_dist_version", version)
    monkeypatch.setattr(runtime, "_dist_requires", requires)

    def broken_resolver(tpu):
        raise ConnectionError("simulated")

    rt = runtime.detect(resolver_factory=broken_resolver, use_cache=False)
    assert rt.kind != "TPU"
    assert any(n.startswith("libtpu mismatch: tensorflow-tpu 2.20.0 needs libtpu~=0.0.14") for n in rt.notes)
    assert "Note: libtpu mismatch" in rt.summary()


@pytest.fixture
def no_tensorflow(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorflow" else real(name, *a))


def _fake_pip(*results):
    calls = []

    def pip(args):
        calls.append(tuple(args))
        return results[len(calls) - 1]

    return pip, calls


def test_a_tpu_machine_with_tensorflows_cpu_build_is_not_tried_and_the_cpu_still_splits():
    """On a TPU VM where the setup fell back to the CPU/GPU build (no TPU reached), trying the TPU recipe anyway
    started TensorFlow's runtime, and the CPU could no longer be split: lesson 05's 4 replicas came out as 1 (nox -s
    colab_tpu). A TensorFlow without TPU support is not tried; the fall-back says why and how to get the TPU."""
    code = (
        "from course_utils import runtime\n"
        "runtime.tpu_hints = lambda: ['/dev/vfio/0 exists (TPU v5e/v6e device file)']\n"
        "def resolver(tpu):\n"
        "    raise AssertionError('tried')\n"
        "rt = runtime.detect(cpu_replicas=4, use_cache=False)\n"
        "print(rt.kind, rt.num_replicas)\n"
        "print(rt.fallbacks[0])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=240,
        env={k: v for k, v in os.environ.items() if not k.startswith("COURSE_")},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    kind_line, why = proc.stdout.strip().splitlines()[-2:]
    assert kind_line == "CPU 4"
    assert (
        why.startswith(
            "TPU (/dev/vfio/0 exists (TPU v5e/v6e device file)) not tried: this TensorFlow has no TPU support"
        )
        and runtime.TPU_INSTALL_FIX in why
    )


def test_install_does_nothing_where_tensorflow_exists():
    pip, calls = _fake_pip()
    assert runtime.install_tensorflow(on_tpu=True, pip=pip) == []
    assert calls == []


def test_install_on_a_tpu_uses_the_documented_find_links_command(no_tensorflow, capsys):
    pip, calls = _fake_pip((0, ""))
    lines = runtime.install_tensorflow(
        on_tpu=True,
        pip=pip,
        check=lambda: ("libtpu installed: libtpu 0.0.14", ["libtpu mismatch: simulated"]),
        version={"jax": "0.7.2", "libtpu": "0.0.21.1"}.get,
        reach_tpu=lambda: (True, "TPU cores: 1"),
    )
    assert calls == [
        (
            "tensorflow-tpu==2.20.0",
            "libtpu==0.0.14",
            "--find-links=https://storage.googleapis.com/libtpu-tf-releases/index.html",
        )
    ]
    cost = [ln for ln in lines if ln.startswith("It replaces this image's libtpu 0.0.21.1")]
    assert cost and "(chosen for its JAX 0.7.2) with 0.0.14" in cost[0] and "JAX may then no longer start" in cost[0]
    assert "Installed the TPU build. libtpu installed: libtpu 0.0.14" in lines
    assert "⚠️ libtpu mismatch: simulated" in lines and lines[-1] == "TensorFlow reaches the TPU: TPU cores: 1."
    assert "⚠️ libtpu mismatch: simulated" in capsys.readouterr().out


def test_a_tpu_build_that_does_not_reach_the_tpu_is_replaced_and_the_images_libtpu_put_back(no_tensorflow):
    """Where TensorFlow's TPU build sees no TPU ("No TPU platform found", Kaggle/docker-python#1499) it cannot compile
    XLA for the CPU either, and Keras' jit_compile='auto' turns XLA on there (it sees TPU_SYSTEM): every fit fails
    ("could not find registered transfer manager for platform Host", measured by nox -s colab_tpu). The setup checks
    in a fresh process, then installs the CPU/GPU build and gives JAX its libtpu back."""
    pip, calls = _fake_pip((0, ""), (0, ""), (0, ""))
    uninstalled = []
    lines = runtime.install_tensorflow(
        on_tpu=True,
        pip=pip,
        check=lambda: ("libtpu installed: libtpu 0.0.14", []),
        version={"jax": "0.7.2", "libtpu": "0.0.21.1"}.get,
        reach_tpu=lambda: (False, "No TPU platform found"),
        pip_uninstall=lambda names: uninstalled.append(names) or (0, ""),
    )
    assert calls == [runtime.TPU_PIP_ARGS, ("libtpu==0.0.21.1",), ("tensorflow==2.20.0",)]
    assert uninstalled == [("tensorflow-tpu",)]
    assert any(
        ln.startswith("⚠️ TensorFlow's TPU build does not reach the TPU here: No TPU platform found.") for ln in lines
    )
    assert "Put back this image's libtpu 0.0.21.1 for its JAX 0.7.2." in lines
    assert lines[-1] == "Installed tensorflow==2.20.0 (CPU/GPU build)."


def test_a_failed_uninstall_of_the_tpu_build_stops_with_what_to_do_and_no_traceback(no_tensorflow):
    pip, calls = _fake_pip((0, ""))
    with pytest.raises(
        runtime.InstallFailed,
        match=r"`pip uninstall -y tensorflow-tpu` exited with code 1: "
        r"ERROR: busy\. Restart the runtime",
    ) as raised:
        runtime.install_tensorflow(
            on_tpu=True,
            pip=pip,
            check=lambda: ("", []),
            version=lambda name: None,
            reach_tpu=lambda: (False, "No TPU platform found"),
            pip_uninstall=lambda names: (1, "ERROR: busy"),
        )
    assert calls == [runtime.TPU_PIP_ARGS]  # nothing installed over a TPU build still in place
    assert raised.value._render_traceback_() == [f"InstallFailed: {raised.value}"]


def test_the_tpu_check_reports_what_the_fresh_process_said(monkeypatch):
    import subprocess

    def fake_run(argv, **kwargs):
        assert argv[:2] == [sys.executable, "-c"] and "initialize_tpu_system" in argv[2]
        return subprocess.CompletedProcess(
            argv,
            1,
            "",
            (
                "2026-11-28 06:01:13.7 I external/local_xla/xla/stream_executor/tpu/tpu_platform_interface.cc:78] No TPU "
                "platform found. Platform manager status: OK\ntensorflow.python.framework.errors_impl.InternalError: Graph "
                "execution error:\n"
            ),
        )

    monkeypatch.setattr(runtime.processes, "run", fake_run)
    assert runtime.tpu_reachable_in_fresh_process() == (False, "No TPU platform found. Platform manager status: OK")
    monkeypatch.setattr(
        runtime.processes,
        "run",
        lambda argv, **kw: subprocess.CompletedProcess(argv, 1, "", "noise\nValueError: Please provide a TPU Name\n"),
    )
    assert runtime.tpu_reachable_in_fresh_process() == (False, "ValueError: Please provide a TPU Name")
    monkeypatch.setattr(
        runtime.processes, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, 0, "TPU cores: 1\n", "")
    )
    assert runtime.tpu_reachable_in_fresh_process() == (True, "TPU cores: 1")
    monkeypatch.setattr(
        runtime.processes, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, 0, "TPU cores: 0\n", "")
    )
    assert runtime.tpu_reachable_in_fresh_process()[0] is False


def test_install_says_when_the_find_links_page_is_unreachable_and_goes_on(no_tensorflow):
    """pip warns and retries when --find-links' host cannot be reached, then installs from the package index (what
    happened where the course is tested): the setup says so in one line, and the install counts."""
    retry = (
        "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection "
        "broken by 'NewConnectionError(': Failed to establish a new connection: [Errno -2] Name or service not "
        "known')': /libtpu-tf-releases/index.html"
    )
    output = f"{retry}\n{retry}\nSuccessfully installed libtpu-0.0.14 tensorflow-tpu-2.20.0"
    notes = runtime.unreachable_links_note(output, runtime.TPU_PIP_ARGS)
    assert notes == [
        f"pip could not reach {runtime.LIBTPU_TF_INDEX} (it retried a few times): it went on with the "
        "package index, which has tensorflow-tpu 2.20.0 and libtpu 0.0.14 too"
    ]
    assert runtime.unreachable_links_note("Successfully installed tensorflow-tpu-2.20.0", runtime.TPU_PIP_ARGS) == []
    pip, _ = _fake_pip((0, "", notes))
    lines = runtime.install_tensorflow(
        on_tpu=True,
        pip=pip,
        check=lambda: ("libtpu installed: libtpu 0.0.14", []),
        version=lambda name: None,
        reach_tpu=lambda: (True, "TPU cores: 1"),
    )
    assert notes[0] in lines and "Installed the TPU build. libtpu installed: libtpu 0.0.14" in lines
    assert not any(ln.startswith("It replaces") for ln in lines)  # no libtpu on the image: nothing replaced


def test_a_failed_tpu_install_is_named_and_falls_back(no_tensorflow):
    pip, calls = _fake_pip((1, "ERROR: No matching distribution found for libtpu~=0.0.14"), (0, ""))
    lines = runtime.install_tensorflow(on_tpu=True, pip=pip, check=lambda: ("", []), version=lambda name: None)
    assert calls == [runtime.TPU_PIP_ARGS, ("tensorflow==2.20.0",)]
    failed = [ln for ln in lines if ln.startswith("The TPU build did not install")]
    assert failed == [
        "The TPU build did not install: `pip install tensorflow-tpu==2.20.0 libtpu==0.0.14 "
        f"--find-links={runtime.LIBTPU_TF_INDEX}` exited with code 1: "
        "ERROR: No matching distribution found for libtpu~=0.0.14"
    ]
    assert any("will run on the TPU VM's CPU" in ln for ln in lines)
    assert lines[-1] == "Installed tensorflow==2.20.0 (CPU/GPU build)."


def test_no_tpu_installs_the_cpu_gpu_build_only(no_tensorflow):
    pip, calls = _fake_pip((0, ""))
    runtime.install_tensorflow(on_tpu=False, pip=pip)
    assert calls == [("tensorflow==2.20.0",)]


def test_when_nothing_installs_the_error_names_the_command_and_exit_code(no_tensorflow):
    pip, _ = _fake_pip((1, "tpu: no wheel"), (2, "ERROR: Could not find a version"))
    with pytest.raises(
        runtime.InstallFailed,
        match=r"`pip install tensorflow==2\.20\.0` exited with code 2: ERROR: Could "
        "not find",
    ) as raised:
        runtime.install_tensorflow(on_tpu=True, pip=pip)
    # a notebook shows the message alone (IPython's _render_traceback_), not a traceback into course_utils
    assert raised.value._render_traceback_() == [f"InstallFailed: {raised.value}"]
    assert isinstance(raised.value, RuntimeError)  # what the setup cell's callers caught before


def test_old_recipes_report_what_they_do_here(monkeypatch):
    from course_utils.lessons.tpu_initialization.experiments import resolver_recipes

    for name in (*runtime.TPU_ENV_VARS, "COLAB_TPU_ADDR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(runtime, "tpu_hints", lambda: [])
    rows = resolver_recipes()
    assert [r["outcome"].split(":")[0] for r in rows[:2]] == ["raises KeyError", "raises ValueError"]
    assert rows[2]["outcome"].startswith("constructed; not connected")


# -- issue 9 §3: re-running the setup cell, stale runtimes (each in a fresh process: the split is global) --


def _fresh(code: str) -> str:
    import subprocess
    import sys
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("COURSE_")}
    env.update(COURSE_DEVICE="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_setup_cell_can_be_rerun_after_a_four_replica_split():
    out = _fresh(
        "import course_utils\n"
        "course_utils.setup(verbose=False)\n"
        "rt4 = course_utils.detect(cpu_replicas=4)\n"
        "rt4.strategy\n"
        "again = course_utils.setup(verbose=False)\n"
        "print(again.num_replicas, again.strategy.num_replicas_in_sync, bool(again.fallbacks[-1:] and 'CPU split' in again.fallbacks[-1]))\n"
    )
    assert out.split() == ["4", "4", "False"]  # keeps the split, quietly


def test_a_runtime_replaced_by_another_split_says_it_is_out_of_date():
    out = _fresh(
        "import course_utils\n"
        "rt4 = course_utils.detect(cpu_replicas=4)\n"
        "rt2 = course_utils.detect(cpu_replicas=2)\n"
        "print(rt2.strategy.num_replicas_in_sync)\n"
        "print('OUT OF DATE' in rt4.summary())\n"
        "try:\n    rt4.strategy\nexcept RuntimeError as e:\n    print('raised:', e)\n"
    )
    lines = out.splitlines()
    assert lines[0] == "2" and lines[1] == "True"
    assert lines[2].startswith("raised: this Runtime is out of date") and "call detect() again" in lines[2]


def test_a_split_too_late_names_the_fix_without_repeating_a_variable_already_set():
    code = (
        "import course_utils, tensorflow as tf\n"
        "tf.constant(1)\n"  # TensorFlow has started with one CPU device
        "rt = course_utils.detect(cpu_replicas=4)\n"
        "print(rt.num_replicas); print(rt.fallbacks[-1])\n"
    )
    out = _fresh(code)
    assert out.splitlines()[0] == "1" and "restart the kernel" in out and "COURSE_CPU_REPLICAS=4" in out
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("COURSE_")}
    env.update(COURSE_DEVICE="cpu", COURSE_CPU_REPLICAS="4", TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    assert "restart the kernel" in proc.stdout and "set COURSE_CPU_REPLICAS=4" not in proc.stdout


# A TPU error as TensorFlow prints it when TensorFlow and the TPU runtime do not match: what to do comes late
# in the first line, and a traceback-like tail follows on the next lines.
TPU_MISMATCH = (
    "Unable to find any devices for the requested device type TPU_SYSTEM. This usually means that the TPU worker "
    "is not yet up, or that your TPU runtime version does not match the TensorFlow version (check the "
    "tensorflow-tpu and libtpu versions of this VM). Available devices: /job:localhost/replica:0/task:0/device:CPU:0, "
    "/job:localhost/replica:0/task:0/device:TPU_SYSTEM:0 (placeholder) with a long list of further devices "
    "/job:localhost/replica:0/task:0/device:XLA_CPU:0 /job:localhost/replica:0/task:0/device:XLA_CPU:1 "
    "/job:localhost/replica:0/task:0/device:XLA_CPU:2 /job:localhost/replica:0/task:0/device:XLA_CPU:3\n"
    "\t [[{{node ConfigureDistributedTPU}}]]"
)
TPU_BUSY = (
    "TPU initialization failed: open(/dev/vfio/0): Device or resource busy: Device or resource busy; Couldn't open "
    "iommu group /dev/vfio/0. The TPU is already in use by process with pid 4242. Not attempting to load libtpu.so "
    "in this process."
)


def test_first_line_keeps_the_key_part_of_a_tpu_error_and_cuts_at_a_word():
    import tensorflow as tf

    exc = tf.errors.InvalidArgumentError(None, None, TPU_MISMATCH)
    line = runtime._first_line(exc)
    assert line.startswith("InvalidArgumentError: Unable to find any devices for the requested device type TPU_SYSTEM.")
    assert "your TPU runtime version does not match the TensorFlow version" in line  # the part that says what to do
    assert "ConfigureDistributedTPU" not in line and "\n" not in line  # first line only
    assert line.endswith("…") and len(line) <= len("InvalidArgumentError: ") + 400
    body = line[len("InvalidArgumentError: ") : -1].rstrip()
    assert TPU_MISMATCH.startswith(body)  # a prefix of the message ...
    assert TPU_MISMATCH[len(body)] in " .;,"  # ... that ends at a word boundary, not inside a word or device name

    busy = runtime._first_line(RuntimeError(TPU_BUSY))
    assert busy == f"RuntimeError: {TPU_BUSY}"  # short enough: whole, nothing cut
    assert "already in use by process with pid 4242" in busy

    assert runtime._first_line(ValueError("")) == "ValueError"
    assert runtime._first_line(ValueError("\n\n  second line only\n")) == "ValueError: second line only"
    token = runtime._first_line(OSError("x" * 1000), limit=50)  # one huge word: cut it anyway
    assert token.endswith("…") and len(token) <= len("OSError: ") + 50


def test_a_long_tpu_error_reaches_the_fallback_reason_whole(monkeypatch):
    import tensorflow as tf

    def failing_init(resolver):
        raise tf.errors.InvalidArgumentError(None, None, TPU_MISMATCH)

    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda resolver: None)
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", failing_init)
    rt = runtime.detect(probe_tpu=True, resolver_factory=lambda tpu: object(), use_cache=False)
    assert "does not match the TensorFlow version" in rt.fallbacks[0]
    assert "does not match the TensorFlow version" in rt.summary()


@pytest.mark.parametrize(
    "kind, course_jit, replicas, expected",
    [
        ("TPU", False, 1, (False, True)),
        ("TPU", True, 8, (False, True)),
        ("GPU", False, 1, (True, True)),
        ("multi-GPU", False, 2, (False, False)),
        ("multi-GPU", True, 4, (False, False)),
        ("CPU", False, 1, (False, False)),
        ("CPU", True, 1, (True, True)),
        ("CPU", True, 4, (False, False)),
    ],
)
def test_fit_jit_compile_per_hardware(kind, course_jit, replicas, expected):
    jit_compile, compiled, why = runtime.fit_jit_compile(kind, course_jit, replicas)
    assert (jit_compile, compiled) == expected and why
    if replicas > 1 and kind != "TPU":
        assert "keras-team/keras#19005" in why and "replica_gradients" in why


@pytest.mark.extended  # a fresh-process scenario: .ci/run runs it after the README's pytest
def test_fit_trains_on_two_replicas_under_xla_with_the_courses_rule():
    """The TPU-shaped run (COURSE_CPU_REPLICAS, COURSE_JIT=1): fit with what fit_jit_compile returns trains, where
    jit_compile=True crashes (keras-team/keras#19005); a custom loop compiles each replica's gradients
    (replica_gradients) and ends with the same weights as without XLA. In a fresh 2-replica process (lesson 01 shows
    the same function's result and makes a claim of it)."""
    from course_utils.lessons.tpu_initialization import experiments as tpu

    got = runtime.run_with_replicas(2, None, tpu.fit_xla_on_replicas)
    assert got["replicas"] == 2 and got["rule"] == [False, False] and got["rule_trained"]
    # still broken in Keras: the rule is still needed (if this starts to train, revisit fit_jit_compile)
    assert (
        got["jit_true"].startswith("InvalidArgumentError: ")
        and "located in device CPU:1 from device CPU:0" in (got["jit_true"])
        and "defined @" not in got["jit_true"]
    ), got["jit_true"]
    assert got["custom_loop_max_diff"] <= 1e-5 and got["custom_loop_moved"] > 1e-3
    assert tpu.xla_on_replicas_claim(got).holds is True


def test_keras_auto_jit_is_off_for_a_model_built_under_a_strategy_even_with_a_gpu(monkeypatch):
    """Why the course never passes jit_compile="auto" (lessons 01 and 06): Keras resolves it to False for any model
    built in a tf.distribute scope, even where a GPU exists. If a Keras release changes this, lesson 01's text and
    runtime.fit_jit_compile must change with it."""
    import keras
    import tensorflow as tf

    real = tf.config.list_physical_devices
    monkeypatch.setattr(
        tf.config,
        "list_physical_devices",  # pretend a GPU: Keras' CPU-only rule does not fire
        lambda kind=None: real(kind) + ([] if kind else [types.SimpleNamespace(device_type="GPU")]),
    )

    def auto(scope):
        with scope:
            model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            model.compile(loss="mse", jit_compile="auto")
        return model.jit_compile

    assert auto(tf.distribute.OneDeviceStrategy("/cpu:0").scope()) is False
    import contextlib

    assert auto(contextlib.nullcontext()) is True  # the same model outside a strategy: XLA on
