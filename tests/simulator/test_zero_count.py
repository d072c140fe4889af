"""The store-side zero-tile counter: `dma.stz` counts the stored block's all-zero N x N tiles, `zc.clr` clears,
`zc.rd` reads once the counting stores have finished. Counts against a numpy oracle over tile contents."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_helpers import machine, unit_slices

from isa.enums import DType, Unit
from simulator import timing
from simulator.config import PRESETS

N = PRESETS["tiny"].array_size
VALUES = {"i8": (0, 1, -1, 127, -128), "i32": (0, 1, -1, 1 << 20), "f32": (0.0, -0.0, 1.5, -2.0, np.nan)}


def oracle(block: np.ndarray, n: int) -> int:
    """All-zero tiles, one numpy test per tile (independent of `simulator.semantics.store`)."""
    rows, cols = block.shape
    return sum(
        1 for r in range(0, rows, n) for c in range(0, cols, n) if np.count_nonzero(block[r : r + n, c : c + n]) == 0
    )


def program(stores: list[tuple[int, int, str, bool]], dtype: str, clear_before: int = 0, reads: int = 1) -> str:
    """Store local blocks to DRAM (rows, cols, mnemonic, ...): `clear_before` stores first, then `zc.clr`, the rest,
    then `zc.rd` into x5 (and x6, ...)."""
    es = DType[dtype].size
    lines = [".kernel k"]
    local = dram = 0
    for k, (rows, cols, mnemonic) in enumerate(stores):
        if k == clear_before:
            lines.append("zc.clr")
        lines += [f"li x1, {local}", f"li x2, OUT + {dram}", f"li x3, {cols * es}"]
        lines.append(f"{mnemonic} x2, x1, x3, {rows}, {cols}, {dtype}")
        local += rows * cols * es
        dram += rows * cols * es
    if clear_before >= len(stores):
        lines.append("zc.clr")
    lines += [f"zc.rd x{5 + r}" for r in range(reads)]
    lines += ["halt", ".endkernel", ".data", f"OUT: .zero {max(dram, 4)}"]
    return "\n".join(lines) + "\n"


@st.composite
def blocks(draw, dtype: str) -> np.ndarray:
    """A rows x cols block built from tiles that are all zero, or hold values (zeros among them)."""
    rows, cols = draw(st.integers(1, 3 * N + 2)), draw(st.integers(1, 3 * N + 2))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    values = np.array(VALUES[dtype], dtype=DType[dtype].numpy)
    block = rng.choice(values, (rows, cols))
    zero = rng.random((-(-rows // N), -(-cols // N))) < draw(st.floats(0, 1))
    mask = np.kron(zero, np.ones((N, N), dtype=bool))[:rows, :cols]
    block[mask] = 0
    return block


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_dma_stz_counts_the_all_zero_tiles_and_stores_as_dma_st(data) -> None:
    dtype = data.draw(st.sampled_from(sorted(VALUES)))
    block = data.draw(blocks(dtype))
    rows, cols = block.shape
    counting = machine(program([(rows, cols, "dma.stz")], dtype), "tiny", {0: block})
    plain = machine(program([(rows, cols, "dma.st")], dtype), "tiny", {0: block})
    assert counting.x[5] == oracle(block, N)
    assert plain.x[5] == 0
    out = counting.obj.symbol("OUT").value
    assert bytes(counting.mem.dram[out : out + block.nbytes]) == block.tobytes()
    assert np.array_equal(counting.mem.dram, plain.mem.dram)


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_the_counter_adds_over_counting_stores_since_the_last_clear(data) -> None:
    a, b, c = (data.draw(blocks("i8")) for _ in range(3))
    stores = [(*x.shape, "dma.stz") for x in (a, b)] + [(*c.shape, "dma.st")]
    local = np.concatenate([x.reshape(-1) for x in (a, b, c)])
    clear = data.draw(st.integers(0, 3))
    m = machine(program(stores, "i8", clear_before=clear, reads=2), "tiny", {0: local})
    expected = sum(oracle(x, N) for x in (a, b)[clear:2])  # the plain dma.st counts nothing
    assert m.x[5] == m.x[6] == expected  # reading does not clear


def test_negative_zero_is_zero_and_nan_is_not() -> None:
    block = np.zeros((N, 2 * N), dtype=np.float32)
    block[:, :N] = -0.0
    block[0, N] = np.nan
    assert machine(program([(N, 2 * N, "dma.stz")], "f32"), "tiny", {0: block}).x[5] == 1


def test_zc_rd_waits_for_the_last_counting_store_and_dma_stz_costs_what_dma_st_does() -> None:
    cfg = PRESETS["tiny"]
    block = np.zeros((2 * N, 3 * N), dtype=np.int8)
    runs = {}
    for mnemonic in ("dma.stz", "dma.st"):
        m = machine(program([(2 * N, 3 * N, mnemonic)], "i8"), cfg, {0: block})
        ((store_pc, start, finish),) = unit_slices(m, Unit.store)[-1:]
        read_pc = next(pc for pc, ins in enumerate(m.instructions) if ins.mnemonic == "zc.rd")
        issued, end = next((s, e) for u, pc, s, e in m.trace if u == Unit.scalar and pc == read_pc)
        runs[mnemonic] = (finish - start, issued, end, finish)
    stz, plain = runs["dma.stz"], runs["dma.st"]
    assert stz[0] == plain[0] == timing.dma_cycles(cfg, 2 * N, 3 * N, 3 * N)  # no extra cycle for counting
    duration, issued, end, finish = stz
    assert finish > issued  # the store was still running when zc.rd came to issue
    assert end == timing.zero_count_read_start(issued, finish) + timing.scalar_cycles(cfg)
    assert plain[2] == plain[1] + timing.scalar_cycles(cfg)  # a plain store is not waited for
