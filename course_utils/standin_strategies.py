"""The TPU stand-in's strategies (:mod:`course_utils.standin`): classes at module level, in a module that imports
TensorFlow at the top, so that each is one class however often a runtime is made; :func:`tpu_strategy` makes one,
:func:`is_tpu_strategy` tells a TPU's (or its stand-in's) strategy from others."""

from __future__ import annotations

from typing import Any

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


def tpu_strategy(cores: list[str]):
    """The TPU stand-in's strategy over ``cores`` (CPU device names): one core, merge in place
    (``OneDeviceStrategy``); several, ``MirroredStrategy``. Both refuse what ``TPUStrategy.run`` refuses."""
    if len(cores) == 1:
        return TPUStandInStrategy(cores[0])
    return TPUStandInMirroredStrategy(cores)


def is_tpu_strategy(strategy: Any) -> bool:
    """``strategy`` is a ``TPUStrategy``, or the TPU stand-in's."""
    return isinstance(strategy, (tf.distribute.TPUStrategy, TPURun))
