"""The builder's instructions encoded with numpy per ISA row (`link._encode_row`) against the table's own
scalar encoder (`isa.make` + `isa.encode`), with operands in every form the builder takes: plain ints and enum
names (the vectorised path), enum members, numpy ints and symbols (the general path) mixed in one row, and a
bad operand among many good ones reported at its own line, as the general path reports it."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assembler import AssemblyError, ProgramBuilder
from assembler.builder import builder_method_name
from assembler.link import _encode_row
from assembler.operands import ENUM_TEXT
from isa import BY_MNEMONIC, INSTRUCTIONS, Kind, encode, make
from isa.fields import ENUM_KINDS

ROWS = [spec for spec in INSTRUCTIONS if not any(f.kind in (Kind.target, Kind.loop_end) for f in spec.fields)]


@st.composite
def operands(draw: st.DrawFn, spec) -> tuple[list[tuple[str, object]], list[int]]:
    """Per field (form, builder argument), and the field values they stand for."""
    args, values = [], []
    for field in spec.fields:
        if field.kind in ENUM_KINDS:
            names = ENUM_TEXT[field.kind]
            allowed = [int(d) for d in spec.dtypes] if field.name == "dtype" and spec.dtypes else list(names)
            value = draw(st.sampled_from(allowed))
            form = draw(st.sampled_from(["name", "name", "member", "int"]))
            arg = {"name": names[value], "member": ENUM_KINDS[field.kind](value), "int": value}[form]
        else:
            value = draw(st.integers(*field.value_range))
            forms = ["int", "int", "numpy"] + ([] if field.kind in (Kind.xreg, Kind.vreg) else ["symbol"])
            form = draw(st.sampled_from(forms))
            arg = np.int64(value) if form == "numpy" else value
        args.append((form, arg))
        values.append(value)
    return args, values


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_columns_encode_as_the_table_does(data: st.DataObject) -> None:
    specs = data.draw(st.lists(st.sampled_from(ROWS), min_size=1, max_size=60))
    b = ProgramBuilder()
    expected = []
    for k, spec in enumerate(specs):
        forms, values = data.draw(operands(spec))
        args = []
        for i, (form, arg) in enumerate(forms):
            if form == "symbol":  # the general path, and a new run after the .equ
                arg = b.equ(f"s{k}_{i}", arg)
            args.append(arg)
        getattr(b, builder_method_name(spec))(*args)
        expected.append(encode(make(spec.mnemonic, *values)))
    assert list(b.build().text) == expected


@pytest.mark.parametrize("bad", [1 << 40, -1, True, 2.5, "nosuch"])
def test_a_bad_operand_among_plain_ones_is_reported_at_its_line(bad: object) -> None:
    b = ProgramBuilder()
    for i in range(300):
        b.addi(1 + i % 30, 2, i)
    b.addi(3, bad, 7)
    line = sys._getframe().f_lineno - 1
    for i in range(300):
        b.addi(4, 5, i)
    with pytest.raises(AssemblyError) as info:
        b.build()
    (diag,) = info.value.diagnostics
    assert diag.line == line and "rs1" in diag.message + diag.hint + diag.source


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_columns_of_enum_members_encode_as_the_table_does(data: st.DataObject) -> None:
    """A row whose enum operands are all members (as generators pass `Activation.none`): by name, vectorised,
    the words the table's encoder makes."""
    spec = data.draw(st.sampled_from([s for s in ROWS if any(f.kind in ENUM_KINDS for f in s.fields)]))
    b = ProgramBuilder()
    expected = []
    for _ in range(data.draw(st.integers(1, 8))):
        _, values = data.draw(operands(spec))
        args = [ENUM_KINDS[f.kind](v) if f.kind in ENUM_KINDS else v for f, v in zip(spec.fields, values, strict=True)]
        getattr(b, builder_method_name(spec))(*args)
        expected.append(encode(make(spec.mnemonic, *values)))
    assert list(b.build().text) == expected


@pytest.mark.parametrize("mnemonic", ["nop", "addi"])
def test_a_row_of_mixed_operand_counts_is_left_to_the_general_path(mnemonic: str) -> None:
    """Operand tuples of different lengths (one of them the row's count, even none) are never encoded as plain:
    the general path reports the count."""
    spec = BY_MNEMONIC[mnemonic]
    right = tuple(range(1, len(spec.fields) + 1))
    _, plain = _encode_row(spec, [right, (*right, 1)], np.arange(2), {})
    assert not plain.any()
