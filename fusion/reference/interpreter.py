"""Run a Graph on numpy inputs, node by node, in fp32: the oracle every compiled result is checked against."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fusion.errors import InputMismatchError
from fusion.graph.ir import Graph
from fusion.reference.kernels import evaluate_node


def check_inputs(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph's inputs as arrays of exactly the declared shape and dtype, or a clear error."""
    missing = [k for k in graph.inputs if k not in inputs]
    extra = [k for k in inputs if k not in graph.inputs]
    if missing or extra:
        raise InputMismatchError(
            f"graph {graph.name!r} needs inputs {list(graph.inputs)}; missing {missing}, unknown {extra}"
        )
    out = {}
    for name in graph.inputs:
        want = graph.types[name]
        array = np.asarray(inputs[name])
        if array.shape != want.shape:
            raise InputMismatchError(f"input {name!r} has shape {array.shape}, graph expects {want.shape}")
        if array.dtype != want.dtype.numpy:
            raise InputMismatchError(f"input {name!r} has dtype {array.dtype}, graph expects {want.dtype.value}")
        out[name] = array
    return out


def evaluate(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every value of the graph (inputs, constants, node outputs) computed in fp32."""
    env: dict[str, np.ndarray] = {**graph.constants, **check_inputs(graph, inputs)}
    for node in graph.nodes:
        outs = evaluate_node(node, tuple(env[v] for v in node.inputs), tuple(t.shape for t in graph.output_types(node)))
        for name, value in zip(node.outputs, outs, strict=True):
            env[name] = np.asarray(value, dtype=graph.types[name].dtype.numpy)
    return env


def run(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph's outputs, by name."""
    env = evaluate(graph, inputs)
    return {name: env[name] for name in graph.outputs}
