"""Where a whole transformer MLP runs as one kernel (`codegen.mlp`): two GEMMs with constant 2-D weights joined by
an elementwise chain, GEMM2 reading the chain's (or GEMM1's) output alone, with the whole-row chains around them.

Each match offers its prologue of up to two chain nodes (the LayerNorm before GEMM1, and the residual Add
before it) whole or not at all (the LayerNorm alone won no zoo plan and cost BERT's planning a fifth of its time)
and every prefix of the chain after GEMM2 (bias, residual Add, the following LayerNorm: its first
chain-op reader each time, so a residual sum also read further on is stored, as `codegen.chain` does). Reshapes
keeping the last axis anywhere among them are views (GPT-2's Gemm -> Reshape -> Gelu -> Reshape -> Gemm): they
join the group and count toward no limit; no variant starts or ends with one."""

from __future__ import annotations

from dataclasses import dataclass

from fusion.engine.codegen.chain import CHAIN_OPS, ROWS
from fusion.engine.codegen.matrix_group import EPILOGUE_HEADS, packable_weight
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType

MAX_MID = 8  # activation chain nodes (SiLU: Sigmoid, Mul; tanh-GELU as exported: 8)
MAX_POST = 4  # bias, residual Add, LayerNorm (one node when fused)
MAX_PRE = 2  # residual Add, LayerNorm


@dataclass(frozen=True)
class MlpMatch:
    first: Node
    mid: tuple[Node, ...]
    second: Node
    pre: tuple[Node, ...]  # the prologue offered (whole, or none)
    post: tuple[Node, ...]  # the longest epilogue offered (its prefixes are offered too)

    def variants(self, graph: Graph) -> list[tuple[str, ...]]:
        """Node tuples (graph order) of the whole prologue or none x every epilogue prefix (cut at chain nodes: a
        view at the end of a group would be a view of a value the group does not hold)."""
        out = []
        starts = [0, len(self.pre)] if self.pre else [0]
        ends = [0] + [k + 1 for k, n in enumerate(self.post) if not is_row_view(graph, n)]
        for i in starts:
            for k in ends:
                names = {n.name for n in (*self.pre[i:], self.first, *self.mid, self.second, *self.post[:k])}
                out.append(graph.in_order(names))
        return out


def is_row_view(graph: Graph, node: Node) -> bool:
    """A Reshape keeping the last axis: the same rows x features in memory, a new name."""
    if node.op != OpType.Reshape:
        return False
    shapes = [graph.types[v].shape for v in (node.inputs[0], node.outputs[0])]
    return shapes[0][-1:] == shapes[1][-1:]


def _readers(graph: Graph, value: str) -> tuple[Node, ...]:
    return () if value in graph.outputs else tuple(graph.consumers.get(value, ()))


def _mid_chain(graph: Graph, first: Node) -> tuple[tuple[Node, ...], Node] | None:
    """The elementwise nodes (graph order) from GEMM1's output to the one value GEMM2 reads, and GEMM2."""
    inside, mid = {first.outputs[0]}, []
    start = graph.nodes.index(first) + 1
    for node in graph.nodes[start:]:
        reads = [v for v in node.inputs if not graph.is_constant(v)]
        if not reads or not set(reads) & inside:
            continue
        if node.op in EPILOGUE_HEADS and node.inputs[0] in inside and packable_weight(graph, node) is not None:
            value = node.inputs[0]
            private = all(c.name in {m.name for m in mid} for v in inside - {value} for c in _readers(graph, v))
            alone = _readers(graph, value) == (node,)
            return (tuple(mid), node) if private and alone and set(reads) <= inside else None
        view = is_row_view(graph, node)
        if not view and (
            node.op not in CHAIN_OPS or node.op in ROWS or sum(not is_row_view(graph, m) for m in mid) >= MAX_MID
        ):
            return None
        if not set(reads) <= inside:
            return None
        mid.append(node)
        inside.add(node.outputs[0])
    return None


def _pre(graph: Graph, first: Node) -> tuple[Node, ...]:
    run: list[Node] = []
    value = first.inputs[0]
    while (node := graph.producers.get(value)) is not None and (node.op in CHAIN_OPS or is_row_view(graph, node)):
        if not is_row_view(graph, node) and sum(not is_row_view(graph, n) for n in run) >= MAX_PRE:
            break
        run.insert(0, node)
        value = node.inputs[0]
    while run and is_row_view(graph, run[0]):  # a view of a value from before the prologue starts no variant
        run.pop(0)
    return tuple(run)


def _post(graph: Graph, second: Node) -> tuple[Node, ...]:
    run: list[Node] = []
    value = second.outputs[0]
    while sum(not is_row_view(graph, n) for n in run) < MAX_POST:
        all_readers = _readers(graph, value)
        readers = [r for r in all_readers if (r.op in CHAIN_OPS or is_row_view(graph, r)) and len(r.outputs) == 1]
        if not readers or ((not run or is_row_view(graph, run[-1])) and len(all_readers) != 1):
            break
        run.append(readers[0])
        value = readers[0].outputs[0]
    return tuple(run)


def find_mlps(graph: Graph) -> list[MlpMatch]:
    """Every GEMM -> elementwise chain -> GEMM pair (each GEMM in at most one), with its prologue and epilogue."""
    out: list[MlpMatch] = []
    taken: set[str] = set()
    for first in graph.nodes:
        if first.op not in EPILOGUE_HEADS or first.name in taken or packable_weight(graph, first) is None:
            continue
        found = _mid_chain(graph, first)
        if found is None or found[1].name in taken:
            continue
        mid, second = found
        out.append(MlpMatch(first, mid, second, _pre(graph, first), _post(graph, second)))
        taken |= {first.name, second.name}
    return out
