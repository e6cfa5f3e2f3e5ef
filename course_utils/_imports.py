"""Imports that must really finish (no third-party imports here: the doctor uses this without numpy)."""

from __future__ import annotations


def import_whole(name: str):
    """Import ``name`` and make sure it really loaded.

    tensorflow-datasets 4.9.10 catches an error in its own ``__init__`` (on Colab: tensorflow-metadata's
    protobuf gencode newer than the runtime's, a ``VersionError``), logs the traceback through absl and
    returns a module without ``load``. Import it with absl's logger quiet, then re-raise what it swallowed.
    """
    import importlib
    import logging

    absl = logging.getLogger("absl")
    was_disabled, absl.disabled = absl.disabled, True
    try:
        module = importlib.import_module(name)
        if name == "tensorflow_datasets" and not hasattr(module, "load"):
            importlib.import_module("tensorflow_datasets.public_api")  # raises the swallowed error
            if not hasattr(module, "load"):
                raise ImportError("tensorflow_datasets imported without `load` (a half-initialised install)")
        return module
    finally:
        absl.disabled = was_disabled
