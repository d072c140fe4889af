"""Errors of the lowering: all FusionError, so the CLI prints them as one clear message."""

from __future__ import annotations

from fusion.errors import FusionError


class LoweringError(FusionError):
    """A graph cannot be lowered to the accelerator (an unsupported operator, form or size)."""


class UnsupportedOpError(LoweringError):
    """The operator (or this form of it) has no kernel generator."""

    def __init__(self, node: str, op: str, reason: str) -> None:
        self.node, self.op, self.reason = node, op, reason
        super().__init__(f"cannot lower node {node!r} ({op}): {reason}")


class UnsupportedTypeError(LoweringError):
    """A value has an element type the accelerator does not compute on (int64, int32 or int8 tensors)."""


class MemoryPlanError(LoweringError):
    """The tensors do not fit DRAM, or a tile does not fit the scratchpad."""
