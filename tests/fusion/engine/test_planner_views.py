"""A group ending in views (`planner.trailing_views`: a Reshape of an output no other node of the group reads) stores
its views' input bytes, so it generates the program of the group without them: the planner prices it from that
core's features and times it by the core's program (`Evaluator._viewless`) instead of generating it again (side by
side Q/K/V projections taking K's head Reshape along, or not)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from engine_helpers import context
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion.cost.analytic import AnalyticCostModel
from fusion.engine.features import kernel_features
from fusion.engine.kernel import build_kernel
from fusion.engine.plan import Group
from fusion.engine.planner import Evaluated, Evaluator, trailing_views
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType


def projections(m: int, k: int, n: int, d: int, seed: int = 0) -> Graph:
    """x (1, m, k) times two weights: p0's output viewed per head (Reshape only), p1's split into heads
    (Reshape + Transpose); a third output viewed from the input side (a Reshape no group node computes)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("projections")
    x = b.input("x", (1, m, k))
    p0 = b.op(OpType.MatMul, x, b.constant(rng.standard_normal((k, n)).astype(np.float32)), name="p0")
    b.output(b.op(OpType.Reshape, p0, shape=(1, m, n // d, d), name="view0"))
    p1 = b.op(OpType.MatMul, x, b.constant(rng.standard_normal((k, n)).astype(np.float32)), name="p1")
    split = b.op(OpType.Reshape, p1, shape=(1, m, n // d, d), name="split1")
    b.output(b.op(OpType.Transpose, split, perm=(0, 2, 1, 3), name="heads1"))
    return b.build()


def test_only_views_of_what_the_group_computes_that_it_reads_no_further_trail() -> None:
    graph = projections(4, 8, 32, 16)
    assert trailing_views(graph, ("p0", "view0", "p1")) == {"view0"}
    assert trailing_views(graph, ("p0", "p1", "split1", "heads1")) == set()  # split1 is read by heads1
    assert trailing_views(graph, ("p0", "view0", "p1", "split1", "heads1")) == {"view0"}
    b = GraphBuilder("input_view")
    x = b.input("x", (4, 8))
    flat = b.op(OpType.Reshape, x, shape=(2, 16), name="flat")  # a view of the input, not of a computed value
    b.output(b.op(OpType.Relu, flat, name="relu"))
    assert trailing_views(b.build(), ("flat", "relu")) == set()


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 40),
    k=st.integers(1, 48),
    n=st.sampled_from([16, 32, 64]),
    panels=st.sampled_from([2, 0]),
    dtype=st.sampled_from(["fp32", "int8"]),
)
def test_a_group_and_it_with_its_trailing_views_generate_one_program(m, k, n, panels, dtype) -> None:
    graph = projections(m, k, n, 16, seed=m * k)
    mc = context(graph, {"x": np.random.default_rng(m).standard_normal((1, m, k)).astype(np.float32)}, dtype)
    for core in (("p0", "p1"), ("p0", "p1", "split1", "heads1")):
        viewed = tuple(n for n in ("p0", "view0", "p1", "split1", "heads1") if n in {*core, "view0"})
        a = build_kernel(mc, Group(core, "siblings", panels=panels))
        b = build_kernel(mc, Group(viewed, "siblings", panels=panels))
        assert a.program.text == b.program.text and a.program.data == b.program.data
        fa, fb = kernel_features(mc, a, 0.0), kernel_features(mc, b, 0.0)
        assert replace(fa, ops=(), shapes=()) == replace(fb, ops=(), shapes=())  # the group's own ops and shapes


def _planner(repeats: bool) -> tuple[Evaluator, Evaluated, Evaluated]:
    graph = projections(24, 32, 32, 16)
    mc = context(graph, {"x": np.ones((1, 24, 32), np.float32)}, "int8")
    ev = Evaluator(mc, AnalyticCostModel(), {}, repeats=repeats)
    core = ev.evaluate(Group(("p0", "p1"), "siblings", panels=2))
    viewed = ev.evaluate(Group(("p0", "view0", "p1"), "siblings", panels=2))
    assert isinstance(core, Evaluated) and isinstance(viewed, Evaluated)
    return ev, core, viewed


def test_the_planner_prices_and_times_a_view_variant_by_its_core_without_generating_it() -> None:
    ev, core, viewed = _planner(repeats=True)
    assert callable(viewed.source)  # priced, not generated
    assert viewed.features == kernel_features(ev.mc, build_kernel(ev.mc, viewed.group), 0.0)  # as if generated
    assert ev.measured_cycles(viewed) == ev.measured_cycles(core)
    assert ev.measurement().kernels == 1  # one program, one simulation
    assert viewed.kernel.program.text == core.kernel.program.text  # generated when its program is needed
    ev, core, viewed = _planner(repeats=False)  # no sharing: each generated and timed by its own program
    assert not callable(viewed.source) and ev.measured_cycles(viewed) == ev.measured_cycles(core)
