"""Structural hashing: a digest of what a graph computes, independent of value/node names and node order.

Each value's hash covers its operator, attributes, type and the hashes of its inputs (Merkle style); graph
inputs hash by position and type, constants by content. The kernel cache keys compiled subgraphs by this.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Iterable

import numpy as np

from fusion.graph.assemble import assemble
from fusion.graph.ir import Graph, Node, TensorType


def _digest(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def constant_digest(array: np.ndarray) -> str:
    return _digest("const", array.dtype.str, array.shape, content_digest(array))


_CONTENT: dict[int, tuple[weakref.ref, str]] = {}  # id -> (the array, its `content_digest`), while it lives


def content_digest(array: np.ndarray) -> str:
    """sha256 (hex) of the array's bytes in C order. A graph's constants are read-only arrays owning their data
    (`ir._readonly`), shared by the graphs the passes make: each is hashed once while it lives (cleanup hashes
    every constant each round, CSE too: a ResNet's 45 MB of weights six times), others every time."""
    frozen = array.flags.owndata and not array.flags.writeable
    if frozen:
        found = _CONTENT.get(id(array))
        if found is not None and found[0]() is array:
            return found[1]
    digest = hashlib.sha256(np.ascontiguousarray(array)).hexdigest()
    if frozen:
        key = id(array)
        _CONTENT[key] = (weakref.ref(array, lambda _, key=key: _CONTENT.pop(key, None)), digest)
    return digest


def value_hashes(graph: Graph) -> dict[str, str]:
    """Structural hash of every value of the graph."""
    hashes = {name: _digest("input", i, str(graph.types[name])) for i, name in enumerate(graph.inputs)}
    hashes.update({name: constant_digest(array) for name, array in graph.constants.items()})
    for node in graph.nodes:
        base = _digest(node.op.value, node.attrs, tuple(hashes[v] for v in node.inputs))
        for index, out in enumerate(node.outputs):
            hashes[out] = _digest(base, index, str(graph.types[out]))
    return hashes


def structural_hash(graph: Graph) -> str:
    """Digest of the graph's input types and the computation of each output, in output order."""
    hashes = value_hashes(graph)
    return _digest(tuple(str(graph.types[i]) for i in graph.inputs), tuple(hashes[o] for o in graph.outputs))


def extract_subgraph(graph: Graph, node_names: Iterable[str], name: str | None = None) -> Graph:
    """The named nodes as a standalone Graph: values they read from outside become inputs (in order of first
    use), values they produce that are read outside (or are graph outputs) become outputs."""
    wanted = set(node_names)
    nodes: list[Node] = [graph.node(n) for n in graph.in_order(wanted)]
    produced = {v for n in nodes for v in n.outputs}
    inputs: dict[str, TensorType] = {}
    for node in nodes:
        for v in node.inputs:
            if v not in produced and not graph.is_constant(v):
                inputs.setdefault(v, graph.types[v])
    outside = {v for n in graph.nodes if n.name not in wanted for v in n.inputs} | set(graph.outputs)
    outputs = [v for n in nodes for v in n.outputs if v in outside]
    constants = {v: graph.constants[v] for n in nodes for v in n.inputs if graph.is_constant(v)}
    return assemble(name or f"{graph.name}/sub", inputs, constants, nodes, outputs)


def subgraph_hash(graph: Graph, node_names: Iterable[str]) -> str:
    return structural_hash(extract_subgraph(graph, node_names))
