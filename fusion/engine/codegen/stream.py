"""Matrix -> vector streaming: a MatMul whose output flows straight into a vector chain, never stored.

For a MatMul with K <= N and at most N output columns (one weight tile, no accumulation), each output tile is
streamed row by row from the array into a vector register (`mx.mms` + `vc.lds`) and the consumers (e.g. the
scaled Softmax of attention scores, an activation) run on it in registers: the scores never exist in the
scratchpad or DRAM. On the int8 path the stream carries int32 sums; the chain requantizes them exactly as the
drain would (`vc.rqnt`) and dequantizes like the unfused consumer, so results stay bit-exact.

Any other MatMul with a 2-D weight (K or N beyond the array) is the fused GEMM (`codegen.gemm`, tiled over rows,
weight panels and k-slices) whose drained tiles, instead of being stored, feed the chain in the scratchpad
(`gemm.ChainEpilogue`): the drain requantizes as the unfused MatMul's does, the chain loads the tile and
dequantizes like the unfused consumer (bit-exact again), and only the chain's result is stored. A chain reducing
whole rows (Softmax, LayerNorm, a reduction) needs the row in one tile: at most N output columns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import product

from fusion.engine.codegen.chain import ROWS, Registers, emit_chain, operand_views, operands
from fusion.engine.codegen.gemm import ChainEpilogue, FusedGemm, Schedule, _load_operand, _quantizer, fused_gemm_steps
from fusion.engine.codegen.matrix_group import EPILOGUE_HEADS, bias_of, own_bias, packed_weight
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext
from fusion.lower.emitter import Emitter, Step, Streamed, f32_bits
from fusion.lower.kernels.gemm import Operand
from fusion.lower.kernels.matrix import matrix_operand, requant
from fusion.lower.local_alloc import TileArena
from fusion.lower.views import dense
from isa.enums import Unit

GEMM_DEFAULTS = {"transA": 0, "transB": 0, "alpha": 1.0, "beta": 1.0}


def leading_reshapes(cx: LowerContext, head: Node, rest: Sequence[Node]) -> int:
    """How many Reshapes keeping the last axis follow the matrix node before its chain (views of its output,
    e.g. GPT-2's Gemm back to (batch, tokens, features)); CodegenError when nothing but Reshapes follows."""
    value, k = head.outputs[0], 0
    while k < len(rest) and rest[k].op == OpType.Reshape and rest[k].inputs[0] == value:
        shapes = [cx.graph.types[v].shape for v in (value, rest[k].outputs[0])]
        if shapes[0][-1:] != shapes[1][-1:]:
            raise CodegenError(f"node {rest[k].name!r}: a Reshape before the chain must keep the last axis")
        value, k = rest[k].outputs[0], k + 1
    if k == len(rest):
        raise CodegenError(f"node {head.name!r}: a stream needs a vector chain after its Reshapes")
    return k


def stream_steps(cx: LowerContext, nodes: Sequence[Node]) -> list[Step]:
    head, rest = nodes[0], list(nodes[1:])
    if head.op not in EPILOGUE_HEADS or not rest:
        raise CodegenError(f"node {head.name!r}: a stream is a MatMul or Gemm followed by a vector chain")
    if head.op == OpType.Gemm and any(head.attr(a, d) != d for a, d in GEMM_DEFAULTS.items()):
        raise CodegenError(f"node {head.name!r}: a Gemm with transposes or scaling does not stream")
    views = leading_reshapes(cx, head, rest)
    q = cx.matrix(head) if cx.int8 else None
    a = matrix_operand(cx, head, head.inputs[0], q.input_scale if q else None)
    b = matrix_operand(cx, head, head.inputs[1], q.weight_scale if q else None)
    *batch, m, k = a.view.shape
    n = b.view.shape[-1]
    if k > cx.config.array_size or n > cx.config.array_size or views or head.op == OpType.Gemm:
        return [*_drained_chain_steps(cx, head, rest[views:], a, b, rest[views - 1].outputs[0] if views else None)]
    table = operands(cx, rest, frozenset({head.outputs[0]}))
    if len(b.view.shape) > len(a.view.shape):
        raise CodegenError(f"node {head.name!r}: a streamed weight with more batch axes than the activation")
    b_full = b.view.broadcast_to((*batch, k, n))
    if m * n > cx.config.vreg_elems or m > 4095:
        raise CodegenError(f"node {head.name!r}: a {m} x {n} tile does not fit a vector register")
    out = cx.view(rest[-1].outputs[0])
    ext, rows_in = operand_views(cx, table, out.shape)
    mult_shift = requant(cx, head)
    scale = cx.scale(head.outputs[0])
    steps = []
    for index in product(*(range(d) for d in batch)):
        arena = TileArena(cx.config, len(steps), cx.rotation)
        loads: list = []
        quants: list = []
        a_addr, dt = _load_operand(arena, a, a.view.index(index), loads, quants)
        b_addr, _ = _load_operand(arena, b, b_full.index(index), loads, quants)
        addr = {v: arena.tile(m * n * view.dtype.size) for v, view in ext.items()}
        loads += [(view.index(index), addr[v]) for v, view in ext.items()]
        addr |= {v: arena.tile(n * 4) for v in rows_in}
        loads += [(view, addr[v]) for v, view in rows_in.items()]
        out_addr = arena.tile(m * n * 4)

        def matrix(em: Emitter, a_addr=a_addr, b_addr=b_addr, dt=dt) -> None:
            em.b.mx_preload(em.reg(b_addr), k, n, dt.name)
            em.b.mx_mms(em.reg(a_addr), m)

        def vector(em: Emitter, addr=addr, out_addr=out_addr) -> None:
            regs = Registers()
            r = regs.new(head.outputs[0])
            em.b.vc_lds(r, m * n)
            if mult_shift is not None:
                em.b.vc_rqnt(r, r, em.reg(mult_shift[0]), mult_shift[1])
                em.b.vc_cvt(r, r, "f32")
                em.b.vc_mul_vs(r, r, em.reg(f32_bits(scale)))
            emit_chain(cx, em, rest, table, addr, out_addr, m * n, n, regs)

        compute = [(Unit.vector, _quantizer(quants))] if quants else []
        compute += [(Unit.matrix, matrix), (Unit.vector, Streamed(vector))]  # the chain takes rows as they leave
        steps.append(Step(loads, compute, [(out_addr, out.index(index))]))
    return steps


def _drained_chain_steps(
    cx: LowerContext, head: Node, rest: list[Node], a: Operand, b: Operand, seen_as: str | None
) -> list[Step]:
    """The fused GEMM over all rows of A (batches flattened) with the chain run on each drained tile (a Gemm's
    own bias added in the accumulator, as the unfused Gemm does); the chain reads the output as `seen_as` (a
    Reshape of it keeping the last axis), if given."""
    graph, cfg = cx.graph, cx.config
    if len(b.view.shape) != 2:
        raise CodegenError(f"node {head.name!r}: a chain after a GEMM with K or N beyond the array needs a 2-D weight")
    (k, n), c_value = b.view.shape, seen_as or head.outputs[0]
    rows = math.prod(a.view.shape[:-1])
    if any(node.op in ROWS for node in rest) and n > cfg.array_size:
        raise CodegenError(f"node {head.name!r}: a chain reducing rows of {n} > N columns needs them in one tile")
    table = operands(cx, rest)  # the MatMul's output is the chain's external operand: its drained tile
    tiles, row_views = operand_views(cx, table, graph.types[c_value].shape)
    tiles.pop(c_value, None)
    flat = {v: view.reshaped((rows, n)) for v, view in tiles.items()}
    av, out = a.view.reshaped((rows, k)), cx.view(rest[-1].outputs[0]).reshaped((rows, n))
    if av is None or out is None or any(view is None for view in flat.values()):
        raise CodegenError(f"node {head.name!r}: the GEMM's rows and the chain's tiles must flatten to 2-D views")
    c_dtype = cx.dtype(head.outputs[0])
    own = own_bias(head)

    def step(arena: TileArena, block: tuple[int, int], panels: list[tuple[int, int, int]]):
        (i0, m), j_first = block, panels[0][0]
        span = panels[-1][0] + panels[-1][1] - j_first
        rows_at = {v: arena.tile(span * 4) for v in row_views}  # each row operand once for all the step's panels
        loads = [(view.slice(0, j_first, span), rows_at[v]) for v, view in row_views.items()]
        emits, stores = [], []
        for j0, cols, drained in panels:
            addr = {c_value: drained}
            for v, view in flat.items():
                addr[v] = arena.tile(m * cols * view.dtype.size)
                loads.append((view.slice(0, i0, m).slice(1, j0, cols), addr[v]))
            addr |= {v: at + (j0 - j_first) * 4 for v, at in rows_at.items()}
            out_addr = arena.tile(m * cols * 4)
            emits.append((addr, out_addr, m * cols, cols))
            stores.append((out_addr, out.slice(0, i0, m).slice(1, j0, cols)))

        def emit(em: Emitter) -> None:
            for addr, out_addr, count, period in emits:
                emit_chain(cx, em, rest, table, addr, out_addr, count, period)

        return loads, emit, stores

    chain = ChainEpilogue(step, (*(view.dtype.size for view in flat.values()), 4), (4,) * len(row_views))
    g = FusedGemm(
        Operand(av, a.quantize_scale),
        Operand(b.view, b.quantize_scale),
        dense(0, (rows, n), c_dtype),  # shape and drained dtype only: the chain stores, this is never written
        bias=None if own is None else bias_of(cx, head, own, n),
        requant=requant(cx, head),
        b_panels=packed_weight(cx, head),
        chain=chain,
    )
    return fused_gemm_steps(cfg, g, Schedule(panels=2), alone=True, rotation=cx.rotation)
