"""The drain epilogue writing its rows itself (`rtl/hdl/drain_write.v`): the simulator's mx.drain and strided
mx.drain.s transactions replayed from their instruction words and register values, values, write addresses and
cycles exact: N-column panels drained in place into a dense rows x D tile at its row stride, only their columns
written (the bytes between their rows, the other panels, never)."""

from __future__ import annotations

import pytest

from assembler.source import assemble
from isa.memory_map import LOCAL_ACC_BASE as ACC
from rtl.corpus import record
from rtl.cosim import cosimulate
from simulator.config import PRESETS

pytestmark = pytest.mark.rtl
BIAS, OUT = 8192, 0  # scratchpad addresses of the bias and of the output tiles


def _panels(n: int, rows: int, d: int, out: str, size: int, stride: int) -> list[str]:
    """mx.drain.s of each N-column panel of a rows x d result (accumulator panel j at ACC + j * rows * n * 4) into
    its place in a tile at `OUT`, rows `stride` bytes apart."""
    lines = [f"ep.cfg x2, x8, x4, 9, relu, bias_res, {out}", f"li x3, {stride}"]
    for j, c0 in enumerate(range(0, d, n)):
        lines += [f"li x1, {ACC + j * rows * n * 4}", f"li x6, {OUT + c0 * size}"]
        lines.append(f"mx.drain.s x6, x1, x3, {rows}, {min(n, d - c0)}")
    return lines


def _program(n: int, rows: int, d: int) -> str:
    """The panels of a rows x d int8 result drained in place (stride d), of an int32 one with a gap (stride d + 3
    elements), then a dense mx.drain of one panel. The accumulator panels and the residual come from DRAM."""
    panels = -(-d // n)
    lines = [".kernel drains", f".input acc: i32[{(panels + 1) * rows}, {n}] @ A", f".input bias: i32[{d}] @ B"]
    lines += [f"li x1, {ACC}", "li x2, A", f"li x3, {4 * n}", f"dma.ld x1, x2, x3, {(panels + 1) * rows}, {n}, i32"]
    lines += [f"li x1, {BIAS}", "li x2, B", f"li x3, {4 * d}", f"dma.ld x1, x2, x3, 1, {d}, i32", "fence"]
    lines += [f"li x2, {BIAS}", f"li x8, {ACC + panels * rows * n * 4}", "li x4, 77"]
    lines += _panels(n, rows, d, "i8", 1, d) + ["fence"]
    lines += _panels(n, rows, d, "i32", 4, 4 * (d + 3)) + ["fence"]
    lines += [f"li x1, {ACC}", f"li x6, {OUT}", f"mx.drain x6, x1, {rows}, {n}", "halt", ".endkernel", ".data"]
    lines += [f"A: .zero {4 * (panels + 1) * rows * n}", f"B: .zero {4 * d}", ""]
    return "\n".join(lines)


@pytest.mark.parametrize(("config", "rows", "d"), [("tiny", 6, 10), ("base", 20, 40)])
def test_the_drain_writes_dense_and_strided_rows_as_the_simulator(config: str, rows: int, d: int, tmp_path) -> None:
    cfg = PRESETS[config]
    n = cfg.array_size
    run = record(config, assemble(_program(n, rows, d)), cfg, seed=rows)
    (report,) = cosimulate(cfg, [run], vcd_dir=tmp_path)
    assert report.ok, "\n".join(report.lines())
    (batch,) = [b for b in report.batches if b.unit == "drain_write"]
    panels = -(-d // n)
    assert [v.label.split()[-1] for v in batch.verdicts] == ["mx.drain.s"] * 2 * panels + ["mx.drain"]
