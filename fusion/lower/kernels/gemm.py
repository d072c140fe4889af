"""Tiled GEMM on the systolic array: C[M, N] = A[M, K] @ B[K, N] (+ bias), int8 or fp32.

A step computes one tm x tn output tile: the loader brings the k-slices of A (tm x tk, one DMA each) and
B's K x tn panel (one DMA; its k-slices are consecutive dense blocks); on the int8 path float operands are
quantized (v.qnt) first; the matrix unit runs mx.preload + mx.mm/mma over k into an accumulator tile; the
vector unit adds the bias and (int8) requantizes to an int8 tile; the store unit writes the tile. tm is the
largest row count whose tiles fit one buffer slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fusion.lower.emitter import Emitter, Step, f32_bits
from fusion.lower.errors import MemoryPlanError
from fusion.lower.local_alloc import TileArena, largest_fitting
from fusion.lower.views import MAX_ROWS, View
from isa.enums import DType, Unit
from simulator.config import MachineConfig


@dataclass(frozen=True)
class Operand:
    """A 2-D DRAM view; `quantize_scale` set means: stored float32, quantize to int8 on the way in."""

    view: View
    quantize_scale: float | None = None


@dataclass(frozen=True)
class Gemm:
    """One GEMM: `bias` is a view broadcast to [M, N] (stride 0 along rows: per column; along columns: per
    row), `requant` (mult, shift) turns the int32 accumulator into int8 on the int8 path."""

    a: Operand
    b: Operand
    out: View
    bias: View | None = None
    requant: tuple[int, int] | None = None

    @property
    def int8(self) -> bool:
        return self.requant is not None

    @property
    def bias_mode(self) -> str:
        if self.bias is None:
            return "none"
        if self.bias.strides[0] == 0:
            return "col"
        return "row" if self.bias.strides[1] == 0 else "full"


def _operand_bytes(op: Operand, elems: int) -> list[int]:
    sizes = [elems * op.view.dtype.size]
    return sizes + [elems] if op.quantize_scale is not None else sizes


def _k_slices(k: int, n: int) -> list[tuple[int, int]]:
    return [(k0, min(n, k - k0)) for k0 in range(0, k, n)]


def _spad_sizes(g: Gemm, tm: int, tn: int, k: int, n: int) -> tuple[list[int], list[int]]:
    spad: list[int] = _operand_bytes(g.b, k * tn)  # one B panel, its k-slices stacked
    for _, kb in _k_slices(k, n):
        spad += _operand_bytes(g.a, tm * kb)
    mode = g.bias_mode
    if mode != "none":
        spad.append({"col": tn, "row": tm, "full": tm * tn}[mode] * 4)
    if g.int8:
        spad.append(tm * tn)
    return spad, [tm * tn * 4]


def choose_rows(cfg: MachineConfig, g: Gemm) -> int:
    m, k = g.a.view.shape
    n_arr = cfg.array_size
    tn = min(n_arr, g.out.shape[1])
    probe = TileArena(cfg, 0)
    tm = largest_fitting(min(m, MAX_ROWS), lambda t: probe.fits(*_spad_sizes(g, t, tn, k, n_arr)))
    if tm == 0:
        raise MemoryPlanError(
            f"a GEMM with K={k} does not fit: one output row needs more than a buffer slot of the scratchpad "
            f"({probe.spad.size} bytes) or accumulator ({probe.acc.size} bytes)"
        )
    return tm


@dataclass(frozen=True)
class _Tiles:
    """Local tiles of one operand's k-slices: where the matrix unit reads each slice (raw or quantized)."""

    raw: tuple[int, ...]
    ready: tuple[int, ...]
    dtype: DType


def _alloc(arena: TileArena, op: Operand, slice_elems: list[int]) -> _Tiles:
    raw = tuple(arena.tile(e * op.view.dtype.size) for e in slice_elems)
    if op.quantize_scale is None:
        return _Tiles(raw, raw, op.view.dtype)
    return _Tiles(raw, tuple(arena.tile(e) for e in slice_elems), DType.i8)


def _fill(op: Operand, tiles: _Tiles, parts: list[View], loads: list, quants: list) -> None:
    """Load the slices; queue their quantization (float operands on the int8 path)."""
    for part, raw, ready in zip(parts, tiles.raw, tiles.ready, strict=True):
        loads.append((part, raw))
        if op.quantize_scale is not None:
            quants.append((ready, raw, part.size, 1.0 / op.quantize_scale))


def gemm_steps(cfg: MachineConfig, gemms: Sequence[Gemm]) -> list[Step]:
    """The tiles of a sequence of GEMMs (e.g. a batch), as one pipeline.

    One operand stays resident while the other streams: A's row block (loaded and quantized once per block,
    reused for every column tile), or B's column panel when there is a single column tile and several row
    blocks. Resident tiles sit at the start of the buffer slot of their block's index; streamed tiles follow
    them in the slot of the step's index, so the pipeline's credits cover both (blocks, across GEMMs too,
    rotate through the slots, so a resident region is rewritten DEPTH blocks, hence DEPTH steps, later).
    """
    steps: list[Step] = []
    blocks_done = 0
    for g in gemms:
        blocks_done = _gemm(cfg, g, steps, blocks_done)
    return steps


def _gemm(cfg: MachineConfig, g: Gemm, steps: list[Step], blocks_done: int) -> int:
    m, k = g.a.view.shape
    n_out = g.out.shape[1]
    n_arr = cfg.array_size
    tm = choose_rows(cfg, g)
    ks = _k_slices(k, n_arr)
    row_blocks = [(i0, min(tm, m - i0)) for i0 in range(0, m, tm)]
    col_blocks = [(j0, min(n_arr, n_out - j0)) for j0 in range(0, n_out, n_arr)]
    a_resident = not (len(col_blocks) == 1 and len(row_blocks) > 1)
    outer, inner = (row_blocks, col_blocks) if a_resident else (col_blocks, row_blocks)
    a_elems = [tm * kb for _, kb in ks]  # A: one tile per k-slice (a column block of A's rows)
    b_elems = [k * n_arr]  # B: the k x cols panel in one DMA; its k-slices are consecutive dense blocks
    resident_op, streamed_op = (g.a, g.b) if a_resident else (g.b, g.a)
    resident_elems, streamed_elems = (a_elems, b_elems) if a_resident else (b_elems, a_elems)
    for b_index, ob in enumerate(outer, blocks_done):
        resident = _alloc(TileArena(cfg, b_index), resident_op, resident_elems)
        for first, ib in enumerate(inner):
            (i0, rows), (j0, cols) = (ob, ib) if a_resident else (ib, ob)
            arena = TileArena(cfg, len(steps))
            _alloc(arena, resident_op, resident_elems)  # skip the resident region of this slot
            streamed = _alloc(arena, streamed_op, streamed_elems)
            a_parts = [g.a.view.slice(0, i0, rows).slice(1, k0, kb) for k0, kb in ks]
            b_parts = [g.b.view.slice(1, j0, cols)]
            loads: list = []
            quants: list = []
            if first == 0:
                _fill(resident_op, resident, a_parts if a_resident else b_parts, loads, quants)
            _fill(streamed_op, streamed, b_parts if a_resident else a_parts, loads, quants)
            a_tiles, b_tiles = (resident, streamed) if a_resident else (streamed, resident)
            steps.append(_tile_step(arena, g, (i0, rows, j0, cols), ks, a_tiles, b_tiles, loads, quants))
    return blocks_done + len(outer)


def _tile_step(
    arena: TileArena,
    g: Gemm,
    tile: tuple[int, int, int, int],
    ks: list[tuple[int, int]],
    a_tiles: _Tiles,
    b_tiles: _Tiles,
    loads: list,
    quants: list,
) -> Step:
    i0, rows, j0, cols = tile
    dt = a_tiles.dtype
    slices = [(a, b_tiles.ready[0] + k0 * cols * dt.size, kb) for a, (k0, kb) in zip(a_tiles.ready, ks, strict=True)]
    acc = arena.acc_tile(rows * cols * 4)
    acc_dt = DType.i32 if g.int8 else DType.f32
    mode = g.bias_mode
    bias_addr = 0
    if g.bias is not None:
        part = g.bias.slice(0, i0, rows).slice(1, j0, cols)
        part = {"col": part.index((0,)), "row": part.permute((1, 0)).index((0,)), "full": part}[mode]
        bias_addr = arena.tile(part.size * 4)
        loads.append((part, bias_addr))
    out_addr = arena.tile(rows * cols) if g.int8 else acc
    n = rows * cols

    def quantize(em: Emitter) -> None:
        for q, raw, count, inv in quants:
            em.b.v_qnt(*em.regs(q, raw, f32_bits(inv)), count)

    def matmul(em: Emitter) -> None:
        for index, (a_addr, b_addr, kb) in enumerate(slices):
            em.b.mx_preload(em.reg(b_addr), kb, cols, dt.name)
            mm = em.b.mx_mm if index == 0 else em.b.mx_mma
            mm(*em.regs(acc, a_addr), rows)

    def epilogue(em: Emitter) -> None:
        if mode == "col":
            em.b.v_add_vr(*em.regs(acc, acc, bias_addr), n, cols, acc_dt.name)
        elif mode == "row":
            em.b.v_add_vc(*em.regs(acc, acc, bias_addr), n, cols, acc_dt.name)
        elif mode == "full":
            em.b.v_add(*em.regs(acc, acc, bias_addr), n, acc_dt.name)
        if g.requant is not None:
            mult, shift = g.requant
            em.b.v_rqnt(*em.regs(out_addr, acc, mult), shift, n)

    compute = [(Unit.vector, quantize)] if quants else []
    compute.append((Unit.matrix, matmul))
    if mode != "none" or g.int8:
        compute.append((Unit.vector, epilogue))
    return Step(loads, compute, [(out_addr, g.out.slice(0, i0, rows).slice(1, j0, cols))])
