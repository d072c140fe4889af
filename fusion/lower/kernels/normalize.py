"""Row reductions: Softmax, LayerNorm and ReduceMean, memory to memory on the vector unit in float32.

The reduced axes are moved last by the load view (a strided DMA), so every tile is whole rows of `period`
elements and the reductions are `v.rsum`/`v.rmax` with per-row broadcasts (`.vc`). Each formula follows the
reference op by op (mean = sum / count, x / sqrt(var + eps) * scale + bias, exp(x - max) / sum), so the
float32 results match it and the int8 path stays bit-exact.
"""

from __future__ import annotations

import math
from dataclasses import replace

from fusion.graph.ir import Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext
from fusion.lower.emitter import Emitter, Step, f32_bits
from fusion.lower.errors import MemoryPlanError
from fusion.lower.kernels.vector_ops import dequantize
from fusion.lower.local_alloc import TileArena, largest_fitting
from fusion.lower.views import blocks
from isa.enums import DType, Unit


def _axes(node: Node, rank: int) -> tuple[int, ...]:
    if node.op == OpType.Softmax:
        return (node.attr("axis"),)
    if node.op == OpType.LayerNorm:
        return tuple(range(node.attr("axis"), rank))
    return tuple(sorted(node.attr("axes")))


def lower_rows(cx: LowerContext, node: Node) -> list[list[Step]]:
    x = node.inputs[0]
    xv = cx.view(x)
    rank = len(xv.shape)
    axes = _axes(node, rank)
    kept = tuple(a for a in range(rank) if a not in axes)
    perm = (*kept, *axes)
    src = xv.permute(perm)
    period = math.prod(xv.shape[a] for a in axes)
    out = cx.view(node.outputs[0])
    if node.op == OpType.ReduceMean:
        rows_shape = tuple(xv.shape[a] for a in kept)
        kept_view = out.reshape_dense(rows_shape)
        dst = replace(kept_view, shape=src.shape, strides=kept_view.strides + (0,) * len(axes))
    else:
        dst = out.permute(perm)
    deq = cx.dtype(x) is DType.i8
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
    steps = []
    for block in blocks(src.shape, rows * period, whole=period):
        arena = TileArena(cx.config, len(steps) % 2)
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
        result = red if node.op == OpType.ReduceMean else work
        body = {OpType.Softmax: _softmax, OpType.LayerNorm: _layernorm, OpType.ReduceMean: _mean}[node.op]

        def compute(em: Emitter, raw=raw, xf=xf, work=work, red=red, red2=red2, n=n, tiles=param_tiles) -> None:
            if deq:
                dequantize(em, xf, raw, n, scale)
            body(em, node, xf, work, red, red2, n, period, tiles)

        out_part = block.of(dst)
        if node.op == OpType.ReduceMean:  # the reduced dims were only there to line the blocks up
            keep = len(out_part.shape) - len(axes)
            out_part = replace(out_part, shape=out_part.shape[:keep], strides=out_part.strides[:keep])
        steps.append(Step(loads, [(Unit.vector, compute)], [(result, out_part)]))
    return [steps]


def _softmax(em: Emitter, node: Node, x: int, y: int, m: int, s: int, n: int, p: int, tiles: list[int]) -> None:
    b = em.b
    b.v_rmax(*em.regs(m, x), n, p, "f32")
    b.v_sub_vc(*em.regs(y, x, m), n, p, "f32")
    b.v_exp(*em.regs(y, y), n, "f32")
    b.v_rsum(*em.regs(s, y), n, p, "f32")
    b.v_div_vc(*em.regs(y, y, s), n, p, "f32")


def _mean_rows(em: Emitter, dst: int, src: int, n: int, p: int) -> None:
    em.b.v_rsum(*em.regs(dst, src), n, p, "f32")
    em.b.v_div_vs(*em.regs(dst, dst, f32_bits(float(p))), n // p, "f32")


def _mean(em: Emitter, node: Node, x: int, y: int, m: int, s: int, n: int, p: int, tiles: list[int]) -> None:
    _mean_rows(em, m, x, n, p)


def _layernorm(em: Emitter, node: Node, x: int, y: int, m: int, s: int, n: int, p: int, tiles: list[int]) -> None:
    b = em.b
    rows = n // p
    _mean_rows(em, m, x, n, p)
    b.v_sub_vc(*em.regs(x, x, m), n, p, "f32")  # x is now centred
    b.v_mul(*em.regs(y, x, x), n, "f32")
    _mean_rows(em, s, y, n, p)
    b.v_add_vs(*em.regs(s, s, f32_bits(node.attr("epsilon"))), rows, "f32")
    b.v_sqrt(*em.regs(s, s), rows, "f32")
    b.v_div_vc(*em.regs(y, x, s), n, p, "f32")
    b.v_mul_vr(*em.regs(y, y, tiles[0]), n, p, "f32")
    if len(tiles) > 1:
        b.v_add_vr(*em.regs(y, y, tiles[1]), n, p, "f32")


LOWERINGS = {OpType.Softmax: lower_rows, OpType.LayerNorm: lower_rows, OpType.ReduceMean: lower_rows}
