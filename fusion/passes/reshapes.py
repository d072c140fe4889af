"""Reshape chains collapse: Reshape(Reshape(x)) becomes one Reshape of x (a reshape only keeps the element order)."""

from __future__ import annotations

from fusion.graph.assemble import rebuild
from fusion.graph.ir import Graph, make_node
from fusion.graph.ops import OpType
from fusion.passes.dce import eliminate_dead_nodes


def merge_reshapes(graph: Graph) -> Graph:
    source: dict[str, str] = {}  # a Reshape's output -> the value its chain of reshapes started from
    nodes = []
    for node in graph.nodes:
        if node.op == OpType.Reshape:
            origin = source.get(node.inputs[0], node.inputs[0])
            source[node.outputs[0]] = origin
            if origin != node.inputs[0]:
                node = make_node(node.name, OpType.Reshape, (origin,), node.outputs, **node.attr_dict)
        nodes.append(node)
    return eliminate_dead_nodes(rebuild(graph, nodes))
