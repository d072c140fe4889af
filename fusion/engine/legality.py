"""Legality predicates for fusing a group of nodes; each returns a `FusionDecision` with its reason.

Legality is separate from profitability (the cost model decides that). The generators add the unit-level
constraints they know best (working set vs scratchpad/accumulator halves, drain width, vector registers) by
refusing with a reason, which `generator_accepts` turns into a decision as well.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fusion.engine.context import ModelContext
from fusion.engine.decision import FusionDecision
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import MATRIX_OPS, OpType


def internal_values_private(graph: Graph, nodes: Sequence[Node]) -> FusionDecision:
    """Values produced inside the group (except the last node's) may be read only inside it: a fused kernel
    never writes them to DRAM."""
    inside = {n.name for n in nodes}
    for node in nodes[:-1]:
        for value in node.outputs:
            if value in graph.outputs:
                return FusionDecision.no(f"{value!r} is a graph output")
            outside = [c.name for c in graph.consumers.get(value, ()) if c.name not in inside]
            if outside:
                return FusionDecision.no(f"{value!r} is also read by {outside[0]!r}")
    return FusionDecision.yes()


@dataclass(frozen=True)
class FamilyRules:
    """What a candidate family's kernels guarantee, which the legality predicates rely on (one row per family
    `candidates.enumerate_candidates` makes; a family without a row is refused by `rules_of`)."""

    dag: bool = False  # its nodes form a DAG (Q, K and V paths meet; two GEMMs read one activation), not a chain
    # its kernels store every value read outside the group (a vector chain's intermediates, side-by-side GEMMs):
    # legal wherever the kernel can run before those readers, which `no_cycle_through_outside` checks (plans run
    # their groups in a topological order, `planner.in_execution_order`)
    stores_intermediates: bool = False
    # int8: its kernels requantize every matrix op as its drain would and run the rest as the unfused recipes
    # (see `numerics_preserved`), so fusing changes no rounding
    keeps_int8_numerics: bool = False


FAMILIES: Mapping[str, FamilyRules] = {
    "single": FamilyRules(),
    "epilogue": FamilyRules(),
    "conv": FamilyRules(),
    "layout_chain": FamilyRules(),
    "layout_load": FamilyRules(),
    "chain": FamilyRules(stores_intermediates=True),
    "stream": FamilyRules(keeps_int8_numerics=True),
    "swapped": FamilyRules(keeps_int8_numerics=True),
    "conv_chain": FamilyRules(keeps_int8_numerics=True),
    "attention": FamilyRules(dag=True, keeps_int8_numerics=True),
    "attention_proj": FamilyRules(dag=True, keeps_int8_numerics=True),  # + its projections: requantized as theirs
    "gated": FamilyRules(dag=True, keeps_int8_numerics=True),
    "segment_chain": FamilyRules(dag=True),  # rotary: x read by a Mul and two Slices
    "siblings": FamilyRules(dag=True, stores_intermediates=True, keeps_int8_numerics=True),
    "patch_embed": FamilyRules(stores_intermediates=True, keeps_int8_numerics=True),
    # a whole MLP: a residual sum read by the epilogue (and a following LayerNorm's input) is a DAG, stored when read
    # outside; both GEMMs requantize as their drains would, every chain as the unfused recipes
    "mlp": FamilyRules(dag=True, stores_intermediates=True, keeps_int8_numerics=True),
}


def rules_of(family: str) -> FamilyRules:
    rules = FAMILIES.get(family)
    if rules is None:
        raise ValueError(f"candidate family {family!r} has no legality rules (fusion.engine.legality.FAMILIES)")
    return rules


def dependencies_respected(graph: Graph, nodes: Sequence[Node]) -> FusionDecision:
    """Each node after the first consumes the previous node's output (a producer/consumer chain)."""
    for prev, node in zip(nodes, nodes[1:], strict=False):
        if prev.outputs[0] not in node.inputs:
            return FusionDecision.no(f"{node.name!r} does not consume {prev.name!r}")
    return FusionDecision.yes()


def no_cycle_through_outside(
    graph: Graph, nodes: Sequence[Node], planned: Mapping[str, Sequence[Node]] | None = None
) -> FusionDecision:
    """No path leaves the group and re-enters it: the fused kernel could not be scheduled (XLA's check).
    `planned`: the nodes of the groups already planned, by node; a path entering one goes on from all of its
    nodes (the group runs as one kernel: every output after every input), so the plan's groups keep an order."""
    inside = {n.name for n in nodes}
    planned = planned or {}
    frontier = [c for n in nodes for v in n.outputs for c in graph.consumers.get(v, ()) if c.name not in inside]
    seen: set[str] = set()
    while frontier:
        node = frontier.pop()
        if node.name in seen:
            continue
        members = planned.get(node.name, (node,))
        seen.update(m.name for m in members)
        for member in members:
            for value in member.outputs:
                for consumer in graph.consumers.get(value, ()):
                    if consumer.name in inside:
                        return FusionDecision.no(
                            f"path {nodes[0].name!r} -> {node.name!r} -> {consumer.name!r} re-enters"
                        )
                    frontier.append(consumer)
    return FusionDecision.yes()


VALUE_PRESERVING = frozenset({OpType.Relu, OpType.Reshape, OpType.Transpose})  # commute with requantization


def numerics_preserved(mc: ModelContext, nodes: Sequence[Node], family: str = "epilogue") -> FusionDecision:
    """int8: moving a float Add that follows a requantized MatMul into the drain skips that requantization
    (the sum is rounded once instead of twice): allowed only with `allow_rounding_change`. A stream requantizes
    in the vector chain exactly as the drain would, and a swapped GEMM drains only value-preserving ops (the rest
    runs as a vector chain on the requantized output), so both keep the numerics; an attention kernel (and a gated
    pair of GEMMs) requantizes both MatMuls as their drains would and runs the rest as the unfused recipes; a conv
    chain requantizes every Conv in its drain and runs a residual Add on the dequantized output, as unfused; a
    patch embedding requantizes its Conv in the drain and runs the class-token Concat and the chain after it on the
    dequantized tokens, as unfused."""
    if not mc.int8 or nodes[0].op not in MATRIX_OPS or rules_of(family).keeps_int8_numerics:
        return FusionDecision.yes()
    if family == "conv" and mc.qplan.matrix[nodes[0].name].dequantize:
        # a dequantizing Conv (read only by Adds) outputs float32: its Add and Relu run in float32 after the
        # dequantization, as unfused (`codegen.conv.Epilogue.rescale`); nothing is rounded
        return FusionDecision.yes()
    # a Conv's trailing Clip: its generator takes it only where it is the requantization clamp, exactly
    # (`codegen.conv.clip_tail`), and refuses the rest; a trailing MaxPool keeps the int8 values' scale and a max
    # commutes with the (monotone) requantization (`codegen.conv_pool`)
    exact = {OpType.Clip, OpType.MaxPool} if family == "conv" else set()
    changes = [n.name for n in nodes[1:] if n.op not in VALUE_PRESERVING | exact]
    if changes and mc.allow_rounding_change:
        return FusionDecision.yes(f"int8: fusing {changes[0]!r} changes rounding (allowed by option)")
    if changes:
        return FusionDecision.no(f"int8: fusing {changes[0]!r} skips a requantization (changes rounding)")
    return FusionDecision.yes()


def structurally_legal(mc: ModelContext, nodes: Sequence[Node], family: str = "epilogue") -> FusionDecision:
    graph, rules = mc.graph, rules_of(family)
    # a DAG family's one output is the last node's, which internal_values_private checks; every other family is a
    # producer/consumer chain
    chain = FusionDecision.yes() if rules.dag else dependencies_respected(graph, nodes)
    return (
        chain
        & (FusionDecision.yes() if rules.stores_intermediates else internal_values_private(graph, nodes))
        & no_cycle_through_outside(graph, nodes)
        & numerics_preserved(mc, nodes, family)
    )


def generator_accepts(built: object) -> FusionDecision:
    """A generator's refusal (a string from `kernel.try_build`) as a decision."""
    if isinstance(built, str):
        return FusionDecision.no(built)
    return FusionDecision.yes()
