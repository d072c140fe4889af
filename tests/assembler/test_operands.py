"""Parser and encoder: every operand kind, expressions, directives and kernels, checked against isa.make/encode."""

from __future__ import annotations

import struct

import pytest

from assembler import Section, assemble
from assembler.disasm import statement_text
from isa import BY_MNEMONIC, Counter, DType, Kind, Unit, encode, make


def words(source: str) -> list[int]:
    return list(assemble(source).text)


def word(mnemonic: str, *values: int) -> int:
    return encode(make(mnemonic, *values))


def f32_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


@pytest.mark.parametrize(
    ("line", "mnemonic", "values"),
    [
        ("add x1, x2, x31", "add", (1, 2, 31)),
        ("add zero, x0, zero", "add", (0, 0, 0)),
        ("addi x3, x4, -1073741824", "addi", (3, 4, -(1 << 30))),
        ("addi x3, x4, 0x3fff_ffff", "addi", (3, 4, (1 << 30) - 1)),
        ("addi x3, x4, 0b1010", "addi", (3, 4, 10)),
        ("li x5, 4294967295", "li", (5, (1 << 32) - 1)),
        ("li x5, -2147483648", "li", (5, -(1 << 31))),
        ("loopi 65535, 1", "loopi", (65535, 1)),
        ("vc.add v7, v0, v3", "vc.add", (7, 0, 3)),
        ("vc.add.vs v1, v2, x9", "vc.add.vs", (1, 2, 9)),
        ("v.add.vr x1, x2, x3, 64, 8, i32", "v.add.vr", (1, 2, 3, 64, 8, int(DType.i32))),
        ("v.div x1, x2, x3, 4, f32", "v.div", (1, 2, 3, 4, int(DType.f32))),
        ("v.cvt x1, x2, 16, i32, f32", "v.cvt", (1, 2, 16, int(DType.i32), int(DType.f32))),
        ("sync.push ld, mx", "sync.push", (int(Unit.load), int(Unit.matrix))),
        ("sync.pop vector, store", "sync.pop", (int(Unit.vector), int(Unit.store))),
        ("rdcnt x1, dram_read_bytes", "rdcnt", (1, int(Counter.dram_read_bytes))),
        ("ep.cfg x1, x2, x3, 7, gelu, bias_res, f32", "ep.cfg", (1, 2, 3, 7, 2, 3, int(DType.f32))),
        ("lw x1, -8(x2)", "lw", (1, -8, 2)),
        ("sw x3, 4 * 4(zero)", "sw", (3, 16, 0)),
        ("jalr x1, 0(x5)", "jalr", (1, 0, 5)),
        ("dma.ld x1, x2, x3, 4095, 4095, i8", "dma.ld", (1, 2, 3, 4095, 4095, int(DType.i8))),
        ("nop", "nop", ()),
        ("halt", "halt", ()),
    ],
)
def test_each_operand_kind_encodes_like_isa_make(line: str, mnemonic: str, values: tuple[int, ...]) -> None:
    assert words(line) == [word(mnemonic, *values)]


def test_every_row_of_the_table_assembles_with_its_syntax_line() -> None:
    """The syntax string of every row, with fields replaced by valid values, assembles to isa.make's word."""
    by_kind = {
        Kind.xreg: ("x7", 7),
        Kind.vreg: ("v5", 5),
        Kind.unit: ("st", int(Unit.store)),
        Kind.counter: ("macs", int(Counter.macs)),
        Kind.act: ("relu", 1),
        Kind.epflags: ("res", 2),
        Kind.target: ("1", 1),
        Kind.loop_end: ("1", 1),
    }
    for spec in BY_MNEMONIC.values():
        pairs = []
        for field in spec.fields:
            if field.kind is Kind.dtype:
                dtype = spec.dtypes[-1] if field.name == "dtype" else DType.i32
                pairs.append((dtype.name, int(dtype)))
            else:
                pairs.append(by_kind.get(field.kind, ("3", 3)))
        line = statement_text(spec, [text for text, _ in pairs])
        assert words(line) == [word(spec.mnemonic, *(value for _, value in pairs))], line


def test_fp32_literals_give_their_bits() -> None:
    source = "li x1, 1.5\nli x2, -0.0\nli x3, 1e-3\nli x4, -2.5e2\n.equ S, 0.125\nli x5, S * 2\nli x6, 1.0 / 3"
    expected = [1.5, -0.0, 1e-3, -250.0, 0.25, 1.0 / 3]
    assert words(source) == [word("li", i + 1, f32_bits(v)) for i, v in enumerate(expected)]


def test_constant_expressions_follow_c_precedence_and_truncate() -> None:
    exprs = [
        "1 + 2 * 3",
        "(1 + 2) * 3",
        "1 << 4 | 3",
        "0xff & ~0xf",
        "6 ^ 3",
        "-7 / 2",
        "-7 % 3",
        "7 % -3",
        "100 >> 2 - 1",
        "16*4",
        "-(3)",
        "+5",
        "~0",
    ]
    expected = [7, 9, 19, 0xF0, 5, -3, -1, 1, 50, 64, -3, 5, -1]
    source = "\n".join(f"addi x1, x0, {e}" for e in exprs)
    assert words(source) == [word("addi", 1, 0, v) for v in expected]


def test_branch_targets_are_pc_relative_labels_or_absolute_indices() -> None:
    source = """
    start:
        nop
    loop:   beq x1, x2, start      # pc 1 -> 0
        bne x1, x2, end            # pc 2 -> 6
        jal x1, loop + 1           # pc 3 -> 2
        bz.tile x3, 64, i8, end    # pc 4 -> 6
        blt x1, x2, 2 * 3          # pc 5 -> 6
    end:
        halt
    """
    assert words(source) == [
        word("nop"),
        word("beq", 1, 2, -1),
        word("bne", 1, 2, 4),
        word("jal", 1, -1),
        word("bz.tile", 3, 64, 0, 2),
        word("blt", 1, 2, 1),
        word("halt"),
    ]


def test_loop_end_is_forward_and_pc_relative() -> None:
    source = "loopi 8, body_end\n add x1, x1, x2\n add x1, x1, x3\nbody_end: loop x4, done\ndone: halt"
    assert words(source) == [
        word("loopi", 8, 3),
        word("add", 1, 1, 2),
        word("add", 1, 1, 3),
        word("loop", 4, 1),
        word("halt"),
    ]


def test_data_directives_layout_and_labels() -> None:
    obj = assemble(
        """
        .data_base 0x1000
        .text
        go: dispatch x1, table, 2
        stop: halt
        .data
        bytes: .i8 1, -1, 255, 0
        .align 4
        table: .word go, stop
        floats: .f32 1.5, -2
        gap: .zero 3
        tail: .i32 -1
        .text
        nop
        """
    )
    assert obj.data_base == 0x1000
    expected = bytes([1, 255, 255, 0]) + struct.pack("<II", 0, 1) + struct.pack("<ff", 1.5, -2.0) + bytes(3)
    expected += struct.pack("<i", -1)
    assert obj.data == expected
    symbols = {s.name: (s.section, s.value) for s in obj.symbols}
    assert symbols == {
        "go": (Section.text, 0),
        "stop": (Section.text, 1),
        "bytes": (Section.data, 0x1000),
        "table": (Section.data, 0x1004),
        "floats": (Section.data, 0x100C),
        "gap": (Section.data, 0x1014),
        "tail": (Section.data, 0x1017),
    }
    assert obj.text == (word("dispatch", 1, 0x1004, 2), word("halt"), word("nop"))


def test_local_labels_and_equ_constants_are_not_symbols() -> None:
    obj = assemble(".equ N, 4\n.Lloop: addi x1, x1, N\nbne x1, x2, .Lloop\nkeep: halt")
    assert [s.name for s in obj.symbols] == ["keep"]
    assert obj.text[1] == word("bne", 1, 2, -1)


def test_label_arithmetic_in_equ_and_data() -> None:
    obj = assemble("start: nop\nnop\nnop\nend: halt\n.equ LEN, end - start\naddi x1, x0, LEN\n.data\n.i32 LEN * 2")
    assert obj.text[4] == word("addi", 1, 0, 3)
    assert obj.data == struct.pack("<i", 6)


def test_kernel_metadata_travels_into_the_object() -> None:
    obj = assemble(
        """
        .equ N, 64
        setup: nop
        .kernel gemm_relu
        .input a: i8[N, N] @ a_buf
        .input w: i8[N, N] @ a_buf + N * N
        .output c: i8[N] @ 0x200
        .attr sparsity dense
        .attr config "tile=64 x 64"
        .attr version 3
        body: mx.preload x1, 64, 64, i8
        mx.mm x2, x3, 64
        .endkernel
        halt
        .data
        a_buf: .zero 8192
        """
    )
    (kernel,) = obj.kernels
    assert (kernel.name, kernel.start, kernel.end) == ("gemm_relu", 1, 3)
    assert [(t.name, t.dtype, t.shape, t.address) for t in kernel.inputs] == [
        ("a", DType.i8, (64, 64), 0),
        ("w", DType.i8, (64, 64), 4096),
    ]
    assert [(t.name, t.shape, t.address) for t in kernel.outputs] == [("c", (64,), 0x200)]
    assert kernel.attrs == (("sparsity", "dense"), ("config", "tile=64 x 64"), ("version", "3"))
    assert kernel.attr("sparsity") == "dense"


def test_comments_blank_lines_crlf_and_several_labels_per_line() -> None:
    source = "# header\r\n\r\n  ; another\r\na: b: add x1, x2, x3 # trailing\r\n\tnop ; trailing\r\nc:\r\n"
    obj = assemble(source)
    assert obj.text == (word("add", 1, 2, 3), word("nop"))
    assert [(s.name, s.value) for s in obj.symbols] == [("a", 0), ("b", 0), ("c", 2)]


def test_enum_names_are_accepted_only_where_allowed() -> None:
    assert words("sync.push sc, st") == [word("sync.push", 0, 4)]
    assert words("sync.push scalar, store") == [word("sync.push", 0, 4)]
    assert words("relu: jal x1, relu") == [word("jal", 1, 0)]  # a label may share an enum's name
