"""The engine's two execution models of a call: host-dispatched kernels (launches priced) or one program.

`EngineOptions(execution="program")`: the call's plan is linked into one program (`program.link_plan`, kept per
calibration state and plan, so calls between re-plans rerun the same binary), with on-chip dispatch between each
group's dense and zero-skip variants (break-even from the engine's cost model), and simulated once. The call
that links a plan keeps the fastest of that candidate, the same without its dispatches and the plan fenced
everywhere (`keep_fastest`: one more simulation, two when the dispatches did not pay on its data; the kernels are
generated once for all of them, `program.PhaseCache`, and the dispatch predictions come from the kernels the
engine built), so the program is never slower than its kernels one by one on that call. Guards and
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
from fusion.engine.kernel import Kernel
from fusion.engine.overlap import BoundaryOverlap, Priced
from fusion.engine.plan import Group, GroupChoice, baseline_group
from fusion.engine.profile import data_class
from fusion.engine.program import (
    Boundary,
    LinkedProgram,
    PhaseCache,
    PlannedKernel,
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
    fenced_cycles: int = 0  # the plan fenced at every boundary, no on-chip dispatch, as the link measured it
    gains: tuple[tuple[int, int, int], ...] = ()  # (plan position before, after, cycles) per token-ordered boundary


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
    phases = PhaseCache(mc)  # (the links of this call's plans, fallbacks included, generate each kernel once)
    for _ in range(len(c.plan.choices) + 2):  # (a replacement per group, one relink for sparse data)
        choices = _with_fallbacks(engine, c, replaced)
        linked = _linked(engine, c, choices)
        made = _link(engine, c, choices, phases) if linked is None else None
        linked = made.candidate if made is not None else linked
        run = _run_checked(engine, c, linked, inputs)
        if not isinstance(run, ProgramRun):
            replaced.update(run)
            continue
        if made is not None:
            budget = _budget(engine, c, [k.group for k in linked.kernels])
            linked, run = keep_fastest(mc, choices, made, run, inputs, engine.options.checked, budget)
            with engine._lock:
                engine.programs[c.state][choices] = linked
        failures, validated = _validate(engine, c, linked, run, inputs)
        if not failures and _turned_sparse(mc, linked, {**inputs, **run.outputs}):
            with engine._lock:  # linked again on this call's data, where the left-out dispatches may pay
                engine.programs[c.state].pop(choices, None)
            continue
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
        linked.fenced_cycles,
        linked.gains,
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
            out += [GroupChoice(baseline_group(engine.graph.node(n)), 0.0, why) for n in group.nodes]
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


def _linked(engine: FusionEngine, c: _Call, choices: tuple) -> LinkedProgram | None:
    """The choices' program if a call of this calibration state linked it (the dispatch thresholds are fixed at
    link), else None."""
    with engine._lock:
        return engine.programs.setdefault(c.state, {}).get(choices)


def _link(engine: FusionEngine, c: _Call, choices: tuple, phases: PhaseCache) -> Candidates:
    """The plan's candidate programs, with on-chip dispatch where the engine's cost model says it can pay
    (predictions from the kernels the engine built)."""
    mc = c.state.mc

    def built(group: Group) -> Kernel:
        return engine._kernel(c.state, group, data_class_of(group), c.evaluator)[0]

    return candidates(mc, choices, model_prefers(mc, engine.cost_model, built), phases)


@dataclass(frozen=True)
class Candidates:
    """What a plan may run as: `candidate` (the joins `planned_fences` picks, on-chip dispatch by `prefer`) and
    `fenced` (a fence at every boundary, no dispatch: each kernel as it runs alone, one after another)."""

    candidate: LinkedProgram
    fenced: LinkedProgram
    fences: frozenset[int]  # the candidate's fenced plan positions (its dispatches fence more)
    phases: PhaseCache


def candidates(
    mc: ModelContext, choices: Sequence[GroupChoice], prefer: Prefer | None, phases: PhaseCache
) -> Candidates:
    """The plan's candidate and fenced programs (`Candidates`), their kernels generated once."""
    fenced = link_plan(mc, choices, None, join=False, phases=phases)
    fences = planned_fences(mc, choices, fenced.kernels)
    return Candidates(link_plan(mc, choices, prefer, fenced=fences, phases=phases), fenced, fences, phases)


def planned_fences(
    mc: ModelContext, choices: Sequence[GroupChoice], kernels: Sequence[ProgramKernel]
) -> frozenset[int]:
    """The plan positions to fence after: the joins of largest total predicted gain (`overlap.BoundaryOverlap`,
    what the planner priced: the next kernel's loads moved under the previous one's last step), none at both ends
    of a single-phase kernel (`_best`). A boundary predicted to gain nothing keeps its fence: such joins gain a few
    cycles of fence drain or lose to loads competing with the previous kernel's stores (docs/program.md)."""
    overlap = BoundaryOverlap(mc)

    def priced(kernel: ProgramKernel) -> PlannedKernel:
        return PlannedKernel(kernel.group, None, choices[kernel.index].predicted_cycles)

    gains = [overlap(priced(a), priced(b)) for a, b in zip(kernels, kernels[1:], strict=False)]
    return _best(kernels, gains)


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


def keep_fastest(
    mc: ModelContext,
    choices: Sequence[GroupChoice],
    made: Candidates,
    run: ProgramRun,
    inputs: Mapping[str, np.ndarray],
    checked: bool = False,
    max_cycles: int | None = None,
) -> tuple[LinkedProgram, ProgramRun]:
    """The program a plan keeps, from the candidate's run on a call's inputs and one more simulation: the fenced
    program's (`Candidates.fenced`). Kept: the candidate, or when its dispatches made it slower than that (their
    count and their fenced boundaries cost more than the zero tiles they skip on this data), the candidate without
    them (a third simulation, only then), or when still slower, the fenced program: so a program is never slower
    than its kernels fenced one by one, and a dispatch stays only where it paid on the data of the call that linked
    it (left out on dense data, it is weighed again when its operand turns sparse: `LinkedProgram.dropped`). The
    kept program carries the fenced cycles and each token-ordered boundary's gain over them (`_gains`); the run is
    the kept program's (each is a valid run of the call: every program computes the same values). `max_cycles`:
    the watchdog of each run (a reference that traps or passes it counts as slowest)."""
    candidate, fenced = made.candidate, made.fenced
    try:
        reference = simulate_program(mc, fenced, inputs, checked=checked, max_cycles=max_cycles)
    except SimulatorTrap:
        return candidate, run
    best = (candidate, run)
    if run.cycles > reference.cycles and candidate.dispatches:
        plain = link_plan(mc, choices, None, fenced=made.fences, phases=made.phases)
        try:
            again = simulate_program(mc, plain, inputs, checked=checked, max_cycles=reference.cycles)
            if again.cycles < run.cycles:
                best = (plain, again)
        except SimulatorTrap:
            pass  # (slower than the fenced program: past its cycles)
    if best[1].cycles > reference.cycles:
        best = (fenced, reference)
    linked, kept = best
    # a dispatch left out on dense data is weighed again when its operand turns sparse (`_turned_sparse`); one left
    # out on sparse data did not pay where it could
    values, n = {**inputs, **run.outputs}, mc.config.array_size
    left_out = candidate.dispatches if linked is not candidate else ()
    dropped = tuple(
        d.operand for d in left_out if d.operand in values and data_class(values[d.operand], n)[0] != "sparse"
    )
    gains = _gains(linked, kept, fenced, reference)
    return replace(linked, fenced_cycles=reference.cycles, gains=gains, dropped=dropped), kept


def link_for_call(
    mc: ModelContext,
    choices: Sequence[GroupChoice],
    prefer: Prefer | None,
    inputs: Mapping[str, np.ndarray],
    max_cycles: int | None = None,
) -> tuple[LinkedProgram, ProgramRun]:
    """The program the engine keeps for a plan and its run on these inputs (`keep_fastest` after the candidate's
    run: two simulations, three when the candidate's dispatches did not pay)."""
    made = candidates(mc, choices, prefer, PhaseCache(mc))
    run = simulate_program(mc, made.candidate, inputs, max_cycles=max_cycles)
    return keep_fastest(mc, choices, made, run, inputs, max_cycles=max_cycles)


def _turned_sparse(mc: ModelContext, linked: LinkedProgram, values: Mapping[str, np.ndarray]) -> bool:
    """Whether an operand whose dispatch the link left out (it did not pay on the linking call's dense data) is of
    the sparse class in this call: the program is then linked again (`keep_fastest` weighs the dispatch anew)."""
    n = mc.config.array_size
    return any(data_class(values[v], n)[0] == "sparse" for v in linked.dropped if v in values)


def _gains(
    linked: LinkedProgram, run: ProgramRun, fenced: LinkedProgram, reference: ProgramRun
) -> tuple[tuple[int, int, int], ...]:
    """Each token-ordered boundary's gain, from the kernels' shares of the timeline (entry to next entry), fenced
    minus joined: a boundary between two fences gains what its two kernels' shares lost together (its gain alone);
    in a chain of joins a kernel between two joined boundaries splits what its share lost between them (removing
    the fence at its end lets the next kernel start early, what it then waits for is paid in that kernel's share:
    in a chain the two do not separate). The gains add up to each chain's exact saving (a fence closes it in both
    programs)."""
    alone = {k.index: reference.kernel_cycles[k.name] for k in fenced.kernels}
    joined = [b.joined for b in linked.boundaries]
    gains = [0] * len(joined)
    for k, kernel in enumerate(linked.kernels):
        lost = alone[kernel.index] - run.kernel_cycles[kernel.name] if kernel.index in alone else 0
        before, after = k > 0 and joined[k - 1], k < len(joined) and joined[k]
        if before and after:
            gains[k - 1] += lost // 2
            gains[k] += lost - lost // 2
        elif before or after:
            gains[k - 1 if before else k] += lost
    return tuple((b.before, b.after, g) for b, g in zip(linked.boundaries, gains, strict=True) if b.joined)


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
