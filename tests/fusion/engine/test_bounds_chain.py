"""`bounds.chain_bound`: a conv chain's matrix-unit bound from its shapes alone must count exactly the preloads and
matmul rows its generated program issues (every band's halo rows, strided and depthwise stages, ragged last
bands, both layouts), so the planner can drop a chain that cannot pass its fusion bar without generating it; and
it bounds the simulated cycles; the planner drops only the schedules it shows cannot pass."""

from __future__ import annotations

import pytest
from engine_helpers import context
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_codegen_conv_chain import _inputs, chain_graph, chains, inverted_residuals

from bench.bench_layer_fusion import inverted_residual
from fusion.cost import AnalyticCostModel
from fusion.engine.bounds import chain_bound
from fusion.engine.candidates import Candidate, schedules
from fusion.engine.codegen.conv_chain import band_heights
from fusion.engine.execute import timing_cycles
from fusion.engine.features import kernel_features
from fusion.engine.kernel import try_build
from fusion.engine.plan import Group
from fusion.engine.planner import Evaluated, Evaluator, fusion_bar, measured_separate, within_reach
from fusion.engine.strategies import shape_bound
from simulator import timing


def _check_counts(graph, names, dtype: str, band: int, simulate: bool = False) -> None:
    mc = context(graph, _inputs(graph), dtype)
    space = band_heights(graph, mc.config, mc.qplan, [graph.node(n) for n in names])
    for rows, wide in {*space, *((min(band, r), w) for r, w in space if band)}:
        group = Group(names, "conv_chain", rows, resident_a=wide)
        kernel = try_build(mc, group)
        if isinstance(kernel, str):  # a band height that does not fit: no bound either
            assert chain_bound(mc, group) == 0.0
            continue
        feats = kernel_features(mc, kernel, 0.0)
        counted = timing.matrix_lower_bound(mc.config, feats.preloads, feats.matmul_rows)
        assert chain_bound(mc, group) == shape_bound(mc, group) == counted, (rows, wide)
        if simulate:
            assert counted <= timing_cycles(mc, kernel)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=chains(), band=st.sampled_from([0, 1, 2, 3]))
def test_the_bound_counts_what_a_random_chain_issues(dtype: str, case: tuple, band: int) -> None:
    c, hw, layers = case
    graph, names = chain_graph(c, hw, layers)
    _check_counts(graph, names, dtype, band)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=inverted_residuals(), band=st.sampled_from([0, 1, 2]))
def test_the_bound_counts_what_an_inverted_residual_issues(dtype: str, case: tuple, band: int) -> None:
    """Depthwise stages (one block per Cout tile), vertically strided ones (a run per output row), the Clips."""
    c, hw, expand, cout, stride, relu6, k, gain = case
    graph, names = inverted_residual(c, hw, expand, cout, stride, relu6=relu6, dw_kernel=k, gain=gain)
    _check_counts(graph, names, dtype, band)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_resnet_block_and_a_batch_are_bounded_by_their_simulation(dtype: str) -> None:
    graph, names = chain_graph(32, (12, 12), [(32, 3, 1, True), (32, 3, 1, False)], residual=True, batch=2)
    _check_counts(graph, names, dtype, 3, simulate=True)
    graph, names = chain_graph(16, (11, 9), [(24, 3, 2, True), (40, 1, 1, False)])
    _check_counts(graph, names, dtype, 2, simulate=True)


@pytest.mark.parametrize("threshold", [0.02, 0.3])
def test_the_planner_drops_only_chain_schedules_that_cannot_pass(threshold: float) -> None:
    """`planner.within_reach` on a chain of three 3x3 Convs: every schedule it drops, built and simulated anyway,
    saves at most its bar (predicted and measured, as `fusion_gain` and `plan_dynamic` judge it). Besides the
    planner's schedules, bands of one output row: each recomputes four halo rows of the first conv and two of the
    second (~3x the rows streamed), which no bar lets pass, so some schedule is always dropped (the check has
    something to check)."""
    graph, names = chain_graph(32, (12, 12), [(32, 3, 1, True), (32, 3, 1, True), (32, 3, 1, False)])
    mc = context(graph, _inputs(graph), "int8")
    ev = Evaluator(mc, AnalyticCostModel(), {})
    parts = [ev.best(schedules(mc, Candidate((n,), "single")))[0] for n in names]
    narrow = [Group(names, "conv_chain", 1, resident_a=wide) for wide in (False, True)]
    groups = schedules(mc, Candidate(names, "conv_chain")) + narrow
    kept = within_reach(ev, groups, parts, threshold)
    dropped = [g for g in groups if g not in kept]
    assert set(kept) <= set(groups) and dropped
    share = sum(p.score for p in parts)
    separate, apart = measured_separate(ev, parts)
    for group in dropped:
        fused = ev.evaluate(group)
        assert isinstance(fused, Evaluated)
        assert share - fused.score <= threshold * share  # the prediction does not pass
        cycles = ev.measured_cycles(fused)
        bar = fusion_bar(threshold, cycles <= apart)
        assert separate - cycles - ev.priced_traffic(fused.features) <= bar * share  # nor the measurement
