"""A conv or GEMM with the elementwise consumers its drain absorbs is never predicted cheaper than its head alone in
the same schedule (`Evaluator.head_alone`), so `Evaluator.ranked` skips generating a fused schedule whose head is
far past the best built one (`Evaluator._dominated`), and picks the schedule it would pick building them all."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from engine_helpers import context, conv_graph, gemm_graph, linear_relu_graph

from fusion.cost.analytic import AnalyticCostModel
from fusion.engine.candidates import Candidate, enumerate_candidates, schedules
from fusion.engine.legality import structurally_legal
from fusion.engine.planner import Evaluated, Evaluator

CONVS = [
    lambda: conv_graph(1, 16, 32, (10, 10), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, True)[0],
    lambda: conv_graph(1, 32, 48, (9, 9), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1, True)[0],
]
CASES = [(d, make) for d in ("fp32", "int8") for make in CONVS]
CASES += [("fp32", lambda: gemm_graph(48, 64, 80)), ("int8", lambda: linear_relu_graph(48, 64, 80))]


def _fused(mc) -> list[Candidate]:
    graph = mc.graph
    return [
        c
        for c in enumerate_candidates(graph)
        if c.family in ("conv", "epilogue") and structurally_legal(mc, [graph.node(n) for n in c.nodes], c.family)
    ]


@pytest.mark.parametrize(("dtype", "make"), CASES)
def test_a_head_alone_bounds_its_fused_groups_and_ranking_picks_the_same(dtype, make) -> None:
    skipped = _ranked(dtype, make)
    if make in CONVS:  # conv schedules far past the best are not generated
        assert skipped


def _ranked(dtype, make) -> list:
    """Rank every fused candidate of the graph after its singles, check it, and return what was skipped."""
    skipped = []
    graph = make()
    rng = np.random.default_rng(1)
    mc = context(graph, {v: rng.standard_normal(graph.types[v].shape).astype(np.float32) for v in graph.inputs}, dtype)
    everything = Evaluator(mc, AnalyticCostModel(), {}, repeats=False)
    ev = Evaluator(mc, AnalyticCostModel(), {}, repeats=False)
    cands = _fused(mc)
    assert cands, "the graph offers fused candidates"
    for cand in cands:
        ev.ranked(schedules(mc, Candidate(cand.nodes[:1], "single")))  # the planner prices the singles first
        groups = schedules(mc, cand)
        built = [e for g in groups if isinstance(e := everything.evaluate(g), Evaluated)]
        for e in built:  # the premise: never predicted cheaper than its head alone in its schedule
            head = everything.evaluate(replace(e.group, nodes=e.group.nodes[:1]))
            if isinstance(head, Evaluated):
                assert e.score >= head.score
        done, _ = ev.ranked(groups)
        assert done[0].group == min(built, key=lambda e: e.score).group
        for g in groups:  # what was skipped: past the best's score by its matrix bound, or its head far past it
            if (g, 0.0) not in ev._memo and ev.bound(g) < done[0].score:
                floor = ev.head_floor(g)
                assert floor is not None and ev._dominated(done[0], *floor)
                skipped.append(g)
    return skipped
