"""TVM's FuseOps grouping (Relax `FuseOps` over `GraphPartitioner`, src/relay/analysis/graph_partitioner.cc) on
the IR: the `static` policy's groups, decided from op patterns alone (no cost model, no data).

Op patterns are those TVM 0.27's `AnnotateTIROpPattern` gives the PrimFuncs `LegalizeOps` makes of each op
(checked on this machine, `bench/bench_tvm.py`), which are not the textbook ones (`OpKind`): elementwise AND
broadcasting arithmetic (bias Add, scaling Mul, Sub of a mean) are kElemWise; every reduction (mean, softmax,
layer_norm) is kOutEWiseFusable like matmul/conv2d/pooling; transpose/reshape/concat/slice/batch_norm are
kInjective; take (Gather) is kOpaque. The partitioner, on those patterns and the post-dominator tree:

- an edge producer -> consumer has the consumer's pattern; a node's post-dominator is the least common ancestor
  of its consumers in the post-dominator tree, the dominator edge's pattern the combination (max) of the
  patterns on the way; a node whose value is a graph output has none (its value must be materialised);
- phase 0: an OUT_ELEMWISE_FUSABLE group (a GEMM, Conv, pooling, Softmax, LayerNorm, reduction) takes its
  post-dominator when the dominator edge is ELEMWISE and every node on the paths to it is at most BROADCAST
  (matmul + bias Add + Gelu: one group; the merged group stays OUT_ELEMWISE_FUSABLE, so the chain grows); an
  ELEMWISE/BROADCAST node joins its post-dominator when the edge is at most INJECTIVE (or kCommReduce, which no
  op has here) and the nodes on the way are at most INJECTIVE (the sink anything fusable);
- phase 1: an INJECTIVE node (Transpose, Reshape, ...) joins its post-dominator when every node on the way, sink
  included, is at most INJECTIVE (a head split's Reshape + Transpose + scaling Mul: one group; a Transpose
  before a MatMul is not absorbed: the MatMul is OUT_ELEMWISE_FUSABLE);
- so a reduction starts its own group: nothing before it joins it (the edge into it is OUT_ELEMWISE_FUSABLE),
  it may absorb elementwise consumers;
- patterns are those of each node's group root, so a node fused into a GEMM's group behaves as the GEMM.
Tuples (phase 2) and the fused-size limits are not modelled (the IR has no tuple nodes; groups stay small).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fusion.graph.ir import Graph
from fusion.graph.ops import OpKind, OpType

Cond = Callable[[OpKind, bool], bool]


@dataclass
class _Group:
    """A union-find node: the group root carries the pattern (updated when a GEMM group merges into it)."""

    pattern: OpKind
    anchored: bool  # holds an OUT_ELEMWISE_FUSABLE node (TVM's anchor_ref)
    parent: _Group | None = None

    def root(self) -> _Group:
        g = self
        while g.parent is not None:
            g = g.parent
        return g


TVM_KIND = {  # AnnotateTIROpPattern's pattern of each OpKind's legalized PrimFunc (TVM 0.27)
    OpKind.ELEMWISE: OpKind.ELEMWISE,
    OpKind.BROADCAST: OpKind.ELEMWISE,
    OpKind.INJECTIVE: OpKind.INJECTIVE,
    OpKind.REDUCTION: OpKind.OUT_ELEMWISE_FUSABLE,
    OpKind.OUT_ELEMWISE_FUSABLE: OpKind.OUT_ELEMWISE_FUSABLE,
    OpKind.OPAQUE: OpKind.OPAQUE,
}
_TVM_NAMED = {  # ops whose PrimFunc's pattern is not their kind's (Expand: broadcast_to; Gather: take)
    "BatchNorm": OpKind.INJECTIVE,
    "Expand": OpKind.BROADCAST,
    "Gather": OpKind.OPAQUE,
    "GatherElements": OpKind.OPAQUE,
}
TVM_OP = {op: _TVM_NAMED[op.value] for op in OpType if op.value in _TVM_NAMED}


def tvm_pattern(op: OpType) -> OpKind:
    """The op pattern TVM gives the op's PrimFunc."""
    return TVM_OP.get(op, TVM_KIND[op.kind])


class _PostDominators:
    """TVM's `DominatorTree` over the nodes (post-dominators: computed from the outputs backwards)."""

    def __init__(self, graph: Graph) -> None:
        self.parent: dict[str, str | None] = {}
        self.pattern: dict[str, OpKind] = {}
        self.depth: dict[str, int] = {}
        for node in reversed(graph.nodes):
            links = [(c.name, tvm_pattern(c.op)) for v in node.outputs for c in graph.consumers.get(v, ())]
            if any(v in graph.outputs for v in node.outputs) or not links:
                self.parent[node.name], self.pattern[node.name], self.depth[node.name] = None, OpKind.OPAQUE, 1
                continue
            pattern = OpKind.ELEMWISE
            parent: str | None = links[0][0]
            pattern = max(pattern, links[0][1])
            for name, link in links[1:]:
                parent, pattern = self._lca(parent, name, pattern)
                pattern = max(pattern, link)
            self.parent[node.name], self.pattern[node.name] = parent, pattern
            self.depth[node.name] = 1 if parent is None else self.depth[parent] + 1

    def _lca(self, a: str | None, b: str | None, pattern: OpKind) -> tuple[str | None, OpKind]:
        while a != b:
            if a is None or b is None:
                return None, pattern
            if self.depth[a] < self.depth[b]:
                pattern, b = max(pattern, self.pattern[b]), self.parent[b]
            elif self.depth[a] > self.depth[b]:
                pattern, a = max(pattern, self.pattern[a]), self.parent[a]
            else:
                pattern = max(pattern, self.pattern[a], self.pattern[b])
                a, b = self.parent[a], self.parent[b]
        return a, pattern


def fuse_ops(graph: Graph) -> list[tuple[str, ...]]:
    """TVM's groups of the graph's nodes (each in graph order), in the order of their first node."""
    dom = _PostDominators(graph)
    kinds = {n.name: tvm_pattern(n.op) for n in graph.nodes}
    groups = {n: _Group(k, k == OpKind.OUT_ELEMWISE_FUSABLE) for n, k in kinds.items()}

    def outputs(name: str) -> list[str]:
        return [c.name for v in graph.node(name).outputs for c in graph.consumers.get(v, ())]

    def check_path(src: str, sink: str, cond: Cond) -> bool:
        seen: set[str] = set()

        def walk(name: str) -> bool:
            if name in seen:
                return True
            seen.add(name)
            if not cond(groups[name].root().pattern, name == sink):
                return False
            return name == sink or all(walk(n) for n in outputs(name))

        return all(walk(n) for n in outputs(src))

    def commit(src: str, sink: str) -> None:
        target, seen = groups[sink], set()

        def merge(name: str) -> None:
            if name == sink or name in seen:
                return
            seen.add(name)
            child, parent = groups[name].root(), target.root()
            if child is not parent:
                child.parent = parent
                if child.anchored:
                    parent.anchored, parent.pattern = True, max(child.pattern, parent.pattern)
            for n in outputs(name):
                merge(n)

        merge(src)

    for phase in (0, 1):
        for node in graph.nodes:
            own, sink = groups[node.name], dom.parent[node.name]
            if own.pattern == OpKind.OPAQUE or sink is None or own.root() is groups[sink].root():
                continue
            edge = dom.pattern[node.name]
            if own.pattern == OpKind.OUT_ELEMWISE_FUSABLE:
                ok = phase == 0 and edge == OpKind.ELEMWISE
                ok = ok and check_path(node.name, sink, lambda k, _: k <= OpKind.BROADCAST)
            elif own.pattern <= OpKind.BROADCAST:
                ok = edge <= OpKind.INJECTIVE or edge == OpKind.REDUCTION
                ok = ok and check_path(node.name, sink, _into_anchor)
            elif own.pattern == OpKind.INJECTIVE:
                ok = phase == 1 and check_path(node.name, sink, lambda k, _: k <= OpKind.INJECTIVE)
            else:  # a reduction: never fused into its consumers
                ok = False
            if ok:
                commit(node.name, sink)
    members: dict[int, list[str]] = {}
    for node in graph.nodes:  # dicts keep insertion order: groups by their first node
        members.setdefault(id(groups[node.name].root()), []).append(node.name)
    return [tuple(m) for m in members.values()]


def _into_anchor(kind: OpKind, is_sink: bool) -> bool:
    """An elementwise node's path: intermediates at most INJECTIVE, the sink anything fusable."""
    return kind <= OpKind.INJECTIVE if not is_sink else kind != OpKind.OPAQUE
