"""A short-and-wide GEMM in the swapped orientation: C^T = B^T A^T, so the few activation rows are stationary.

The systolic array streams the rows of its moving operand; an instruction costs `rows + 2N - 1` cycles and a
weight preload N more. A GEMM with M <= N activation rows (a transformer layer's tokens) therefore spends most
of its matrix time filling and draining the array once per weight tile. Swapped, each k-slice of A^T (one
`dma.ldt` of A, transposed in flight) is preloaded once and the weight's columns stream through as rows: one
`mx.mm` of `n_out` rows per k-slice instead of one preload and one 16-row `mx.mm` per weight tile. The weight
is a constant, packed at compile time as the rows the array streams (`pack_swapped`, one DMA per chunk of output
columns). The accumulator then holds C^T; phase 1 drains it (int8 requantize, ReLU) to a DRAM scratch buffer,
phase 2 brings it back transposed (`dma.ldt`) and stores C. Only epilogues that act per element or per tensor
(requantize, ReLU) survive the swap: a per-column bias would be per-row here, which the drain cannot apply.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fusion.engine.codegen.matrix_group import EPILOGUE_HEADS, epilogue_ops, packable_weight
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Graph, Node
from fusion.lower.context import LowerContext, const_key, temp_key
from fusion.lower.emitter import Emitter, Step, f32_bits
from fusion.lower.kernels.matrix import matrix_operand, requant
from fusion.lower.local_alloc import TileArena, largest_fitting
from fusion.lower.views import MAX_COLS, MAX_ROWS, View, dense
from isa.enums import Activation, DType, Unit
from simulator.config import MachineConfig

SWAPPED = "swapped"  # constant-form key of a weight packed as streamed rows (see pack_swapped)


@dataclass(frozen=True)
class SwappedShape:
    m: int  # activation rows (stationary, <= N)
    k: int
    n_out: int  # output columns (streamed as rows)
    chunk: int  # output columns per pipeline step


def _k_slices(k: int, n: int) -> list[tuple[int, int]]:
    return [(k0, min(n, k - k0)) for k0 in range(0, k, n)]


def swapped_shape(graph: Graph, cfg: MachineConfig, head: Node, int8: bool) -> SwappedShape:
    """The GEMM's extents and the chunk of output columns one step handles; CodegenError when it does not apply."""
    if head.op not in EPILOGUE_HEADS or packable_weight(graph, head) is None:
        raise CodegenError(
            f"node {head.name!r}: the swapped orientation needs a MatMul/Gemm with a constant 2-D weight"
        )
    a_shape = graph.types[head.inputs[0]].shape
    k, n_out = graph.types[head.inputs[1]].shape
    m = math.prod(a_shape[:-1])
    n_arr = cfg.array_size
    if m > n_arr:
        raise CodegenError(f"node {head.name!r}: {m} activation rows do not fit one stationary tile (N = {n_arr})")
    if k > MAX_COLS or n_out > MAX_ROWS:
        raise CodegenError(f"node {head.name!r}: a {m} x {k} x {n_out} GEMM exceeds one transposing DMA")
    es = 1 if int8 else 4
    probe = TileArena(cfg, 0)

    def fits(c: int) -> bool:
        return probe.fits([m * k * 4, m * k, c * k * es, c * m * 4], [c * m * 4])

    chunk = largest_fitting(n_out, fits)
    if chunk == 0:
        raise CodegenError(f"node {head.name!r}: one swapped step does not fit a buffer slot")
    return SwappedShape(m, k, n_out, chunk)


def pack_swapped(weights: np.ndarray, chunk: int, n_arr: int) -> np.ndarray:
    """A K x N weight as the rows the array streams: per chunk of `chunk` output columns, per k-slice, the slice's
    columns as rows (kb elements each). Flat, so one chunk is one contiguous DMA."""
    k, n = weights.shape
    parts = [
        weights[k0 : k0 + kb, c0 : c0 + chunk].T.ravel() for c0 in range(0, n, chunk) for k0, kb in _k_slices(k, n_arr)
    ]
    return np.ascontiguousarray(np.concatenate(parts))


def scratch_bytes(graph: Graph, cfg: MachineConfig, head: Node, int8: bool) -> int:
    """DRAM bytes of the C^T buffer between the two phases."""
    shape = swapped_shape(graph, cfg, head, int8)
    return shape.n_out * shape.m * (1 if int8 else 4)


def swapped_phases(cx: LowerContext, nodes: Sequence[Node]) -> list[list[Step]]:
    graph, head, cfg = cx.graph, nodes[0], cx.config
    ops = epilogue_ops(graph, nodes)
    if ops.bias is not None or ops.residual is not None:
        raise CodegenError(f"node {head.name!r}: a per-column bias or residual cannot be drained in swapped order")
    shape = swapped_shape(graph, cfg, head, cx.int8)
    q = cx.matrix(head) if cx.int8 else None
    a = matrix_operand(cx, head, head.inputs[0], q.input_scale if q else None)
    a_view = a.view.reshape_dense((shape.m, shape.k)) if _is_dense(a.view) else None
    if a_view is None:
        raise CodegenError(f"node {head.name!r}: the swapped orientation needs a dense activation")
    out = cx.view(nodes[-1].outputs[0])
    out_dt = out.dtype
    w_dt = DType.i8 if cx.int8 else DType.f32
    packed = cx.addresses[const_key(packable_weight(graph, head), SWAPPED)]
    scratch = dense(cx.addresses[temp_key(head, 0)], (shape.n_out, shape.m), out_dt)
    mult, shift = requant(cx, head) or (f32_bits(1.0), 0)
    act = Activation.relu if ops.relu else Activation.none
    slices = _k_slices(shape.k, cfg.array_size)
    steps = []
    for c0 in range(0, shape.n_out, shape.chunk):
        rows = min(shape.chunk, shape.n_out - c0)
        arena = TileArena(cfg, len(steps))
        a_raw = arena.tile(shape.m * shape.k * a_view.dtype.size)
        a_t = arena.tile(shape.m * shape.k) if a.quantize_scale is not None else a_raw
        w = arena.tile(rows * shape.k * w_dt.size)
        acc = arena.acc_tile(rows * shape.m * 4)
        res = arena.tile(rows * shape.m * out_dt.size)
        w_part = dense(packed + c0 * shape.k * w_dt.size, (rows * shape.k,), w_dt)

        def load(em: Emitter, a_raw=a_raw, w=w, w_part=w_part) -> None:
            local, dram, stride = em.regs(a_raw, a_view.address, a_view.strides[0])
            em.b.dma_ldt(local, dram, stride, shape.m, shape.k, a_view.dtype.name)
            em.dma_load(w_part, w)

        def quantize(em: Emitter, a_t=a_t, a_raw=a_raw) -> None:
            em.b.v_qnt(*em.regs(a_t, a_raw, f32_bits(1.0 / a.quantize_scale)), shape.m * shape.k)

        def matmul(em: Emitter, a_t=a_t, w=w, acc=acc, res=res, rows=rows) -> None:
            for index, (k0, kb) in enumerate(slices):
                em.b.mx_preload(em.reg(a_t + k0 * shape.m * w_dt.size), kb, shape.m, w_dt.name)
                mm = em.b.mx_mm if index == 0 else em.b.mx_mma
                mm(*em.regs(acc, w + k0 * rows * w_dt.size), rows)
            em.b.ep_cfg(*em.regs(0, 0, mult), shift, act, "none", "i8" if cx.int8 else "f32")
            em.b.mx_drain(*em.regs(res, acc), rows, shape.m)

        compute = [(Unit.load, load)]
        if a.quantize_scale is not None:
            compute.append((Unit.vector, quantize))
        compute.append((Unit.matrix, matmul))
        steps.append(Step([], compute, [(res, scratch.slice(0, c0, rows))]))
    return [steps, _transpose_back(cfg, scratch, out.reshape_dense((shape.m, shape.n_out)))]


def _transpose_back(cfg: MachineConfig, scratch: View, out: View) -> list[Step]:
    """C^T (n_out x m, dense in DRAM) -> C (m x n_out): transposing loads of column chunks, plain stores."""
    n_out, m = scratch.shape
    es = scratch.dtype.size
    probe = TileArena(cfg, 0)
    chunk = largest_fitting(n_out, lambda c: probe.fits([c * m * es]))
    steps = []
    for c0 in range(0, n_out, chunk):
        cols = min(chunk, n_out - c0)
        tile = TileArena(cfg, len(steps)).tile(cols * m * es)
        part = scratch.slice(0, c0, cols)

        def load(em: Emitter, tile=tile, part=part, cols=cols) -> None:
            local, dram, stride = em.regs(tile, part.address, part.strides[0])
            em.b.dma_ldt(local, dram, stride, cols, m, part.dtype.name)

        steps.append(Step([], [(Unit.load, load)], [(tile, out.slice(1, c0, cols))]))
    return steps


def _is_dense(view: View) -> bool:
    return view == dense(view.address, view.shape, view.dtype)
