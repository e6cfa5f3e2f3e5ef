"""Tests of course_utils.data: CIFAR-10 sources, the pipeline, and every example exactly once.

No test touches the network: the tfds path runs under ``tfds.testing.mock_data``, and the failed
download is simulated by making the tfds call raise.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from course_utils import config, data


@pytest.fixture
def env(monkeypatch):
    """Set COURSE_* variables for one test; the config is re-read before and after."""

    def set_env(**values):
        for key, value in values.items():
            monkeypatch.setenv(key, value)
        return config.reload()

    yield set_env
    monkeypatch.undo()
    config.reload()


def _arrays(n=12, seed=0):
    return data.synthetic_cifar(n, n, seed=seed)


def _npz(tmp_path, name="c.npz", **override):
    (xtr, ytr), (xte, yte) = _arrays()
    arrays = dict(x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
    arrays.update(override)
    arrays = {k: v for k, v in arrays.items() if v is not None}
    path = tmp_path / name
    np.savez(path, **arrays)
    return str(path)


# ---------------------------------------------------------------------------------------------- sources


def test_every_source_yields_the_same_element_spec(tmp_path, capsys):
    import tensorflow_datasets as tfds

    expected = data.image_label_spec()
    synthetic = data.load_cifar10("synthetic", n_train=16, n_test=8)
    (xtr, ytr), (xte, yte) = _arrays(16)
    path = data.write_npz(str(tmp_path / "cifar10.npz"), (xtr, ytr), (xte, yte))
    npz = data.load_cifar10(f"npz:{path}", n_train=10, n_test=-1)
    with tfds.testing.mock_data(num_examples=12):
        real = data.load_cifar10("tfds", n_train=12, n_test=12, try_gcs=False)
        first_real = next(iter(real.train))
    for d in (synthetic, npz, real):
        assert d.train.element_spec == expected and d.test.element_spec == expected, d.source
    assert (synthetic.num_train, synthetic.num_test) == (16, 8)
    assert (npz.num_train, npz.num_test) == (10, 16)
    assert (real.num_train, real.num_test) == (12, 12)
    assert first_real[0].dtype.name == "uint8" and first_real[0].shape == (32, 32, 3)
    x_back, y_back = data.to_numpy(npz.train)
    np.testing.assert_array_equal(x_back, xtr[:10])  # the file's own data, unchanged
    np.testing.assert_array_equal(y_back, ytr[:10])
    out = capsys.readouterr().out
    assert "SYNTHETIC" in out and "real CIFAR-10 (tensorflow-datasets)" in out and "local file" in out


def test_default_source_comes_from_config_and_is_announced(env, tmp_path, capsys):
    env(COURSE_SMOKE="1", COURSE_DATA="")
    d = data.load_cifar10(n_train=8, n_test=8)
    assert d.source == "synthetic" and "smoke mode" in d.reason
    assert "smoke mode" in capsys.readouterr().out
    path = _npz(tmp_path)
    env(COURSE_DATA=f"npz:{path}")
    d = data.load_cifar10(n_train=4, n_test=4, verbose=False)
    assert d.source == f"npz:{path}" and d.reason == "set by COURSE_DATA" and d.num_train == 4
    assert capsys.readouterr().out == ""


def test_failed_download_is_a_clear_error_not_a_silent_switch(monkeypatch):
    def offline(**kwargs):
        raise ConnectionError("simulated: Failed to resolve 'storage.googleapis.com'")

    monkeypatch.setattr(data, "_tfds_load", offline)
    with pytest.raises(data.DataSourceError) as info:
        data.load_cifar10("tfds", n_train=8, n_test=8, try_gcs=False)
    message = str(info.value)
    assert "ConnectionError: simulated" in message
    for option in ("COURSE_DATA=synthetic", "COURSE_DATA=npz:", "~/tensorflow_datasets/cifar10", "not switch"):
        assert option in message, option


def test_unknown_source_is_rejected():
    with pytest.raises(config.ConfigError, match="not a data source"):
        data.load_cifar10("cifar", n_train=4, n_test=4)


@pytest.mark.parametrize(
    "override, words",
    [
        ({"x_train": np.zeros((12, 32, 32, 3), np.float32)}, ["x_train has dtype float32", "uint8"]),
        ({"x_train": np.zeros((12, 3, 32, 32), np.uint8)}, ["x_train has shape (12, 3, 32, 32)", "NCHW"]),
        ({"x_test": np.zeros((12, 28, 28), np.uint8)}, ["x_test has shape (12, 28, 28)", "(N, 32, 32, 3)"]),
        ({"y_train": np.zeros((12, 10), np.int64)}, ["y_train has shape (12, 10)", "one-hot"]),
        ({"y_test": np.zeros(12, np.float32)}, ["y_test has dtype float32"]),
        ({"y_test": np.full(12, 10)}, ["labels from 10 to 10", "0-9"]),
        ({"y_test": None}, ["lacks the key(s) y_test", "x_train, y_train, x_test, y_test"]),
    ],
    ids=["float-images", "channels-first", "grayscale", "one-hot", "float-labels", "label-range", "missing-key"],
)
def test_bad_npz_gives_a_clear_error(tmp_path, override, words):
    path = _npz(tmp_path, **override)
    with pytest.raises(data.DataSourceError) as info:
        data.load_cifar10(f"npz:{path}", verbose=False)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_missing_npz_file_names_the_options(tmp_path):
    with pytest.raises(data.DataSourceError, match="no such file.*COURSE_DATA=synthetic"):
        data.load_cifar10(f"npz:{tmp_path / 'nope.npz'}", verbose=False)


def test_synthetic_data_is_learnable_quickly():
    import keras

    from course_utils import models

    keras.utils.set_random_seed(0)
    d = data.load_cifar10("synthetic", n_train=1024, n_test=512, verbose=False)
    train = data.build_pipeline(d.train, 32, augment_fn=None, seed=0)
    test = data.build_pipeline(d.test, 128, training=False, drop_remainder=False)
    model = models.small_cnn(width=8)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    start = time.perf_counter()
    model.fit(train, epochs=4, verbose=0)
    seconds = time.perf_counter() - start
    _, accuracy = model.evaluate(test, verbose=0)
    assert accuracy > 0.60, accuracy
    assert seconds < 30, seconds


# ---------------------------------------------------------------------------------------------- pipeline


def _epoch_ids_and_images(ds):
    ids, images = [], []
    for x, y in ds:
        ids += [int(v) for v in y]
        images.append(x.numpy())
    return ids, np.concatenate(images)


def test_pipeline_order_cache_shuffle_augment():
    import tensorflow as tf

    n = 64
    x = np.tile(np.arange(32, dtype=np.uint8)[None, :, None, None], (n, 1, 32, 3))  # left-right asymmetric
    ds = tf.data.Dataset.from_tensor_slices((x, np.arange(n, dtype=np.int64)))
    tuned = data.build_pipeline(ds, 16, seed=1)
    assert tuned.element_spec[0].shape.as_list() == [16, 32, 32, 3]  # static batch shape
    assert tuned.element_spec[0].dtype == tf.float32
    (ids1, im1), (ids2, im2) = _epoch_ids_and_images(tuned), _epoch_ids_and_images(tuned)
    assert sorted(ids1) == sorted(ids2) == list(range(n))
    assert ids1 != ids2  # shuffle after cache: a new order every epoch
    order1, order2 = np.argsort(ids1), np.argsort(ids2)
    assert not np.array_equal(im1[order1], im2[order2])  # augmentation after cache: new every epoch

    # The wrong order: augment, then cache; shuffle, then cache. Both get frozen after epoch 1.
    frozen = ds.map(data.to_float).shuffle(n, seed=1).map(data.augment).cache().batch(16)
    (f1, fim1), (f2, fim2) = _epoch_ids_and_images(frozen), _epoch_ids_and_images(frozen)
    assert f1 == f2 and np.array_equal(fim1, fim2)


def test_distribute_rejects_unknown_api():
    import tensorflow as tf

    with pytest.raises(ValueError, match="api must be one of"):
        data.distribute(tf.distribute.get_strategy(), tf.data.Dataset.range(4), 2, api="nope")
