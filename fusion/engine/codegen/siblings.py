"""GEMMs reading one activation, side by side: an attention's Q, K and V projections (as BERT and LLaMA export
them, three MatMuls of the normed hidden state) as ONE kernel.

The constant K x N_i weights are concatenated along N and packed panel-major (`pack_siblings`), so they are one
fused GEMM (`codegen.gemm`) over sum(N_i) columns: A is read (and on the int8 path quantized) once for all of
them, the weight panels of every projection stream through one pipeline (one DMA latency per panel instead of
each kernel's own prologue and epilogue), and each drained tile is stored to its own projection's output
(`FusedGemm.split_out`; int8: requantized with its own node's multiplier, `FusedGemm.panel_requant`, as the
unfused MatMuls drain). Each output may be followed by its head split, a Reshape and a Transpose keeping the
last axis (each array-wide panel of a head's columns is stored as that head's rows), so the group's outputs are
what the rotary embedding or the attention reads. Refused: N_i (or the head dim) not a multiple of the array
size (a panel would straddle two outputs or heads), different activation scales, outputs stored in different
dtypes, a head split whose rows do not flatten (several batches).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product

import numpy as np

from fusion.engine.codegen.gemm import FusedGemm, Schedule, fused_gemm_steps, pack_panels
from fusion.engine.codegen.matrix_group import packable_weight
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext, const_key
from fusion.lower.emitter import Step
from fusion.lower.kernels.gemm import Operand
from fusion.lower.kernels.matrix import matrix_operand, requant
from fusion.lower.views import View, dense
from isa.enums import DType

SIBLINGS = "siblings"  # constant-form key (on the first weight) of the weights side by side, packed panel-major
MAX_SIBLINGS = 4


@dataclass(frozen=True)
class SiblingMatch:
    heads: tuple[Node, ...]  # the MatMuls, in graph order
    views: tuple[Node, ...]  # the head splits (Reshape, Transpose) taken along

    def nodes(self, graph: Graph) -> tuple[str, ...]:
        names = {n.name for n in (*self.heads, *self.views)}
        return tuple(n.name for n in graph.nodes if n.name in names)


def _head_split(graph: Graph, head: Node) -> list[Node]:
    """The layout after a GEMM: a Reshape keeping or splitting the last axis, then optionally a Transpose keeping
    the last axis (an attention head split), each the previous one's only reader."""
    out, value = [], head.outputs[0]
    for op in (OpType.Reshape, OpType.Transpose):
        users = graph.consumers.get(value, ())
        if len(users) != 1 or users[0].op != op or value in graph.outputs:
            break
        if op == OpType.Transpose and tuple(users[0].attr("perm"))[-1] != len(users[0].attr("perm")) - 1:
            break
        out.append(users[0])
        value = users[0].outputs[0]
    return out


def find_siblings(graph: Graph) -> list[SiblingMatch]:
    """Every set of 2..MAX_SIBLINGS MatMuls with constant 2-D weights reading one activation (the first ones in
    graph order when there are more), once for each choice of which of them take their head split along (the
    layout may belong to another kernel, e.g. an attention's)."""
    by_input: dict[str, list[Node]] = {}
    for node in graph.nodes:
        if node.op == OpType.MatMul and not graph.is_constant(node.inputs[0]) and packable_weight(graph, node):
            by_input.setdefault(node.inputs[0], []).append(node)
    out = []
    for heads in by_input.values():
        heads = heads[:MAX_SIBLINGS]
        splits = [_head_split(graph, h) for h in heads]
        if len(heads) < 2:
            continue
        for taken in product(*((False, True) if split else (False,) for split in splits)):
            views = tuple(v for split, take in zip(splits, taken, strict=True) if take for v in split)
            out.append(SiblingMatch(tuple(heads), views))
    return out


def sibling_heads(nodes: Sequence[Node]) -> tuple[list[Node], dict[str, list[Node]]]:
    """The group's MatMuls (in order) and each one's layout nodes in the group (its Reshape, Transpose)."""
    heads = [n for n in nodes if n.op == OpType.MatMul]
    if len(heads) < 2:
        raise CodegenError(f"side-by-side GEMMs are at least two MatMuls, this group has {len(heads)}")
    layouts: dict[str, list[Node]] = {h.name: [] for h in heads}
    final = {h.name: h.outputs[0] for h in heads}
    for node in (n for n in nodes if n.op != OpType.MatMul):
        owner = next((h for h, v in final.items() if v == node.inputs[0]), None)
        if node.op not in (OpType.Reshape, OpType.Transpose) or owner is None:
            raise CodegenError(f"node {node.name!r}: side-by-side GEMMs take only the layout of their outputs")
        layouts[owner].append(node)
        final[owner] = node.outputs[0]
    return heads, layouts


def _outputs(cx: LowerContext, head: Node, layout: list[Node], rows: int, n: int) -> list[tuple[int, View]]:
    """Where a GEMM's (rows x n) output goes: (first column, rows x width view) per run of columns. Without a
    Transpose, one run (the Reshape is a view); with a head split, one run per head, stored as its rows."""
    final = layout[-1].outputs[0] if layout else head.outputs[0]
    view = cx.view(final)
    if not layout or layout[-1].op != OpType.Transpose:
        flat = view.reshaped((rows, n))
        if flat is None:
            raise CodegenError(f"node {head.name!r}: its output must flatten to rows x columns")
        return [(0, flat)]
    perm = tuple(layout[-1].attr("perm"))
    split = view.permute(tuple(np.argsort(perm).tolist()))  # (..., heads, D) in the GEMM's row order
    d = split.shape[-1]
    if d % cx.config.array_size or math.prod(split.shape[:-1]) * d != rows * n:
        raise CodegenError(f"node {head.name!r}: a head dim of {d} is not a multiple of the array size")
    runs = []
    for h in range(split.shape[-2]):
        rows_view = split.slice(len(split.shape) - 2, h, 1).reshaped((rows, d))
        if rows_view is None:
            raise CodegenError(f"node {head.name!r}: a head's rows do not flatten (several batches)")
        runs.append((h * d, rows_view))
    return runs


def pack_siblings(weights: Sequence[np.ndarray], n_arr: int) -> np.ndarray:
    """The K x N_i weights side by side, as (sum N_i / n_arr, K, n_arr) panels."""
    for w in weights:
        if w.shape[1] % n_arr:
            raise CodegenError(f"side-by-side GEMMs: {w.shape[1]} columns are not a multiple of the array size")
    return pack_panels(np.concatenate(weights, axis=1), n_arr)


def sibling_steps(cx: LowerContext, nodes: Sequence[Node], panels: int) -> list[Step]:
    graph, cfg = cx.graph, cx.config
    heads, layouts = sibling_heads(nodes)
    first = heads[0]
    weights = [packable_weight(graph, h) for h in heads]
    if any(h.inputs[0] != first.inputs[0] for h in heads) or any(w is None for w in weights):
        raise CodegenError("side-by-side GEMMs read one activation with constant 2-D weights")
    shapes = [graph.types[w].shape for w in weights]  # type: ignore[index]
    k, widths = shapes[0][0], [s[1] for s in shapes]
    if any(s[0] != k for s in shapes) or any(n % cfg.array_size for n in widths):
        raise CodegenError(f"node {first.name!r}: widths {widths} are not multiples of the array size")
    qs = [cx.matrix(h) for h in heads] if cx.int8 else []
    if len({q.input_scale for q in qs}) > 1:
        raise CodegenError(f"nodes {[h.name for h in heads]} quantize their activation differently")
    dtypes = {cx.dtype(h.outputs[0]) for h in heads}
    if len(dtypes) != 1:
        raise CodegenError(f"nodes {[h.name for h in heads]} store their outputs in different dtypes")
    a = matrix_operand(cx, first, first.inputs[0], qs[0].input_scale if qs else None)
    rows, total = math.prod(a.view.shape[:-1]), sum(widths)
    av = a.view.reshaped((rows, k))
    if av is None:
        raise CodegenError(f"node {first.name!r}: the activation must flatten to rows x K")
    starts = np.cumsum([0, *widths[:-1]]).tolist()
    split_out = tuple(
        (start + j, view)
        for h, n, start in zip(heads, widths, starts, strict=True)
        for j, view in _outputs(cx, h, layouts[h.name], rows, n)
    )
    w_dt = DType.i8 if cx.int8 else DType.f32
    packed = cx.addresses[const_key(first.inputs[1], SIBLINGS)]
    n_arr = cfg.array_size
    panel_requant = tuple(requant(cx, h) for h, n in zip(heads, widths, strict=True) for _ in range(n // n_arr))
    g = FusedGemm(
        Operand(av, a.quantize_scale),
        Operand(dense(packed, (k, total), w_dt)),
        dense(0, (rows, total), dtypes.pop()),  # shape and drained dtype only: split_out says where tiles go
        requant=requant(cx, first),
        b_panels=dense(packed, (total // n_arr, k, n_arr), w_dt),
        panel_requant=panel_requant if cx.int8 else (),
        split_out=split_out,
    )
    return fused_gemm_steps(cfg, g, Schedule(panels=panels), alone=True, rotation=cx.rotation)


def sibling_weights(graph: Graph) -> list[str]:
    """The group's weights in its MatMuls' order (for packing)."""
    heads, _ = sibling_heads(graph.nodes)
    return [packable_weight(graph, h) for h in heads]  # type: ignore[misc]
