"""The Q, K and V projections of an attention computed inside its kernel (`codegen.attention`), so they never
round-trip DRAM.

The group is an attention whose Q, K and V are read (through their layout nodes) from projections X @ W
(`attention_match.with_projections`): one packed in_proj sliced into Q, K and V (torchvision's ViT, PyTorch's
MultiheadAttention, GPT-2's c_attn as a MatMul), or one MatMul per operand (BERT, LLaMA; cross-attention reads K
and V from another activation). Each leading index (batch, head) of the attention reads its operands from a block
of rows and a run of columns of the projection outputs; per step the kernel computes exactly those, into the
tiles the loads would have filled:

- Q_h (rows x d) = X[rows] @ W_q[:, cols]: per value chunk of at most N columns, the activation's row chunks
  streamed through the K-chunks of the weight, drained (int8: requantized with the projection's own multiplier,
  as the unfused MatMul drains) as the dense m x chunk tile the attention reads;
- K_h^T (d x keys) = W_k[:, cols]^T @ X^T: the transposed orientation (W_k^T's rows streamed, X^T's key tiles
  preloaded, one transposing `dma.ldt` per key tile), so K^T is drained as the dense d x key-tile tile the scores
  preload: the same int32 sums as X @ W_k, hence the same requantized values; or, where that moves no more DRAM
  bytes (`round_trips`: int8 K from a float activation), K (keys x d) as Q, stored to a DRAM scratch buffer and
  loaded back one transposing `dma.ldt` per key tile (the matrix unit streams the keys instead of d rows per key
  tile, and no transposed activation is loaded);
- V_h (keys x dv) as Q, over every key row.

Each output tile accumulates in its own accumulator region when they fit (every matmul issued back to back, the
drains after the last). With the output projection taken in too (`with_out_projection`: a bias-free MatMul/Gemm
of the merged heads), each head's O_h @ W_o[the head's rows] is added to Y's accumulators in the accumulator
bank no buffer slot uses (they live across the steps); the first head of a block of rows starts them, the last
drains Y (requantized as that node drains) and stores it: the merged heads never reach DRAM.

The weights are packed at compile time (`pack_projection_weights`): per distinct (Q, K, V[, O]) column block, the
stationary tiles of W_q and W_v, the streamed rows of W_k^T and the head's rows of W_o back to back, read by one
DMA per step. The activation is read once per step: its rows (one DMA, quantized whole on the int8 path, each
chunk of N columns read in place by `mx.mm.s`; else one DMA per chunk where that is cheaper; Q's rows shared with
V's when they are the same rows of the same tensor; a [seq, batch, features] activation row-strided) and its key
tiles transposed; when every step reads the same rows (one batch, all query rows per step) they are
read once, by the first step, into the spare scratchpad bank (`shared_arena`).

Refused (CodegenError, the planner then runs the projections as their own kernels): an activation that is not
rows x features in DRAM, an operand not one run of columns of its projection per head, a per-channel int8
projection, a projection with a bias Add or a rotary embedding between it and the attention (not matched), a head
whose K and V do not fit one buffer slot beside its weights (fp32 heads of large models; streamed key blocks and
the online softmax read K and V block by block: not expressed here), Y's accumulators beyond the spare bank.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from fusion.engine.attention_match import (
    AttentionMatch,
    affine_heads,
    head_maps,
    operand_sources,
    operand_values,
    output_map,
)
from fusion.engine.codegen.gemm import k_slices
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Graph
from fusion.lower.context import CONST_F32, CONST_I8, LowerContext, const_key, temp_key
from fusion.lower.emitter import Emitter, f32_bits
from fusion.lower.kernels.matrix import requant
from fusion.lower.local_alloc import DEPTH, TileArena, slot
from fusion.lower.views import View, dense
from isa.enums import Activation, DType
from isa.memory_map import LOCAL_ACC_BASE
from simulator.config import MachineConfig
from simulator.timing import dma_cycles

PROJECTIONS = "attnproj"  # constant-form key (on the first projection's weight): the per-head packed weights
PIECE_ROWS = 128  # rows of one accumulator pass (a projection of more rows drains in pieces)


@dataclass(frozen=True)
class Side:
    """Where one of Q, K^T, V comes from: its projection node, the activation, and per leading index the first
    activation row and the first output column it reads."""

    node: str
    x: str
    rows: np.ndarray
    cols: np.ndarray
    width: int  # columns per head (d, or dv)
    step: int = 1  # rows between consecutive positions (2: a [seq, batch, features] activation of 2 batches)


def _side(graph: Graph, match: AttentionMatch, which: int, layout: tuple[str, ...], lead: tuple[int, ...]) -> Side:
    """Q (0) and V (2) are rows x width of their projection's output, K^T (1) width x keys."""
    source = operand_sources(graph, match)[which]
    value = operand_values(graph, match)[which]
    node = graph.producers[source]
    maps = head_maps(graph, value, layout, lead)
    if maps is None:
        raise CodegenError(f"node {node.name!r}: an attention operand is not one strided view per head")
    shape = graph.types[source].shape
    cols = shape[-1]
    op_shape = graph.types[value].shape[-2:]
    width = op_shape[0] if which == 1 else op_shape[1]
    along, across = (maps.col_stride, maps.row_stride) if which == 1 else (maps.row_stride, maps.col_stride)
    count = op_shape[1] if which == 1 else op_shape[0]
    if (across != 1 and width > 1) or (count > 1 and (along <= 0 or along % cols)):
        raise CodegenError(f"node {node.name!r}: an attention operand is not one run of its output columns per head")
    step = along // cols if count > 1 else 1
    return Side(node.name, node.inputs[0], maps.bases // cols, maps.bases % cols, width, step)


def sides(graph: Graph, match: AttentionMatch) -> tuple[Side, Side, Side]:
    scores = graph.node(match.scores)
    lead = tuple(graph.types[scores.outputs[0]].shape[:-2])
    layouts = (match.q_layout, match.k_layout, match.v_layout)
    return tuple(_side(graph, match, i, layouts[i], lead) for i in range(3))


def out_side(graph: Graph, match: AttentionMatch) -> Side | None:
    """The output projection's side (`match.out_projection`): per leading index the first row and column of the
    merged heads its output block lands at (the rows of W_o it multiplies); `width`: W_o's output columns."""
    if match.out_projection is None:
        return None
    node = graph.node(match.out_projection)
    context = graph.node(match.context)
    shape = graph.types[context.outputs[0]].shape
    lead = tuple(shape[:-2])
    layout = [graph.node(n) for n in match.out_layout]
    where = output_map(graph, layout, shape) if layout else np.arange(math.prod(shape)).reshape(shape)
    maps = affine_heads(np.broadcast_to(where, (*lead, *shape[-2:]))) if where is not None else None
    cols = graph.types[node.inputs[0]].shape[-1]
    sq, dv = shape[-2:]
    if (
        maps is None
        or (maps.col_stride != 1 and dv > 1)
        or (sq > 1 and (maps.row_stride <= 0 or maps.row_stride % cols))
    ):
        raise CodegenError(f"node {node.name!r}: the merged heads are not one run of its input columns per head")
    rows = maps.bases // cols
    runs = np.flatnonzero(np.diff(rows)) + 1  # each row block's heads must be consecutive (accumulated in turn)
    if len(np.unique(rows)) != len(runs) + 1:
        raise CodegenError(f"node {node.name!r}: the heads of one block of rows are not consecutive")
    step = maps.row_stride // cols if sq > 1 else 1
    return Side(node.name, node.inputs[0], rows, maps.bases % cols, graph.types[node.outputs[0]].shape[-1], step)


def _blocks(q: Side, k: Side, v: Side, o: Side | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (Q, K, V[, O]) column blocks, and per leading index which of them it reads."""
    keys = np.stack([q.cols, k.cols, v.cols] + ([o.cols] if o is not None else []), axis=1)
    distinct, which = np.unique(keys, axis=0, return_inverse=True)
    return distinct, which.reshape(-1)


@dataclass(frozen=True)
class TileLayout:
    """Offsets (elements) of one head's packed weight tiles: W_q's (value chunk e, K chunk c) tiles (kc x ec),
    W_k^T's K chunks (d x kc) or W_k's tiles (K's round trip), W_v's tiles as W_q's."""

    q: dict[tuple[int, int], int]
    kt: dict[int, int]  # W_k^T's K chunks (d x kc), K^T computed transposed
    k: dict[tuple[int, int], int]  # or W_k's tiles as W_q's, K computed as Q and transposed through DRAM
    v: dict[tuple[int, int], int]
    size: int
    o: dict[tuple[int, int], int]  # W_o's rows of the head: (output chunk, value chunk) tiles (kc x ec)


def tile_layout(kd: int, d: int, dv: int, n: int, dout: int = 0, trip: bool = False) -> TileLayout:
    at = 0
    q, kt, k, v, o = {}, {}, {}, {}, {}
    for e0, ec in k_slices(d, n):
        for c0, kc in k_slices(kd, n):
            q[(e0, c0)], at = at, at + kc * ec
    for e0, ec in k_slices(d, n) if trip else ():
        for c0, kc in k_slices(kd, n):
            k[(e0, c0)], at = at, at + kc * ec
    for c0, kc in k_slices(kd, n) if not trip else ():
        kt[c0], at = at, at + d * kc
    for e0, ec in k_slices(dv, n):
        for c0, kc in k_slices(kd, n):
            v[(e0, c0)], at = at, at + kc * ec
    for e0, ec in k_slices(dout, n):
        for c0, kc in k_slices(dv, n):
            o[(e0, c0)], at = at, at + kc * ec
    return TileLayout(q, kt, k, v, at, o)


def round_trips(graph: Graph, match: AttentionMatch, x_dt: DType, int8: bool) -> bool:
    """Whether K is computed as Q is (keys x d) and transposed through a DRAM scratch buffer (stored, loaded back
    by `dma.ldt`) instead of as K^T = W_k^T @ X^T: where the round trip moves no more DRAM bytes than the
    transposed activation (`x_dt`, the key rows' dtype in DRAM) it spares, so a load-bound kernel gets no more
    traffic, while the matrix unit streams the keys (sk rows per d chunk) instead of d rows per key tile (a tile of
    one key costs as much as one of N)."""
    k = sides(graph, match)[1]
    kd = graph.types[k.x].shape[-1]
    return 2 * len(k.rows) * k.width * (1 if int8 else 4) <= len(np.unique(k.rows)) * kd * x_dt.size


def k_scratch(graph: Graph, match: AttentionMatch) -> tuple[str, tuple[int, int, int]]:
    """The DRAM scratch buffer K round-trips through (`round_trips`): its key and shape (a region of keys x d per
    buffer slot: the steps in flight at once never share one)."""
    k = sides(graph, match)[1]
    sk = graph.types[operand_values(graph, match)[1]].shape[-1]
    return temp_key(graph.node(k.node), 0), (DEPTH, sk, k.width)


def pack_projection_weights(
    graph: Graph, match: AttentionMatch, forms: Mapping[str, np.ndarray], int8: bool, n: int, trip: bool
):
    """{form key: the packed weights}: per distinct column block, its `tile_layout` (device dtype: int8 or f32),
    with the head's rows of W_o when the output projection is taken in too; `trip`: `round_trips`."""
    o = out_side(graph, match)
    form = CONST_I8 if int8 else CONST_F32
    q, k, v = sides(graph, match)
    w = [np.asarray(forms[const_key(graph.node(s.node).inputs[1], form)]) for s in (q, k, v)]
    wo = np.asarray(forms[const_key(graph.node(o.node).inputs[1], form)]) if o is not None else None
    kd = w[0].shape[0]
    lay = tile_layout(kd, q.width, v.width, n, o.width if o is not None else 0, trip)
    distinct, _ = _blocks(q, k, v, o)
    out = np.zeros((len(distinct), lay.size), dtype=w[0].dtype)
    for b, (qc, kc0, vc, *oc) in enumerate(distinct):
        for (e0, c0), at in lay.o.items():  # the head's rows [oc, oc + dv) of W_o
            tile = wo[oc[0] + c0 : oc[0] + min(c0 + n, v.width), e0 : e0 + n]
            out[b, at : at + tile.size] = tile.reshape(-1)
        for (e0, c0), at in lay.q.items():
            tile = w[0][c0 : c0 + n, qc + e0 : qc + min(e0 + n, q.width)]
            out[b, at : at + tile.size] = tile.reshape(-1)
        for c0, at in lay.kt.items():
            tile = w[1][c0 : c0 + n, kc0 : kc0 + k.width].T
            out[b, at : at + tile.size] = tile.reshape(-1)
        for (e0, c0), at in lay.k.items():
            tile = w[1][c0 : c0 + n, kc0 + e0 : kc0 + min(e0 + n, k.width)]
            out[b, at : at + tile.size] = tile.reshape(-1)
        for (e0, c0), at in lay.v.items():
            tile = w[2][c0 : c0 + n, vc + e0 : vc + min(e0 + n, v.width)]
            out[b, at : at + tile.size] = tile.reshape(-1)
    return {weights_key(graph, match): out}


def weights_key(graph: Graph, match: AttentionMatch) -> str:
    return const_key(graph.node(match.projections[0]).inputs[1], PROJECTIONS)


@dataclass(frozen=True)
class OutProjection:
    """The projection of the merged heads, accumulated head by head: Y[rows] = sum over heads of O_h @ W_o[the
    head's rows] in an accumulator region outside the buffer slots (the bank no slot uses), so it lives across
    the steps; the first head of a block of rows starts it (`mx.mm`), the last drains it (requantized as the
    projection drains) and stores Y."""

    side: Side
    y: View  # the output, rows x width in DRAM
    requant: tuple[int, int]
    out_dt: DType
    acc: int  # its accumulator region: per output chunk of N columns, rows x N float32/int32
    rows: int  # the attention's query rows (the region's rows per output chunk)
    first: np.ndarray  # per leading index: the first head of its rows
    last: np.ndarray
    layout: TileLayout  # where its W_o tiles are in a head's packed weights (`layout.o`)
    mm_dt: DType
    dv: int
    whole_rows: int = 0  # blocks of at most these rows drain Y into one dense tile (`stores_whole`)

    def whole(self, m: int) -> bool:
        return m <= self.whole_rows


def stores_whole(cfg: MachineConfig, y: View, rows: int, width: int, step: int) -> bool:
    """Whether Y's output chunks of N columns are drained into one dense tile of its rows (`mx.drain.s`, timed as
    `mx.drain`) and stored by one DMA: where that DMA takes less than one per chunk (their latencies)."""
    n, es = cfg.array_size, y.dtype.size
    ochunks = k_slices(width, n)
    if len(ochunks) == 1:
        return False
    stride = y.strides[0] * step
    chunked = sum(dma_cycles(cfg, rows, ec * es, stride) for _, ec in ochunks)
    return dma_cycles(cfg, rows, width * es, stride) < chunked


def out_projection(cx: LowerContext, match: AttentionMatch, p: Projection) -> OutProjection:
    """The output projection of the match (`match.out_projection`), its W_o's rows of each head packed with the
    head's Q/K/V projection weights (`p.layout.o`)."""
    o = out_side(cx.graph, match)
    sq, dv = cx.graph.types[cx.graph.node(match.context).outputs[0]].shape[-2:]
    node = cx.graph.node(o.node)
    shape = cx.graph.types[node.outputs[0]].shape
    y = cx.view(node.outputs[0]).reshaped((math.prod(shape[:-1]), shape[-1]))
    if y is None:
        raise CodegenError(f"node {node.name!r}: its output is not rows x features in DRAM")
    if cx.int8 and (cx.dtype(node.inputs[0]) is not DType.i8 or cx.dtype(node.outputs[0]) is not DType.i8):
        raise CodegenError(f"node {node.name!r}: an int8 output projection with a float32 input or output")
    cfg, n = cx.config, cx.config.array_size
    used = DEPTH * slot(cfg.acc_bytes, cfg.acc_banks, 0).size
    need = sq * n * 4 * -(-o.width // n)
    if cfg.acc_bytes - used < need:
        raise CodegenError(f"node {node.name!r}: its {sq} rows x {o.width} accumulators do not fit the spare bank")
    edge = np.append(np.diff(o.rows) != 0, True)
    first = np.insert(edge[:-1], 0, True)
    reqs = requant(cx, node) or (f32_bits(1.0), 0)
    acc = LOCAL_ACC_BASE + used
    whole = max((m for m in range(1, sq + 1) if stores_whole(cfg, y, m, o.width, o.step)), default=0)
    return OutProjection(o, y, reqs, cx.dtype(node.outputs[0]), acc, sq, first, edge, p.layout, p.mm_dt, dv, whole)


@dataclass(frozen=True)
class Projection:
    """What a step needs to compute its head's Q, K^T and V: the activations as 2-D DRAM views (rows x kd), their
    int8 quantization (a float activation on the int8 path), each side's drain (mult, shift), the packed weights."""

    q: Side
    k: Side
    v: Side
    xs: tuple[View, View, View]
    quantize: tuple[float | None, float | None, float | None]
    requants: tuple[tuple[int, int], tuple[int, int], tuple[int, int]]
    out_dt: tuple[DType, DType, DType]
    weights: View  # (blocks, layout size)
    block_of: np.ndarray  # per leading index: its row of `weights`
    layout: TileLayout
    kd: int
    mm_dt: DType
    acc_slot: int  # bytes of one accumulator buffer slot
    config: MachineConfig
    kscratch: View | None  # K's round trip (`round_trips`): (buffer slot, keys, d) in DRAM; None: K^T computed

    def whole_rows(self, side: int, rows: int) -> bool:
        """Whether a side's (0: Q, 1: K, 2: V) rows of the activation are read by one DMA (quantized whole by one
        `v.qnt` when they are float on the int8 path) and the matrix unit reads each K chunk in place (`mx.mm.s`,
        row stride kd elements), instead of one DMA per chunk (a DRAM latency each)."""
        cfg, x, n = self.config, self.xs[side], self.config.array_size
        chunks = k_slices(self.kd, n)
        if len(chunks) == 1:
            return False
        stride = x.strides[0] * (self.q, self.k, self.v)[side].step
        chunked = sum(dma_cycles(cfg, rows, kc * x.dtype.size, stride) for _, kc in chunks)
        return dma_cycles(cfg, rows, self.kd * x.dtype.size, stride) < chunked

    def keys_in_rows(self) -> bool:
        """The keys are V's rows of the same activation, quantized alike: a tile of one key of X^T (kd x 1, dense)
        is that key's row of V's activation tile, read in place instead of loaded transposed (a DRAM latency)."""
        same = self.k.x == self.v.x and self.k.step == self.v.step and self.quantize[1] == self.quantize[2]
        return same and np.array_equal(self.k.rows, self.v.rows)

    def shares_rows(self) -> bool:
        """Q's rows are V's rows of the same activation (self-attention): one load of them."""
        same = self.q.x == self.v.x and self.q.step == self.v.step
        return same and np.array_equal(self.q.rows, self.v.rows)


def projection(cx: LowerContext, match: AttentionMatch) -> Projection:
    g = cx.graph
    q, k, v = sides(g, match)
    xs, quants, reqs, outs = [], [], [], []
    for side in (q, k, v):
        node = g.node(side.node)
        shape = g.types[side.x].shape
        rows = math.prod(shape[:-1])
        flat = cx.view(side.x).reshaped((rows, shape[-1]))
        if flat is None or flat.strides[1] != flat.dtype.size:
            raise CodegenError(f"node {node.name!r}: its activation is not rows x features in DRAM")
        xs.append(flat)
        quants.append(cx.matrix(node).input_scale if cx.int8 and cx.scale(side.x) is None else None)
        reqs.append(requant(cx, node) or (f32_bits(1.0), 0))
        outs.append(cx.dtype(node.outputs[0]))
        if cx.int8 and outs[-1] is not DType.i8:
            raise CodegenError(f"node {node.name!r}: an int8 projection stored as float32 (dequantized) is not fused")
    kd = xs[0].shape[1]
    if any(x.shape[1] != kd for x in xs):
        raise CodegenError(f"node {match.softmax!r}: the projections' activations differ in width")
    n = cx.config.array_size
    o = out_side(g, match)
    trip = round_trips(g, match, xs[1].dtype, cx.int8)
    lay = tile_layout(kd, q.width, v.width, n, o.width if o is not None else 0, trip)
    distinct, which = _blocks(q, k, v, o)
    mm_dt = DType.i8 if cx.int8 else DType.f32
    key = weights_key(g, match)
    if key not in cx.addresses:
        raise CodegenError(f"node {match.softmax!r}: the kernel's DRAM image has no packed projection weights")
    weights = dense(cx.addresses[key], (len(distinct), lay.size), mm_dt)
    acc_slot = TileArena(cx.config, 0).acc.size
    skey, sshape = k_scratch(g, match)
    kscratch = dense(cx.addresses[skey], sshape, outs[1]) if trip else None
    fields = (q, k, v, tuple(xs), tuple(quants), tuple(reqs), tuple(outs), weights, which, lay, kd, mm_dt, acc_slot)
    return Projection(*fields, cx.config, kscratch)


def out_tiles(op: OutProjection, m: int, n: int) -> list[int]:
    """Scratchpad bytes of a step's output projection tiles: Y's rows per output chunk, or Y's rows whole."""
    if op.whole(m):
        return [m * op.side.width * op.out_dt.size]
    return [m * ec * op.out_dt.size for _, ec in k_slices(op.side.width, n)]


def out_projection_emit(
    op: OutProjection, block: tuple[int, int, int], w: int, o_tiles: list[int], y_tiles: list[int], n: int
):
    """The matrix work adding head block (h, i0, m)'s O (its value chunks' tiles) @ W_o[the head's rows] (at `w`,
    the head's packed weights) to the output's accumulators (and, the last head of its rows, draining Y); the
    stores of Y (none before the last)."""
    h, i0, m = block
    wes = op.mm_dt.size
    ochunks, vchunks = k_slices(op.side.width, n), k_slices(op.dv, n)
    region = [op.acc + (e * op.rows + i0) * n * 4 for e in range(len(ochunks))]

    def emit(em: Emitter) -> None:
        for e, (e0, ec) in enumerate(ochunks):
            for ci, ((c0, kc), a) in enumerate(zip(vchunks, o_tiles, strict=True)):
                em.b.mx_preload(em.reg(w + op.layout.o[(e0, c0)] * wes), kc, ec, op.mm_dt.name)
                start = op.first[h] and ci == 0
                (em.b.mx_mm if start else em.b.mx_mma)(*em.regs(region[e], a), m)
        if op.last[h]:
            mult, shift = op.requant
            em.b.ep_cfg(*em.regs(0, 0, mult), shift, Activation.none, "none", op.out_dt.name)
            whole = op.whole(m)
            for (e0, ec), y, acc in zip(ochunks, y_tiles * len(ochunks) if whole else y_tiles, region, strict=True):
                if not whole:
                    em.b.mx_drain(*em.regs(y, acc), m, ec)
                    continue
                # the chunk's rows straight to their place in Y's dense rows (`mx.drain.s`, row stride the width)
                stride = op.side.width * op.out_dt.size
                em.b.mx_drain_s(*em.regs(y + e0 * op.out_dt.size, acc, stride), m, ec)

    rows = op.y.slice(0, int(op.side.rows[h]) + i0 * op.side.step, m, op.side.step)
    if not op.last[h]:
        return emit, []
    if op.whole(m):
        return emit, [(y_tiles[0], rows)]
    return emit, [(y, rows.slice(1, e0, ec)) for y, (e0, ec) in zip(y_tiles, ochunks, strict=True)]


def weight_tile(p: Projection) -> int:
    """Scratchpad bytes of one head's packed weights."""
    return p.layout.size * p.mm_dt.size


def activation_tiles(p: Projection, sq_rows: int, sk: int, n: int) -> list[int]:
    """Scratchpad bytes of one step's activation tiles (`step_projection` allocates them, once per step)."""
    out = []

    def rows_tiles(side: int, rows: int) -> None:
        x, quantize = p.xs[side], p.quantize[side]
        es = x.dtype.size
        if p.whole_rows(side, rows):  # the rows as loaded (and quantized), read in place
            out.extend([rows * p.kd * es] + ([rows * p.kd] if quantize is not None else []))
            return
        for _, kc in k_slices(p.kd, n):
            out.append(rows * kc * es)
            out.extend([rows * kc] if quantize is not None else [])

    rows_tiles(2, sk)
    if not p.shares_rows():
        rows_tiles(0, sq_rows)
    if p.kscratch is not None:
        if not p.keys_in_rows():
            rows_tiles(1, sk)
        return out
    for _, bk in k_slices(sk, n):
        if bk == 1 and p.keys_in_rows():
            continue
        out.append(p.kd * bk * p.xs[1].dtype.size)
        out.extend([p.kd * bk] if p.quantize[1] is not None else [])
    return out


def _products(p: Projection, m: int, sk: int, n: int) -> list[tuple[int, int, int, int]]:
    """The step's output tiles in order: (side 0/1/2, index among the side's tiles, rows, cols)."""
    q = [(0, i, m, ec) for i, (_, ec) in enumerate(k_slices(p.q.width, n))]
    if p.kscratch is not None:
        k = [(1, i, sk, ec) for i, (_, ec) in enumerate(k_slices(p.k.width, n))]
    else:
        k = [(1, j, p.k.width, bk) for j, (_, bk) in enumerate(k_slices(sk, n))]
    return q + k + [(2, i, sk, ec) for i, (_, ec) in enumerate(k_slices(p.v.width, n))]


def acc_bytes(p: Projection, m: int, sk: int, n: int) -> list[int]:
    """The projection's accumulator tiles: one region per output tile when they take at most 3/4 of a slot (every
    matmul issued back to back, the drains after the last: one pipeline latency, not one per tile), else one
    region of at most PIECE_ROWS rows drained after each tile's piece."""
    rows = [r for _, _, r, _ in _products(p, m, sk, n)]
    regions = [r * n * 4 for r in rows]
    if max(rows) <= PIECE_ROWS and sum(regions) <= p.acc_slot * 3 // 4:
        return regions
    return [min(max(m, sk, p.q.width, p.v.width), PIECE_ROWS) * n * 4]


def _activation(arena, p: Projection, block: tuple[int, int, int], sk: int, n: int, loads: list, quants: list):
    """The activation's tiles as the projections read them: (Q's row chunks, X^T's key tiles, V's row chunks),
    each row chunk as (address, bytes between its rows), each key tile as its K chunks' addresses."""
    h, i0, m = block

    def rows_tiles(side: int, row0: int, rows: int) -> list[tuple[int, int]]:
        x, quantize, step = p.xs[side], p.quantize[side], (p.q, p.k, p.v)[side].step
        es = 1 if quantize is not None else x.dtype.size
        if p.whole_rows(side, rows):  # one DMA (and v.qnt) of the rows; each chunk read in place
            raw = arena.tile(rows * p.kd * x.dtype.size)
            part = x.slice(0, row0, rows, step)
            loads.append(lambda em, v=part, a=raw: em.dma_load(v, a))
            if quantize is not None:
                qt = arena.tile(rows * p.kd)
                quants.append((qt, raw, rows * p.kd, 1.0 / quantize))
                raw = qt
            return [(raw + c0 * es, p.kd * es) for c0, _ in k_slices(p.kd, n)]
        read = []
        for c0, kc in k_slices(p.kd, n):
            raw = arena.tile(rows * kc * x.dtype.size)
            part = x.slice(0, row0, rows, step).slice(1, c0, kc)
            loads.append(lambda em, v=part, a=raw: em.dma_load(v, a))
            if quantize is not None:
                qt = arena.tile(rows * kc)
                quants.append((qt, raw, rows * kc, 1.0 / quantize))
                raw = qt
            read.append((raw, kc * es))
        return read

    xv = rows_tiles(2, int(p.v.rows[h]), sk)
    if p.shares_rows():
        xq = [(a + i0 * stride, stride) for a, stride in xv]
    else:
        xq = rows_tiles(0, int(p.q.rows[h]) + i0 * p.q.step, m)
    if p.kscratch is not None:
        return xq, xv if p.keys_in_rows() else rows_tiles(1, int(p.k.rows[h]), sk), xv
    xk = []
    xk_view = p.xs[1]
    xdt = xk_view.dtype.name
    stride = xk_view.strides[0] * p.k.step  # DRAM bytes between consecutive keys' rows
    for j0, bk in k_slices(sk, n):
        if bk == 1 and p.keys_in_rows():  # the key's row of V's tiles, each K chunk in place
            xk.append([a + j0 * row for a, row in xv])
            continue
        raw = arena.tile(p.kd * bk * xk_view.dtype.size)
        addr = xk_view.address + (int(p.k.rows[h]) + j0 * p.k.step) * xk_view.strides[0]
        loads.append(lambda em, a=raw, s=addr, b=bk: em.b.dma_ldt(*em.regs(a, s, stride), b, p.kd, xdt))
        if p.quantize[1] is not None:
            qt = arena.tile(p.kd * bk)
            quants.append((qt, raw, p.kd * bk, 1.0 / p.quantize[1]))
            raw = qt
        xk.append([raw + c0 * bk * p.mm_dt.size for c0, _ in k_slices(p.kd, n)])
    return xq, xk, xv


def shared_arena(cfg: MachineConfig, p: Projection, m: int, sq: int, sk: int) -> TileArena | None:
    """Where the activation tiles go when every step reads the same ones (each head reads the same rows of each
    activation and a step takes all sq query rows): the spare scratchpad bank, which no step's loads fill, so
    the first step loads (and quantizes) them and the others only read them (the matrix unit reads them in step
    order, after the first step's projections waited for them). None: loaded per step, in its own slot."""
    if m != sq or not all(np.all(s.rows == s.rows[0]) for s in (p.q, p.k, p.v)):
        return None
    spare = TileArena.spare(cfg)
    n = cfg.array_size
    return spare if spare is not None and spare.fits(activation_tiles(p, m, sk, n)) else None


@dataclass(frozen=True)
class KTrip:
    """A step's K round trip (`round_trips`): K (keys x d, at `kn`) stored to the step's buffer slot's region of
    the scratch (a later step in the slot reuses it after this one) and its key tiles loaded back transposed; a
    tile of one key (d x 1) is K's row, read in place."""

    kn: int
    here: View  # (1, keys, d) in DRAM
    sk: int
    n: int

    def in_place(self) -> list[int | None]:
        """Per key tile: the address it is read at in place, or None (loaded back)."""
        row = self.here.shape[-1] * self.here.dtype.size
        return [self.kn + j0 * row if bk == 1 else None for j0, bk in k_slices(self.sk, self.n)]

    def calls(self, kt_tiles: list[int | None]) -> tuple[list, list]:
        """The store of K, and the transposing loads of its key tiles into `kt_tiles` (None: read in place); none
        when every tile is read in place (one key)."""
        d, dt = self.here.shape[-1], self.here.dtype
        here = self.here.reshaped((self.sk, d))
        row = d * dt.size
        back = [
            lambda em, a=a, j0=j0, bk=bk: em.b.dma_ldt(*em.regs(a, here.address + j0 * row, row), bk, d, dt.name)
            for (j0, bk), a in zip(k_slices(self.sk, self.n), kt_tiles, strict=True)
            if a is not None
        ]
        return ([lambda em: em.dma_store(self.kn, here)], back) if back else ([], [])


def step_projection(
    arena, p: Projection, block: tuple[int, int, int], sk: int, n: int, accs: list[int], shared: TileArena | None = None
) -> tuple[list, list, Callable[[Emitter, tuple[list[int], list[int], list[int]]], None], int]:
    """Allocate and fill (loads, quantizations) the activation and weight tiles of head block (h, i0, m); returns
    (loads, quants, emit, the weights' tile, K's round trip or None) where emit(em, (q_tiles, kt_tiles, v_tiles))
    computes Q (m x chunk tiles), K^T (d x key-tile tiles; or K, keys x d, with the round trip) and V (keys x
    chunk tiles) into the attention's buffers, through `accs` (the step's accumulator tiles, sized by `acc_bytes`;
    the matrix unit drains them before another head's products).
    `shared` (`shared_arena`): the activation tiles are there, loaded by the first head's step only."""
    h, i0, m = block
    loads: list = []
    quants: list = []
    xq, xk, xv = _activation(shared or arena, p, block, sk, n, loads, quants)
    if shared is not None and h > 0:
        loads, quants = [], []
    w = arena.tile(weight_tile(p))
    wrow = p.weights.slice(0, int(p.block_of[h]), 1)
    loads.append(lambda em: em.dma_load(wrow, w))

    es = p.mm_dt.size
    lay, kchunks = p.layout, k_slices(p.kd, n)
    qcols, vcols = [e0 for e0, _ in k_slices(p.q.width, n)], [e0 for e0, _ in k_slices(p.v.width, n)]
    kcols = [e0 for e0, _ in k_slices(p.k.width, n)]
    kes = p.out_dt[1].size
    trip = p.kscratch is not None
    kn = arena.tile(sk * p.k.width * kes) if trip else 0  # K (keys x d), round-tripped through DRAM

    def operands(side: int, i: int, r0: int) -> list[tuple[int, int, int, int]]:
        """(A rows address, bytes between A's rows, preloaded tile address, kc) per K chunk of output tile i of a
        side, from row r0."""
        if side == 1 and not trip:  # K^T: W_k^T's rows streamed over X^T's key tile
            return [
                (w + (lay.kt[c0] + r0 * kc) * es, kc * es, b, kc) for (c0, kc), b in zip(kchunks, xk[i], strict=True)
            ]
        x, at, e0 = ((xq, lay.q, qcols[i]), (xk, lay.k, kcols[i] if trip else 0), (xv, lay.v, vcols[i]))[side]
        return [(a + r0 * st, st, w + at[(e0, c0)] * es, kc) for (a, st), (c0, kc) in zip(x, kchunks, strict=True)]

    def emit(em: Emitter, outs: tuple[list[int], list[int], list[int]]) -> None:
        def drain_cfg(side: int) -> None:
            mult, shift = p.requants[side]
            em.b.ep_cfg(*em.regs(0, 0, mult), shift, Activation.none, "none", p.out_dt[side].name)

        def products(acc: int, side: int, i: int, r0: int, rows: int, cols: int) -> None:
            for ci, (a, stride, b, kc) in enumerate(operands(side, i, r0)):
                em.b.mx_preload(em.reg(b), kc, cols, p.mm_dt.name)
                if stride == kc * es:  # dense rows
                    (em.b.mx_mm if ci == 0 else em.b.mx_mma)(*em.regs(acc, a), rows)
                else:  # a chunk of wider rows, read in place
                    (em.b.mx_mm_s if ci == 0 else em.b.mx_mma_s)(*em.regs(acc, a, stride), rows)

        tiles = _products(p, m, sk, n)
        if len(accs) == len(tiles):  # a region per tile: every product, then every drain
            for acc, (side, i, rows, cols) in zip(accs, tiles, strict=True):
                products(acc, side, i, 0, rows, cols)

        def drain(acc: int, side: int, i: int, r0: int, rows: int, cols: int) -> None:
            if side == 1 and trip:  # K's columns of its dense rows (`mx.drain.s`, row stride d)
                row = p.k.width * kes
                em.b.mx_drain_s(*em.regs(kn + r0 * row + kcols[i] * kes, acc, row), rows, cols)
            else:
                em.b.mx_drain(*em.regs(outs[side][i] + r0 * cols * p.out_dt[side].size, acc), rows, cols)

        for t, (side, i, rows, cols) in enumerate(tiles):
            if t == 0 or tiles[t - 1][0] != side:
                drain_cfg(side)
            if len(accs) == len(tiles):
                drain(accs[t], side, i, 0, rows, cols)
                continue
            for r0, pr in k_slices(rows, PIECE_ROWS):
                products(accs[0], side, i, r0, pr, cols)
                drain(accs[0], side, i, r0, pr, cols)

    trip_ = KTrip(kn, p.kscratch.slice(0, arena.spad.base // arena.spad.size, 1), sk, n) if trip else None
    return loads, quants, emit, w, trip_


def check_heads(p: Projection, d: int, dv: int) -> None:
    """The projection's head widths are the attention's operand widths (a layout the sides misread otherwise)."""
    if (p.q.width, p.k.width, p.v.width) != (d, d, dv):
        raise CodegenError("the projections' head widths are not the attention's head dims")
