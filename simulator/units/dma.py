"""DMA load/store units: 2-D strided copies between DRAM and local memory (one optionally transposing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from isa import Instruction
from simulator.engine import LOAD, S_DRAM_RD, S_DRAM_WR, STORE
from simulator.memory import NUMPY_DTYPES
from simulator.semantics.scalar import unsigned32
from simulator.semantics.store import zero_tiles
from simulator.timing import dma_cycles, dma_transfer_cycles, dma_transposed_cycles, zero_count_clear_cycles

if TYPE_CHECKING:
    from simulator.machine import Builder, Machine, Once, Step


def dma_load(transposed: bool) -> Builder:
    """`dma.ld` / `dma.ldt`: a strided DRAM tile into dense local memory (`dma.ldt` stores its transpose)."""

    def build(m: Machine, pc: int, ins: Instruction) -> Step:
        rd, rs1, rs2, rows, cols, dtype = ins.values
        dt = NUMPY_DTYPES[dtype]
        row_bytes, x, nxt, row = cols * dt.itemsize, m.x, pc + 1, m.row(pc)
        lat = ins.spec.latency if transposed else 0

        def step() -> int:
            src, stride = unsigned32(x[rs1]), unsigned32(x[rs2])
            data = m.mem.dram_rows(src, rows, row_bytes, stride, dt.itemsize).view(dt)
            m.check_dram(src, rows, row_bytes, stride, write=False)
            m.write_local(x[rd], data.T.copy() if transposed else data, row)
            _queue_load(m, pc, transposed, lat, rows, row_bytes, stride, row)
            return nxt

        return step

    return build


def dma_load_timed(transposed: bool) -> Once:
    """`dma_load` without values (`simulator.dispatch.TIMED`): its checks and accesses, no data moved."""

    def run(m: Machine, pc: int, ins: Instruction) -> int:
        rd, rs1, rs2, rows, cols, dtype = ins.values
        dt, x, row = NUMPY_DTYPES[dtype], m.x, m.row(pc)
        row_bytes, src, stride = cols * dt.itemsize, unsigned32(x[rs1]), unsigned32(x[rs2])
        m.mem.check_dram_rows(src, rows, row_bytes, stride, dt.itemsize)
        m.check_dram(src, rows, row_bytes, stride, write=False)
        m.written(x[rd], rows * cols, dt, row)
        _queue_load(m, pc, transposed, ins.spec.latency if transposed else 0, rows, row_bytes, stride, row)
        return pc + 1

    return run


def _queue_load(
    m: Machine, pc: int, transposed: bool, lat: int, rows: int, row_bytes: int, stride: int, row: list[int]
) -> None:
    """Count a load's DRAM bytes and queue it (`lat`: the transpose buffer's, of `dma.ldt`)."""
    cfg = m.cfg
    row[S_DRAM_RD] += rows * row_bytes
    if transposed:
        dur = dma_transposed_cycles(cfg, rows, row_bytes, stride, lat)
    else:
        dur = dma_cycles(cfg, rows, row_bytes, stride)
    m.submit(m.dma_op(LOAD, pc, dur, dma_transfer_cycles(cfg, rows, row_bytes, stride), lat, row))


def dma_store(counting: bool) -> Builder:
    """`dma.st` / `dma.stz`: a dense local tile to strided DRAM; `dma.stz` also adds the tile's all-zero N x N
    tiles to the zero-tile counter (no extra cycle: the count is combinational on the store path)."""

    def build(m: Machine, pc: int, ins: Instruction) -> Step:
        rd, rs1, rs2, rows, cols, dtype = ins.values
        dt = NUMPY_DTYPES[dtype]
        row_bytes, x, nxt, row, engine = cols * dt.itemsize, m.x, pc + 1, m.row(pc), m.engine
        n = m.cfg.array_size

        def step() -> int:
            dst, stride = unsigned32(x[rd]), unsigned32(x[rs2])
            dest = m.mem.dram_rows(dst, rows, row_bytes, stride, dt.itemsize)
            values = m.read_local(x[rs1], rows * cols, dt, row)
            m.check_dram(dst, rows, row_bytes, stride, write=True)
            dest[...] = values.view(dest.dtype).reshape(rows, row_bytes)
            if counting:
                engine.zero_tiles += zero_tiles(values.reshape(rows, cols), n)
            _queue_store(m, pc, counting, rows, row_bytes, stride, row)
            return nxt

        return step

    return build


def dma_store_timed(counting: bool) -> Once:
    """`dma_store` without values (`simulator.dispatch.TIMED`): its checks and accesses, no data moved and no zero
    tiles counted (without values no `zc.rd` reads the count: `machine.READS_DATA`)."""

    def run(m: Machine, pc: int, ins: Instruction) -> int:
        rd, rs1, rs2, rows, cols, dtype = ins.values
        dt, x, row = NUMPY_DTYPES[dtype], m.x, m.row(pc)
        row_bytes, dst, stride = cols * dt.itemsize, unsigned32(x[rd]), unsigned32(x[rs2])
        m.mem.check_dram_rows(dst, rows, row_bytes, stride, dt.itemsize)
        m.read_local(x[rs1], rows * cols, dt, row)
        m.check_dram(dst, rows, row_bytes, stride, write=True)
        _queue_store(m, pc, counting, rows, row_bytes, stride, row)
        return pc + 1

    return run


def _queue_store(m: Machine, pc: int, counting: bool, rows: int, row_bytes: int, stride: int, row: list[int]) -> None:
    """Count a store's DRAM bytes and queue it (`dma.stz`: as the op `zc.rd` waits for)."""
    cfg = m.cfg
    row[S_DRAM_WR] += rows * row_bytes
    dur = dma_cycles(cfg, rows, row_bytes, stride)
    op = m.dma_op(STORE, pc, dur, dma_transfer_cycles(cfg, rows, row_bytes, stride), 0, row)
    if counting:
        m.engine.counted = op
    m.submit(op)


def zero_count_clear(m: Machine, pc: int, ins: Instruction) -> Step:
    """`zc.clr`: the counter restarts from zero, behind every store issued before it (it enters the store queue)."""
    nxt, row, engine, cost = pc + 1, m.row(pc), m.engine, zero_count_clear_cycles(m.cfg)

    def step() -> int:
        engine.zero_tiles = 0
        m.submit(m.unit_op(STORE, pc, cost, row))
        return nxt

    return step
