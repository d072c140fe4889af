"""Errors of design-space exploration: bad space files, objectives and result directories."""

from __future__ import annotations

from fusion.errors import FusionError


class ExploreError(FusionError):
    """A space file, objective or result directory that cannot be used; the message names the file and field."""
