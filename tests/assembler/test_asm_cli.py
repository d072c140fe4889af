"""`dynfuse asm` / `dynfuse disasm`: exit codes, summaries, clear messages and never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from assembler import assemble, load, to_bytes
from dynfuse.cli import main

PROGRAM = """
.text
.kernel k
.attr sparsity dense
start:  li x1, table
        lw x2, 0(x1)
        vc.ld v1, x3, 64, f32
        vc.exp v2, v1
        vc.st x4, v2
.endkernel
        halt
.data
table:  .word start
"""


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_asm_writes_binary_and_prints_one_line_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "prog.s"
    source.write_text(PROGRAM)
    code, out, _ = run(["asm", str(source), "-o", str(tmp_path / "prog.bin")], capsys)
    assert code == 0
    assert out.strip().endswith("6 instructions, 4 data bytes, 1 kernel, extensions: base, fusion")
    assert load(tmp_path / "prog.bin") == assemble(PROGRAM)


def test_asm_default_output_is_next_to_the_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "prog.s"
    source.write_text(PROGRAM)
    assert run(["asm", str(source)], capsys)[0] == 0
    assert (tmp_path / "prog.bin").exists()


def test_disasm_to_stdout_and_file_reassembles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "prog.bin"
    binary.write_bytes(to_bytes(assemble(PROGRAM)))
    code, out, _ = run(["disasm", str(binary)], capsys)
    assert code == 0 and ".kernel k" in out and "start:" in out
    assert to_bytes(assemble(out)) == binary.read_bytes()
    listing = tmp_path / "out.s"
    assert run(["disasm", str(binary), "-o", str(listing)], capsys)[0] == 0
    assert listing.read_text() == out


def test_check_ext_base_rejects_fusion_instructions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "prog.s"
    source.write_text(PROGRAM)
    code, _, err = run(["asm", str(source), "--check-ext", "base"], capsys)
    assert code == 1
    assert "instruction 2 (start+2): vc.ld belongs to the fusion extension" in err
    assert not (tmp_path / "prog.bin").exists()
    assert run(["asm", str(source), "--check-ext", "base", "--check-ext", "fusion"], capsys)[0] == 0


def test_source_errors_exit_one_with_the_full_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "bad.s"
    source.write_text("nop\n  ad x1, x2, x3\n  add x1, x2\n")
    code, _, err = run(["asm", str(source)], capsys)
    assert code == 1
    assert f"{source}:2:3: error: unknown mnemonic 'ad'" in err
    assert f"{source}:3:3: error: add takes 3 operands, got 2" in err
    assert err.startswith("error: assembly failed: 2 errors\n")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "truncated header"),
        (b"\x7fELF" + bytes(60), "not a dynfuse binary"),
        (b"\xff\xfe not text", "not a dynfuse binary"),
    ],
)
def test_disasm_of_bad_files_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    path = tmp_path / "x.bin"
    path.write_bytes(content)
    code, _, err = run(["disasm", str(path)], capsys)
    assert code == 1 and message in err


def test_missing_files_and_non_utf8_sources(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["asm", str(tmp_path / "nope.s")], capsys)
    assert code == 1 and "No such file" in err
    code, _, err = run(["disasm", str(tmp_path / "nope.bin")], capsys)
    assert code == 1 and "No such file" in err
    latin = tmp_path / "latin.s"
    latin.write_bytes(b"nop # caf\xe9\n")
    code, _, err = run(["asm", str(latin)], capsys)
    assert code == 1 and "not UTF-8" in err
