"""Build a Graph from inputs, constants and nodes, inferring every node's output types on the way.

Builders, the importer and every pass go through here, so a graph always has consistent types.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from fusion.errors import GraphError
from fusion.graph.ir import DataType, DimAssumption, Graph, Node, TensorType
from fusion.graph.shapes import infer


def constant_type(array: np.ndarray) -> TensorType:
    return TensorType(tuple(int(d) for d in array.shape), DataType.of(array.dtype))


def assemble(
    name: str,
    inputs: Mapping[str, TensorType],
    constants: Mapping[str, np.ndarray],
    nodes: Iterable[Node],
    outputs: Iterable[str],
    assumptions: Iterable[DimAssumption] = (),
) -> Graph:
    """A typed Graph; constants no node or output uses are dropped. Nodes must be in topological order."""
    nodes = tuple(nodes)
    outputs = tuple(outputs)
    types: dict[str, TensorType] = dict(inputs)
    types.update({k: constant_type(np.asarray(v)) for k, v in constants.items()})
    for node in nodes:
        missing = [v for v in node.inputs if v not in types]
        if missing:
            raise GraphError(f"node {node.name!r} reads undefined value(s) {missing}")
        types.update(zip(node.outputs, infer(node, tuple(types[v] for v in node.inputs)), strict=True))
    used = {v for node in nodes for v in node.inputs} | set(outputs)
    kept = {k: np.asarray(v) for k, v in constants.items() if k in used}
    live = set(inputs) | set(kept) | {v for node in nodes for v in node.outputs}
    live_types = {k: t for k, t in types.items() if k in live}
    return Graph(name, tuple(inputs), outputs, nodes, live_types, kept, tuple(dict.fromkeys(assumptions)))


def rebuild(
    graph: Graph,
    nodes: Iterable[Node],
    constants: Mapping[str, np.ndarray] | None = None,
    outputs: Iterable[str] | None = None,
    assumptions: Iterable[DimAssumption] | None = None,
) -> Graph:
    """The same graph (name, inputs, assumptions) with new nodes/constants/outputs; what passes return."""
    return assemble(
        graph.name,
        {k: graph.types[k] for k in graph.inputs},
        graph.constants if constants is None else constants,
        nodes,
        graph.outputs if outputs is None else outputs,
        graph.assumptions if assumptions is None else assumptions,
    )
