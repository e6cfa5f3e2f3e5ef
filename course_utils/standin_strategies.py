"""The TPU stand-in's strategies (:mod:`course_utils.standin`): classes at module level, in a module that imports
TensorFlow at the top, so that each is one class however often a runtime is made."""

from __future__ import annotations

import tensorflow as tf

from .standin import RUN_UNDER_XLA, TPUStandInRefused, _in_xla_context, _validate_run_function


class TPURun:
    """``run`` as ``TPUStrategy`` accepts it (mixed into the stand-in's strategies)."""

    def run(self, fn, args=(), kwargs=None, options=None):  # noqa: D102 - tf.distribute.Strategy.run
        _validate_run_function(fn)
        if _in_xla_context():
            raise TPUStandInRefused(RUN_UNDER_XLA)
        return super().run(fn, args=args, kwargs=kwargs, options=options)


class TPUStandInStrategy(TPURun, tf.distribute.OneDeviceStrategy):
    """A one-core TPU stood in for by one CPU device (Colab's v5e-1): its merge is in place, as TPUStrategy's is."""


class TPUStandInMirroredStrategy(TPURun, tf.distribute.MirroredStrategy):
    """A several-core TPU stood in for by CPU devices (MirroredStrategy underneath: its merge is threaded)."""
