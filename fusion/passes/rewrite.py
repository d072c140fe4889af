"""Helpers the passes share: making readers of a value read an equivalent one, and naming new values."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fusion.graph.ir import Graph, Node


def scalar_constant(graph: Graph, value: str) -> float | None:
    """The value of a one-element constant of any rank ((), (1,), (1, 1, 1)...), else None."""
    array = graph.constants.get(value)
    return float(array.reshape(-1)[0]) if array is not None and array.size == 1 else None


def resolve(mapping: Mapping[str, str], value: str) -> str:
    """Follow a substitution chain a -> b -> c to its end."""
    while value in mapping:
        value = mapping[value]
    return value


def apply_equivalences(graph: Graph, nodes: Iterable[Node], mapping: Mapping[str, str]) -> list[Node]:
    """Nodes where readers of each `old` in mapping read its equivalent value instead.

    Graph outputs keep their names: when every output of a node is mapped and its graph outputs' equivalents
    are written by other nodes (and are neither graph inputs nor outputs), those nodes write the output names
    directly and the node is dropped; otherwise it stays. Nodes left without readers are for DCE to remove.
    """
    nodes = list(nodes)
    produced = {o for n in nodes for o in n.outputs}
    readers = {old: resolve(mapping, old) for old in mapping if old not in graph.outputs}
    renamed: dict[str, str] = {}  # equivalent value -> the graph output name its producer now writes
    dropped: set[str] = set()
    for node in nodes:
        outs = [o for o in node.outputs if o in graph.outputs]
        if not outs or not all(o in mapping for o in node.outputs):
            continue
        news = [resolve(mapping, o) for o in outs]
        fine = all(v in produced and v not in graph.outputs and v not in renamed for v in news)
        if fine and len(set(news)) == len(news):
            renamed.update(zip(news, outs, strict=True))
            dropped.add(node.name)

    def final(value: str) -> str:
        value = resolve(readers, value)
        return renamed.get(value, value)

    out = []
    for node in nodes:
        if node.name in dropped:
            continue
        inputs = tuple(final(v) for v in node.inputs)
        outputs = tuple(renamed.get(v, v) for v in node.outputs)
        same = (inputs, outputs) == (node.inputs, node.outputs)
        out.append(node if same else Node(node.name, node.op, inputs, outputs, node.attrs))
    return out


def fresh_name(graph: Graph, stem: str, taken: set[str] | None = None) -> str:
    taken = taken or set()
    names = set(graph.types) | {n.name for n in graph.nodes} | taken
    name, i = stem, 0
    while name in names:
        i += 1
        name = f"{stem}#{i}"
    return name
