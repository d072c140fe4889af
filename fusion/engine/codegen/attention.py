"""Attention as one kernel: scores, scale, position mask, softmax and the product with V; scores never leave
local memory.

The group is an `attention_match.AttentionMatch`. Per (leading index, block of query rows) one pipeline step:

- loads: the block's Q (one DMA per head-dim chunk of at most N columns), each key tile's K^T (one transposing
  `dma.ldt` of the tile's keys: keys are rows of K in DRAM), each (key tile, value chunk) tile of V, all read
  straight from the tensors the layout nodes index (`attention_match.index_map`): the head split, K's transpose
  and the grouped-query repeat of KV heads cost no copy, a shared KV head is read by each of its query heads;
- matrix: per key tile, Q chunks x K^T chunks accumulated (`mx.mm` / `mx.mma`) and drained (int8: requantized
  as the unfused MatMul does) into its columns of the whole m x Sk rows of scores (`mx.drain.s`, row stride Sk);
- vector: per pass of rows, one chain in registers: dequantize, the scale node's recipe, the mask regenerated
  from positions (see below), the Softmax recipe (the unfused kernels' recipes, so the arithmetic is the
  reference's, operation for operation), int8: quantized as the second MatMul quantizes its float operand;
  stored as whole rows of P;
- matrix: P's key tiles read in place from its rows (`mx.mm.s`, row stride Sk) x V tiles, accumulated per value
  chunk of at most N columns, drained (requantized) and stored at the output's place (the head merge is the
  store's view).

Masks: the mask Add's constant is never loaded. Its rule (`PositionMask`) is rebuilt in registers from key and
query positions: a vector of positions 0..P-1 (P = max(Sq, Sk); the kernel's only extra data, in place of an
Sq x Sk mask: the ISA has no instruction producing a position), t = clip(j - i - offset, 0, 1) (causal) and/or
clip(j - (len - 1), 0, 1) (padding), the score plus t * value: exactly the reference's score + mask.

Tiling (`tiling`): the head dim and value dim in chunks of N, the keys in tiles of N, query rows in blocks of as
many rows as fit a buffer slot and a vector register (a whole row of scores per row). K and V of a head that do
not fit a slot beside them stream through it in key blocks inside the step. A row of scores longer than a vector
register runs the online softmax (`_online_step`, FlashAttention's loop: running max and sum in registers, the
output rescaled per key block); fp32 only: its sums are not the reference's, so int8 refuses (CodegenError) rather
than run an inexact kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fusion.engine.attention_match import (
    AttentionMatch,
    HeadMaps,
    PositionMask,
    affine_heads,
    head_maps,
    mask_of,
    match_attention,
    output_map,
    scalar_constant,
    with_out_projection,
    with_projections,
)
from fusion.engine.codegen import attention_order, attention_proj
from fusion.engine.codegen.attention_proj import Projection, projection
from fusion.engine.codegen.chain import Registers, emit_node, operands
from fusion.engine.codegen.gemm import _quantizer, k_slices
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext, const_key
from fusion.lower.emitter import Emitter, Step, f32_bits
from fusion.lower.local_alloc import DEPTH, TileArena, largest_fitting
from fusion.lower.views import View, dense
from isa.enums import Activation, DType, Unit
from isa.fields import NUM_VREGS
from simulator.config import MachineConfig

POSITIONS = "positions"  # constant form: float32 0..P-1, the positions a generated mask is computed from


def group_match(graph: Graph, nodes: Sequence[Node]) -> AttentionMatch:
    """The attention the group's nodes are, exactly; CodegenError otherwise."""
    softmax = [n for n in nodes if n.op == OpType.Softmax]
    match = match_attention(graph, softmax[0]) if len(softmax) == 1 else None
    names = {n.name for n in nodes}
    if match is not None and set(match.names()) != names:
        match = with_projections(graph, match)
        if match is not None and set(match.names()) != names:
            match = with_out_projection(graph, match)
    if match is None or set(match.names()) != names:
        raise CodegenError("the group is not one attention (MatMul, scale, mask, Softmax, MatMul and their layout)")
    return match


def positions_key(match: AttentionMatch) -> str:
    return const_key(match.softmax, POSITIONS)


def attention_forms(graph: Graph) -> dict[str, np.ndarray]:
    """The constants an attention group's kernel reads beyond the graph's: the positions of a generated mask."""
    match = group_match(graph, graph.nodes)
    if match.mask is None:
        return {}
    *_, sq, sk = graph.types[graph.node(match.scores).outputs[0]].shape
    return {positions_key(match): np.arange(max(sq, sk), dtype=np.float32)}


@dataclass(frozen=True)
class HeadOperand:
    """One 2-D operand per leading index, read from `source` through the layout's index map."""

    maps: HeadMaps
    shape: tuple[int, int]
    address: int
    dtype: DType
    quantize: float | None  # int8 path: quantized at this scale on the way in (a float source, or a pre-scale)
    prescale: float | None = None  # a scalar Mul on the operand (in float32, as the reference's Mul node)
    source_scale: float | None = None  # int8 source under a pre-scale: dequantized first
    vreg_elems: int = 0  # a vector register's elements: a pre-scaled int8-path tile is transformed in such pieces

    def view(self, head: int) -> View:
        es = self.dtype.size
        base = self.address + int(self.maps.bases[head]) * es
        return View(base, self.shape, (self.maps.row_stride * es, self.maps.col_stride * es), self.dtype)


def _operand(
    cx: LowerContext,
    value: str,
    layout: Sequence[str],
    lead: tuple[int, ...],
    scale: float | None,
    prescale: str | None = None,
    projected: bool = False,
) -> HeadOperand:
    """`value` read through the layout nodes; `prescale`: a Mul node by a scalar between them and the MatMul."""
    factor = None
    if prescale is not None:
        node = cx.graph.node(prescale)
        if cx.dtype(node.outputs[0]) is not DType.f32:
            raise CodegenError(f"node {prescale!r}: an int8 value inside the attention's float chain")
        factor = next(c for v in node.inputs if (c := scalar_constant(cx.graph, v)) is not None)
        value = next(v for v in node.inputs if not cx.graph.is_constant(v))
    maps = head_maps(cx.graph, value, layout, lead)
    if maps is None:
        raise CodegenError(f"value {value!r}: its layout is not one strided view per head")
    source = cx.graph.node(layout[0]).inputs[0] if layout else value
    shape = cx.graph.types[value].shape[-2:]
    if projected:  # computed in the kernel (`codegen.attention_proj`): no DRAM tensor
        view = dense(0, cx.graph.types[source].shape, cx.dtype(source))
    else:
        view = cx.view(source)
        if view.strides != dense(view.address, view.shape, view.dtype).strides:
            raise CodegenError(f"value {source!r} is not a dense tensor")
    source_scale = cx.scale(source)
    quantize = scale if cx.int8 and (source_scale is None or factor is not None) else None
    staged = source_scale if factor is not None else None
    return HeadOperand(maps, shape, view.address, view.dtype, quantize, factor, staged, cx.config.vreg_elems)


def _output(cx: LowerContext, match: AttentionMatch, lead: tuple[int, ...]) -> HeadOperand:
    context = cx.graph.node(match.context)
    shape = cx.graph.types[context.outputs[0]].shape
    layout = [cx.graph.node(n) for n in match.out_layout]
    final = layout[-1].outputs[0] if layout else context.outputs[0]
    if layout:
        where = output_map(cx.graph, layout, shape)
    else:
        where = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    maps = affine_heads(np.broadcast_to(where, (*lead, *shape[-2:]))) if where is not None else None
    if maps is None:
        raise CodegenError(f"node {context.name!r}: the output's layout is not one strided view per head")
    if match.out_projection is not None:  # read in the kernel by the output projection: no DRAM tensor
        view = dense(0, cx.graph.types[final].shape, cx.dtype(final))
    else:
        view = cx.view(final)
    if cx.dtype(final) is not cx.dtype(context.outputs[0]):
        raise CodegenError(f"value {final!r}: the head merge changes the storage dtype")
    return HeadOperand(maps, shape[-2:], view.address, view.dtype, None)


@dataclass(frozen=True)
class Plan:
    """Everything a step needs that does not depend on the head or the row block."""

    q: HeadOperand
    k: HeadOperand  # K^T: (d, Sk) per head
    v: HeadOperand
    out: HeadOperand
    sq: int
    sk: int
    d: int
    dv: int
    score_dt: DType  # the drained scores (i8 on the int8 path)
    prob_dt: DType  # P as the second MatMul reads it
    out_dt: DType
    requant: tuple[tuple[int, int], tuple[int, int]] | None  # (mult, shift) of both MatMuls, int8
    score_scale: float | None  # dequantization of the scores, int8
    prob_scale: float | None  # quantization of P, int8
    mask: PositionMask | None
    positions: View | None
    proj: Projection | None = None  # Q, K^T and V computed in the kernel from their projections
    outp: attention_proj.OutProjection | None = None  # the merged heads projected in the kernel


def _plan(cx: LowerContext, match: AttentionMatch) -> Plan:
    g = cx.graph
    scores, context = g.node(match.scores), g.node(match.context)
    *lead, sq, sk = g.types[scores.outputs[0]].shape
    lead = tuple(lead)
    q1 = cx.matrix(scores) if cx.int8 else None
    q2 = cx.matrix(context) if cx.int8 else None
    inside = bool(match.projections)
    q = _operand(cx, scores.inputs[0], match.q_layout, lead, q1.input_scale if q1 else None, match.q_scale, inside)
    k = _operand(cx, scores.inputs[1], match.k_layout, lead, q1.weight_scale if q1 else None, match.k_scale, inside)
    v = _operand(cx, context.inputs[1], match.v_layout, lead, q2.weight_scale if q2 else None, None, inside)
    out = _output(cx, match, lead)
    for name in (match.scale, match.mask, match.softmax):
        if name is not None and cx.dtype(g.node(name).outputs[0]) is not DType.f32:
            raise CodegenError(f"node {name!r}: an int8 value inside the attention's float chain")
    mask = mask_of(g, g.node(match.mask)) if match.mask is not None else None
    positions = None
    if mask is not None:
        key = positions_key(match)
        if key not in cx.addresses:
            raise CodegenError(f"node {match.mask!r}: the kernel's DRAM image has no positions for the mask")
        positions = dense(cx.addresses[key], (max(sq, sk),), DType.f32)
    i8 = cx.int8
    proj = projection(cx, match) if inside else None
    outp = attention_proj.out_projection(cx, match, proj) if proj and match.out_projection is not None else None
    return Plan(
        q,
        k,
        v,
        out,
        sq,
        sk,
        q.shape[1],
        v.shape[1],
        DType.i8 if i8 else DType.f32,
        DType.i8 if i8 else DType.f32,
        out.dtype,
        ((q1.mult, q1.shift), (q2.mult, q2.shift)) if q1 and q2 else None,
        cx.scale(scores.outputs[0]),
        q2.input_scale if q2 else None,
        mask,
        positions,
        proj,
        outp,
    )


def _op_dt(op: HeadOperand) -> DType:
    return DType.i8 if op.quantize is not None else op.dtype


@dataclass(frozen=True)
class Tiling:
    """How one attention is cut: query rows per step, keys per block (one block: K and V loaded with the step's Q
    and prefetched under the previous step; several: loaded block by block inside the step, in the same
    buffers), and whether operands are loaded whole and split locally into N-wide chunks (else one DMA each)."""

    rows: int
    block_keys: int
    local_split: bool
    online: bool = False  # rows longer than a vector register: running max and sum over key blocks (fp32)
    v_by_chunk: bool = True  # V: one DMA per value chunk over the block's keys (else per key tile, see local_split)
    sub_rows: int = 0  # rows of scores per vector-register pass (0: all the step's rows); the matrix unit takes all

    @property
    def register_rows(self) -> int:
        return self.sub_rows or self.rows


def _loaded(op: HeadOperand, elems: int) -> list[int]:
    """The tiles one loaded operand tile takes: as loaded, int8 copy (int8 path)."""
    return [elems * op.dtype.size] + ([elems] if op.quantize is not None else [])


def _tile_bytes(p: Plan, n: int, t: Tiling) -> tuple[list[int], list[int]]:
    """Scratchpad and accumulator tiles of a step, one entry per tile `_step` (`_online_step`) allocates."""
    spad: list[int] = []
    m = t.rows

    def operand(op: HeadOperand, rows: int, cols: int, in_place: bool = False) -> None:
        parts = [cols] if t.local_split else [kc for _, kc in k_slices(cols, n)]
        for c in parts:
            spad.extend(_loaded(op, rows * c))
        if t.local_split and cols > n and not in_place:  # the chunks the matrix unit reads
            spad.extend(rows * kc * _op_dt(op).size for _, kc in k_slices(cols, n))

    operand(p.q, m, p.d, in_place=True)
    acc_extra = []
    if p.proj is not None:
        spad += [*attention_proj.activation_tiles(p.proj, m, p.sk, n), attention_proj.weight_tile(p.proj)]
        acc_extra += attention_proj.acc_bytes(p.proj, m, p.sk, n)
    if p.outp is not None:
        spad += attention_proj.out_tiles(p.outp, m, n)
    ktiles = k_slices(min(t.block_keys, p.sk), n)
    for _, bk in ktiles:
        spad += _loaded(p.k, p.d * bk)
    block = sum(bk for _, bk in ktiles)
    for _, ec in k_slices(p.dv, n) if t.v_by_chunk else ():  # V: one tile per value chunk over the block's keys
        spad.extend(_loaded(p.v, block * ec))
    for _, bk in ktiles if not t.v_by_chunk else ():
        operand(p.v, bk, p.dv)
    if p.positions is not None:
        spad.append(p.positions.size * 4)
    echunks = k_slices(p.dv, n)
    if t.online:  # a block's scores and probabilities (rows, key tiles), the output and a block's product
        spad += [m * t.block_keys * 4] * 2 + [m * ec * 4 for _, ec in echunks] * 2
        return spad, [m * n * len(echunks) * 4]
    spad += [m * p.sk * p.score_dt.size, m * p.sk * p.prob_dt.size]  # whole rows (`_head_stages`)
    spad += [m * ec * p.out_dt.size for _, ec in echunks]
    streamed = t.block_keys < -(-p.sk // n) * n
    return spad, [*acc_extra, m * n * (len(echunks) if streamed else 1) * 4]


def _v_by_chunk(cfg: MachineConfig, p: Plan) -> bool:
    """V by value chunk (a DMA per chunk, no copies) when that costs less than a DMA per key tile plus the copies
    splitting it into chunks (about three issue cycles each: two addresses and the copy)."""
    n = cfg.array_size
    per_tile = -(-p.sk // n) * cfg.dram_latency + (p.sk * -(-p.dv // n) * 3 if p.dv > n else 0)
    return -(-p.dv // n) * cfg.dram_latency <= per_tile


def tiling(cfg: MachineConfig, p: Plan, softmax: str) -> Tiling:
    """The most query rows per step (a whole row of scores per row in a vector register), K and V of a head in
    the step when they fit, else in the largest key blocks that fit."""
    n = cfg.array_size
    rows = min(p.sq, cfg.vreg_elems // p.sk, 4095)  # rows of scores a vector register holds
    cap = min(p.sq, 4095)  # rows the matrix unit takes per step (the softmax runs in register-sized passes)
    probe = TileArena(cfg, 0)
    if p.proj is not None:
        attention_proj.check_heads(p.proj, p.d, p.dv)

    def fits(t: Tiling) -> bool:
        return probe.fits(*_tile_bytes(p, n, t))

    whole = -(-p.sk // n) * n
    by_chunk = _v_by_chunk(cfg, p) or p.proj is not None  # a projection drains V by value chunk
    splits = (False,) if p.proj is not None else (True, False)  # ... and Q by chunk: no whole-row tile to split
    if rows:
        for local_split in splits:
            m = largest_fitting(cap, lambda r, s=local_split: fits(Tiling(r, whole, s, False, by_chunk, min(r, rows))))
            if m >= min(rows, n):
                m = -(-p.sq // -(-p.sq // m))
                return Tiling(m, whole, local_split, False, by_chunk, min(m, rows))
        if p.proj is not None:
            raise CodegenError(
                f"node {softmax!r}: a head's K and V ({p.sk} keys) and its projections do not fit one buffer slot "
                "(K and V computed in the kernel are not streamed in key blocks)"
            )
        for local_split in (True, False):
            m = min(rows, n)
            while m and not fits(Tiling(m, n, local_split, False, by_chunk)):
                m //= 2
            if m:
                keys = n * largest_fitting(
                    whole // n, lambda b, m=m, s=local_split: fits(Tiling(m, b * n, s, False, by_chunk))
                )
                return Tiling(-(-p.sq // -(-p.sq // m)), keys, local_split, False, by_chunk)
    if p.proj is not None:
        raise CodegenError(f"node {softmax!r}: rows of {p.sk} scores beyond a vector register with the projections")
    if p.requant is not None:
        raise CodegenError(
            f"node {softmax!r}: int8 rows of {p.sk} scores beyond a vector register would need the online softmax, "
            "whose sums are not the reference's (not bit-exact)"
        )
    for local_split in (True, False):  # online: m rows x a block of keys in a vector register
        m = min(p.sq, n, cfg.vreg_elems // n)
        while m and not fits(Tiling(m, n, local_split, True)):
            m //= 2
        if m:
            limit = min(whole, cfg.vreg_elems // m) // n
            keys = n * largest_fitting(limit, lambda b, m=m, s=local_split: fits(Tiling(m, b * n, s, True)))
            return Tiling(-(-p.sq // -(-p.sq // m)), keys, local_split, True)
    raise CodegenError(f"node {softmax!r}: one key tile of K and V and the rows of scores do not fit a buffer slot")


def attention_steps(cx: LowerContext, nodes: Sequence[Node]) -> list[Step]:
    match = group_match(cx.graph, nodes)
    p = _plan(cx, match)
    t = tiling(cx.config, p, match.softmax)
    heads = len(p.q.maps.bases)
    blocks = [(h, i0, rows_i) for h in range(heads) for i0, rows_i in k_slices(p.sq, t.rows)]
    if not t.online and 1 < len(blocks) <= DEPTH and t.block_keys >= p.sk:
        arenas = [TileArena(cx.config, j, cx.rotation) for j in range(len(blocks))]
        return [_grouped_step(cx, match, p, arenas, blocks, t)]
    steps = []
    for block in blocks:
        arena = TileArena(cx.config, len(steps), cx.rotation)
        if t.online:
            steps.append(_online_step(cx, match, p, arena, block, t))
        else:
            steps.append(_grouped_step(cx, match, p, [arena], [block], t))
    return steps


@dataclass(frozen=True)
class Buffer:
    """Local tiles of one operand part: as loaded (one per DMA), its int8 copies (a float source on the int8
    path), and the dense chunks of at most N columns the matrix unit reads."""

    raw: tuple[int, ...]
    quant: tuple[int, ...] | None
    chunks: tuple[int, ...]
    stride: int = 0  # bytes between a chunk's rows when the chunks are read in place (`mx.mm.s`), else dense


def _mm(em: Emitter, buf: Buffer, first: bool, acc: int, chunk: int, rows: int) -> None:
    """The product of a chunk of `buf` as the matrix unit's A operand (read in place when it has a stride)."""
    if buf.stride:
        (em.b.mx_mm_s if first else em.b.mx_mma_s)(*em.regs(acc, chunk, buf.stride), rows)
    else:
        (em.b.mx_mm if first else em.b.mx_mma)(*em.regs(acc, chunk), rows)


def _alloc_region(
    arena: TileArena, op: HeadOperand, rows: int, cols: int, n: int, local_split: bool, in_place: bool = False
) -> Buffer:
    """`in_place`: the matrix unit reads the chunks of a whole-row tile as A in place (Q; V is preloaded, and a
    preload has no strided form)."""
    widths = [cols] if local_split else [kc for _, kc in k_slices(cols, n)]
    raw = tuple(arena.tile(rows * w * op.dtype.size) for w in widths)
    quant = tuple(arena.tile(rows * w) for w in widths) if op.quantize is not None else None
    read = quant or raw
    es = _op_dt(op).size
    if local_split and cols > n and in_place:
        return Buffer(raw, quant, tuple(read[0] + c0 * es for c0, _ in k_slices(cols, n)), cols * es)
    if local_split and cols > n:
        read = tuple(arena.tile(rows * kc * _op_dt(op).size) for _, kc in k_slices(cols, n))
    return Buffer(raw, quant, read)


def _fill_region(buf: Buffer, op: HeadOperand, part: View, n: int, work: dict[str, list]) -> None:
    """Load `part` into the buffer (its rows may be fewer than allocated): DMAs, quantization, chunk copies."""
    rows, cols = part.shape
    parts = [part] if len(buf.raw) == 1 else _column_chunks(part, n)
    for i, (piece, raw) in enumerate(zip(parts, buf.raw, strict=True)):
        work["loads"].append(lambda em, v=piece, a=raw: em.dma_load(v, a))
        _transform(buf, op, i, piece.size, work)
    if len(buf.raw) == 1 and cols > n and not buf.stride:
        src, dt = (buf.quant or buf.raw)[0], _op_dt(op)
        work["copies"].append(lambda em: _split_columns(em, src, list(buf.chunks), rows, cols, n, dt))


def _alloc_kt(arena: TileArena, op: HeadOperand, rows: int, cols: int, n: int = 0, row: int | None = None) -> Buffer:
    """Dense rows x cols tiles, one per column chunk of at most n (n = 0: one tile), loaded as they are read;
    `row`: the one tile is already there (a computed K's row, `attention_proj.KTrip`)."""
    widths = [c for _, c in k_slices(cols, n)] if n else [cols]
    raw = (row,) if row is not None else tuple(arena.tile(rows * w * op.dtype.size) for w in widths)
    quant = tuple(arena.tile(rows * w) for w in widths) if op.quantize is not None else None
    return Buffer(raw, quant, quant or raw)


def _transform(buf: Buffer, op: HeadOperand, i: int, count: int, work: dict[str, list]) -> None:
    """The i-th loaded tile as the matrix unit reads it: the pre-scale in float32 (an int8 source dequantized
    first, as the reference's Mul reads it), then quantized at the MatMul's scale (int8 path). A pre-scaled tile
    on the int8 path is one vector chain (load, dequantize, scale, quantize, store: one pass over the tile, not
    one per operation); the float32 path scales in place."""
    raw = buf.raw[i]
    if op.prescale is not None and buf.quant is not None:
        work["scales"].append(lambda em, dst=buf.quant[i], src=raw: _scale_quantize(em, dst, src, count, op))
        return
    if op.prescale is not None:
        scale = f32_bits(op.prescale)
        work["scales"].append(lambda em, a=raw: em.b.v_mul_vs(*em.regs(a, a, scale), count, "f32"))
    if buf.quant is not None:
        work["quants"].append((buf.quant[i], raw, count, 1.0 / op.quantize))


CHAIN_REG = NUM_VREGS - 1  # the transform's vector register: the online softmax keeps its state in v0-v2


def _scale_quantize(em: Emitter, dst: int, src: int, count: int, op: HeadOperand) -> None:
    """int8 dst = quantize(prescale * (src, dequantized if int8)) in register-sized pieces: the same float32
    operations, in the same order, as the reference's dequantize, Mul and quantize."""
    r, es = CHAIN_REG, op.dtype.size
    for at, size in k_slices(count, op.vreg_elems):
        em.b.vc_ld(r, em.reg(src + at * es), size, op.dtype.name)
        if op.source_scale is not None:
            em.b.vc_cvt(r, r, "f32")
            em.b.vc_mul_vs(r, r, em.reg(f32_bits(op.source_scale)))
        em.b.vc_mul_vs(r, r, em.reg(f32_bits(op.prescale)))
        em.b.vc_qnt(r, r, em.reg(f32_bits(1.0 / op.quantize)))
        em.b.vc_st(em.reg(dst + at), r)


def _alloc_v(arena: TileArena, v: HeadOperand, keys: list[tuple[int, int]], dv: int, n: int, t: Tiling) -> list[Buffer]:
    """V's buffers for one key block: a tile per value chunk over all its keys (`t.v_by_chunk`), else a region per
    key tile (split locally into chunks, or loaded chunk by chunk: `t.local_split`)."""
    if t.v_by_chunk:
        return [_alloc_kt(arena, v, sum(bk for _, bk in keys), dv, n)]
    return [_alloc_region(arena, v, bk, dv, n, t.local_split) for _, bk in keys]


def _fill_v(
    bufs: list[Buffer], v: HeadOperand, view: View, keys: list, n: int, t: Tiling, work: dict[str, list]
) -> None:
    if not t.v_by_chunk:
        for (j0, bk), buf in zip(keys, bufs, strict=False):
            _fill_region(buf, v, view.slice(0, j0, bk), n, work)
        return
    (buf,) = bufs
    part = view.slice(0, keys[0][0], sum(bk for _, bk in keys))
    for i, piece in enumerate(_column_chunks(part, n)):  # one DMA per value chunk, every key's row of it
        work["loads"].append(lambda em, x=piece, a=buf.raw[i]: em.dma_load(x, a))
        _transform(buf, v, i, piece.size, work)


def _v_tile(bufs: list[Buffer], t: Tiling, i: int, e: int, offset: int) -> int:
    """Where the i-th key tile of the block's value chunk e is (`offset`: its first key's bytes in a chunk tile)."""
    return bufs[0].chunks[e] + offset if t.v_by_chunk else bufs[i].chunks[e]


def _fill_kt(buf: Buffer, op: HeadOperand, part: View, work: dict[str, list]) -> None:
    """K^T's (d, bk) tile, dense: one transposing load of the tile's keys when they are rows of K in DRAM (the
    head dim contiguous), one plain load when K^T itself has contiguous rows, else the view's transfers."""
    d, bk = part.shape
    es = part.dtype.size
    raw = buf.raw[0]
    if part.strides[0] == es and bk > 1:
        stride = part.strides[1]
        work["loads"].append(lambda em: em.b.dma_ldt(*em.regs(raw, part.address, stride), bk, d, part.dtype.name))
    else:
        work["loads"].append(lambda em: em.dma_load(part, raw))
    _transform(buf, op, 0, d * bk, work)


def _work() -> dict[str, list]:
    keys = ("loads", "xquants", "project", "scales", "quants", "copies", "kstore", "kload")
    return {key: [] for key in keys}


def _block_loads(work: dict[str, list]) -> list:
    """A key block's loads inside a step, then the vector unit's work on them (if any)."""
    return [(Unit.load, _run(work["loads"]))] + ([(Unit.vector, _prepare(work))] if _busy(work) else [])


def _busy(work: dict[str, list]) -> bool:
    """Whether the vector unit has work on the loaded tiles (scale, quantize, split)."""
    return bool(work["scales"] or work["quants"] or work["copies"])


def _run(fns: list) -> Callable[[Emitter], None]:
    def emit(em: Emitter) -> None:
        for fn in fns:
            fn(em)

    return emit


def _prepare(work: dict[str, list]) -> Callable[[Emitter], None]:
    def emit(em: Emitter) -> None:
        for fn in work["scales"]:
            fn(em)
        _quantizer(work["quants"])(em)
        for fn in work["copies"]:
            fn(em)

    return emit


@dataclass(frozen=True)
class StepOperands:
    """A step's operand buffers and the work filling them: Q (and positions) with the step's first loads, K^T and
    V per key block (one block's buffers, reused by every block)."""

    head: dict[str, list]
    q: Buffer
    positions: int
    ktiles: list[tuple[int, int]]
    kblocks: list[list[tuple[int, int]]]
    k: list[Buffer]
    v: list[Buffer]
    k_work: list[dict[str, list]]
    v_work: list[dict[str, list]]
    weights: int = 0  # the step's packed projection weights' tile (`codegen.attention_proj`), read by W_o's products


def _step_operands(
    arena: TileArena,
    p: Plan,
    block: tuple[int, int, int],
    t: Tiling,
    n: int,
    gt: GroupTiles,
    shared: TileArena | None = None,
) -> StepOperands:
    """`gt`: the tiles the step's head blocks share (the first block loads the positions); `shared`: the arena of
    the projections' activation tiles every step reads (`attention_proj.shared_arena`)."""
    h, i0, m = block
    head = _work()
    q_buf = _alloc_region(arena, p.q, m, p.d, n, t.local_split, in_place=True)
    pos = arena.tile(p.positions.size * 4) if p.positions is not None else 0
    load = [lambda em: em.dma_load(p.positions, pos)] if p.positions is not None else []
    if p.proj is not None:
        head["loads"] += load
        return _projected_operands(arena, p, block, t, n, head, q_buf, pos, gt, shared)
    _fill_region(q_buf, p.q, p.q.view(h).slice(0, i0, m), n, head)
    head["loads"] += load
    ktiles = k_slices(p.sk, n)
    per_block = t.block_keys // n
    kblocks = [ktiles[b : b + per_block] for b in range(0, len(ktiles), per_block)]
    kview, vview = p.k.view(h), p.v.view(h)
    k_bufs = [_alloc_kt(arena, p.k, p.d, bk) for _, bk in kblocks[0]]
    v_bufs = _alloc_v(arena, p.v, kblocks[0], p.dv, n, t)
    k_work, v_work = [_work() for _ in kblocks], [_work() for _ in kblocks]
    for b, keys in enumerate(kblocks):
        for (j0, bk), kb in zip(keys, k_bufs, strict=False):
            _fill_kt(kb, p.k, kview.slice(1, j0, bk), k_work[b])
        _fill_v(v_bufs, p.v, vview, keys, n, t, v_work[b])
    return StepOperands(head, q_buf, pos, ktiles, kblocks, k_bufs, v_bufs, k_work, v_work)


def _projected_operands(
    arena: TileArena,
    p: Plan,
    block: tuple[int, int, int],
    t: Tiling,
    n: int,
    head: dict,
    q_buf: Buffer,
    pos: int,
    gt: GroupTiles,
    shared: TileArena | None,
) -> StepOperands:
    """`_step_operands` when Q, K^T and V are computed (`codegen.attention_proj`): the same buffers, filled by the
    projections (one key block: a whole head's K and V) and then transformed as loaded ones are."""
    ktiles = k_slices(p.sk, n)
    loads, quants, emit, weights, trip = attention_proj.step_projection(
        arena, p.proj, block, p.sk, n, list(gt.proj_accs), shared
    )
    # a key tile K's round trip reads in place (K's row) is transformed from there as a loaded one would be
    in_place = trip.in_place() if trip is not None else [None] * len(ktiles)
    k_bufs = [_alloc_kt(arena, p.k, p.d, bk, row=a) for (_, bk), a in zip(ktiles, in_place, strict=True)]
    v_bufs = _alloc_v(arena, p.v, ktiles, p.dv, n, t)
    head["loads"] += loads
    if trip is not None:
        loaded = [kb.raw[0] if a is None else None for kb, a in zip(k_bufs, in_place, strict=True)]
        head["kstore"], head["kload"] = trip.calls(loaded)
    head["xquants"] += quants
    tiles = (list(q_buf.raw), [kb.raw[0] for kb in k_bufs], list(v_bufs[0].raw))
    head["project"].append(lambda em: emit(em, tiles))
    for i, (_, ec) in enumerate(k_slices(p.d, n)):
        _transform(q_buf, p.q, i, block[2] * ec, head)
    for kb, (_, bk) in zip(k_bufs, ktiles, strict=True):
        _transform(kb, p.k, 0, p.d * bk, head)
    for i, (_, ec) in enumerate(k_slices(p.dv, n)):
        _transform(v_bufs[0], p.v, i, p.sk * ec, head)
    return StepOperands(head, q_buf, pos, ktiles, [ktiles], k_bufs, v_bufs, [_work()], [_work()], weights)


@dataclass(frozen=True)
class GroupTiles:
    """Accumulator tiles a step's head blocks share: the projections' (`attention_proj.acc_bytes`) and the
    scores' and product's; only the matrix unit uses them, in order, each drained before the next head's products
    start."""

    proj_accs: tuple[int, ...] = ()
    acc: int = 0
    score_regions: bool = False  # one region per key tile: every score product issued, then every drain
    product_regions: bool = False  # one region per value chunk (else one, each chunk drained before the next)


def _group_tiles(cfg: MachineConfig, arena: TileArena, p: Plan, t: Tiling, m: int, n: int) -> GroupTiles:
    proj = attention_proj.acc_bytes(p.proj, m, p.sk, n) if p.proj is not None else []
    proj_accs = tuple(arena.acc_tile(b) for b in proj)
    ktiles, echunks = len(k_slices(min(t.block_keys, p.sk), n)), len(k_slices(p.dv, n))
    streamed = t.block_keys < -(-p.sk // n) * n
    probe = TileArena(cfg, 0)
    # one accumulator region per value chunk (when they fit) lets the chunks' products follow each other through
    # the array, each drained after the last one is issued, instead of a drain waiting after each; the same for
    # the scores' key tiles
    product = streamed or probe.fits([], [m * n * echunks * 4])
    regions = echunks if product else 1
    scores = ktiles > 1 and probe.fits([], [*proj, m * n * max(ktiles, regions) * 4])
    acc = arena.acc_tile(m * n * max(ktiles if scores else 1, regions) * 4)
    return GroupTiles(proj_accs, acc, scores, product)


def _grouped_step(
    cx: LowerContext,
    match: AttentionMatch,
    p: Plan,
    arenas: list[TileArena],
    blocks: list[tuple[int, int, int]],
    t: Tiling,
) -> Step:
    """Head blocks in one step, block j's tiles in buffer slot j (its own banks: one unit's work on one block
    never waits for another unit's on another), their stages unit by unit (loads, quantize, project, prepare,
    scores, softmax, product, stores): each unit takes one stage of every block in turn and hands each block's
    part to the next unit as soon as it is done (a token per block), so the matrix unit projects or scores one
    head while the vector unit runs another's softmax; the instructions in the order `attention_order` expects
    them to start. One block: the pipeline's step, its stages one segment each."""
    n = cx.config.array_size
    gt = _group_tiles(cx.config, arenas[0], p, t, blocks[0][2], n)
    alone = len(blocks) == 1
    parts = [_head_stages(cx, match, p, a, b, t, gt, alone) for a, b in zip(arenas, blocks, strict=True)]
    if len(parts) == 1:
        ((stages, stores),) = parts
        return Step([], [(u, _run(fns)) for u, fns in _runs([stages])[0]], stores)
    heads = []
    for stages, stores in parts:
        store = [lambda em, a=a, v=v: em.dma_store(a, v) for a, v in stores]
        heads.append([*stages, (Unit.store, _run(store) if store else None)])
    runs = _runs(heads)
    recorded = [[(unit, _recorded(head, r)) for r, (unit, _) in enumerate(head)] for head in runs]
    orders = _orders(cx, [_hand_on(cx.config, head) for head in recorded])
    order = min(orders, key=lambda o: attention_order.estimate(cx.config, o))
    if p.proj is not None:  # matrix-bound (loads only X and weights): its preloads under the drains' wait
        order = attention_order.hoist_preloads(order)
    # no stores described: the step's tiles lie in every slot (`pipelined.step_slots` then assumes all)
    return Step([], [(runs[0][-1][0], lambda em: attention_order.replay(em, order))], [])


def _orders(cx: LowerContext, parts: list[list[tuple[Unit, list]]]) -> list[list]:
    """The pipeline's order; each unit stage by stage (the heads in turn) or head by head, merged."""
    stages, heads = range(len(parts[0])), range(len(parts))
    return [
        _pipelined(parts),
        attention_order.merge(cx.config, _streams([parts[g][r] for r in stages for g in heads]))[0],
        attention_order.merge(cx.config, _streams([parts[g][r] for g in heads for r in stages]))[0],
    ]


def _recorded(head: list[tuple[Unit, list[Callable]]], r: int) -> list:
    """Stage run r of a head as instructions, with its tokens: popped from the previous run's unit first, pushed
    to the next run's unit last. Runs with no work at the head's end (a head that stores nothing) take no
    tokens: a push waits for every result before it, for nothing."""
    end = len(head)
    while end > 1 and not head[end - 1][1]:
        end -= 1
    if r >= end:
        return []
    unit, fns = head[r]
    calls = [attention_order.token(head[r - 1][0], unit, False)] if r else []
    calls += attention_order.record(fns)
    return calls + ([attention_order.token(unit, head[r + 1][0], True)] if r + 1 < end else [])


def _hand_on(cfg: MachineConfig, head: list[tuple[Unit, list]]) -> list[tuple[Unit, list]]:
    """The head's first run of loads with the tiles whose banks its next run never touches (`attention_order`: in a
    projected head, the weights only the matrix unit reads after the vector unit has quantized X) loaded after
    that run's token, and handed to the run after it by a token of their own: the vector unit starts on X while
    the weights are still loading instead of waiting for all of them. Which loads those are comes from the
    recorded instructions (`_recorded` ends a run with its push)."""
    if len(head) < 3 or head[0][0] is not Unit.load or head[2][0] is Unit.load:
        return head
    *loads, push = head[0][1]
    nxt = [c for c in head[1][1] if c.name not in ("sync_push", "sync_pop")]
    read = [
        any(attention_order.touches(r, *attention_order.written(c, cfg.spad_bank_bytes)) for r in nxt) for c in loads
    ]
    needed = [c for c, r in zip(loads, read, strict=True) if r]
    later = [c for c, r in zip(loads, read, strict=True) if not r]
    if not later:
        return head
    # a later load writing over an earlier needed one's bytes keeps its place (no reordered overwrite)
    if any(_overlap(attention_order.written(a), attention_order.written(b)) for a in later for b in needed):
        return head
    unit = head[2][0]
    first = (Unit.load, [*needed, push, *later, attention_order.token(Unit.load, unit, True)])
    return [first, head[1], (unit, [attention_order.token(Unit.load, unit, False), *head[2][1]]), *head[3:]]


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _pipelined(parts: list[list[tuple[Unit, list]]]) -> list:
    """The order `run_pipeline` gives steps of one head each: a head's loads before the previous head's compute."""
    loads = [[c for unit, calls in head if unit is Unit.load for c in calls] for head in parts]
    rest = [[c for unit, calls in head if unit is not Unit.load for c in calls] for head in parts]
    order = list(loads[0])
    for g in range(len(parts)):
        order += (loads[g + 1] if g + 1 < len(parts) else []) + rest[g]
    return order


def _streams(parts: list[tuple[Unit, list]]) -> dict[Unit, list]:
    """Each unit's instructions, its parts in the given order."""
    streams: dict[Unit, list] = {}
    for unit, calls in parts:
        streams.setdefault(unit, []).extend(calls)
    return streams


def _runs(heads: list[list[tuple[Unit, Callable | None]]]) -> list[list[tuple[Unit, list[Callable]]]]:
    """Per head: its stages as runs on one unit each (unit, emit functions), the same units for every head (a
    stage is left out when no head has work in it)."""
    units = [u for u, _ in heads[0]]
    keep = [k for k in range(len(units)) if any(stages[k][1] is not None for stages in heads)]
    runs: list[list[int]] = []
    for k in keep:
        if runs and units[runs[-1][-1]] == units[k]:
            runs[-1].append(k)
        else:
            runs.append([k])
    return [
        [(units[run[0]], [stages[k][1] for k in run if stages[k][1] is not None]) for run in runs] for stages in heads
    ]


def _head_stages(
    cx: LowerContext,
    match: AttentionMatch,
    p: Plan,
    arena: TileArena,
    block: tuple[int, int, int],
    t: Tiling,
    gt: GroupTiles,
    alone: bool = False,
) -> tuple[list[tuple[Unit, Callable | None]], list]:
    """One head's block of m query rows: its stages (unit, emit or None), the same units for every block, and its
    stores. Q, each key tile's K^T and V loaded with one DMA each (or computed: `codegen.attention_proj`), split
    locally into the chunks of at most N columns the matrix unit reads (else one DMA per chunk). Keys in blocks
    (`t.block_keys`): each block's K^T then V reuse the same buffers, loaded once the matrix unit is done with
    the previous block (one step's segments run in order)."""
    h, i0, m = block
    n = cx.config.array_size
    g = cx.graph
    shared = attention_proj.shared_arena(cx.config, p.proj, m, p.sq, p.sk) if p.proj is not None else None
    io = _step_operands(arena, p, block, t, n, gt, shared)
    head, q_buf, pos, kblocks = io.head, io.q, io.positions, io.kblocks
    k_bufs, v_bufs, k_work, v_work = io.k, io.v, io.k_work, io.v_work
    ses = p.score_dt.size
    pes = p.prob_dt.size
    # whole rows: each key tile's scores drained into its columns (mx.drain.s) and its probabilities read in place
    # by the product (mx.mm.s), both at row stride sk, so no per-row copies between key tiles and rows
    s_rows = arena.tile(m * p.sk * ses)
    p_rows = arena.tile(m * p.sk * pes)
    echunks = k_slices(p.dv, n)
    streamed = len(kblocks) > 1  # the product accumulates over key blocks: one region per value chunk
    acc, regions = gt.acc, gt.product_regions
    o_tiles = [arena.tile(m * ec * p.out_dt.size) for _, ec in echunks]
    (mult1, shift1), (mult2, shift2) = p.requant or ((f32_bits(1.0), 0), (f32_bits(1.0), 0))
    kdt, vdt = _op_dt(p.k), _op_dt(p.v)
    first_tile = [sum(len(kb) for kb in kblocks[:b]) for b in range(len(kblocks))]

    def scores(b: int) -> Callable[[Emitter], None]:
        tiles = list(zip(kblocks[b], k_bufs, strict=False))
        at = [acc + (i * m * n * 4 if gt.score_regions else 0) for i in range(len(tiles))]

        def drain(em: Emitter, lo: int, hi: int) -> None:
            em.b.ep_cfg(*em.regs(0, 0, mult1), shift1, Activation.none, "none", p.score_dt.name)
            for j in range(lo, hi):
                (j0, bk), _ = tiles[j]
                if bk == p.sk:  # the whole rows
                    em.b.mx_drain(*em.regs(s_rows, at[j]), m, bk)
                else:
                    em.b.mx_drain_s(*em.regs(s_rows + j0 * ses, at[j], p.sk * ses), m, bk)

        def emit(em: Emitter) -> None:
            for i, ((_, bk), kb) in enumerate(tiles):
                for ci, ((c0, kc), q_addr) in enumerate(zip(k_slices(p.d, n), q_buf.chunks, strict=True)):
                    em.b.mx_preload(em.reg(kb.chunks[0] + c0 * bk * kdt.size), kc, bk, kdt.name)
                    _mm(em, q_buf, ci == 0, at[i], q_addr, m)
                if not gt.score_regions:  # one region: each tile drained before the next one's products
                    drain(em, i, i + 1)
            if gt.score_regions:  # every tile's products back to back, then the drains
                drain(em, 0, len(tiles))

        return emit

    def softmax(em: Emitter) -> None:
        for r0, rows in k_slices(m, t.register_rows):  # register-sized passes over the step's rows
            _softmax_pass(em, r0, rows)

    def _softmax_pass(em: Emitter, r0: int, rows: int) -> None:
        s_at, p_at = s_rows + r0 * p.sk * ses, p_rows + r0 * p.sk * pes
        regs = Registers()
        scores_out = g.node(match.scores).outputs[0]
        r = regs.new(scores_out)
        em.b.vc_ld(r, em.reg(s_at), rows * p.sk, p.score_dt.name)
        if p.score_scale is not None:
            em.b.vc_cvt(r, r, "f32")
            em.b.vc_mul_vs(r, r, em.reg(f32_bits(p.score_scale)))
        for name in (match.scale, match.mask, match.softmax):
            if name is None:
                continue
            node = g.node(name)
            if name == match.mask:
                src = regs.of[_chain_input(g, node, regs)]
                out = _emit_mask(em, regs, src, p.mask, (i0 + r0, rows, 0, p.sk), pos)
            else:
                out = _emit_recipe(cx, em, regs, node, p.sk)
            regs.of[node.outputs[0]] = out
        out = regs.of[g.node(match.softmax).outputs[0]]
        if p.prob_scale is not None:
            em.b.vc_qnt(out, out, em.reg(f32_bits(1.0 / p.prob_scale)))
        em.b.vc_st(em.reg(p_at), out)

    def context(b: int) -> Callable[[Emitter], None]:
        def emit(em: Emitter) -> None:
            last = b == len(kblocks) - 1
            if last:
                em.b.ep_cfg(*em.regs(0, 0, mult2), shift2, Activation.none, "none", p.out_dt.name)
            for e, (_, ec) in enumerate(echunks):
                region = acc + (e * m * n * 4 if regions else 0)  # one region: each chunk drained before the next
                for i, (j0, bk) in enumerate(kblocks[b]):
                    j = first_tile[b] + i
                    v_at = _v_tile(v_bufs, t, i, e, (j0 - kblocks[b][0][0]) * ec * vdt.size)
                    em.b.mx_preload(em.reg(v_at), bk, ec, vdt.name)
                    if bk == p.sk:  # the whole rows
                        (em.b.mx_mm if j == 0 else em.b.mx_mma)(*em.regs(region, p_rows), m)
                    else:
                        (em.b.mx_mm_s if j == 0 else em.b.mx_mma_s)(*em.regs(region, p_rows + j0 * pes, p.sk * pes), m)
                if last and not regions:
                    em.b.mx_drain(*em.regs(o_tiles[e], region), m, ec)
            for e, (_, ec) in enumerate(echunks) if last and regions else ():
                em.b.mx_drain(*em.regs(o_tiles[e], acc + e * m * n * 4), m, ec)

        return emit

    if not streamed:  # K and V with the step's first loads: prefetched under the previous step
        for key in head:
            head[key] += k_work[0][key] + v_work[0][key]
    # a streamed step (or a step alone loading its K back from DRAM) loads inside its segments: it must not start
    # with loads, which the pipeline would issue under the previous step (their hand-over tokens would then pair
    # with this step's later loads)
    compute: list = [(Unit.scalar, _run([]))] if streamed or (alone and head["kload"]) else []
    compute.append((Unit.load, _run(head["loads"]) if head["loads"] else None))
    compute.append((Unit.vector, _quantizer(head["xquants"]) if head["xquants"] else None))
    compute.append((Unit.matrix, _run(head["project"]) if head["project"] else None))
    if head["kstore"]:  # K round-trips through DRAM (`attention_proj.round_trips`), loaded back transposed
        compute += [(Unit.store, _run(head["kstore"])), (Unit.load, _run(head["kload"]))]
    compute.append((Unit.vector, _prepare(head) if _busy(head) else None))
    for b in range(len(kblocks)):
        compute += _block_loads(k_work[b]) if streamed else []
        compute.append((Unit.matrix, scores(b)))
    compute.append((Unit.vector, softmax))
    for b in range(len(kblocks)):
        compute += _block_loads(v_work[b]) if streamed else []
        compute.append((Unit.matrix, context(b)))
    if p.outp is not None:  # O @ W_o accumulated over the heads, Y stored by the last
        y_tiles = [arena.tile(b) for b in attention_proj.out_tiles(p.outp, m, n)]
        emit, stores = attention_proj.out_projection_emit(p.outp, block, io.weights, o_tiles, y_tiles, n)
        compute.append((Unit.matrix, emit))
        return compute, stores
    out = p.out.view(h).slice(0, i0, m)
    return compute, [(o, out.slice(1, e0, ec)) for o, (e0, ec) in zip(o_tiles, echunks, strict=True)]


def _online_step(
    cx: LowerContext, match: AttentionMatch, p: Plan, arena: TileArena, block: tuple[int, int, int], t: Tiling
) -> Step:
    """fp32, rows of scores longer than a vector register: per key block, the block's scores (scaled, masked),
    m = max(m, rowmax), alpha = exp(m_old - m), P = exp(S - m), l = l * alpha + rowsum(P), O = O * alpha + P V;
    finally O / l (FlashAttention's loop, one query block at a time). Running max, sum and alpha stay in vector
    registers v0-v2 across the step's segments (nothing else runs on the vector unit in between)."""
    h, i0, m = block
    n = cx.config.array_size
    g = cx.graph
    io = _step_operands(arena, p, block, t, n, GroupTiles())
    q_buf, pos, kblocks, k_bufs, v_bufs = io.q, io.positions, io.kblocks, io.k, io.v
    kb_max = t.block_keys
    # a block's scores and P as whole rows of its kn keys (row stride kn): key tiles drained into their columns
    # (mx.drain.s) and read in place (mx.mm.s), no per-row copies
    s_rows, p_rows = arena.tile(m * kb_max * 4), arena.tile(m * kb_max * 4)
    echunks = k_slices(p.dv, n)
    acc = arena.acc_tile(m * n * len(echunks) * 4)
    o_tiles = [arena.tile(m * ec * 4) for _, ec in echunks]
    pv_tiles = [arena.tile(m * ec * 4) for _, ec in echunks]
    kdt, vdt = _op_dt(p.k), _op_dt(p.v)
    one = f32_bits(1.0)

    def state(em: Emitter) -> Registers:
        regs = Registers()
        for name in ("max", "sum", "alpha"):
            regs.new(name)
        return regs

    def start(em: Emitter) -> None:
        _prepare(io.head)(em)
        for o, (_, ec) in zip(o_tiles, echunks, strict=True):  # O = 0: x - x on the bits, whatever they were
            em.b.v_sub(*em.regs(o, o, o), m * ec, "i32")
        em.b.vc_ld(0, em.reg(o_tiles[0]), m, "f32")
        em.b.vc_add_vs(1, 0, 0)  # sum = 0
        em.b.vc_add_vs(0, 0, em.reg(f32_bits(float(np.finfo(np.float32).min))))  # max = float32 min

    def columns(b: int) -> list[tuple[int, int, int]]:
        """(its first key's byte offset in a row, keys, row stride) per key tile of block b."""
        keys = kblocks[b]
        kn = sum(bk for _, bk in keys)
        return [((j0 - keys[0][0]) * 4, bk, kn * 4) for j0, bk in keys]

    def scores(b: int) -> Callable[[Emitter], None]:
        def emit(em: Emitter) -> None:
            for i, (off, bk, stride) in enumerate(columns(b)):
                for ci, ((c0, kc), q_addr) in enumerate(zip(k_slices(p.d, n), q_buf.chunks, strict=True)):
                    em.b.mx_preload(em.reg(k_bufs[i].chunks[0] + c0 * bk * kdt.size), kc, bk, kdt.name)
                    _mm(em, q_buf, ci == 0, acc, q_addr, m)
                em.b.ep_cfg(*em.regs(0, 0, one), 0, Activation.none, "none", "f32")
                if bk * 4 == stride:
                    em.b.mx_drain(*em.regs(s_rows, acc), m, bk)
                else:
                    em.b.mx_drain_s(*em.regs(s_rows + off, acc, stride), m, bk)

        return emit

    def update(b: int) -> Callable[[Emitter], None]:
        keys = kblocks[b]
        k0, kn = keys[0][0], sum(bk for _, bk in keys)

        def emit(em: Emitter) -> None:
            regs = state(em)
            r = regs.new(g.node(match.scores).outputs[0])
            em.b.vc_ld(r, em.reg(s_rows), m * kn, "f32")
            x = r
            for name in (match.scale, match.mask):
                if name is None:
                    continue
                node = g.node(name)
                src = regs.of[_chain_input(g, node, regs)]
                if name == match.mask:
                    x = _emit_mask(em, regs, src, p.mask, (i0, m, k0, kn), pos)
                else:
                    x = _emit_recipe(cx, em, regs, node, kn)
                regs.of[node.outputs[0]] = x
            top = regs.temp()
            em.b.vc_rmax(top, x, kn)
            em.b.vc_max(top, top, 0)  # the new running max
            em.b.vc_sub(2, 0, top)
            em.b.vc_exp(2, 2)  # alpha = exp(m_old - m_new)
            em.b.vc_copy(0, top)
            regs.release(top)
            e = regs.temp()
            em.b.vc_sub_vc(e, x, 0)
            em.b.vc_exp(e, e)  # P = exp(S - m_new)
            regs.release(x)
            row = regs.temp()
            em.b.vc_rsum(row, e, kn)
            em.b.vc_mul(1, 1, 2)
            em.b.vc_add(1, 1, row)  # l = l * alpha + rowsum(P)
            regs.release(row)
            em.b.vc_st(em.reg(p_rows), e)

        return emit

    def product(b: int) -> Callable[[Emitter], None]:
        def emit(em: Emitter) -> None:
            for e, (_, ec) in enumerate(echunks):
                for i, (off, bk, stride) in enumerate(columns(b)):
                    v_at = _v_tile(v_bufs, t, i, e, off // 4 * ec * vdt.size)
                    em.b.mx_preload(em.reg(v_at), bk, ec, vdt.name)
                    if bk * 4 == stride:
                        (em.b.mx_mm if i == 0 else em.b.mx_mma)(*em.regs(acc + e * m * n * 4, p_rows), m)
                    else:
                        (em.b.mx_mm_s if i == 0 else em.b.mx_mma_s)(
                            *em.regs(acc + e * m * n * 4, p_rows + off, stride), m
                        )
            em.b.ep_cfg(*em.regs(0, 0, one), 0, Activation.none, "none", "f32")
            for e, (_, ec) in enumerate(echunks):
                em.b.mx_drain(*em.regs(pv_tiles[e], acc + e * m * n * 4), m, ec)

        return emit

    def rescale(em: Emitter) -> None:  # O = O * alpha + P V
        regs = state(em)
        for o, pv, (_, ec) in zip(o_tiles, pv_tiles, echunks, strict=True):
            a, c = regs.temp(), regs.temp()
            em.b.vc_ld(a, em.reg(o), m * ec, "f32")
            em.b.vc_mul_vc(a, a, 2)
            em.b.vc_ld(c, em.reg(pv), m * ec, "f32")
            em.b.vc_add(a, a, c)
            em.b.vc_st(em.reg(o), a)
            regs.release(c)
            regs.release(a)

    def finish(em: Emitter) -> None:  # O / l
        regs = state(em)
        for o, (_, ec) in zip(o_tiles, echunks, strict=True):
            a = regs.temp()
            em.b.vc_ld(a, em.reg(o), m * ec, "f32")
            em.b.vc_div_vc(a, a, 1)
            em.b.vc_st(em.reg(o), a)
            regs.release(a)

    compute: list = [(Unit.scalar, _run([])), (Unit.load, _run(io.head["loads"])), (Unit.vector, start)]
    for b in range(len(kblocks)):
        compute += [*_block_loads(io.k_work[b]), (Unit.matrix, scores(b)), (Unit.vector, update(b))]
        compute += [*_block_loads(io.v_work[b]), (Unit.matrix, product(b)), (Unit.vector, rescale)]
    compute.append((Unit.vector, finish))
    out = p.out.view(h).slice(0, i0, m)
    return Step([], compute, [(o, out.slice(1, e0, ec)) for o, (e0, ec) in zip(o_tiles, echunks, strict=True)])


def _column_chunks(part: View, n: int) -> list[View]:
    return [part.slice(1, c0, kc) for c0, kc in k_slices(part.shape[1], n)]


def _split_columns(em: Emitter, src: int, tiles: list[int], rows: int, cols: int, n: int, dt: DType) -> None:
    """A dense rows x cols tile -> its column chunks (at most n wide), each dense: one `v.copy` per row and chunk."""
    for (c0, kc), tile in zip(k_slices(cols, n), tiles, strict=True):
        for r in range(rows):
            em.b.v_copy(*em.regs(tile + r * kc * dt.size, src + (r * cols + c0) * dt.size), kc, dt.name)


def _chain_input(graph: Graph, node: Node, regs: Registers) -> str:
    return next(v for v in node.inputs if v in regs.of)


def _emit_recipe(cx: LowerContext, em: Emitter, regs: Registers, node: Node, period: int) -> int:
    """The node's own recipe in registers (scale: Mul/Div by a scalar; Softmax over the row)."""
    src = _chain_input(cx.graph, node, regs)
    table = operands(cx, [node], frozenset({src}))
    ins = [o for (name, _), o in table.items() if name == node.name]
    if any(o.kind not in ("chain", "scalar") for o in ins):
        raise CodegenError(f"node {node.name!r}: only a scalar constant scales the scores")
    out = emit_node(em, node, ins, regs, period)
    regs.release(regs.of[src])
    return out


def _emit_mask(
    em: Emitter, regs: Registers, s: int, mask: PositionMask, window: tuple[int, int, int, int], pos: int
) -> int:
    """score + mask for query rows [i0, i0 + m) x keys [k0, k0 + kn), the mask rebuilt from positions: t in {0, 1}
    (1 = masked), score + t * value."""
    i0, m, k0, kn = window
    one, zero = em.reg(f32_bits(1.0)), 0
    t = regs.temp()
    em.b.vc_mul_vs(t, s, zero)
    col = regs.temp()
    em.b.vc_ld(col, em.reg(pos + k0 * 4), kn, "f32")
    em.b.vc_add_vr(t, t, col)  # t = key position j
    regs.release(col)
    hit = None
    if mask.causal_offset is not None:
        row = regs.temp()
        em.b.vc_ld(row, em.reg(pos + i0 * 4), m, "f32")
        hit = regs.temp()
        em.b.vc_sub_vc(hit, t, row)  # j - i
        regs.release(row)
        em.b.vc_sub_vs(hit, hit, em.reg(f32_bits(mask.causal_offset)))
        em.b.vc_clip(hit, hit, zero, one)
    if mask.key_len < k0 + kn:
        em.b.vc_sub_vs(t, t, em.reg(f32_bits(mask.key_len - 1)))
        em.b.vc_clip(t, t, zero, one)
        if hit is None:
            hit, t = t, -1
        else:
            em.b.vc_max(hit, hit, t)
    if t >= 0:
        regs.release(t)
    if hit is None:
        return s
    em.b.vc_mul_vs(hit, hit, em.reg(f32_bits(mask.value)))
    out = regs.temp()
    em.b.vc_add(out, s, hit)
    regs.release(hit)
    regs.release(s)
    return out
