"""Tiled GEMM on the systolic array: C[M, N] = A[M, K] @ B[K, N] (+ bias), int8 or fp32.

A step computes one tm x tn output tile: the loader brings the k-slices of A (tm x tk) and B (tk x tn);
on the int8 path float operands are quantized (v.qnt) first; the matrix unit runs mx.preload + mx.mm/mma
over k into an accumulator tile; the vector unit adds the bias and (int8) requantizes to an int8 tile;
the store unit writes the tile. tm is the largest row count whose tiles fit one buffer half.
"""

from __future__ import annotations

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
    spad: list[int] = []
    for _, kb in _k_slices(k, n):
        spad += _operand_bytes(g.a, tm * kb) + _operand_bytes(g.b, kb * tn)
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
            f"a GEMM with K={k} does not fit: one output row needs more than half the scratchpad "
            f"({cfg.spad_bytes // 2} bytes) or accumulator"
        )
    return tm


def _load_operand(arena: TileArena, op: Operand, part: View, loads: list, quants: list) -> tuple[int, DType]:
    """Load a tile of an operand; returns the local address and dtype the matrix unit reads."""
    raw = arena.tile(part.size * part.dtype.size)
    loads.append((part, raw))
    if op.quantize_scale is None:
        return raw, part.dtype
    q = arena.tile(part.size)
    quants.append((q, raw, part.size, 1.0 / op.quantize_scale))
    return q, DType.i8


def gemm_steps(cfg: MachineConfig, g: Gemm, start: int = 0) -> list[Step]:
    """The tiles of one GEMM; `start` is the index of its first step in the pipeline (sets buffer parity)."""
    m, k = g.a.view.shape
    n_out = g.out.shape[1]
    n_arr = cfg.array_size
    tm = choose_rows(cfg, g)
    steps = []
    for i0 in range(0, m, tm):
        rows = min(tm, m - i0)
        for j0 in range(0, n_out, n_arr):
            cols = min(n_arr, n_out - j0)
            steps.append(_tile_step(TileArena(cfg, (start + len(steps)) % 2), g, i0, rows, j0, cols, k, n_arr))
    return steps


def _tile_step(arena: TileArena, g: Gemm, i0: int, rows: int, j0: int, cols: int, k: int, n_arr: int) -> Step:
    loads: list = []
    quants: list = []
    slices = []
    for k0, kb in _k_slices(k, n_arr):
        a_addr, dt = _load_operand(arena, g.a, g.a.view.slice(0, i0, rows).slice(1, k0, kb), loads, quants)
        b_addr, _ = _load_operand(arena, g.b, g.b.view.slice(0, k0, kb).slice(1, j0, cols), loads, quants)
        slices.append((a_addr, b_addr, kb, dt))
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
        for index, (a_addr, b_addr, kb, dt) in enumerate(slices):
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
