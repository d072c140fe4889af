"""The table validator rejects every kind of inconsistency it promises to."""

from __future__ import annotations

import dataclasses

import pytest

from isa import BY_MNEMONIC, INSTRUCTIONS, Extension, IsaTableError, Unit
from isa.spec import parse_operands, validate_table
from isa.table import _row


def test_the_shipped_table_validates_and_has_both_extensions() -> None:
    validate_table(INSTRUCTIONS)
    assert {s.extension for s in INSTRUCTIONS} == {Extension.base, Extension.fusion}


def test_every_unit_has_instructions() -> None:
    assert {s.unit for s in INSTRUCTIONS if s.unit is not None} == set(Unit)


@pytest.mark.parametrize(
    "mnemonic",
    ["ep.cfg", "mx.drain", "mx.mms", "vc.lds", "vc.add", "bz.tile", "dispatch", "dma.ldt"],
)
def test_fusion_primitives_belong_to_the_fusion_extension(mnemonic: str) -> None:
    assert BY_MNEMONIC[mnemonic].extension is Extension.fusion


def test_overlapping_encodings_are_rejected() -> None:
    a = _row("foo", "rd", 0x7E, 1, Unit.scalar, Extension.base, "scalar", 1, "x")
    b = _row("bar", "rd", 0x7E, 1, Unit.scalar, Extension.base, "scalar", 1, "y")
    with pytest.raises(IsaTableError, match="overlap"):
        validate_table((a, b))


def test_rows_without_funct_shadowing_rows_with_funct_are_rejected() -> None:
    a = _row("foo", "rd", 0x7E, None, Unit.scalar, Extension.base, "scalar", 1, "x")
    b = _row("bar", "rd", 0x7E, 3, Unit.scalar, Extension.base, "scalar", 1, "y")
    with pytest.raises(IsaTableError, match="overlap"):
        validate_table((a, b))


def test_fixed_value_wider_than_its_field_is_rejected() -> None:
    row = _row("foo", "rd", 0x7E, 64, Unit.scalar, Extension.base, "scalar", 1, "x")
    with pytest.raises(IsaTableError, match="wider than 6 bits"):
        validate_table((row,))


def test_fields_overlapping_inside_one_instruction_are_rejected() -> None:
    row = _row("foo", "n, rows", 0x7E, None, Unit.scalar, Extension.base, "scalar", 1, "x")
    with pytest.raises(IsaTableError, match="overlaps"):
        validate_table((row,))


def test_duplicate_mnemonic_and_opcode_zero_are_rejected() -> None:
    a = _row("foo", "rd", 0x7E, 1, Unit.scalar, Extension.base, "scalar", 1, "x")
    with pytest.raises(IsaTableError, match="duplicate"):
        validate_table((a, dataclasses.replace(a, fixed=(("opcode", 0x7D),))))
    with pytest.raises(IsaTableError, match="reserved"):
        validate_table((dataclasses.replace(a, fixed=(("opcode", 0),)),))


def test_dtype_list_must_match_dtype_operand() -> None:
    row = _row("foo", "rd, dtype", 0x7E, None, Unit.scalar, Extension.base, "scalar", 1, "x")
    with pytest.raises(IsaTableError, match="dtypes"):
        validate_table((row,))


def test_unknown_and_fixed_fields_cannot_be_operands() -> None:
    with pytest.raises(IsaTableError, match="unknown field"):
        parse_operands("rd, bogus")
    with pytest.raises(IsaTableError, match="fixed"):
        parse_operands("opcode")


def test_memory_operand_form_parses_into_two_fields() -> None:
    (op,) = parse_operands("imm(rs1)")
    assert [f.name for f in op.fields] == ["imm", "rs1"]
    assert BY_MNEMONIC["lw"].syntax == "lw rd, imm(rs1)"
