"""The dynamic planner never loses: measurement by expected regret, and the plan guard against `static` and
`none` (the oracle is the simulator itself: whole plans run kernel by kernel)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from engine_helpers import context, gemm_graph
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformer_graphs import BlockShape, transformer

from fusion.cost import AnalyticCostModel, CostEstimate, KernelFeatures
from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.plan import Group
from fusion.engine.planner import REGRET_FLOOR, Evaluator, expected_regret, plan_dynamic
from fusion.engine.validation import ValidationPolicy
from simulator.config import MachineConfig


@dataclass(frozen=True)
class Skewed:
    """The analytic model with a stated spread, and optionally a lie: kernels of `favour` strategies predicted
    `factor` times their analytic cycles."""

    spread: float
    favour: tuple[str, ...] = ()
    factor: float = 1.0
    name: str = "skewed"

    def predict(self, features: KernelFeatures, config: MachineConfig) -> CostEstimate:
        est = AnalyticCostModel().predict(features, config)
        scale = self.factor if features.strategy in self.favour else 1.0
        return CostEstimate(est.cycles * scale, est.energy_pj, self.spread)

    def predict_group(self, features: Sequence[KernelFeatures], config: MachineConfig) -> list[CostEstimate]:
        return [self.predict(f, config) for f in features]


def test_expected_regret_grows_with_the_spread_and_shrinks_with_the_gap() -> None:
    assert expected_regret(100.0, 0.0, 120.0, 0.0) == 0.0  # certain and better: nothing to lose
    assert expected_regret(130.0, 0.0, 120.0, 0.0) == 10.0
    wide, narrow = expected_regret(100.0, 30.0, 110.0, 30.0), expected_regret(100.0, 3.0, 110.0, 3.0)
    assert wide > narrow > 0.0
    assert expected_regret(100.0, 10.0, 150.0, 10.0) < expected_regret(100.0, 10.0, 105.0, 10.0)


def _schedules(ev: Evaluator):
    """Two built epilogue schedules of one GEMM group, slower and faster by measurement."""
    nodes = ("mm", "add_bias", "add_res", "relu")
    built = [ev.evaluate(Group(nodes, "epilogue", panels=p)) for p in (1, 0)]
    return sorted(built, key=ev.measured_score)


def test_an_uncertain_model_measures_and_a_confident_one_does_not() -> None:
    """The favourite by prediction is the slower schedule (by measurement). A model whose stated spread makes
    the regret large measures both and takes the faster; one confident in its numbers measures nothing."""
    mc = context(gemm_graph(m=64), {}, "fp32")
    probe = Evaluator(mc, AnalyticCostModel(), {})
    faster, slower = _schedules(probe)
    assert probe.measured_score(faster) < probe.measured_score(slower)
    gap = 0.01 * slower.score
    for spread, measured in ((0.3, True), (0.0, False)):
        ev = Evaluator(mc, Skewed(spread), {})
        favourite = replace(slower, score=slower.score, sd=spread * slower.cycles)
        other = replace(faster, score=slower.score + gap, sd=spread * faster.cycles)
        regret = expected_regret(favourite.score, favourite.sd, other.score, other.sd)
        assert (regret >= REGRET_FLOOR * favourite.score) is measured
        chosen = ev.settle([favourite, other])
        assert chosen.group == (faster.group if measured else slower.group)
        assert ev.measurement().kernels == (2 if measured else 0)


def test_the_plan_guard_falls_back_where_a_lying_model_loses() -> None:
    """A model that predicts every chain and baseline kernel 20x cheaper than it is, and is sure of it (spread 0:
    no regret test measures anything), makes dynamic pick what loses; measured region by region, the guard
    takes none's or static's groups there, so the plan never loses."""
    graph, inputs = transformer(BlockShape(seq=16, dim=32, heads=2))
    liar = Skewed(0.0, favour=("chain", "unfused"), factor=0.05)
    cycles = {}
    for policy in ("none", "static", "dynamic"):
        options = EngineOptions(policy=policy, validation=ValidationPolicy("off"), workers=1)
        engine = FusionEngine(graph, "base", "fp32", options, samples=[inputs], cost_model=liar)
        cycles[policy] = engine.run(inputs).cycles
        measured = engine.plan.measured
    assert measured.regions > 0 and measured.kernels > 0 and measured.seconds > 0
    assert cycles["dynamic"] <= min(cycles["none"], cycles["static"])
    mc = context(graph, inputs, "fp32")
    unguarded = plan_dynamic(Evaluator(mc, liar, {}), guard=False)
    guarded = plan_dynamic(Evaluator(mc, liar, {}))
    assert guarded.measured.fallbacks > 0 and guarded.groups != unguarded.groups


@st.composite
def blocks(draw) -> BlockShape:
    heads = draw(st.sampled_from([1, 2, 4]))
    return BlockShape(
        batch=draw(st.sampled_from([1, 2])),
        seq=draw(st.sampled_from([8, 16, 17, 24])),
        dim=heads * draw(st.sampled_from([8, 16])),
        heads=heads,
        ffn=draw(st.sampled_from([1, 2, 4])),
        pre_norm=draw(st.booleans()),
        act=draw(st.sampled_from(["gelu", "relu"])),
    )


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks(), st.sampled_from(["fp32", "int8"]), st.integers(0, 2**16))
def test_dynamic_is_never_slower_than_static_or_none(shape: BlockShape, dtype: str, seed: int) -> None:
    graph, inputs = transformer(shape, seed)
    cycles = {}
    for policy in ("none", "static", "dynamic"):
        options = EngineOptions(policy=policy, validation=ValidationPolicy("off"), workers=1)
        cycles[policy] = FusionEngine(graph, "base", dtype, options, samples=[inputs]).run(inputs).cycles
    assert cycles["dynamic"] <= min(cycles["none"], cycles["static"]), cycles
