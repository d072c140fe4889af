"""Constant folding: a node whose inputs are all constants becomes constants, computed by the reference kernels."""

from __future__ import annotations

import numpy as np

from fusion.graph.assemble import rebuild
from fusion.graph.ir import Graph
from fusion.reference.kernels import evaluate_node


def fold_constants(graph: Graph) -> Graph:
    constants = dict(graph.constants)
    kept = []
    for node in graph.nodes:
        if node.inputs and all(v in constants for v in node.inputs) and not set(node.outputs) & set(graph.outputs):
            shapes = tuple(graph.types[v].shape for v in node.outputs)
            values = evaluate_node(node, tuple(constants[v] for v in node.inputs), shapes)
            for name, value in zip(node.outputs, values, strict=True):
                constants[name] = np.asarray(value, dtype=graph.types[name].dtype.numpy)
        else:
            kept.append(node)
    return rebuild(graph, kept, constants)
