"""Per-node analytic cost: MACs, vector work, DRAM bytes, arithmetic intensity and a roofline cycle estimate.

`node_cost` treats each node as its own kernel that reads its inputs from DRAM and writes its outputs back
(`group_cost` does the same for a fused group of nodes, counting only the traffic crossing the group boundary):
    cycles = ceil(max(MACs / N^2 + vector_ops / L, bytes / dram_bytes_per_cycle))
with N the array size and L the vector lanes of the machine. It is a lower bound (Williams et al. roofline):
no simulated kernel may beat it. Reshape and Identity are views and cost nothing. An op's vector work is what its
vector recipe emits (`fusion.lower.kernels.recipes.vector_elements`), the one recipe its unfused and chain kernels
run, so the count follows the kernels instead of a second table.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from fusion.graph.hashing import extract_subgraph
from fusion.graph.ir import DataType, Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.kernels.recipes import vector_elements
from simulator.config import MachineConfig

# vector-unit element operations per output element of the ops no vector recipe runs (every other op's count is
# its recipe's, `fusion.lower.kernels.recipes.vector_elements`: counted from what the recipe emits)
VECTOR_OPS_PER_ELEMENT: dict[OpType, int] = {OpType.Sin: 1, OpType.Cos: 1, OpType.Not: 1}
REDUCTIONS = frozenset({OpType.ReduceMean, OpType.ReduceSum, OpType.ReduceMax})
VIEWS = frozenset({OpType.Reshape, OpType.Identity})


@dataclass(frozen=True)
class NodeCost:
    macs: int
    vector_ops: int
    bytes_read: int
    bytes_written: int
    compute_cycles: float
    memory_cycles: float

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float:
        """Operations (MACs + vector element ops) per DRAM byte."""
        return (self.macs + self.vector_ops) / self.bytes if self.bytes else math.inf

    @property
    def cycles(self) -> int:
        return math.ceil(max(self.compute_cycles, self.memory_cycles))

    @property
    def bound(self) -> str:
        return "compute" if self.compute_cycles >= self.memory_cycles else "memory"


def macs(graph: Graph, node: Node) -> int:
    """Multiply-accumulates of a matrix-unit op (0 for the others)."""
    out = graph.types[node.outputs[0]]
    if node.op == OpType.MatMul:
        return out.size * graph.types[node.inputs[0]].shape[-1]
    if node.op == OpType.Gemm:
        return out.size * graph.types[node.inputs[0]].shape[1]
    if node.op == OpType.Conv:
        w = graph.types[node.inputs[1]].shape
        return out.size * int(np.prod(w[1:], dtype=np.int64))
    return 0


def vector_ops(graph: Graph, node: Node) -> int:
    out = graph.types[node.outputs[0]]
    if node.op in (OpType.MaxPool, OpType.AveragePool):
        return out.size * int(np.prod(node.attr("kernel"), dtype=np.int64))
    if node.op in REDUCTIONS:
        return graph.types[node.inputs[0]].size
    if node.op == OpType.Gemm and len(node.inputs) > 2:
        return out.size  # bias add
    if node.op == OpType.Conv and len(node.inputs) > 2:
        return out.size
    counted = vector_elements(graph, node)
    return out.size * VECTOR_OPS_PER_ELEMENT.get(node.op, 0) if counted is None else counted


def _nbytes(graph: Graph, value: str, elem_bytes: int | None) -> int:
    t = graph.types[value]
    if elem_bytes is not None and t.dtype == DataType.float32:
        return t.size * elem_bytes
    return t.nbytes


def node_cost(graph: Graph, node: Node, config: MachineConfig, elem_bytes: int | None = None) -> NodeCost:
    """Roofline cost of `node`; `elem_bytes` overrides float32 element size (1 for the int8 path)."""
    if node.op in VIEWS:
        return NodeCost(0, 0, 0, 0, 0.0, 0.0)
    read = sum(_nbytes(graph, v, elem_bytes) for v in node.inputs)
    written = sum(_nbytes(graph, v, elem_bytes) for v in node.outputs)
    m, v = macs(graph, node), vector_ops(graph, node)
    compute = m / config.peak_macs_per_cycle + v / config.vector_lanes
    return NodeCost(m, v, read, written, compute, (read + written) / config.dram_bytes_per_cycle)


def group_cost(
    graph: Graph, node_names: Iterable[str], config: MachineConfig, elem_bytes: int | None = None
) -> NodeCost:
    """Roofline cost of running the named nodes as one fused kernel: all their work, but DRAM traffic only for
    values entering the group (inputs and constants) and values leaving it (read outside or graph outputs)."""
    sub = extract_subgraph(graph, node_names)
    costs = [node_cost(sub, n, config, elem_bytes) for n in sub.nodes]
    read = sum(_nbytes(sub, v, elem_bytes) for v in (*sub.inputs, *sub.constants))
    written = sum(_nbytes(sub, v, elem_bytes) for v in sub.outputs)
    return NodeCost(
        sum(c.macs for c in costs),
        sum(c.vector_ops for c in costs),
        read,
        written,
        sum(c.compute_cycles for c in costs),
        (read + written) / config.dram_bytes_per_cycle,
    )


def graph_costs(graph: Graph, config: MachineConfig, elem_bytes: int | None = None) -> dict[str, NodeCost]:
    """Node name -> cost, in graph order."""
    return {n.name: node_cost(graph, n, config, elem_bytes) for n in graph.nodes}
