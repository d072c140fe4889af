"""Nodes that are views of their input: no kernel, the consumer reads the same bytes (a pointer offset).

Reshape and Identity (as in the baseline), a Transpose moving only axes of size 1 (the other axes keep their order:
the same bytes, ViT's (17, 1, 64) <-> (1, 17, 64)), and a constant selection that is one contiguous run of a
row-major tensor (`slab_offset`): a Gather of one constant index, or of consecutive ones, and a Slice with unit
steps, on any axis, whenever every axis before the selected one holds a single element and every axis after it is
whole (a ViT's class token x[:, 0] of [1, 17, 64], a row x[i] of a matrix, rows [a, b) of it). The engine applies
them on the host to the stored (int8 or float32) data; in one program they are address offsets.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.compiler import ALIAS_OPS


def _gather_box(graph: Graph, node: Node) -> list[tuple[int, int]] | None:
    """(start, count) per input axis of a Gather of constant consecutive indices (a scalar or a 1-D run)."""
    if not graph.is_constant(node.inputs[1]):
        return None
    shape = graph.types[node.inputs[0]].shape
    axis = node.attr("axis") % len(shape)
    idx = np.asarray(graph.constants[node.inputs[1]]).astype(np.int64)
    dim = shape[axis]
    if idx.ndim > 1 or idx.size == 0 or (idx < -dim).any() or (idx >= dim).any():
        return None
    idx = np.where(idx < 0, idx + dim, idx).ravel()
    if (np.diff(idx) != 1).any():
        return None
    return [(int(idx[0]), idx.size) if a == axis else (0, d) for a, d in enumerate(shape)]


def _slice_box(graph: Graph, node: Node) -> list[tuple[int, int]] | None:
    """(start, count) per input axis of a Slice with unit steps (a step on an axis it leaves one element of is
    no step)."""
    box = [(0, d) for d in graph.types[node.inputs[0]].shape]
    for axis, start, end, step in zip(
        node.attr("axes"), node.attr("starts"), node.attr("ends"), node.attr("steps"), strict=True
    ):
        count = len(range(start, end, step))
        if step != 1 and count > 1:
            return None
        box[axis] = (start, count)
    return box


def slab_offset(graph: Graph, node: Node) -> int | None:
    """The elements of the input before a constant Gather's or Slice's selection when it is one contiguous run
    (the last partly selected axis has whole axes after it and single elements before it), else None."""
    if node.op == OpType.Gather:
        box = _gather_box(graph, node)
    elif node.op == OpType.Slice:
        box = _slice_box(graph, node)
    else:
        return None
    if box is None or any(count == 0 for _, count in box):
        return None
    shape = graph.types[node.inputs[0]].shape
    partial = [a for a, (_, count) in enumerate(box) if count < shape[a]]
    if partial and any(count != 1 for _, count in box[: partial[-1]]):
        return None
    strides = np.cumprod([1, *shape[::-1]], dtype=np.int64)[-2::-1]  # row-major element strides
    return int(sum(start * int(stride) for (start, _), stride in zip(box, strides, strict=True)))


def keeps_order(graph: Graph, node: Node) -> bool:
    """A Transpose whose axes longer than 1 stay in their order: a reshape of the same bytes."""
    if node.op != OpType.Transpose:
        return False
    shape = graph.types[node.inputs[0]].shape
    moved = [a for a in node.attr("perm") if shape[a] != 1]
    return moved == sorted(moved)


def is_view(graph: Graph, node: Node) -> bool:
    return node.op in ALIAS_OPS or keeps_order(graph, node) or slab_offset(graph, node) is not None


def apply_view(graph: Graph, node: Node, data: np.ndarray) -> np.ndarray:
    """The view's output: the same elements in row-major order from the slab's offset (0 for the others)."""
    shape: Sequence[int] = graph.types[node.outputs[0]].shape
    start = slab_offset(graph, node) or 0
    return np.asarray(data).reshape(-1)[start : start + int(np.prod(shape, dtype=np.int64))].reshape(shape)
