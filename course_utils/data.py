"""Data for the lessons: CIFAR-10 from an explicitly chosen source, the tf.data pipeline, handing it to a
strategy (global vs per-replica batch), and TFRecord files with an auto-shard policy.

Lesson 04's measurements (every example exactly once, auto-shard tables, timings) are experiments:
:mod:`course_utils.experiments.pipeline`.

Sources (``load_cifar10(source=...)``; default ``COURSE_DATA``, smoke mode → ``synthetic``):

==============  ==================================================================================
``tfds``        real CIFAR-10 via tensorflow-datasets (on TPU VMs optionally read from the public GCS
                copy, ``try_gcs=True``). A failed download raises :class:`DataSourceError` naming the
                offline options — never a silent switch to fake data.
``synthetic``   generated offline, CIFAR-shaped, learnable (:func:`synthetic_cifar`).
``npz:PATH``    a local ``.npz`` with ``x_train, y_train, x_test, y_test`` (uint8 N×32×32×3 images,
                integer labels 0-9), e.g. written by :func:`write_npz` on a connected machine.
==============  ==================================================================================

Every source yields the same element spec: ``(uint8[32, 32, 3] image, int64[] label)``, unbatched.
Offline data is only ever used when chosen explicitly or in smoke mode, and it is announced
(COURSE_DESIGN §5).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import numpy as np

from . import config as _config

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def synthetic_cifar(
    n_train: int,
    n_test: int,
    num_classes: int = 10,
    image_size: int = 32,
    seed: int = 0,
    signal: float = 14.0,  # with noise=80: a small CNN reaches ~85-95% in 4 epochs on 1024 examples
    noise: float = 80.0,
):
    """CIFAR-shaped offline data with learnable class structure.

    Each class has a fixed, smooth colour pattern (a random 4×4×3 grid scaled up to the image size);
    an example is its class pattern plus strong per-pixel noise and a random brightness shift, as
    uint8 HWC images with int64 labels — the same layout as CIFAR-10. A small CNN gets well above
    chance (10%) in a few epochs, but not to 100% at once.

    Returns ``(x_train, y_train), (x_test, y_test)``.
    """
    if image_size % 4:
        raise ValueError(f"image_size must be a multiple of 4, got {image_size}")
    rng = np.random.default_rng(seed)
    block = image_size // 4
    templates = rng.normal(size=(num_classes, 4, 4, 3))
    templates = np.kron(templates, np.ones((1, block, block, 1)))

    def make(n: int):
        y = rng.integers(0, num_classes, size=n)
        shift = rng.normal(scale=20.0, size=(n, 1, 1, 1))
        x = 128.0 + signal * templates[y] + shift + rng.normal(scale=noise, size=(n, image_size, image_size, 3))
        return np.clip(x, 0, 255).astype(np.uint8), y.astype(np.int64)

    return make(n_train), make(n_test)


# ----------------------------------------------------------------------------------------------
# CIFAR-10 from an explicitly chosen source
# ----------------------------------------------------------------------------------------------

NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
OFFLINE_OPTIONS = (
    "Offline options: COURSE_DATA=synthetic (generated CIFAR-shaped data, no download); "
    "COURSE_DATA=npz:/path/cifar10.npz (a pre-downloaded copy, see course_utils.data.write_npz); or run "
    "tfds once on a connected machine and copy ~/tensorflow_datasets/cifar10 to this machine's "
    "~/tensorflow_datasets/ (or TFDS_DATA_DIR)."
)


class DataSourceError(RuntimeError):
    """The chosen data source cannot deliver CIFAR-10; the message says why and what to do instead."""


@dataclasses.dataclass
class CifarData:
    """CIFAR-10 (or a stand-in) as unbatched ``tf.data`` datasets of ``(uint8 image, int64 label)``."""

    train: Any  # tf.data.Dataset
    test: Any  # tf.data.Dataset
    source: str  # "tfds" | "synthetic" | "npz:PATH"
    reason: str  # why this source was used
    num_train: int
    num_test: int
    num_classes: int = 10

    @property
    def element_spec(self):
        return self.train.element_spec

    def announce(self) -> str:
        kind = {"tfds": "real CIFAR-10 (tensorflow-datasets)", "synthetic": "SYNTHETIC CIFAR-shaped data, generated offline"}
        what = kind.get(self.source, f"CIFAR-10 from a local file ({self.source[4:]})")
        return f"Data: {what} — {self.num_train} train / {self.num_test} test images; source {self.source!r}: {self.reason}"


def image_label_spec(image_size: int = 32):
    """The element spec every source yields."""
    import tensorflow as tf

    return (tf.TensorSpec((image_size, image_size, 3), tf.uint8), tf.TensorSpec((), tf.int64))


def _from_arrays(x, y):
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((np.asarray(x, np.uint8), np.asarray(y, np.int64)))


def _check_arrays(path: str, name_x: str, x, name_y: str, y, image_size: int, num_classes: int) -> None:
    fmt = f"expected uint8 images of shape (N, {image_size}, {image_size}, 3) (HWC) and integer labels of shape (N,)"
    if x.dtype != np.uint8:
        raise DataSourceError(
            f"{path}: {name_x} has dtype {x.dtype}, {fmt}. Convert with np.clip(x, 0, 255).astype(np.uint8) "
            "(if your images are floats in [0, 1], multiply by 255 first)."
        )
    if x.ndim != 4 or tuple(x.shape[1:]) != (image_size, image_size, 3):
        hint = " It looks channels-first (NCHW): use x.transpose(0, 2, 3, 1)." if x.ndim == 4 and x.shape[1] == 3 else ""
        raise DataSourceError(f"{path}: {name_x} has shape {x.shape}, {fmt}.{hint}")
    if not np.issubdtype(y.dtype, np.integer):
        raise DataSourceError(f"{path}: {name_y} has dtype {y.dtype}, {fmt}; labels are class numbers 0-{num_classes - 1}.")
    if y.shape != (len(x),):
        raise DataSourceError(
            f"{path}: {name_y} has shape {y.shape} but {name_x} has {len(x)} images; {fmt}"
            + (" (one-hot labels? use y.argmax(1))" if y.ndim == 2 else "") + "."
        )
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise DataSourceError(f"{path}: {name_y} has labels from {y.min()} to {y.max()}; expected 0-{num_classes - 1}.")


def read_npz(path: str, image_size: int = 32, num_classes: int = 10):
    """Read and validate a CIFAR-10 ``.npz``; returns ``(x_train, y_train), (x_test, y_test)``."""
    if not os.path.isfile(path):
        raise DataSourceError(f"npz:{path} — no such file. Fix the path in COURSE_DATA, or: {OFFLINE_OPTIONS}")
    with np.load(path, allow_pickle=False) as f:
        missing = [k for k in NPZ_KEYS if k not in f.files]
        if missing:
            raise DataSourceError(
                f"{path} lacks the key(s) {', '.join(missing)} (it has: {', '.join(f.files) or 'none'}); "
                f"a course npz needs exactly {', '.join(NPZ_KEYS)} — write one with course_utils.data.write_npz."
            )
        arrays = {k: f[k] for k in NPZ_KEYS}
    for split in ("train", "test"):
        _check_arrays(path, f"x_{split}", arrays[f"x_{split}"], f"y_{split}", arrays[f"y_{split}"], image_size, num_classes)
    return (arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"])


def write_npz(path: str, train, test) -> str:
    """Save ``(x_train, y_train), (x_test, y_test)`` in the course's npz format (for offline classrooms).

    On a connected machine: ``d = load_cifar10("tfds", n_train=-1, n_test=-1)``, then
    ``write_npz("cifar10.npz", to_numpy(d.train), to_numpy(d.test))``; hand out the file and set
    ``COURSE_DATA=npz:cifar10.npz``.
    """
    (x_train, y_train), (x_test, y_test) = train, test
    np.savez_compressed(
        path,
        x_train=np.asarray(x_train, np.uint8),
        y_train=np.asarray(y_train, np.int64),
        x_test=np.asarray(x_test, np.uint8),
        y_test=np.asarray(y_test, np.int64),
    )
    return path


def to_numpy(ds):
    """An unbatched ``(image, label)`` dataset as numpy arrays ``(x, y)`` (reads all of it)."""
    pairs = list(ds.as_numpy_iterator())
    if not pairs:
        return np.zeros((0, 32, 32, 3), np.uint8), np.zeros(0, np.int64)
    xs, ys = zip(*pairs)
    return np.stack(xs).astype(np.uint8), np.asarray(ys, np.int64)


def _tfds_load(**kwargs):
    """Indirection so tests can make the download fail without touching the network."""
    import tensorflow_datasets as tfds

    return tfds.load(**kwargs)


def _load_tfds(n_train: int | None, n_test: int | None, data_dir: str | None, try_gcs: bool):
    def split(name, n):
        return name if n is None else f"{name}[:{n}]"

    try:
        import tensorflow_datasets  # noqa: F401
    except ImportError as exc:
        raise DataSourceError(
            f"tensorflow-datasets is not installed ({exc}): pip install 'tensorflow-datasets>=4.9'. " + OFFLINE_OPTIONS
        ) from exc
    try:
        train, test = _tfds_load(
            name="cifar10",
            split=[split("train", n_train), split("test", n_test)],
            as_supervised=True,
            data_dir=data_dir,
            try_gcs=try_gcs,
        )
    except Exception as exc:  # noqa: BLE001 - any failure: explain, never switch silently
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        where = data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"
        fix = f" (a dependency of the tfds download is missing: pip install {exc.name})" if isinstance(
            exc, ModuleNotFoundError) and exc.name else ""
        raise DataSourceError(
            f"Could not load real CIFAR-10 with tensorflow-datasets (data dir {where}): "
            f"{type(exc).__name__}: {first}{fix}. The course does not switch to fake data by itself. {OFFLINE_OPTIONS}"
        ) from exc
    return train, test


def load_cifar10(
    source: str | None = None,
    *,
    n_train: int | None = None,
    n_test: int | None = None,
    data_dir: str | None = None,
    try_gcs: bool | None = None,
    seed: int | None = None,
    verbose: bool = True,
) -> CifarData:
    """CIFAR-10 from an explicit source, announced. Returns :class:`CifarData` (unbatched datasets).

    source:   ``"tfds"`` | ``"synthetic"`` | ``"npz:PATH"``; default ``config.get().data``
              (``COURSE_DATA``; smoke mode → ``synthetic``), with the reason recorded and printed.
    n_train, n_test: take the first n examples (default: the config's ``train_examples``/``test_examples``);
              ``-1`` = the whole split.
    try_gcs:  tfds only — read the prepared dataset from the public GCS bucket (default: on TPU VMs).
    Raises :class:`DataSourceError` when the source cannot deliver (no silent fallback).
    """
    cfg = _config.get()
    if source is None:
        source, reason = cfg.data, cfg.data_reason
    else:
        source, reason = _config._parse_data(source), "chosen by argument"
    sizes = cfg.sizes
    n_train = sizes.train_examples if n_train is None else n_train
    n_test = sizes.test_examples if n_test is None else n_test
    n_train = None if n_train < 0 else int(n_train)
    n_test = None if n_test < 0 else int(n_test)
    seed = cfg.seed if seed is None else seed

    if source == "synthetic":
        (xtr, ytr), (xte, yte) = synthetic_cifar(
            50_000 if n_train is None else n_train, 10_000 if n_test is None else n_test, image_size=32, seed=seed
        )
        train, test = _from_arrays(xtr, ytr), _from_arrays(xte, yte)
    elif source.startswith("npz:"):
        (xtr, ytr), (xte, yte) = read_npz(source[4:])
        xtr, ytr, xte, yte = xtr[:n_train], ytr[:n_train], xte[:n_test], yte[:n_test]
        train, test = _from_arrays(xtr, ytr), _from_arrays(xte, yte)
    else:
        if try_gcs is None:
            from .runtime import tpu_hints

            try_gcs = bool(tpu_hints())
        train, test = _load_tfds(n_train, n_test, data_dir, try_gcs)
        if try_gcs:
            reason += "; read from the public GCS copy of tfds (try_gcs=True)"
        train, test = train.map(_int64_label), test.map(_int64_label)
    result = CifarData(train, test, source, reason, _count(train), _count(test))
    if verbose:
        print(result.announce())
    return result


def _count(ds) -> int:
    """Examples in ``ds``: its cardinality when known, else counted once."""
    n = int(ds.cardinality())
    return n if n >= 0 else int(ds.reduce(0, lambda count, _: count + 1))


def _int64_label(x, y):
    import tensorflow as tf

    return x, tf.cast(y, tf.int64)


# ----------------------------------------------------------------------------------------------
# The pipeline
# ----------------------------------------------------------------------------------------------


def encode_png(ds):
    """``(image, label)`` → ``(PNG bytes, label)``: how images sit on disk (tfds, TFRecords). Decoding is then
    real per-example work for the pipeline, as it is with files."""
    import tensorflow as tf

    return ds.map(lambda x, y: (tf.io.encode_png(x), y))


def decode_png(png, label):
    """The decode step for :func:`encode_png`'d data."""
    import tensorflow as tf

    image = tf.io.decode_png(png, channels=3)
    image.set_shape((None, None, 3))
    return image, label


def to_float(image, label):
    """Normalize step: uint8 → float32 (0-255; the course models rescale to [0, 1] in their first layer)."""
    import tensorflow as tf

    return tf.cast(image, tf.float32), label


def augment(image, label, pad: int = 4):
    """Random augmentation: horizontal flip and a random crop after padding (different every epoch)."""
    import tensorflow as tf

    size = image.shape[0] or tf.shape(image)[0]
    image = tf.image.random_flip_left_right(image)
    image = tf.image.resize_with_crop_or_pad(image, size + 2 * pad, size + 2 * pad)
    image = tf.image.random_crop(image, tf.stack([size, size, 3]))
    return image, label


def build_pipeline(
    ds,
    batch_size: int,
    *,
    training: bool = True,
    decode: Callable | None = None,
    augment_fn: Callable | None = augment,
    cache: bool = True,
    shuffle_buffer: int | None = 10_000,
    seed: int | None = None,
    drop_remainder: bool = True,
    parallel: bool = True,
    prefetch: bool = True,
):
    """The tuned input pipeline, in the order that matters::

        decode (map, AUTOTUNE) → cache → shuffle → normalize + augment (map, AUTOTUNE) → batch → prefetch

    * ``cache`` after the expensive deterministic work (decode), while images are still uint8 (4× smaller
      than float32), and **before** random augmentation — cached augmentations would repeat the same
      "random" images every epoch;
    * ``shuffle`` **after** ``cache`` — a shuffle before it is recorded once and replayed every epoch;
    * ``batch(drop_remainder=True)`` — static batch shapes (TPUs compile for one shape);
    * ``prefetch(AUTOTUNE)`` last — prepares the next batches while the accelerator trains.

    ``training=False`` skips shuffle and augmentation. ``parallel=False``, ``cache=False``,
    ``prefetch=False`` give the naive pipeline for comparison.
    """
    import tensorflow as tf

    calls = tf.data.AUTOTUNE if parallel else None
    if decode is not None:
        ds = ds.map(decode, num_parallel_calls=calls)
    if cache:
        ds = ds.cache()
    if training and shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if training and augment_fn is not None:
        ds = ds.map(lambda x, y: augment_fn(*to_float(x, y)), num_parallel_calls=calls)
    else:
        ds = ds.map(to_float, num_parallel_calls=calls)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    if prefetch:
        ds = ds.prefetch(tf.data.AUTOTUNE)
    return ds


# ----------------------------------------------------------------------------------------------
# Distribution: global vs per-replica batch, and proofs that every example arrives exactly once
# ----------------------------------------------------------------------------------------------

APIS = ("experimental_distribute_dataset", "distribute_datasets_from_function")


def distribute(strategy, ds, global_batch_size: int, api: str = APIS[0], *, drop_remainder: bool = True):
    """Batch the *unbatched* ``ds`` and hand it to ``strategy`` with one of the two APIs.

    * ``experimental_distribute_dataset``: you batch with the **global** batch; the strategy splits
      every batch across replicas (and, on several workers, auto-shards the input).
    * ``distribute_datasets_from_function``: your function receives an ``InputContext`` and batches
      with the **per-replica** batch ``ctx.get_per_replica_batch_size(global_batch_size)``; you shard
      per input pipeline yourself (``ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)``).

    With ``drop_remainder=False`` the ragged last step differs: the first API splits the last global
    batch evenly; the second cuts per-replica batches and deals them to the replicas in turn, so the
    remainder fills whole per-replica batches first, then one partial one, then empty ones (680 ids,
    4 replicas × 32: ``[32, 8, 0, 0]``). Shuffle ``ds`` with a ``seed`` (or shuffle after sharding):
    an unseeded shuffle before ``shard`` gives every worker its own order, so shares overlap.
    """
    import tensorflow as tf

    if api == APIS[0]:
        batched = ds.batch(global_batch_size, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE)
        return strategy.experimental_distribute_dataset(batched)
    if api == APIS[1]:

        def dataset_fn(ctx: tf.distribute.InputContext):
            local = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id) if ctx.num_input_pipelines > 1 else ds
            per_replica = ctx.get_per_replica_batch_size(global_batch_size)
            return local.batch(per_replica, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE)

        return strategy.distribute_datasets_from_function(dataset_fn)
    raise ValueError(f"api must be one of {APIS}, got {api!r}")


# ----------------------------------------------------------------------------------------------
# Sharding across workers: TFRecord files and auto-shard policies
# ----------------------------------------------------------------------------------------------


def write_tfrecords(directory: str, ds, num_files: int) -> list[str]:
    """Write ``(image, label)`` examples (plus an ``id``) into ``num_files`` TFRecord files of consecutive
    examples (file 0: the first ``n / num_files`` ids, and so on).

    Each record is a ``tf.train.Example`` with ``image`` (PNG bytes), ``label`` and ``id`` (int64).
    """
    import tensorflow as tf

    os.makedirs(directory, exist_ok=True)
    paths = [os.path.join(directory, f"cifar-{i:05d}-of-{num_files:05d}.tfrecord") for i in range(num_files)]
    examples = list(ds.as_numpy_iterator())
    writers = [tf.io.TFRecordWriter(p) for p in paths]
    try:
        for i, (x, y) in enumerate(examples):
            feature = {
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[tf.io.encode_png(x).numpy()])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y)])),
                "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
            }
            writers[i * num_files // len(examples)].write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    finally:
        for w in writers:
            w.close()
    return paths


def parse_record(record):
    """A TFRecord written by :func:`write_tfrecords` → ``{"image": uint8 HWC, "label", "id"}``."""
    import tensorflow as tf

    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "id": tf.io.FixedLenFeature([], tf.int64),
    }
    ex = tf.io.parse_single_example(record, spec)
    return {"image": tf.io.decode_png(ex["image"], channels=3), "label": ex["label"], "id": ex["id"]}


def tfrecord_dataset(paths: list[str], policy: str = "AUTO", cycle_length: int = 1):
    """Read the files with an auto-shard policy (``"AUTO"``, ``"FILE"``, ``"DATA"``, ``"OFF"``).

    The pipeline starts from the list of file names, so FILE sharding can split it. ``cycle_length=1`` reads
    the files one after another (a deterministic order that makes each worker's share easy to read);
    for speed, real pipelines interleave several files (``cycle_length=4`` or more).
    """
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices(paths)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=cycle_length, num_parallel_calls=tf.data.AUTOTUNE,
                       deterministic=True)
    ds = ds.map(parse_record, num_parallel_calls=tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = getattr(tf.data.experimental.AutoShardPolicy, policy)
    return ds.with_options(options)
