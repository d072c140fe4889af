"""Recognise the decomposed layer normalisation some exporters emit and replace it by one LayerNorm node:

    m = ReduceMean(x, trailing axes, keepdims); d = x - m; v = ReduceMean(d^2 or d*d); n = d / Sqrt(v + eps)
    [y = n * gamma] [y = y + beta]          ->  y = LayerNorm(x, gamma or 1, beta or 0)

Only when every intermediate is private to the pattern (read by nothing else and not a graph output).
"""

from __future__ import annotations

import numpy as np

from fusion.graph.assemble import rebuild
from fusion.graph.ir import Graph, Node, make_node
from fusion.graph.ops import OpType
from fusion.passes.dce import eliminate_dead_nodes
from fusion.passes.rewrite import fresh_name, scalar_constant


def _sole(graph: Graph, value: str, op: OpType, readers: int = 1) -> Node | None:
    """The node of type `op` reading `value`, if value has exactly `readers` readers and is no graph output."""
    users = graph.consumers.get(value, ())
    if value in graph.outputs or len(users) != readers:
        return None
    matches = [u for u in users if u.op == op]
    return matches[0] if matches else None


def _other(node: Node, value: str) -> str:
    return node.inputs[1] if node.inputs[0] == value else node.inputs[0]


def _match(graph: Graph, mean: Node) -> tuple[Node, dict] | None:
    """(last node of the pattern, LayerNorm inputs/attrs) for the pattern starting at ReduceMean `mean`."""
    x = mean.inputs[0]
    rank = graph.types[x].rank
    axes = tuple(mean.attr("axes"))
    if not mean.attr("keepdims") or axes != tuple(range(rank - len(axes), rank)):
        return None
    sub = _sole(graph, mean.outputs[0], OpType.Sub)
    if sub is None or sub.inputs != (x, mean.outputs[0]):
        return None
    d = sub.outputs[0]
    users = graph.consumers.get(d, ())
    square = next((u for u in users if u.op in (OpType.Pow, OpType.Mul)), None)
    div = next((u for u in users if u.op == OpType.Div and u.inputs[0] == d), None)
    if square is None or div is None or d in graph.outputs or len(users) != 2:
        return None
    if not (square.inputs == (d, d) or (square.op == OpType.Pow and scalar_constant(graph, square.inputs[1]) == 2.0)):
        return None
    var = _sole(graph, square.outputs[0], OpType.ReduceMean)
    if var is None or tuple(var.attr("axes")) != axes or not var.attr("keepdims"):
        return None
    add = _sole(graph, var.outputs[0], OpType.Add)
    eps = scalar_constant(graph, _other(add, var.outputs[0])) if add is not None else None
    sqrt = _sole(graph, add.outputs[0], OpType.Sqrt) if eps is not None else None
    if sqrt is None or _sole(graph, sqrt.outputs[0], OpType.Div) is not div or div.inputs[1] != sqrt.outputs[0]:
        return None
    last, scale, bias = div, None, None
    norm_shape = graph.types[x].shape[rank - len(axes) :]
    for op in (OpType.Mul, OpType.Add):
        nxt = _sole(graph, last.outputs[0], op)
        param = _other(nxt, last.outputs[0]) if nxt is not None else None
        if param is None or param not in graph.constants:
            break
        if np.broadcast_shapes(graph.types[param].shape, norm_shape) != norm_shape:
            break
        if op == OpType.Mul:
            scale = param
        elif op == OpType.Add:
            bias = param
        last = nxt
    return last, {"x": x, "axis": rank - len(axes), "epsilon": eps, "scale": scale, "bias": bias, "shape": norm_shape}


def fuse_layernorm(graph: Graph) -> Graph:
    constants = dict(graph.constants)
    replacement: dict[str, Node] = {}
    taken: set[str] = set()
    for node in graph.nodes:
        found = _match(graph, node) if node.op == OpType.ReduceMean else None
        if found is None:
            continue
        last, m = found
        scale = m["scale"]
        if scale is None:
            scale = fresh_name(graph, f"{node.name}/ln_scale", taken)
            taken.add(scale)
            constants[scale] = np.ones(m["shape"], np.float32)
        inputs = (m["x"], scale) + ((m["bias"],) if m["bias"] is not None else ())
        name = fresh_name(graph, f"{node.name}/layernorm", taken)
        taken.add(name)
        replacement[last.name] = make_node(
            name, OpType.LayerNorm, inputs, last.outputs, axis=m["axis"], epsilon=m["epsilon"]
        )
    if not replacement:
        return graph
    nodes = [replacement.get(n.name, n) for n in graph.nodes]
    return eliminate_dead_nodes(rebuild(graph, nodes, constants))
