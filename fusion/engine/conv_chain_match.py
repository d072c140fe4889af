"""Candidates for layer fusion (`codegen.conv_chain`): runs of consecutive Convs (ungrouped or depthwise), each
(with the Relu or Clip after it) read only by the next, and optionally the residual Add of the last one's output
and the run's input (+ its Relu): a ResNet basic block, a bottleneck's three Convs, a MobileNet inverted residual
(1x1 expand -> Clip -> 3x3 depthwise -> Clip -> 1x1 project, + the input), a chain of pointwise Convs."""

from __future__ import annotations

from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.kernels.conv_depthwise import is_depthwise

MAX_CONVS = 3  # a bottleneck (1x1 -> 3x3 -> 1x1) or an inverted residual


def _sole_consumer(graph: Graph, node: Node) -> Node | None:
    # imported here: `candidates` imports this module to list its candidates
    from fusion.engine.candidates import sole_consumer

    return sole_consumer(graph, node)


def _chainable(graph: Graph, node: Node | None) -> bool:
    return node is not None and node.op == OpType.Conv and (node.attr("group") == 1 or is_depthwise(graph, node))


def _stage_end(graph: Graph, conv: Node) -> list[Node]:
    """A Conv and the Relu or Clip that alone reads it (the drain, or the vector unit between stages, applies it)."""
    act = _sole_consumer(graph, conv)
    return [conv, act] if act is not None and act.op in (OpType.Relu, OpType.Clip) else [conv]


def _residual_tail(graph: Graph, chain_input: str, end: Node) -> list[Node]:
    """The Add of the chain's output and its input (and the Relu that alone reads it), if it follows."""
    add = _sole_consumer(graph, end)
    if add is None or add.op != OpType.Add or sorted(add.inputs) != sorted((end.outputs[0], chain_input)):
        return []
    relu = _sole_consumer(graph, add)
    return [add, relu] if relu is not None and relu.op == OpType.Relu else [add]


def find_conv_chains(graph: Graph) -> list[tuple[str, ...]]:
    """Every chain of 2 to MAX_CONVS Convs from each Conv, each also with its residual tail when it has one. A
    chain's last Conv is taken without a Clip after it (the Clip then runs on its own)."""
    found: list[tuple[str, ...]] = []
    for head in graph.nodes:
        if not _chainable(graph, head):
            continue
        run = _stage_end(graph, head)
        for _ in range(MAX_CONVS - 1):
            nxt = _sole_consumer(graph, run[-1])
            if not _chainable(graph, nxt) or nxt.inputs[0] != run[-1].outputs[0]:
                break
            run += _stage_end(graph, nxt)
            if run[-1].op == OpType.Clip:
                found.append(tuple(n.name for n in run[:-1]))
                continue
            found.append(tuple(n.name for n in run))
            tail = _residual_tail(graph, head.inputs[0], run[-1])
            if tail:
                found.append(tuple(n.name for n in run + tail))
    return found
