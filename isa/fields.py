"""Bit fields of the 64-bit instruction word, and the kinds of value they hold.

Like riscv-opcodes' `arg_lut.csv`: one row per field name. Several names may
share bits (e.g. `imm` and `n`); the table validator only forbids overlap
inside one instruction.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from isa.enums import Activation, Counter, DType, EpilogueFlags, Unit

WORD_BITS = 64
WORD_BYTES = WORD_BITS // 8
NUM_XREGS = 32
NUM_VREGS = 8


class Kind(enum.Enum):
    """How an operand's text or value maps to field bits."""

    xreg = "xreg"  # scalar register x0..x31
    vreg = "vreg"  # vector register v0..v7 (fusion chains)
    simm = "simm"  # signed immediate
    uimm = "uimm"  # unsigned immediate
    imm32 = "imm32"  # any 32-bit value: signed, unsigned or an fp32 literal
    target = "target"  # pc-relative branch target, signed (instructions)
    loop_end = "loop_end"  # pc-relative end of a hardware-loop body, forward only
    dtype = "dtype"
    unit = "unit"
    counter = "counter"
    act = "act"
    epflags = "epflags"


ENUM_KINDS: dict[Kind, type[enum.IntEnum]] = {
    Kind.dtype: DType,
    Kind.unit: Unit,
    Kind.counter: Counter,
    Kind.act: Activation,
    Kind.epflags: EpilogueFlags,
}


@dataclass(frozen=True)
class Field:
    name: str
    lo: int
    width: int
    kind: Kind
    doc: str

    @property
    def hi(self) -> int:
        """Highest bit, inclusive (Verilog-style [hi:lo])."""
        return self.lo + self.width - 1

    @property
    def mask(self) -> int:
        return ((1 << self.width) - 1) << self.lo

    @property
    def signed(self) -> bool:
        return self.kind in (Kind.simm, Kind.target)

    @property
    def value_range(self) -> tuple[int, int]:
        """Inclusive range of values the operand may take (before encoding)."""
        if self.kind is Kind.xreg:
            return 0, NUM_XREGS - 1
        if self.kind is Kind.vreg:
            return 0, NUM_VREGS - 1
        if self.kind in ENUM_KINDS:
            return 0, max(ENUM_KINDS[self.kind])
        if self.kind is Kind.imm32:
            return -(1 << 31), (1 << 32) - 1
        if self.signed:
            return -(1 << (self.width - 1)), (1 << (self.width - 1)) - 1
        return 0, (1 << self.width) - 1


def _f(name: str, lo: int, width: int, kind: Kind, doc: str) -> Field:
    return Field(name, lo, width, kind, doc)


# name, lo, width, kind, meaning
FIELD_TABLE: tuple[Field, ...] = (
    _f("opcode", 0, 8, Kind.uimm, "major opcode"),
    _f("rd", 8, 5, Kind.xreg, "destination register / local destination address"),
    _f("rs1", 13, 5, Kind.xreg, "first source register"),
    _f("rs2", 18, 5, Kind.xreg, "second source register"),
    _f("vd", 8, 5, Kind.vreg, "destination vector register"),
    _f("vs1", 13, 5, Kind.vreg, "first source vector register"),
    _f("vs2", 18, 5, Kind.vreg, "second source vector register"),
    _f("funct", 23, 6, Kind.uimm, "minor opcode"),
    _f("dtype", 29, 2, Kind.dtype, "element type"),
    _f("mode", 31, 2, Kind.uimm, "vector operand mode (vv, vs, vr, vc)"),
    _f("imm32", 32, 32, Kind.imm32, "32-bit immediate"),
    _f("imm", 33, 31, Kind.simm, "signed immediate"),
    _f("target", 33, 31, Kind.target, "branch target, pc-relative"),
    _f("n", 33, 16, Kind.uimm, "element count / loop count"),
    _f("rows", 33, 12, Kind.uimm, "tile rows"),
    _f("cols", 45, 12, Kind.uimm, "tile columns"),
    _f("act", 33, 3, Kind.act, "epilogue activation"),
    _f("epflags", 36, 3, Kind.epflags, "epilogue optional operands"),
    _f("counter", 33, 8, Kind.counter, "performance counter id"),
    _f("src", 33, 3, Kind.unit, "token source unit"),
    _f("dst", 36, 3, Kind.unit, "token destination unit"),
    _f("table", 33, 24, Kind.uimm, "DRAM byte address of a dispatch table"),
    _f("ncase", 57, 7, Kind.uimm, "number of dispatch table entries"),
    _f("period", 49, 15, Kind.uimm, "row length for broadcasts and reductions"),
    _f("shift", 49, 6, Kind.uimm, "requantization right shift"),
    _f("dtype2", 49, 2, Kind.dtype, "destination element type of a conversion"),
    _f("btarget", 49, 15, Kind.target, "short branch target, pc-relative"),
    _f("lend", 49, 15, Kind.loop_end, "end of loop body (first instruction after it), pc-relative"),
    _f("rs3", 59, 5, Kind.xreg, "third source register"),
)

FIELDS: dict[str, Field] = {f.name: f for f in FIELD_TABLE}
FIXED_FIELDS = ("opcode", "funct", "mode")
