"""Recognise GELU written out as exporters emit it and replace it by one Gelu node (which the matrix unit's
epilogue can apply): the exact form 0.5 * x * (1 + erf(x / sqrt(2))) and the tanh form GPT-2's gelu_new uses,
0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))), in any order of the operations.

Starting at each Erf or Tanh whose argument is arithmetic (Add/Sub/Mul/Div/Pow with scalar constants) on one
value x, the pass follows the single reader chain through Add/Mul nodes whose other operand is a scalar
constant, x, or 0.5 * x; after each step it checks numerically, on probe values, whether the chain computes
gelu(x) (exact for Erf, tanh-approximated for Tanh), and rewrites the longest prefix that does.
"""

from __future__ import annotations

import numpy as np

from fusion.errors import ShapeError
from fusion.graph.assemble import assemble, rebuild
from fusion.graph.hashing import extract_subgraph
from fusion.graph.ir import Graph, Node, TensorType, make_node
from fusion.graph.ops import OpType
from fusion.passes.dce import eliminate_dead_nodes
from fusion.passes.rewrite import scalar_constant
from fusion.reference.interpreter import run
from fusion.reference.kernels import gelu

PROBE = np.linspace(-5.0, 5.0, 41, dtype=np.float32)


_ARITHMETIC = (OpType.Add, OpType.Sub, OpType.Mul, OpType.Div, OpType.Pow)
_APPROXIMATE = {OpType.Erf: "none", OpType.Tanh: "tanh"}
MAX_ARGUMENT_NODES = 6


def _argument(graph: Graph, start: Node) -> tuple[str, list[Node]] | None:
    """(x, nodes) when `start` reads arithmetic on a single value x and scalar constants, computed by nodes
    whose results nothing else reads (e.g. x / sqrt(2), or sqrt(2/pi) * (x + 0.044715 * x^3)). The walk up
    stops at values read outside the pattern (x itself is also read by the final multiplication)."""
    cone: dict[str, Node] = {}
    pending = [start.inputs[0]]
    while pending and len(cone) < MAX_ARGUMENT_NODES:
        prod = graph.producers.get(pending.pop())
        if prod is not None and prod.op in _ARITHMETIC and prod.name not in cone:
            cone[prod.name] = prod
            pending.extend(v for v in prod.inputs if scalar_constant(graph, v) is None)
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    kept: dict[str, Node] = {}
    for node in sorted(cone.values(), key=lambda n: -order[n.name]):  # readers before their producers
        readers = graph.consumers.get(node.outputs[0], ())
        if node.outputs[0] not in graph.outputs and all(r.name in kept or r is start for r in readers):
            kept[node.name] = node
    produced = {n.outputs[0] for n in kept.values()}
    leaves = {v for n in kept.values() for v in n.inputs if v not in produced and scalar_constant(graph, v) is None}
    if len(leaves) != 1 or start.inputs[0] not in produced:
        return None
    return leaves.pop(), sorted(kept.values(), key=lambda n: order[n.name])


def _operand_nodes(graph: Graph, value: str, x: str) -> list[Node] | None:
    """Pattern nodes behind an allowed operand: [] for x or a scalar constant, [mul] for 0.5 * x; else None."""
    if value == x or scalar_constant(graph, value) is not None:
        return []
    prod = graph.producers.get(value)
    if prod is not None and prod.op == OpType.Mul and x in prod.inputs and len(graph.consumers[value]) == 1:
        other = prod.inputs[1] if prod.inputs[0] == x else prod.inputs[0]
        return [prod] if scalar_constant(graph, other) is not None else None
    return None


def _computes_gelu(graph: Graph, nodes: list[Node], x: str, out: str, approximate: str) -> bool:
    """Evaluate the candidate nodes on probe values of x and compare with gelu(x, approximate)."""
    sub = extract_subgraph(graph, [n.name for n in nodes])
    if sub.inputs != (x,) or out not in sub.outputs:
        return False
    try:
        probe = assemble(sub.name, {x: TensorType(PROBE.shape)}, sub.constants, sub.nodes, sub.outputs)
    except ShapeError:
        return False
    got = run(probe, {x: PROBE})[out]
    return got.shape == PROBE.shape and bool(np.allclose(got, gelu(PROBE, approximate), rtol=1e-5, atol=1e-6))


def _match(graph: Graph, start: Node) -> tuple[str, Node] | None:
    """(x, last node) of the longest chain from the Erf/Tanh `start` that computes gelu(x)."""
    found_argument = _argument(graph, start)
    if found_argument is None:
        return None
    x, nodes = found_argument
    nodes = [*nodes, start]
    current, found = start.outputs[0], None
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
        if _computes_gelu(graph, nodes, x, current, _APPROXIMATE[start.op]):
            found = (x, step)
    return found


def fuse_gelu(graph: Graph) -> Graph:
    replacement: dict[str, Node] = {}
    for node in graph.nodes:
        found = _match(graph, node) if node.op in _APPROXIMATE else None
        if found is not None:
            x, last = found
            approximate = _APPROXIMATE[node.op]
            replacement[last.name] = make_node(last.name, OpType.Gelu, (x,), last.outputs, approximate=approximate)
    if not replacement:
        return graph
    return eliminate_dead_nodes(rebuild(graph, [replacement.get(n.name, n) for n in graph.nodes]))
