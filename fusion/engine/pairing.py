"""The planner's complementarity pass: which consecutive groups of a plan run as one pipelined program.

A memory-bound group next to a compute-bound one is the pair whose overlap can pay: the consumer's DMAs run
while the producer's matrix or vector unit works (or the other way round), where two memory-bound kernels would
only queue on the same DMA units. Bound = the cost model's per-unit busy time (`unit_times`): memory when the
busiest DMA unit (or the channel) outworks the matrix and vector units; a producer of a single step (`serial`)
pairs with a consumer of either bound. Each such adjacent pair (the producer's output flowing into the consumer)
is built with `build_pipelined` and measured on the
simulator on zero inputs: kernel timing does not depend on the values (zero-skip kernels, which test data at
issue, are never pipelined), so planning needs no live data. The pair is taken when it saves at least
REGRET_FLOOR of the two kernels' measured cycles (`worth_pairing`) and its run in checked mode finds no race (the
checker is run only then: it costs 3-12x a plain simulation); a group joins at most one pair (the disjoint pairs
saving the most cycles in total). At dispatch the pair
runs only when the dispatch table keeps the producer's planned kernel (a switch to a zero-skip variant runs them
apart); a consumer with a dispatch table is not paired (its operand is the producer's output).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import replace

from fusion.cost.analytic import unit_times
from fusion.cost.interface import KernelFeatures
from fusion.engine.errors import CodegenError
from fusion.engine.execute import timing_cycles
from fusion.engine.pipelined import build_pipelined
from fusion.engine.plan import Group, GroupChoice, PipelinedPair, Plan
from fusion.engine.planner import REGRET_FLOOR, Evaluated, Evaluator
from fusion.engine.strategies import strategy_of
from fusion.lower.errors import LoweringError
from simulator.config import MachineConfig
from simulator.errors import SimulatorTrap


def bound(features: KernelFeatures, cfg: MachineConfig) -> str:
    """'memory' when a DMA unit or the DRAM channel is the kernel's busiest unit, else 'compute'."""
    t = unit_times(features, cfg)
    return "memory" if max(t.load, t.store, t.transfer) >= max(t.matrix, t.vector) else "compute"


def serial(features: KernelFeatures) -> bool:
    """A producer of one step runs its load, compute and store in series: its load unit idles while it computes
    and stores, which the consumer's independent loads fill whatever either kernel's bound (a small RMSNorm chain
    before llama's Q/K/V + rotary GEMM, both memory-bound: 1119 + 5811 cycles apart, 6467 paired)."""
    return features.steps <= 1


def plan_pipelines(ev: Evaluator, plan: Plan, region: Collection[str] | None = None, kept: Sequence = ()) -> Plan:
    """The plan with its pipelined pairs (see the module docstring). Local re-planning passes the re-planned
    `region`: only pairs inside it are considered (no kept group is priced again) and the `kept` pairs outside it
    stay."""
    choices = plan.choices
    inside = (lambda c: True) if region is None else (lambda c: set(c.group.nodes) <= set(region))
    outcomes: dict[tuple, PipelinedPair | str | None] = {}  # by `Evaluator.pair_key`: a repeated layer's pairs
    considered = [
        (i, _consider(ev, choices[i], choices[i + 1], outcomes))
        for i in range(len(choices) - 1)
        if inside(choices[i]) and inside(choices[i + 1])
    ]
    found = {i: pair for i, (pair, _) in considered if isinstance(pair, PipelinedPair)}
    simulated = sum(1 for _, (_, fresh) in considered if fresh)
    outside = tuple(p for p in kept if region is not None and region.isdisjoint((*p.producer.nodes, *p.consumer.nodes)))
    pairs = outside + best_pairs(found, len(choices))
    return Plan(plan.policy, plan.choices, plan.rejected, pairs, ev.measurement(pairs=simulated))


def best_pairs(found: dict[int, PipelinedPair], n: int) -> tuple[PipelinedPair, ...]:
    """The disjoint adjacent pairs (pair i joins groups i and i + 1) saving the most cycles in total."""
    best: list[tuple[int, tuple[PipelinedPair, ...]]] = [(0, ())] * (n + 2)
    for i in range(n - 1, -1, -1):
        best[i] = best[i + 1]
        if i in found:
            p = found[i]
            gain = best[i + 2][0] + p.separate_cycles - p.pipelined_cycles
            if gain > best[i][0]:
                best[i] = (gain, (p, *best[i + 2][1]))
    return best[0][1]


def _consider(
    ev: Evaluator, a: GroupChoice, b: GroupChoice, outcomes: dict[tuple, PipelinedPair | str | None]
) -> tuple[PipelinedPair | str | None, bool]:
    """The pair when it beats its two kernels, "slower" when it does not, None when it was not simulated (not
    complementary, or refused); and whether it was simulated now. A pair of the structure of one considered
    before (`Evaluator.pair_key`, in `outcomes`) has its outcome, and is neither built nor simulated."""
    if strategy_of(a.group).host_view or strategy_of(b.group).host_view or b.zero_skip is not None:
        return None, False  # a consumer's dispatch table reads the producer's output: unknown before the pair runs
    ea, eb = ev.evaluate(a.group), ev.evaluate(b.group)
    if isinstance(ea, str) or isinstance(eb, str):
        return None, False
    kinds = (bound(ea.features, ev.mc.config), bound(eb.features, ev.mc.config))
    if kinds[0] == kinds[1] and not serial(ea.features):
        return None, False
    key = ev.pair_key(a.group, b.group)
    if key in outcomes:
        known = outcomes[key]
        if isinstance(known, PipelinedPair):
            known = replace(known, producer=a.group, consumer=b.group)
        return known, False
    outcome = _measure(ev, a.group, b.group, ea, eb, kinds)
    if key is not None:
        outcomes[key] = outcome
    return outcome, outcome is not None


def _measure(
    ev: Evaluator, a: Group, b: Group, ea: Evaluated, eb: Evaluated, kinds: tuple[str, str]
) -> PipelinedPair | str | None:
    """The complementary pair built and simulated: as `_consider`."""
    try:
        kernel = build_pipelined(ev.mc, a, b)
    except (CodegenError, LoweringError):
        return None
    apart = ev.measured_cycles(ea) + ev.measured_cycles(eb)
    try:  # simulated only as far as it could still be worth pairing
        together = ev.simulated_within(kernel, max(1, pairing_budget(apart) + 1))  # + 1: rounding, checked below
    except SimulatorTrap:
        return None
    if together is None or not worth_pairing(apart, together):
        return "slower"
    try:  # the race check (several times a plain simulation) only for a pair worth taking
        together = ev.timed(lambda: timing_cycles(ev.mc, kernel, checked=True))
    except SimulatorTrap:
        return None
    return PipelinedPair(a, b, kinds, apart, together) if worth_pairing(apart, together) else "slower"


def pairing_budget(apart: int) -> int:
    """The most cycles a pair may take and still be worth taking (`worth_pairing`) against `apart`."""
    return math.floor(apart - max(1.0, REGRET_FLOOR * apart))


def worth_pairing(apart: int, together: int) -> bool:
    """A pair is taken when it saves at least REGRET_FLOOR of its two kernels' cycles: a smaller saving is below
    the stake at which the planner measures any of its decisions (`planner.REGRET_FLOOR`), and proving the pair
    race-free costs a checked simulation of both groups, 3-12x a plain one (resnet18 at 224x224 int8: eight conv
    -> residual pairs saved 100-200 cycles of ~700k each, for 12% of its planning time)."""
    return apart - together >= max(1.0, REGRET_FLOOR * apart)
