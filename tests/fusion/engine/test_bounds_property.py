"""`bounds.cycle_bound` (from a built kernel's program) and the strategies' shape bounds (`strategies.shape_bound`,
from shapes alone) against the simulator over generated kernels: every schedule of every candidate of small
resnet-like conv blocks, GEMM epilogues and memory-bound elementwise graphs, int8 and fp32. A bound above a
kernel's simulated cycles would let the plan guard or `settle` drop a rival that could win, and a shape bound
above its predicted cycles would let branch and bound skip a schedule the model prefers, so both must hold on
every kernel; and they must be tight enough to matter: on each kind some kernel is within 1.3x of its bound (an
inflated bound fails the property on it). Each kernel simulated with its own cycles as its budget runs to its end:
the simulator's bound on what a run still needs (`simulator.remaining`) holds on the generators' loops."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import context
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion.cost.analytic import AnalyticCostModel
from fusion.engine.bounds import cycle_bound
from fusion.engine.candidates import enumerate_candidates, schedules
from fusion.engine.context import ModelContext
from fusion.engine.execute import timing_cycles
from fusion.engine.features import kernel_features
from fusion.engine.kernel import try_build
from fusion.engine.legality import structurally_legal
from fusion.engine.strategies import shape_bound
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType

TIGHT = 1.3  # on each kind, some kernel's cycles are below TIGHT x its bound
SHAPE_TIGHT = 1.4  # the same for a conv schedule's shape bound (it cannot see the tiling the generator picks)


def conv_block(
    c: int, cout: int, size: int, kernel: int, stride: int, residual: bool, seed: int = 0, depthwise: bool = False
) -> Graph:
    """Conv (+ bias) -> Relu (-> + x -> Relu when the shapes allow): a resnet basic block's first half; depthwise:
    one channel a group (Cout = C, as MobileNet's)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("block")
    x = b.input("x", (1, c, size, size))
    cout = c if depthwise else cout
    cg = 1 if depthwise else c
    w = (rng.standard_normal((cout, cg, kernel, kernel)) / np.sqrt(cg * kernel * kernel)).astype(np.float32)
    pad = kernel // 2
    h = b.op(
        OpType.Conv,
        x,
        b.constant(w),
        b.constant(rng.standard_normal(cout).astype(np.float32) * 0.1),
        name="conv",
        pads=(pad,) * 4,
        strides=(stride, stride),
        dilations=(1, 1),
        group=c if depthwise else 1,
    )
    h = b.op(OpType.Relu, h, name="relu")
    if residual and c == cout and stride == 1:
        h = b.op(OpType.Relu, b.op(OpType.Add, h, x, name="add"), name="relu2")
    b.output(h)
    return b.build()


def gemm_block(m: int, k: int, n: int, seed: int = 0) -> Graph:
    rng = np.random.default_rng(seed)
    b = GraphBuilder("gemm")
    x = b.input("x", (m, k))
    h = b.op(OpType.MatMul, x, b.constant((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)), name="mm")
    h = b.op(OpType.Add, h, b.constant(rng.standard_normal(n).astype(np.float32)), name="bias")
    b.output(b.op(OpType.Relu, h, name="relu"))
    return b.build()


def elementwise(shape: tuple[int, ...]) -> Graph:
    """x + y -> Relu: pure DRAM traffic and vector passes."""
    b = GraphBuilder("eltwise")
    x, y = b.input("x", shape), b.input("y", shape)
    b.output(b.op(OpType.Relu, b.op(OpType.Add, x, y, name="add"), name="relu"))
    return b.build()


Bounded = tuple[str, int, float, float, int]  # schedule, cycle_bound, shape bound, predicted and simulated cycles


def kernels(graph: Graph, dtype: str) -> list[Bounded]:
    """The bounds, predicted and simulated cycles of every buildable kernel without zero tests of every
    candidate."""
    rng = np.random.default_rng(1)
    inputs = {v: rng.standard_normal(graph.types[v].shape).astype(np.float32) for v in graph.inputs}
    mc: ModelContext = context(graph, inputs, dtype)
    out = []
    for cand in enumerate_candidates(graph):
        if not structurally_legal(mc, [graph.node(n) for n in cand.nodes], cand.family):
            continue
        for group in schedules(mc, cand):
            built = try_build(mc, group, "any")
            if isinstance(built, str) or built.program is None:
                continue
            feats = kernel_features(mc, built)
            if feats.zero_tests:
                continue
            name = f"{'+'.join(group.nodes)} {group.schedule}"
            predicted = AnalyticCostModel().predict(feats, mc.config).cycles
            cycles = timing_cycles(mc, built)
            # within its budget, never stopped (the watchdog's `simulator.remaining` bound holds on its loops)
            assert timing_cycles(mc, built, max_cycles=cycles) == cycles, name
            out.append((name, cycle_bound(mc, feats), shape_bound(mc, group), predicted, cycles))
    return out


def _check(graph: Graph, dtype: str) -> None:
    found = kernels(graph, dtype)
    assert found
    for schedule, bound, shape, predicted, cycles in found:
        assert 0 < bound <= cycles, (schedule, bound, cycles)
        assert shape <= min(predicted, cycles), (schedule, shape, predicted, cycles)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    c=st.sampled_from([3, 8, 16, 32, 64]),
    cout=st.sampled_from([16, 32, 64]),
    size=st.sampled_from([4, 7, 8, 14, 19]),
    kernel=st.sampled_from([1, 3, 7]),
    stride=st.sampled_from([1, 2]),
    residual=st.booleans(),
    dtype=st.sampled_from(["int8", "fp32"]),
    depthwise=st.booleans(),
)
def test_the_bound_holds_on_conv_blocks(c, cout, size, kernel, stride, residual, dtype, depthwise) -> None:
    _check(conv_block(c, cout, size, kernel, stride, residual, depthwise=depthwise), dtype)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.sampled_from([1, 16, 49, 100, 128]),
    k=st.sampled_from([16, 64, 100, 256]),
    n=st.sampled_from([16, 40, 64, 128]),
    dtype=st.sampled_from(["int8", "fp32"]),
)
def test_the_bound_holds_on_gemm_epilogues(m, k, n, dtype) -> None:
    _check(gemm_block(m, k, n), dtype)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=st.sampled_from([(1, 64, 56, 56), (1, 128, 28, 28), (1, 512, 7, 7), (7, 33), (1, 3, 17, 5), (4096,)]),
    dtype=st.sampled_from(["int8", "fp32"]),
)
def test_the_bound_holds_on_elementwise_kernels(shape, dtype) -> None:
    _check(elementwise(shape), dtype)


@pytest.mark.parametrize(
    ("graph", "head"),
    [
        (conv_block(64, 64, 14, 3, 1, True), "conv"),
        (gemm_block(128, 256, 128), "mm"),
        (elementwise((1, 64, 56, 56)), ""),
    ],
    ids=["conv", "gemm", "elementwise"],
)
def test_the_bound_is_tight_on_each_kind(graph: Graph, head: str) -> None:
    """Some kernel of each kind (led by `head`) is within TIGHT of its bound, so a bound inflated by TIGHT fails
    the property on it."""
    found = [k for dtype in ("int8", "fp32") for k in kernels(graph, dtype) if k[0].startswith(head)]
    assert max(bound / cycles for _, bound, _, _, cycles in found) > 1 / TIGHT, found


@pytest.mark.parametrize("strategy", ["unfused", "implicit_gemm", "implicit_packed", "implicit_stationary"])
def test_the_shape_bounds_of_conv_schedules_are_tight(strategy: str) -> None:
    """Each conv schedule's shape bound is within SHAPE_TIGHT of the simulated cycles of some kernel of it (resnet
    3x3 convs, where the matrix unit's work dominates: on small ones the layout passes do), so an inflated one
    fails the property."""
    graphs = [conv_block(128, 128, 14, 3, 1, False), conv_block(256, 256, 4, 3, 1, False)]
    found = [
        (name, shape, cycles)
        for graph in graphs
        for dtype in ("int8", "fp32")
        for name, _, shape, _, cycles in kernels(graph, dtype)
        if name.endswith(f" {strategy}") and name.startswith("conv ")
    ]
    assert found and max(shape / cycles for _, shape, cycles in found) > 1 / SHAPE_TIGHT, found
