"""The instruction specification record and the table validator.

An `InstructionSpec` is one row of the ISA table; everything else (assembler,
disassembler, decoder, simulator dispatch, docs, the Verilog header) is derived
from the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from isa.enums import DType, Extension, Unit
from isa.errors import IsaTableError
from isa.fields import FIELDS, FIXED_FIELDS, WORD_BITS, Field, Kind


@dataclass(frozen=True)
class Operand:
    """One written operand. `base` is set for the memory form `imm(rs1)`."""

    field: Field
    base: Field | None = None

    @property
    def text(self) -> str:
        if self.base is not None:
            return f"{self.field.name}({self.base.name})"
        return self.field.name

    @cached_property
    def fields(self) -> tuple[Field, ...]:
        return (self.field,) if self.base is None else (self.field, self.base)


@dataclass(frozen=True)
class InstructionSpec:
    mnemonic: str
    operands: tuple[Operand, ...]
    fixed: tuple[tuple[str, int], ...]  # (field name, value) pairs identifying the row
    unit: Unit | None  # None: the queue is named by an operand (sync tokens)
    extension: Extension
    timing: str  # name of the simulator's timing rule
    latency: int  # pipeline depth in cycles, used by the timing rule
    dtypes: tuple[DType, ...]  # element types allowed in the dtype field (empty: no dtype)
    semantics: str  # one line for docs
    reads_data: bool = False  # sets control flow or a register from a value in memory (a timing-only run needs values)

    @cached_property
    def fields(self) -> tuple[Field, ...]:
        return tuple(f for op in self.operands for f in op.fields)

    @cached_property
    def mask(self) -> int:
        """Bits that identify this instruction."""
        return sum(FIELDS[name].mask for name, _ in self.fixed)

    @cached_property
    def match(self) -> int:
        return sum(value << FIELDS[name].lo for name, value in self.fixed)

    @cached_property
    def used_mask(self) -> int:
        """All bits this instruction gives meaning to; the rest must be zero."""
        return self.mask | sum(f.mask for f in self.fields)

    @cached_property
    def opcode(self) -> int:
        return dict(self.fixed)["opcode"]

    @property
    def python_name(self) -> str:
        """Identifier used by the generated builders (`v.add.vs` -> `v_add_vs`)."""
        return self.mnemonic.replace(".", "_")

    @property
    def syntax(self) -> str:
        ops = ", ".join(op.text for op in self.operands)
        return f"{self.mnemonic} {ops}".rstrip()


def parse_operands(text: str) -> tuple[Operand, ...]:
    """Parse an operand list like `rd, imm(rs1)` against the field table."""
    operands = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if item.endswith(")") and "(" in item:
            name, base = item[:-1].split("(")
            operands.append(Operand(_field(name), _field(base)))
        else:
            operands.append(Operand(_field(item)))
    return tuple(operands)


def _field(name: str) -> Field:
    if name not in FIELDS:
        raise IsaTableError(f"operand names unknown field {name!r}")
    if name in FIXED_FIELDS:
        raise IsaTableError(f"field {name!r} is fixed per instruction, not an operand")
    return FIELDS[name]


def validate_table(specs: tuple[InstructionSpec, ...]) -> None:
    """Reject the table if any word could decode two ways or any field misbehaves."""
    seen: dict[str, InstructionSpec] = {}
    for spec in specs:
        if spec.mnemonic in seen:
            raise IsaTableError(f"duplicate mnemonic {spec.mnemonic!r}")
        seen[spec.mnemonic] = spec
        _validate_row(spec)
    for i, a in enumerate(specs):
        for b in specs[i + 1 :]:
            common = a.mask & b.mask
            if (a.match & common) == (b.match & common):
                raise IsaTableError(f"encodings of {a.mnemonic!r} and {b.mnemonic!r} overlap")


def _validate_row(spec: InstructionSpec) -> None:
    names = [name for name, _ in spec.fixed]
    if "opcode" not in names:
        raise IsaTableError(f"{spec.mnemonic}: no opcode")
    if spec.opcode == 0:
        raise IsaTableError(f"{spec.mnemonic}: opcode 0 is reserved so that zeroed memory traps")
    occupied = 0
    for name, value in spec.fixed:
        field = FIELDS[name]
        if not 0 <= value < (1 << field.width):
            raise IsaTableError(f"{spec.mnemonic}: fixed {name}={value} wider than {field.width} bits")
        occupied = _claim(spec, occupied, field)
    for field in spec.fields:
        occupied = _claim(spec, occupied, field)
        lo, hi = field.value_range
        if field.kind is not Kind.imm32 and (hi >= (1 << field.width) or lo < -(1 << field.width)):
            raise IsaTableError(f"{spec.mnemonic}: values of {field.name} do not fit {field.width} bits")
    if occupied >> WORD_BITS:
        raise IsaTableError(f"{spec.mnemonic}: fields exceed the {WORD_BITS}-bit word")
    has_dtype = "dtype" in {f.name for f in spec.fields}
    if has_dtype != bool(spec.dtypes):
        raise IsaTableError(f"{spec.mnemonic}: allowed dtypes must be listed exactly when it has a dtype operand")
    if spec.latency < 0:
        raise IsaTableError(f"{spec.mnemonic}: negative latency")


def _claim(spec: InstructionSpec, occupied: int, field: Field) -> int:
    if occupied & field.mask:
        raise IsaTableError(f"{spec.mnemonic}: field {field.name} overlaps another field")
    return occupied | field.mask
