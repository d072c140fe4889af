"""Profiler, drift detection, fusion decisions and legality predicates."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import context, gemm_graph, model, sparse_activations
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fusion.engine.candidates import enumerate_candidates
from fusion.engine.decision import FusionDecision
from fusion.engine.drift import DriftThresholds, detect_drift
from fusion.engine.legality import (
    dependencies_respected,
    internal_values_private,
    no_cycle_through_outside,
    numerics_preserved,
)
from fusion.engine.profile import profile_tensor, zero_tile_fraction
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType


def _brute_zero_tiles(x: np.ndarray, t: int) -> float:
    rows, cols = x.shape
    tiles = [not x[i : i + t, j : j + t].any() for i in range(0, rows, t) for j in range(0, cols, t)]
    return sum(tiles) / len(tiles)


@pytest.mark.parametrize("shape", [(32, 48), (20, 30), (5, 7)])
def test_zero_tile_fraction_matches_brute_force(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape) * (rng.random((shape[0], 1)) < 0.5) * (rng.random((1, shape[1])) < 0.6)
    assert zero_tile_fraction(x, 4) == pytest.approx(_brute_zero_tiles(x, 4))


@settings(max_examples=60, deadline=None)
@example(rows=6, cols=7, tile=4, zeros=1, block=(9, 9), seed=0)  # the 2 x 3 corner block: 6 zeros, 6 elements
@given(
    rows=st.integers(1, 40),
    cols=st.integers(1, 40),
    tile=st.integers(1, 8),
    zeros=st.integers(0, 60),
    block=st.tuples(st.integers(0, 9), st.integers(0, 9)),
    seed=st.integers(0, 2**16),
)
def test_zero_tile_fraction_is_exact_around_its_few_zeros_shortcut(
    rows: int, cols: int, tile: int, zeros: int, block: tuple[int, int], seed: int
) -> None:
    """Few zeros (the shortcut: fewer than the smallest, edge, block holds) or one whole block zeroed: the
    fraction is the brute-force one either way, including the edge block just as large as the zeros."""
    rng = np.random.default_rng(seed)
    x = rng.integers(1, 100, (rows, cols)).astype(np.int8)
    i, j = (min(b, (n - 1) // tile) * tile for b, n in zip(block, (rows, cols), strict=True))
    if zeros % 2:  # one block alone (an edge block when it is the last one: exactly as many zeros as it holds)
        x[i : i + tile, j : j + tile] = 0
    else:
        x.reshape(-1)[rng.choice(x.size, min(zeros, x.size), replace=False)] = 0
    assert zero_tile_fraction(x, tile) == pytest.approx(_brute_zero_tiles(x, tile))


def test_profile_fields_and_sparsity_class() -> None:
    dense = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    p = profile_tensor(dense, 16)
    assert p.shape == (64, 64) and p.dtype == "float32" and p.sparsity == "dense"
    assert p.min == dense.min() and p.max == dense.max() and sum(p.histogram) == dense.size
    sparse = sparse_activations((64, 128), 16, 0.75)
    q = profile_tensor(sparse, 16)
    assert q.sparsity == "sparse" and q.zero_tile_fraction == pytest.approx(0.75)
    assert 0.7 <= q.zero_fraction <= 0.9


def test_profile_samples_large_tensors_without_bias() -> None:
    x = sparse_activations((4096, 64), 16, 0.5, seed=2)
    assert profile_tensor(x, 16).zero_tile_fraction == pytest.approx(0.5)


def test_drift_detects_class_shape_and_range_changes_only() -> None:
    limits = DriftThresholds(range_ratio=2.0)
    base = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    old = {"x": profile_tensor(base, 16)}
    assert detect_drift(old, {"x": profile_tensor(base * 1.1, 16)}, limits) == ()
    assert "range" in detect_drift(old, {"x": profile_tensor(base * 5, 16)}, limits)[0].reason
    assert "shape" in detect_drift(old, {"x": profile_tensor(base[:32], 16)}, limits)[0].reason
    sparse = base.copy()
    sparse[:, :48] = 0
    assert "sparsity" in detect_drift(old, {"x": profile_tensor(sparse, 16)}, limits)[0].reason
    assert detect_drift({}, old, limits) == ()


def test_fusion_decision_combines_with_reasons() -> None:
    yes, no1, no2 = FusionDecision.yes(), FusionDecision.no("too big"), FusionDecision.no("cycle")
    assert (yes & yes) and not (yes & no1) and (yes & no1).reason == "too big"
    assert (no1 | yes) and not (no1 | no2) and (no1 | no2).reason == "too big and cycle"
    assert (no2 & no1).reason == "cycle"


def _diamond():
    """a -> b -> c and a -> c: fusing (a, c) would need b in between (a cycle through outside)."""
    b = GraphBuilder("diamond")
    x = b.input("x", (4, 8))
    a = b.op(OpType.Relu, x, name="a")
    m = b.op(OpType.Exp, a, name="b")
    b.output(b.op(OpType.Add, a, m, name="c"))
    return b.build()


def test_legality_predicates_on_a_diamond() -> None:
    g = _diamond()
    a, bnode, c = (g.node(n) for n in ("a", "b", "c"))
    assert not no_cycle_through_outside(g, [a, c])
    assert "re-enters" in no_cycle_through_outside(g, [a, c]).reason
    assert not internal_values_private(g, [a, bnode])  # a is also read by c
    assert internal_values_private(g, [bnode, c])
    assert dependencies_respected(g, [a, bnode]) and not dependencies_respected(g, [bnode, a])


def test_int8_rounding_changing_fusion_needs_the_option() -> None:
    graph = gemm_graph(residual=False)
    x = {"x": np.random.default_rng(0).standard_normal((32, 48)).astype(np.float32)}
    mc = context(graph, x, "int8")
    nodes = [graph.node(n) for n in ("mm", "add_bias")]
    assert "requantization" in numerics_preserved(mc, nodes).reason
    relaxed = type(mc)(mc.graph, mc.config, mc.dtype, mc.params, allow_rounding_change=True)
    assert numerics_preserved(relaxed, nodes)
    assert numerics_preserved(mc, [graph.node("mm")])


def test_candidates_cover_epilogues_and_chains_of_the_encoder() -> None:
    graph, _ = model("encoder_post_d64")
    found = {(c.nodes, c.family) for c in enumerate_candidates(graph)}
    assert (("node_MatMul_85", "node_linear_2", "node_relu"), "epilogue") in found
    assert (("node_add", "node_layer_norm"), "chain") in found
    assert all(len(n) == 1 for n, f in found if f == "single")


def test_constant_slab_gather_is_a_view() -> None:
    from fusion.engine.views import apply_view, is_view
    from fusion.reference.interpreter import evaluate

    graph, inputs = model("encoder_post_d64")
    env = evaluate(graph, inputs)
    gathers = [n for n in graph.nodes if n.op == OpType.Gather]
    assert gathers and all(is_view(graph, n) for n in gathers)
    for node in gathers:
        np.testing.assert_array_equal(apply_view(graph, node, env[node.inputs[0]]), env[node.outputs[0]])
    assert not is_view(graph, next(n for n in graph.nodes if n.op == OpType.Transpose))


def test_a_transpose_moving_only_size_one_axes_is_a_view() -> None:
    """ViT's (17, 1, 64) <-> (1, 17, 64): the same bytes, applied on the host like a Reshape; one that reorders
    longer axes is a kernel."""
    from fusion.engine.views import apply_view, is_view
    from fusion.graph.builder import GraphBuilder

    b = GraphBuilder("size_one_transposes")
    x = b.input("x", (17, 1, 3, 64))
    b.output(b.op(OpType.Transpose, x, perm=(1, 0, 2, 3), name="swap_one"))
    b.output(b.op(OpType.Transpose, x, perm=(2, 1, 0, 3), name="reorder"))
    graph = b.build()
    data = np.random.default_rng(0).standard_normal((17, 1, 3, 64)).astype(np.float32)
    assert is_view(graph, graph.node("swap_one")) and not is_view(graph, graph.node("reorder"))
    np.testing.assert_array_equal(apply_view(graph, graph.node("swap_one"), data), data.transpose(1, 0, 2, 3))


def test_bound_pruning_finds_the_same_best_schedule_as_building_every_one() -> None:
    """Branch and bound over GEMM schedules: the matrix-unit bound never exceeds the analytic prediction, so the
    pruned search picks the schedule an exhaustive search picks, while building fewer kernels."""
    from fusion.cost import AnalyticCostModel
    from fusion.engine.candidates import Candidate, schedules
    from fusion.engine.planner import Evaluator
    from fusion.engine.strategies import shape_bound

    graph, inputs = model("encoder_post_d64")
    mc = context(graph, inputs, "int8")
    pruned, full = Evaluator(mc, AnalyticCostModel(), {}), Evaluator(mc, AnalyticCostModel(), {})
    heads = [n.name for n in graph.nodes if n.op in (OpType.MatMul, OpType.Gemm)]
    for name in heads:
        groups = schedules(mc, Candidate((name,), "single"))
        built = [e for e in (full.evaluate(g) for g in groups) if not isinstance(e, str)]
        for e in built:
            assert shape_bound(mc, e.group) <= e.cycles
        best, _, _ = pruned.best(groups)
        exhaustive, _, _ = full.best(groups)
        assert best is not None and best.group == exhaustive.group and best.score == min(e.score for e in built)
    assert len(pruned._memo) < len(full._memo)


def test_schedules_of_one_group_are_ranked_by_their_joint_prices() -> None:
    """The planner ranks the schedules it built for one set of nodes by `CostModel.predict_group` (the learned
    model prices them together): with a model whose joint prices reverse its own one-at-a-time order, the best
    schedule is the one the joint prices favour, and asking again returns the same objects."""
    from dataclasses import replace

    from fusion.cost import AnalyticCostModel
    from fusion.engine.candidates import Candidate, schedules
    from fusion.engine.planner import Evaluator

    class Reversing(AnalyticCostModel):
        def predict_group(self, features, config):
            alone = [self.predict(f, config) for f in features]
            order = sorted(range(len(alone)), key=lambda i: alone[i].cycles)
            # certain of its prices (spread 0): the planner trusts them instead of measuring the close ones
            return [replace(alone[j], spread=0.0) for _, j in sorted(zip(order, reversed(order), strict=True))]

    graph, inputs = model("encoder_post_d64")
    mc = context(graph, inputs, "int8")
    ev = Evaluator(mc, Reversing(), {})
    channel = mc.config.dram_bytes_per_cycle
    reordered = 0
    for head in (n.name for n in graph.nodes if n.op in (OpType.MatMul, OpType.Gemm)):
        groups = schedules(mc, Candidate((head,), "single"))
        best, _, _ = ev.best(groups)
        built = [e for g in groups if (g, 0.0) in ev._memo and not isinstance(e := ev._memo[(g, 0.0)].result(), str)]
        traffic = {e.group: (e.features.dram_read_bytes + e.features.dram_write_bytes) / channel for e in built}
        ranked, _ = ev.ranked(groups)
        alone = {e.group: e.cycles for e in built}  # the memo holds the one-at-a-time prices
        joint = {e.group: e.cycles for e in ranked}
        assert sorted(joint.values()) == sorted(alone.values())  # the joint prices are the same values, reordered
        for a in ranked:  # reversed: a schedule cheaper alone is dearer jointly (schedules tied alone in any order)
            assert all(joint[a.group] >= joint[b.group] for b in ranked if alone[a.group] < alone[b.group])
        assert best is not None and best.score == min(joint[g] + ev.dram_weight * traffic[g] for g in joint)
        assert best.cycles == joint[best.group]
        assert ev.best(groups)[0] is best
        reordered += best.group != min(built, key=lambda e: e.score).group
    assert reordered > 0
