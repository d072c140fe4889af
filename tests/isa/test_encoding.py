"""Encoding round trips for every row, and decoding rejects what is not an instruction."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from isa import BY_MNEMONIC, INSTRUCTIONS, EncodingError, Instruction, decode, encode, make
from isa.fields import FIELDS


@st.composite
def instructions(draw: st.DrawFn) -> Instruction:
    spec = draw(st.sampled_from(INSTRUCTIONS))
    values = []
    for field in spec.fields:
        if field.name == "dtype" and spec.dtypes:
            values.append(int(draw(st.sampled_from(spec.dtypes))))
        else:
            lo, hi = field.value_range
            values.append(draw(st.integers(lo, hi)))
    return make(spec.mnemonic, *values)


@given(instructions())
def test_decode_inverts_encode_for_every_row(instruction: Instruction) -> None:
    word = encode(instruction)
    assert 0 <= word < 1 << 64
    decoded = decode(word)
    assert decoded.spec is instruction.spec
    normalised = tuple(
        v - (1 << 32) if f.kind.value == "imm32" and v >= 1 << 31 else v
        for f, v in zip(instruction.spec.fields, instruction.values, strict=True)
    )
    assert decoded.values == normalised


def test_each_row_decodes_to_itself_with_zero_operands() -> None:
    for spec in INSTRUCTIONS:
        values = [
            int(spec.dtypes[0]) if f.name == "dtype" and spec.dtypes else max(f.value_range[0], 0) for f in spec.fields
        ]
        assert decode(encode(make(spec.mnemonic, *values))).spec is spec


def test_all_zero_word_is_illegal() -> None:
    with pytest.raises(EncodingError, match="not a valid instruction"):
        decode(0)


def test_reserved_bits_are_rejected() -> None:
    word = encode(make("add", 1, 2, 3)) | (1 << 63)
    with pytest.raises(EncodingError, match="reserved bits"):
        decode(word)


def test_dtype_not_allowed_by_the_row_is_rejected_on_decode() -> None:
    word = encode(make("v.add", 1, 2, 3, 16, 0))
    bad = word | (3 << FIELDS["dtype"].lo)  # dtype code 3 is unassigned
    with pytest.raises(EncodingError, match="dtype"):
        decode(bad)
    exp_on_i8 = encode(make("v.exp", 1, 2, 16, 2)) & ~(3 << FIELDS["dtype"].lo)
    with pytest.raises(EncodingError, match="dtype must be one of f32"):
        decode(exp_on_i8)


@pytest.mark.parametrize(
    ("mnemonic", "values", "message"),
    [
        ("add", (32, 0, 0), r"rd=32 out of range \[0, 31\]"),
        ("addi", (1, 2, 1 << 30), r"imm=1073741824 out of range"),
        ("vc.add", (8, 0, 0), r"vd=8 out of range \[0, 7\]"),
        ("v.add", (1, 2, 3, 1 << 16, 0), r"n=65536 out of range \[0, 65535\]"),
        ("v.exp", (1, 2, 16, 0), r"dtype must be one of f32"),
    ],
)
def test_make_range_checks_every_operand(mnemonic: str, values: tuple[int, ...], message: str) -> None:
    with pytest.raises(EncodingError, match=message):
        make(mnemonic, *values)


def test_make_rejects_unknown_mnemonic_and_wrong_arity() -> None:
    with pytest.raises(EncodingError, match="unknown mnemonic"):
        make("vadd", 1)
    with pytest.raises(EncodingError, match="expected 3 field values"):
        make("add", 1, 2)


def test_signed_fields_keep_their_sign() -> None:
    assert decode(encode(make("beq", 1, 2, -7))).values == (1, 2, -7)
    assert decode(encode(make("li", 3, 0xFFFFFFFF))).values == (3, -1)
    assert BY_MNEMONIC["bz.tile"].fields[-1].signed
