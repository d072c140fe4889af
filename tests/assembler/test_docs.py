"""docs/assembly.md stays true: its asm blocks assemble and round-trip, its Python runs, its error sample is real."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from assembler import AssemblyError, assemble, disassemble, to_bytes

DOC = Path(__file__).resolve().parents[2] / "docs" / "assembly.md"
TEXT = DOC.read_text()
ASM_BLOCKS = re.findall(r"```asm\n(.*?)```", TEXT, re.S)
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, re.S)
FUSION_PRIMITIVES = ("ep.cfg", "mx.drain", "vc.", "mx.mms", "vc.lds", "bz.tile", "dispatch", ".word", "dma.ldt")


@pytest.mark.parametrize("block", ASM_BLOCKS, ids=[f"asm{i}" for i in range(len(ASM_BLOCKS))])
def test_asm_examples_assemble_and_round_trip(block: str) -> None:
    obj = assemble(block, "docs/assembly.md")
    assert to_bytes(assemble(disassemble(obj))) == to_bytes(obj)


def test_every_fusion_primitive_has_an_example() -> None:
    for primitive in FUSION_PRIMITIVES:
        assert any(primitive in block for block in ASM_BLOCKS), primitive


@pytest.mark.parametrize("block", PYTHON_BLOCKS)
def test_python_examples_run(block: str) -> None:
    exec(compile(block, str(DOC), "exec"), {})


def test_error_sample_is_what_the_assembler_prints() -> None:
    sample = re.search(r"```text\n\$ dynfuse asm bad.s\n(.*?)```", TEXT, re.S).group(1)
    source_lines = [line[4:] for line in sample.splitlines() if line.startswith("    ") and "^" not in line]
    source = "start:  li x1, 0\n" + "\n".join(s for s in source_lines if not s.lstrip().startswith("hint:"))
    with pytest.raises(AssemblyError) as info:
        assemble(source, "bad.s")
    assert "error: " + str(info.value) + "\n" == sample
