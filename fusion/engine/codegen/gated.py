"""Two GEMMs reading one activation, joined by a vector chain: a gated MLP's gate and up projections with SiLU(gate)
* up (LLaMA), GEGLU, or any chain of both outputs, as ONE kernel.

The two constant K x N weights are packed panel-interleaved (gate panel j, then up panel j: `pack_gated`), so they
are one fused GEMM (`codegen.gemm`) over 2N columns whose steps each take a pair of panels: A is read once for
both, and each drained pair of tiles (int8: each requantized with its own node's multiplier, as the unfused
MatMuls drain) feeds the chain in the scratchpad (`gemm.ChainEpilogue`), which dequantizes like the unfused
consumer; only the chain's result is stored. Neither projection's output exists in DRAM. Refused: weights of
different shapes, N not a multiple of the array size (the pairs would straddle panels), a chain reading anything
but the two outputs and scalars, different activation scales.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fusion.engine.codegen.chain import CHAIN_OPS, emit_chain, operands
from fusion.engine.codegen.gemm import ChainEpilogue, FusedGemm, Schedule, fused_gemm_steps, plan_tiles
from fusion.engine.codegen.matrix_group import packable_weight
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext, const_key
from fusion.lower.emitter import Emitter, Step
from fusion.lower.kernels.gemm import Operand
from fusion.lower.kernels.matrix import matrix_operand, requant
from fusion.lower.local_alloc import TileArena
from fusion.lower.views import dense
from isa.enums import DType

GATED = "gated"  # constant-form key (on the first weight) of the two weights packed panel-interleaved
MAX_GATED_CHAIN = 8  # chain nodes after the two GEMMs


@dataclass(frozen=True)
class GatedMatch:
    first: Node  # the two MatMuls, in graph order
    second: Node
    chain: tuple[Node, ...]  # in graph order; the last one's output is the group's

    def nodes(self, graph: Graph) -> tuple[str, ...]:
        """The group's node names in graph order."""
        names = {self.first.name, self.second.name, *(n.name for n in self.chain)}
        return graph.in_order(names)


def _pairable(graph: Graph, a: Node, b: Node) -> bool:
    wa, wb = packable_weight(graph, a), packable_weight(graph, b)
    return (
        a.op == b.op == OpType.MatMul
        and a.inputs[0] == b.inputs[0]
        and wa is not None
        and wb is not None
        and graph.types[wa].shape == graph.types[wb].shape
    )


def _chain_after(graph: Graph, first: Node, second: Node) -> tuple[Node, ...] | None:
    """The chain nodes (graph order) from the two outputs to one value that is all that leaves the group."""
    inside = {first.outputs[0], second.outputs[0]}
    chain: list[Node] = []
    start = min(graph.nodes.index(first), graph.nodes.index(second)) + 1
    for node in graph.nodes[start:]:
        reads = [v for v in node.inputs if not graph.is_constant(v)]
        if node.op not in CHAIN_OPS or not reads or not set(reads) <= inside:
            continue
        chain.append(node)
        inside.add(node.outputs[0])
        names = {n.name for n in chain}
        leaving = {
            v for v in inside if v in graph.outputs or any(c.name not in names for c in graph.consumers.get(v, ()))
        }
        if leaving == {node.outputs[0]}:
            return tuple(chain)
        if len(chain) >= MAX_GATED_CHAIN:
            return None
    return None


def find_gated(graph: Graph) -> list[GatedMatch]:
    """Every pair of MatMuls sharing an activation whose outputs meet in a vector chain (each MatMul in one)."""
    matrix = [n for n in graph.nodes if n.op == OpType.MatMul]
    out: list[GatedMatch] = []
    taken: set[str] = set()
    for i, a in enumerate(matrix):
        for b in matrix[i + 1 :]:
            if a.name in taken or b.name in taken or not _pairable(graph, a, b):
                continue
            chain = _chain_after(graph, a, b)
            if chain is not None and {a.outputs[0], b.outputs[0]} <= {v for n in chain for v in n.inputs}:
                out.append(GatedMatch(a, b, chain))
                taken |= {a.name, b.name}
    return out


def gated_heads(nodes: Sequence[Node]) -> tuple[tuple[Node, Node], list[Node]]:
    """The group's two MatMuls (in order) and its chain nodes."""
    heads = [n for n in nodes if n.op == OpType.MatMul]
    if len(heads) != 2:
        raise CodegenError(f"a gated GEMM has two MatMuls, this group {len(heads)}")
    return (heads[0], heads[1]), [n for n in nodes if n.op != OpType.MatMul]


def pack_gated(first: np.ndarray, second: np.ndarray, n_arr: int) -> np.ndarray:
    """Two K x N weights as (2 N / n_arr, K, n_arr) panels: the first's panel j, then the second's."""
    k, n = first.shape
    if n % n_arr:
        raise CodegenError(f"gated GEMM: {n} output columns are not a multiple of the array size {n_arr}")
    panels = np.stack([w.reshape(k, n // n_arr, n_arr).transpose(1, 0, 2) for w in (first, second)], axis=1)
    return np.ascontiguousarray(panels.reshape(2 * (n // n_arr), k, n_arr))


def gated_steps(cx: LowerContext, nodes: Sequence[Node]) -> list[Step]:
    g, schedule = gated_gemm(cx, nodes)
    return fused_gemm_steps(cx.config, g, schedule, alone=True, rotation=cx.rotation)


def gated_gemm(cx: LowerContext, nodes: Sequence[Node]) -> tuple[FusedGemm, Schedule]:
    """The group as one fused GEMM over the panel-interleaved weights, with its chain as the epilogue, and the
    schedule it runs (a pair of panels per step)."""
    graph, cfg = cx.graph, cx.config
    heads, chain = gated_heads(nodes)
    first, second = heads
    if not chain or not _pairable(graph, first, second):
        raise CodegenError("a gated GEMM is two MatMuls of one activation with same-shaped constant weights, a chain")
    k, n = graph.types[first.inputs[1]].shape
    if n % cfg.array_size:
        raise CodegenError(f"node {first.name!r}: {n} output columns are not a multiple of the array size")
    outs = (first.outputs[0], second.outputs[0])
    table = operands(cx, chain)
    external = {o.value for o in table.values() if o.kind in ("tile", "row")}
    if not external <= set(outs):
        raise CodegenError(f"the gated chain reads {sorted(external - set(outs))}: only the two GEMMs' outputs")
    q1, q2 = (cx.matrix(h) if cx.int8 else None for h in (first, second))
    scale = q1.input_scale if q1 else None
    if q1 is not None and q2 is not None and q1.input_scale != q2.input_scale:
        raise CodegenError(f"nodes {first.name!r}, {second.name!r} quantize their activation differently")
    a = matrix_operand(cx, first, first.inputs[0], scale)
    rows = math.prod(a.view.shape[:-1])
    av = a.view.reshaped((rows, k))
    out = cx.view(chain[-1].outputs[0]).reshaped((rows, n))
    if av is None or out is None:
        raise CodegenError(f"node {first.name!r}: the activation and the chain's output must flatten to 2-D views")
    w_dt = DType.i8 if cx.int8 else DType.f32
    packed = cx.addresses[const_key(first.inputs[1], GATED)]
    n_arr = cfg.array_size
    dtypes = [cx.dtype(v) for v in outs]

    def step(arena: TileArena, block: tuple[int, int], panels: list[tuple[int, int, int]]):
        (i0, m), stores, emits = block, [], []
        for (j0, cols, drained), (_, _, other) in zip(panels[::2], panels[1::2], strict=True):
            out_addr = arena.tile(m * cols * 4)
            emits.append(({outs[0]: drained, outs[1]: other}, out_addr, m * cols, cols))
            stores.append((out_addr, out.slice(0, i0, m).slice(1, j0 // 2, cols)))

        def emit(em: Emitter) -> None:
            for addr, out_addr, count, period in emits:
                emit_chain(cx, em, chain, table, {v: addr[v] for v in outs if v in external}, out_addr, count, period)

        return [], emit, stores

    if dtypes[0] != dtypes[1]:
        raise CodegenError(f"nodes {first.name!r}, {second.name!r} store their outputs in different dtypes")
    g = FusedGemm(
        Operand(av, a.quantize_scale),
        Operand(dense(packed, (k, 2 * n), w_dt)),
        dense(0, (rows, 2 * n), dtypes[0]),  # shape and drained dtype only: the chain stores, this is never written
        requant=requant(cx, first),
        b_panels=dense(packed, (2 * n // n_arr, k, n_arr), w_dt),
        chain=ChainEpilogue(step, (4,), ()),
        panel_requant=(requant(cx, first), requant(cx, second)) if cx.int8 else (),
    )
    schedule = Schedule(panels=2)
    if plan_tiles(cfg, g, schedule)[1] != 2:
        raise CodegenError(f"node {first.name!r}: a pair of weight panels does not fit a buffer slot beside A")
    return g, schedule
