"""Syntax nodes of one source line, as the parser produces them.

Nodes only record what was written and where (1-based columns); meaning
(which mnemonic, which operand kind) is assigned later from the ISA table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Num:
    value: int | float
    col: int


@dataclass(frozen=True, slots=True)
class Name:
    name: str
    col: int


@dataclass(frozen=True, slots=True)
class UnOp:
    op: str
    arg: Expr
    col: int


@dataclass(frozen=True, slots=True)
class BinOp:
    op: str
    left: Expr
    right: Expr
    col: int  # where the whole expression starts
    op_col: int  # where the operator is


Expr = Num | Name | UnOp | BinOp


@dataclass(frozen=True, slots=True)
class Mem:
    """The memory form `imm(rs1)`."""

    imm: Expr
    base: Expr
    col: int


@dataclass(frozen=True, slots=True)
class Tensor:
    """`NAME: dtype[dims] @ address` of a kernel's `.input`/`.output`."""

    name: str
    dtype: Name
    shape: tuple[Expr, ...]
    address: Expr
    col: int


@dataclass(frozen=True, slots=True)
class Pair:
    """`key value` of `.attr`."""

    key: str
    value: str
    col: int


@dataclass(frozen=True, slots=True)
class Str:
    value: str
    col: int


Operand = Num | Name | UnOp | BinOp | Mem | Tensor | Pair | Str


@dataclass(frozen=True, slots=True)
class LabelDef:
    name: str
    line: int
    col: int


@dataclass(frozen=True, slots=True)
class Statement:
    """`name operand, operand...`: an instruction, or a directive when `name` starts with '.'."""

    name: str
    operands: tuple[Operand, ...]
    line: int
    col: int


def column(operand: object) -> int:
    return getattr(operand, "col", 0)
