"""The attention subgraph as exporters write it, recognised so that one kernel (`codegen.attention`) runs it.

    MatMul(Q, K^T) [-> Mul/Div by a scalar] [-> Add(constant mask)] -> Softmax(last axis) -> MatMul(., V)

with the layout nodes around it that are only index arithmetic: the head split (Reshape, Transpose), K's
transpose, the grouped-query repeat of K/V heads (Reshape, Expand, Reshape) before, the head merge (Transpose,
Reshape) after. Each absorbed operand is described by an index map (`IndexMap`): for every element of the
operand the flat index of the element of its source tensor it reads, so the kernel reads each query head's
Q, K and V straight from the source (a KV head shared by several query heads is read by each of them, never
copied) and writes the output at its merged place.

A constant mask is recognised by what it is, not loaded: `PositionMask` says which (query, key) positions it
masks (keys after the query plus an offset: causal; keys from a length on: padding) and the value it adds
there; the kernel regenerates it from positions. A mask of another pattern is not matched (the nodes then
run as the other kernels do).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from fusion.engine.views import apply_view, slab_offset
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType

LAYOUT_OPS = frozenset({OpType.Transpose, OpType.Reshape, OpType.Expand, OpType.Identity})  # + Split, slab Gather
MAX_MAP_ELEMS = 1 << 24  # index maps are int64 arrays of the operand's size: bound what a graph can make us build


@dataclass(frozen=True)
class PositionMask:
    """Key j is masked for query i when j - i > causal_offset (None: no causal part) or j >= key_len; a masked
    score gets `value` added (the exporter's constant, e.g. float32 min), an unmasked one 0."""

    causal_offset: int | None
    key_len: int
    value: float

    def masked(self, sq: int, sk: int) -> np.ndarray:
        i = np.arange(sq)[:, None]
        j = np.arange(sk)[None, :]
        out = j >= self.key_len
        if self.causal_offset is not None:
            out = out | (j - i > self.causal_offset)
        return np.broadcast_to(out, (sq, sk))


@dataclass(frozen=True)
class AttentionMatch:
    """Node names of one attention, by role; `nodes` in graph order is the group."""

    q_layout: tuple[str, ...]
    k_layout: tuple[str, ...]
    v_layout: tuple[str, ...]
    scores: str
    scale: str | None
    mask: str | None
    softmax: str
    context: str
    out_layout: tuple[str, ...]
    q_scale: str | None = None  # a Mul by a scalar on Q before the scores (ViT, PyTorch's MultiheadAttention)
    k_scale: str | None = None  # the same on K^T
    # the MatMuls computing the tensors Q, K and V are read from, taken into the kernel (`with_projections`): one
    # packed in_proj, or one per operand; () when Q, K and V are read from DRAM
    projections: tuple[str, ...] = ()
    # the MatMul projecting the merged heads (constant 2-D weight), taken in too (`with_out_projection`)
    out_projection: str | None = None

    def names(self) -> frozenset[str]:
        parts = (*self.q_layout, *self.k_layout, *self.v_layout, *self.out_layout, *self.projections)
        single = (self.scale, self.mask, self.q_scale, self.k_scale, self.out_projection)
        return frozenset({*parts, self.scores, self.softmax, self.context} | {n for n in single if n})

    def nodes(self, graph: Graph) -> tuple[str, ...]:
        return graph.in_order(self.names())


def _only_consumer(graph: Graph, value: str) -> Node | None:
    users = graph.consumers.get(value, ())
    if len(users) != 1 or value in graph.outputs:
        return None
    return users[0]


def scalar_constant(graph: Graph, value: str) -> float | None:
    if not graph.is_constant(value) or graph.constants[value].size != 1:
        return None
    return float(np.asarray(graph.constants[value]).reshape(()))


def fit_position_mask(mask: np.ndarray, sq: int, sk: int) -> PositionMask | None:
    """The position rule a constant additive mask follows, or None: the same (sq, sk) pattern for every leading
    index, values 0 and one finite c != 0 only, masked keys = a causal suffix and/or a padding suffix."""
    if mask.ndim < 2 or mask.shape[-2] not in (1, sq) or mask.shape[-1] not in (1, sk):
        return None
    flat = np.broadcast_to(mask, (*mask.shape[:-2], sq, sk)).reshape(-1, sq, sk)
    if not (flat == flat[:1]).all():
        return None
    m = np.asarray(flat[0], dtype=np.float32)
    values = np.unique(m)
    nonzero = values[values != 0]
    if len(nonzero) > 1 or not np.isfinite(values).all():
        return None
    if len(nonzero) == 0:
        return PositionMask(None, sk, 0.0)
    c = float(nonzero[0])
    hit = m == np.float32(c)
    full = hit.all(axis=0)
    key_len = sk
    while key_len > 0 and full[key_len - 1]:
        key_len -= 1
    unmasked = (~hit[:, :key_len]).sum(axis=1)
    offsets = {int(u) - 1 - i for i, u in enumerate(unmasked) if 0 < u < key_len}
    blind = np.flatnonzero(unmasked == 0)  # rows seeing no key: i + offset < 0
    if not offsets and len(blind):
        offsets = {-1 - int(blind[-1])}
    if len(offsets) > 1:
        return None
    fitted = PositionMask(offsets.pop() if offsets else None, key_len, c)
    return fitted if (fitted.masked(sq, sk) == hit).all() else None


def _mask_of(graph: Graph, node: Node, scores: str) -> PositionMask | None:
    if node.op != OpType.Add or len(node.inputs) != 2:
        return None
    other = node.inputs[1] if node.inputs[0] == scores else node.inputs[0]
    if other == scores or not graph.is_constant(other):
        return None
    *_, sq, sk = graph.types[scores].shape
    return fit_position_mask(np.asarray(graph.constants[other]), sq, sk)


def mask_of(graph: Graph, node: Node) -> PositionMask:
    """The position mask of a matched mask Add (the match guarantees there is one)."""
    scores = next(v for v in node.inputs if not graph.is_constant(v))
    fitted = _mask_of(graph, node, scores)
    if fitted is None:
        raise ValueError(f"node {node.name!r} is not a position mask")
    return fitted


def _scale_of(graph: Graph, node: Node, scores: str) -> bool:
    if node.op == OpType.Mul and len(node.inputs) == 2:
        other = node.inputs[1] if node.inputs[0] == scores else node.inputs[0]
        return scalar_constant(graph, other) is not None
    return node.op == OpType.Div and node.inputs[0] == scores and scalar_constant(graph, node.inputs[1]) is not None


def _activation_matmul(graph: Graph, node: Node | None) -> bool:
    return (
        node is not None
        and node.op == OpType.MatMul
        and not any(graph.is_constant(v) for v in node.inputs)
        and len(graph.types[node.outputs[0]].shape) >= 2
    )


def _layout_before(graph: Graph, value: str, consumer: Node) -> tuple[str, ...]:
    """The layout nodes producing `value`, walked back as long as the operand stays one strided 2-D view per
    leading index (a node whose outputs are also read elsewhere is cut off later: `_whole_layouts`)."""
    chain: list[Node] = []
    operand = value
    while value not in graph.inputs and not graph.is_constant(value):
        node = graph.producers.get(value)
        if node is None or not _is_layout(graph, node) or (len(node.outputs) != 1 and node.op != OpType.Split):
            break
        reader = chain[-1] if chain else consumer
        if value in graph.outputs or reader.name not in {u.name for u in graph.consumers.get(value, ())}:
            break
        candidate = [*chain, node]
        if index_map(graph, list(reversed(candidate)), operand) is None:
            break
        chain, value = candidate, node.inputs[0]
    return tuple(n.name for n in reversed(chain))


def _is_layout(graph: Graph, node: Node) -> bool:
    return node.op in LAYOUT_OPS or node.op == OpType.Split or slab_offset(graph, node) is not None


def _layout_after(graph: Graph, node: Node) -> tuple[str, ...]:
    chain: list[Node] = []
    value = node.outputs[0]
    while (user := _only_consumer(graph, value)) is not None and user.op in (OpType.Transpose, OpType.Reshape):
        if output_map(graph, [*chain, user], graph.types[node.outputs[0]].shape) is None:
            break
        chain.append(user)
        value = user.outputs[0]
    return tuple(n.name for n in chain)


def match_attention(graph: Graph, softmax: Node) -> AttentionMatch | None:
    """The attention around this Softmax, or None."""
    shape = graph.types[softmax.outputs[0]].shape
    if softmax.op != OpType.Softmax or len(shape) < 2 or softmax.attr("axis") not in (-1, len(shape) - 1):
        return None
    context = _only_consumer(graph, softmax.outputs[0])
    if not _activation_matmul(graph, context) or context.inputs[0] != softmax.outputs[0]:
        return None
    value, scale, mask = softmax.inputs[0], None, None
    producer = graph.producers.get(value)
    if producer is not None and _single(graph, value, softmax):
        inner = _activation_input(graph, producer)
        if inner is not None and _mask_of(graph, producer, inner) is not None:
            mask, value = producer.name, inner
            producer = graph.producers.get(value)
    if producer is not None and _only_consumer(graph, value) is not None:
        inner = _activation_input(graph, producer)
        if inner is not None and _scale_of(graph, producer, inner):
            scale, value = producer.name, inner
            producer = graph.producers.get(value)
    if not _activation_matmul(graph, producer) or _only_consumer(graph, value) is None:
        return None
    scores = producer
    if graph.types[scores.outputs[0]].shape != shape or scores.inputs[0] == scores.inputs[1]:
        return None
    q_scale, q_value, q_user = _operand_scale(graph, scores.inputs[0], scores)
    k_scale, k_value, k_user = _operand_scale(graph, scores.inputs[1], scores)
    core = {scores.name, softmax.name, context.name} | {n for n in (scale, mask, q_scale, k_scale) if n}
    layouts = _whole_layouts(
        graph,
        [
            _layout_before(graph, q_value, q_user),
            _layout_before(graph, k_value, k_user),
            _layout_before(graph, context.inputs[1], context),
        ],
        core,
    )
    return AttentionMatch(
        q_layout=layouts[0],
        k_layout=layouts[1],
        v_layout=layouts[2],
        scores=scores.name,
        scale=scale,
        mask=mask,
        softmax=softmax.name,
        context=context.name,
        out_layout=_layout_after(graph, context),
        q_scale=q_scale,
        k_scale=k_scale,
    )


def operand_values(graph: Graph, match: AttentionMatch) -> tuple[str, str, str]:
    """The values Q, K^T and V are (past a pre-scale Mul): what their layout nodes produce."""
    scores, context = graph.node(match.scores), graph.node(match.context)

    def past(value: str, scale: str | None) -> str:
        return value if scale is None else next(v for v in graph.node(scale).inputs if not graph.is_constant(v))

    return past(scores.inputs[0], match.q_scale), past(scores.inputs[1], match.k_scale), context.inputs[1]


def operand_sources(graph: Graph, match: AttentionMatch) -> tuple[str, str, str]:
    """The tensors Q, K^T and V are read from (their layout's first input, else themselves)."""
    layouts = (match.q_layout, match.k_layout, match.v_layout)
    values = operand_values(graph, match)
    return tuple(graph.node(lay[0]).inputs[0] if lay else v for lay, v in zip(layouts, values, strict=True))


def projection_of(graph: Graph, value: str) -> Node | None:
    """The MatMul (or bias-free Gemm) producing `value` from an activation and a constant 2-D weight (a
    projection), or None."""
    node = graph.producers.get(value)
    if node is None or node.op not in (OpType.MatMul, OpType.Gemm) or len(node.inputs) != 2:  # Gemm: no bias
        return None
    x, w = node.inputs
    if graph.is_constant(x) or not graph.is_constant(w) or len(graph.types[w].shape) != 2:
        return None
    return node


def with_projections(graph: Graph, match: AttentionMatch) -> AttentionMatch | None:
    """The attention with the projections producing the tensors Q, K and V are read from taken in, when each of
    them is a projection (`projection_of`) read by nothing outside the attention; None otherwise."""
    names: list[str] = []
    for source in operand_sources(graph, match):
        node = projection_of(graph, source)
        if node is None:
            return None
        if node.name not in names:
            names.append(node.name)
    inside = match.names() | set(names)
    for name in names:
        out = graph.node(name).outputs[0]
        if out in graph.outputs or any(u.name not in inside for u in graph.consumers.get(out, ())):
            return None
    return replace(match, projections=tuple(names))


def attention_output(graph: Graph, match: AttentionMatch) -> str:
    """The value the attention writes: the merged heads (its out layout's last output, else the context's)."""
    return graph.node(match.out_layout[-1] if match.out_layout else match.context).outputs[0]


def with_out_projection(graph: Graph, match: AttentionMatch) -> AttentionMatch | None:
    """The attention with the projection of its merged heads taken in, when that output is read only by a MatMul
    with a constant 2-D weight (`projection_of`); None otherwise."""
    value = attention_output(graph, match)
    user = _only_consumer(graph, value)
    if user is None or projection_of(graph, user.outputs[0]) is None or user.inputs[0] != value:
        return None
    return replace(match, out_projection=user.name)


def find_projected_attention(graph: Graph, found: Sequence[AttentionMatch] | None = None) -> list[AttentionMatch]:
    """Every attention of the graph (`found`, else `find_attention`'s) with the projections it can take in: its
    Q, K and V projections, and those with its output projection. (The output projection alone is not offered:
    its weight rows then join the attention's loads on the one DMA unit, which the fp32 kernels of BERT and LLaMA
    are already bound by, while the analytic model prices them 20% low.)"""
    out = []
    for m in find_attention(graph) if found is None else found:
        if (p := with_projections(graph, m)) is not None:
            out += [p] + ([o] if (o := with_out_projection(graph, p)) is not None else [])
    return out


def _operand_scale(graph: Graph, value: str, consumer: Node) -> tuple[str | None, str, Node]:
    """A Mul of the operand by a scalar constant that only the scores read: (its name, its input, itself), else
    (None, the operand, the scores MatMul)."""
    node = graph.producers.get(value)
    if node is None or node.op != OpType.Mul or not _single(graph, value, consumer):
        return None, value, consumer
    inner = _activation_input(graph, node)
    if inner is None or not _scale_of(graph, node, inner):
        return None, value, consumer
    return node.name, inner, node


def _whole_layouts(graph: Graph, layouts: list[tuple[str, ...]], core: set[str]) -> list[tuple[str, ...]]:
    """A layout node belongs to the kernel only if every output of it is read inside (the kernel writes none of
    them: a Split feeding Q, K and V, a head split shared by three slab Gathers); otherwise its layout is cut after
    it (it and the nodes before it stay outside)."""
    inside = core | {n for layout in layouts for n in layout}
    cut = []
    for layout in layouts:
        keep = list(layout)
        for i in range(len(layout) - 1, -1, -1):
            node = graph.node(layout[i])
            users = {u.name for v in node.outputs for u in graph.consumers.get(v, ())}
            if not users <= inside or any(v in graph.outputs for v in node.outputs):
                keep = list(layout[i + 1 :])
                break
        cut.append(tuple(keep))
    return _whole_layouts(graph, cut, core) if cut != layouts else cut


def _activation_input(graph: Graph, node: Node) -> str | None:
    """The one non-constant input of a node (None: not exactly one)."""
    live = [v for v in node.inputs if not graph.is_constant(v)]
    return live[0] if len(live) == 1 else None


def _single(graph: Graph, value: str, consumer: Node) -> bool:
    user = _only_consumer(graph, value)
    return user is not None and user.name == consumer.name


def find_attention(graph: Graph) -> list[AttentionMatch]:
    """Every attention of the graph (disjoint: each Softmax leads at most one)."""
    found = [m for n in graph.nodes if n.op == OpType.Softmax and (m := match_attention(graph, n)) is not None]
    taken: set[str] = set()
    out = []
    for m in found:
        if not (m.names() & taken):
            out.append(m)
            taken |= m.names()
    return out


def _apply(node: Node, graph: Graph, data: np.ndarray, output: str) -> np.ndarray:
    """The layout node's semantics on an index array (`output`: which of its outputs)."""
    shape = graph.types[output].shape
    if node.op == OpType.Transpose:
        return np.transpose(data, node.attr("perm"))
    if node.op == OpType.Expand:
        return np.broadcast_to(data, shape)
    if node.op == OpType.Split:
        k = node.outputs.index(output)
        start = int(sum(node.attr("sizes")[:k]))
        return np.take(data, np.arange(start, start + shape[node.attr("axis")]), axis=node.attr("axis"))
    return apply_view(graph, node, data)  # Reshape, Identity, slab Gather or Slice


def index_map(graph: Graph, layout: Sequence[Node], operand: str | None = None) -> np.ndarray | None:
    """For `operand` (default: the last node's only output): the flat index into the first node's input each of
    its elements reads; None when it is not one strided 2-D view per leading index (or too large to describe)."""
    if not layout:
        return None
    src = graph.types[layout[0].inputs[0]].shape
    out = operand or layout[-1].outputs[0]
    if int(np.prod(src)) > MAX_MAP_ELEMS or int(np.prod(graph.types[out].shape)) > MAX_MAP_ELEMS:
        return None
    idx = np.arange(int(np.prod(src)), dtype=np.int64).reshape(src)
    for node, nxt in zip(layout, [*layout[1:], None], strict=True):
        value = out if nxt is None else next(v for v in node.outputs if v in nxt.inputs)
        idx = _apply(node, graph, idx, value)
    return idx if affine_heads(idx) is not None else None


def output_map(graph: Graph, layout: Sequence[Node], shape: tuple[int, ...]) -> np.ndarray | None:
    """For a tensor of `shape` moved by the layout nodes: the flat index in the last node's output where each of
    its elements lands; None when not one strided 2-D view per leading index."""
    size = int(np.prod(shape))
    if size > MAX_MAP_ELEMS or any(n.op not in (OpType.Transpose, OpType.Reshape) for n in layout):
        return None
    idx = np.arange(size, dtype=np.int64).reshape(shape)
    for node in layout:
        idx = _apply(node, graph, idx, node.outputs[0])
    where = np.empty(size, dtype=np.int64)
    where[idx.reshape(-1)] = np.arange(size, dtype=np.int64)
    where = where.reshape(shape)
    return where if affine_heads(where) is not None else None


def head_maps(graph: Graph, value: str, layout: Sequence[str], lead: tuple[int, ...]) -> HeadMaps | None:
    """Per leading index, where `value` (read through the layout nodes, or itself without any) starts in the
    layout's source and its two trailing strides; None when it is not one strided 2-D view per leading index."""
    nodes = [graph.node(n) for n in layout]
    if nodes:
        idx = index_map(graph, nodes, value)
    else:
        shape = graph.types[value].shape
        idx = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    if idx is None:
        return None
    return affine_heads(np.broadcast_to(idx, (*lead, *idx.shape[-2:])))


@dataclass(frozen=True)
class HeadMaps:
    """Per leading index (row-major over the leading dims), the flat element offset of element (0, 0), and the
    element strides of the two trailing axes (the same for every leading index)."""

    bases: np.ndarray
    row_stride: int
    col_stride: int


def affine_heads(idx: np.ndarray) -> HeadMaps | None:
    """`idx[..., r, c] == base[...] + r * sr + c * sc` for one (sr, sc), else None."""
    if idx.ndim < 2:
        return None
    rows, cols = idx.shape[-2:]
    if rows == 0 or cols == 0:
        return None
    flat = idx.reshape(-1, rows, cols)
    base = flat[:, 0, 0]
    sr = int(flat[0, 1, 0] - flat[0, 0, 0]) if rows > 1 else 0
    sc = int(flat[0, 0, 1] - flat[0, 0, 0]) if cols > 1 else 0
    expect = base[:, None, None] + np.arange(rows)[None, :, None] * sr + np.arange(cols)[None, None, :] * sc
    if not np.array_equal(flat, expect) or sr < 0 or sc < 0:
        return None
    return HeadMaps(base, sr, sc)
