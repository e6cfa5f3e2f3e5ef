"""Run the course's test suite against other package sets (issue 9 §5): `pip install -r requirements-dev.txt`
(it pins nox), then

    nox -s pinned    # requirements-dev.txt (requirements.txt + test tools) — what CI runs (.ci/run)
    nox -s colab     # requirements-colab.txt — the versions Colab's runtime ships
    nox -s latest    # requirements-latest.txt — the newest releases

Extra arguments go to pytest: `nox -s colab -- -x tests/`. Each session builds its own virtual
environment under .nox/ with the Python running nox (the course supports 3.11-3.13). Colab runs
Python 3.13: `nox -s colab --force-python 3.13` matches it where a 3.13 interpreter is installed.
"""

import nox

nox.options.sessions = ["pinned"]


def _suite(session: nox.Session, requirements: str) -> None:
    session.install("-r", requirements)
    session.run("python", "-m", "course_utils", "doctor", "--offline")
    session.run("python", "-c", "import tensorflow as tf, keras; print('TensorFlow', tf.__version__, '· Keras', keras.__version__)")
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
