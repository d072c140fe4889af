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

from fusion.engine.codegen.gemm import ChainEpilogue, FusedGemm, Schedule, fused_gemm_steps, k_slices, pack_panels
from fusion.engine.codegen.matrix_group import packable_weight
from fusion.engine.codegen.rotary import Region, find_segment_chains, plan_region, segment_views
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext, const_key
from fusion.lower.emitter import Emitter, Step
from fusion.lower.kernels.gemm import Operand
from fusion.lower.kernels.matrix import matrix_operand, requant
from fusion.lower.local_alloc import DEPTH, TileArena, aligned
from fusion.lower.views import View, dense
from isa.enums import DType

SIBLINGS = "siblings"  # constant-form key (on the first weight) of the weights side by side, packed panel-major
MAX_SIBLINGS = 4


@dataclass(frozen=True)
class SiblingMatch:
    heads: tuple[Node, ...]  # the MatMuls, in graph order
    views: tuple[Node, ...]  # the head splits (Reshape, Transpose) taken along
    regions: tuple[str, ...] = ()  # the rotary regions (`codegen.rotary`) on split outputs taken along

    def nodes(self, graph: Graph) -> tuple[str, ...]:
        names = {n.name for n in (*self.heads, *self.views)} | set(self.regions)
        return graph.in_order(names)


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


def _rotary_region(graph: Graph, value: str, regions: list[tuple[str, ...]]) -> tuple[str, ...]:
    """The largest segment-chain region (`codegen.rotary`) reading nothing but `value` and constants, holding
    every reader of `value`, its output shaped like `value` (so it is stored head by head); () when none."""
    readers = {c.name for c in graph.consumers.get(value, ())}
    fits = []
    for region in regions:
        names = set(region)
        produced = {graph.node(n).outputs[0] for n in region}
        reads = {v for n in region for v in graph.node(n).inputs if v not in produced and not graph.is_constant(v)}
        out = graph.node(region[-1]).outputs[0]
        if reads == {value} and readers <= names and graph.types[out].shape == graph.types[value].shape:
            fits.append(region)
    return max(fits, key=len, default=())


def find_siblings(graph: Graph) -> list[SiblingMatch]:
    """Every set of 2..MAX_SIBLINGS MatMuls with constant 2-D weights reading one activation (the first ones in
    graph order when there are more), once for each choice of which of them take their head split along (the
    layout may belong to another kernel, e.g. an attention's), and once more with the rotary regions of the split
    outputs taken along where each of them has one (Q and K rotated in the GEMM's store, never stored unrotated;
    a split without one, V's, is left to its reader then)."""
    by_input: dict[str, list[Node]] = {}
    for node in graph.nodes:
        if node.op == OpType.MatMul and not graph.is_constant(node.inputs[0]) and packable_weight(graph, node):
            by_input.setdefault(node.inputs[0], []).append(node)
    regions = find_segment_chains(graph) if by_input else []
    out = []
    for heads in by_input.values():
        heads = heads[:MAX_SIBLINGS]
        splits = [_head_split(graph, h) for h in heads]
        if len(heads) < 2:
            continue
        for taken in product(*((False, True) if split else (False,) for split in splits)):
            chosen = [split for split, take in zip(splits, taken, strict=True) if take]
            views = tuple(v for split in chosen for v in split)
            out.append(SiblingMatch(tuple(heads), views))
            rotary = [_rotary_region(graph, split[-1].outputs[0], regions) for split in chosen]
            if chosen and all(rotary) and all(split[-1].op == OpType.Transpose for split in chosen):
                out.append(SiblingMatch(tuple(heads), views, tuple(n for region in rotary for n in region)))
    return out


def sibling_heads(nodes: Sequence[Node]) -> tuple[list[Node], dict[str, list[Node]], dict[str, list[Node]]]:
    """The group's MatMuls (in order), each one's layout nodes in the group (its Reshape, Transpose) and each
    one's rotary region (the nodes reading its split output, directly or through each other)."""
    heads = [n for n in nodes if n.op == OpType.MatMul]
    if len(heads) < 2:
        raise CodegenError(f"side-by-side GEMMs are at least two MatMuls, this group has {len(heads)}")
    layouts: dict[str, list[Node]] = {h.name: [] for h in heads}
    regions: dict[str, list[Node]] = {h.name: [] for h in heads}
    final = {h.name: h.outputs[0] for h in heads}
    owner_of: dict[str, str] = {}  # a region value -> its head
    for node in (n for n in nodes if n.op != OpType.MatMul):
        owner = next((h for h, v in final.items() if v == node.inputs[0] and not regions[h]), None)
        if node.op in (OpType.Reshape, OpType.Transpose) and owner is not None:
            layouts[owner].append(node)
            final[owner] = node.outputs[0]
            continue
        owners = {owner_of.get(v) or next((h for h, f in final.items() if f == v), None) for v in node.inputs}
        owners.discard(None)
        if len(owners) != 1:
            raise CodegenError(f"node {node.name!r}: side-by-side GEMMs take only the layout and rotary of outputs")
        (head,) = owners
        regions[head].append(node)
        owner_of[node.outputs[0]] = head
    return heads, layouts, regions


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
    runs = _head_rows(head, view, tuple(layout[-1].attr("perm")), rows)
    d = runs[0][1].shape[-1]
    if d % cx.config.array_size or len(runs) * d != n:
        raise CodegenError(f"node {head.name!r}: a head dim of {d} is not a multiple of the array size")
    return runs


def _head_rows(head: Node, view: View, perm: tuple[int, ...], rows: int) -> list[tuple[int, View]]:
    """A head-split value (or one shaped like it) seen per head: (head's first column in the GEMM's output, its
    rows x d view)."""
    split = view.permute(tuple(np.argsort(perm).tolist()))  # (..., heads, d) in the GEMM's row order
    d = split.shape[-1]
    if math.prod(split.shape[:-2]) != rows:
        raise CodegenError(f"node {head.name!r}: its head split does not keep the GEMM's {rows} rows")
    runs = []
    for h in range(split.shape[-2]):
        rows_view = split.slice(len(split.shape) - 2, h, 1).reshaped((rows, d))
        if rows_view is None:
            raise CodegenError(f"node {head.name!r}: a head's rows do not flatten (several batches)")
        runs.append((h * d, rows_view))
    return runs


@dataclass(frozen=True)
class _Rotated:
    """A head-split output whose rotary region runs on its drained tiles: per head, its first column in the fused
    GEMM, the region output's rows x d view and each packed constant's rows x width view."""

    region: Region
    d: int
    heads: tuple[tuple[int, View, dict[str, View]], ...]
    const_cuts: dict[str, tuple[int, ...]]  # packed constant form key -> its segments' cuts


def _rotated(cx: LowerContext, head: Node, layout: list[Node], region: list[Node], rows: int, start: int) -> _Rotated:
    """Plan a head's rotary region on its drained panels: the split value's segments must be the panels (each
    drained tile one segment, so a head's tiles side by side are its segment-major register)."""
    if not layout or layout[-1].op != OpType.Transpose:
        raise CodegenError(f"node {head.name!r}: a rotary region is taken only after a head split")
    value, n_arr = layout[-1].outputs[0], cx.config.array_size
    d = cx.graph.types[value].shape[-1]
    panels = tuple(range(0, d + 1, n_arr))
    plan = plan_region(cx, region, {value: panels})
    if plan.externals != (value,) or plan.layout.cuts[value] != panels:
        raise CodegenError(f"node {head.name!r}: its rotary region's segments are not the GEMM's panels")
    perm, out = tuple(layout[-1].attr("perm")), plan.output
    if cx.graph.types[out].shape != cx.graph.types[value].shape:
        raise CodegenError(f"node {head.name!r}: its rotary region's output is not shaped like its head split")
    outs = _head_rows(head, cx.view(out), perm, rows)
    consts = {
        key: _head_rows(head, cx.view(c).broadcast_to(cx.graph.types[plan.nodes[i].outputs[0]].shape), perm, rows)
        for i, c, key in plan.packed
    }
    per_head = tuple(
        (start + col, view, {key: runs[h][1] for key, runs in consts.items()}) for h, (col, view) in enumerate(outs)
    )
    const_cuts = {key: plan.layout.cuts[plan.nodes[i].outputs[0]] for i, _, key in plan.packed}
    return _Rotated(plan, d, per_head, const_cuts)


def _rotary_store(
    cx: LowerContext, rotated: Sequence[_Rotated], split_out: Sequence[tuple[int, View]], m: int, a_spare: int
):
    """The fused GEMM's store epilogue: panels of rotated heads go through their region (every value in
    registers, the output stored segment by segment), every other panel is stored as drained. The constants
    (one load for all heads reading the same bytes) stay for a whole row block in the spare scratchpad banks,
    above the `a_spare` bytes a single block's A may take there (`gemm.fused_gemm_steps`), loaded by the block's
    first step (`DEPTH` regions in rotation when there are several blocks: a block's first step waits, by the
    pipeline's credits, for the step DEPTH before it); where they do not fit, each step loads its own."""
    n_arr, cfg = cx.config.array_size, cx.config
    rotated_cols = {j for rot in rotated for col, _, _ in rot.heads for j in range(col, col + rot.d)}
    consts = {}  # the distinct constant views (all rows) and their cuts, in first-use order
    for rot in rotated:
        for _, _, views in rot.heads:
            for key, view in views.items():
                consts.setdefault((view.address, view.shape, view.strides), (view, rot.const_cuts[key]))
    homes: dict[int, dict[tuple, int]] = {}  # a block's first row -> its constants' local addresses
    first_rows: list[int] = []  # the first block's rows: every block but the last has as many

    def target(j0: int) -> tuple[View, int]:
        return next((view, start) for start, view in reversed(split_out) if j0 >= start)

    def resident(i0: int, rows: int, loads: list) -> dict[tuple, int] | None:
        """The block's constants in the spare banks (loaded now by its first step), None if they do not fit."""
        if i0 in homes:
            return homes[i0]
        tm = first_rows[0]
        spare = TileArena.spare(cfg)
        if spare is None or not consts:
            return None
        blocks = -(-m // tm)
        sizes = [aligned(tm * view.shape[-1] * 4) for view, _ in consts.values()]
        regions = 1 if blocks == 1 else DEPTH
        base = spare.spad.base + spare.spad.size - regions * sum(sizes)
        if base < spare.spad.base + (a_spare if blocks == 1 else 0):
            return None
        at = base + (i0 // tm % regions) * sum(sizes)
        home = {}
        for (ident, (view, cuts)), size in zip(consts.items(), sizes, strict=True):
            home[ident] = at
            loads += segment_views(view.slice(0, i0, rows), cuts, at, 4)
            at += size
        homes[i0] = home
        return home

    def step(arena: TileArena, block: tuple[int, int], tiles: list[tuple[int, int, int]]):
        i0, rows = block
        if not first_rows:
            first_rows.append(rows)
        drained = {j0: addr for j0, _, addr in tiles}
        loads: list = []
        stores: list = []
        home = resident(i0, rows, loads)
        const_at: dict[tuple, int] = {}  # without a home: one load per step for every head reading the same bytes
        work = []
        for rot in rotated:
            spill = {v: arena.tile(rows * rot.region.width(v) * 4) for v in rot.region.spills}
            for col, out_view, views in rot.heads:
                panels = list(range(col, col + rot.d, n_arr))
                if not any(j in drained for j in panels):
                    continue
                if not all(j in drained for j in panels):
                    raise CodegenError("a step's weight panels split a rotated head (panels per step not whole heads)")
                es = cx.dtype(rot.region.externals[0]).size
                src, size = drained[panels[0]], rows * n_arr * es
                copies = [] if all(drained[j] == src + i * size for i, j in enumerate(panels)) else panels
                if copies:
                    src = arena.tile(size * len(panels))
                addr = {rot.region.externals[0]: src}
                for key, view in views.items():
                    ident = (view.address, view.shape, view.strides)
                    if home is not None:
                        addr[key] = home[ident]
                        continue
                    if ident not in const_at:
                        const_at[ident] = arena.tile(rows * view.shape[-1] * 4)
                        loads += segment_views(view.slice(0, i0, rows), rot.const_cuts[key], const_at[ident], 4)
                    addr[key] = const_at[ident]
                out_addr = arena.tile(rows * rot.d * 4)
                out_cuts = rot.region.layout.cuts[rot.region.output]
                stores += [(a, v) for v, a in segment_views(out_view.slice(0, i0, rows), out_cuts, out_addr, 4)]
                copies_from = [(drained[j], src + i * size) for i, j in enumerate(copies)]
                work.append((rot.region, addr, spill, out_addr, copies_from, size, es))
        for j0, cols, addr in tiles:
            if j0 in rotated_cols:
                continue
            view, start = target(j0)
            stores.append((addr, view.slice(0, i0, rows).slice(1, j0 - start, cols)))

        def emit(em: Emitter) -> None:
            for region, addr, spill, out_addr, copies_from, size, es in work:
                for src, dst in copies_from:
                    em.b.v_copy(*em.regs(dst, src), size // es, "i8" if es == 1 else "f32")
                em.b.vc_st(em.reg(out_addr), region.emit(cx, em, rows, addr, spill))

        return loads, emit, stores

    return step


def pack_siblings(weights: Sequence[np.ndarray], n_arr: int) -> np.ndarray:
    """The K x N_i weights side by side, as (sum N_i / n_arr, K, n_arr) panels."""
    for w in weights:
        if w.shape[1] % n_arr:
            raise CodegenError(f"side-by-side GEMMs: {w.shape[1]} columns are not a multiple of the array size")
    return pack_panels(np.concatenate(weights, axis=1), n_arr)


def sibling_steps(cx: LowerContext, nodes: Sequence[Node], panels: int) -> list[Step]:
    graph, cfg = cx.graph, cx.config
    heads, layouts, regions = sibling_heads(nodes)
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
    rotated = [
        _rotated(cx, h, layouts[h.name], regions[h.name], rows, start)
        for h, start in zip(heads, starts, strict=True)
        if regions[h.name]
    ]
    schedule = Schedule(panels=panels)
    chain = None
    if rotated:
        whole = math.lcm(*(r.d // n_arr for r in rotated))  # a step's panels hold whole rotated heads
        widest = max(max(r.region.layout.cuts[v][-1] for v in r.region.layout.cuts) for r in rotated)
        schedule = Schedule(tile_m=cfg.vreg_elems // widest, panels=panels, panel_multiple=whole)
        per_elem = max(len(r.region.spills) + len(r.region.packed) for r in rotated) + 2  # + output, + a copy
        a_spare = sum(
            aligned(rows * kb * (av.dtype.size + (a.quantize_scale is not None))) for _, kb in k_slices(k, n_arr)
        )
        chain = ChainEpilogue(_rotary_store(cx, rotated, split_out, rows, a_spare), (4,) * per_elem, ())
    g = FusedGemm(
        Operand(av, a.quantize_scale),
        Operand(dense(packed, (k, total), w_dt)),
        dense(0, (rows, total), dtypes.pop()),  # shape and drained dtype only: split_out says where tiles go
        requant=requant(cx, first),
        b_panels=dense(packed, (total // n_arr, k, n_arr), w_dt),
        chain=chain,
        panel_requant=panel_requant if cx.int8 else (),
        split_out=split_out,
    )
    return fused_gemm_steps(cfg, g, schedule, alone=True, rotation=cx.rotation)


def sibling_weights(graph: Graph) -> list[str]:
    """The group's weights in its MatMuls' order (for packing)."""
    heads, _, _ = sibling_heads(graph.nodes)
    return [packable_weight(graph, h) for h in heads]  # type: ignore[misc]
