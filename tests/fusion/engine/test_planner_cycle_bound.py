"""`bounds.cycle_bound`, the lower bound on a kernel's simulated cycles that spares the plan guard and `settle`
simulating a rival already past its budget: a bound that is not one would drop a rival that could win (a plan
change), so it is checked against the simulator on every kernel planning builds for the bundled models."""

from __future__ import annotations

import pytest
from engine_helpers import context, model

from fusion.cost import AnalyticCostModel
from fusion.engine.planner import Evaluated, Evaluator, plan_dynamic


@pytest.mark.parametrize("name", ["resnet_block", "mlp", "encoder_post_d64"])
@pytest.mark.parametrize("dtype", ["int8", "fp32"])
def test_the_cycle_bound_is_below_every_planned_kernels_cycles(name: str, dtype: str) -> None:
    mc = context(*model(name), dtype)
    ev = Evaluator(mc, AnalyticCostModel(), {})
    plan_dynamic(ev)
    built = [e for (group, _), f in ev._memo.items() if isinstance(e := f.result(), Evaluated)]
    bounded = 0
    for e in built:
        bound = ev.cycle_bound(e)
        if bound:
            bounded += 1
            assert bound <= ev.measured_cycles(e), e.group
    assert bounded >= len(built) // 2  # most kernels have a bound (views and zero-skip kernels do not)


def test_a_rival_past_its_budget_by_its_bound_is_not_simulated() -> None:
    mc = context(*model("resnet_block"), "int8")
    group = plan_dynamic(Evaluator(mc, AnalyticCostModel(), {})).choices[0].group
    ev = Evaluator(mc, AnalyticCostModel(), {})
    e = ev.evaluate(group)
    assert isinstance(e, Evaluated) and ev.cycle_bound(e) > 0, group
    assert ev.measured_within(e, ev.cycle_bound(e) - 1) is None
    assert ev.measurement().kernels == 0 and ev.stopped == 0  # nothing simulated
    cycles = ev.measured_cycles(e)
    assert ev.measured_within(e, cycles) == cycles
