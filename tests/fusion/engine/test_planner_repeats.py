"""Repeated structures (a model's layers): the planner prices and measures their kernels by the first one built,
without changing its plans."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from engine_helpers import context
from transformer_graphs import BlockShape, transformer

from fusion.cost import AnalyticCostModel
from fusion.engine import pairing
from fusion.engine.candidates import Candidate, schedules
from fusion.engine.execute import timing_cycles
from fusion.engine.features import kernel_features
from fusion.engine.kernel import Kernel
from fusion.engine.overlap import BoundaryOverlap
from fusion.engine.pairing import plan_pipelines
from fusion.engine.planner import Evaluator, plan_dynamic
from fusion.engine.strategies import strategy_of
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType


def _layer_nodes(graph, op: OpType) -> list[str]:
    return [n.name for n in graph.nodes if n.op == op]


def test_repeated_layers_share_a_shape_signature_and_other_shapes_do_not() -> None:
    graph, inputs = transformer(BlockShape(seq=16, dim=32, heads=2, layers=2))
    mc = context(graph, inputs, "int8")
    matmuls = _layer_nodes(graph, OpType.MatMul)  # per layer: q, k, v, scores, context, out, up, down
    per_layer = len(matmuls) // 2
    first, second = matmuls[:per_layer], matmuls[per_layer:]
    for a, b in zip(first, second, strict=True):
        assert mc.shape_signature((a,)) == mc.shape_signature((b,))  # other weights and int8 scales
    up, down = first[-2], first[-1]  # (32 -> 64) and (64 -> 32): other shapes
    assert mc.shape_signature((up,)) != mc.shape_signature((down,))
    assert mc.scale(graph.node(first[0]).outputs[0]) != mc.scale(graph.node(second[0]).outputs[0])


def test_a_small_constant_enters_the_signature_by_value() -> None:
    g = GraphBuilder("muls")
    x = g.input("x", (4, 16))
    a = g.op(OpType.Mul, x, g.constant(np.float32(0.5)))
    b = g.op(OpType.Mul, x, g.constant(np.float32(0.25)))
    c = g.op(OpType.Mul, x, g.constant(np.float32(0.5)))
    g.output(g.op(OpType.Add, g.op(OpType.Add, a, b), c))
    graph = g.build()
    mc = context(graph, {}, "fp32")
    first, second, third = _layer_nodes(graph, OpType.Mul)
    assert mc.shape_signature((first,)) == mc.shape_signature((third,)) != mc.shape_signature((second,))


def _built(ev: Evaluator) -> int:
    """Groups the evaluator generated code for (refusals included), not those priced as repeats and never built."""
    results = [f.result() for f in ev._memo.values()]
    return sum(isinstance(r, str) or isinstance(r.source, Kernel) for r in results)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_repeats_plan_the_same_and_build_less(dtype: str) -> None:
    """The plan (groups, schedules, predictions, reasons, alternatives, refusals) with repeated layers' kernels
    priced from the first layer's and measured by them is the plan without, and fewer kernels are built and
    simulated for it; a planned group priced as a repeat builds its own kernel, with the features it was priced
    by."""
    graph, inputs = transformer(BlockShape(seq=16, dim=32, heads=2, layers=2))
    mc = context(graph, inputs, dtype)
    plans, built, evaluators = [], [], []
    for repeats in (False, True):
        ev = Evaluator(mc, AnalyticCostModel(), {}, repeats=repeats)
        plans.append(plan_dynamic(ev))
        built.append(_built(ev))
        evaluators.append(ev)
    full, repeated = plans
    assert (repeated.choices, repeated.rejected) == (full.choices, full.rejected)
    assert repeated.measured.kernels < full.measured.kernels
    assert built[1] < built[0]
    ev = evaluators[1]
    for choice in repeated.choices:
        e = ev.evaluate(choice.group)
        assert e.kernel.group == choice.group
        if e.kernel.program is not None:
            assert kernel_features(mc, e.kernel, 0.0) == e.features


def test_repeated_int8_layers_differ_in_immediates_not_in_features_or_cycles() -> None:
    """What pricing and measuring a repeat by the first rest on, on every GEMM schedule of two int8 layers: their
    programs differ (requantization immediates), their features and simulated cycles do not."""
    graph, inputs = transformer(BlockShape(seq=16, dim=32, heads=2, layers=2))
    mc = context(graph, inputs, "int8")
    ev = Evaluator(mc, AnalyticCostModel(), {}, repeats=False)
    matmuls = _layer_nodes(graph, OpType.MatMul)
    per_layer = len(matmuls) // 2
    differ = 0
    for a, b in zip(matmuls[:per_layer], matmuls[per_layer:], strict=True):
        for group in schedules(mc, Candidate((a,), "single")):
            first, second = ev.evaluate(group), ev.evaluate(replace(group, nodes=(b,)))
            if isinstance(first, str):
                assert isinstance(second, str)
                continue
            differ += first.kernel.program.text != second.kernel.program.text
            assert first.features == second.features
            assert timing_cycles(mc, first.kernel) == timing_cycles(mc, second.kernel)
    assert differ > 0


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_repeated_layers_boundaries_are_priced_by_the_first_layers(dtype: str) -> None:
    """In program mode the planner prices the overlap at the boundaries of a fusion's separate kernels
    (`overlap.BoundaryOverlap`, generated for each pair of groups); with `repeats`, a repeated layer's are the
    first layer's, asked once, and the plan is the plan of the planner asking for every one."""
    graph, inputs = transformer(BlockShape(seq=16, dim=32, heads=2, layers=2))
    mc = context(graph, inputs, dtype)
    plans, asked = [], []
    for repeats in (False, True):
        boundaries, found = BoundaryOverlap(mc), []

        def overlap(parts, boundaries=boundaries, found=found) -> float:
            found.append(boundaries.chain(parts))
            return found[-1]

        ev = Evaluator(mc, AnalyticCostModel(), {}, overlap=overlap, repeats=repeats)
        plan = plan_dynamic(ev)
        plans.append((plan.choices, plan.rejected))
        asked.append(found)
    assert plans[1] == plans[0]
    assert any(asked[0]) and 0 < len(asked[1]) < len(asked[0])


def test_a_repeat_is_measured_by_the_first_kernel_without_being_built() -> None:
    """A second layer's kernel priced as a repeat and measured before the first layer's (the plan guard measures
    regions in plan order) is timed on the first's program: not built, and the cycles of its own program."""
    graph, inputs = transformer(BlockShape(seq=16, dim=32, heads=2, layers=2))
    mc = context(graph, inputs, "int8")
    ev = Evaluator(mc, AnalyticCostModel(), {})
    matmuls = _layer_nodes(graph, OpType.MatMul)
    first, second = matmuls[0], matmuls[len(matmuls) // 2]
    for group in schedules(mc, Candidate((first,), "single")):
        a = ev.evaluate(group)
        if isinstance(a, str) or a.kernel.program is None:
            continue
        b = ev.evaluate(replace(group, nodes=(second,)))
        assert not isinstance(b.source, Kernel)  # priced as a repeat
        cycles = ev.measured_cycles(b)
        assert not isinstance(b.source, Kernel)  # measured without being built
        assert cycles == timing_cycles(mc, b.kernel) == ev.measured_cycles(a)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_repeated_layers_pipelined_pairs_share_the_first_layers_outcome(dtype: str, monkeypatch) -> None:
    """With `repeats`, a pair of the structure of one considered before is neither built nor simulated, and the
    pipelined pairs (and the rest of the plan) are those of the planner that builds and measures every pair."""
    # 64 tokens: a shape whose layers consider pipelined pairs in both dtypes (fp32 considers none at 16-48 tokens
    # since the attention and GEMM kernels read their k-slices in place, and the test would have nothing to compare)
    graph, inputs = transformer(BlockShape(seq=64, dim=32, heads=2, layers=2))
    mc = context(graph, inputs, dtype)
    built: list[tuple] = []
    build = pairing.build_pipelined

    def counted(mc, producer, consumer):
        built.append((producer, consumer))
        return build(mc, producer, consumer)

    monkeypatch.setattr(pairing, "build_pipelined", counted)
    plans, builds = [], []
    for repeats in (False, True):
        built.clear()
        ev = Evaluator(mc, AnalyticCostModel(), {}, repeats=repeats)
        plan = plan_pipelines(ev, plan_dynamic(ev))
        plans.append((plan.choices, plan.rejected, plan.pipelined))
        builds.append(len(built))
    assert plans[1] == plans[0]
    assert 0 < builds[1] < builds[0]


def _batch_of_one(dims: int) -> tuple[Graph, str]:
    """x (1, ..., 1, 16, 32) @ w (32, 48) with `dims` axes in x."""
    g = GraphBuilder("batch_one")
    x = g.input("x", (*([1] * (dims - 2)), 16, 32))
    w = g.constant(np.random.default_rng(0).standard_normal((32, 48)).astype(np.float32))
    g.output(g.op(OpType.MatMul, x, w))
    graph = g.build()
    return graph, _layer_nodes(graph, OpType.MatMul)[0]


@pytest.mark.parametrize("dims", [3, 4])
def test_a_batch_of_one_is_not_flattened_since_flattening_it_is_the_same_program(dims: int) -> None:
    """`gemm_schedules` offers flattening only for a batch of more than one GEMM; flattening a batch of ones
    would generate the same program as each unflattened schedule (what leaving them out loses: nothing)."""
    graph, head = _batch_of_one(dims)
    mc = context(graph, {}, "fp32")
    offered = schedules(mc, Candidate((head,), "single"))
    assert [g for g in offered if strategy_of(g).tiled] and not [g for g in offered if g.flatten]
    ev = Evaluator(mc, AnalyticCostModel(), {}, repeats=False)
    built = 0
    for group in offered:
        if not strategy_of(group).tiled:
            continue
        a, b = ev.evaluate(group), ev.evaluate(replace(group, flatten=True))
        assert isinstance(a, str) == isinstance(b, str)
        if not isinstance(a, str):
            assert a.kernel.program.text == b.kernel.program.text
            built += 1
    assert built > 0
    batched, _ = transformer(BlockShape(batch=2, seq=16, dim=32, heads=2))
    matmul = _layer_nodes(batched, OpType.MatMul)[0]
    assert any(g.flatten for g in schedules(context(batched, {}, "fp32"), Candidate((matmul,), "single")))
