"""Transpose-pair cancellation: Transpose(Transpose(x, p1), p2) becomes x (if the perms cancel) or one Transpose."""

from __future__ import annotations

from fusion.graph.assemble import rebuild
from fusion.graph.ir import Graph, Node, make_node
from fusion.graph.ops import OpType
from fusion.passes.dce import eliminate_dead_nodes
from fusion.passes.rewrite import apply_equivalences


def compose(first: tuple[int, ...], second: tuple[int, ...]) -> tuple[int, ...]:
    """The perm of transposing by `first` then by `second`."""
    return tuple(first[i] for i in second)


def cancel_transposes(graph: Graph) -> Graph:
    mapping: dict[str, str] = {}
    nodes: list[Node] = []
    for node in graph.nodes:
        inner = graph.producers.get(node.inputs[0]) if node.op == OpType.Transpose else None
        if inner is None or inner.op != OpType.Transpose:
            nodes.append(node)
            continue
        perm = compose(tuple(inner.attr("perm")), tuple(node.attr("perm")))
        if perm == tuple(range(len(perm))):
            # an Identity stands in where the output's name must survive (e.g. a graph output of an input)
            mapping[node.outputs[0]] = inner.inputs[0]
            nodes.append(make_node(node.name, OpType.Identity, inner.inputs, node.outputs))
        else:
            nodes.append(make_node(node.name, OpType.Transpose, inner.inputs, node.outputs, perm=perm))
    return eliminate_dead_nodes(rebuild(graph, apply_equivalences(graph, nodes, mapping)))
