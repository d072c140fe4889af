"""Fusion candidates: producer/consumer chains of nodes, each with the kernel schedules worth trying.

Starting points are (a) a matrix node with the elementwise consumers its drain can absorb, (b) maximal runs of
elementwise/row-reduction nodes that a vector chain can execute, (c) a matrix node with a constant weight (after a
leading-axis Transpose it absorbs) followed by such a run or by whole-row layout moves, for the swapped
orientation, (d) a Transpose (and the Reshapes after it) feeding such a run, as one chain reading the transposed
tensor from local memory, or feeding a MatMul that reads it in place, (e) an attention with its layout nodes
(`attention_match`), as one kernel. Every prefix of (a), (c) and (d) and
every sub-run of (b) is a candidate; schedules vary tile rows, batch flattening and the zero-skip variant.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fusion.engine.attention_match import find_attention, find_projected_attention
from fusion.engine.codegen.absorbed_layout import loads_in_place
from fusion.engine.codegen.chain import CHAIN_OPS
from fusion.engine.codegen.gated import find_gated
from fusion.engine.codegen.matrix_group import EPILOGUE_HEADS
from fusion.engine.codegen.patch_embed import find_patch_embeds
from fusion.engine.codegen.rotary import find_segment_chains
from fusion.engine.codegen.siblings import find_siblings
from fusion.engine.context import ModelContext
from fusion.engine.conv_chain_match import find_conv_chains
from fusion.engine.mlp_match import find_mlps
from fusion.engine.plan import Group
from fusion.engine.strategies import REGISTRY, strategy_of
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.compiler import ALIAS_OPS

ABSORBABLE = frozenset({OpType.Add, OpType.Relu})
# a Conv's drain also applies a trailing Clip where it is the int8 requantization clamp (`codegen.conv.clip_tail`)
CONV_ABSORBABLE = ABSORBABLE | {OpType.Clip}
MAX_CHAIN = 4
MAX_VECTOR_CHAIN = 8  # a run of chain nodes alone: RMSNorm is 7 (Pow, ReduceMean, Add, Sqrt, Div, Mul, Mul)


@dataclass(frozen=True)
class Candidate:
    nodes: tuple[str, ...]
    family: str  # "single", "epilogue", "chain", "stream", "swapped" ((c)), "conv", "layout_chain"/"layout_load" ((d)),
    # "attention" ((e)), "gated", "segment_chain" (chain ops with last-axis Slice/Concat: `codegen.rotary`),
    # "patch_embed" (a patchify Conv with its token Reshape + Transpose: `codegen.patch_embed`)


def sole_consumer(graph: Graph, node: Node) -> Node | None:
    value = node.outputs[0]
    users = graph.consumers.get(value, ())
    if len(node.outputs) != 1 or len(users) != 1 or value in graph.outputs:
        return None
    return users[0]


def _follow(graph: Graph, node: Node, allowed: frozenset, limit: int) -> list[Node]:
    run = [node]
    while len(run) < limit:
        nxt = sole_consumer(graph, run[-1])
        if nxt is None or nxt.op not in allowed:
            break
        run.append(nxt)
    return run


def _feeds_activation(transpose: Node, mm: Node) -> bool:
    """A Transpose of leading axes only, read as a GEMM's activation: the swapped GEMM can absorb it."""
    perm = tuple(transpose.attr("perm"))
    return mm.op in EPILOGUE_HEADS and mm.inputs[0] == transpose.outputs[0] and perm[-1] == len(perm) - 1


def _row_move_tails(graph: Graph, head: Node) -> list[tuple[str, ...]]:
    """A GEMM (+ Relu) followed by a leading-axis Transpose, possibly through a Reshape keeping the last axis:
    layout moves of whole output rows that a swapped GEMM stores directly."""
    run = _follow(graph, head, frozenset({OpType.Relu, OpType.Reshape, OpType.Transpose}), 4)
    found = []
    for k in range(2, len(run) + 1):
        last, body = run[k - 1], run[: k - 1]
        ops = [n.op for n in body]
        if last.op != OpType.Transpose or tuple(last.attr("perm"))[-1] != len(last.attr("perm")) - 1:
            continue
        if OpType.Transpose in ops[1:] or ops[1:].count(OpType.Reshape) > 1 or OpType.Reshape in ops[1:-1]:
            continue
        found.append(tuple(n.name for n in run[:k]))
    return found


def _pooled(graph: Graph, run: list[Node]) -> list[Candidate]:
    """A Conv and its absorbed consumers, each prefix of them followed by the MaxPool that alone reads it: the
    kernel pools its own output (`codegen.conv_pool`; ResNet's stem)."""
    out = []
    for k in range(1, len(run) + 1):
        pool = sole_consumer(graph, run[k - 1])
        if pool is not None and pool.op == OpType.MaxPool:
            out.append(Candidate((*(n.name for n in run[:k]), pool.name), "conv"))
    return out


def enumerate_candidates(graph: Graph) -> list[Candidate]:
    out: list[Candidate] = [Candidate((n.name,), "single") for n in graph.nodes]
    for node in graph.nodes:
        if node.op in EPILOGUE_HEADS:
            run = _follow(graph, node, ABSORBABLE, MAX_CHAIN)
            out += [Candidate(tuple(n.name for n in run[:k]), "epilogue") for k in range(2, len(run) + 1)]
        if node.op in EPILOGUE_HEADS:
            out += _stream_runs(graph, node)
        if node.op == OpType.Transpose and (mm := sole_consumer(graph, node)) and _feeds_activation(node, mm):
            run = [node, *_follow(graph, mm, CHAIN_OPS, MAX_CHAIN)]
            out += [Candidate(tuple(n.name for n in run[:k]), "swapped") for k in range(2, len(run) + 1)]
        if node.op in EPILOGUE_HEADS:
            out += [Candidate(nodes, "swapped") for nodes in _row_move_tails(graph, node)]
            run = _follow(graph, node, CHAIN_OPS, MAX_CHAIN)  # the epilogue as a chain after the transposing load
            out += [Candidate(tuple(n.name for n in run[:k]), "swapped") for k in range(2, len(run) + 1)]
        if node.op == OpType.Conv:
            run = _follow(graph, node, CONV_ABSORBABLE, MAX_CHAIN)
            out += [Candidate(tuple(n.name for n in run[:k]), "conv") for k in range(2, len(run) + 1)]
            out += _pooled(graph, run)
        if node.op in CHAIN_OPS:
            run = _follow(graph, node, CHAIN_OPS, MAX_VECTOR_CHAIN)
            out += [Candidate(tuple(n.name for n in run[:k]), "chain") for k in range(2, len(run) + 1)]
            out += _stored_chains(graph, node)
        if node.op == OpType.Transpose:
            out += _layout_chains(graph, node)
    attentions = find_attention(graph)
    out += [Candidate(m.nodes(graph), "attention") for m in attentions]
    out += [Candidate(m.nodes(graph), "attention_proj") for m in find_projected_attention(graph, attentions)]
    out += [Candidate(m.nodes(graph), "gated") for m in find_gated(graph)]
    out += [Candidate(nodes, "conv_chain") for nodes in find_conv_chains(graph)]
    out += [Candidate(nodes, "segment_chain") for nodes in find_segment_chains(graph)]
    out += [Candidate(m.nodes(graph), "siblings") for m in find_siblings(graph)]
    out += [Candidate(nodes, "patch_embed") for nodes in find_patch_embeds(graph)]
    out += [Candidate(nodes, "mlp") for m in find_mlps(graph) for nodes in m.variants(graph)]
    return out


def _stream_runs(graph: Graph, head: Node) -> list[Candidate]:
    """A matrix node, the Reshapes of its output keeping the last axis (views: GPT-2's Gemm back to 3-D), then
    a run of chain nodes from the output's first reader: every prefix holding all its readers (`codegen.stream`;
    a SiLU reads the GEMM's output twice: Sigmoid, then the Mul by it)."""
    run = [head]
    while (nxt := sole_consumer(graph, run[-1])) is not None and nxt.op == OpType.Reshape and len(run) <= MAX_CHAIN:
        run.append(nxt)
    value = run[-1].outputs[0]
    private = len(run[-1].outputs) == 1 and value not in graph.outputs
    readers = graph.consumers.get(value, ()) if private else ()
    if not readers or any(r.op not in CHAIN_OPS for r in readers):
        return []
    run += _follow(graph, readers[0], CHAIN_OPS, MAX_CHAIN)
    names = [n.name for n in run]
    if any(r.name not in names for r in readers):
        return []
    first = max(names.index(r.name) for r in readers) + 1
    return [Candidate(tuple(names[:k]), "stream") for k in range(first, len(run) + 1)]


def _stored_chains(graph: Graph, node: Node) -> list[Candidate]:
    """A chain node read by several nodes, then a run of chain nodes from each chain-op reader: the chain also
    stores the first node's value for the other readers (a pre-LN block's residual sum feeds its LayerNorm and
    the next residual Add: one kernel instead of two, `codegen.chain.stored_intermediates`)."""
    readers = graph.consumers.get(node.outputs[0], ()) if len(node.outputs) == 1 else ()
    if len(readers) < 2:
        return []
    out = []
    for reader in readers:
        if reader.op in CHAIN_OPS:
            run = (node.name, *(n.name for n in _follow(graph, reader, CHAIN_OPS, MAX_VECTOR_CHAIN - 1)))
            out += [Candidate(run[:k], "chain") for k in range(2, len(run) + 1)]
    return out


def _layout_chains(graph: Graph, transpose: Node) -> list[Candidate]:
    """A Transpose and the Reshapes after it, then a run of chain nodes (one vector chain fed through the layout
    transform, every prefix with at least one chain node) or the MatMul reading them (in place): see
    `codegen.absorbed_layout`."""
    layout = _follow(graph, transpose, frozenset({OpType.Reshape}), MAX_CHAIN)
    head = sole_consumer(graph, layout[-1])
    names = tuple(n.name for n in layout)
    if head is not None and loads_in_place(graph, head):
        return [Candidate((*names, head.name), "layout_load")]
    if head is None or head.op not in CHAIN_OPS:
        return []
    run = tuple(n.name for n in _follow(graph, head, CHAIN_OPS, MAX_CHAIN))
    return [Candidate((*names, *run[:k]), "layout_chain") for k in range(1, len(run) + 1)]


def schedules(mc: ModelContext, cand: Candidate) -> list[Group]:
    """The kernel variants to try for a candidate: every registered strategy's groups for it (its candidate rule
    and schedule space, `strategies.REGISTRY`, in registry order); a layout-only node gets its host view alone. The
    zero-skip twins are added by the planner."""
    head = mc.graph.node(cand.nodes[0])
    views = cand.family == "single" and head.op in ALIAS_OPS
    return [g for s in REGISTRY.values() if s.host_view or not views for g in s.offers(mc, cand)]


def zero_skip_twin(group: Group) -> Group | None:
    """The zero-skip variant of a group (same schedule), when its strategy has one (`Strategy.sparse_twin`)."""
    twin = strategy_of(group).sparse_twin
    return None if twin is None else replace(group, strategy=twin)
