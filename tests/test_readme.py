"""The README's examples are executable claims: its assembly must assemble and run race-free, its error verbatim."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from assembler import assemble
from assembler.diagnostics import AssemblyError
from simulator.run import simulate

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def _block(lang: str) -> str:
    match = re.search(rf"```{lang}\n(.*?)```", README, re.S)
    assert match, f"README has no ```{lang} block"
    return match.group(1)


def test_readme_assembly_example_computes_a_relu_gemm() -> None:
    program = assemble(_block("asm"), "README.md")
    rng = np.random.default_rng(0)
    a = rng.integers(-8, 8, (16, 16), dtype=np.int8)
    w = rng.integers(-8, 8, (16, 16), dtype=np.int8)
    result = simulate(program, "base", {"a": a, "w": w}, checked=True)
    acc = np.maximum(a.astype(np.int64) @ w.astype(np.int64), 0)
    expected = np.clip((acc * 1 + (1 << 3)) >> 4, -128, 127).astype(np.int8)
    np.testing.assert_array_equal(result.outputs["c"], expected)


def test_readme_error_example_is_what_the_assembler_prints() -> None:
    shown = _block("text").splitlines()
    source = _block("asm").replace("mx.mm x5, x3, 16", "mx.mul x5, x3, 16")
    with pytest.raises(AssemblyError) as err:
        assemble(source, "gemm.s")
    printed = str(err.value).splitlines()
    for line in shown[2:]:  # after the command and the summary line the CLI adds
        assert line in printed, line


def test_every_readme_assembly_block_assembles_and_runs() -> None:
    blocks = re.findall(r"```asm\n(.*?)```", README, re.S)
    primitives = {"ep.cfg", "vc.ld", "mx.mms", "bz.tile", "dispatch", "dma.ldt"}
    assert all(any(p in block for block in blocks) for p in primitives)
    for block in blocks:
        simulate(assemble(block, "README.md"), "base", checked=True)
