"""Errors the fusion engine raises; all are DynfuseError so the CLI prints them without a traceback."""

from __future__ import annotations

from dataclasses import dataclass

from isa.errors import DynfuseError


class FusionError(DynfuseError):
    """Root of fusion-engine errors."""


class GraphError(FusionError):
    """A graph is malformed: a value used before it is defined, a duplicate name, a type mismatch."""


class ShapeError(GraphError):
    """An operator's inputs have shapes or dtypes it cannot accept."""


class InputMismatchError(FusionError):
    """The reference interpreter was given inputs that do not match the graph."""


@dataclass(frozen=True)
class Problem:
    """One reason a model cannot be imported: `kind` is "op" (unknown operator), "feature" (unsupported
    attribute, dtype or form of a known operator) or "malformed" (a required input or attribute is missing)."""

    node: str
    op_type: str
    kind: str
    reason: str

    def __str__(self) -> str:
        return f"  node {self.node!r} ({self.op_type}): {self.reason}"


class UnsupportedModelError(FusionError):
    """Every unsupported node of a model, gathered before giving up, so one run shows all of them."""

    def __init__(self, problems: tuple[Problem, ...], header: str = "model uses unsupported operators or features"):
        self.problems = problems
        lines = [f"{header} ({len(problems)} node(s)):", *(str(p) for p in problems)]
        super().__init__("\n".join(lines))
