"""Nodes that are views of their input: no kernel, the consumer reads the same bytes (a pointer offset).

Reshape and Identity (as in the baseline), a Transpose moving only axes of size 1 (the other axes keep their order:
the same bytes, ViT's (17, 1, 64) <-> (1, 17, 64)), and a Gather of one constant index along axis 0, which selects a
contiguous slab of a row-major tensor. The engine applies them on the host to the stored (int8 or float32) data.
"""

from __future__ import annotations

import numpy as np

from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.compiler import ALIAS_OPS


def slice_index(graph: Graph, node: Node) -> int | None:
    """The index of a Gather that is a contiguous slab (axis 0, one constant scalar index), else None."""
    if node.op != OpType.Gather or node.attr("axis") != 0 or not graph.is_constant(node.inputs[1]):
        return None
    idx = np.asarray(graph.constants[node.inputs[1]])
    if idx.size != 1 or idx.ndim != 0:
        return None
    dim = graph.types[node.inputs[0]].shape[0]
    return int(idx) % dim if -dim <= int(idx) < dim else None


def keeps_order(graph: Graph, node: Node) -> bool:
    """A Transpose whose axes longer than 1 stay in their order: a reshape of the same bytes."""
    if node.op != OpType.Transpose:
        return False
    shape = graph.types[node.inputs[0]].shape
    moved = [a for a in node.attr("perm") if shape[a] != 1]
    return moved == sorted(moved)


def is_view(graph: Graph, node: Node) -> bool:
    return node.op in ALIAS_OPS or keeps_order(graph, node) or slice_index(graph, node) is not None


def apply_view(graph: Graph, node: Node, data: np.ndarray) -> np.ndarray:
    index = slice_index(graph, node)
    if index is not None:
        data = data[index]
    return np.asarray(data).reshape(graph.types[node.outputs[0]].shape)
