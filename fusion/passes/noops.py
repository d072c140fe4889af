"""Identity/no-op removal: Identity, same-shape Reshape, identity Transpose, full Slice, one-way Concat/Split,
Cast to the same dtype, Expand to the same shape, Pad by nothing, Clip to (-inf, inf), and arithmetic with a
constant neutral element (x+0, x-0, x*1, x/1, x^1) that does not change x's type."""

from __future__ import annotations

import numpy as np

from fusion.graph.assemble import rebuild
from fusion.graph.ir import Graph, Node, make_node
from fusion.graph.ops import OpType
from fusion.passes.dce import eliminate_dead_nodes
from fusion.passes.rewrite import apply_equivalences

_NEUTRAL_RIGHT = {OpType.Add: 0.0, OpType.Sub: 0.0, OpType.Mul: 1.0, OpType.Div: 1.0, OpType.Pow: 1.0}
_NEUTRAL_LEFT = {OpType.Add: 0.0, OpType.Mul: 1.0}


def _is_full_slice(graph: Graph, node: Node) -> bool:
    shape = graph.types[node.inputs[0]].shape
    return all(
        s == 0 and e == shape[a] and st == 1
        for a, s, e, st in zip(
            node.attr("axes"), node.attr("starts"), node.attr("ends"), node.attr("steps"), strict=True
        )
    )


def _neutral_operand(graph: Graph, node: Node) -> str | None:
    """The input that passes through unchanged, if the other is a constant neutral element."""
    out_type = graph.types[node.outputs[0]]
    for keep, other, table in ((0, 1, _NEUTRAL_RIGHT), (1, 0, _NEUTRAL_LEFT)):
        value = graph.constants.get(node.inputs[other])
        if (
            node.op in table
            and value is not None
            and np.all(value == table[node.op])
            and graph.types[node.inputs[keep]] == out_type
        ):
            return node.inputs[keep]
    return None


def passthrough(graph: Graph, node: Node) -> str | None:
    """The input value a no-op node forwards, or None if the node does real work."""
    op, src = node.op, node.inputs[0] if node.inputs else None
    same_type = src is not None and graph.types[src] == graph.types[node.outputs[0]]
    if op == OpType.Identity or (op in (OpType.Reshape, OpType.Cast, OpType.Expand) and same_type):
        return src
    if op == OpType.Pad and not any(node.attr("pads")):
        return src
    if op == OpType.Clip and node.attr("min") == -np.inf and node.attr("max") == np.inf:
        return src
    if op == OpType.Transpose and tuple(node.attr("perm")) == tuple(range(len(node.attr("perm")))):
        return src
    if op == OpType.Slice and _is_full_slice(graph, node):
        return src
    if op in (OpType.Concat, OpType.Split) and len(node.inputs) == 1 and len(node.outputs) == 1:
        return src
    if op in _NEUTRAL_RIGHT:
        return _neutral_operand(graph, node)
    return None


def remove_noops(graph: Graph) -> Graph:
    """Readers of a no-op read its input; a no-op whose output name must survive becomes an Identity."""
    mapping: dict[str, str] = {}
    nodes: list[Node] = []
    for node in graph.nodes:
        src = passthrough(graph, node)
        if src is not None:
            mapping[node.outputs[0]] = src
            node = make_node(node.name, OpType.Identity, (src,), node.outputs)
        nodes.append(node)
    return eliminate_dead_nodes(rebuild(graph, apply_equivalences(graph, nodes, mapping)))
