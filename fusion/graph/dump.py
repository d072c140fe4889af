"""A readable text listing of a graph, one line per node, optionally with each node's roofline cost."""

from __future__ import annotations

from fusion.graph.cost import NodeCost, node_cost
from fusion.graph.ir import Graph, Node
from simulator.config import MachineConfig


def _attrs(node: Node) -> str:
    return ", ".join(f"{k}={v}" for k, v in node.attrs)


def cost_text(cost: NodeCost) -> str:
    return (
        f"macs={cost.macs} vops={cost.vector_ops} rd={cost.bytes_read}B wr={cost.bytes_written}B "
        f"ai={cost.intensity:.2f} cycles={cost.cycles} ({cost.bound})"
    )


def node_line(graph: Graph, node: Node, config: MachineConfig | None = None) -> str:
    outs = ", ".join(f"%{v}: {graph.types[v]}" for v in node.outputs)
    ins = ", ".join(f"%{v}" for v in node.inputs)
    attrs = f" {{{_attrs(node)}}}" if node.attrs else ""
    line = f"  {outs} = {node.op.value}({ins}){attrs}  # {node.name} [{node.op.kind.name.lower()}]"
    return line if config is None else f"{line} {cost_text(node_cost(graph, node, config))}"


def dump(graph: Graph, config: MachineConfig | None = None) -> str:
    """The whole graph as text: inputs, constants, nodes in order, outputs."""
    lines = [f"graph {graph.name}("]
    lines += [f"  %{v}: {graph.types[v]}," for v in graph.inputs]
    lines.append(") {")
    lines += [f"  const %{k}: {graph.types[k]}" for k in graph.constants]
    lines += [node_line(graph, n, config) for n in graph.nodes]
    lines.append(f"  return {', '.join('%' + v for v in graph.outputs)}")
    lines.append("}")
    return "\n".join(lines)
