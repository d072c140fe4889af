"""Common-subexpression elimination: identical constants (by content) and identical nodes (same op, attributes
and inputs) are computed once."""

from __future__ import annotations

from fusion.graph.assemble import rebuild
from fusion.graph.hashing import constant_digest
from fusion.graph.ir import Graph, Node
from fusion.passes.dce import eliminate_dead_nodes
from fusion.passes.rewrite import apply_equivalences, resolve


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    mapping: dict[str, str] = {}
    first_constant: dict[str, str] = {}  # by `constant_digest`: dtype, shape and bytes
    for name, array in graph.constants.items():
        key = constant_digest(array)
        if key in first_constant:
            mapping[name] = first_constant[key]
        else:
            first_constant[key] = name
    seen: dict[tuple, Node] = {}
    for node in graph.nodes:
        key = (node.op, tuple(resolve(mapping, v) for v in node.inputs), node.attrs, len(node.outputs))
        earlier = seen.get(key)
        if earlier is None:
            seen[key] = node
        else:
            mapping.update(zip(node.outputs, earlier.outputs, strict=True))
    return eliminate_dead_nodes(rebuild(graph, apply_equivalences(graph, graph.nodes, mapping)))
