"""The matrix unit fetching A itself (`rtl/hdl/matrix_fetch.v`): the simulator's mx.mm / mx.mma and
strided mx.mm.s / mx.mma.s transactions replayed from their instruction words, register values and the scratchpad
image, values and cycles exact: a k-slice of a dense tile read in place at its row stride, the bytes between its
rows (the other slices) never reaching the array."""

from __future__ import annotations

import numpy as np
import pytest

from assembler.source import assemble
from isa import decode
from isa.memory_map import LOCAL_ACC_BASE as ACC
from rtl.replay import run_cases
from rtl.stimulus import fetch_case
from rtl.units import MATRIX_FETCH
from simulator.config import PRESETS
from simulator.machine import Machine

pytestmark = pytest.mark.rtl


def _program(n: int, rows: int, d: int) -> str:
    """C = A @ W for a dense rows x d int8 A at 0 and W's k-slices at 4096 on: dense mx.mm of the first slice copied
    out (a v.copy per row), then mx.mma.s of every later slice in place at stride d, then mx.mm.s again at an odd
    stride (overlapping rows) into a second accumulator."""
    lines = [f"li x5, {ACC}", f"li x3, {d}", "li x1, 0", "li x8, 2048"]
    lines += [f"li x9, {r * d}\nli x10, {2048 + r * n}\nv.copy x10, x9, {n}, i8" for r in range(rows)]
    lines += ["fence", "li x2, 4096", f"mx.preload x2, {n}, {n}, i8", f"mx.mm x5, x8, {rows}"]
    for s, k0 in enumerate(range(n, d, n)):
        kb = min(n, d - k0)
        lines += [f"li x2, {4096 + (s + 1) * n * n}", f"mx.preload x2, {kb}, {n}, i8"]
        lines += [f"li x1, {k0}", f"mx.mma.s x5, x1, x3, {rows}"]
    lines += ["li x4, 3", f"li x6, {ACC + 4 * n * rows}", f"mx.mm.s x6, x1, x4, {rows}", "halt", ""]
    return "\n".join(lines)


@pytest.mark.parametrize(("config", "rows", "d"), [("tiny", 6, 10), ("base", 20, 40)])
def test_the_row_fetch_reads_dense_and_strided_a_as_the_simulator(config: str, rows: int, d: int, tmp_path) -> None:
    cfg = PRESETS[config]
    n = cfg.array_size
    m = Machine(assemble(_program(n, rows, d)), cfg, record_transactions=True)
    rng = np.random.default_rng(rows)
    m.mem.spad[: 8192] = rng.integers(0, 256, 8192, dtype=np.uint8)
    m.run()
    cases = []
    for op, pc, ops, result in m.transactions:
        ins = decode(m.obj.text[pc])
        if "a_addr" not in ops:
            continue
        at, stride = ops["a_addr"], ops["a_stride"]
        span = (rows - 1) * stride + ops["a"].shape[1]
        image = (at, m.mem.spad[at : at + span].copy())
        rs2 = stride if ins.mnemonic.endswith(".s") else 0xDEAD  # a dense form ignores rs2
        label = f"pc {pc} {ins.mnemonic} stride {stride}"
        cases.append(fetch_case(cfg, label, ins, at, rs2, image, ops["w"], result, acc=ops.get("acc"), charged=op.finish - op.start))
    assert [c.label.split()[2] for c in cases] == ["mx.mm"] + ["mx.mma.s"] * (-(-d // n) - 1) + ["mx.mm.s"]
    report = run_cases(MATRIX_FETCH, cfg, cases, vcd_dir=tmp_path)
    assert report.ok, report.first_mismatch()
