"""Graphviz DOT export: operators as boxes, graph inputs/outputs as ellipses, tensors as labelled edges."""

from __future__ import annotations

from fusion.graph.cost import node_cost
from fusion.graph.ir import Graph
from simulator.config import MachineConfig

_KIND_COLOURS = {
    "ELEMWISE": "#d9ead3",
    "BROADCAST": "#d0e0e3",
    "INJECTIVE": "#fff2cc",
    "REDUCTION": "#fce5cd",
    "OUT_ELEMWISE_FUSABLE": "#cfe2f3",
    "OPAQUE": "#ead1dc",
}


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _typed(graph: Graph, value: str) -> str:
    return f"{value}\n{graph.types[value]}"


def to_dot(graph: Graph, config: MachineConfig | None = None, show_constants: bool = False) -> str:
    """DOT source of the graph; with a config each node also shows its MACs and roofline cycles."""
    lines = [f"digraph {_quote(graph.name)} {{", "  rankdir=TB;", '  node [fontname="Helvetica", fontsize=10];']
    for v in graph.inputs:
        lines.append(f"  {_quote('in:' + v)} [shape=ellipse, label={_quote(_typed(graph, v))}];")
    for v in graph.outputs:
        lines.append(f"  {_quote('out:' + v)} [shape=ellipse, label={_quote(v)}];")
    if show_constants:
        for v in graph.constants:
            lines.append(f"  {_quote('const:' + v)} [shape=note, fontsize=8, label={_quote(_typed(graph, v))}];")
    source = {v: "in:" + v for v in graph.inputs}
    source.update({v: "const:" + v for v in graph.constants} if show_constants else {})
    for node in graph.nodes:
        label = f"{node.op.value}\n{node.name}"
        if config is not None:
            cost = node_cost(graph, node, config)
            label += f"\nmacs {cost.macs}, {cost.cycles} cyc ({cost.bound})"
        colour = _quote(_KIND_COLOURS[node.op.kind.name])
        lines.append(
            f"  {_quote('n:' + node.name)} [shape=box, style=filled, fillcolor={colour}, label={_quote(label)}];"
        )
        for v in node.inputs:
            if v in source:
                lines.append(
                    f"  {_quote(source[v])} -> {_quote('n:' + node.name)} [label={_quote(str(graph.types[v]))}];"
                )
        source.update({v: "n:" + node.name for v in node.outputs})
    for v in graph.outputs:
        if v in source:
            lines.append(f"  {_quote(source[v])} -> {_quote('out:' + v)} [label={_quote(str(graph.types[v]))}];")
    lines.append("}")
    return "\n".join(lines)
