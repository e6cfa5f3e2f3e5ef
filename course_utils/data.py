"""Data for the lessons: CIFAR-10 from an explicitly chosen source, the tf.data pipeline, handing it to a
strategy (global vs per-replica batch), and TFRecord files with an auto-shard policy.

Lesson 04's measurements (every example exactly once, auto-shard tables, timings) are experiments:
:mod:`course_utils.lessons.data_pipeline_sharding.experiments`.

Sources (``load_cifar10(source=...)``; default ``COURSE_DATA``, smoke mode → ``synthetic``):

==============  ==================================================================================
``tfds``        real CIFAR-10 via tensorflow-datasets (on TPU VMs optionally read from the public GCS
                copy, ``try_gcs=True``). A failed download raises :class:`DataSourceError` naming the
                offline options — never a silent switch to fake data. Not downloaded yet and no
                internet: fails within seconds (a probe of the hosts, :data:`PROBE_TIMEOUT_S`).
``synthetic``   generated offline, CIFAR-shaped, learnable (:func:`synthetic_cifar`).
``npz:PATH``    a local ``.npz`` with ``x_train, y_train, x_test, y_test`` (uint8 N×32×32×3 images,
                integer labels 0-9, N ≥ 1), e.g. written by :func:`write_npz` on a connected machine;
                ``~`` is expanded; any defect is one :class:`DataSourceError` (:func:`read_npz`).
==============  ==================================================================================

Every source yields the same element spec: ``(uint8[32, 32, 3] image, int64[] label)``, unbatched.
Offline data is only ever used when chosen explicitly or in smoke mode, and it is announced
(CONTRIBUTING.md §5).
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
    # mirror-symmetric, like real classes (a flipped cat is a cat): flip augmentation keeps the label;
    # the mean of a pair of N(0,1) has variance 1/2, so scale by sqrt(2) to keep the contrast
    templates = (templates + templates[:, :, ::-1, :]) / np.sqrt(2.0)
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
        kind = {
            "tfds": "real CIFAR-10 (tensorflow-datasets)",
            "synthetic": "SYNTHETIC CIFAR-shaped data, generated offline",
        }
        what = kind.get(self.source, f"CIFAR-10 from a local file ({self.source[4:]})")
        return f"Data: {what} — {self.num_train} train / {self.num_test} test images; source {self.source!r}: {self.reason}"


def image_label_spec(image_size: int = 32):
    """The element spec every source yields."""
    import tensorflow as tf

    return (tf.TensorSpec((image_size, image_size, 3), tf.uint8), tf.TensorSpec((), tf.int64))


def _from_arrays(x, y):
    """A dataset over in-memory arrays, built on the host: in eager mode ``from_tensor_slices`` first turns each array
    into one tensor on the default device — a GPU's memory, where there is one (tensorflow#71744)."""
    import tensorflow as tf

    with tf.device("/CPU:0"):
        return tf.data.Dataset.from_tensor_slices((np.asarray(x, np.uint8), np.asarray(y, np.int64)))


def _check_arrays(path: str, name_x: str, x, name_y: str, y, image_size: int, num_classes: int) -> None:
    fmt = f"expected uint8 images of shape (N, {image_size}, {image_size}, 3) (HWC) and integer labels of shape (N,)"
    if x.dtype != np.uint8:
        raise DataSourceError(
            f"{path}: {name_x} has dtype {x.dtype}, {fmt}. Convert with np.clip(x, 0, 255).astype(np.uint8) "
            "(if your images are floats in [0, 1], multiply by 255 first)."
        )
    if x.ndim != 4 or tuple(x.shape[1:]) != (image_size, image_size, 3):
        hint = (
            " It looks channels-first (NCHW): use x.transpose(0, 2, 3, 1)." if x.ndim == 4 and x.shape[1] == 3 else ""
        )
        raise DataSourceError(f"{path}: {name_x} has shape {x.shape}, {fmt}.{hint}")
    if not np.issubdtype(y.dtype, np.integer):
        raise DataSourceError(
            f"{path}: {name_y} has dtype {y.dtype}, {fmt}; labels are class numbers 0-{num_classes - 1}."
        )
    if y.shape != (len(x),):
        raise DataSourceError(
            f"{path}: {name_y} has shape {y.shape} but {name_x} has {len(x)} images; {fmt}"
            + (" (one-hot labels? use y.argmax(1))" if y.ndim == 2 else "")
            + "."
        )
    if len(x) == 0:
        split = name_x.split("_", 1)[-1]
        raise DataSourceError(
            f"{path}: {name_x} has 0 images — the {split} split is empty; a course npz needs at "
            "least one train and one test example."
        )
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise DataSourceError(f"{path}: {name_y} has labels from {y.min()} to {y.max()}; expected 0-{num_classes - 1}.")


NPZ_HOWTO = (
    'To get a good file: on a connected machine, course_utils.data.write_npz("cifar10.npz", '
    '*[to_numpy(s) for s in (d.train, d.test)]) with d = load_cifar10("tfds", n_train=-1, n_test=-1), then copy it '
    "here; or use COURSE_DATA=synthetic (no file needed)."
)


def _npz_error(path: str, what: str) -> DataSourceError:
    return DataSourceError(f"npz:{path} — {what}. {NPZ_HOWTO}")


def _plain_reason(exc: BaseException) -> str:
    """A library's error message, first line, without numpy's advice to load pickles."""
    text = (str(exc).strip().splitlines() or [""])[0][:160]
    return "" if "allow_pickle" in text else f" ({text})"


def file_problem(path: str) -> str | None:
    """Why ``path`` cannot be read as a data file, as a predicate ("does not exist", "is a folder, not a file", "is a
    named pipe (FIFO), not a regular file"), or None. Never opens it: opening a FIFO waits for a writer forever."""
    import stat

    try:
        mode = os.stat(os.path.expanduser(os.fspath(path))).st_mode
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or type(exc).__name__})"
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    if not stat.S_ISREG(mode):
        kind = "a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        return f"is {kind}, not a regular file"
    return None


_OBJECT_ARRAY = (
    "is an object array (pickled Python objects), which the course never loads (unsafe); save plain "
    "numeric arrays (uint8 images, integer labels)"
)
MAX_NPZ_IMAGES = 200_000  # per split: CIFAR-10 has 50,000 + 10,000; a file declaring more is refused before reading


def _npz_headers(path: str, image_size: int, num_classes: int) -> None:
    """Read each course member's ``.npy`` header — not its data — and refuse what must not be loaded: a declared
    shape larger than :data:`MAX_NPZ_IMAGES` images (numpy would allocate it first: a 2.79 TiB shape is a
    MemoryError), a declared size the member does not hold (corrupt, or a zip bomb's member that decompresses to
    more than its header says), pickled object arrays. Members that are missing are left to :func:`read_npz`."""
    import math
    import zipfile
    import zlib

    limits = {"x": MAX_NPZ_IMAGES * image_size * image_size * 3, "y": MAX_NPZ_IMAGES * num_classes}
    with zipfile.ZipFile(path) as archive:
        members = {name[:-4]: name for name in archive.namelist() if name.endswith(".npy")}
        for key in NPZ_KEYS:
            if key not in members:
                continue
            info = archive.getinfo(members[key])
            try:
                with archive.open(info) as fp:
                    try:
                        version = np.lib.format.read_magic(fp)
                    except ValueError:
                        raise _npz_error(
                            path, f"member {key} is not a numpy array (raw bytes, not written by np.savez)"
                        ) from None
                    read_header = {
                        (1, 0): np.lib.format.read_array_header_1_0,
                        (2, 0): np.lib.format.read_array_header_2_0,
                    }.get(version)
                    if read_header is None:
                        raise _npz_error(
                            path,
                            f"member {key} is in .npy format {version}, which the course does not "
                            "read (np.savez writes 1.0 or 2.0)",
                        )
                    try:
                        shape, _, dtype = read_header(fp, max_header_size=10_000)
                    except ValueError as exc:
                        raise _npz_error(path, f"member {key} is not a valid numpy array{_plain_reason(exc)}") from None
                    header = fp.tell()
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
                raise _npz_error(
                    path,
                    f"is not a readable .npz archive: corrupt or truncated in member {key}"
                    f"{_plain_reason(exc)}; copy or download it again",
                ) from None
            if dtype.hasobject:
                raise _npz_error(path, f"member {key} {_OBJECT_ARRAY}")
            elements = math.prod(shape)
            if elements > limits[key[0]]:
                raise _npz_error(
                    path,
                    f"member {key} declares shape {shape}: more than {MAX_NPZ_IMAGES:,} images' worth "
                    "(CIFAR-10 has 50,000 + 10,000); the course does not load it",
                )
            if header + elements * dtype.itemsize != info.file_size:
                raise _npz_error(
                    path,
                    f"member {key} declares shape {shape} of {dtype} ({elements * dtype.itemsize:,} "
                    f"bytes) but holds {max(info.file_size - header, 0):,}: corrupt, or not written "
                    "by np.savez",
                )


def read_npz(path: str, image_size: int = 32, num_classes: int = 10):
    """Read and validate a CIFAR-10 ``.npz``; returns ``(x_train, y_train), (x_test, y_test)``.

    Every defect — a missing or unreadable file, something that is not an npz archive (random bytes, a
    ``.npy``), a truncated or corrupt archive, pickled object arrays (never loaded: unsafe), a member that is
    not an array, empty splits, wrong shapes, dtypes or labels — is one :class:`DataSourceError` that says
    what is wrong and how to get a good file.
    """
    import zipfile
    import zlib

    path = os.path.expanduser(os.fspath(path))
    if not os.path.exists(path):
        raise DataSourceError(f"npz:{path} — no such file. Fix the path in COURSE_DATA, or: {OFFLINE_OPTIONS}")
    if os.path.isdir(path):
        raise _npz_error(path, "is a folder, not a file; COURSE_DATA=npz: needs the path of the .npz file itself")
    problem = file_problem(path)  # a FIFO: opening it would wait for a writer forever
    if problem is not None:
        raise _npz_error(path, f"{problem}; COURSE_DATA=npz: needs the path of the .npz file itself")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(6)
    except PermissionError:
        raise _npz_error(
            path,
            "cannot be read (permission denied): fix its permissions (chmod a+r) or copy it somewhere you can read",
        ) from None
    except OSError as exc:
        raise _npz_error(path, f"cannot be read ({exc.strerror or type(exc).__name__})") from None
    if magic == b"\x93NUMPY":
        raise _npz_error(
            path, f"is a single .npy array (np.save), not an .npz archive of {', '.join(NPZ_KEYS)} (np.savez)"
        )
    if not magic.startswith(b"PK"):
        what = (
            "is empty (0 bytes)"
            if not magic
            else "is not a readable .npz archive (not a zip file: another format, or corrupt)"
        )
        raise _npz_error(path, what)
    key = None
    arrays = {}
    try:
        _npz_headers(path, image_size, num_classes)
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in NPZ_KEYS if k not in f.files]
            if missing:
                raise _npz_error(
                    path,
                    f"lacks the key(s) {', '.join(missing)} (it has: {', '.join(f.files) or 'none'}); "
                    f"a course npz needs exactly {', '.join(NPZ_KEYS)}",
                )
            for key in NPZ_KEYS:
                value = f[key]
                if not isinstance(value, np.ndarray):  # numpy hands back the raw bytes of a non-.npy member
                    raise _npz_error(path, f"member {key} is not a numpy array (raw bytes, not written by np.savez)")
                arrays[key] = value
    except DataSourceError:
        raise
    except PermissionError:
        raise _npz_error(path, "cannot be read (permission denied)") from None
    except ValueError as exc:
        member = f"member {key}" if key else "the archive"
        if "pickle" in str(exc).lower() or "object arrays" in str(exc).lower():
            raise _npz_error(path, f"{member} {_OBJECT_ARRAY}") from None
        raise _npz_error(path, f"{member} is not a valid numpy array{_plain_reason(exc)}") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, KeyError, NotImplementedError) as exc:
        where = f" in member {key}" if key else ""
        raise _npz_error(
            path,
            f"is not a readable .npz archive: corrupt or truncated{where}{_plain_reason(exc)}; "
            "copy or download it again",
        ) from None
    try:
        for split in ("train", "test"):
            _check_arrays(
                path, f"x_{split}", arrays[f"x_{split}"], f"y_{split}", arrays[f"y_{split}"], image_size, num_classes
            )
    except DataSourceError as exc:
        raise DataSourceError(f"{exc} {NPZ_HOWTO}") from None
    return (arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"])


def _uint8_images(name: str, x) -> np.ndarray:
    """``x`` as uint8 0-255 without guessing a scale: integers in 0-255 (any integer dtype, or floats that
    hold whole numbers 0-255, e.g. ``tf.cast`` of uint8 images) convert exactly; anything else is refused."""
    x = np.asarray(x)
    if x.dtype == np.uint8:
        return x
    if x.dtype == object or not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
        raise DataSourceError(f"write_npz: {name} has dtype {x.dtype}; images must be uint8 0-255.")
    if x.size == 0:
        return x.astype(np.uint8)
    if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
        raise DataSourceError(f"write_npz: {name} contains NaN or infinite values; images must be uint8 0-255.")
    low, high = x.min(), x.max()
    whole = np.issubdtype(x.dtype, np.integer) or bool(np.all(x == np.round(x)))
    if whole and low >= 0 and high <= 255 and (np.issubdtype(x.dtype, np.integer) or high > 1):
        return x.astype(np.uint8)
    if np.issubdtype(x.dtype, np.floating) and low >= 0 and high <= 1:
        raise DataSourceError(
            f"write_npz: {name} is {x.dtype} with values in [{low:g}, {high:g}] — images scaled to [0, 1]; casting "
            "them to uint8 would make them all black, and write_npz does not guess a scale. Pass "
            "np.round(x * 255).astype(np.uint8)."
        )
    raise DataSourceError(
        f"write_npz: {name} is {x.dtype} with values in [{low:g}, {high:g}]; images must be whole numbers 0-255 "
        "(uint8). Convert them yourself, e.g. np.clip(np.round(x), 0, 255).astype(np.uint8)."
    )


def _int_labels(name: str, y) -> np.ndarray:
    y = np.asarray(y)
    if np.issubdtype(y.dtype, np.floating) and y.size and np.isfinite(y).all() and np.all(y == np.round(y)):
        return y.astype(np.int64)  # 3.0 → 3 exactly; 3.7 stays float and is refused by _check_arrays
    return y.astype(np.int64) if np.issubdtype(y.dtype, np.integer) and y.dtype != np.int64 else y


def write_npz(path: str, train, test) -> str:
    """Save ``(x_train, y_train), (x_test, y_test)`` in the course's npz format (for offline classrooms).

    On a connected machine: ``d = load_cifar10("tfds", n_train=-1, n_test=-1)``, then
    ``write_npz("cifar10.npz", to_numpy(d.train), to_numpy(d.test))``; hand out the file and set
    ``COURSE_DATA=npz:cifar10.npz``.

    Images are stored as uint8 0-255 and never rescaled by guess: float images in [0, 1] are refused with
    the conversion to use (``np.round(x * 255).astype(np.uint8)``) instead of being cast to all zeros;
    whole-number images in 0-255 of another dtype convert exactly. The arrays are checked like
    :func:`read_npz` checks them (shapes, labels 0-9, no empty split), so a file written here reads back.
    ``~`` is expanded and ``.npz`` appended when missing (as numpy does); returns the path written.
    """
    try:
        (x_train, y_train), (x_test, y_test) = train, test
    except (TypeError, ValueError):
        raise DataSourceError(
            "write_npz(path, train, test): train and test must each be a pair (x, y) of arrays, e.g. to_numpy(d.train)."
        ) from None
    path = os.path.expanduser(os.fspath(path))
    if not path.endswith(".npz"):
        path += ".npz"
    arrays = {}
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        arrays[f"x_{split}"] = _uint8_images(f"x_{split}", x)
        arrays[f"y_{split}"] = _int_labels(f"y_{split}", y)
        _check_arrays(path, f"x_{split}", arrays[f"x_{split}"], f"y_{split}", arrays[f"y_{split}"], 32, 10)
    arrays = {k: (v.astype(np.int64) if k.startswith("y_") else v) for k, v in arrays.items()}
    partial = path + ".partial.npz"
    try:
        np.savez_compressed(partial, **arrays)
        os.replace(partial, path)  # never leave a half-written file under the real name
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return path


def to_numpy(ds):
    """An unbatched ``(image, label)`` dataset as numpy arrays ``(x, y)`` (reads all of it)."""
    pairs = list(ds.as_numpy_iterator())
    if not pairs:
        return np.zeros((0, 32, 32, 3), np.uint8), np.zeros(0, np.int64)
    xs, ys = zip(*pairs)
    return np.stack(xs).astype(np.uint8), np.asarray(ys, np.int64)


# Where tensorflow-datasets fetches CIFAR-10 when it is not in the data dir yet: the public GCS bucket
# (prepared datasets and download mirror) and the original host.
TFDS_HOSTS = (("storage.googleapis.com", 443), ("www.cs.toronto.edu", 443))
PROBE_TIMEOUT_S = 5.0  # all hosts are probed at once: the whole probe takes at most this long
NO_INTERNET_FIX = (
    "Set COURSE_DATA=npz:/path/cifar10.npz (a copy of CIFAR-10), COURSE_DATA=synthetic (generated CIFAR-shaped "
    "data, no download) or COURSE_SMOKE=1 (small generated data) "
    'BEFORE the setup cell runs — in a notebook: os.environ["COURSE_DATA"] = "npz:/path/cifar10.npz" at the top, '
    "or, if the setup cell already ran, restart the kernel/runtime and run again. To get CIFAR-10 for this "
    'machine: on a connected one run load_cifar10("tfds", n_train=-1, n_test=-1) and write_npz(...) '
    "(see course_utils.data.write_npz), or copy its ~/tensorflow_datasets/cifar10 folder here."
)


def _plain_network_reason(exc: BaseException) -> str:
    import socket

    if isinstance(exc, socket.gaierror):
        return "cannot look up the host name"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "no answer in time"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return f"cannot connect ({getattr(exc, 'strerror', None) or type(exc).__name__})"


def _probe_hosts(hosts=None, timeout: float | None = None) -> tuple[bool, str]:
    """Can this machine open a connection to any of ``hosts``? ``(True, host)`` or ``(False, why)``.

    All hosts are tried at once in background threads, and the answer comes after at most ``timeout``
    seconds — also when name lookup itself hangs (``getaddrinfo`` has no timeout of its own)."""
    import queue
    import socket
    import threading
    import time

    hosts = TFDS_HOSTS if hosts is None else hosts
    timeout = PROBE_TIMEOUT_S if timeout is None else timeout
    answers: queue.Queue = queue.Queue()

    def probe(host, port):
        try:
            with socket.create_connection((host, port), timeout=timeout):
                answers.put((True, host, ""))
        except Exception as exc:  # noqa: BLE001 - OSError mostly; whatever it is, this host is not usable
            answers.put((False, host, _plain_network_reason(exc)))

    for host, port in hosts:
        threading.Thread(target=probe, args=(host, port), daemon=True, name=f"probe-{host}").start()
    deadline = time.monotonic() + timeout
    failed: dict[str, str] = {}
    while len(failed) < len(hosts):
        try:
            ok, host, why = answers.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if ok:
            return True, host
        failed[host] = why
    reasons = [f"{host}: {failed.get(host, f'no answer within {timeout:g} s')}" for host, _ in hosts]
    return False, "; ".join(reasons)


def _import_tfds():
    """``tensorflow_datasets``, or a :class:`DataSourceError` saying why it cannot be imported and the fix."""
    try:
        from ._imports import import_whole

        tfds = import_whole("tensorflow_datasets")
    except Exception as exc:  # noqa: BLE001 - any import failure (e.g. protobuf VersionError) becomes one line
        if isinstance(exc, ModuleNotFoundError) and exc.name == "tensorflow_datasets":
            raise DataSourceError(
                "tensorflow-datasets is not installed: pip install 'tensorflow-datasets>=4.9' (then restart the "
                "kernel), or set COURSE_DATA=npz:/path/cifar10.npz or COURSE_SMOKE=1 before the setup cell. "
                + OFFLINE_OPTIONS
            ) from None
        from .runtime import describe_import_failure

        what, fix = describe_import_failure("tensorflow-datasets", exc)
        raise DataSourceError(
            f"Cannot load real CIFAR-10: {what}. Fix: {fix}. Or skip tfds: set COURSE_DATA=npz:/path/cifar10.npz "
            "or COURSE_SMOKE=1 before the setup cell (restart the kernel if it already ran)."
        ) from None
    return tfds


def _tfds_prepared(tfds, data_dir: str | None) -> bool:
    """Is CIFAR-10 already downloaded and prepared in the local tfds data dir? (No network is used.)"""
    try:
        return bool(tfds.builder("cifar10", data_dir=data_dir).is_prepared())
    except Exception:  # noqa: BLE001 - a copy tfds cannot read: if it is there, let tfds.load say what is wrong
        import glob

        root = data_dir or os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")
        return bool(glob.glob(os.path.join(root, "cifar10", "*", "dataset_info.json")))


def _tfds_load(**kwargs):
    """Indirection so tests can make the download fail without touching the network."""
    import tensorflow_datasets as tfds

    return tfds.load(**kwargs)


def _load_tfds(n_train: int | None, n_test: int | None, data_dir: str | None, try_gcs: bool):
    """``(train, test, read_from_gcs)``. Fails fast, with the offline options, when CIFAR-10 is not in the local
    data dir and none of its hosts can be reached (instead of minutes of download retries)."""

    def split(name, n):
        return name if n is None else f"{name}[:{n}]"

    tfds = _import_tfds()
    where = data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"
    if _tfds_prepared(tfds, data_dir):
        try_gcs = False  # the local copy: no network needed
    elif not (os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")):  # behind a proxy: cannot tell
        reachable, why = _probe_hosts()
        if not reachable:
            raise DataSourceError(
                f"No internet connection: CIFAR-10 is not in the tfds data dir ({where}/cifar10) and cannot be "
                f"downloaded ({why}). {NO_INTERNET_FIX}"
            )
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
        fix = (
            f" (a dependency of the tfds download is missing: pip install {exc.name})"
            if isinstance(exc, ModuleNotFoundError) and exc.name
            else ""
        )
        raise DataSourceError(
            f"Could not load real CIFAR-10 with tensorflow-datasets (data dir {where}): "
            f"{type(exc).__name__}: {first}{fix}. The course does not switch to fake data by itself. {OFFLINE_OPTIONS}"
        ) from exc
    return train, test, try_gcs


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
    # the config is read only for what the arguments leave open (the capstone passes all of it: CourseSettings)
    cfg = _config.get() if None in (source, n_train, n_test, seed) else None
    if source is None:
        source, reason = cfg.data, cfg.data_reason
    else:
        source, reason = _config.parse_data(source), "chosen by argument"
    n_train = cfg.sizes.train_examples if n_train is None else n_train
    n_test = cfg.sizes.test_examples if n_test is None else n_test
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
        train, test, try_gcs = _load_tfds(n_train, n_test, data_dir, try_gcs)
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


def without_autotune(ds):
    """``ds`` with tf.data's autotuning off (``AUTOTUNE`` then means fixed defaults: as many parallel calls as cores, a
    small prefetch buffer). For a pipeline that ``fit`` iterates epoch after epoch on one device: Keras drops each
    epoch's iterator when the next epoch starts (or ``fit`` returns), and TensorFlow (2.20 and 2.21) destroys an
    iterator only once its autotuning thread wakes, a thread that sleeps longer the longer the iterator lived. On one
    CPU core that idled the process for up to an epoch each time (a small CNN: 5.5 s of training per epoch, 10–20 s
    in all). Under ``OneDeviceStrategy`` or ``MirroredStrategy`` the strategy's own per-device datasets still autotune
    (see ``runtime.Runtime.one_device_strategy``)."""
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options)


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


def augment_batch(images, labels, pad: int = 4):
    """:func:`augment` for a whole batch in one call (``ds.batch(n).map(augment_batch)``): each image gets its own
    flip and its own crop offset, as with :func:`augment` per image.

    ``tf.image.random_flip_left_right`` flips each image of a 4-D batch independently; ``tf.image.random_crop`` does
    not — it draws one offset for the whole batch — so the crop is a gather with one random offset per image."""
    import tensorflow as tf

    n, size = tf.shape(images)[0], images.shape[1] or tf.shape(images)[1]
    images = tf.image.random_flip_left_right(images)
    padded = tf.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
    offsets = tf.random.uniform([n, 2], 0, 2 * pad + 1, dtype=tf.int32)  # (row, column) per image
    window = tf.range(size)[tf.newaxis]
    images = tf.gather(padded, offsets[:, :1] + window, axis=1, batch_dims=1)  # rows
    images = tf.gather(images, offsets[:, 1:] + window, axis=2, batch_dims=1)  # columns
    return images, labels


def build_pipeline(
    ds,
    batch_size: int,
    *,
    training: bool = True,
    decode: Callable | None = None,
    augment_fn: Callable | None = augment,
    batch_augment_fn: Callable | None = None,
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

    ``batch_augment_fn`` (e.g. :func:`augment_batch`; then pass ``augment_fn=None``): augment whole batches instead,
    ``… → shuffle → batch → normalize + augment (map over batches, AUTOTUNE) → prefetch`` — one call per batch
    instead of one per image (lesson 04 measures the difference).
    """
    import tensorflow as tf

    if training and augment_fn is not None and batch_augment_fn is not None:
        raise ValueError("give augment_fn (per image, before batch) or batch_augment_fn (per batch), not both")
    calls = tf.data.AUTOTUNE if parallel else None
    if decode is not None:
        ds = ds.map(decode, num_parallel_calls=calls)
    if cache:
        ds = ds.cache()
    if training and shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if training and batch_augment_fn is not None:
        ds = ds.batch(batch_size, drop_remainder=drop_remainder)
        ds = ds.map(lambda x, y: batch_augment_fn(*to_float(x, y)), num_parallel_calls=calls)
        return ds.prefetch(tf.data.AUTOTUNE) if prefetch else ds
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
            writers[i * num_files // len(examples)].write(
                tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
            )
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
    ds = ds.interleave(
        tf.data.TFRecordDataset, cycle_length=cycle_length, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )
    ds = ds.map(parse_record, num_parallel_calls=tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = getattr(tf.data.experimental.AutoShardPolicy, policy)
    return ds.with_options(options)
