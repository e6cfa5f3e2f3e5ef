"""Checks for ``nox -s colab_tpu``: Colab's TPU image as shipped (requirements-colab-tpu.txt), before and after the
setup cell's install path (``course_utils.runtime.install_tensorflow(on_tpu=True)``, against the package index).

    python -m devtools.colab_tpu_image before   # the untouched image: no TensorFlow, and libtpu_check says nothing false
    python -m devtools.colab_tpu_image install  # the setup cell's TPU path, as on a TPU runtime
    python -m devtools.colab_tpu_image after    # what the setup left: where TensorFlow reaches a TPU, its TPU build
                                                # with libtpu 0.0.14; where not (this machine: no TPU), the CPU/GPU
                                                # build and the image's libtpu back — importing beside the image's
                                                # protobuf and Keras either way

Each prints what it found and exits 1 with the reason when something is not as the course says.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib import metadata


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _fail(reason: str) -> None:
    print(f"colab_tpu: {reason}", file=sys.stderr)
    raise SystemExit(1)


def _image_pins() -> dict[str, str]:
    here = os.path.join(os.path.dirname(__file__), "..", "requirements-colab-tpu.txt")
    pins = {}
    with open(here, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if "==" in line:
                name, version = line.split("==", 1)
                pins[name.strip()] = version.strip()
    return pins


def before() -> None:
    from course_utils import runtime

    if importlib.util.find_spec("tensorflow") is not None:
        _fail("TensorFlow is installed: Colab's TPU image has none")
    for name in ("jax", "libtpu", "protobuf", "keras"):
        if _version(name) != _image_pins()[name]:
            _fail(f"{name} {_version(name)} is not the image's {_image_pins()[name]}")
    summary, problems = runtime.libtpu_check()
    print("untouched image:", summary)
    if problems:
        _fail(f"libtpu_check warns on the untouched image: {problems}")


def install() -> None:
    from course_utils import runtime

    runtime.install_tensorflow(on_tpu=True)


def after() -> None:
    from course_utils import runtime

    pins = _image_pins()
    # the image's own packages stay: the install must not replace them
    want = {name: pins[name] for name in ("jax", "protobuf", "keras", "numpy", "ml_dtypes")}
    if _version("tensorflow-tpu"):  # TensorFlow reached a TPU: its build stays, with the libtpu it names
        want.update({"tensorflow-tpu": runtime.TF_VERSION, "libtpu": runtime.LIBTPU_FOR_TF})
        case = "TensorFlow's TPU build, which reached the TPU"
    else:  # no TPU reached: the CPU/GPU build, and JAX's libtpu back
        want.update({"tensorflow": runtime.TF_VERSION, "libtpu": pins["libtpu"]})
        case = "no TPU reached: the CPU/GPU build, the image's libtpu back"
    wrong = {name: (_version(name), version) for name, version in want.items() if _version(name) != version}
    if wrong:
        _fail(
            f"after the setup's install ({case}): "
            + ", ".join(f"{n} {got} (want {exp})" for n, (got, exp) in wrong.items())
        )
    summary, problems = runtime.libtpu_check()
    print(f"after the setup ({case}):", summary)
    if problems:
        _fail(f"libtpu_check after the setup's install: {problems}")
    import google.protobuf
    import keras
    import tensorflow as tf

    print(
        f"TensorFlow {tf.__version__} imports beside protobuf {google.protobuf.__version__} and Keras "
        f"{keras.__version__}; devices: {[d.device_type for d in tf.config.list_physical_devices()]}"
    )
    compiled = tf.function(lambda: tf.reduce_sum(tf.ones((3, 3))), jit_compile=True)
    if float(compiled()) != 9.0:  # XLA for the CPU: what the TPU build cannot do
        _fail("TensorFlow computed a wrong sum under XLA")


if __name__ == "__main__":
    steps = {"before": before, "install": install, "after": after}
    if len(sys.argv) != 2 or sys.argv[1] not in steps:
        print(f"usage: python -m devtools.colab_tpu_image {{{'|'.join(steps)}}}", file=sys.stderr)
        raise SystemExit(2)
    steps[sys.argv[1]]()
