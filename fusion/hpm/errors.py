"""Errors of the hardware performance model: bad datasets, bad model files, schema mismatches."""

from __future__ import annotations

from fusion.errors import FusionError


class HpmError(FusionError):
    """Root of HPM errors (a CLI user sees the message, never a traceback)."""


class DatasetError(HpmError):
    """A calibration dataset is missing, malformed, of another format version, or empty."""


class ModelFileError(HpmError):
    """A file is not an HPM model (wrong kind of file, missing, not a regular file, too large): an error."""


class UnusableModelError(ModelFileError):
    """An HPM model file this code cannot use: the cost-model resolver warns and plans with the analytic model."""


class CorruptModelError(UnusableModelError):
    """An HPM model file that does not parse (truncated, damaged, arrays of the wrong type or structure)."""


class StaleModelError(UnusableModelError):
    """An HPM model of another format version, or calibrated on other kernel generators than this code's."""


class SchemaMismatchError(StaleModelError):
    """A model was trained on another feature schema than the one this code computes."""
