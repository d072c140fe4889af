"""Dead-node elimination: drop nodes none of whose outputs reach a graph output."""

from __future__ import annotations

from fusion.graph.assemble import rebuild
from fusion.graph.ir import Graph


def eliminate_dead_nodes(graph: Graph) -> Graph:
    live = set(graph.outputs)
    kept = []
    for node in reversed(graph.nodes):
        if live.intersection(node.outputs):
            kept.append(node)
            live.update(node.inputs)
    return rebuild(graph, reversed(kept))
