"""The engine's two execution models of a call: host-dispatched kernels (launches priced) or one program.

`EngineOptions(execution="program")`: the call's plan is linked into one program (`program.link_plan`, kept per
calibration state and plan, so calls between re-plans rerun the same binary), with on-chip dispatch between each
group's dense and zero-skip variants (break-even from the engine's cost model), and simulated once. Guards and
shadow validation keep working per kernel: each kernel's outputs in the program (every value has its own DRAM
bytes) are compared with its group's nodes run unfused on the program's own inputs of that kernel; a failing
kernel is evicted, its signature blocked and the event logged as in host mode, and the program is linked again
with that group replaced by its unfused kernels (at most once per group). The host path stays for comparison.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from fusion.engine.context import ModelContext
from fusion.engine.errors import EngineError
from fusion.engine.execute import KernelRun, to_real
from fusion.engine.overlap import BoundaryOverlap, Priced
from fusion.engine.plan import Group, GroupChoice, baseline_group
from fusion.engine.program import (
    Boundary,
    LinkedProgram,
    Prefer,
    ProgramKernel,
    ProgramRun,
    data_class_of,
    kernel_at,
    link_plan,
    model_prefers,
)
from fusion.engine.program import run_program as simulate_program
from fusion.engine.strategies import strategy_of
from fusion.engine.validation import compare
from fusion.engine.views import is_view
from fusion.graph.ir import Graph
from simulator.errors import SimulatorTrap

if TYPE_CHECKING:
    from fusion.engine.engine import CallResult, FusionEngine, KernelRecord, _Call

EXECUTIONS = ("host", "program")


@dataclass(frozen=True)
class ProgramCall:
    """What one program run of a call did (`CallResult.program`)."""

    cycles: int  # the whole program, one launch
    boundaries: tuple[Boundary, ...]
    # (group nodes, the strategy of the variant that ran, zero-tile threshold, tiles)
    decisions: tuple[tuple[tuple[str, ...], str, int, int], ...]
    dispatch_cycles: int  # the on-chip measurements' cycles (inside `cycles`)
    replaced: tuple[tuple[str, ...], ...]  # groups run as unfused kernels after a failed validation
    driver_cycles: int = 0  # `cycles` outside the plan's kernels (the dispatch code, the final halt)


def planning_overlap(mc: ModelContext, execution: str) -> Callable[[Sequence[Priced]], float] | None:
    """What the planner prices at kernel boundaries (`Evaluator(overlap=)`): the predicted overlap of separate
    kernels (`overlap.BoundaryOverlap.chain`) when the plan runs as one program; nothing when each kernel is
    launched on its own and ends in a fence."""
    return BoundaryOverlap(mc).chain if execution == "program" else None


def host_launches(graph: Graph, records: Sequence[KernelRecord]) -> int:
    """Kernels a host-dispatched call launched: one per simulated program (a view runs on the host, launches
    nothing; a fallback launches each of its non-view nodes' kernels)."""
    total = 0
    for r in records:
        if r.fallback:
            total += sum(not is_view(graph, graph.node(n)) for n in r.nodes)
        else:
            total += r.measured_cycles > 0
    return total


def run_as_program(
    engine: FusionEngine, c: _Call, inputs: Mapping[str, np.ndarray], drifts: tuple, replanned: tuple
) -> CallResult:
    """One call in program mode (module docstring)."""
    from fusion.engine.engine import CallResult  # (engine imports this module: the cycle is broken here)

    start = time.perf_counter()
    mc = c.state.mc
    replaced: dict[tuple[str, ...], str] = {}
    for _ in range(len(c.plan.choices) + 1):
        choices = _with_fallbacks(engine, c, replaced)
        linked = _linked(engine, c, choices)
        run = _run_checked(engine, c, linked, inputs)
        if not isinstance(run, ProgramRun):
            replaced.update(run)
            continue
        failures, validated = _validate(engine, c, linked, run, inputs)
        if not failures:
            break
        replaced.update(failures)
    else:
        raise EngineError(f"the program still fails after replacing {len(replaced)} groups by unfused kernels")
    records = _records(engine, c, linked, run, replaced, validated)
    call = ProgramCall(
        run.cycles,
        linked.boundaries,
        tuple(
            (d.dense_group.nodes, variant.strategy, d.threshold, d.tiles)
            for d in linked.dispatches
            for i, variant in run.decisions
            if i == d.index
        ),
        run.dispatch_cycles,
        tuple(replaced),
        run.cycles - sum(run.kernel_cycles[k.name] for k in linked.kernels),
    )
    outputs = {v: to_real(mc, v, run.outputs[v]) for v in engine.graph.outputs}
    seconds = time.perf_counter() - start
    return CallResult(outputs, tuple(records), drifts, replanned, seconds, mc.params, mc.config.launch_cycles, call)


def _with_fallbacks(engine: FusionEngine, c: _Call, replaced: Mapping[tuple[str, ...], str]) -> tuple:
    """The plan's choices, each blocked or failed group as its nodes' unfused kernels."""
    out: list[GroupChoice] = []
    for choice in c.plan.choices:
        group = choice.group
        if _fused(group) and (group.nodes in replaced or engine._signature(c.state, group) in engine.blocked):
            why = replaced.get(group.nodes, "fusion blocked for this signature after a failed validation")
            out += [GroupChoice(baseline_group(engine.graph.node(n)), 0.0, 0.0, why) for n in group.nodes]
        else:
            out.append(_buildable_variants(engine, c, choice))
    return tuple(out)


def _buildable_variants(engine: FusionEngine, c: _Call, choice: GroupChoice) -> GroupChoice:
    """The choice without the dispatch-table variants its generators refuse (`FusionEngine.variant_builds`)."""
    twin, dense = choice.zero_skip, choice.dense
    if twin is not None and twin != choice.group and not engine.variant_builds(c, twin, "sparse"):
        twin = None
    if dense is not None and dense != choice.group and not engine.variant_builds(c, dense, "any"):
        dense = None
    return choice if (twin, dense) == (choice.zero_skip, choice.dense) else replace(choice, zero_skip=twin, dense=dense)


def _linked(engine: FusionEngine, c: _Call, choices: tuple) -> LinkedProgram:
    """The choices' program, linked once per calibration state (the dispatch thresholds are fixed at link)."""
    with engine._lock:
        linked = engine.programs.setdefault(c.state, {}).get(choices)
    if linked is None:
        groups = [g for choice in choices for g in _variants(choice)]
        budget = _budget(engine, c, groups)
        linked = faster_link(c.state.mc, choices, model_prefers(c.state.mc, engine.cost_model), budget)
        with engine._lock:
            engine.programs[c.state][choices] = linked
    return linked


def faster_link(
    mc: ModelContext, choices: Sequence[GroupChoice], prefer: Prefer | None, max_cycles: int | None = None
) -> LinkedProgram:
    """The program with the token-ordered boundaries `best_fences` picks, unless the same program with a fence at
    every boundary measures fewer cycles (on zero inputs: timing does not depend on values, the on-chip dispatch
    aside, which both take alike): so a program never runs slower than its kernels fenced one after another. A
    measurement that traps or passes `max_cycles` counts as slowest (the fenced program is kept: the call's own
    run then finds the failing kernel)."""
    return link_with_gains(mc, choices, prefer, max_cycles)[0]


def link_with_gains(
    mc: ModelContext, choices: Sequence[GroupChoice], prefer: Prefer | None, max_cycles: int | None = None
) -> tuple[LinkedProgram, dict[tuple[int, int], float]]:
    """`faster_link`'s program and what each of its token-ordered boundaries gains alone, as the link measured it
    ((plan position before, after) -> cycles; `best_fences`), at no extra simulation."""
    zeros = {v: np.zeros(mc.graph.types[v].shape, mc.graph.types[v].dtype.numpy) for v in mc.graph.inputs}
    timing = _Timing(mc, choices, prefer, zeros, max_cycles)
    fenced = timing.link(None)
    kernels = fenced.kernels
    gains = _gains(fenced, timing)
    fences = _best(kernels, gains)
    if fences >= {k.index for k in kernels}:
        return fenced, {}
    joined = timing.link(fences)
    if not any(b.joined for b in joined.boundaries):
        return joined, {}
    if timing.cycles(fences) >= timing.cycles(None):
        return fenced, {}
    alone = {(a.index, b.index): g for a, b, g in zip(kernels, kernels[1:], gains, strict=False)}
    return joined, {(b.before, b.after): alone.get((b.before, b.after), 0.0) for b in joined.boundaries if b.joined}


class _Timing:
    """The plan's programs on zero inputs, each fence set linked and simulated at most once: its cycles (infinite
    when it traps or overruns) and each `.kernel` block's share of the timeline."""

    def __init__(
        self,
        mc: ModelContext,
        choices: Sequence[GroupChoice],
        prefer: Prefer | None,
        zeros: Mapping[str, np.ndarray],
        max_cycles: int | None,
    ) -> None:
        self.mc, self.choices, self.prefer, self.zeros, self.max_cycles = mc, choices, prefer, zeros, max_cycles
        self._linked: dict[frozenset[int] | None, LinkedProgram] = {}
        self._runs: dict[frozenset[int] | None, ProgramRun | None] = {}

    def link(self, fences: frozenset[int] | None) -> LinkedProgram:
        """The program with a fence after these plan positions (None: after every kernel)."""
        if fences not in self._linked:
            if fences is None:
                self._linked[fences] = link_plan(self.mc, self.choices, self.prefer, join=False)
            else:
                self._linked[fences] = link_plan(self.mc, self.choices, self.prefer, fenced=fences)
        return self._linked[fences]

    def run(self, fences: frozenset[int] | None) -> ProgramRun | None:
        """Its run on zero inputs; None when it traps or overruns."""
        if fences not in self._runs:
            try:
                linked = self.link(fences)
                self._runs[fences] = simulate_program(self.mc, linked, self.zeros, max_cycles=self.max_cycles)
            except SimulatorTrap:
                self._runs[fences] = None
        return self._runs[fences]

    def cycles(self, fences: frozenset[int] | None) -> float:
        run = self.run(fences)
        return math.inf if run is None else run.cycles


def best_fences(
    mc: ModelContext,
    choices: Sequence[GroupChoice],
    fenced: LinkedProgram,
    zeros: Mapping[str, np.ndarray],
    max_cycles: int | None = None,
    prefer: Prefer | None = None,
) -> frozenset[int]:
    """Which boundaries of `fenced` (the plan linked with `prefer` and a fence after every kernel) to fence: each
    boundary's gain measured in the whole program (`_gains`), then the set of joins of largest total gain in which
    no single-phase kernel is joined at both ends (the link's rule), by dynamic programming over the boundaries in
    order (`_best`)."""
    return _best(fenced.kernels, _gains(fenced, _Timing(mc, choices, prefer, zeros, max_cycles)))


def _gains(fenced: LinkedProgram, timing: _Timing) -> list[float]:
    """Each boundary's gain alone, in three simulations, not two per boundary: the fenced program, then the program
    with every even boundary token-ordered and every odd one fenced, then the reverse. A fence separates each
    joined pair from the rest, so the two kernels' shares of the timeline (entry to entry: the fence after the
    pair included) fenced minus joined is that boundary's gain. 0 where the link refuses the join or it traps."""
    kernels = fenced.kernels
    every = frozenset(k.index for k in kernels)
    base = timing.run(None)
    gains = [0.0] * (len(kernels) - 1)
    for parity in (0, 1):
        trial = [k for k in range(parity, len(gains), 2) if kernels[k].index != kernels[k + 1].index]
        fences = every - {kernels[k].index for k in trial}
        run = timing.run(fences) if trial and base is not None else None
        if run is None:
            continue  # (a trap: those joins gain nothing; the call's own run finds the failing kernel)
        joined = timing.link(fences).boundaries
        for k in trial:
            if joined[k].joined:
                pair = (kernels[k].name, kernels[k + 1].name)
                gains[k] = sum(base.kernel_cycles[n] - run.kernel_cycles[n] for n in pair)
    return gains


def _best(kernels: Sequence[ProgramKernel], gains: Sequence[float]) -> frozenset[int]:
    """The plan positions to fence after: the joins of largest total gain, none at both ends of a single-phase
    kernel. value[s]: the largest total gain so far with the last boundary joined (s = 1) or fenced; back[k][s]:
    the previous boundary's state on that best path."""
    value, back = [0.0, -math.inf], []
    for k, gain in enumerate(gains):
        single = kernels[k].phases == 1  # the kernel between boundaries k - 1 and k
        fence = max((0, 1), key=lambda p: value[p])
        join = max((0, 1) if not single else (0,), key=lambda p: value[p])
        back.append((fence, join))
        value = [value[fence], value[join] + gain if gain > 0 else -math.inf]
    joined_at: set[int] = set()
    state = max((0, 1), key=lambda p: value[p])
    for k in range(len(gains) - 1, -1, -1):
        if state:
            joined_at.add(k)
        state = back[k][state]
    return frozenset(kernels[k].index for k in range(len(gains)) if k not in joined_at)


def _fused(group: Group) -> bool:
    """A fusion (validated, blockable): several nodes, or one node run by a strategy other than the baseline's."""
    return group.fused or not strategy_of(group).baseline


def _run_checked(
    engine: FusionEngine, c: _Call, linked: LinkedProgram, inputs: Mapping[str, np.ndarray]
) -> ProgramRun | dict[tuple[str, ...], str]:
    """Run the program within the sum of its kernels' cycle budgets (`engine.cycle_budget`). A trap or an overrun
    inside a fused kernel is that kernel's failure, as in host mode (evicted, blocked, logged): returns
    {its nodes: the fallback reason}; one elsewhere (an unfused kernel, the driver) propagates."""
    from fusion.engine.engine import _Target

    st = c.state
    budget = _budget(engine, c, [k.group for k in linked.kernels])
    try:
        return simulate_program(st.mc, linked, inputs, checked=engine.options.checked, max_cycles=budget)
    except SimulatorTrap as trap:
        kernel = kernel_at(linked, trap.pc)
        if kernel is None or not _fused(kernel.group):
            raise
        group = kernel.group
        key = engine._key(st, group, data_class_of(group))
        what = f"over the program's cycle budget of {budget}" if "watchdog" in trap.reason else "trapped"
        target = _Target(key, engine._signature(st, group), group, group.schedule)
        return {group.nodes: engine._reject(c, target, "", float("inf"), f"{what}: {trap}")}


def _variants(choice: GroupChoice) -> list[Group]:
    """The kernels a choice may link: its group (none for a host view) and its dense / zero-skip variants."""
    if strategy_of(choice.group).host_view:
        return []
    return list(dict.fromkeys(g for g in (choice.group, choice.dense, choice.zero_skip) if g is not None))


def _budget(engine: FusionEngine, c: _Call, groups: Sequence[Group]) -> int:
    """The program's cycle budget: the sum of its kernels' budgets (`engine.cycle_budget` of each prediction),
    never past the machine's watchdog. A hung kernel then ends the run in bounded time, not the watchdog's."""
    from fusion.engine.engine import cycle_budget

    watchdog = engine.config.max_cycles
    return min(watchdog, sum(cycle_budget(engine._predicted(c, g), watchdog) for g in groups))


def _ran(run: ProgramRun, kernel: ProgramKernel) -> bool:
    return int(run.kernel_counters[kernel.name].instret) > 0


def _validate(
    engine: FusionEngine, c: _Call, linked: LinkedProgram, run: ProgramRun, inputs: Mapping[str, np.ndarray]
) -> tuple[dict[tuple[str, ...], str], set[tuple[str, ...]]]:
    """Shadow-validate the kernels that ran (by the validation policy's count per kernel): returns the failed
    groups (nodes -> fallback reason; each already evicted, blocked and logged by the engine) and the validated
    ones."""
    from fusion.engine.engine import _Target

    st = c.state
    env = {**inputs, **run.outputs}
    failed: dict[tuple[str, ...], str] = {}
    validated: set[tuple[str, ...]] = set()
    for kernel in linked.kernels:
        group = kernel.group
        if not _ran(run, kernel) or not _fused(group):
            continue
        key = engine._key(st, group, data_class_of(group))
        with engine._lock:
            count = engine._runs.get(key, 0)
            engine._runs[key] = count + 1
        if not engine.options.validation.should_validate(count):
            continue
        mine = {v: run.outputs[v] for v in st.mc.subgraph(group.nodes).outputs}
        validated.add(group.nodes)
        policy = engine._tolerance(st, group)
        cmp = compare(mine, engine._unfused_outputs(c, group, env), policy)
        if not cmp.ok:
            cmp = compare(mine, engine._unfused_outputs(c, group, env, rebuild=True), policy)
        if not cmp.ok:
            target = _Target(key, engine._signature(st, group), group, group.schedule)
            reason = f"max |diff| {cmp.max_abs_diff:.3g}"
            failed[group.nodes] = engine._reject(c, target, cmp.value, cmp.max_abs_diff, reason)
    return failed, validated


def _records(
    engine: FusionEngine,
    c: _Call,
    linked: LinkedProgram,
    run: ProgramRun,
    replaced: Mapping[tuple[str, ...], str],
    validated: set[tuple[str, ...]],
) -> list[KernelRecord]:
    """One record per kernel that ran: its share of the program's timeline and its own counters, its features and
    prediction (as host mode records them; an online-learning cost model is fed the share)."""
    from fusion.engine.engine import KernelRecord

    dispatched = {d.index for d in linked.dispatches}
    records = []
    for kernel in linked.kernels:
        if not _ran(run, kernel):
            continue
        group, counters = kernel.group, run.kernel_counters[kernel.name]
        data_class = _data_class(kernel, dispatched)
        fallback = next((why for nodes, why in replaced.items() if set(group.nodes) <= set(nodes)), "")
        built, hit, key = engine._kernel(c.state, group, data_class_of(group), c.evaluator)
        feats = engine._feature_row(c.state, key, built, group)
        reads, writes = int(counters.dram_read_bytes), int(counters.dram_write_bytes)
        share = KernelRun({}, run.kernel_cycles[kernel.name], reads, writes, float(counters.energy_total_pj), counters)
        records.append(
            KernelRecord(
                group.nodes,
                group.schedule,
                data_class,
                engine._predict(feats),
                share.cycles,
                reads + writes,
                engine._unfused_bytes(c, group),
                share.energy_pj,
                hit,
                group.nodes in validated,
                fallback,
                feats,
                engine._learn(feats, share),  # an online-learning model learns the kernel's share in the program
            )
        )
    return records


def _data_class(kernel: ProgramKernel, dispatched: set[int]) -> str:
    """The data class of the variant that ran: "sparse" (zero-skip) or, for a dispatched group, "dense"; else
    "any" (as host records name them)."""
    if strategy_of(kernel.group).skips_zero_tiles:
        return "sparse"
    return "dense" if kernel.index in dispatched else "any"
