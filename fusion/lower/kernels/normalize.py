"""Reductions: Softmax, LayerNorm and ReduceMean / ReduceSum / ReduceMax, memory to memory on the vector unit
in float32 (an int8-preserving ReduceMax in int8).

Row layout: the reduced axes are moved last by the load view (a strided DMA), so every tile is whole rows of
`period` elements and the reductions are `v.rsum`/`v.rmax` with per-row broadcasts (`.vc`); numpy sums such
contiguous rows pairwise, as v.rsum does. Column layout, for one reduced axis with data after it: the axis
is outermost in the tile and sums run slice by slice in sequence, the order numpy uses for a strided axis.
Each formula follows the reference op by op (mean = sum / count, x / sqrt(var + eps) * scale + bias,
exp(x - max) / sum), so the float32 results match it and the int8 path stays bit-exact (the exception:
ReduceMean over several axes that are not trailing, where numpy's order is its iterator's own).
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial

from fusion.graph.ir import Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext
from fusion.lower.emitter import Emitter, Step, f32_bits
from fusion.lower.errors import MemoryPlanError
from fusion.lower.kernels.movement import copy_steps
from fusion.lower.kernels.recipes import REDUCE_RECIPES, ROW_RECIPES, MemoryForm, Row
from fusion.lower.kernels.vector_ops import dequantize
from fusion.lower.local_alloc import TileArena, largest_fitting
from fusion.lower.views import blocks
from isa.enums import DType, Unit

REDUCE = {OpType.ReduceMean: "add", OpType.ReduceSum: "add", OpType.ReduceMax: "max"}  # the column fold


def _axes(node: Node, rank: int) -> tuple[int, ...]:
    if node.op == OpType.Softmax:
        return (node.attr("axis"),)
    if node.op == OpType.LayerNorm:
        return tuple(range(node.attr("axis"), rank))
    return tuple(sorted(node.attr("axes")))


def lower_reduction(cx: LowerContext, node: Node) -> list[list[Step]]:
    """A single reduced axis with data after it is reduced in column layout (numpy sums such an axis in
    sequence); every other reduction in row layout (contiguous rows: numpy's pairwise sum, as v.rsum)."""
    shape = cx.graph.types[node.inputs[0]].shape
    axes = _axes(node, len(shape))
    if not axes:  # ReduceSum/Max/Mean over no axis: a copy
        x = node.inputs[0]
        return [copy_steps(cx, [(cx.view(x), cx.view(node.outputs[0]).reshape_dense(shape), None)])]
    if node.op != OpType.LayerNorm and len(axes) == 1 and math.prod(shape[axes[0] + 1 :]) > 1:
        return lower_columns(cx, node, axes[0])
    return lower_rows(cx, node, axes)


def lower_rows(cx: LowerContext, node: Node, axes: tuple[int, ...]) -> list[list[Step]]:
    x = node.inputs[0]
    xv = cx.view(x)
    rank = len(xv.shape)
    kept = tuple(a for a in range(rank) if a not in axes)
    perm = (*kept, *axes)
    src = xv.permute(perm)
    period = math.prod(xv.shape[a] for a in axes)
    out = cx.view(node.outputs[0])
    if node.op in REDUCE:
        rows_shape = tuple(xv.shape[a] for a in kept)
        kept_view = out.reshape_dense(rows_shape)
        dst = replace(kept_view, shape=src.shape, strides=kept_view.strides + (0,) * len(axes))
    else:
        dst = out.permute(perm)
    deq = cx.dtype(x) is DType.i8 and out.dtype is DType.f32  # an int8 ReduceMax stays int8
    scale = cx.scale(x)
    reduced_shape = tuple(xv.shape[a] for a in axes)
    params = [cx.view(v).broadcast_to(reduced_shape) for v in node.inputs[1:]]  # LayerNorm scale and bias
    probe = TileArena(cx.config, 0)
    per_elem = xv.dtype.size + 4 * (2 + deq)

    def fits(rows: int) -> bool:
        return probe.fits([rows * period * per_elem, *(period * 4 for _ in params), rows * 8 + 64])

    rows = largest_fitting(max(1, src.size // max(period, 1)), fits)
    if rows == 0:
        raise MemoryPlanError(f"node {node.name!r}: a row of {period} elements does not fit the scratchpad")
    body = _row_recipe if node.op in ROW_RECIPES else partial(_reduce, dt=out.dtype)
    steps = []
    for block in blocks(src.shape, rows * period, whole=period):
        arena = TileArena(cx.config, len(steps), cx.rotation)
        part = block.of(src)
        n = part.size
        nrows = n // period
        raw = arena.tile(n * xv.dtype.size)
        xf = arena.tile(n * 4) if deq else raw
        work = arena.tile(n * 4)
        red = arena.tile(nrows * 4)
        red2 = arena.tile(nrows * 4)
        param_tiles = [arena.tile(period * 4) for _ in params]
        loads = [(part, raw), *((p, t) for p, t in zip(params, param_tiles, strict=True))]
        result = red if node.op in REDUCE else work

        def compute(em: Emitter, raw=raw, xf=xf, work=work, red=red, red2=red2, n=n, tiles=param_tiles) -> None:
            if deq:
                dequantize(em, xf, raw, n, scale)
            body(em, node, xf, work, red, red2, n, period, tiles)

        out_part = block.of(dst)
        if node.op in REDUCE:  # the reduced dims were only there to line the blocks up
            keep = len(out_part.shape) - len(axes)
            out_part = replace(out_part, shape=out_part.shape[:keep], strides=out_part.strides[:keep])
        steps.append(Step(loads, [(Unit.vector, compute)], [(result, out_part)]))
    return [steps]


def lower_columns(cx: LowerContext, node: Node, axis: int) -> list[list[Step]]:
    """Tiles [L, R]: the reduced axis (length L) outermost, R kept positions contiguous; max and sum run as
    L - 1 sequential v.max / v.add over R-element slices, broadcasts are `.vr` with period R."""
    x = node.inputs[0]
    xv = cx.view(x)
    length = xv.shape[axis]
    kept = tuple(a for a in range(len(xv.shape)) if a != axis)
    x_kept = xv.permute(kept)  # the l = 0 slice; l moves by xv.strides[axis]
    out = cx.view(node.outputs[0])
    reduce_only = node.op in REDUCE
    out_kept = out.reshape_dense(x_kept.shape) if reduce_only else out.permute(kept)
    deq = cx.dtype(x) is DType.i8 and out.dtype is DType.f32
    scale = cx.scale(x)
    probe = TileArena(cx.config, 0)

    def fits(r: int) -> bool:
        return probe.fits([length * r * xv.dtype.size, length * r * 4, length * r * 4, r * 4, r * 4])

    budget = largest_fitting(max(1, x_kept.size), fits)
    if budget == 0:
        raise MemoryPlanError(f"node {node.name!r}: a column of {length} elements does not fit the scratchpad")
    steps = []
    for block in blocks(x_kept.shape, budget):
        arena = TileArena(cx.config, len(steps), cx.rotation)
        part = block.of(x_kept)
        r = part.size
        n = length * r
        raw = arena.tile(n * xv.dtype.size)
        xf = arena.tile(n * 4) if deq else raw
        work = arena.tile(n * 4)
        red, red2 = arena.tile(r * 4), arena.tile(r * 4)
        load = replace(part, shape=(length, *part.shape), strides=(xv.strides[axis], *part.strides))

        def compute(em: Emitter, raw=raw, xf=xf, work=work, red=red, red2=red2, r=r, n=n) -> None:
            if deq:
                dequantize(em, xf, raw, n, scale)
            if reduce_only:
                _column_fold(em, f"v_{REDUCE[node.op]}", red, xf, length, r, out.dtype)
                if node.op == OpType.ReduceMean:
                    em.b.v_div_vs(*em.regs(red, red, f32_bits(float(length))), r, "f32")
                return
            b = em.b
            _column_fold(em, "v_max", red, xf, length, r)
            b.v_sub_vr(*em.regs(work, xf, red), n, r, "f32")
            b.v_exp(*em.regs(work, work), n, "f32")
            _column_fold(em, "v_add", red2, work, length, r)
            b.v_div_vr(*em.regs(work, work, red2), n, r, "f32")

        store_part = block.of(out_kept)
        if not reduce_only:
            store_part = replace(
                store_part, shape=(length, *store_part.shape), strides=(out.strides[axis], *store_part.strides)
            )
        steps.append(Step([(load, raw)], [(Unit.vector, compute)], [(red if reduce_only else work, store_part)]))
    return [steps]


def _column_fold(em: Emitter, method: str, dst: int, src: int, length: int, r: int, dt: DType = DType.f32) -> None:
    """dst = op(...op(op(src[0], src[1]), src[2])..., src[length - 1]) over R-element slices, in order."""
    em.b.v_copy(*em.regs(dst, src), r, dt.name)
    for index in range(1, length):
        getattr(em.b, method)(*em.regs(dst, dst, src + index * r * dt.size), r, dt.name)


def _row_recipe(em: Emitter, node: Node, x: int, y: int, m: int, s: int, n: int, p: int, tiles: list[int]) -> None:
    """Softmax / LayerNorm: the recipe chains emit too, in memory form (x is the kernel's private copy)."""
    form = MemoryForm(em, n, period=p, row_temps=[m, s])
    ROW_RECIPES[node.op](form, node, y, [x, *(Row(t) for t in tiles)])


def _reduce(
    em: Emitter, node: Node, x: int, y: int, m: int, s: int, n: int, p: int, tiles: list[int], dt: DType
) -> None:
    """ReduceMean (sum / count), ReduceSum of each row by the recipe chains emit too; ReduceMax (an
    int8-preserving max in int8)."""
    if node.op in REDUCE_RECIPES:
        REDUCE_RECIPES[node.op](MemoryForm(em, n, period=p), node, m, [x])
    else:
        em.b.v_rmax(*em.regs(m, x), n, p, dt.name)


LOWERINGS = dict.fromkeys((OpType.Softmax, OpType.LayerNorm, *REDUCE), lower_reduction)
