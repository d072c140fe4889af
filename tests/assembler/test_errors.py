"""Every error class names file:line:col, shows the line with a caret, gives its hint; all errors in one run."""

from __future__ import annotations

import pytest

from assembler import AssemblyError, assemble
from isa.errors import DynfuseError


def error_of(source: str) -> AssemblyError:
    with pytest.raises(AssemblyError) as info:
        assemble(source, "prog.s")
    return info.value


def caret_column(report_lines: list[str], source_line: str) -> int:
    """1-based column the caret under `source_line` points at."""
    index = report_lines.index(f"    {source_line}")
    return report_lines[index + 1].index("^") - 4 + 1


CASES = [
    # (source, line, col, message part, hint part)
    ("nop\n  ad x1, x2, x3", 2, 3, "unknown mnemonic 'ad'", "'add'"),
    ("add x1, x2", 1, 1, "add takes 3 operands, got 2", "syntax: add rd, rs1, rs2"),
    ("addi x1, x2, 1 << 40", 1, 14, "imm=1099511627776 out of range", "[-1073741824, 1073741823]"),
    ("start: nop\nbeq x1, x2, strat", 2, 13, "unknown symbol 'strat'", "did you mean 'start'"),
    ("v.exp x1, x2, 8, i8", 1, 18, "dtype i8 is not allowed for v.exp", "allowed dtypes: f32"),
    ("v.add x1, x2, x3, 8, i16", 1, 22, "unknown dtype 'i16'", "dtype is one of: i8, i32, f32"),
    ("sync.push sc, vec", 1, 15, "unknown unit 'vec'", "did you mean 'vector'? dst is one of: sc, ld, mx, vx, st"),
    ("rdcnt x1, cycles", 1, 11, "unknown counter 'cycles'", "did you mean 'cycle'"),
    ("add x1, x2, 3", 1, 13, "expected a scalar register", "write addi"),
    ("vc.add v1, x2, v3", 1, 12, "expected a vector register v0..v7 for vs1, got 'x2'", "x2 is a scalar register"),
    ("add x1, x32, x3", 1, 9, "got 'x32'", "did you mean"),
    ("lw x1, x2", 1, 8, "expected the memory form imm(rs1)", "syntax: lw rd, imm(rs1)"),
    ("add x1 x2, x3", 1, 5, "missing ',' after 'x1'", "syntax: add rd, rs1, rs2"),
    ("addi x1, x2, (3", 1, 16, "syntax error: unbalanced parentheses", "expected ')'"),
    ("add x1, x2,", 1, 12, "syntax error: operand missing after ','", "expected"),
    ("addi x1, x2, 3 ? 4", 1, 16, "unexpected character '?'", "comments"),
    ("back: loopi 2, back", 1, 16, "loop end 0 must come after", "lend"),
    ("addi x1, x0, 1.5", 1, 14, "fp32 literal 1.5 is not allowed for imm", "only accepted by imm32 operands"),
    ("li x1, 1e39", 1, 8, "too large for single precision", ""),
    ("addi x1, x0, 4 / (2 - 2)", 1, 16, "division by zero", ""),
    ("addi x1, x0, x2 + 1", 1, 14, "register x2 cannot be used in an expression", ""),
    (".equ A, B\n.equ B, A\naddi x1, x0, A", 2, 9, "defined in terms of itself", ""),
    (".txt", 1, 1, "unknown directive '.txt'", "did you mean '.text'"),
    (".data\n.i8 300", 2, 5, ".i8 value 300 out of range", "[-128, 255]"),
    (".i8 1", 1, 1, "data directive in the .text section", "switch to data with .data"),
    (".data\nnop", 2, 1, "instruction in the .data section", "switch back with .text"),
    ("a: nop\na: nop", 2, 1, "symbol 'a' is already defined", ""),
    ("x3: nop", 1, 1, "'x3' is a register name", ""),
    (".kernel k\nnop", 1, 1, "kernel 'k' has no .endkernel", ""),
    (
        ".kernel k\nnop\n.attr a b\n.endkernel",
        3,
        1,
        ".attr must come before the kernel's first instruction",
        "lead the .kernel block",
    ),
    (".input a: i8[4] @ 0", 1, 1, ".input outside a .kernel block", ""),
    (".kernel k\n.input a: q8[4] @ 0\n.endkernel", 2, 11, "unknown dtype 'q8'", "dtypes: i8, i32, f32"),
    (".endkernel", 1, 1, ".endkernel without an open .kernel", ""),
    (".data\n.align 3", 2, 1, "not a power of two", ""),
    (".data\n.zero later\nlater: .i8 0", 2, 7, "'later' must be defined before this line", "only earlier symbols"),
    ("bz.tile x1, 4, i8, 100000", 1, 20, "out of range", "pc-relative offset must be in [-16384, 16383]"),
    ("beq x0, x0, 100000", 1, 13, "target 100000 is outside the program", "text is [0, 1]"),
    (".equ 3, 4", 1, 6, ".equ expects a name here", "syntax: .equ NAME, expr"),
]


@pytest.mark.parametrize(("source", "line", "col", "message", "hint"), CASES)
def test_error_names_position_shows_caret_and_hint(source: str, line: int, col: int, message: str, hint: str) -> None:
    err = error_of(source)
    assert len(err.diagnostics) == 1, err.report()
    (diag,) = err.diagnostics
    assert (diag.file, diag.line, diag.col) == ("prog.s", line, col), err.report()
    assert message in diag.message
    assert hint in diag.hint
    report = str(err).splitlines()
    source_line = source.splitlines()[line - 1]
    assert report[0] == "assembly failed: 1 error"
    assert report[1].startswith(f"prog.s:{line}:{col}: error: ")
    assert caret_column(report, source_line) == col
    if hint:
        assert any(hint in r for r in report if r.strip().startswith("hint:"))
    assert isinstance(err, DynfuseError)


def test_all_errors_of_a_file_are_reported_in_one_run() -> None:
    source = "\n".join(
        [
            "start: nop",
            "  ad x1, x2, x3",  # 2 unknown mnemonic
            "  add x1, x2",  # 3 operand count
            "  addi x1, x2, (3",  # 4 syntax error
            "  beq x1, x2, strat",  # 5 unknown label
            "  v.exp x1, x2, 8, i8",  # 6 wrong dtype
            "  add x1, x2, x3 x4",  # 7 syntax-level missing comma
            "  halt",
        ]
    )
    err = error_of(source)
    assert [d.line for d in err.diagnostics] == [2, 3, 4, 5, 6, 7]
    assert err.report().startswith("assembly failed: 6 errors\n")


def test_syntax_errors_on_several_lines_do_not_hide_each_other() -> None:
    err = error_of("addi x1, x2, (3\nnop\nadd x1,, x2\nbeq x1, x2, nowhere\n: nop")
    assert [(d.line, d.message.startswith("syntax error")) for d in err.diagnostics] == [
        (1, True),
        (3, True),
        (4, False),
        (5, True),
    ]


def test_error_in_tabs_indented_line_keeps_caret_aligned() -> None:
    err = error_of("\tadd x1, x2, foo")
    report = str(err).splitlines()
    assert report[2] == "        add x1, x2, foo"
    assert report[3].index("^") == report[2].index("foo")


def test_absurd_literals_are_ordinary_errors() -> None:
    err = error_of("addi x1, x2, " + "9" * 5000)
    assert err.diagnostics[0].line == 1
    assert assemble("li x1, " + "9" * 400 + ".0").instructions()[0].values == (1, 0x7F800000)  # +inf
