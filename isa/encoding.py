"""Instruction objects and their 64-bit encoding, both derived from the table.

An `Instruction` holds the *field values* of one word (branch targets as
pc-relative offsets, enums as their integers); symbolic operands are the
assembler's business and are resolved before an `Instruction` exists.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from isa.errors import EncodingError
from isa.fields import WORD_BITS, Field, Kind
from isa.spec import InstructionSpec
from isa.table import BY_MNEMONIC, INSTRUCTIONS

_WORD_MASK = (1 << WORD_BITS) - 1
_WORD = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class Instruction:
    spec: InstructionSpec
    values: tuple[int, ...]  # one per spec.fields, in order

    @property
    def mnemonic(self) -> str:
        return self.spec.mnemonic

    def field(self, name: str) -> int:
        for field, value in zip(self.spec.fields, self.values, strict=True):
            if field.name == name:
                return value
        raise KeyError(f"{self.spec.mnemonic} has no field {name!r}")

    def by_name(self) -> dict[str, int]:
        return {f.name: v for f, v in zip(self.spec.fields, self.values, strict=True)}

    def __repr__(self) -> str:
        return f"Instruction({self.spec.mnemonic} {', '.join(map(str, self.values))})"


def make(mnemonic: str, *values: int) -> Instruction:
    """Build and range-check an instruction from field values in operand order."""
    spec = BY_MNEMONIC.get(mnemonic)
    if spec is None:
        raise EncodingError(f"unknown mnemonic {mnemonic!r}")
    if len(values) != len(spec.fields):
        raise EncodingError(f"{spec.syntax}: expected {len(spec.fields)} field values, got {len(values)}")
    ints = tuple(int(v) for v in values)
    for field, value in zip(spec.fields, ints, strict=True):
        check_range(spec, field, value)
    return Instruction(spec, ints)


def check_range(spec: InstructionSpec, field: Field, value: int) -> None:
    lo, hi = field.value_range
    if not lo <= value <= hi:
        raise EncodingError(f"{spec.mnemonic}: {field.name}={value} out of range [{lo}, {hi}]")
    if field.name == "dtype" and spec.dtypes and value not in spec.dtypes:
        allowed = ", ".join(d.name for d in spec.dtypes)
        raise EncodingError(f"{spec.mnemonic}: dtype must be one of {allowed}")


def encode(instruction: Instruction) -> int:
    return encode_fields(instruction.spec, instruction.values)


def encode_fields(spec: InstructionSpec, values: Sequence[int]) -> int:
    """The word of `spec` with its operand fields set to `values` (already range-checked): `encode` without an
    `Instruction` object, for the assembler's fast path."""
    word = spec.match
    for field, value in zip(spec.fields, values, strict=True):
        word |= (value & ((1 << field.width) - 1)) << field.lo
    return word


class _Decoder:
    """Opcode-indexed lookup; an opcode's rows are told apart by their masks."""

    def __init__(self) -> None:
        self.by_opcode: dict[int, list[InstructionSpec]] = {}
        for spec in INSTRUCTIONS:
            self.by_opcode.setdefault(spec.opcode, []).append(spec)

    def spec_of(self, word: int) -> InstructionSpec:
        for spec in self.by_opcode.get(word & 0xFF, ()):
            if word & spec.mask == spec.match:
                if word & ~spec.used_mask & _WORD_MASK:
                    raise EncodingError(f"word {word:#018x}: reserved bits set for {spec.mnemonic}")
                return spec
        raise EncodingError(f"word {word:#018x} is not a valid instruction")


_DECODER = _Decoder()


def decode(word: int) -> Instruction:
    """Decode one word, rejecting unknown opcodes, set reserved bits and out-of-range fields."""
    spec = _DECODER.spec_of(word)
    values = []
    for field in spec.fields:
        raw = (word >> field.lo) & ((1 << field.width) - 1)
        if field.signed and raw >> (field.width - 1):
            raw -= 1 << field.width
        elif field.kind is Kind.imm32 and raw >> 31:
            raw -= 1 << 32
        values.append(raw)
    instruction = Instruction(spec, tuple(values))
    for field, value in zip(spec.fields, instruction.values, strict=True):
        try:
            check_range(spec, field, value)
        except EncodingError as err:
            raise EncodingError(f"word {word:#018x}: {err}") from None
    return instruction


def pack_words(words: list[int]) -> bytes:
    return b"".join(_WORD.pack(w) for w in words)


def unpack_words(data: bytes) -> list[int]:
    if len(data) % _WORD.size:
        raise EncodingError(f"text of {len(data)} bytes is not a whole number of {_WORD.size}-byte words")
    return [w for (w,) in _WORD.iter_unpack(data)]
