"""Tests of lesson 04's experiments (course_utils.lessons.data_pipeline_sharding.experiments): every example exactly once on 1, 2
and 4 replicas, how the ragged last step is dealt out, auto-shard policies, shuffle before shard, and the
timing helpers."""

from __future__ import annotations

import time

import numpy as np
import pytest

from course_utils import data
from course_utils.lessons.data_pipeline_sharding import experiments as exp
from course_utils.runtime import run_with_replicas


def test_naive_pipeline_has_no_cache_parallelism_or_prefetch():
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((np.zeros((8, 32, 32, 3), np.uint8), np.zeros(8, np.int64)))
    naive = data.build_pipeline(ds, 4, parallel=False, cache=False, prefetch=False)
    tuned = data.build_pipeline(ds, 4)
    assert "Prefetch" in type(tuned).__name__ and "Prefetch" not in type(naive).__name__
    assert exp.pipeline_throughput(naive, epochs=1) > 0


def test_input_bound_check_names_a_slow_pipeline():
    import keras
    import tensorflow as tf

    x = np.zeros((64, 32, 32, 3), np.uint8)
    ds = tf.data.Dataset.from_tensor_slices((x, np.zeros(64, np.int64)))

    def slow(image, label):
        tf.py_function(lambda: time.sleep(0.01), [], [])
        return image, label

    model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Flatten(), keras.layers.Dense(10)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    slow_ds = ds.map(slow).batch(16).map(data.to_float)
    slow_report = exp.input_bound_check(model, slow_ds, steps=3, repeats=3)
    assert slow_report.bottleneck == "input pipeline" and "INPUT-BOUND" in str(slow_report)
    fast_ds = data.build_pipeline(ds, 16).cache()
    assert exp.input_bound_check(model, fast_ds, steps=3, repeats=3).pipeline_images_per_s > 0


# ---------------------------------------------------------------------------------------------- replicas

N, PER_REPLICA = 100, 8  # 100 is not a multiple of any global batch here: the last batch is ragged


def _assert_exactly_once(rows, replicas):
    assert {(r["api"], r["drop_remainder"]) for r in rows} == {(a, d) for a in data.APIS for d in (False, True)}
    for r in rows:
        assert r["replicas"] == replicas and r["global_batch"] == PER_REPLICA * replicas
        assert r["first_step"] == [PER_REPLICA] * replicas, r
        assert r["duplicated"] == 0, r
        if r["drop_remainder"]:
            assert r["missing"] == N % r["global_batch"] and r["seen"] == N - N % r["global_batch"], r
            assert r["last_step"] == [PER_REPLICA] * replicas, r
        else:
            assert r["exactly_once"] and r["seen"] == N and r["missing"] == 0, r
            assert sum(r["last_step"]) == N % r["global_batch"], r  # the ragged final step


def test_each_example_exactly_once_on_one_replica():
    import tensorflow as tf

    _assert_exactly_once(exp.replica_checks(tf.distribute.OneDeviceStrategy("/cpu:0"), N, PER_REPLICA)["rows"], 1)


@pytest.mark.parametrize("replicas", [2, 4])
def test_each_example_exactly_once_on_cpu_replicas(replicas):
    result = run_with_replicas(replicas, None, exp.replica_checks, n_examples=N, per_replica_batch=PER_REPLICA)
    assert result["replicas"] == replicas and "fresh process" in result["where"]
    _assert_exactly_once(result["rows"], replicas)


def test_exactly_once_counts():
    assert exp.exactly_once([0, 1, 2], 3)["exactly_once"]
    assert exp.exactly_once([0, 0, 2], 3) == {"seen": 3, "missing": 1, "duplicated": 1, "exactly_once": False}


# ---------------------------------------------------------------------------------------------- workers


def test_auto_shard_policies(tmp_path):
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((np.zeros((16, 32, 32, 3), np.uint8), np.arange(16, dtype=np.int64)))
    four = data.write_tfrecords(str(tmp_path / "four"), ds, num_files=4)
    rows = exp.auto_shard_table(four, num_workers=2)
    summary = {r["policy"]: r for r in rows if r["worker"] == "all"}
    assert summary["FILE"]["count"] == 16 and "0 ids duplicated, 0 missing" in summary["FILE"]["ids"]
    assert summary["DATA"]["count"] == 16 and "0 ids duplicated, 0 missing" in summary["DATA"]["ids"]
    assert summary["OFF"]["count"] == 32 and "16 ids duplicated" in summary["OFF"]["ids"]
    first = next(iter(data.tfrecord_dataset(four)))
    assert first["image"].shape == (32, 32, 3) and first["image"].dtype == tf.uint8
    two = data.write_tfrecords(str(tmp_path / "two"), ds, num_files=2)
    failed = exp.auto_shard_table(two, num_workers=4, policies=("FILE",))
    assert "FAILED" in failed[-1]["ids"]
    assert any("not enough for the required 4 shards" in r["ids"] for r in failed)


def test_remainder_is_dealt_in_per_replica_batches():
    result = run_with_replicas(4, None, exp.remainder_split, per_replica_batch=32, examples=[659, 680, 740])
    last = {r["examples"]: r for r in result["rows"]}
    assert last[680]["distribute_datasets_from_function"] == [32, 8, 0, 0]  # not [40, 0, 0, 0]
    assert last[659]["distribute_datasets_from_function"] == [19, 0, 0, 0]
    assert last[740]["distribute_datasets_from_function"] == [32, 32, 32, 4]
    assert last[680]["experimental_distribute_dataset"] == [10, 10, 10, 10]  # split evenly
    for r in result["rows"]:
        assert r["distribute_datasets_from_function"] == r["predicted (dealt in turn)"]
        assert sum(r["experimental_distribute_dataset"]) == r["remainder"]


def test_dealt_last_step_prediction():
    assert exp.dealt_last_step(680, 32, 4) == [32, 8, 0, 0]
    assert exp.dealt_last_step(640, 32, 4) == [32, 32, 32, 32]  # no remainder: a full last step


def test_unseeded_shuffle_before_shard_overlaps_and_the_fixes_do_not():
    rows = {r["case"]: r for r in exp.shuffle_shard_cases(64, num_workers=4)}
    bad = rows["unseeded shuffle → shard"]
    assert bad["count"] == 64 and bad["duplicated"] > 0 and bad["missing"] > 0
    for case in ("seeded shuffle → shard", "shard → shuffle"):
        assert rows[case]["duplicated"] == rows[case]["missing"] == 0 and rows[case]["count"] == 64
        assert sorted(i for ids in rows[case]["per_worker"] for i in ids) == list(range(64))
    with pytest.raises(ValueError, match="case must be one of"):
        exp.worker_pipeline("nope", 8, 2, 0)


def test_without_auto_prefetch_switches_off_tf_datas_own_overlap():
    import tensorflow as tf

    plain = exp.without_auto_prefetch(tf.data.Dataset.range(8).map(lambda i: i * 2).batch(4))
    opt = plain.options().experimental_optimization
    assert opt.inject_prefetch is False and opt.map_parallelization is False
    assert exp.drain(plain) == 8
    assert exp.simulated_accelerator(plain, step_s=0.0)() == 2  # one wait per batch


def test_interleaved_times_and_ratio():
    times = exp.interleaved_times({"slow": lambda: time.sleep(0.004), "fast": lambda: None}, rounds=3, warmup=0)
    assert len(times["slow"]) == len(times["fast"]) == 3
    assert exp.ratio_samples(times, "slow", "fast").low > 1


def test_a_drained_iterator_is_destroyed_after_the_timer_stops():
    """TensorFlow destroys a tf.data iterator only once its autotuning thread wakes (tens of ms after a short pass):
    drain and simulated_accelerator keep the iterator until interleaved_times has stopped the timer, and it is then
    destroyed, before the next call starts. A stand-in iterator whose destruction takes 0.3 s."""
    destroyed = []

    class SlowToDestroy:
        def __init__(self):
            self.left = 2

        def __iter__(self):
            return self

        def __next__(self):
            if not self.left:
                raise StopIteration
            self.left -= 1
            return np.zeros((4, 2))

        def __del__(self):
            time.sleep(0.3)
            destroyed.append(time.perf_counter())

    class Pipeline:
        def __iter__(self):
            return SlowToDestroy()

    times = exp.interleaved_times(
        {"drain": lambda: exp.drain(Pipeline()), "loop": exp.simulated_accelerator(Pipeline(), step_s=0.001)},
        rounds=2,
        warmup=1,
    )
    assert max(times["drain"] + times["loop"]) < 0.2, times  # the 0.3 s destruction is not timed
    assert len(destroyed) == 6 and not exp._RETIRED  # every iterator destroyed: warm-up and timed calls alike


def test_plots_are_built_from_measurements():
    rows = exp.shuffle_shard_cases(16, num_workers=2)
    fig = exp.plot_worker_ids({r["case"]: r["per_worker"] for r in rows}, n=16)
    assert len(fig.axes) == len(rows)
    fig2 = exp.plot_speedups({"a": exp.Samples([1.1, 1.2, 1.3]), "b": exp.Samples([0.9, 1.0, 1.1])})
    assert len(fig2.axes[0].patches) == 2


def test_shard_as_worker_is_tensorflows_auto_shard_rewrite():
    """shard_as_worker wraps TensorFlow's private _AutoShardDataset (the rewrite experimental_distribute_dataset
    applies on each worker): a release that renames it or changes what it does fails here, not in lesson 04."""
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    ds = tf.data.Dataset.range(12).with_options(options)
    shares = [
        [int(v) for v in exp.shard_as_worker(ds, tf.distribute.InputContext(3, worker, 3))] for worker in range(3)
    ]
    assert shares == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]


# ----------------------------------------------------------------------------------------------
# Reading files, deterministic=False, batch before map, the profiler's view (lesson 04 §2, §6)
# ----------------------------------------------------------------------------------------------


def _row_images(n: int, size: int = 32) -> np.ndarray:
    """Images whose pixels name their row (channel 0) and column (channel 1): a crop and a flip can be read back."""
    x = np.zeros((n, size, size, 3), np.uint8)
    x[..., 0] = np.arange(size)[:, None] + 100
    x[..., 1] = np.arange(size)[None, :] + 100
    return x


def _image_dataset(n: int):
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((_row_images(n), np.arange(n) % 10))


def test_augment_batch_gives_each_image_its_own_flip_and_crop():
    import tensorflow as tf

    x = _row_images(64)
    out = data.augment_batch(tf.constant(x), tf.zeros([64], tf.int64))[0].numpy()
    assert out.shape == x.shape and out.dtype == x.dtype
    padded = np.pad(x, ((0, 0), (4, 4), (4, 4), (0, 0)))
    windows = {(flip, dy, dx) for flip in (False, True) for dy in range(9) for dx in range(9)}

    def window_of(i):  # the (flip, row offset, column offset) that gives image i, or None
        for flip, dy, dx in windows:
            image = padded[i][:, ::-1] if flip else padded[i]
            if np.array_equal(image[dy : dy + 32, dx : dx + 32], out[i]):
                return flip, dy, dx
        return None

    found = [window_of(i) for i in range(64)]
    assert None not in found  # every output is a flip + crop of its own padded image
    assert len({f[0] for f in found}) == 2 and len({f[1] for f in found}) > 3  # drawn per image, not per batch
    assert exp.distinct_crops(data.augment_batch, 64) > 3
    assert exp.distinct_crops(exp.augment_batch_one_crop, 64) == 1  # the mistake: one offset for the batch


def test_bucket_reader_reads_every_record_and_waits(tmp_path):
    import tensorflow as tf

    files = data.write_tfrecords(str(tmp_path), _image_dataset(64), num_files=4)
    reader = exp.bucket_reader(open_s=0.01, request_s=0.01)
    records = tf.data.Dataset.from_tensor_slices(files).flat_map(reader).map(data.parse_record)
    start = time.perf_counter()
    ids = [int(r["id"]) for r in records.as_numpy_iterator()]
    waited = time.perf_counter() - start
    assert ids == list(range(64))
    assert waited >= 4 * 0.01 + 4 * 0.01  # 4 opens, 4 requests of 16 records, one after another


def test_read_and_tail_latency_pipelines_deliver_the_same_records(tmp_path):
    files = data.write_tfrecords(str(tmp_path), _image_dataset(128), num_files=8)
    for name, ds in exp.read_pipelines(files, 32).items():
        assert sorted(exp.arrival_ids(ds)) == list(range(128)), name
    tail = exp.tail_latency_pipelines(files, 32, cycle_length=8)
    arrived = {flag: exp.arrival_ids(ds) for flag, ds in tail.items()}
    assert sorted(arrived[False]) == list(range(128))
    assert list(arrived[True][:8]) == [0, 16, 32, 48, 64, 80, 96, 112]  # round robin over the 8 files
    assert (arrived[True] != arrived[False]).any()  # the next ready record goes first


def test_fused_map_and_batch_keeps_the_order_even_with_deterministic_false():
    moved = exp.fused_map_order(n=64, batch_size=16, slow_one_in=8, slow_s=0.02)
    assert moved["fused (default)"] == 0 and moved["fusion off"] > 0


def test_profiled_input_share_tells_slow_reads_from_memory(tmp_path):
    import keras
    import tensorflow as tf

    x = np.zeros((64, 32, 32, 3), np.float32)
    fast = tf.data.Dataset.from_tensor_slices((x, np.zeros(64, np.int64))).batch(16).cache()

    def slow(image, label):
        waited = tf.py_function(lambda v: (time.sleep(0.1), v)[1], [image], tf.float32)
        waited.set_shape(image.shape)
        return waited, label

    # a step of a few ms (not a few µs): with a step as short as reading the cache, a busy machine (CI's, beside
    # other test workers) measured the cached input at 50.1% of the time. A slow batch of 0.1 s, the regime the
    # pause floor (PAUSE_FLOOR_MS) is for: at 0.02 s a pause of the loop under the floor let the pipeline buffer
    # most of the profiled steps, and CI's busy machine read 21% waiting (2026-12-02)
    model = keras.Sequential(
        [keras.Input((32, 32, 3)), keras.layers.Flatten(), keras.layers.Dense(256), keras.layers.Dense(10)]
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    slow_share = exp.profiled_input_share(model, fast.map(slow), str(tmp_path / "slow")).input_share
    fast_share = exp.profiled_input_share(model, fast, str(tmp_path / "fast")).input_share
    assert slow_share > 0.5 > fast_share


def _slow_buffered_input_and_model():
    """20 ms a batch of input, with room for 8 batches in its buffer (16 batches an epoch); a step of a few ms."""
    import keras
    import tensorflow as tf

    x = np.zeros((256, 8, 8, 3), np.float32)

    def slow(image, label):
        waited = tf.py_function(lambda v: (time.sleep(0.1), v)[1], [image], tf.float32)
        waited.set_shape(image.shape)
        return waited, label

    ds = tf.data.Dataset.from_tensor_slices((x, np.zeros(256, np.int64))).batch(16).cache().map(slow).prefetch(8)
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(10)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return ds, model


def _pause_the_loop_after_step_1(monkeypatch, runs: int, seconds: float = 0.4) -> list:
    """The training loop pauses ``seconds`` after step 1 of the next ``runs`` profiled fits (as a garbage collection
    or a busy machine pauses it): meanwhile the pipeline runs ahead and fills its buffer."""
    import keras

    paused, end = [], keras.callbacks.TensorBoard.on_train_batch_end

    def on_train_batch_end(self, batch, logs=None):
        end(self, batch, logs)
        if batch == 0 and len(paused) < runs:
            paused.append(batch)
            time.sleep(seconds)

    monkeypatch.setattr(keras.callbacks.TensorBoard, "on_train_batch_end", on_train_batch_end)
    return paused


def test_a_pause_of_the_loop_before_the_profiled_steps_does_not_hide_the_wait(tmp_path, monkeypatch):
    """2 busy cores: the loop paused before the profiled steps, the slow pipeline filled its buffers, and the
    profiled steps were fed from them (lesson 04 read 1-3% waiting instead of ~85%). The pause is seen and the run
    profiled again."""
    ds, model = _slow_buffered_input_and_model()
    paused = _pause_the_loop_after_step_1(monkeypatch, runs=1)
    share = exp.profiled_input_share(model, ds, str(tmp_path))
    assert paused and share.input_share > 0.5, share  # the old profile_batch=(3, 6) read ~0 here
    assert share.tries >= 2 and not share.paused and share.stall == "", share  # 2, or more on a busy machine
    assert (tmp_path / "try2").is_dir()  # the run profiled again, beside the paused one


def test_a_loop_that_pauses_on_every_try_is_not_a_measurement(tmp_path, monkeypatch):
    ds, model = _slow_buffered_input_and_model()
    _pause_the_loop_after_step_1(monkeypatch, runs=2)
    share = exp.profiled_input_share(model, ds, str(tmp_path), tries=2)
    assert share.paused and share.tries == 2 and "paused between two profiled steps in each of 2" in share.stall
    assert "not a steady profile" in str(share)


def test_steady_share_leaves_step_1_out_and_measures_the_loops_pauses():
    from course_utils import profiler

    def reading(steps, source="the trace"):  # (step ms, wait ms, ms from getting the last batch to asking again)
        timeline, clock = [], 0.0
        for step_ms, wait_ms, busy in steps:
            asked = clock + busy
            timeline.append(profiler.StepTiming(clock, step_ms, wait_ms, asked, asked + wait_ms))
            clock += step_ms
        return profiler.ProfileReading(0.0, len(steps), 0.0, source, "", "x", tuple(timeline))

    steady = exp.steady_share(reading([(300, 290, 1)] + [(100, 90, 10)] * 6))  # step 1 waits for the pipeline to start
    assert steady.input_share == pytest.approx(0.9) and steady.steps == 6 and not steady.paused, steady
    fed = exp.steady_share(reading([(100, 90, 1), (812, 0, 800)] + [(12, 0, 12)] * 5))  # fed after an 800 ms pause
    assert fed.paused and 700 < fed.pause_ms < 800 and fed.input_share == 0, fed
    assert "paused between two profiled steps" in fed.stall and "not a steady profile" in str(fed)
    analysis = profiler.ProfileReading(
        0.7,
        3,
        100,
        "the input pipeline analysis",
        "",
        "x",
        tuple(profiler.StepTiming(100.0 * i, 100.0, w, None, None) for i, w in enumerate((90, 60, 70))),
    )
    no_times = exp.steady_share(analysis)  # an accelerator's analysis: no times of asking for a batch
    assert no_times.input_share == pytest.approx(0.65) and no_times.pause_ms is None and not no_times.paused


def test_the_steps_per_execution_check_trains_on_one_replica_and_a_hung_check_is_stopped_and_says_so():
    """§7: on one device the fit runs here; the several-replica check runs in a fresh process that is stopped at its
    timeout (the failed step there sometimes blocks for a minute before it raises) and then reads "hung"."""
    import tensorflow as tf

    assert exp.spe_on_mirrored(tf.distribute.OneDeviceStrategy("/cpu:0"), 4) == {
        "replicas": 1,
        "outcome": "fit ran",
        "error": "",
    }
    start = time.monotonic()
    stopped = exp.spe_on_mirrored_fresh(4, timeout=0.5)  # far less than a fresh process needs
    assert time.monotonic() - start < 20
    assert stopped["outcome"] == "hung" and stopped["replicas"] == 4 and "0.5 s" in stopped["error"], stopped


def test_a_steps_per_execution_check_whose_process_fails_says_so_in_one_line(monkeypatch):
    def failed(*args, **kwargs):
        raise RuntimeError("the 4-replica process failed:\nTraceback ...\nImportError: no TensorFlow here")

    monkeypatch.setattr(exp._runtime, "run_with_replicas", failed)
    got = exp.spe_on_mirrored_fresh(4)
    assert got["outcome"] == "process failed" and got["error"] == "ImportError: no TensorFlow here", got
