"""ProgramBuilder: generated from the table, and byte-identical to the text path."""

from __future__ import annotations

import keyword
import sys

import numpy as np
import pytest

from assembler import AssemblyError, ProgramBuilder, assemble, to_bytes
from assembler.builder import builder_method_name
from isa import INSTRUCTIONS, Activation, DType, EpilogueFlags, Unit

FUSED_SOURCE = """
.equ N, 16
.text
.kernel fused_gemm
.input a: i8[N, N] @ a_tile
.input w: i8[N, N] @ w_tile
.output y: i8[N, N] @ y_tile
.attr sparsity dense
        li x1, a_tile
        li x2, w_tile
        li x9, 0.5
        addi x3, zero, N
        dma.ldt x4, x2, x3, N, N, i8         # weights arrive transposed
        dma.ld x5, x1, x3, N, N, i8
        sync.push ld, mx
        sync.pop ld, mx
        bz.tile x5, N * N, i8, skip          # all-zero activations: skip the matmul
        mx.preload x4, N, N, i8
        mx.mm x6, x5, N
        ep.cfg x7, zero, x8, 7, relu, bias, i8
        mx.drain x10, x6, N, N
        mx.mms x5, N                          # stream rows to the vector unit
        vc.lds v1, N * N
        vc.relu v2, v1
        vc.mul.vs v3, v2, x9
        vc.st x11, v3
skip:   lw x12, 0(zero)
        dispatch x12, table, 2
case0:  halt
case1:  nop
.endkernel
        halt
.data
a_tile: .i8 1, -2, 3, -4
        .zero 252
w_tile: .zero 256
y_tile: .zero 256
        .align 4
table:  .word case0, case1
scales: .f32 0.5, -1.25
"""


def fused_builder() -> ProgramBuilder:
    b = ProgramBuilder()
    b.equ("N", 16)
    b.text()
    inputs = [("a", "i8", ("N", "N"), "a_tile"), ("w", DType.i8, (16, 16), "w_tile")]
    with b.kernel("fused_gemm", inputs=inputs, outputs=[("y", "i8", (16, 16), "y_tile")], attrs={"sparsity": "dense"}):
        b.li(1, "a_tile").li(2, "w_tile").li(9, 0.5)
        b.addi(rd=3, rs1="zero", imm="N")
        b.dma_ldt(4, 2, 3, 16, 16, "i8")
        b.dma_ld(rd=5, rs1=1, rs2=3, rows=16, cols=16, dtype=DType.i8)
        b.sync_push(Unit.load, Unit.matrix)
        b.sync_pop("ld", "mx")
        b.bz_tile(5, 256, "i8", "skip")
        b.mx_preload(4, 16, 16, "i8")
        b.mx_mm(6, 5, 16)
        b.ep_cfg(7, 0, 8, 7, Activation.relu, EpilogueFlags.bias, "i8")
        b.mx_drain(10, 6, 16, 16)
        b.mx_mms(5, 16)
        b.vc_lds(1, 256)
        b.vc_relu(2, 1)
        b.vc_mul_vs(3, 2, 9)
        b.vc_st(11, 3)
        b.label("skip")
        b.lw(12, 0, 0)
        b.dispatch(12, "table", 2)
        b.label("case0")
        b.halt()
        b.label("case1")
        b.nop()
    b.halt()
    b.data()
    b.label("a_tile")
    b.i8(np.array([1, -2, 3, -4], dtype=np.int8))
    b.zero(252)
    b.label("w_tile")
    b.zero(256)
    b.label("y_tile")
    b.zero(256)
    b.align(4)
    b.label("table")
    b.word("case0", "case1")
    b.label("scales")
    b.f32(np.array([0.5, -1.25]))
    return b


def test_object_api_gives_the_same_bytes_as_text() -> None:
    from_text = assemble(FUSED_SOURCE)
    from_builder = fused_builder().build()
    assert from_builder == from_text
    assert to_bytes(from_builder) == to_bytes(from_text)
    assert from_text.kernels[0].inputs[0].shape == (16, 16)


def test_one_generated_method_per_row_with_its_syntax_as_doc() -> None:
    for spec in INSTRUCTIONS:
        method = getattr(ProgramBuilder, builder_method_name(spec))
        assert spec.syntax in method.__doc__
        assert not keyword.iskeyword(method.__name__)
    assert builder_method_name(INSTRUCTIONS[2]) == "and_"  # Python keywords get a trailing underscore


def test_instr_by_mnemonic_matches_generated_method() -> None:
    a, b = ProgramBuilder(), ProgramBuilder()
    a.instr("v.add.vs", 1, 2, 3, n=64, dtype="f32")
    b.v_add_vs(1, 2, 3, 64, DType.f32)
    assert a.build() == b.build()


def test_an_emitter_gives_its_methods_bytes_and_reports_at_the_line_that_made_it() -> None:
    a, b = ProgramBuilder(), ProgramBuilder()
    a.li(1, 7).v_add_vs(1, 2, 3, 64, "f32").li(2, 9)
    li = b.emitter("li")  # the line an emitter's instructions are reported at
    li(1, 7)
    b.emitter("v_add_vs")(1, 2, 3, 64, "f32")
    li(2, 9)
    assert a.build() == b.build()
    li(1, 1 << 40)
    with pytest.raises(AssemblyError) as info:
        b.build()
    assert 'li = b.emitter("li")' in info.value.diagnostics[0].source
    with pytest.raises(AssemblyError, match="no instruction method 'v.add.vs'"):
        b.emitter("v.add.vs")


def test_numpy_data_is_range_checked_and_encoded_like_text() -> None:
    values = np.arange(-128, 256, dtype=np.int32)
    b = ProgramBuilder()
    b.data().i8(values).i32(np.array([-1, 2**32 - 1], dtype=np.int64))
    text = ".data\n.i8 " + ", ".join(map(str, values)) + "\n.i32 -1, 4294967295\n"
    assert b.build().data == assemble(text).data
    image = bytes(range(256)) * 3  # one bytes object: the section's bytes as they are, the object itself kept
    b = ProgramBuilder()
    b.data().i8(image)
    assert b.build().data == assemble(".data\n.i8 " + ", ".join(map(str, image)) + "\n").data
    assert ProgramBuilder().data().i8(image).build().data is image
    with pytest.raises(AssemblyError, match=r"outside \[-128, 255\]"):
        ProgramBuilder().data().i8(np.array([256]))
    with pytest.raises(AssemblyError, match="too large for single precision"):
        ProgramBuilder().data().f32(np.array([1e40]))


def test_errors_point_at_the_python_line_that_emitted_them() -> None:
    b = ProgramBuilder()
    b.label("top")
    b.beq(1, 2, "tpo")  # the line reported
    b.add(1, 2, 40)
    with pytest.raises(AssemblyError) as info:
        b.build()
    first, second = info.value.diagnostics
    assert first.file == __file__ and 'b.beq(1, 2, "tpo")' in first.source
    assert "unknown symbol 'tpo'" in first.message and "'top'" in first.hint
    assert second.line == first.line + 1 and "rs2=40 out of range" in second.message


def test_call_shape_errors_are_raised_at_the_call() -> None:
    b = ProgramBuilder()
    with pytest.raises(AssemblyError, match="missing operand.*rs2") as info:
        b.add(1, 2)
    assert info.value.diagnostics[0].file == __file__
    with pytest.raises(AssemblyError, match="has no operand 'rx'"):
        b.add(1, 2, rx=3)
    with pytest.raises(AssemblyError, match="given twice"):
        b.add(1, 2, 3, rd=1)
    with pytest.raises(AssemblyError, match="unknown mnemonic"):
        b.instr("addd", 1, 2, 3)


def test_wrong_enum_and_register_values_are_diagnosed_at_build() -> None:
    b = ProgramBuilder()
    b.sync_push(DType.i8, "mx")
    b.v_exp(1, 2, 8, "i8")
    b.add("x1", "v2", 3)
    with pytest.raises(AssemblyError) as info:
        b.build()
    messages = [d.message for d in info.value.diagnostics]
    assert "expected a unit name for src" in messages[0]
    assert "dtype i8 is not allowed for v.exp" in messages[1]
    assert "got 'v2'" in messages[2]


def test_numpy_scalars_are_accepted_like_ints() -> None:
    a, b = ProgramBuilder(), ProgramBuilder()
    a.v_add(np.int64(1), np.uint8(2), np.int32(3), np.int64(64), "i32").li(4, np.float32(0.5))
    b.v_add(1, 2, 3, 64, "i32").li(4, 0.5)
    assert to_bytes(a.build()) == to_bytes(b.build())


def test_data_base_and_kernel_metadata_errors_point_at_the_with_line() -> None:
    b = ProgramBuilder(data_base=0x100)
    b.data().label("buf")
    b.i32(7)
    b.text()
    with b.kernel("k", inputs=[("t", "q8", (2,), "buf")]):  # the line reported
        b.nop()
    with pytest.raises(AssemblyError) as info:
        b.build()
    (diag,) = info.value.diagnostics
    assert "unknown dtype 'q8'" in diag.message and "with b.kernel(" in diag.source
    ok = ProgramBuilder(data_base=0x100)
    ok.data().label("buf")
    ok.i32(7)
    assert to_bytes(ok.build()) == to_bytes(assemble(".data_base 0x100\n.data\nbuf: .i32 7"))


def test_an_instruction_emitted_in_a_loop_is_reported_at_the_line_of_its_call() -> None:
    """The builder keeps (code, bytecode offset) per instruction and finds the line only for a diagnostic: the
    line found is the one `frame.f_lineno` gives at the call, for each of several calls on different lines."""
    b = ProgramBuilder()
    lines = []
    for i in range(3):
        b.addi(1, 1, 1)
        if i == 1:
            lines.append(sys._getframe().f_lineno + 1)
            b.addi(1, 40, 1)
        b.nop()
    lines.append(sys._getframe().f_lineno + 1)
    b.add(1, 2, 40)
    with pytest.raises(AssemblyError) as info:
        b.build()
    assert [d.line for d in info.value.diagnostics] == lines
    assert all(d.file == __file__ for d in info.value.diagnostics)


def test_targets_naming_text_labels_encode_like_text() -> None:
    """Loop ends and branches naming text labels (the linker's vectorised path), forward and backward, beside a
    target the general path takes (an absolute index), give the text path's words."""
    source = """
top:    loopi 2, end
        addi x1, x1, 1
end:    beq x1, x2, top
        bne x1, x2, done
        jal x3, 1
done:   halt
"""
    b = ProgramBuilder()
    b.label("top")
    b.loopi(2, "end").addi(1, 1, 1)
    b.label("end")
    b.beq(1, 2, "top").bne(1, 2, "done").jal(3, 1)
    b.label("done")
    b.halt()
    assert b.build() == assemble(source)


def test_a_loop_end_before_its_loop_is_reported() -> None:
    b = ProgramBuilder()
    b.label("back")
    b.nop().loopi(2, "back")
    with pytest.raises(AssemblyError, match="must come after the loop instruction"):
        b.build()
