"""Measuring within a budget (`Evaluator.measured_within`): a rival is simulated only as far as it could still
win, which must change no decision. The reference is an evaluator that measures every kernel to the end."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from engine_helpers import context, model
from hypothesis import given
from hypothesis import strategies as st
from transformer_graphs import BlockShape, transformer

from fusion.cost import AnalyticCostModel, CostEstimate, KernelFeatures
from fusion.engine.execute import timing_cycles
from fusion.engine.kernel import Kernel
from fusion.engine.pairing import pairing_budget, plan_pipelines, worth_pairing
from fusion.engine.plan import Group
from fusion.engine.planner import Evaluated, Evaluator, below, plan_dynamic
from fusion.graph.ir import Graph
from simulator.config import MachineConfig


class Exact(Evaluator):
    """Every measurement simulated to the end (the planner before budgets)."""

    def measured_within(self, e: Evaluated, budget: int) -> int | None:
        cycles = self.measured_cycles(e)
        return cycles if cycles <= budget else None

    def simulated_within(self, kernel: Kernel, budget: int, checked: bool = False) -> int | None:
        return self.timed(lambda: timing_cycles(self.mc, kernel, checked))


def test_below_is_the_largest_integer_strictly_under_the_limit() -> None:
    assert [below(x) for x in (10.0, 10.5, 0.25, 0.0, -1.5)] == [9, 10, 0, -1, -2]


def test_a_kernel_is_measured_exactly_within_its_budget_and_stopped_past_it() -> None:
    mc = context(*model("resnet_block"), "int8")
    group = Group((mc.graph.nodes[0].name,), "unfused")
    exact = Exact(mc, AnalyticCostModel(), {})
    cycles = exact.measured_cycles(exact.evaluate(group))
    ev = Evaluator(mc, AnalyticCostModel(), {})
    e = ev.evaluate(group)
    budget = (ev.cycle_bound(e) + cycles) // 2  # past its lower bound (so simulated) but short of its cycles
    assert ev.cycle_bound(e) < budget < cycles
    assert ev.measured_within(e, budget) is None
    assert ev.stopped == 1  # the watchdog stopped it
    assert ev.measured_within(e, budget - 1) is None and ev.stopped == 1  # known to exceed: not simulated again
    assert ev.measurement().kernels == 1
    assert ev.measured_within(e, cycles - 1) is None
    assert ev.measured_cycles(e) == cycles  # a stopped run leaves no wrong count behind
    assert ev.measured_within(e, cycles) == cycles
    assert ev.measurement().kernels == 1


@dataclass(frozen=True)
class Liar:
    """The analytic model, sure of itself, predicting chain and baseline kernels 20x cheaper than they are: the
    plan guard's rivals win regions (`test_engine_planner`), so their measurements decide."""

    name: str = "liar"

    def predict(self, features: KernelFeatures, config: MachineConfig) -> CostEstimate:
        est = AnalyticCostModel().predict(features, config)
        scale = 0.05 if features.strategy in ("chain", "unfused") else 1.0
        return CostEstimate(est.cycles * scale, est.energy_pj, 0.0)

    def predict_group(self, features: Sequence[KernelFeatures], config: MachineConfig) -> list[CostEstimate]:
        return [self.predict(f, config) for f in features]


def _model(name: str) -> tuple[Graph, dict[str, np.ndarray]]:
    return transformer(BlockShape(seq=16, dim=32, heads=2)) if name == "block" else model(name)


@pytest.mark.parametrize(
    ("name", "dtype", "cost"),
    [
        ("resnet_block", "int8", AnalyticCostModel()),
        ("resnet_block", "fp32", AnalyticCostModel()),
        ("mlp", "int8", AnalyticCostModel()),
        ("block", "fp32", Liar()),
    ],
)
def test_budgeted_measurement_gives_the_same_plan(name: str, dtype: str, cost) -> None:
    """The dynamic plan (regret tests, plan guard, pipelined pairs) is the same with and without budgets, and
    the budgets did stop simulations (with the liar, the guard's fallbacks too)."""
    graph, inputs = _model(name)
    mc = context(graph, inputs, dtype)
    plans = []
    for kind in (Exact, Evaluator):
        ev = kind(mc, cost, {})
        plan = plan_pipelines(ev, plan_dynamic(ev))
        plans.append(((plan.choices, plan.rejected, plan.pipelined), ev.stopped, plan.measured))
    (exact, never, full), (budgeted, stopped, cut) = plans
    assert budgeted == exact
    assert never == 0 and stopped > 0
    assert (cut.regions, cut.fallbacks) == (full.regions, full.fallbacks)
    if isinstance(cost, Liar):  # the liar's plan loses regions; the guard's fallbacks are decided the same, budgeted
        assert full.fallbacks > 0


@given(st.integers(1, 10**9))
def test_the_pairing_budget_is_the_most_a_pair_worth_taking_may_take(apart: int) -> None:
    budget = pairing_budget(apart)
    assert budget < 1 or worth_pairing(apart, budget)
    assert not worth_pairing(apart, budget + 1)
