"""Rival candidates (`planner._uncertain_rivals`): two candidates sharing nodes are rivals to measure when the order
of their gains is uncertain. A node both hold adds its single kernel's score to both gains, so its error cannot change
that order: how uncertain the shared nodes are must not decide what is measured."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fusion.engine.candidates import Candidate
from fusion.engine.plan import Group, GroupChoice
from fusion.engine.planner import Evaluated, Scored, _guarded, _measured_gain, _uncertain_rivals


class Counting:
    """The evaluator's measuring side: measured cycles are the predicted score plus a known offset, counted; no
    priced traffic, no boundary overlap."""

    def __init__(self) -> None:
        self.measured: list[tuple[str, ...]] = []

    def measured_cycles(self, e: Evaluated) -> float:
        self.measured.append(e.group.nodes)
        return e.score + 1.0

    def measured_score(self, e: Evaluated) -> float:
        return self.measured_cycles(e)

    def measured_within(self, e: Evaluated, budget: int) -> float | None:
        cycles = self.measured_cycles(e)
        return cycles if cycles <= budget else None

    def priced_traffic(self, features: object) -> float:
        return 0.0

    def parts_overlap(self, parts: list[Evaluated]) -> float:
        return 0.0


def _evaluated(nodes: tuple[str, ...], score: float, sd: float) -> Evaluated:
    strategy = "unfused" if len(nodes) == 1 else "chain"
    return Evaluated(Group(nodes, strategy), lambda: None, None, score, 0.0, score, sd)


def _settle(shared_sd: float, own_sd: float, gains: tuple[float, float]) -> bool:
    """Candidates (a, b) and (a, b, c) with the given predicted gains: whether `_uncertain_rivals` pairs them."""
    alone = {
        "a": (_evaluated(("a",), 4000.0, shared_sd), [], ""),
        "b": (_evaluated(("b",), 3000.0, shared_sd), [], ""),
        "c": (_evaluated(("c",), 2000.0, own_sd), [], ""),
    }
    scored = []
    for nodes, gain in zip((("a", "b"), ("a", "b", "c")), gains, strict=True):
        base = sum(alone[n][0].score for n in nodes)
        fused = _evaluated(nodes, base - gain, 10.0)
        scored.append(Scored(gain, base, fused, [], Candidate(nodes, "chain"), 0.02))
    rivals = _uncertain_rivals(dict(enumerate(scored)), alone)
    assert rivals in ({}, {0: {1}, 1: {0}})  # a pair, both ways
    for s in scored:  # a measured gain is the measured scores' (+1 per part, +1 for the fused kernel) where it
        # passes its bar; below, the fused kernel's simulation stops at the budget and the gain is at most the bar
        exact, passing = s.gain + len(s.cand.nodes) - 1, 0.02 * s.base
        gain = _measured_gain(Counting(), s, alone, 0.02)[0]
        assert gain == pytest.approx(exact) if exact > passing else gain <= passing
    return bool(rivals)


def test_rivals_are_measured_when_a_node_only_one_holds_is_uncertain() -> None:
    assert _settle(shared_sd=0.0, own_sd=2000.0, gains=(1000.0, 900.0))
    assert not _settle(shared_sd=0.0, own_sd=0.0, gains=(1000.0, 900.0))


@given(
    shared=st.floats(0.0, 1e5),
    own=st.floats(0.0, 2000.0),
    gains=st.tuples(st.floats(0.0, 3000.0), st.floats(0.0, 3000.0)),
)
def test_the_nodes_both_rivals_hold_do_not_decide_what_is_measured(
    shared: float, own: float, gains: tuple[float, float]
) -> None:
    assert bool(_settle(shared, own, gains)) == bool(_settle(0.0, own, gains))


class Guarding(Counting):
    """The plan guard's side of the evaluator: the groups in `refused` cannot be built (a generator refuses them);
    every other kernel measures its predicted score (+1)."""

    mc = None

    def __init__(self, built: list[Evaluated], refused: set[Group]) -> None:
        super().__init__()
        self.built, self.refused, self.counted = {e.group: e for e in built}, refused, []

    def evaluate(self, group: Group) -> Evaluated | str:
        return "the generator refuses it" if group in self.refused else self.built[group]

    def cycle_bound(self, e: Evaluated) -> int:
        return 0

    def measured_within(self, e: Evaluated, budget: int) -> float | None:
        cycles = self.measured_cycles(e)
        return cycles if cycles <= budget else None

    def count(self, outcome: str) -> None:
        self.counted.append(outcome)


def test_a_rival_with_a_kernel_that_cannot_be_built_is_never_taken() -> None:
    """A rival region whose kernels would measure fewer cycles than dynamic's, but one of which cannot be built,
    cannot run: dynamic's choices stay (before, the refused kernel was left out of the rival's sum)."""
    fused = _evaluated(("a", "b"), 9000.0, 0.0)
    # (of a strategy without a shape bound: the guard's bounds leave both rivals to be measured)
    a, b = (Evaluated(Group((n,), "chain"), lambda: None, None, 1000.0, 0.0, 1000.0, 0.0) for n in "ab")
    mine = [GroupChoice(fused.group, fused.cycles, "dynamic")]
    rival = [GroupChoice(a.group, a.cycles, "rival"), GroupChoice(b.group, b.cycles, "rival")]
    assert _guarded(Guarding([fused, a, b], set()), mine, [rival])[0].group == a.group  # measured faster: taken
    assert _guarded(Guarding([fused, a], {b.group}), mine, [rival]) == mine
