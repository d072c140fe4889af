"""The program as a list of items: what both the text parser and `ProgramBuilder` produce.

Operand arguments are either syntax nodes (`assembler.nodes`, from text) or
plain Python values (from the builder: ints, enum members, names as str, numpy
arrays for data). `assembler.link` turns the items into an `ObjectFile`, so both
front ends share one resolver and one encoder and give identical bytes.

`loc` is opaque here: the front end that made an item knows how to show it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from assembler.objfile import Section
from isa.spec import InstructionSpec

Arg = Any  # a syntax node, int, float, str (a name) or enum member


@dataclass(frozen=True, slots=True)
class Instr:
    spec: InstructionSpec
    args: tuple[Arg, ...]  # one per spec.fields
    loc: Any
    cols: tuple[int, ...] = ()  # column of each arg (text only)


@dataclass(frozen=True, slots=True, init=False)
class InstrRun:
    """Consecutive instructions from `ProgramBuilder`, held as columns so the linker encodes them per ISA row
    with numpy instead of one Python call per word: `rows` indexes `isa.INSTRUCTIONS`, `args` and `locs` are as
    in `Instr` (one operand tuple and one emitting location per instruction: the builder keeps (code, bytecode
    offset), resolved to (file, line) only for a diagnostic). The builder appends to the
    open run until another item follows it."""

    rows: list[int]
    args: list[tuple[Arg, ...]]
    locs: list[Any]

    def __init__(self, rows: list[int], args: list[tuple[Arg, ...]], locs: list[Any]) -> None:
        """Sets the slots directly (a frozen dataclass's `__init__` costs twice as much; a builder opens a run
        after every label, and a kernel's hardware loops make tens of thousands)."""
        _RUN_SET[0](self, rows)
        _RUN_SET[1](self, args)
        _RUN_SET[2](self, locs)


@dataclass(frozen=True, slots=True, init=False)
class Label:
    name: str
    loc: Any
    col: int = 0

    def __init__(self, name: str, loc: Any, col: int = 0) -> None:
        """Sets the slots directly (as `InstrRun`: one per hardware loop a generator emits)."""
        _LABEL_SET[0](self, name)
        _LABEL_SET[1](self, loc)
        _LABEL_SET[2](self, col)


def slot_setters(cls: type) -> tuple:
    """The `__set__` of each field's slot of a frozen slots dataclass, in field order: its fast `__init__`."""
    return tuple(getattr(cls, f.name).__set__ for f in fields(cls))


_RUN_SET, _LABEL_SET = slot_setters(InstrRun), slot_setters(Label)


@dataclass(frozen=True, slots=True)
class Equ:
    name: str
    value: Arg
    loc: Any
    col: int = 0


@dataclass(frozen=True, slots=True)
class SetSection:
    section: Section
    loc: Any


@dataclass(frozen=True, slots=True)
class Data:
    """Initialised data: `kind` is 'i8', 'i32' or 'f32'; items are args or one numpy array."""

    kind: str
    items: Any
    loc: Any


@dataclass(frozen=True, slots=True)
class Zero:
    count: Arg
    loc: Any


@dataclass(frozen=True, slots=True)
class Align:
    boundary: Arg
    loc: Any


@dataclass(frozen=True, slots=True)
class DataBase:
    address: Arg
    loc: Any


@dataclass(frozen=True, slots=True)
class KernelBegin:
    name: str
    loc: Any


@dataclass(frozen=True, slots=True)
class KernelTensor:
    """`.input` / `.output`: dtype is a name (or DType), shape and address are args."""

    output: bool
    name: str
    dtype: Arg
    shape: tuple[Arg, ...]
    address: Arg
    loc: Any


@dataclass(frozen=True, slots=True)
class KernelAttr:
    key: str
    value: str
    loc: Any


@dataclass(frozen=True, slots=True)
class KernelEnd:
    loc: Any


Item = (
    Instr
    | InstrRun
    | Label
    | Equ
    | SetSection
    | Data
    | Zero
    | Align
    | DataBase
    | KernelBegin
    | KernelTensor
    | KernelAttr
    | KernelEnd
)

DATA_SIZES = {"i8": 1, "i32": 4, "f32": 4}
