"""Errors of the hardware performance model: bad datasets, bad model files, schema mismatches."""

from __future__ import annotations

from fusion.errors import FusionError


class HpmError(FusionError):
    """Root of HPM errors (a CLI user sees the message, never a traceback)."""


class DatasetError(HpmError):
    """A calibration dataset is missing, malformed, of another format version, or empty."""


class ModelFileError(HpmError):
    """A model file is not an HPM model, is corrupted (checksum), or of another container version."""


class SchemaMismatchError(ModelFileError):
    """A model was trained on another feature schema than the one this code computes."""
