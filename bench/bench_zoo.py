"""The model zoo measured: none / static / dynamic on every zoo model, fp32 and int8, on one machine config.

Per model and dtype: simulated cycles of each policy with their fraction of the model's roofline bound
(`fusion.cost.roofline`: max(MACs / peak, compulsory bytes / DRAM bandwidth), the number `dynfuse fuse` prints),
DRAM bytes and their ratio to the compulsory traffic (inputs, weights, outputs once), energy, the dynamic
policy's planning and JIT time, the simulator's wall time, and the peak memory (RSS) of the process measuring
the model (each model and dtype runs in its own child process). A model that fails is a row saying why.

    python bench/bench_zoo.py                 # small inputs, both dtypes -> bench/results/zoo.md
    python bench/bench_zoo.py --full          # also resnet18 at 224x224 (slow: minutes per policy)
    python bench/bench_zoo.py --models bert,gpt2 --dtypes int8 --out /tmp/zoo.md
    python bench/bench_zoo.py --sizes full --dtypes int8 --out bench/results/zoo_full.md
    python bench/bench_zoo.py --cost-models analytic,hpm   # cost models' error and plan quality -> zoo_cost_models.md

`--cost-models` measures the cost models instead of the policies (see `measure_cost_models`): per model and
dtype, each model's per-kernel error on the dynamic plan it made and on every candidate kernel either planner built,
the Kendall tau and selection regret of its ranking of each group's schedules, and the measured cycles of its
dynamic plan (beside the oracle's, where the oracle's search is affordable). The learned model is the shipped one
(or $DYNFUSE_HPM_MODEL), used even when its generator stamp is stale, which each row reports.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `bench.zoo` from a script run as `python bench/bench_zoo.py`

from bench.zoo import NAMES, prefetch, spec, zoo_model  # noqa: E402

POLICIES = ("none", "static", "dynamic")
DTYPES = ("fp32", "int8")
RESULTS = Path(__file__).parent / "results" / "zoo.md"
COST_RESULTS = Path(__file__).parent / "results" / "zoo_cost_models.md"
CHILD_TIMEOUT_S = 3600
COST_MODELS = ("analytic", "hpm")
ORACLE_MODELS = ("whisper_encoder",)  # the oracle refuses the other zoo models (> 512 legal plans) or takes minutes


def measure(name: str, size: str, dtype: str, config: str, execution: bool = True) -> dict:
    """One model at one size and dtype under each policy (in this process); `execution`: also the dynamic plan's
    execution-model figures (`measure_execution`)."""
    from bench.bench_cost_error import kernel_errors, summary
    from fusion.cost.analytic import AnalyticCostModel
    from fusion.cost.roofline import model_roofline
    from fusion.engine.engine import EngineOptions, FusionEngine
    from fusion.engine.validation import ValidationPolicy
    from fusion.lower.compiler import load_graph

    entry = zoo_model(name, size)
    graph = load_graph(entry.onnx_path)
    inputs = {graph.inputs[0]: entry.input}
    row: dict = {"policies": {}}
    for policy in POLICIES:
        options = EngineOptions(policy=policy, validation=ValidationPolicy("off"), execution="host")
        engine = FusionEngine(graph, config, dtype, options)
        start = time.perf_counter()
        result = engine.run(inputs)
        wall = time.perf_counter() - start
        if policy == "dynamic" and execution:
            row["execution"] = measure_execution(engine, inputs)
        engine.close()
        bound = model_roofline(engine.graph, engine.config, engine.mc.qplan)
        row.update(bound=bound.cycles, macs=bound.macs, compulsory=bound.compulsory_bytes)
        row["policies"][policy] = {
            "cycles": result.cycles,
            "dram_bytes": result.dram_bytes,
            "energy_pj": result.energy_pj,
            "kernels": len(result.records),
            "plan_s": engine.plan_seconds,
            "jit_s": engine.compile_seconds,
            "sim_s": max(0.0, wall - engine.plan_seconds - engine.compile_seconds - result.dispatch_seconds),
            # the analytic model's error on the kernels just simulated (`bench_cost_error`: nothing re-simulated)
            "analytic_error": summary(kernel_errors(result.records, engine.config, {"a": AnalyticCostModel()}), "a"),
        }
    row["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def measure_execution(engine, inputs: dict) -> dict:
    """The engine's plan under the three execution models (`program_figures.measure`, without the per-boundary
    marginal gains): the kernels' sum, host-dispatched (launches priced), one program with on-chip dispatch."""
    from fusion.engine.program import model_prefers
    from fusion.engine.program_figures import measure as figures

    start = time.perf_counter()
    f = figures(engine.mc, engine.plan.choices, inputs, model_prefers(engine.mc, engine.cost_model), False)
    return {
        "kernels": f.kernel_cycles,
        "launches": f.launches,
        "host": f.host_cycles,
        "program": f.program_cycles,
        "dispatch": f.dispatch_cycles,
        "joined": f.joined,
        "fences": f.fences,
        "seconds": time.perf_counter() - start,
    }


def measure_in_child(name: str, size: str, dtype: str, config: str, extra: tuple[str, ...] = ()) -> dict:
    """`measure` (or, with `extra` = `--cost-models ...`, `measure_cost_models`) in a child process: its own peak
    RSS, and a crash or timeout becomes the row's error."""
    command = [sys.executable, __file__, "--child", name, size, dtype, "--config", config, *extra]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {CHILD_TIMEOUT_S} s"}
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return {"error": lines[-1] if lines else f"exit code {done.returncode}"}
    row = json.loads(done.stdout.splitlines()[-1])
    row["wall_s"] = time.perf_counter() - start
    return row


def load_hpm() -> tuple[object, dict]:
    """The learned model (the shipped one, or $DYNFUSE_HPM_MODEL) and its stamp status. A stale model (calibrated
    on other kernel generators than this code's) is measured anyway, since that is what the figures are about, and
    every row says whether it was fresh; the engine's own resolver would plan with the analytic model instead."""
    from fusion.hpm.cost_model import HpmCostModel, default_model_path
    from fusion.hpm.modelfile import load_model
    from fusion.hpm.stamp import generator_hash

    path = default_model_path()
    model = load_model(path, check_generators=False)
    code = generator_hash()
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return HpmCostModel(model), {"path": str(shown), "stamp": model.generators, "code": code}


def _recording_evaluator(mc, cost_model, profiles):
    """A planner's evaluator that keeps every candidate kernel it builds and prices (`built`, by group)."""
    from fusion.engine.planner import Evaluated, Evaluator

    class Recording(Evaluator):
        def __init__(self) -> None:
            super().__init__(mc, cost_model, profiles)
            self.built: dict = {}

        def evaluate(self, group, zero_fraction=None):
            done = super().evaluate(group, zero_fraction)
            if isinstance(done, Evaluated):
                self.built.setdefault(group, done)
            return done

    return Recording()


def _errors(predicted: list[float], measured: list[float]) -> dict:
    """Median and 90th percentile of |predicted - measured| / measured (fractions), and the count."""
    import numpy as np

    err = np.abs(np.asarray(predicted, dtype=float) - measured) / np.asarray(measured, dtype=float)
    if not err.size:
        return {"n": 0}
    return {"n": int(err.size), "median": float(np.median(err)), "p90": float(np.percentile(err, 90))}


def measure_cost_models(name: str, size: str, dtype: str, config: str, labels: tuple[str, ...], oracle: bool) -> dict:
    """Each cost model (`labels`, of COST_MODELS) against the simulator on one model, in this process:

    - plan: the engine's `dynamic` plan made with the model, run on the model's input (validation off): its
      measured cycles, and the model's error over the kernels it dispatched (predicted as the planner priced them,
      measured on the live values; pipelined pairs have no features and are left out);
    - candidates: every kernel the planners (one per cost model) built and priced, each distinct program once,
      simulated on zero inputs (`Evaluator.measured_cycles`; zero-skip kernels, whose timing depends on the data,
      and views are left out), predicted by every model: its per-kernel error, and over each set of nodes with
      several schedules the Kendall tau and the selection regret of its ranking (schedules priced together, as
      the planner ranks them: `predict_group`);
    - oracle (`oracle`): the cycles of the plan the oracle policy finds by measuring every legal plan, or its
      refusal.
    """
    import numpy as np

    from fusion.cost.analytic import AnalyticCostModel
    from fusion.engine.engine import EngineOptions, FusionEngine
    from fusion.engine.errors import EngineError
    from fusion.engine.planner import plan_dynamic
    from fusion.engine.validation import ValidationPolicy
    from fusion.hpm.metrics import grouped
    from fusion.lower.compiler import load_graph

    entry = zoo_model(name, size)
    graph = load_graph(entry.onnx_path)
    inputs = {graph.inputs[0]: entry.input}
    hpm, stamp = load_hpm()
    models = {"analytic": AnalyticCostModel(), "hpm": hpm}
    off = ValidationPolicy("off")
    row: dict = {"hpm": stamp, "cost_models": {}}
    built: dict = {}
    probe = None
    for label in labels:
        engine = FusionEngine(
            graph, config, dtype, EngineOptions(policy="dynamic", validation=off), cost_model=models[label]
        )
        result = engine.run(inputs)
        recs = [r for r in result.records if r.features is not None and r.measured_cycles > 0]
        ev = _recording_evaluator(engine.mc, models[label], engine.profiles)
        plan_dynamic(ev)  # the same planning questions the engine asked, now keeping every kernel built
        for group, done in ev.built.items():
            built.setdefault(group, done)
        probe = probe or ev
        row["cost_models"][label] = {
            "cycles": result.cycles,
            "plan_s": engine.plan_seconds,
            "plan": _errors([r.predicted_cycles for r in recs], [r.measured_cycles for r in recs]),
        }
        engine.close()
    kernels: dict = {}  # each distinct program once: repeated layers build the same kernels
    for done in built.values():
        if done.kernel.program is not None and done.group.strategy != "zero_skip":
            guard = done.kernel.guard
            shapes, dtypes = tuple(s for _, s in guard.shapes), tuple(d for _, d in guard.dtypes)
            kernels.setdefault((done.kernel.program.text, shapes, dtypes), done)
    cands = list(kernels.values())
    measured = np.array([probe.measured_cycles(e) for e in cands], dtype=float)
    keys = [e.group.nodes for e in cands]
    for label in labels:
        model = models[label]
        alone = [model.predict(e.features, probe.mc.config).cycles for e in cands]
        joint = np.zeros(len(cands))
        for nodes in set(keys):
            idx = [i for i, k in enumerate(keys) if k == nodes]
            estimates = model.predict_group([cands[i].features for i in idx], probe.mc.config)
            joint[idx] = [est.cycles for est in estimates]
        tau, regret, groups = grouped([str(k) for k in keys], joint, measured)
        row["cost_models"][label]["candidates"] = {
            **_errors(alone, measured.tolist()),
            "tau": tau,
            "regret": regret,
            "groups": groups,
        }
    if oracle:
        options = EngineOptions(policy="oracle", validation=off)
        try:
            row["oracle"] = {"cycles": FusionEngine(graph, config, dtype, options).run(inputs).cycles}
        except EngineError as err:
            row["oracle"] = {"refused": str(err).splitlines()[0]}
    row["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def _pct(cycles: int, bound: float) -> str:
    return f"{bound / cycles:.1%}" if cycles else "-"


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f}"


def table(rows: list[tuple[str, str, str, dict]]) -> list[str]:
    head = [
        "model",
        "dtype",
        "roofline cyc",
        "none cyc (roofline)",
        "static cyc (roofline)",
        "dynamic cyc (roofline)",
        "dyn/none",
        "dyn/static",
        "compulsory MB",
        "DRAM MB none/static/dyn (x compulsory)",
        "energy dyn uJ",
        "plan s",
        "JIT s",
        "sim s (dyn)",
        "peak RSS MB",
    ]

    def cells(label: str, dtype: str, row: dict) -> list[str]:
        p, bound = row["policies"], row["bound"]
        none, static, dyn = p["none"], p["static"], p["dynamic"]
        dram = "/".join(_mb(p[k]["dram_bytes"]) for k in POLICIES)
        ratios = "/".join(f"{p[k]['dram_bytes'] / row['compulsory']:.1f}" for k in POLICIES)
        return [
            label,
            dtype,
            f"{bound:,.0f}",
            f"{none['cycles']:,} ({_pct(none['cycles'], bound)})",
            f"{static['cycles']:,} ({_pct(static['cycles'], bound)})",
            f"{dyn['cycles']:,} ({_pct(dyn['cycles'], bound)})",
            f"{none['cycles'] / dyn['cycles']:.2f}x",
            f"{static['cycles'] / dyn['cycles']:.2f}x",
            _mb(row["compulsory"]),
            f"{dram} ({ratios})",
            f"{dyn['energy_pj'] / 1e6:,.1f}",
            f"{dyn['plan_s']:.1f}",
            f"{dyn['jit_s']:.1f}",
            f"{dyn['sim_s']:.1f}",
            f"{row['rss_mb']:.0f}",
        ]

    return markdown(head, rows, cells)


def execution_table(rows: list[tuple[str, str, str, dict]]) -> list[str]:
    """The dynamic plan per execution model: kernels' sum, host-dispatched, one program, the overlap gained."""
    head = [
        "model",
        "dtype",
        "kernels' sum cyc",
        "launches",
        "host-dispatched cyc",
        "program cyc",
        "host/program",
        "overlap cyc (of sum)",
        "joined / fenced boundaries",
        "on-chip dispatch cyc (of program)",
        "program s",
    ]

    def cells(label: str, dtype: str, row: dict) -> list[str]:
        e = row["execution"]
        overlap = e["kernels"] - e["program"]
        return [
            label,
            dtype,
            f"{e['kernels']:,}",
            str(e["launches"]),
            f"{e['host']:,}",
            f"{e['program']:,}",
            f"{e['host'] / e['program']:.2f}x",
            f"{overlap:,} ({overlap / e['kernels']:.2%})",
            f"{e['joined']} / {e['fences']}",
            f"{e['dispatch']:,} ({e['dispatch'] / e['program']:.2%})",
            f"{e['seconds']:.1f}",
        ]

    return markdown(head, [r for r in rows if "error" in r[3] or "execution" in r[3]], cells)


def cost_error_table(rows: list[tuple[str, str, str, dict]]) -> list[str]:
    """Per policy, the analytic model's median / 90th percentile |error| over the kernels its plan ran."""
    head = ["model", "dtype"] + [f"{p} kernels, analytic err med / p90 (signed med)" for p in POLICIES]

    def cells(label: str, dtype: str, row: dict) -> list[str]:
        errors = [row["policies"][p].get("analytic_error", {"n": 0}) for p in POLICIES]
        return [label, dtype] + [f"{e['n']}: {_err(e)} ({e['signed']:+.1%})" if e["n"] else "-" for e in errors]

    return markdown(head, rows, cells)


def _err(e: dict) -> str:
    return f"{e['median']:.1%} / {e['p90']:.1%}" if e.get("n") else "-"


def stamp_text(stamp: dict) -> str:
    return "fresh" if stamp["stamp"] == stamp["code"] else f"stale ({stamp['stamp']}, code {stamp['code']})"


def cost_table(rows: list[tuple[str, str, str, dict]], labels: tuple[str, ...]) -> list[str]:
    """One row per model and dtype: per cost model its plan kernels' and candidates' error, ranking figures and
    plan cycles; the learned model's stamp status at the time of the row."""
    head = ["model", "dtype", "HPM stamp", "plan kernels"]
    head += [f"{m} plan err med / p90" for m in labels]
    head += ["candidates (groups)"] + [f"{m} cand err med / p90" for m in labels]
    head += [f"{m} tau / regret" for m in labels]
    head += [f"{m} dynamic cyc" for m in labels]
    head += ["hpm / analytic cyc" if labels == COST_MODELS else "-", "oracle cyc", "plan s " + "/".join(labels)]

    def cells(label: str, dtype: str, row: dict) -> list[str]:
        cms = row["cost_models"]
        first = cms[labels[0]]
        oracle = row.get("oracle", {})
        out = [label, dtype, stamp_text(row["hpm"]), "/".join(str(cms[m]["plan"]["n"]) for m in labels)]
        out += [_err(cms[m]["plan"]) for m in labels]
        out.append(f"{first['candidates']['n']} ({first['candidates']['groups']})")
        out += [_err(cms[m]["candidates"]) for m in labels]
        out += [f"{cms[m]['candidates']['tau']:.3f} / {cms[m]['candidates']['regret']:.2%}" for m in labels]
        out += [f"{cms[m]['cycles']:,}" for m in labels]
        out.append(f"{cms['hpm']['cycles'] / cms['analytic']['cycles']:.3f}" if labels == COST_MODELS else "-")
        out.append(f"{oracle['cycles']:,}" if "cycles" in oracle else "refused" if oracle else "-")
        out.append("/".join(f"{cms[m]['plan_s']:.1f}" for m in labels))
        return out

    return markdown(head, rows, cells)


def markdown(
    head: list[str], rows: list[tuple[str, str, str, dict]], cells: Callable[[str, str, dict], list[str]]
) -> list[str]:
    """The table: `cells(label, dtype, row)` gives a measured row's cells; a failed row says why."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, size, dtype, row in rows:
        label = name if size == "small" else f"{name} ({size})"
        label += " " + "x".join(map(str, spec(name).shape(size)[1:]))
        if "error" in row:
            lines.append(f"| {label} | {dtype} | " + " | ".join(["-"] * (len(head) - 3)) + f" | {_cell(row['error'])}")
        else:
            lines.append("| " + " | ".join(cells(label, dtype, row)) + " |")
    return lines


def _cell(text: str) -> str:
    return "failed: " + text.replace("|", "\\|")[:300] + " |"


POLICY_TEXT = (
    "Models: `bench/zoo` (random weights, seeded; docs/zoo.md), small inputs unless marked. Cycles are "
    "simulated (sum over the plan's kernels, host execution, validation off; the one-program figures are in the "
    "second table); `(roofline)` is the model's roofline bound / "
    "cycles, the bound being max(total MACs / peak MACs per cycle, compulsory DRAM bytes / DRAM bytes per "
    "cycle) with compulsory = graph inputs, weights as the kernels read them and outputs, each once "
    "(`fusion.cost.roofline`, the number `dynfuse fuse --report/--compare/--json` prints). DRAM MB are per "
    "policy with their ratio to the compulsory bytes. `plan s` / `JIT s` are the dynamic policy's planning "
    "and kernel compile (wall), `sim s` the rest of its run (simulating the kernels, host data movement), "
    "`peak RSS` the measuring process's maximum resident set over its three policies. A failed model is a "
    "row with the error its run ended with. The cost models' per-kernel error and plan quality on the same models "
    "(`--cost-models analytic,hpm`) are in [zoo_cost_models.md](zoo_cost_models.md)."
)
EXECUTION_TEXT = (
    "The dynamic plan above under the three execution models (`fusion.engine.program_figures.measure`, "
    "docs/program.md): `kernels' sum` = each planned group simulated as its own program (no pipelined pairs), "
    "cycles added; `host-dispatched` = that sum + `launch_cycles` (5 us at the clock) per launched kernel "
    "(`launches`; views launch nothing); `program` = the plan linked into one binary (token-ordered kernel "
    "boundaries where the link measured a gain, on-chip dense/zero-skip dispatch within its 1% budget), one "
    "simulation. `overlap` = kernels' sum - program: what the boundaries gain (the next kernel's loads under the "
    "current kernel's compute, fences dropped), launches aside. `on-chip dispatch`: the measuring code's cycles "
    "inside the program. `program s`: wall time of these three measurements."
)
COST_ERROR_TEXT = (
    "The analytic model's error on every kernel each policy's plan ran above (`bench/bench_cost_error.py`, which "
    "also measures the learned model and splits the error by kernel kind): (predicted - measured) / measured "
    "cycles from the features and simulated cycles the engine recorded, nothing re-simulated; pipelined pairs and "
    "views left out. Target (#17): the median <= 10% per model."
)
COST_TEXT = (
    "Cost models against the simulator on the zoo (`measure_cost_models` in `bench/bench_zoo.py`), small inputs, "
    "validation off. Error = |predicted - measured| / measured cycles, as median / 90th percentile. `plan`: the "
    "kernels the engine's `dynamic` plan made with that model dispatched, predicted as the planner priced them, "
    "measured on the model's input (`plan kernels`: how many, per model; pipelined pairs left out). `cand`: every "
    "kernel either planner built and priced (the candidates branch and bound did not prune), each distinct program "
    "once, simulated on zero inputs (zero-skip kernels and views left out), predicted by each model; `tau / "
    "regret`: mean Kendall tau between each model's joint ranking of a set of nodes' schedules (`predict_group`, as "
    "the planner ranks them) and the measured one, and the mean selection regret (how much slower the schedule it "
    "ranks first is than the fastest), over the `groups` with at least two schedules. `dynamic cyc`: the measured "
    "cycles of the dynamic plan made with each model (`hpm / analytic` < 1: the learned model's plan is faster); "
    "`oracle cyc`: the oracle policy's plan (every legal plan measured) where its search is affordable. "
    "`HPM stamp`: whether the learned model (`{path}`) was calibrated on the kernel generators of the code measured "
    "(`fusion.hpm.stamp`); a stale model is measured as it is (the engine would warn and plan with the analytic "
    "model), so its figures describe a model behind the generators."
)


def write_results(args: argparse.Namespace, rows: list, planned: int, seconds: float) -> None:
    machine = (
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.1f} at the end (timings are wall time on a shared machine)"
    )
    command = "python bench/bench_zoo.py " + " ".join(sys.argv[1:])
    partial = "" if len(rows) == planned else f" (partial: {len(rows)} of {planned} rows)"
    if args.cost_models:
        labels = tuple(args.cost_models.split(","))
        path = next((r["hpm"]["path"] for *_, r in rows if "hpm" in r), "fusion/hpm/data/hpm.npz")
        title, text, body = "# Model zoo: cost models", COST_TEXT.format(path=path), cost_table(rows, labels)
    else:
        title, text = "# Model zoo benchmark", POLICY_TEXT
        body = table(rows)
        if any("execution" in r for *_, r in rows):
            body += ["", "## Execution models (dynamic plan)", "", EXECUTION_TEXT, "", *execution_table(rows)]
        body += ["", "## Analytic cost model: per-kernel error", "", COST_ERROR_TEXT, "", *cost_error_table(rows)]
    args.out.write_text(
        f"{title}\n\n`{command}` on `{args.config}`, {machine}; {seconds:.0f} s{partial}. {text}\n\n"
        + "\n".join(body)
        + "\n"
    )


def progress(row: dict) -> str:
    if "policies" in row:
        return f"dynamic {row['policies']['dynamic']['cycles']:,} cycles"
    cms = row["cost_models"]
    return ", ".join(f"{m}: plan {c['cycles']:,} cycles, candidates {_err(c['candidates'])}" for m, c in cms.items())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="base")
    ap.add_argument("--models", help=f"comma-separated (default: all): {', '.join(NAMES)}")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--full", action="store_true", help="also the full-size inputs (resnet18 at 224x224)")
    ap.add_argument("--sizes", help="comma-separated sizes to measure (default: small, plus full with --full)")
    ap.add_argument(
        "--cost-models",
        help=f"measure these cost models instead of the policies (comma-separated, of {', '.join(COST_MODELS)})",
    )
    ap.add_argument(
        "--oracle",
        default=",".join(ORACLE_MODELS),
        help="with --cost-models: models whose oracle plan is measured too (comma-separated; empty: none)",
    )
    ap.add_argument(
        "--no-execution",
        action="store_true",
        help="skip the execution-models table (the program figures: ~5 min more for resnet18 small on 2 cores)",
    )
    ap.add_argument("--out", type=Path, help="default: bench/results/zoo.md (zoo_cost_models.md with --cost-models)")
    ap.add_argument("--child", nargs=3, metavar=("NAME", "SIZE", "DTYPE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    labels = tuple(args.cost_models.split(",")) if args.cost_models else ()
    if unknown := [m for m in labels if m not in COST_MODELS]:
        ap.error(f"unknown cost model(s) {', '.join(unknown)}; known: {', '.join(COST_MODELS)}")
    oracle = tuple(filter(None, args.oracle.split(",")))
    if args.child:
        name, size, dtype = args.child
        if labels:
            print(json.dumps(measure_cost_models(name, size, dtype, args.config, labels, name in oracle)))
        else:
            print(json.dumps(measure(name, size, dtype, args.config, not args.no_execution)))
        return 0
    args.out = args.out or (COST_RESULTS if labels else RESULTS)
    extra = ("--cost-models", args.cost_models, "--oracle", args.oracle) if labels else ()
    extra += ("--no-execution",) if args.no_execution else ()
    names = args.models.split(",") if args.models else list(NAMES)
    dtypes = args.dtypes.split(",")
    sizes = tuple(args.sizes.split(",")) if args.sizes else ("small", "full") if args.full else ("small",)
    jobs = [(n, s, d) for s in sizes for n in names if s in spec(n).sizes for d in dtypes]
    start = time.perf_counter()
    for size in sizes:
        prefetch(tuple(names), size)
    rows = []
    for name, size, dtype in jobs:
        row = measure_in_child(name, size, dtype, args.config, extra)
        rows.append((name, size, dtype, row))
        status = row.get("error") or progress(row)
        print(f"{name} {size} {dtype}: {status} ({row.get('wall_s', 0):.0f} s)", flush=True)
        write_results(args, rows, len(jobs), time.perf_counter() - start)  # a partial table survives a stop
    print("\n".join(cost_table(rows, labels) if labels else table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
