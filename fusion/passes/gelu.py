"""Recognise GELU written out with Erf, as exporters emit it: 0.5 * x * (1 + erf(x / sqrt(2))) in any order of
the multiplications, and replace it by one Gelu node (which the matrix unit's epilogue can apply).

Starting at each Erf of x / sqrt(2) (or x * 1/sqrt(2)), the pass follows the single reader chain through Add/Mul
nodes whose other operand is a scalar constant, x, or 0.5 * x; after each step it checks numerically, on
probe values, whether the chain computes gelu(x), and rewrites the longest prefix that does.
"""

from __future__ import annotations

import math

import numpy as np

from fusion.errors import ShapeError
from fusion.graph.assemble import assemble, rebuild
from fusion.graph.hashing import extract_subgraph
from fusion.graph.ir import Graph, Node, TensorType, make_node
from fusion.graph.ops import OpType
from fusion.passes.dce import eliminate_dead_nodes
from fusion.reference.interpreter import run
from fusion.reference.kernels import gelu

PROBE = np.linspace(-5.0, 5.0, 41, dtype=np.float32)


def _scalar(graph: Graph, value: str) -> float | None:
    array = graph.constants.get(value)
    return float(array) if array is not None and array.size == 1 else None


def _erf_argument(graph: Graph, erf: Node) -> str | None:
    """x when the Erf reads x / sqrt(2) or x * (1 / sqrt(2))."""
    prod = graph.producers.get(erf.inputs[0])
    if prod is None or prod.op not in (OpType.Div, OpType.Mul) or len(graph.consumers[erf.inputs[0]]) != 1:
        return None
    c = _scalar(graph, prod.inputs[1])
    want = math.sqrt(2.0) if prod.op == OpType.Div else 1 / math.sqrt(2.0)
    return prod.inputs[0] if c is not None and abs(c - want) < 1e-6 else None


def _operand_nodes(graph: Graph, value: str, x: str) -> list[Node] | None:
    """Pattern nodes behind an allowed operand: [] for x or a scalar constant, [mul] for 0.5 * x; else None."""
    if value == x or _scalar(graph, value) is not None:
        return []
    prod = graph.producers.get(value)
    if prod is not None and prod.op == OpType.Mul and x in prod.inputs and len(graph.consumers[value]) == 1:
        other = prod.inputs[1] if prod.inputs[0] == x else prod.inputs[0]
        return [prod] if _scalar(graph, other) is not None else None
    return None


def _computes_gelu(graph: Graph, nodes: list[Node], x: str, out: str) -> bool:
    """Evaluate the candidate nodes on probe values of x and compare with exact gelu."""
    sub = extract_subgraph(graph, [n.name for n in nodes])
    if sub.inputs != (x,) or out not in sub.outputs:
        return False
    try:
        probe = assemble(sub.name, {x: TensorType(PROBE.shape)}, sub.constants, sub.nodes, sub.outputs)
    except ShapeError:
        return False
    got = run(probe, {x: PROBE})[out]
    return got.shape == PROBE.shape and bool(np.allclose(got, gelu(PROBE, "none"), rtol=1e-5, atol=1e-6))


def _match(graph: Graph, erf: Node) -> tuple[str, Node] | None:
    """(x, last node) of the longest chain from `erf` that computes gelu(x)."""
    x = _erf_argument(graph, erf)
    if x is None:
        return None
    nodes = [graph.producers[erf.inputs[0]], erf]
    current, found = erf.outputs[0], None
    for _ in range(3):
        readers = graph.consumers.get(current, ())
        if current in graph.outputs or len(readers) != 1 or readers[0].op not in (OpType.Add, OpType.Mul):
            break
        step = readers[0]
        extra = _operand_nodes(graph, step.inputs[1] if step.inputs[0] == current else step.inputs[0], x)
        if extra is None:
            break
        nodes += [*extra, step]
        current = step.outputs[0]
        if _computes_gelu(graph, nodes, x, current):
            found = (x, step)
    return found


def fuse_gelu(graph: Graph) -> Graph:
    replacement: dict[str, Node] = {}
    for node in graph.nodes:
        found = _match(graph, node) if node.op == OpType.Erf else None
        if found is not None:
            x, last = found
            replacement[last.name] = make_node(last.name, OpType.Gelu, (x,), last.outputs, approximate="none")
    if not replacement:
        return graph
    return eliminate_dead_nodes(rebuild(graph, [replacement.get(n.name, n) for n in graph.nodes]))
