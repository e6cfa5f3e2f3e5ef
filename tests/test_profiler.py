"""course_utils.profiler reads a Keras TensorBoard profile: an input-bound step reads as input-bound,
a compute-bound one as compute-bound; no profile or no plugin is one clear ProfileError."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from course_utils import profiler


def _profiled_fit(log_dir, slow_input: bool) -> None:
    import keras
    import tensorflow as tf

    x = np.random.default_rng(0).random((640, 32, 32, 3), dtype=np.float32)
    y = np.arange(640) % 10

    def slow(image, label):  # 2 ms of host work per example, serial, no prefetch: the step waits
        image = tf.numpy_function(lambda v: (__import__("time").sleep(0.002), v)[1], [image], tf.float32)
        image.set_shape((32, 32, 3))
        return image, label

    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = ds.map(slow).batch(32) if slow_input else ds.batch(32).cache().prefetch(4)
    model = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            # 96 filters: a step of ~25 ms, so that the cached input's hiccups on a busy machine stay a small share
            # (with 32, a ~7 ms step, CI's machine read the cached input at 10.2% waiting: "input-bound", 2026-12-03)
            keras.layers.Conv2D(96, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ]
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ds, epochs=1, verbose=0, callbacks=[keras.callbacks.TensorBoard(str(log_dir), profile_batch=(4, 12))])


@pytest.mark.parametrize("slow_input, expected", [(True, "input-bound"), (False, "compute-bound")])
def test_reads_whether_the_step_waits_for_input(tmp_path, slow_input, expected):
    _profiled_fit(tmp_path, slow_input)
    try:
        reading = profiler.read_input_bound(str(tmp_path))
    except profiler.ProfileError as err:  # e.g. Colab's protobuf 5.29 with xprof 2.20.9 (needs >= 6.31)
        if "cannot load" not in str(err):
            raise
        pytest.skip(str(err))
    assert reading.bound == expected, reading
    assert reading.steps == 9 and reading.step_ms > 0
    if slow_input:
        assert reading.input_share > 0.5, reading  # 64 ms of sleep in each step of ~70 ms
    else:
        assert reading.input_share < profiler.INPUT_BOUND_ABOVE, reading
    assert expected in str(reading)
    assert len(reading.timeline) == 9  # each step's timing: it asked for its batch within the step, and got it
    for step in reading.timeline:
        assert step.start_ms <= step.asked_ms <= step.got_ms <= step.start_ms + step.step_ms, step
        assert step.wait_ms == pytest.approx(step.got_ms - step.asked_ms, abs=0.01), step  # one IteratorGetNext
    assert [s.start_ms for s in reading.timeline] == sorted(s.start_ms for s in reading.timeline)
    assert reading.timeline[0].start_ms == 0


def test_no_profile_is_a_clear_error(tmp_path):
    with pytest.raises(profiler.ProfileError, match="no profile under .*profile_batch"):
        profiler.read_input_bound(str(tmp_path))


def _hide_plugin(monkeypatch):
    for name in ("xprof", "xprof.convert", "tensorboard_plugin_profile", "tensorboard_plugin_profile.convert"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed


def test_missing_plugin_says_how_to_install_when_tensorflow_cannot_read_the_profile_either(tmp_path, monkeypatch):
    plane = tmp_path / "train" / "plugins" / "profile" / "2026_01_01_00_00_00" / "host.xplane.pb"
    plane.parent.mkdir(parents=True)
    plane.write_bytes(b"")  # an empty profile: no steps
    _hide_plugin(monkeypatch)
    with pytest.raises(profiler.ProfileError, match="pip install tensorboard-plugin-profile"):
        profiler.read_input_bound(str(tmp_path))
    plane.write_bytes(b"\xff" * 64)  # not an XSpace at all
    with pytest.raises(profiler.ProfileError, match="not a readable profile"):
        profiler.read_input_bound(str(tmp_path))


@pytest.mark.parametrize("slow_input", [True, False])
def test_without_the_plugin_the_trace_is_read_with_tensorflows_own_format(tmp_path, monkeypatch, slow_input):
    """Colab: tensorboard-plugin-profile is not installed, and xprof 2.20.9 cannot load on its protobuf 5.29."""
    _profiled_fit(tmp_path, slow_input)
    try:
        with_plugin = profiler.read_input_bound(str(tmp_path))
    except profiler.ProfileError:
        with_plugin = None
    _hide_plugin(monkeypatch)
    reading = profiler.read_input_bound(str(tmp_path))
    assert "TensorFlow's own profile format" in reading.source and reading.steps == 9
    assert reading.bound == ("input-bound" if slow_input else "compute-bound"), reading
    if with_plugin is not None and "trace" in with_plugin.source:  # the same events, read two ways
        assert reading.input_share == pytest.approx(with_plugin.input_share, abs=1e-6)
        for ours, theirs in zip(reading.timeline, with_plugin.timeline, strict=True):
            assert ours.asked_ms == pytest.approx(theirs.asked_ms, abs=0.01), (ours, theirs)
            assert ours.wait_ms == pytest.approx(theirs.wait_ms, abs=0.01), (ours, theirs)


def _table(cols, rows, conclusion="Your program is HIGHLY input-bound"):
    return [
        {
            "p": {"input_conclusion": conclusion, "hardware_type": "TPU"},
            "cols": [{"id": c, "type": "number"} for c in cols],
            "rows": [{"c": [{"v": v} for v in r]} for r in rows],
        },
        {"cols": [{"id": "opName"}], "rows": []},
    ]  # the host-ops table that follows it


def test_reads_a_tpu_profiles_columns_not_the_trace(monkeypatch, tmp_path):
    """Issue 21: xprof's TPU table has no stepTimeMs/infeedTimeMs (GenerateTpuInputPipelineAnalysisDataTable): the
    TensorCore's compute, infeed, outfeed, idle and host-transfer times per step; SparseCore v0 columns where the
    chip has one. The reading comes from those columns, never silently from the trace."""
    cols = [
        "stepnum",
        "tcComputeTimeMs",
        "scv0ComputeTimeMs",
        "scv0InfeedTimeMs",
        "tcInfeedTimeMs",
        "tcOutfeedTimeMs",
        "tcIdleTimeMs",
        "hostTransferTimeMs",
        "tooltip",
        "infeedPercentAverage",
        "infeedPercentMin",
        "infeedPercentMax",
    ]
    rows = [
        ["0", 30.0, 0.0, 0.0, 60.0, 1.0, 8.0, 1.0, "step 0", 60.0, 55.0, 65.0],
        ["1", 30.0, 0.0, 0.0, 70.0, 0.0, 0.0, 0.0, "step 1", 70.0, 66.0, 74.0],
    ]
    tables = {"input_pipeline_analyzer": _table(cols, rows)}

    class Convert:
        @staticmethod
        def xspace_to_tool_data(paths, tool, params):
            if tool not in tables:
                raise AssertionError(f"read {tool}: the TPU columns were not used")
            import json

            return json.dumps(tables[tool]).encode(), None

    monkeypatch.setattr(profiler, "find_xplanes", lambda log_dir: [str(tmp_path / "t.xplane.pb")])
    monkeypatch.setattr(profiler, "_converter", lambda: Convert)
    reading = profiler.read_input_bound(str(tmp_path))
    assert reading.source == "the input pipeline analysis" and reading.steps == 2
    assert reading.step_ms == pytest.approx(100.0) and reading.input_share == pytest.approx(0.65)
    assert reading.bound == "input-bound"
    assert [(t.start_ms, t.step_ms, t.wait_ms, t.asked_ms) for t in reading.timeline] == [
        (0.0, 100.0, 60.0, None),
        (100.0, 100.0, 70.0, None),
    ]  # each step's time and input part, end to end
    # the same table without the SparseCore columns (chips without one) reads the same
    keep = [i for i, c in enumerate(cols) if not c.startswith("scv0")]
    tables["input_pipeline_analyzer"] = _table([cols[i] for i in keep], [[r[i] for i in keep] for r in rows])
    assert profiler.read_input_bound(str(tmp_path)).input_share == pytest.approx(0.65)


def _memory_profile(allocators: dict):
    """xprof's memory_profile tool output (the shape it has for a CPU BFC, GPU or TPU allocator)."""
    import json

    class Convert:
        @staticmethod
        def xspace_to_tool_data(paths, tool, params):
            assert tool == "memory_profile", tool
            return json.dumps({"memoryProfilePerAllocator": allocators, "numHosts": 1, "version": 1}).encode(), None

    return Convert


def _snapshot(heap, op, shape, size):
    return {
        "aggregationStats": {"heapAllocatedBytes": str(heap)},
        "activityMetadata": {
            "memoryActivity": "ALLOCATION",
            "allocationBytes": str(size),
            "tfOpName": op,
            "tensorShape": shape,
        },
    }


def test_memory_profile_reads_the_peak_and_what_is_alive_there(monkeypatch, tmp_path):
    gpu = {
        "memoryProfileSnapshots": [
            _snapshot(100, "a/Gelu", "[8,256]", 60),
            _snapshot(160, "a/MatMul", "[8,64]", 40),
            _snapshot(220, "b/Gelu", "[8,256]", 60),
        ],
        "activeAllocations": [
            {"snapshotIndex": "0", "specialIndex": "-1", "numOccurrences": "1"},
            {"snapshotIndex": "2", "specialIndex": "-1", "numOccurrences": "2"},
            {"snapshotIndex": "-1", "specialIndex": "0", "numOccurrences": "1"},
        ],
        "specialAllocations": [
            {"allocationBytes": "20", "tfOpName": "unused preallocated device memory", "tensorShape": "unknown"}
        ],
    }
    host = {"memoryProfileSnapshots": [_snapshot(50, "x", "[1]", 50)], "activeAllocations": []}
    monkeypatch.setattr(profiler, "find_xplanes", lambda log_dir: [str(tmp_path / "run" / "h.xplane.pb")])
    monkeypatch.setattr(profiler, "_converter", lambda: _memory_profile({"host_bfc": host, "GPU_0_bfc": gpu}))
    profile = profiler.read_memory_profile(str(tmp_path))
    assert profile.allocator == "GPU_0_bfc" and profile.peak_bytes == 220  # the allocator with the highest peak
    assert [(e["op"], e["bytes"], e["count"]) for e in profile.at_peak] == [("b/Gelu", 120, 2), ("a/Gelu", 60, 1)]
    assert profile.reserved_bytes == 20  # the allocator's reserve is no tensor: kept apart
    from course_utils.lessons.activation_memory import experiments as activation_memory

    assert activation_memory.tensor_bytes_at_peak(profile) == 200  # what lesson 07's claim compares
    assert profile.share(lambda e: e["op"] == "b/Gelu") == pytest.approx(120 / 180)

    monkeypatch.setattr(profiler, "_converter", lambda: _memory_profile({"cpu": {"memoryProfileSnapshots": []}}))
    with pytest.raises(profiler.ProfileError, match="recorded no allocations: on a CPU the allocator must be"):
        profiler.read_memory_profile(str(tmp_path))


def test_lesson_07_runs_on_without_the_plugin_and_its_claim_says_why(tmp_path, monkeypatch):
    """Colab's images have no tensorboard_plugin_profile (nox -s colab_tpu: lesson 07 §7's cell raised ProfileError
    there, and Run all stopped): the profile is skipped with the reason, and the claim reads "not measurable here"."""
    from course_utils import report
    from course_utils.lessons.activation_memory import experiments as exp

    _hide_plugin(monkeypatch)
    monkeypatch.setattr(exp, "profile_step_memory", lambda log_dir, **kw: profiler.read_memory_profile(log_dir))
    profiles, why = exp.profiled_steps(str(tmp_path), batch=8, net=dict(depth=2, width=8))
    assert profiles == {} and "profile" in why
    claim = exp._profile_claim({"no_profile": why, "profile_peaks": {}, "wide_share": {}})
    assert claim.status == report.UNMEASURABLE and claim.note == why and claim.id == "07.peak_is_block_insides"
