"""Seeded random programs that keep the RTL-checked units busy, for the co-simulation corpus.

Each program loads random tiles and vectors (extremes mixed in) with DMA, then
runs a random mix of preload / mm / mma / drain and integer vector and chain
instructions, all valid for the given machine config. Same seed, same program.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from isa import BY_MNEMONIC, Activation, DType, EpilogueFlags
from isa.memory_map import LOCAL_ACC_BASE
from rtl.units import LANE_BINARY, LANE_REDUCE, LANE_UNARY
from simulator.config import MachineConfig

MODES = ("", ".vs", ".vr", ".vc")
LIMITS = {DType.i8: (-128, 127), DType.i32: (-(2**31), 2**31 - 1)}
ALIGN = 64


@dataclass
class _Writer:
    """Accumulates text lines, DRAM data and local-memory allocations of one program."""

    rng: np.random.Generator
    cfg: MachineConfig
    text: list[str] = field(default_factory=list)
    data: list[str] = field(default_factory=list)
    spad_next: int = 0
    acc_next: int = LOCAL_ACC_BASE
    labels: int = 0

    def emit(self, line: str) -> None:
        self.text.append(f"    {line}")

    def pick(self, options: tuple) -> Any:
        return options[int(self.rng.integers(0, len(options)))]

    def li(self, reg: int, value: int | str) -> None:
        self.emit(f"li x{reg}, {value}")

    def values(self, dtype: DType, shape: tuple[int, ...]) -> np.ndarray:
        lo, hi = LIMITS[dtype]
        x = self.rng.integers(lo, hi, shape, endpoint=True, dtype=np.int64)
        corners = np.array([lo, hi, -1, 0, 1])
        pick = self.rng.random(shape) < 0.2
        x[pick] = self.rng.choice(corners, int(pick.sum()))
        return x

    def alloc(self, nbytes: int, acc: bool = False) -> int:
        size = -(-nbytes // ALIGN) * ALIGN
        if acc:
            addr, self.acc_next = self.acc_next, self.acc_next + size
            limit = LOCAL_ACC_BASE + self.cfg.acc_bytes
        else:
            addr, self.spad_next = self.spad_next, self.spad_next + size
            limit = self.cfg.spad_bytes
        if addr + size > limit:
            raise ValueError("random program outgrew local memory")
        return addr

    def load(self, dtype: DType, shape: tuple[int, int], acc: bool = False, values: np.ndarray | None = None) -> int:
        """DMA a rows x cols tile (random unless `values` are given) into local memory; returns its local address."""
        rows, cols = shape
        label = f"d{self.labels}"
        self.labels += 1
        data = self.values(dtype, shape) if values is None else values
        self.data.append(f"{label}: .{dtype.name} {', '.join(map(str, data.reshape(-1)))}")
        self.data.append(".align 8")
        local = self.alloc(rows * cols * dtype.size, acc)
        self.li(1, local)
        self.li(2, label)
        self.li(3, cols * dtype.size)
        self.emit(f"dma.ld x1, x2, x3, {rows}, {cols}, {dtype.name}")
        return local


def _matrix_block(w: _Writer) -> None:
    n, rng = w.cfg.array_size, w.rng
    k, cols = (int(v) for v in rng.integers(1, n + 1, 2))
    rows = int(rng.integers(1, 3 * n + 1))
    wt, a, a2 = w.load(DType.i8, (k, cols)), w.load(DType.i8, (rows, k)), w.load(DType.i8, (rows, k))
    bias = w.load(DType.i32, (1, cols))
    res = w.load(DType.i32, (rows, cols), acc=True)
    acc = w.alloc(rows * cols * 4, acc=True)
    out = w.alloc(rows * cols * 4)
    w.emit("fence")
    w.li(4, wt)
    w.emit(f"mx.preload x4, {k}, {cols}, i8")
    w.li(5, acc)
    w.li(6, a)
    w.emit(f"mx.mm x5, x6, {rows}")
    w.li(6, a2)
    w.emit(f"mx.mma x5, x6, {rows}")
    flags = w.pick(tuple(f.name for f in EpilogueFlags))
    act = w.pick((Activation.none.name, Activation.relu.name))
    dtype = w.pick((DType.i8.name, DType.i32.name))
    if EpilogueFlags[flags] & EpilogueFlags.pc:  # rs3: a table of (mult, shift) int32 pairs, one per column
        dtype = DType.i8.name  # the per-column requantizer is the int8 output path
        table = np.stack([w.values(DType.i32, (cols,)), rng.integers(0, 48, cols)], axis=1)
        w.li(9, w.load(DType.i32, (cols, 2), values=table))
        w.emit("fence")  # the table is in the scratchpad before the drain reads it
    else:
        w.li(9, int(rng.integers(-(2**31), 2**31)))
    w.li(7, bias)
    w.li(8, res)
    w.emit(f"ep.cfg x7, x8, x9, {int(rng.integers(0, 48))}, {act}, {flags}, {dtype}")
    w.li(10, out)
    w.emit(f"mx.drain x10, x5, {rows}, {cols}")


def _stream_block(w: _Writer) -> None:
    """mx.mms streams full-width rows into a chain (vc.lds), overlapping the two units.

    The consumer starts with the stream, or late: behind a vector op over the stream's source bank (it waits
    for mx.mms to finish, so all rows wait in the FIFO; more rows than `stream_fifo_depth` would deadlock, so
    that stream is kept short), or behind a long vector op elsewhere (rows pile up, the FIFO fills and the
    array stalls until vc.lds takes them).
    """
    n, rng = w.cfg.array_size, w.rng
    k, rows = int(rng.integers(1, n + 1)), int(rng.integers(1, 3 * n + 1))
    late = w.pick(("", "bank", "busy"))
    rows = min(rows, w.cfg.stream_fifo_depth) if late == "bank" else rows
    wt, a = w.load(DType.i8, (k, n)), w.load(DType.i8, (rows, k))
    out = w.alloc(rows * n * 4)
    w.emit("fence")
    w.li(4, wt)
    w.emit(f"mx.preload x4, {k}, {n}, i8")
    if late == "busy":  # 3N..8N beats in the accumulator: usually past the first rows + the FIFO's depth
        busy = int(rng.integers(3 * n, 8 * n + 1)) * w.cfg.vector_lanes
        w.li(15, w.alloc(busy * 4, acc=True))
        w.emit(f"v.copy x15, x15, {busy}, i32")
    w.li(6, a)
    w.emit(f"mx.mms x6, {rows}")
    if late == "bank":
        w.emit(f"v.copy x6, x6, {int(rng.integers(1, 4 * n))}, i8")
    w.emit(f"vc.lds v1, {rows * n}")
    w.emit(f"vc.{w.pick(LANE_UNARY)} v2, v1")
    w.li(13, out)
    w.emit("vc.st x13, v2")


def _vector_block(w: _Writer) -> None:
    rng, lanes = w.rng, w.cfg.vector_lanes
    dtype = w.pick((DType.i8, DType.i32))
    period = int(rng.integers(1, 2 * lanes + 1))
    rows = int(rng.integers(1, 5))
    n = period * rows
    a = w.load(dtype, (1, n))
    b = w.load(dtype, (1, n))
    by_row, by_col = w.load(dtype, (1, period)), w.load(dtype, (1, rows))
    wide = w.load(DType.i32, (1, n))
    out = w.alloc(n * 4)
    w.emit("fence")
    w.li(11, a)
    w.li(13, out)
    op = w.pick(LANE_BINARY)
    mode = w.pick(MODES)
    second = {"": b, ".vs": int(w.values(dtype, (1,))[0]), ".vr": by_row, ".vc": by_col}[mode]
    w.li(12, second)
    tail = f", {period}" if mode in (".vr", ".vc") else ""
    w.emit(f"v.{op}{mode} x13, x11, x12, {n}{tail}, {dtype.name}")
    w.emit(f"v.{w.pick(LANE_UNARY)} x13, x13, {n}, {dtype.name}")
    w.emit(f"v.{w.pick(LANE_REDUCE)} x13, x11, {n}, {period}, {dtype.name}")
    lo, hi = sorted(int(v) for v in w.values(dtype, (2,)))
    w.li(14, lo)
    w.li(15, hi)
    w.emit(f"v.clip x13, x11, x14, x15, {n}, {dtype.name}")
    w.li(16, wide)
    w.li(17, int(rng.integers(-(2**31), 2**31)))
    w.emit(f"v.rqnt x13, x16, x17, {int(rng.integers(0, 64))}, {n}")
    # a fusion chain over the same data
    w.emit(f"vc.ld v1, x11, {n}, {dtype.name}")
    w.li(18, b)
    w.emit(f"vc.ld v2, x18, {n}, {dtype.name}")
    chain_op = w.pick(LANE_BINARY)
    w.emit(f"vc.{chain_op} v3, v1, v2")
    w.emit(f"vc.{chain_op}.vs v3, v3, x14")
    w.emit(f"vc.{w.pick(LANE_UNARY)} v4, v3")
    w.emit("vc.clip v4, v4, x14, x15")
    w.emit(f"vc.{w.pick(LANE_REDUCE)} v5, v4, {period}")
    w.emit("vc.st x13, v4")
    w.emit(f"vc.ld v6, x16, {n}, i32")
    w.emit(f"vc.rqnt v7, v6, x17, {int(rng.integers(0, 64))}")
    w.emit("vc.st x13, v7")


def random_program(seed: int, cfg: MachineConfig, blocks: int = 3) -> str:
    """Assembly text of a valid program mixing matrix, epilogue, vector and chain work."""
    w = _Writer(np.random.default_rng(seed), cfg)
    for _ in range(blocks):
        (_matrix_block, _stream_block, _vector_block)[int(w.rng.integers(0, 3))](w)
        w.emit("fence")
    w.emit("halt")
    assert all(line.split()[0] in BY_MNEMONIC for line in w.text)
    return (
        "\n".join(
            [f"# random co-simulation program, seed {seed}, config {cfg.name}", ".text", *w.text, ".data", *w.data]
        )
        + "\n"
    )
