"""Run the course's test suite against other package sets (issue 9 §5): `pip install -r requirements-dev.txt`
(it pins nox), then

    nox -s pinned    # requirements-dev.txt (requirements.txt + test tools) — what CI runs (.ci/run)
    nox -s colab     # requirements-colab.txt — the versions Colab's runtime ships
    nox -s latest    # requirements-latest.txt — the newest releases
    nox -s colab_tpu # requirements-colab-tpu.txt — Colab's TPU image (Python 3.13, no TensorFlow), then the setup
                     # cell's TPU install path for real, then every lesson in smoke mode on the TPU build

Extra arguments go to pytest: `nox -s colab -- -x tests/`. Each session builds its own virtual
environment under .nox/ with the Python running nox (the course supports 3.11-3.13). Colab runs
Python 3.13: `nox -s colab --force-python 3.13` matches it where a 3.13 interpreter is installed.
"""

import nox

nox.options.sessions = ["pinned"]


def _suite(session: nox.Session, requirements: str) -> None:
    session.install("-r", requirements)
    session.run("python", "-m", "course_utils", "doctor", "--offline")
    session.run(
        "python",
        "-c",
        "import tensorflow as tf, keras; print('TensorFlow', tf.__version__, '· Keras', keras.__version__)",
    )
    session.run("pytest", *session.posargs)


@nox.session
def pinned(session: nox.Session) -> None:
    _suite(session, "requirements-dev.txt")


@nox.session
def colab(session: nox.Session) -> None:
    _suite(session, "requirements-colab.txt")


@nox.session
def latest(session: nox.Session) -> None:
    _suite(session, "requirements-latest.txt")


# The test tools on top of the TPU image, held to the image's pins (-c): nothing the image ships is replaced
_TEST_TOOLS = (
    "pytest==9.2.0",
    "pytest-xdist==3.8.0",
    "nbval==0.11.0",
    "nbclient==0.11.0",
    "ipykernel==7.4.0",
    "nbconvert==7.17.2",
    "pyyaml==6.0.4",
)


@nox.session(python="3.13")
def colab_tpu(session: nox.Session) -> None:
    """Colab's TPU image as shipped, then what the setup cell does there: ``install_tensorflow(on_tpu=True)`` runs
    its real pip commands against the package index (Google's --find-links host may be unreachable: it must say so
    and go on), installs TensorFlow's TPU build with its libtpu, and checks in a fresh process whether it reaches the
    TPU. Here it cannot — the case of a TPU runtime where TensorFlow finds no TPU (Kaggle/docker-python#1499) — so
    the setup must replace it with the CPU/GPU build and give the image's JAX its libtpu back; then every lesson runs
    in smoke mode on the image's protobuf 7 and Keras 3.13. libtpu would query a Google Cloud metadata server that is
    not here (and wait minutes for it): TPU_SKIP_MDS_QUERY=1 skips that, as on a machine that is not a TPU VM. Extra
    arguments go to pytest (default: the notebooks)."""
    session.install("-r", "requirements-colab-tpu.txt")
    session.install(".")  # course_utils as the setup cell installs it, with its own dependencies
    env = {"TPU_SKIP_MDS_QUERY": "1"}
    session.run("python", "-m", "devtools.colab_tpu_image", "before", env=env)
    session.run("python", "-m", "devtools.colab_tpu_image", "install", env=env)
    session.run("python", "-m", "devtools.colab_tpu_image", "after", env=env)
    session.install("-c", "requirements-colab-tpu.txt", *_TEST_TOOLS)
    session.run("python", "-m", "devtools.colab_tpu_image", "after", env=env)  # still the image's versions
    session.run("pytest", *(session.posargs or ["notebooks"]), env=env)
