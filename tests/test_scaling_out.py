"""Lesson 08's other cluster programs: Keras fit under MultiWorkerMirroredStrategy, parameter servers,
model parallelism over two worker processes — and the launcher pieces the lesson uses (launch, --wait-for).

Each test starts real TensorFlow processes on localhost and checks that none is left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from test_cluster import _gone  # the same check that no process is left behind

from course_utils import cluster, exercises, lessons

pytestmark = pytest.mark.usefixtures("float32_policy")  # conftest.py


@pytest.mark.extended  # lesson 08 runs this cluster in every mode; the message format is checked in .ci/run
def test_keras_fit_under_multi_worker_mirrored_fails_in_one_readable_line(tmp_path):
    """Lesson 08 §2 shows this failing (keras-team/keras#20585). If a Keras release fixes it, this test fails:
    then the lesson's text, its claim and this test must change."""
    lines = []
    with pytest.raises(cluster.ClusterError) as info:
        cluster.launch(
            "course_utils.lessons.scaling_out.multiworker",
            ["--fit", "--steps", "2", "--out", str(tmp_path)],
            workers=2,
            timeout=180,
            log=lines.append,
        )
    message = str(info.value)
    assert "exited with code 1" in message
    assert "model.fit failed: ValueError: Attempt to convert a value (PerReplica:{...})" in message
    assert "(raised in keras/src/" in message and "traceback_utils" not in message  # Keras' own frame, unfiltered
    assert "array(" not in message and "I0000" not in message  # one line, no tensor dump, no TensorFlow chatter
    assert not any("I0000" in line or "All log messages before absl" in line for line in lines)


@pytest.fixture
def one_core():
    """Pin this process — and the cluster tasks it starts, which inherit it — to one core, as a 1-core VM or
    `taskset -c 0` does; restored afterwards. Skipped where affinity cannot be set (macOS, Windows)."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("CPU affinity cannot be set on this OS")
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    yield
    os.sched_setaffinity(0, before)


@pytest.mark.full  # lesson 08 runs this cluster in every mode; pinned to one core it is a release check
def test_parameter_server_coordinator_trains_a_keras_3_model_and_fit_does_not_run(tmp_path, one_core):
    """On one core (issue 20: it never finished there: one inter-op thread, blocked by a task waiting on a peer).
    Lesson 08 runs the same cluster in the README's pytest; this pinned run is in `pytest -m full` (releases), and
    under `taskset -c 0` every notebook runs it before an issue is resolved."""
    lines = []
    result = cluster.launch(
        "course_utils.lessons.scaling_out.parameter_server",
        ["--steps", "24", "--out", str(tmp_path)],
        chief=True,
        workers=2,
        ps=1,
        timeout=180,
        log=lines.append,
    )
    assert result.awaited == ("chief 0",) and result.returncodes["chief 0"] == 0
    out = json.loads((tmp_path / "parameter_server.json").read_text())
    assert out["fit"].startswith("ValueError") and "create_per_worker_dataset" in out["fit"]
    assert len(out["losses"]) == 24
    assert sum(out["losses"][-6:]) < sum(out["losses"][:6])  # it learns
    assert out["variable_devices"] and all(d.startswith("/job:ps/") for d in out["variable_devices"])
    assert 0 < out["optimizer_iterations"] <= 24  # asynchronous updates: the counter may miss some, never add
    assert any("custom loop, 24 steps scheduled" in line for line in lines)
    ev = out["evaluation"]  # one batch per scheduled step: every example once, the coordinator's count (on one core)
    assert ev["one batch per step"]["visits"] == [1] * ev["examples"]
    assert ev["one batch per step"]["correct"] == ev["coordinator_correct"]
    assert sum(ev["per-worker dataset"]["visits"]) == ev["examples"]  # as many visits, not necessarily these
    assert all(_gone(pid) for pid in result.pids.values())  # the serving workers and ps were stopped


@pytest.mark.extended  # lesson 08 runs this cluster (and its gradient claim) in every mode; placement details in .ci/run
def test_model_parallel_split_and_pipelined_steps_compute_the_one_device_gradients(tmp_path):
    lines = []
    result = cluster.launch(
        "course_utils.lessons.scaling_out.model_parallel",
        [
            "--out",
            str(tmp_path),
            "--width",
            "64",
            "--layers",
            "2",
            "--batch",
            "32",
            "--rounds",
            "1",
            "--micro-batches",
            "2",
            "4",
        ],
        chief=True,
        workers=2,
        timeout=180,
        log=lines.append,
    )
    out = json.loads((tmp_path / "model_parallel.json").read_text())
    names = ["one device", "split (naive)", "split, 2 micro-batches", "split, 4 micro-batches"]
    assert list(out["max_grad_diff"]) == names
    for name in names:
        assert out["max_grad_diff"][name] <= 1e-5 * out["grad_scale"], (name, out["max_grad_diff"])
    # where the weights live: one device = worker 0 only; split = one stage on each worker
    assert out["devices"]["one device"] == ["/job:worker/replica:0/task:0/device:CPU:0"]
    assert [d.split("/")[3] for d in out["devices"]["split (naive)"]] == ["task:0", "task:1"]
    assert out["bytes_across_per_step"] == 2 * 32 * 64 * 4
    assert set(out["times_s"]) == {*names, "stage 1 alone (worker 0)", "stage 2 alone (worker 1)"}
    assert all(v[0] > 0 for v in out["times_s"].values())
    if hasattr(os, "sched_setaffinity"):
        assert any("worker 1: pinned to CPU core" in line for line in lines)
    assert all(_gone(pid) for pid in result.pids.values())


def test_model_parallel_program_refuses_a_batch_the_micro_batches_do_not_divide(tmp_path):
    with pytest.raises(cluster.ClusterError, match="must divide by every --micro-batches"):
        cluster.launch(
            "course_utils.lessons.scaling_out.model_parallel",
            ["--out", str(tmp_path), "--batch", "30", "--micro-batches", "4"],
            chief=True,
            workers=2,
            timeout=60,
            log=None,
        )


def test_launch_keeps_program_lines_and_drops_tensorflow_chatter():
    shown = []
    show = cluster._without_tf_noise(shown.append)
    for line in [
        "[worker 0] WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "[worker 0] I0000 00:00:1795446494.163542    8113 grpc_server_lib.cc:466] Started server",
        "[worker 0] I0000 00:00:17954 eager_service_impl.cc:355] SessionOptions: device_count {",
        '[worker 0]   key: "CPU"',
        "[worker 0] }",
        "[worker 0] allow_soft_placement: true",
        "[worker 0] ",
        "[worker 1] 2026-11-23 15:06:36.323287: I external/local_xla/xla/tsl/cuda/cudart_stub.cc:31] x",
        "[worker 0] worker 0: 6 steps on 2 replicas",
        "[worker 0] Traceback (most recent call last):",
        '[worker 0]   File "train.py", line 3, in <module>',
        "[worker 0] ValueError: boom",
    ]:
        show(line)
    assert shown == [
        "[worker 0] worker 0: 6 steps on 2 replicas",
        "[worker 0] Traceback (most recent call last):",
        '[worker 0]   File "train.py", line 3, in <module>',
        "[worker 0] ValueError: boom",
    ]


def test_launch_hides_gpus_from_the_tasks_and_wait_for_must_name_a_task_type(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # as on a GPU runtime
    (tmp_path / "show_env.py").write_text(
        "import os\nprint('CUDA_VISIBLE_DEVICES=' + repr(os.environ.get('CUDA_VISIBLE_DEVICES')))\n"
    )
    lines = []
    cluster.launch("show_env", workers=1, timeout=30, log=lines.append, cwd=str(tmp_path))  # python -m: cwd
    assert lines == ["[worker 0] CUDA_VISIBLE_DEVICES=''"]
    lines.clear()
    cluster.launch(
        "show_env",
        workers=1,
        timeout=30,
        log=lines.append,
        cwd=str(tmp_path),
        env=dict(os.environ, CUDA_VISIBLE_DEVICES="1"),
    )  # asked for explicitly: kept
    assert lines == ["[worker 0] CUDA_VISIBLE_DEVICES='1'"]
    with pytest.raises(ValueError, match="wait_for must name task types"):
        cluster.run_cluster([sys.executable, "-c", "pass"], workers=1, wait_for=("chief",), timeout=10)
    with pytest.raises(ValueError, match="wait_for must name task types"):
        cluster.run_cluster([sys.executable, "-c", "pass"], workers=1, wait_for="worker", timeout=10)


def test_command_line_wait_for_chief_ends_when_the_chief_does(tmp_path):
    """Workers that serve forever (as parameter servers do) are stopped once the chief exits: exit 0, fast."""
    script = tmp_path / "serve.py"
    script.write_text(
        "import json, os, time\n"
        "if json.loads(os.environ['TF_CONFIG'])['task']['type'] == 'chief':\n"
        "    print('chief done', flush=True)\n"
        "else:\n"
        "    time.sleep(120)\n"
    )
    start = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "course_utils",
            "cluster",
            "--chief",
            "--workers",
            "2",
            "--wait-for",
            "chief",
            "--timeout",
            "60",
            "--",
            sys.executable,
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr
    assert "[chief 0] chief done" in proc.stdout and time.monotonic() - start < 30
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "course_utils",
            "cluster",
            "--workers",
            "1",
            "--wait-for",
            "chief",
            "--",
            sys.executable,
            "-c",
            "pass",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "wait_for must name task types" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_tf_config_exercise_accepts_the_other_keys_tensorflow_reads_and_rejects_unknown_ones():
    from course_utils import exercises

    ex = exercises.load(lessons.scaling_out).tf_config_for
    with_rpc = lambda a, i: {
        "cluster": {"worker": a},
        "task": {"type": "worker", "index": i},  # noqa: E731
        "rpc_layer": "grpc",
    }
    assert ex.check(with_rpc).status == "correct"
    unknown = lambda a, i: {"cluster": {"worker": a}, "task": {"type": "worker", "index": i}, "tasks": []}  # noqa: E731
    result = ex.check(unknown)
    assert result.status == "incorrect" and "rpc_layer" in str(result)


def test_every_worker_program_refuses_bad_arguments_and_a_wrong_cluster_in_one_line(tmp_path):
    """No traceback, no hang: a chief-driven program started without its chief would otherwise serve forever."""

    def run(module, *args, tf_config):
        env = dict(os.environ, TF_CONFIG=tf_config)
        return subprocess.run(
            [sys.executable, "-m", f"course_utils.lessons.scaling_out.{module}", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    full = cluster.tf_config(
        {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"], "ps": ["127.0.0.1:4"]}, "chief", 0
    )
    workers_only = cluster.tf_config({"worker": ["127.0.0.1:2", "127.0.0.1:3"]}, "worker", 0)
    out = ["--out", str(tmp_path)]
    cases = [
        ("model_parallel", [*out, "--micro-batches", "0"], full, "must be at least 1"),
        ("model_parallel", [*out, "--width", "wide"], full, "must be a whole number"),
        ("model_parallel", out, workers_only, "needs at least 1 chief"),
        ("model_parallel", out, "{not json", "not valid JSON"),
        ("parameter_server", [*out, "--steps", "0"], full, "must be at least 1"),
        ("parameter_server", out, workers_only, "--chief --workers 1 --ps 1"),
        ("multiworker", [*out, "--per-worker-batch", "-1"], workers_only, "must be at least 1"),
    ]
    for module, args, tf_config, expected in cases:
        result = run(module, *args, tf_config=tf_config)
        assert result.returncode == 2, (module, args, result.stderr[-500:])
        assert expected in result.stderr and "Traceback" not in result.stderr, (module, args, result.stderr[-500:])


def test_worker_program_refuses_alone_without_time_in_one_line(monkeypatch, capsys, tmp_path):
    from course_utils.lessons.scaling_out import multiworker

    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}')
    assert multiworker.main(["--alone", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["--alone needs --time STEPS"]


def test_worker_program_refuses_own_handler_without_single_in_one_line(monkeypatch, capsys, tmp_path):
    from course_utils.lessons.scaling_out import multiworker

    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert multiworker.main(["--own-handler", str(tmp_path / "ckpt"), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["--own-handler needs --single (one process)"]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--collective-timeout", "nan"], "must be a finite number of seconds"),
        (["--collective-timeout", "-1"], "must be a finite number of seconds"),
        (["--collective-timeout", "inf"], "must be a finite number of seconds"),
        (["--stall-seconds", "soon"], "must be a number of seconds"),
        (["--stall-after", "0"], "must be at least 1"),
    ],
)
def test_worker_program_refuses_a_bad_timeout_or_stall_in_one_line(monkeypatch, capsys, tmp_path, args, expected):
    """The class of bad arguments runs in a fresh process above; these run through the same parser in-process."""
    from course_utils.lessons.scaling_out import multiworker

    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}')
    with pytest.raises(SystemExit) as exit_info:
        multiworker.main(["--out", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and expected in err and "Traceback" not in err, err


def test_notebook_08_keras_distribution_cell_runs_on_four_replicas():
    """§5's keras.distribution / DTensor cell, as the notebook has it, in a fresh process whose CPU is split into 4
    devices (the TPU shape): its meshes take the devices there are. A mesh of a hard-coded shape [1] failed there
    ("length of devices (4) must be equal to total size of the mesh of shape [1]")."""
    import pathlib

    from course_utils import runtime

    nb = json.loads(
        (pathlib.Path(__file__).resolve().parents[1] / "notebooks" / "08_scaling_out.ipynb").read_text(encoding="utf-8")
    )
    [cell] = [
        "".join(c["source"])
        for c in nb["cells"]
        if c["cell_type"] == "code" and "keras.distribution.DeviceMesh" in "".join(c["source"])
    ]
    code = (
        "import course_utils, keras, numpy as np, tensorflow as tf\ncourse_utils.detect().strategy\n"
        + cell
        + "\nprint(len(devices), mesh.num_local_devices())\n"
    )
    out = runtime.run_on_cpu_replicas(4, code, timeout=120)
    assert out.strip().splitlines()[-1] == "4 4", out
    assert "keras.distribution on TensorFlow:" in out


def test_fake_metadata_server_is_what_tensorflow_reads(monkeypatch):
    """course_utils.gce's server answers the two paths TensorFlow's failure handling asks (with GCE's header rules),
    and TensorFlow's own functions read it: on a fake GCE VM ``on_gcp()`` is True and ``detect_platform()`` says
    GCE_CPU (GCE_GPU where TensorFlow lists a GPU); the maintenance watcher sees the notice; with ``on_gcp=False`` it
    is INTERNAL_CPU (INTERNAL_GPU)."""
    import urllib.error
    import urllib.request

    from tensorflow.python.distribute.failure_handling import failure_handling_util as util

    from course_utils import gce

    import tensorflow as tf

    gpu = bool(tf.config.list_logical_devices("GPU"))  # detect_platform asks TensorFlow's devices, not the server
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with gce.FakeMetadataServer() as server:
        url = f"http://{server.address}/computeMetadata/v1/instance/hostname"
        with pytest.raises(urllib.error.HTTPError) as refused:  # GCE refuses a request without the header
            opener.open(url, timeout=5)
        assert refused.value.code == 403
        with opener.open(urllib.request.Request(url, headers=util.GCP_METADATA_HEADER), timeout=5) as response:
            assert response.status == 200 and response.headers["Metadata-Flavor"] == "Google"
        monkeypatch.setenv("GCE_METADATA_IP", server.address)
        assert util.on_gcp() and util.detect_platform() == (
            util.PlatformDevice.GCE_GPU if gpu else util.PlatformDevice.GCE_CPU
        )
        assert util.termination_watcher_function_gce() is False  # "NONE": no maintenance pending
        gce.send_maintenance_notice(address=server.address)
        assert util.termination_watcher_function_gce() is True
        assert server.requests.count("/computeMetadata/v1/instance/maintenance-event") == 2
    with gce.FakeMetadataServer(on_gcp=False) as server:
        monkeypatch.setenv("GCE_METADATA_IP", server.address)
        assert not util.on_gcp() and util.detect_platform() == (
            util.PlatformDevice.INTERNAL_GPU if gpu else util.PlatformDevice.INTERNAL_CPU
        )


@pytest.mark.extended  # lesson 08 runs two of these rows in smoke mode, all in full mode
def test_preemption_handler_on_each_platform_and_our_own_handler(tmp_path):
    """Lesson 08 §3's matrix: the preemption demo (one process, a notice after step 3 — 2 for a maintenance event —
    then the same command again) against the fake metadata server. What TensorFlow 2.20's PreemptionCheckpointHandler
    really does: off Google Cloud it saves after the next step and exits 42, and the restart resumes there; on a GCE
    CPU VM it does nothing (SIGTERM kills the process, no checkpoint, the restart begins at 0); on a GCE GPU VM
    (detection patched: no GPU here) it ignores SIGTERM, and on a maintenance event saves once and keeps training
    (grace period 3600 s), or with grace_period=0 saves and exits 143. Our own handler saves on SIGTERM and exits
    143 with no step lost; SIGKILL loses fewer steps than its save interval."""
    from course_utils.lessons.scaling_out import experiments as scaling_out

    rows = scaling_out.platform_matrix(str(tmp_path), rows=(scaling_out.OFF_GCP_ROW, *scaling_out.PLATFORM_ROWS))
    got = {
        (r["row"], r["notice"]): (r["platform"], r["exit"], len(r["saved"]), r["run1_last"], r["resumed"]) for r in rows
    }
    assert got[("off Google Cloud, 1 worker", "sigterm")] == ("INTERNAL_CPU", 42, 1, 4, 4)
    assert got[("GCE CPU VM (Colab CPU)", "sigterm")] == ("GCE_CPU", -15, 0, 3, 0)
    assert got[("GCE GPU VM*", "sigterm")] == ("GCE_GPU", -15, 0, 3, 0)
    platform, code, saved, last, resumed = got[("GCE GPU VM*", "maintenance")]
    assert (platform, code, saved, last) == ("GCE_GPU", 0, 1, 8) and 2 < resumed < 8  # saved, trained on
    platform, code, saved, last, resumed = got[("GCE GPU VM*, grace_period=0", "maintenance")]
    assert (platform, code, saved) == ("GCE_GPU", 143, 1) and resumed == last > 2
    assert got[("own handler, GCE CPU VM", "sigterm")][1:] == (143, 2, 4, 4)  # step 2 (periodic) and 4 (the notice)
    platform, code, saved, last, resumed = got[("own handler, GCE CPU VM", "sigkill")]
    assert (code, saved, last, resumed) == (-9, 1, 3, 2)  # the periodic save at step 2: one step lost
    assert {tuple(r["metadata_asked"]) for r in rows if r["row"].startswith("GCE GPU")} == {
        ("instance/hostname", "instance/maintenance-event")
    }
    claims = scaling_out._platform_claims(rows)
    assert [c.holds for c in claims] == [True, None, True, True, True, True, True], [c.measured for c in claims]


# -- Issue 32: heartbeats, evaluation by index, a worker lost mid-schedule ------------------------------------------


def test_batch_by_index_sees_every_example_once_and_matches_skip():
    """Step k of the exact evaluation slices batch k by index: together the steps see every example once, each batch
    the one ``skip(k).take(1)`` would have produced (what the lesson replaced: O(k) a step)."""
    import numpy as np
    import tensorflow as tf

    from course_utils.lessons.scaling_out import parameter_server

    n, batch = 100, 16  # 6 whole batches; the last 4 examples are dropped, as batch(drop_remainder=True) does
    ids = np.arange(n, dtype="int32")
    x = np.random.default_rng(0).normal(size=(n, 3)).astype("float32")
    tensors = (tf.constant(ids), tf.constant(x))
    data = tf.data.Dataset.from_tensor_slices((ids, x)).batch(batch, drop_remainder=True)

    @tf.function
    def by_index(k):  # as the scheduled step does: k is a tensor
        return parameter_server.batch_by_index(tensors, k, batch)

    seen = []
    for k in range(n // batch):
        got = by_index(tf.constant(k, tf.int64))
        want = data.skip(k).take(1).get_single_element()
        assert all(np.array_equal(g.numpy(), w.numpy()) for g, w in zip(got, want)), k
        seen.append(got[0].numpy())
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange((n // batch) * batch))


def test_batch_cost_times_skip_and_slicing_on_the_same_batches():
    from course_utils.lessons.scaling_out import parameter_server

    cost = parameter_server.batch_cost(batches=32, batch=4, rounds=1)  # checks inside that each way got batch k
    assert cost["batches"] == 32 and set(cost) == {"batches", "batch", "skip(k).take(1)", "slice by index"}
    assert all(
        set(cost[way]) == {"0", "31"} and min(cost[way].values()) > 0 for way in ("skip(k).take(1)", "slice by index")
    )


def _stall_results(**dead_changes) -> dict:
    hung = {
        "step_s": [0.5, 0.02, 12.01, 0.02],
        "error": None,
        "failed_step": None,
        "waited_s": None,
        "timeout_s": 0.0,
        "stall_s": 12.0,
        "stall_after": 2,
        "dies": False,
        "message": None,
        "detection": {"health_check_thread": False, "coordination_service": "standalone", "heartbeat_timeout_ms": 0},
    }
    timed = dict(
        hung,
        step_s=[0.5, 0.02],
        error="DeadlineExceededError",
        failed_step=3,
        waited_s=2.0,
        timeout_s=2.0,
        error_line="timed out",
        message="worker 0 exited with code 3; the other tasks were stopped",
    )
    dead = dict(
        hung,
        step_s=[0.5, 0.02],
        error="UnavailableError",
        failed_step=3,
        waited_s=9.3,
        after_death_s=9.4,
        dies=True,
        error_line="The following tasks are unhealthy (stopped sending heartbeats): /job:worker/...",
        message="worker 1 was killed by SIGKILL after 4.0 s; worker 0 exited with code 3 after 13.4 s",
    )
    dead.update(dead_changes)
    return {"no timeout": hung, "timeout": timed, "dead": dead}


def test_heartbeat_claims_hold_only_for_a_death_found_by_the_heartbeats_in_time():
    from course_utils import report
    from course_utils.lessons.scaling_out import experiments as scaling_out

    claims = scaling_out._heartbeat_claims(_stall_results())
    assert [c.status for c in claims] == [report.HOLDS, report.HOLDS], [c.measured for c in claims]
    assert "9.4 s after the death" in claims[0].measured
    assert scaling_out._heartbeat_claims({k: v for k, v in _stall_results().items() if k != "dead"}) == []
    off = {"health_check_thread": True, "coordination_service": "standalone", "heartbeat_timeout_ms": 0}
    for change in (
        {"after_death_s": 0.05},  # at once: a broken connection, not the heartbeats
        {"after_death_s": 25.0},  # far beyond the heartbeat timeout
        {"after_death_s": None},
        {"error_line": "recvmsg:Connection reset by peer"},
        {"error": "DeadlineExceededError"},
        {"error": None, "error_line": ""},
        {"detection": off},  # the old health check ran
        {"detection": dict(off, health_check_thread=False, heartbeat_timeout_ms=3000)},  # not the default
        {"message": "worker 1 was killed by SIGKILL; the other tasks were stopped"},
    ):  # worker 0 never ran on
        claim = scaling_out._heartbeat_claims(_stall_results(**change))[0]
        assert claim.status == report.FAILS, change
    short = _stall_results()
    short["no timeout"].update(stall_s=4.0, step_s=[0.5, 0.02, 4.01, 0.02])  # shorter than the heartbeat timeout
    assert scaling_out._heartbeat_claims(short)[1].status == report.FAILS
    caught = _stall_results()
    caught["no timeout"].update(error="UnavailableError", failed_step=3, step_s=[0.5, 0.02])  # the hang was "found"
    assert scaling_out._heartbeat_claims(caught)[1].status == report.FAILS


def test_heartbeat_claims_with_the_smoke_mode_timeout_hold_against_that_timeout():
    """Smoke mode sets a 4 s heartbeat timeout (multiworker.set_heartbeat_timeout): a death found ~3 s after, and a 6 s
    hang not found, hold; the strategy reporting another timeout than the one asked for, or a hang no longer than
    the timeout, does not."""
    from course_utils import report
    from course_utils.lessons.scaling_out import experiments as scaling_out

    set4 = {"health_check_thread": False, "coordination_service": "standalone", "heartbeat_timeout_ms": 4000}

    def smoke(**dead):
        results = _stall_results(**{"heartbeat_s": 4.0, "detection": set4, "after_death_s": 3.1, **dead})
        results["no timeout"].update(heartbeat_s=4.0, stall_s=6.0, step_s=[0.5, 0.02, 6.01, 0.02], detection=set4)
        return results

    claims = scaling_out._heartbeat_claims(smoke())
    assert [c.status for c in claims] == [report.HOLDS, report.HOLDS], [c.measured for c in claims]
    assert "timeout 4 s (set: smoke mode)" in claims[0].expected and "(> 4 s)" in claims[1].expected
    assert scaling_out.detection_bounds_s(4.0) == (1.0, 7.0)
    for change in (
        {"detection": dict(set4, heartbeat_timeout_ms=0)},  # the setting did not reach the service
        {"after_death_s": 9.4},
    ):  # found only after the default timeout
        assert scaling_out._heartbeat_claims(smoke(**change))[0].status == report.FAILS, change
    short = smoke()
    short["no timeout"].update(stall_s=4.5, step_s=[0.5, 0.02, 4.51, 0.02])  # not beyond timeout + the 1 s check
    assert scaling_out._heartbeat_claims(short)[1].status == report.FAILS
    assert scaling_out.heartbeat_timeout_s(True) == 4.0 and scaling_out.heartbeat_timeout_s(False) is None


def _ps_failure(**changes) -> dict:
    lost = {
        "killed": 1,
        "scheduled": 16,
        "returned": 16,
        "first_half": [0, 1, 0, 0, 0, 0, 0, 0],
        "second_half": [0] * 8,
        "ran_on_killed_before_kill": 1,
        "put_back": 1,
        "failure_lines": ["Worker ..."],
        "executions": 17,
        "join_after_kill_s": 0.1,
        "grpc_fail_fast": "use_caller",
    }
    lost.update(changes)
    return {"worker_failure": lost}


def test_worker_failure_claim_needs_every_step_back_and_the_survivor_running_the_rest():
    from course_utils import report
    from course_utils.lessons.scaling_out import experiments as scaling_out

    assert scaling_out._worker_failure_claim(_ps_failure())[0].status == report.HOLDS
    assert scaling_out._worker_failure_claim({}) == []
    for change in (
        {"returned": 15},
        {"second_half": [0, 1, 0, 0, 0, 0, 0, 0]},
        {"second_half": []},
        {"put_back": 0},
        {"executions": 15},
        {"grpc_fail_fast": "false"},
    ):
        assert scaling_out._worker_failure_claim(_ps_failure(**change))[0].status == report.FAILS, change


def test_batch_cost_claim_needs_skip_to_grow_and_slicing_to_stay_flat():
    from course_utils import report
    from course_utils.lessons.scaling_out import experiments as scaling_out

    def ev(skip_last, index_last):
        return {
            "batch_cost": {
                "batches": 1024,
                "batch": 16,
                "skip(k).take(1)": {"0": 0.001, "1023": skip_last},
                "slice by index": {"0": 0.0004, "1023": index_last},
            }
        }

    assert scaling_out._batch_cost_claim(ev(0.18, 0.0004))[0].status == report.HOLDS
    assert scaling_out._batch_cost_claim({}) == []
    assert scaling_out._batch_cost_claim(ev(0.005, 0.0004))[0].status == report.FAILS  # skip did not grow
    assert scaling_out._batch_cost_claim(ev(0.18, 0.01))[0].status == report.FAILS  # slicing grew with k


def test_fault_demo_programs_refuse_bad_arguments_in_one_line(monkeypatch, capsys, tmp_path):
    from course_utils.lessons.scaling_out import multiworker
    from course_utils.lessons.scaling_out import parameter_server

    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}')
    assert multiworker.main(["--die", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["--die needs --stall-worker I (the worker that dies)"]
    for workers, kill, expected in (
        (2, "2", "--kill-worker 2: the cluster has workers 0-1"),
        (1, "0", "--kill-worker needs at least 2 workers: one must survive"),
    ):
        monkeypatch.setenv(
            "TF_CONFIG",
            cluster.tf_config(
                {
                    "chief": ["127.0.0.1:1"],
                    "worker": [f"127.0.0.1:{2 + i}" for i in range(workers)],
                    "ps": ["127.0.0.1:9"],
                },
                "chief",
                0,
            ),
        )
        assert parameter_server.main(["--out", str(tmp_path), "--kill-worker", kill]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [expected]


@pytest.mark.extended  # lesson 08 runs this cluster (and its claim) in every mode
@pytest.mark.parametrize("heartbeat_s", [None, 4.0], ids=["default", "smoke-mode 4 s"])
def test_a_dead_worker_is_found_by_the_heartbeats_within_bounds(tmp_path, heartbeat_s):
    """Issue 32: TensorFlow 2.20's MultiWorkerMirroredStrategy turns on the coordination service and its health-check
    thread off; a SIGKILLed worker's peer fails with UnavailableError naming the stopped heartbeats, about the
    heartbeat timeout after the death (the default 10 s, or the 4 s smoke mode sets) — not at once, not after the old
    30 s check."""
    from course_utils.lessons.scaling_out import experiments as scaling_out

    dead = scaling_out.stalled_worker(str(tmp_path), heartbeat_s=heartbeat_s, runs=("dead",))["dead"]
    assert dead["detection"] == {
        "health_check_thread": False,
        "coordination_service": "standalone",
        "heartbeat_timeout_ms": int(1000 * (heartbeat_s or 0)),
    }
    assert dead["error"] == "UnavailableError" and "stopped sending heartbeats" in dead["error_line"], dead
    low, high = scaling_out.detection_bounds_s(heartbeat_s or scaling_out.HEARTBEAT_TIMEOUT_S)
    assert low <= dead["after_death_s"] <= high, dead
    assert dead["failed_step"] == 3 and len(dead["step_s"]) == 2
    assert (
        "worker 1 was killed by SIGKILL after" in dead["message"] and "worker 0 exited with code 3" in dead["message"]
    )


@pytest.mark.extended  # lesson 08 runs this cluster (and its claim) in every mode
def test_parameter_server_coordinator_reruns_a_killed_workers_steps_on_the_other(tmp_path):
    lines = []
    result = cluster.launch(
        "course_utils.lessons.scaling_out.parameter_server",
        ["--steps", "8", "--out", str(tmp_path), "--no-fit", "--kill-worker", "1", "--kill-steps", "6"],
        chief=True,
        workers=2,
        ps=1,
        timeout=180,
        log=lines.append,
        stop_on_failure=False,
    )
    assert result.ok() and result.returncodes["worker 1"] == -9
    lost = json.loads((tmp_path / "parameter_server.json").read_text())["worker_failure"]
    assert lost["returned"] == lost["scheduled"] == 12 and set(lost["second_half"]) == {0}
    assert lost["put_back"] >= 1 and lost["executions"] >= 12 and lost["grpc_fail_fast"] == "use_caller"
    assert any("SIGKILLed mid-schedule" in line for line in lines)
    assert not any("GRPC error information" in line for line in lines)  # the coordinator's log kept quiet
    assert all(_gone(pid) for pid in result.pids.values())
