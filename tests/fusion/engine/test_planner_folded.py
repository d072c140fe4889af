"""A group ending in a Relu its strategy folds into the drain (`Strategy.folds_relu`) generates the program of the
group without it but for the drain's configuration fields (and a `li` or two where its bounds hit or miss the
register cache): the same operations and counts. The planner prices it from that core's program counted for its
own nodes (`Evaluator._folded`) instead of generating it, and generates it only to measure or run it (resnet18
224: a conv, or conv + Add, with and without its Relu, 45 of 210 builds)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from engine_helpers import context
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion.cost.analytic import AnalyticCostModel
from fusion.engine.execute import timing_cycles
from fusion.engine.features import kernel_features
from fusion.engine.kernel import try_build
from fusion.engine.plan import Group
from fusion.engine.planner import Evaluated, Evaluator
from fusion.engine.strategies import REGISTRY
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType
from isa.encoding import decode
from isa.table import BY_MNEMONIC

FOLDING = sorted(name for name, s in REGISTRY.items() if s.folds_relu is not None)
LI = BY_MNEMONIC["li"].opcode


def conv_add_relu(c: int, size: int, kernel: int, stride: int, residual: bool, seed: int = 0) -> Graph:
    """Conv (+ bias) (-> + x when the shapes allow) -> Relu: a resnet basic block's second half."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("block")
    x = b.input("x", (1, c, size, size))
    w = (rng.standard_normal((c, c, kernel, kernel)) / np.sqrt(c * kernel * kernel)).astype(np.float32)
    h = b.op(
        OpType.Conv,
        x,
        b.constant(w),
        b.constant(rng.standard_normal(c).astype(np.float32) * 0.1),
        name="conv",
        pads=(kernel // 2,) * 4,
        strides=(stride, stride),
        dilations=(1, 1),
        group=1,
    )
    if residual and stride == 1:
        h = b.op(OpType.Add, h, x, name="add")
    b.output(b.op(OpType.Relu, h, name="relu"))
    return b.build()


def _operations(text) -> list[int]:
    """Each word's opcode (what the folding leaves alone: only field values differ)."""
    return [decode(int(w)).spec.opcode for w in text]


def test_strategies_fold_relu() -> None:
    assert FOLDING == ["implicit_gemm", "implicit_packed"]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    c=st.sampled_from([16, 32, 64]),
    size=st.sampled_from([4, 7, 12]),
    kernel=st.sampled_from([1, 3]),
    stride=st.sampled_from([1, 2]),
    residual=st.booleans(),
    dtype=st.sampled_from(["int8", "fp32"]),
)
def test_a_folded_relu_changes_only_the_drain(c, size, kernel, stride, residual, dtype) -> None:
    graph = conv_add_relu(c, size, kernel, stride, residual, seed=c + size)
    rng = np.random.default_rng(size)
    mc = context(graph, {"x": rng.standard_normal((1, c, size, size)).astype(np.float32)}, dtype)
    nodes = tuple(n.name for n in graph.nodes)
    for strategy in FOLDING:
        folds = REGISTRY[strategy].folds_relu
        assert folds is not None
        if not folds(mc, graph.node("conv")):  # an int8 conv read only by the Add: its Relu is a vector pass
            assert dtype == "int8" and residual and stride == 1
            continue
        core, folded = try_build(mc, Group(nodes[:-1], strategy), "any"), try_build(mc, Group(nodes, strategy), "any")
        assert isinstance(core, str) == isinstance(folded, str), (strategy, core, folded)
        if isinstance(core, str):
            continue
        ops, folded_ops = _operations(core.program.text), _operations(folded.program.text)
        assert [o for o in ops if o != LI] == [o for o in folded_ops if o != LI], strategy
        assert abs(len(ops) - len(folded_ops)) <= 2, strategy
        relabelled = kernel_features(mc, replace(core, group=folded.group))
        assert replace(relabelled, instructions=0) == replace(kernel_features(mc, folded), instructions=0), strategy
        assert abs(timing_cycles(mc, core) - timing_cycles(mc, folded)) <= 2, strategy


def test_the_planner_prices_a_folded_relu_by_its_core_and_measures_its_own_program() -> None:
    graph = conv_add_relu(32, 8, 3, 1, False)
    mc = context(graph, {"x": np.ones((1, 32, 8, 8), np.float32)}, "int8")
    ev = Evaluator(mc, AnalyticCostModel(), {})
    folded = ev.evaluate(Group(("conv", "relu"), "implicit_gemm"))
    core = ev.evaluate(Group(("conv",), "implicit_gemm"))  # built for the folded group's price
    assert isinstance(folded, Evaluated) and isinstance(core, Evaluated)
    assert callable(folded.source) and not callable(core.source)  # priced, not generated
    built = try_build(mc, folded.group, "any")
    assert not isinstance(built, str)
    as_built = kernel_features(mc, built)
    assert replace(folded.features, instructions=0) == replace(as_built, instructions=0)  # as if generated
    assert abs(folded.features.instructions - as_built.instructions) <= 2
    assert ev.measured_cycles(folded) == timing_cycles(mc, built)  # measured on its own program
    assert folded.kernel.program.text == built.program.text  # generated, with its own drain, when needed


def test_a_relu_after_a_dequantizing_conv_is_generated() -> None:
    """int8, a conv read only by an Add dequantizes: its Relu is a vector pass (`Epilogue.late`), not folded."""
    graph = conv_add_relu(32, 8, 3, 1, True)
    mc = context(graph, {"x": np.ones((1, 32, 8, 8), np.float32)}, "int8")
    ev = Evaluator(mc, AnalyticCostModel(), {})
    late = ev.evaluate(Group(("conv", "add", "relu"), "implicit_gemm"))
    assert isinstance(late, Evaluated) and not callable(late.source)
