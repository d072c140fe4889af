"""A fused kernel's core (`planner._core_spread`): the parts of its own strategy and schedule (a conv alone, against
the conv with the Relu its drain absorbs) share its loop nest, so the model's error on them cancels in the gain and
only the rest decides whether `fusion_gain` measures and `_uncertain_rivals` pairs them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_planner_rivals import Counting as RivalCounting

from fusion.engine.candidates import Candidate
from fusion.engine.plan import Group
from fusion.engine.planner import REGRET_FLOOR, Evaluated, Scored, _uncertain_rivals, fusion_gain

SPREAD = 0.10  # the conv's relative spread


class Counting(RivalCounting):
    """The evaluator's measuring side (`test_planner_rivals.Counting`: measured = predicted + 1, counted, no priced
    traffic nor boundary overlap), measuring within budgets."""

    def measured_within(self, e: Evaluated, budget: int) -> float | None:
        self.budgets.append(budget)
        score = self.measured_score(e)
        return score if score <= budget else None

    def __init__(self) -> None:
        super().__init__()
        self.budgets: list[int] = []


def _evaluated(nodes: tuple[str, ...], strategy: str, cycles: float, sd: float) -> Evaluated:
    return Evaluated(Group(nodes, strategy), lambda: None, None, cycles, 0.0, cycles, sd)


def _gain(fused_strategy: str, extra: float, relu_sd: float) -> list[tuple[str, ...]]:
    """conv + relu fused (`extra` cycles over the conv alone) against the conv (500k cycles) and a 10k-cycle relu
    alone: what `fusion_gain` measured (threshold 0: fuse whenever it saves)."""
    conv = _evaluated(("conv",), "implicit_gemm", 500_000.0, SPREAD * 500_000)
    relu = _evaluated(("relu",), "unfused", 10_000.0, relu_sd)
    cycles = 500_000.0 + extra
    fused = _evaluated(("conv", "relu"), fused_strategy, cycles, SPREAD * cycles)
    ev = Counting()
    gain, _ = fusion_gain(ev, fused, [conv, relu], 0.0)
    assert gain == pytest.approx(10_000.0 - extra + (1.0 if ev.measured else 0.0), abs=1e-6)  # measured: +1 cycle
    return ev.measured


def test_the_core_error_cancels_in_the_gain() -> None:
    # the same strategy: only the relu alone and the 100 extra cycles are uncertain -> trusted
    assert not _gain("implicit_gemm", 100.0, relu_sd=1500.0)
    # another strategy: the fused kernel's 50k-cycle spread against the conv's -> measured
    assert _gain("implicit_packed", 100.0, relu_sd=1500.0) == [("conv",), ("relu",), ("conv", "relu")]
    # the part outside the core is what is uncertain -> measured
    assert _gain("implicit_gemm", 100.0, relu_sd=40_000.0)


def test_a_fused_kernel_is_simulated_only_as_far_as_it_could_pass_the_threshold() -> None:
    """conv + relu measured (another strategy) 20k cycles slower than the conv and relu apart (510,002 measured):
    simulated under a budget of the separate cycles less the bar of a measured gain that saves cycles too
    (REGRET_FLOOR, under the threshold), and rejected whatever it measures."""
    conv = _evaluated(("conv",), "implicit_gemm", 500_000.0, SPREAD * 500_000)
    relu = _evaluated(("relu",), "unfused", 10_000.0, 1500.0)
    fused = _evaluated(("conv", "relu"), "implicit_packed", 530_000.0, SPREAD * 530_000)
    ev = Counting()
    gain, bar = fusion_gain(ev, fused, [conv, relu], 0.01)
    assert ev.budgets == [510_002 - 2_550]  # the whole cycles below it, + 1 for float rounding
    assert gain <= bar * 510_000.0


@given(extra=st.floats(0.0, 9_000.0), relu_sd=st.floats(0.0, 20_000.0))
def test_a_shared_core_is_measured_only_when_the_rest_is_uncertain(extra: float, relu_sd: float) -> None:
    """Measured exactly when the regret of the decision, from the relu's spread and the fused kernel's relative
    spread on its extra cycles alone, reaches REGRET_FLOOR of the separate score (an independent oracle: the
    normal loss integral evaluated numerically)."""
    import numpy as np

    mu, sd = 500_000.0 + extra - 510_000.0, float(np.hypot(SPREAD * extra, relu_sd))  # fused - separate (< 0)
    if sd < 1e-6:  # no spread (to a cycle's millionth): the loss is known
        regret = max(0.0, mu)
    else:
        x = np.linspace(mu - 12 * sd, mu + 12 * sd, 200_001)
        density = np.exp(-((x - mu) ** 2) / (2 * sd * sd)) / (sd * np.sqrt(2 * np.pi))
        regret = float(np.sum(np.maximum(x, 0.0) * density) * (x[1] - x[0]))
    floor = REGRET_FLOOR * 510_000.0
    if abs(regret - floor) > 1e-3 * floor:  # away from the boundary's quadrature error
        assert bool(_gain("implicit_gemm", extra, relu_sd)) == (regret >= floor)


def _rivals(extra: float, relu_sd: float, strategies: tuple[str, str]) -> bool:
    """conv + add and conv + add + relu (the latter `extra` cycles slower), of these strategies, as rivals: whether
    `_uncertain_rivals` pairs them (to measure)."""
    alone = {
        "conv": (_evaluated(("conv",), "unfused", 600_000.0, 90_000.0), [], ""),
        "add": (_evaluated(("add",), "unfused", 20_000.0, 3_000.0), [], ""),
        "relu": (_evaluated(("relu",), "unfused", 10_000.0, relu_sd), [], ""),
    }
    scored = []
    rivals = ((("conv", "add"), 500_000.0), (("conv", "add", "relu"), 500_000.0 + extra))
    for (nodes, cycles), strategy in zip(rivals, strategies, strict=True):
        base = sum(alone[n][0].score for n in nodes)
        fused = _evaluated(nodes, strategy, cycles, SPREAD * cycles)
        scored.append(Scored(base - cycles, base, fused, [], Candidate(nodes, "conv"), 0.02))
    return bool(_uncertain_rivals(dict(enumerate(scored)), alone))


def test_nested_rivals_of_one_schedule_share_their_core() -> None:
    same, other = ("implicit_gemm", "implicit_gemm"), ("implicit_gemm", "implicit_packed")
    assert not _rivals(200.0, 1_000.0, same)  # 9.8k cycles apart, 1k uncertain: the order is sure
    assert _rivals(200.0, 1_000.0, other)  # two loop nests: each fused kernel's 50k-cycle spread -> measured
    assert _rivals(200.0, 20_000.0, same)  # the relu alone is what is uncertain -> measured
