"""``python -m course_utils.capstone``: the command line (:func:`course_utils.capstone.cli.main`)."""

import os
import sys

from .cli import main

_code = main()
if _code >= 128:  # interrupted mid-step: the backup is written; TensorFlow's threads may still be running, and
    sys.stdout.flush()  # its teardown at exit then can abort the process (seen once under load: "free():
    sys.stderr.flush()  # invalid next size", exit -6 instead of 130), so end without it
    os._exit(_code)
sys.exit(_code)
