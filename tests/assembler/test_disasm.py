"""Disassembly: readable listing (labels for targets, names for enums and data) that re-assembles identically."""

from __future__ import annotations

from assembler import assemble, disassemble, to_bytes


def listing(source: str) -> list[str]:
    obj = assemble(source)
    text = disassemble(obj)
    assert to_bytes(assemble(text)) == to_bytes(obj)
    return text.splitlines()


def test_targets_print_as_symbols_or_synthesised_local_labels() -> None:
    lines = listing("top: nop\n.Lskip_me: nop\nbeq x1, x2, top\nbne x1, x2, .Lskip_me\nloopi 3, 6\nnop\nhalt")
    assert "top:" in lines and ".L1:" in lines and ".L6:" in lines
    assert "    beq x1, x2, top" in lines
    assert "    bne x1, x2, .L1" in lines
    assert "    loopi 3, .L6" in lines
    assert lines.index(".L6:") == lines.index("    halt") - 1


def test_enums_registers_memory_form_and_data_names() -> None:
    lines = listing(
        "sync.pop ld, mx\nrdcnt x3, macs\nsw x1, -4(zero)\nep.cfg x1, x2, x3, 0, tanh, res, f32\n"
        "dispatch x1, tbl, 2\n.data\n.i8 1\ntbl: .word 0, 1"
    )
    assert lines[1:6] == [
        "    sync.pop ld, mx",
        "    rdcnt x3, macs",
        "    sw x1, -4(x0)",
        "    ep.cfg x1, x2, x3, 0, tanh, res, f32",
        "    dispatch x1, tbl, 2",
    ]
    assert lines[6:] == [".data", "    .i8 1", "tbl:", "    .i8 0, 0, 0, 0, 1, 0, 0, 0"]


def test_kernels_data_base_and_quoted_attributes_survive() -> None:
    source = (
        '.data_base 0x100\n.kernel a\n.attr mode "two words"\n.endkernel\n.kernel b\n'
        ".input t: i32[2, 3] @ buf\nnop\n.endkernel\n.data\nbuf: .i32 7"
    )
    lines = listing(source)
    assert lines[:8] == [
        ".data_base 0x100",
        ".text",
        ".kernel a",
        '.attr mode "two words"',
        ".endkernel",
        ".kernel b",
        ".input t: i32[2, 3] @ buf",
        "    nop",
    ]


def test_fp32_immediates_carry_a_readable_note() -> None:
    lines = listing("li x1, 0.5\nli x2, -1\nli x3, 123456789")
    assert lines[1:] == ["    li x1, 1056964608  # fp32 0.5", "    li x2, -1", "    li x3, 123456789"]
