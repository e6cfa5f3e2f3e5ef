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


def test_every_source_yields_the_same_element_spec(tmp_path, capsys, monkeypatch):
    import tensorflow_datasets as tfds

    monkeypatch.setattr(data, "_probe_hosts", lambda *a, **k: (True, "mocked"))  # mock_data never downloads

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

    monkeypatch.setattr(data, "_probe_hosts", lambda *a, **k: (True, "storage.googleapis.com"))  # host answers,
    monkeypatch.setattr(data, "_tfds_load", offline)  # but the download itself fails
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


def _member_bytes(array) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _good_arrays(n_train=4, n_test=2):
    return dict(
        x_train=np.zeros((n_train, 32, 32, 3), np.uint8),
        y_train=np.zeros(n_train, np.int64),
        x_test=np.zeros((n_test, 32, 32, 3), np.uint8),
        y_test=np.zeros(n_test, np.int64),
    )


def _defective_npz_files(tmp_path):
    """{defect: (path, words the message must contain)} — each a file a learner could really end up with."""
    import pickle
    import zipfile

    good = _good_arrays()
    cases = {}

    def put(name, content: bytes):
        (tmp_path / name).write_bytes(content)
        return str(tmp_path / name)

    rng = np.random.default_rng(0)
    cases["random bytes"] = (put("random.npz", rng.bytes(2048)), ["not a readable .npz", "not a zip file"])
    cases["empty file"] = (put("zero.npz", b""), ["is empty (0 bytes)"])
    cases["a pickle"] = (put("pickled.npz", pickle.dumps(good)), ["not a readable .npz"])
    np.savez(tmp_path / "full.npz", **good)
    full = (tmp_path / "full.npz").read_bytes()
    cases["truncated zip"] = (put("truncated.npz", full[: len(full) // 2]), ["corrupt or truncated", "again"])
    np.savez_compressed(tmp_path / "fullc.npz", **good)
    fullc = (tmp_path / "fullc.npz").read_bytes()
    cases["truncated compressed zip"] = (put("truncc.npz", fullc[:-30]), ["corrupt or truncated"])
    broken = bytearray(full)
    broken[200] ^= 0xFF  # a byte inside x_train's data: CRC mismatch
    cases["CRC broken"] = (put("crc.npz", bytes(broken)), ["corrupt or truncated in member x_train", "CRC"])
    broken = bytearray(fullc)
    broken[100] ^= 0xFF  # inside the deflated stream
    cases["deflate broken"] = (put("crcc.npz", bytes(broken)), ["corrupt or truncated in member x_train"])
    np.save(tmp_path / "single.npy", good["x_train"])
    cases[".npy"] = (str(tmp_path / "single.npy"), ["single .npy array", "not an .npz archive"])
    np.savez(tmp_path / "objects.npz", **dict(good, y_train=np.array([{"a": 1}] * 4, dtype=object)))
    cases["object array"] = (str(tmp_path / "objects.npz"), ["member y_train is an object array", "pickled", "unsafe"])
    for name, member in (("raw.npz", "y_test"), ("badnpy.npz", "y_test.npy")):
        with zipfile.ZipFile(tmp_path / name, "w") as z:
            for k, v in good.items():
                z.writestr(k + ".npy", _member_bytes(v)) if k != "y_test" else z.writestr(member, b"hello")
        cases[f"non-array member {member}"] = (str(tmp_path / name), ["member y_test is not a numpy array"])
    np.savez(tmp_path / "empty_train.npz", **dict(good, x_train=good["x_train"][:0], y_train=good["y_train"][:0]))
    cases["0 train examples"] = (str(tmp_path / "empty_train.npz"), ["x_train has 0 images", "train split is empty"])
    np.savez(tmp_path / "empty_test.npz", **dict(good, x_test=good["x_test"][:0], y_test=good["y_test"][:0]))
    cases["0 test examples"] = (str(tmp_path / "empty_test.npz"), ["x_test has 0 images", "test split is empty"])
    np.savez(tmp_path / "negative.npz", **dict(good, y_train=np.full(4, -1)))
    cases["negative label"] = (str(tmp_path / "negative.npz"), ["labels from -1 to -1", "0-9"])
    np.savez(tmp_path / "bool.npz", **dict(good, y_train=np.zeros(4, bool)))
    cases["bool labels"] = (str(tmp_path / "bool.npz"), ["y_train has dtype bool"])
    np.savez(tmp_path / "scalar.npz", **dict(good, x_train=np.uint8(3)))
    cases["0-d images"] = (str(tmp_path / "scalar.npz"), ["x_train has shape ()"])
    np.savez(tmp_path / "mismatch.npz", **dict(good, y_train=np.zeros(3, np.int64)))
    cases["label count"] = (str(tmp_path / "mismatch.npz"), ["y_train has shape (3,) but x_train has 4 images"])
    (tmp_path / "folder.npz").mkdir()
    cases["a folder"] = (str(tmp_path / "folder.npz"), ["is a folder, not a file"])
    # issue 21: shapes declared in a member's header are checked before numpy allocates them
    huge = bytearray(_member_bytes(good["x_train"]))
    declared = b"(4, 32, 32, 3)"
    at = huge.index(declared)
    huge[at : at + len(declared) + 10] = b"(9999999, 32, 32, 3), }   "[: len(declared) + 10]  # same header length
    with zipfile.ZipFile(tmp_path / "huge.npz", "w") as z:
        for k, v in good.items():
            z.writestr(k + ".npy", bytes(huge) if k == "x_train" else _member_bytes(v))
    cases["huge declared shape"] = (
        str(tmp_path / "huge.npz"),
        ["x_train declares shape (9999999, 32, 32, 3)", "200,000"],
    )
    short = bytearray(_member_bytes(good["x_test"]))
    at = short.index(b"(2, 32, 32, 3)")
    short[at : at + 14] = b"(3, 32, 32, 3)"  # declares one image more than it holds
    with zipfile.ZipFile(tmp_path / "short.npz", "w") as z:
        for k, v in good.items():
            z.writestr(k + ".npy", bytes(short) if k == "x_test" else _member_bytes(v))
    cases["declared more than held"] = (
        str(tmp_path / "short.npz"),
        ["x_test declares shape (3, 32, 32, 3)", "holds 6,144"],
    )
    return cases


def _zip_bomb(path) -> str:
    """A valid npz whose x_train is one image more than the course loads: 614 MB of zeros in 0.6 MB, streamed."""
    import zipfile

    n = data.MAX_NPZ_IMAGES + 1
    header = np.lib.format.header_data_from_array_1_0(np.zeros((0, 32, 32, 3), np.uint8))
    header["shape"] = (n, 32, 32, 3)
    good = _good_arrays()
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open("x_train.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_1_0(member, header)
            zeros = bytes(32 * 32 * 3 * 1000)
            for _ in range(0, n, 1000):
                member.write(zeros[: 32 * 32 * 3 * min(1000, n - _)])
        for k in ("y_train", "x_test", "y_test"):
            z.writestr(k + ".npy", _member_bytes(np.zeros(n, np.int64) if k == "y_train" else good[k]))
    return str(path)


def test_each_npz_defect_is_one_clear_data_source_error(tmp_path):
    for defect, (path, words) in _defective_npz_files(tmp_path).items():
        with pytest.raises(data.DataSourceError) as info:
            data.read_npz(path)
        message = str(info.value)
        assert info.value.__cause__ is None and (info.value.__suppress_context__ or info.value.__context__ is None), (
            defect
        )
        for w in words:
            assert w in message, (defect, w, message)
        assert "\n" not in message, (defect, message)  # one line
        assert "allow_pickle" not in message, (defect, message)  # never numpy's advice to load pickles
        assert "write_npz" in message and "COURSE_DATA=synthetic" in message, (defect, message)  # how to get a good one
    np.savez(tmp_path / "ok.npz", **_good_arrays())
    (xtr, ytr), (xte, yte) = data.read_npz(str(tmp_path / "ok.npz"))
    assert xtr.shape == (4, 32, 32, 3) and xte.shape == (2, 32, 32, 3) and len(ytr) == 4 and len(yte) == 2


def test_a_zip_bomb_is_refused_from_its_header_without_decompressing(tmp_path):
    import resource

    path = _zip_bomb(tmp_path / "bomb.npz")
    assert (tmp_path / "bomb.npz").stat().st_size < 5 * 2**20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    with pytest.raises(data.DataSourceError, match=r"x_train declares shape \(200001, 32, 32, 3\).*200,000"):
        data.read_npz(path)
    assert time.monotonic() - t0 < 2
    grew_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grew_mib < 100, grew_mib  # it would be 614 MB decompressed


def test_a_named_pipe_is_refused_at_once_not_waited_on(tmp_path):
    import os
    import subprocess
    import sys

    fifo = tmp_path / "cifar10.npz"
    os.mkfifo(fifo)
    with pytest.raises(data.DataSourceError, match="is a named pipe"):
        data.read_npz(str(fifo))
    # where a learner meets it: the trainer's command line, a fresh process
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "course_utils.capstone",
            "--data",
            f"npz:{fifo}",
            "--epochs",
            "1",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "is a named pipe (FIFO), not a regular file" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_defective_npz_fails_in_load_cifar10_too(tmp_path):
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 but then nothing a zip needs")
    with pytest.raises(data.DataSourceError, match="not a readable .npz archive: corrupt or truncated"):
        data.load_cifar10(f"npz:{tmp_path / 'bad.npz'}", verbose=False)


def test_an_unreadable_npz_says_permission_denied(tmp_path):
    import os

    path = tmp_path / "locked.npz"
    np.savez(path, **_good_arrays())
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):
            pytest.skip("this user can read a chmod-000 file (root): permissions cannot be tested here")
        with pytest.raises(data.DataSourceError, match="cannot be read \\(permission denied\\)"):
            data.read_npz(str(path))
    finally:
        path.chmod(0o644)


def test_an_unreadable_npz_says_permission_denied_even_as_root(tmp_path, monkeypatch):
    """The same path for root, where chmod has no effect: opening the file is made to fail."""
    import builtins

    path = tmp_path / "locked.npz"
    np.savez(path, **_good_arrays())
    real_open = builtins.open

    def denied(file, *args, **kwargs):
        if str(file) == str(path):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", denied)
    with pytest.raises(data.DataSourceError, match="cannot be read \\(permission denied\\)"):
        data.read_npz(str(path))


def test_npz_paths_expand_the_home_folder(tmp_path, monkeypatch, env):
    monkeypatch.setenv("HOME", str(tmp_path))
    path = data.write_npz("~/mine.npz", *data.synthetic_cifar(6, 3))
    assert path == str(tmp_path / "mine.npz") and (tmp_path / "mine.npz").is_file()
    assert config.load({"COURSE_DATA": "npz:~/mine.npz"}).data == f"npz:{tmp_path}/mine.npz"
    d = env(COURSE_DATA="npz: ~/mine.npz")
    assert d.data == f"npz:{tmp_path}/mine.npz"
    loaded = data.load_cifar10(n_train=-1, n_test=-1, verbose=False)
    assert (loaded.num_train, loaded.num_test) == (6, 3)
    assert data.load_cifar10("npz:~/mine.npz", verbose=False).source == f"npz:{tmp_path}/mine.npz"
    (xtr, _), _ = data.read_npz("~/mine.npz")
    assert len(xtr) == 6


def test_write_npz_refuses_float_images_in_0_1_instead_of_writing_black_ones(tmp_path):
    (xtr, ytr), (xte, yte) = data.synthetic_cifar(8, 4)
    scaled = xtr.astype(np.float32) / 255.0  # what a normalised pipeline hands back
    with pytest.raises(data.DataSourceError) as info:
        data.write_npz(str(tmp_path / "f.npz"), (scaled, ytr), (xte, yte))
    message = str(info.value)
    assert "x_train is float32 with values in [0" in message and "np.round(x * 255).astype(np.uint8)" in message
    assert not (tmp_path / "f.npz").exists()  # nothing half-written
    # The conversion the message names gives back the original images exactly.
    path = data.write_npz(str(tmp_path / "f.npz"), (np.round(scaled * 255).astype(np.uint8), ytr), (xte, yte))
    (x_back, _), _ = data.read_npz(path)
    np.testing.assert_array_equal(x_back, xtr)


def test_write_npz_converts_whole_number_images_exactly_and_refuses_the_rest(tmp_path):
    (xtr, ytr), (xte, yte) = data.synthetic_cifar(8, 4)
    for exact in (xtr.astype(np.float32), xtr.astype(np.int64)):  # e.g. tf.cast(uint8 → float32)
        path = data.write_npz(str(tmp_path / "w"), (exact, ytr.astype(np.float64)), (xte, yte))
        assert path.endswith("w.npz")  # numpy's own ".npz" suffix, and the path returned is the real one
        (x_back, y_back), _ = data.read_npz(path)
        np.testing.assert_array_equal(x_back, xtr)
        assert y_back.dtype == np.int64 and np.array_equal(y_back, ytr)
    bad = {
        "fractions": (xtr.astype(np.float32) + 0.5, "whole numbers 0-255"),
        "out of range": (xtr.astype(np.int64) + 300, "values in [300"),
        "nan": (np.full(xtr.shape, np.nan, np.float32), "NaN"),
        "strings": (np.full(xtr.shape, "a"), "dtype <U1"),
    }
    for what, (x, words) in bad.items():
        with pytest.raises(data.DataSourceError, match=None) as info:
            data.write_npz(str(tmp_path / "bad.npz"), (x, ytr), (xte, yte))
        assert words in str(info.value), (what, str(info.value))
    for labels, words in ((ytr + 0.5, "y_train has dtype float64"), (np.eye(10)[ytr], "one-hot"), (ytr + 10, "0-9")):
        with pytest.raises(data.DataSourceError) as info:
            data.write_npz(str(tmp_path / "bad.npz"), (xtr, labels), (xte, yte))
        assert words in str(info.value), (words, str(info.value))
    with pytest.raises(data.DataSourceError, match="0 images"):
        data.write_npz(str(tmp_path / "bad.npz"), (xtr[:0], ytr[:0]), (xte, yte))
    with pytest.raises(data.DataSourceError, match="must each be a pair"):
        data.write_npz(str(tmp_path / "bad.npz"), xtr, (xte, yte))
    assert not (tmp_path / "bad.npz").exists()


# ------------------------------------------------------------------------------------ tfds: offline, broken


def test_offline_full_mode_fails_fast_with_what_to_set(tmp_path, monkeypatch):
    """No internet and no local copy: one DataSourceError in seconds, not minutes of retries."""
    import tensorflow_datasets  # noqa: F401 - imported before the clock starts

    monkeypatch.setattr(data, "TFDS_HOSTS", (("nonexistent.invalid", 443), ("also-nonexistent.invalid", 443)))
    monkeypatch.delenv("HTTPS_PROXY", raising=False)
    monkeypatch.delenv("https_proxy", raising=False)
    calls = []
    monkeypatch.setattr(data, "_tfds_load", lambda **kw: calls.append(kw))  # must not be reached
    start = time.perf_counter()
    with pytest.raises(data.DataSourceError) as info:
        data.load_cifar10("tfds", n_train=8, n_test=8, data_dir=str(tmp_path), try_gcs=False, verbose=False)
    elapsed = time.perf_counter() - start
    assert elapsed <= 15, elapsed
    assert not calls
    message = str(info.value)
    assert info.value.__cause__ is None and "\n" not in message
    assert (
        message.startswith("No internet connection") and "nonexistent.invalid: cannot look up the host name" in message
    )
    for words in (
        "COURSE_DATA=npz:",
        "COURSE_SMOKE=1",
        "BEFORE the setup cell",
        "restart the kernel",
        "write_npz",
        "~/tensorflow_datasets/cifar10",
        f"{tmp_path}/cifar10",
    ):
        assert words in message, words


def test_the_probe_gives_up_on_a_host_that_never_answers(monkeypatch):
    """Name lookup that hangs (no DNS server answering) still ends within the probe's timeout."""
    import socket

    def hangs(*args, **kwargs):
        time.sleep(3)  # far past the probe's 0.5 s; then fails as a lookup that finally gives up
        raise socket.gaierror(-3, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "create_connection", hangs)
    start = time.perf_counter()
    ok, why = data._probe_hosts((("slow.example", 443),), timeout=0.5)
    assert not ok and "slow.example: no answer within 0.5 s" in why
    assert time.perf_counter() - start < 3


def test_a_local_copy_is_used_without_probing_the_network(tmp_path, monkeypatch):
    """CIFAR-10 already in the tfds data dir: no probe, no GCS (the download never starts)."""
    version_dir = tmp_path / "cifar10" / "3.0.2"
    version_dir.mkdir(parents=True)
    (version_dir / "dataset_info.json").write_text('{"name": "cifar10", "version": "3.0.2"}')
    (version_dir / "features.json").write_text("{}")

    def must_not_probe(*args, **kwargs):
        raise AssertionError("probed the network although the data is here")

    seen = {}

    def fake_load(**kwargs):
        import tensorflow as tf

        seen.update(kwargs)
        x, y = np.zeros((4, 32, 32, 3), np.uint8), np.zeros(4, np.int64)
        return tf.data.Dataset.from_tensor_slices((x, y)), tf.data.Dataset.from_tensor_slices((x, y))

    monkeypatch.setattr(data, "_probe_hosts", must_not_probe)
    monkeypatch.setattr(data, "_tfds_load", fake_load)
    d = data.load_cifar10("tfds", n_train=4, n_test=4, data_dir=str(tmp_path), try_gcs=True, verbose=False)
    assert d.num_train == 4 and seen["data_dir"] == str(tmp_path)
    assert seen["try_gcs"] is False and "GCS" not in d.reason  # the local copy, not the bucket
    # A copy tfds cannot parse still counts as "here": tfds.load then says what is wrong with it, not "offline".
    (version_dir / "dataset_info.json").write_text("{}")
    import tensorflow_datasets as tfds

    assert data._tfds_prepared(tfds, str(tmp_path)) and not data._tfds_prepared(tfds, str(tmp_path / "empty"))


def _broken_tfds_package(root):
    """A `tensorflow_datasets` whose import fails as on Colab when protobuf is older than the generated code."""
    package = root / "tensorflow_datasets"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from google.protobuf.runtime_version import VersionError\n"
        "raise VersionError('Detected incompatible Protobuf Gencode/Runtime versions when loading "
        "tensorflow_metadata/proto/v0/schema.proto: gencode 6.31.1 runtime 5.29.5. Runtime version cannot be older "
        "than the linked gencode version. See Protobuf version guarantees at "
        "https://protobuf.dev/support/cross-version-runtime-guarantee.')\n"
    )
    return root


def _swallowing_tfds_package(root):
    """As tensorflow-datasets 4.9.10 really behaves on Colab: its __init__ catches the VersionError, logs the
    traceback through absl and leaves a module without `load` (so a plain import "succeeds")."""
    package = root / "tensorflow_datasets"
    package.mkdir()
    (package / "__init__.py").write_text(
        "try:\n"
        "    from tensorflow_datasets.public_api import *  # noqa\n"
        "except Exception:\n"
        "    from absl import logging\n"
        "    logging.exception('tfds failed to import')\n"
    )
    (package / "public_api.py").write_text(
        "from google.protobuf.runtime_version import VersionError\n"
        "raise VersionError('Detected incompatible Protobuf Gencode/Runtime versions when loading "
        "tensorflow_metadata/proto/v0/anomalies.proto: gencode 6.31.1 runtime 5.29.6.')\n"
    )
    return root


@pytest.mark.parametrize("make_package", [_broken_tfds_package, _swallowing_tfds_package], ids=["raises", "swallows"])
def test_a_tfds_that_fails_to_import_is_one_line_with_the_fix(tmp_path, monkeypatch, capfd, make_package):
    import sys

    for name in [m for m in sys.modules if m == "tensorflow_datasets" or m.startswith("tensorflow_datasets.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(make_package(tmp_path)))
    with pytest.raises(data.DataSourceError) as info:
        data.load_cifar10("tfds", n_train=4, n_test=4, try_gcs=False, verbose=False)
    message = str(info.value)
    assert "\n" not in message and info.value.__cause__ is None
    assert (
        "tensorflow-datasets is installed but fails to import (VersionError: Detected incompatible Protobuf" in message
    )
    for words in ("pip install -U protobuf", "restart", "COURSE_DATA=npz:", "COURSE_SMOKE=1"):
        assert words in message, words
    assert "Traceback" not in capfd.readouterr().err  # tfds' own logged traceback is kept quiet


def test_a_missing_tfds_names_the_install_and_the_offline_options(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import raises ModuleNotFoundError
    with pytest.raises(data.DataSourceError) as info:
        data.load_cifar10("tfds", n_train=4, n_test=4, try_gcs=False, verbose=False)
    message = str(info.value)
    assert "tensorflow-datasets is not installed: pip install" in message and "COURSE_DATA=npz:" in message


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
