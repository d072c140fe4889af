"""Everything known about one node in one record: what the fusion planner and reports read."""

from __future__ import annotations

from dataclasses import dataclass

from fusion.graph.cost import NodeCost, node_cost
from fusion.graph.ir import AttrValue, Graph, Node, TensorType
from fusion.graph.ops import OpKind, OpType
from simulator.config import MachineConfig


@dataclass(frozen=True)
class NodeInfo:
    """Op type, kind, attributes, input/output types and the roofline cost of one node on one machine."""

    name: str
    op: OpType
    kind: OpKind
    attrs: tuple[tuple[str, AttrValue], ...]
    inputs: tuple[TensorType, ...]
    outputs: tuple[TensorType, ...]
    cost: NodeCost


def node_info(graph: Graph, node: Node, config: MachineConfig, elem_bytes: int | None = None) -> NodeInfo:
    return NodeInfo(
        node.name,
        node.op,
        node.op.kind,
        node.attrs,
        graph.input_types(node),
        graph.output_types(node),
        node_cost(graph, node, config, elem_bytes),
    )


def graph_info(graph: Graph, config: MachineConfig, elem_bytes: int | None = None) -> tuple[NodeInfo, ...]:
    """NodeInfo of every node, in graph order."""
    return tuple(node_info(graph, n, config, elem_bytes) for n in graph.nodes)
