"""Fusion candidates: producer/consumer chains of nodes, each with the kernel schedules worth trying.

Starting points are (a) a matrix node with the elementwise consumers its drain can absorb, (b) maximal runs of
elementwise/row-reduction nodes that a vector chain can execute, (c) a matrix node with a constant weight (after a
leading-axis Transpose it absorbs) followed by such a run or by whole-row layout moves, for the swapped
orientation, (d) a Transpose (and the Reshapes after it) feeding such a run, as one chain reading the transposed
tensor from local memory, or feeding a MatMul that reads it in place, (e) an attention with its layout nodes
(`attention_match`), as one kernel. Every prefix of (a), (c) and (d) and
every sub-run of (b) is a candidate; schedules vary tile rows, batch flattening and the zero-skip variant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from fusion.engine.attention_match import find_attention
from fusion.engine.codegen.absorbed_layout import loads_in_place
from fusion.engine.codegen.chain import CHAIN_OPS
from fusion.engine.codegen.matrix_group import EPILOGUE_HEADS
from fusion.engine.context import ModelContext
from fusion.engine.plan import Group
from fusion.engine.views import is_view
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.compiler import ALIAS_OPS

ABSORBABLE = frozenset({OpType.Add, OpType.Relu})
MAX_CHAIN = 4
PANELS = (1, 2, 4, 0)  # weight panels per GEMM step (0: as many as fit)


@dataclass(frozen=True)
class Candidate:
    nodes: tuple[str, ...]
    family: str  # "single", "epilogue", "chain", "stream", "swapped" ((c)), "conv", "layout_chain"/"layout_load" ((d)),
    # "attention" ((e))


def sole_consumer(graph: Graph, node: Node) -> Node | None:
    value = node.outputs[0]
    users = graph.consumers.get(value, ())
    if len(node.outputs) != 1 or len(users) != 1 or value in graph.outputs:
        return None
    return users[0]


def _follow(graph: Graph, node: Node, allowed: frozenset, limit: int) -> list[Node]:
    run = [node]
    while len(run) < limit:
        nxt = sole_consumer(graph, run[-1])
        if nxt is None or nxt.op not in allowed:
            break
        run.append(nxt)
    return run


def _feeds_activation(transpose: Node, mm: Node) -> bool:
    """A Transpose of leading axes only, read as a GEMM's activation: the swapped GEMM can absorb it."""
    perm = tuple(transpose.attr("perm"))
    return mm.op in EPILOGUE_HEADS and mm.inputs[0] == transpose.outputs[0] and perm[-1] == len(perm) - 1


def _row_move_tails(graph: Graph, head: Node) -> list[tuple[str, ...]]:
    """A GEMM (+ Relu) followed by a leading-axis Transpose, possibly through a Reshape keeping the last axis:
    layout moves of whole output rows that a swapped GEMM stores directly."""
    run = _follow(graph, head, frozenset({OpType.Relu, OpType.Reshape, OpType.Transpose}), 4)
    found = []
    for k in range(2, len(run) + 1):
        last, body = run[k - 1], run[: k - 1]
        ops = [n.op for n in body]
        if last.op != OpType.Transpose or tuple(last.attr("perm"))[-1] != len(last.attr("perm")) - 1:
            continue
        if OpType.Transpose in ops[1:] or ops[1:].count(OpType.Reshape) > 1 or OpType.Reshape in ops[1:-1]:
            continue
        found.append(tuple(n.name for n in run[:k]))
    return found


def enumerate_candidates(graph: Graph) -> list[Candidate]:
    out: list[Candidate] = [Candidate((n.name,), "single") for n in graph.nodes]
    for node in graph.nodes:
        if node.op in EPILOGUE_HEADS:
            run = _follow(graph, node, ABSORBABLE, MAX_CHAIN)
            out += [Candidate(tuple(n.name for n in run[:k]), "epilogue") for k in range(2, len(run) + 1)]
        if node.op == OpType.MatMul:
            run = _follow(graph, node, CHAIN_OPS, MAX_CHAIN)
            out += [Candidate(tuple(n.name for n in run[:k]), "stream") for k in range(2, len(run) + 1)]
        if node.op == OpType.Transpose and (mm := sole_consumer(graph, node)) and _feeds_activation(node, mm):
            run = [node, *_follow(graph, mm, CHAIN_OPS, MAX_CHAIN)]
            out += [Candidate(tuple(n.name for n in run[:k]), "swapped") for k in range(2, len(run) + 1)]
        if node.op in EPILOGUE_HEADS:
            out += [Candidate(nodes, "swapped") for nodes in _row_move_tails(graph, node)]
            run = _follow(graph, node, CHAIN_OPS, MAX_CHAIN)  # the epilogue as a chain after the transposing load
            out += [Candidate(tuple(n.name for n in run[:k]), "swapped") for k in range(2, len(run) + 1)]
        if node.op == OpType.Conv:
            run = _follow(graph, node, ABSORBABLE, MAX_CHAIN)
            out += [Candidate(tuple(n.name for n in run[:k]), "conv") for k in range(2, len(run) + 1)]
        if node.op in CHAIN_OPS:
            run = _follow(graph, node, CHAIN_OPS, MAX_CHAIN)
            out += [Candidate(tuple(n.name for n in run[:k]), "chain") for k in range(2, len(run) + 1)]
        if node.op == OpType.Transpose:
            out += _layout_chains(graph, node)
    out += [Candidate(m.nodes(graph), "attention") for m in find_attention(graph)]
    return out


def _layout_chains(graph: Graph, transpose: Node) -> list[Candidate]:
    """A Transpose and the Reshapes after it, then a run of chain nodes (one vector chain fed through the layout
    transform, every prefix with at least one chain node) or the MatMul reading them (in place): see
    `codegen.absorbed_layout`."""
    layout = _follow(graph, transpose, frozenset({OpType.Reshape}), MAX_CHAIN)
    head = sole_consumer(graph, layout[-1])
    names = tuple(n.name for n in layout)
    if head is not None and loads_in_place(graph, head):
        return [Candidate((*names, head.name), "layout_load")]
    if head is None or head.op not in CHAIN_OPS:
        return []
    run = tuple(n.name for n in _follow(graph, head, CHAIN_OPS, MAX_CHAIN))
    return [Candidate((*names, *run[:k]), "layout_chain") for k in range(1, len(run) + 1)]


def schedules(mc: ModelContext, cand: Candidate) -> list[Group]:
    """The kernel variants to try for a candidate (the zero-skip twins are added by the planner)."""
    graph = mc.graph
    head = graph.node(cand.nodes[0])
    if cand.family == "single" and head.op in ALIAS_OPS:
        return [Group(cand.nodes, "alias")]
    groups: list[Group] = []
    if cand.family == "single" and is_view(graph, head):  # a constant slab Gather: a view, no kernel
        groups.append(Group(cand.nodes, "alias"))
    if cand.family == "single":
        groups.append(Group(cand.nodes, "unfused"))
        if head.op in CHAIN_OPS:
            groups.append(Group(cand.nodes, "chain"))
        if head.op == OpType.Transpose:
            groups.append(Group(cand.nodes, "transpose_load"))
        if head.op == OpType.Conv:
            groups.append(Group(cand.nodes, "implicit_gemm"))
    if cand.family in ("chain", "stream", "swapped"):
        groups.append(Group(cand.nodes, cand.family))
    if cand.family == "layout_chain":
        groups.append(Group(cand.nodes, "chain"))
    if cand.family == "layout_load":
        groups.append(Group(cand.nodes, "transpose_load"))
    if cand.family == "conv":
        groups.append(Group(cand.nodes, "implicit_gemm"))
    if cand.family == "attention":
        groups.append(Group(cand.nodes, "attention"))
    if head.op in EPILOGUE_HEADS and cand.family in ("single", "epilogue"):
        groups += gemm_schedules(mc, cand.nodes)
        groups.append(Group(cand.nodes, "swapped"))
    return groups


def gemm_schedules(mc: ModelContext, nodes: tuple[str, ...]) -> list[Group]:
    """Distinct GEMM schedules: batch flattening, row tiles, weight panels per step, A-stationary order."""
    graph, n_arr = mc.graph, mc.config.array_size
    head = graph.node(nodes[0])
    a, b = (graph.types[v].shape for v in head.inputs[:2])
    out = graph.types[head.outputs[0]].shape
    total_panels = -(-out[-1] // n_arr)
    panels = sorted({p if p < total_panels else 0 for p in PANELS}, key=lambda p: p or total_panels)
    groups = []
    for flatten in (False, True) if len(a) > 2 and len(b) == 2 else (False,):
        rows = math.prod(a[:-1]) if flatten else a[-2]
        for tile_m in (0, n_arr) if rows > 2 * n_arr else (0,):
            groups += [Group(nodes, "epilogue", tile_m, flatten, p) for p in panels]
        groups += [Group(nodes, "epilogue", 0, flatten, p, True) for p in panels]
    return groups


def zero_skip_twin(group: Group) -> Group | None:
    if group.strategy != "epilogue":
        return None
    return replace(group, strategy="zero_skip")
