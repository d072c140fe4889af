"""Inputs that once made the assembler run without bound or crash: growing `.equ` integers, deep expressions and
`.equ` chains, huge literals, a syntax error Lark's example matcher choked on, and binaries the loader must
refuse because their listing could not re-assemble to the same bytes."""

from __future__ import annotations

import time
import zlib

import pytest

from assembler import AssemblyError, BinaryFormatError, assemble, disassemble, from_bytes, to_bytes
from assembler.binary import HEADER
from assembler.link import MAX_EQU_DEPTH
from assembler.objfile import Section, Symbol
from assembler.operands import EXPR_BITS


def _error(source: str) -> str:
    start = time.monotonic()
    with pytest.raises(AssemblyError) as caught:
        assemble(source)
    assert time.monotonic() - start < 10
    return str(caught.value)


def test_repeatedly_squared_equ_values_are_bounded() -> None:
    lines = [".equ a0, 3", *(f".equ a{i}, a{i - 1} * a{i - 1}" for i in range(1, 40))]
    assert f"wider than {EXPR_BITS} bits" in _error("\n".join([*lines, ".text", "li x1, a39", "halt"]))


def test_a_diamond_of_equs_used_in_layout_is_evaluated_once_each() -> None:
    lines = [".equ d0, 1", *(f".equ d{i}, d{i - 1} + d{i - 1} - d{i - 1}" for i in range(1, 60))]
    obj = assemble("\n".join([*lines, ".data", ".zero d59", ".text", "li x1, d59", "halt"]))
    assert len(obj.data) == 1


def test_a_thousand_term_sum_assembles() -> None:
    obj = assemble(".text\nli x1, " + " + ".join(["1"] * 1000) + "\nhalt\n")
    assert len(obj.text) == 2


def test_a_long_equ_chain_is_a_clear_error() -> None:
    lines = [".equ e0, 1", *(f".equ e{i}, e{i - 1} + 1" for i in range(1, 3000))]
    message = _error("\n".join([*lines, ".text", "li x1, e2999", "halt"]))
    assert f"more than {MAX_EQU_DEPTH} other .equ symbols" in message
    short = [".equ e0, 1", *(f".equ e{i}, e{i - 1} + 1" for i in range(1, MAX_EQU_DEPTH // 2))]
    assert assemble("\n".join([*short, ".text", f"li x1, e{MAX_EQU_DEPTH // 2 - 1}", "halt"]))


@pytest.mark.parametrize("literal", ["0x" + "f" * 4000, "9" * 2000, "0b" + "1" * 200], ids=["hex", "dec", "bin"])
def test_huge_literals_are_ordinary_errors(literal: str) -> None:
    assert f"wider than {EXPR_BITS} bits" in _error(f".text\nli x1, {literal}\nhalt\n")


def test_a_literal_beyond_pythons_digit_limit_is_an_ordinary_error() -> None:
    assert "error" in _error(".text\nli x1, " + "9" * 5000 + "\nhalt\n")


def test_a_syntax_error_after_a_label_is_a_diagnostic() -> None:
    assert "syntax error" in _error(".text\nstart: addi x1, x2, 3 4\nhalt\n")


def _reseal(blob: bytes) -> bytes:
    crc = HEADER.size - 4
    out = bytearray(blob)
    out[crc : crc + 4] = b"\0\0\0\0"
    out[crc : crc + 4] = zlib.crc32(out).to_bytes(4, "little")
    return bytes(out)


def test_the_loader_refuses_branch_targets_outside_the_program() -> None:
    obj = assemble(".text\nstart: beq x0, x0, start\nhalt\n")
    far = assemble(".text\nbeq x0, x0, end\nnop\nnop\nnop\nend: halt\n").text[0]
    blob = to_bytes(obj)
    at = blob.index(obj.text[0].to_bytes(8, "little"))
    bad = _reseal(blob[:at] + far.to_bytes(8, "little") + blob[at + 8 :])
    with pytest.raises(BinaryFormatError, match=r"target 4 is outside \[0, 2\]"):
        from_bytes(bad)


def test_the_loader_refuses_symbols_out_of_address_order() -> None:
    obj = assemble(".text\na: nop\nb: halt\n")
    swapped = type(obj)(obj.text, obj.data, obj.data_base, (Symbol("b", Section.text, 1), Symbol("a", Section.text, 0)))
    with pytest.raises(BinaryFormatError, match="out of address order"):
        to_bytes(swapped)
    assert to_bytes(assemble(disassemble(obj))) == to_bytes(obj)
