"""Constant folding: a node whose inputs are all constants becomes constants, computed by the reference kernels.

Shape, ConstantOfShape and Range need no constant inputs (Shape reads only its input's type) and fold too. A
Shape folded on a run-time value records a DimAssumption for each dim it read, so re-typing the graph for other
input shapes refuses instead of keeping a stale shape.
"""

from __future__ import annotations

import numpy as np

from fusion.graph.assemble import rebuild
from fusion.graph.ir import DimAssumption, Graph, Node
from fusion.graph.ops import TYPE_ONLY, OpType
from fusion.reference.kernels import evaluate_node


def _foldable(graph: Graph, node: Node, constants: dict[str, np.ndarray]) -> bool:
    if set(node.outputs) & set(graph.outputs):
        return False
    return node.op in TYPE_ONLY or bool(node.inputs) and all(v in constants for v in node.inputs)


def fold_constants(graph: Graph) -> Graph:
    constants = dict(graph.constants)
    assumptions = list(graph.assumptions)
    kept = []
    for node in graph.nodes:
        if not _foldable(graph, node, constants):
            kept.append(node)
            continue
        args = tuple(constants.get(v) for v in node.inputs)
        if node.op == OpType.Shape and node.inputs[0] not in constants:
            source = graph.types[node.inputs[0]].shape
            args = (np.broadcast_to(np.int8(0), source),)
            read = range(node.attr("start"), node.attr("end"))
            assumptions += [DimAssumption(node.name, node.inputs[0], axis, source[axis]) for axis in read]
        shapes = tuple(graph.types[v].shape for v in node.outputs)
        for name, value in zip(node.outputs, evaluate_node(node, args, shapes), strict=True):
            constants[name] = np.asarray(value, dtype=graph.types[name].dtype.numpy)
    return rebuild(graph, kept, constants, assumptions=assumptions)
