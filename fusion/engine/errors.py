"""Errors of the fusion engine (all DynfuseError: the CLI prints them without a traceback)."""

from __future__ import annotations

from fusion.errors import FusionError


class EngineError(FusionError):
    """A plan, policy, kernel or cache request the engine cannot honour."""


class CodegenError(EngineError):
    """A fused-kernel generator was asked for a group or strategy it cannot emit."""
