"""The plan report: groups, strategy per group, predicted and measured cycles, DRAM bytes saved, cache
statistics, validations; as text (`--report`) or JSON (`--json`), and several policies side by side.

Every cycle count of a plan is shown with its fraction of the model's roofline bound (`fusion.cost.roofline`:
one number per model, machine and dtype, whatever the plan), and DRAM bytes with their ratio to the
compulsory traffic (inputs, weights and outputs moved once)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fusion.cost.roofline import model_roofline
from fusion.engine.engine import CallResult, FusionEngine
from fusion.engine.program_figures import ProgramFigures
from fusion.engine.strategies import strategy_of


@dataclass(frozen=True)
class PolicyReport:
    policy: str
    model: str
    dtype: str
    config: str
    cost_model: str
    cycles: int
    dram_bytes: int
    energy_pj: float
    macs: int
    compulsory_bytes: int
    roofline_cycles: float
    roofline_fraction: float
    plan_seconds: float
    compile_seconds: float
    measured: dict[str, Any]  # what planning simulated (`plan.Measurement`): kernels, seconds, guard regions
    groups: tuple[dict[str, Any], ...]
    pipelined: tuple[dict[str, Any], ...]
    rejected: tuple[dict[str, Any], ...]
    cache: dict[str, int]
    validations: int
    validation_events: tuple[dict[str, Any], ...]
    execution: str = "host"
    model_cycles: int = 0  # cycles + the launches (`MachineConfig.launch_cycles` each; one for a program)
    program: dict[str, Any] | None = None  # execution="program": boundaries, overlap, on-chip dispatch

    def as_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def build_report(engine: FusionEngine, result: CallResult, figures: ProgramFigures | None = None) -> PolicyReport:
    """The call's report; `figures` (`program_figures.of_call`): a program's overlap per boundary."""
    plan = engine.plan
    assert plan is not None and engine.mc is not None
    reasons = {c.group.nodes: c.reason for c in plan.choices}
    views = {c.group.nodes for c in plan.choices if strategy_of(c.group).host_view}  # no kernel: run on the host
    groups = tuple(
        {
            "nodes": list(r.nodes),
            "ops": [engine.graph.node(n).op.value for n in r.nodes],
            "strategy": r.schedule,
            "view": r.nodes in views and not r.fallback,
            "data_class": r.data_class,
            "predicted_cycles": round(r.predicted_cycles, 1),
            "measured_cycles": r.measured_cycles,
            "dram_bytes": r.dram_bytes,
            "dram_bytes_saved": r.unfused_dram_bytes - r.dram_bytes,
            "energy_pj": round(r.energy_pj, 1),
            "cache_hit": r.cache_hit,
            "validated": r.validated,
            "fallback": r.fallback,
            "reason": reasons.get(r.nodes, ""),
            "pipelined_with": list(r.pipelined_with),
        }
        for r in result.records
    )
    bound = model_roofline(engine.graph, engine.config, engine.mc.qplan)
    return PolicyReport(
        policy=plan.policy,
        model=engine.graph.name,
        dtype=engine.dtype,
        config=engine.config.name,
        cost_model=engine.cost_model.name,
        cycles=result.cycles,
        dram_bytes=result.dram_bytes,
        energy_pj=round(result.energy_pj, 1),
        macs=bound.macs,
        compulsory_bytes=bound.compulsory_bytes,
        roofline_cycles=round(bound.cycles, 1),
        roofline_fraction=round(bound.fraction(result.cycles), 4),
        plan_seconds=round(engine.plan_seconds, 4),
        compile_seconds=round(engine.compile_seconds, 4),
        measured={**plan.measured.__dict__, "seconds": round(plan.measured.seconds, 4)},
        groups=groups,
        pipelined=tuple(
            {
                "producer": list(p.producer.nodes),
                "consumer": list(p.consumer.nodes),
                "bounds": list(p.bounds),
                "separate_cycles": p.separate_cycles,
                "pipelined_cycles": p.pipelined_cycles,
            }
            for p in plan.pipelined
        ),
        rejected=tuple({"nodes": list(n), "reason": why} for n, why in plan.rejected),
        cache=engine.cache.stats.as_dict(),
        validations=sum(r.validated for r in result.records),
        validation_events=tuple(e.__dict__ for e in engine.events),
        execution=engine.options.execution,
        model_cycles=result.model_cycles,
        program=_program(result, figures),
    )


def _program(result: CallResult, figures: ProgramFigures | None) -> dict[str, Any] | None:
    p = result.program
    if p is None:
        return None
    gained = {(b, a): g for b, a, g in figures.boundaries} if figures is not None else {}
    out: dict[str, Any] = {
        "cycles": p.cycles,
        "dispatch_cycles": p.dispatch_cycles,
        "driver_cycles": p.driver_cycles,
        "boundaries": [
            {"before": b.before, "after": b.after, "joined": b.joined, "reason": b.reason}
            | ({"gained_cycles": gained[(b.before, b.after)]} if (b.before, b.after) in gained else {})
            for b in p.boundaries
        ],
        "dispatch": [
            {"nodes": list(nodes), "variant": v, "threshold_tiles": t, "tiles": n} for nodes, v, t, n in p.decisions
        ],
        "replaced": [list(n) for n in p.replaced],
    }
    if figures is not None:
        out |= {"kernel_cycles": figures.kernel_cycles, "host_cycles": figures.host_cycles}
    return out


def format_report(rep: PolicyReport, show_rejected: int = 8) -> str:
    lines = [
        f"model {rep.model} ({rep.dtype}) on {rep.config}, policy {rep.policy}, cost model {rep.cost_model}",
        f"{'group':44} {'strategy':34} {'pred':>8} {'meas':>8} {'dram B':>8} {'saved B':>8}  pipelined with",
    ]
    for g in rep.groups:
        if g["view"]:
            continue
        name = "+".join(g["ops"]) + f" [{g['nodes'][0]}]"
        strat = g["strategy"] + (f" ({g['data_class']})" if g["data_class"] not in ("any", "dense") else "")
        if g["fallback"]:
            strat = f"unfused: {g['fallback']}"
        lines.append(
            f"{name[:44]:44} {strat[:34]:34} {g['predicted_cycles']:8.0f} {g['measured_cycles']:8d} "
            f"{g['dram_bytes']:8d} {g['dram_bytes_saved']:8d}  {'+'.join(g['pipelined_with'])}"
        )
    lines += [
        f"total: {rep.cycles} cycles ({rep.roofline_fraction:.1%} of roofline), {rep.dram_bytes} DRAM bytes "
        f"({traffic_ratio(rep):.2f}x compulsory), {rep.energy_pj / 1e6:.3f} uJ",
        roofline_line(rep),
        f"plan {rep.plan_seconds * 1e3:.1f} ms, JIT compile {rep.compile_seconds * 1e3:.1f} ms; cache {rep.cache}",
        f"measured while planning: {rep.measured['kernels']} kernels in {rep.measured['seconds'] * 1e3:.1f} ms; "
        f"plan guard: {rep.measured['regions']} regions measured, {rep.measured['fallbacks']} taken from static/none",
        f"validations run: {rep.validations}; validation failures: {len(rep.validation_events)}",
    ]
    lines += [f"  ! {e}" for e in rep.validation_events]
    lines += program_lines(rep)
    lines += [
        f"pipelined: {'+'.join(p['producer'])} ({p['bounds'][0]}) -> {'+'.join(p['consumer'])} ({p['bounds'][1]}): "
        f"{p['separate_cycles']} -> {p['pipelined_cycles']} cycles"
        for p in rep.pipelined
    ]
    fused = [set(g["nodes"]) for g in rep.groups if len(g["nodes"]) > 1]
    missed = [r for r in rep.rejected if not any(set(r["nodes"]) <= nodes for nodes in fused)]
    if missed and show_rejected:  # refusals of nodes the plan fused another way are in the JSON only
        lines.append("fusions refused (first ones not fused in another way):")
        lines += [f"  {'+'.join(r['nodes'])}: {r['reason']}" for r in missed[:show_rejected]]
    return "\n".join(lines)


def program_lines(rep: PolicyReport) -> list[str]:
    """Execution: launches priced (host) or the one program's boundaries and on-chip dispatch decisions."""
    p = rep.program
    if p is None:
        return [
            f"execution host: {rep.model_cycles} cycles with launches ({rep.model_cycles - rep.cycles} launch cycles)"
        ]
    joined = [b for b in p["boundaries"] if b["joined"]]
    lines = [
        f"execution program: {p['cycles']} cycles, {rep.model_cycles} with its one launch; "
        f"{len(joined)} of {len(p['boundaries'])} kernel boundaries token-ordered, on-chip dispatch "
        f"{p['dispatch_cycles']} cycles"
    ]
    if "kernel_cycles" in p:
        lines.append(
            f"  kernels fenced one by one {p['kernel_cycles']} cycles (host-dispatched {p['host_cycles']}); overlap "
            "gained "
            f"{p['kernel_cycles'] - p['cycles']}; per boundary: "
            + ", ".join(f"{b['before']}->{b['after']}: {b.get('gained_cycles', '?')}" for b in joined)
        )
    lines += [
        f"  dispatch {'+'.join(d['nodes'])}: {d['variant']} (zero-skip from {d['threshold_tiles']} of {d['tiles']} "
        "zero tiles)"
        for d in p["dispatch"]
    ]
    lines += [f"  replaced by unfused kernels: {'+'.join(n)}" for n in p["replaced"]]
    return lines


def traffic_ratio(rep: PolicyReport) -> float:
    """DRAM bytes moved / compulsory bytes (1.0: every input, weight and output moved exactly once)."""
    return rep.dram_bytes / rep.compulsory_bytes if rep.compulsory_bytes else 0.0


def roofline_line(rep: PolicyReport) -> str:
    return (
        f"roofline bound {rep.roofline_cycles:.0f} cycles ({rep.dtype} on {rep.config}: {rep.macs} MACs, "
        f"{rep.compulsory_bytes} compulsory DRAM bytes)"
    )


def format_comparison(reports: Sequence[PolicyReport]) -> str:
    base = {r.policy: r for r in reports}
    lines = [
        f"{'policy':10} {'cycles':>9} {'roofline':>8} {'DRAM bytes':>11} {'x compul.':>9} {'energy uJ':>10} "
        f"{'vs none':>8} {'vs static':>9}"
    ]
    for r in reports:
        vs = [
            f"{base[p].cycles / r.cycles:7.2f}x" if p in base and r.cycles else "       -" for p in ("none", "static")
        ]
        lines.append(
            f"{r.policy:10} {r.cycles:9d} {r.roofline_fraction:8.1%} {r.dram_bytes:11d} {traffic_ratio(r):8.2f}x "
            f"{r.energy_pj / 1e6:10.3f} {vs[0]:>8} {vs[1]:>9}"
        )
    lines.append(roofline_line(reports[0]))
    return "\n".join(lines)
