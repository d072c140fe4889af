"""Host-side cost of the engine: planning time, JIT time, peak memory per zoo model, and cache-hit dispatch latency.

Each (model, size, dtype) is planned by the `dynamic` policy in its own child process (so its peak RSS is its
own): `plan s` is `FusionEngine.plan_seconds` (candidates, codegen of every schedule tried, cost model, the
kernels simulated while planning, pipelined pairs), `JIT s` the planned kernels through the cache, `built` the
candidate kernels generated, assembled, linked and counted while planning and `measured` the kernels simulated
while planning, each with their host seconds, all in CPU seconds of the process (the
machine is shared with other jobs; alone, wall time is the same), `wall s` plan + JIT in wall seconds, `peak RSS`
the child's maximum resident set after its first call (plan + JIT + one simulated run), `cycles` the plan's
simulated cycles, `plan` a digest of the plan (its groups, schedules, predictions, reasons, refusals and
pipelined pairs) and `chosen` a digest of the kernels it runs (groups with their schedules, pipelined pairs): what a
planning speed-up must not change (one that only measures or builds less may change `plan`'s reasons and listed
alternatives, never `chosen`). Dispatch: the median host time of a cache-hit
dispatch per kernel over warm calls of
a bundled model and a zoo model, wall and thread CPU time (the CPU figure does not see this shared machine's
other jobs).

`--baseline DIR` runs every child a second time on another source tree (e.g. `git archive <commit> | tar -x -C
DIR`), interleaved with this one so both see the same machine load, and reports the two side by side.

    python bench/bench_planning.py                                  # -> bench/results/planning.md
    python bench/bench_planning.py --models bert:small:int8 --out /tmp/p.md
    python bench/bench_planning.py --baseline /tmp/base             # before / after
    python bench/bench_planning.py --models bert:small:int8 --baseline /tmp/base --repeat 5   # medians of 5
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "planning.md"
MODELS = (
    "resnet18:full:int8",
    "resnet18:small:int8",
    "resnet50:small:fp32",
    "resnet50:small:int8",
    "mobilenet_v2:small:int8",
    "vit:small:int8",
    "bert:small:int8",
    "bert:small:fp32",
    "gpt2:small:int8",
    "llama:small:int8",
    "whisper_encoder:small:int8",
)
DISPATCH = ("bundled:encoder_post_d64:int8", "zoo:bert:int8")
WARM_CALLS = 41
CHILD_TIMEOUT_S = 3600
MAX_REPEAT = 20


class _Planned(Exception):
    """Stops a first call once it has planned and compiled (`--no-run`)."""


def plan_child(name: str, size: str, dtype: str, run: str = "run") -> dict:
    """Plan, JIT and (`run` == "run") run one zoo model once (in this process); plan and JIT times in CPU
    seconds. Without the run, the first call stops after planning and JIT (`cycles` is not measured)."""
    import fusion.engine.engine as engine_module
    import fusion.engine.planner as planner_module
    from bench.zoo import zoo_model
    from fusion.engine.engine import EngineOptions, FusionEngine
    from fusion.engine.validation import ValidationPolicy
    from fusion.lower.compiler import load_graph

    entry = zoo_model(name, size)
    graph = load_graph(entry.onnx_path)
    inputs = {graph.inputs[0]: entry.input}
    for module in (engine_module, planner_module):  # the engine's timers read this process's CPU time
        module.time = _Clock(time.process_time)
    built = [0, 0.0]  # candidate builds in this process and their CPU seconds
    build_and_count = planner_module.build_and_count

    def counted_build(*args, **kwargs):
        begin = time.process_time()
        try:
            return build_and_count(*args, **kwargs)
        finally:
            built[0] += 1
            built[1] += time.process_time() - begin

    planner_module.build_and_count = counted_build
    walls = []
    planned = FusionEngine._planned

    def wall_timed(self, *args, **kwargs):  # plan + JIT (`FusionEngine._planned`) in wall seconds
        begin = time.perf_counter()
        try:
            plan = planned(self, *args, **kwargs)
        finally:
            walls.append(time.perf_counter() - begin)
        if run != "run":
            raise _Planned(plan)
        return plan

    FusionEngine._planned = wall_timed
    start = time.perf_counter()
    engine = FusionEngine(graph, "base", dtype, EngineOptions(validation=ValidationPolicy("off")))
    try:
        cycles = engine.run(inputs).cycles
        plan = engine.plan
    except _Planned as planned_only:
        cycles, plan = None, planned_only.args[0]
    measured = plan.measured
    digest = hashlib.sha256(repr((plan.choices, plan.rejected, plan.pipelined)).encode()).hexdigest()[:12]
    chosen = hashlib.sha256(repr(([c.group for c in plan.choices], plan.pipelined)).encode()).hexdigest()[:12]
    return {
        "plan_s": engine.plan_seconds,
        "jit_s": engine.compile_seconds,
        "wall_s": sum(walls),
        "plan": digest,
        "chosen": chosen,
        "first_call_s": time.perf_counter() - start,
        "measured": None if measured is None else [measured.kernels, measured.seconds],
        "built": built,
        "pairs": len(plan.pipelined),
        "groups": len(plan.choices),
        "cycles": cycles,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def dispatch_child(kind: str, name: str, dtype: str) -> dict:
    """Median cache-hit dispatch time per kernel over WARM_CALLS calls: wall (the engine's own figure) and the
    same span in thread CPU time."""
    import numpy as np

    import fusion.engine.engine as engine_module
    from fusion.engine.engine import EngineOptions, FusionEngine
    from fusion.engine.validation import ValidationPolicy
    from fusion.lower.compiler import load_graph

    if kind == "bundled":
        models = ROOT / "tests" / "fusion" / "models"
        graph = load_graph(models / f"{name}.onnx")
        inputs = {graph.inputs[0]: np.load(models / f"{name}.npz")["input"]}
    else:
        from bench.zoo import zoo_model

        entry = zoo_model(name, "small")
        graph = load_graph(entry.onnx_path)
        inputs = {graph.inputs[0]: entry.input}
    options = EngineOptions(validation=ValidationPolicy("off"), execution="host")
    engine = FusionEngine(graph, "base", dtype, options, samples=[inputs])
    engine.run(inputs)
    figures = {}
    for clock, counter in (("wall", time.perf_counter), ("cpu", time.thread_time)):
        engine_module.time = _Clock(counter)
        per_kernel = []
        for _ in range(WARM_CALLS):
            warm = engine.run(inputs)
            per_kernel.append(warm.dispatch_seconds / len(warm.records))
        figures[clock] = 1e6 * float(np.median(per_kernel))
    return {"wall_us": figures["wall"], "cpu_us": figures["cpu"], "kernels": len(warm.records)}


class _Clock:
    """Stands in for the `time` module in an engine module, so its timers read another clock."""

    def __init__(self, counter) -> None:
        self.perf_counter = counter


def run_child(tree: Path, args: list[str]) -> dict:
    """This script's child mode on the source tree `tree` (its packages first on the path)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", *args],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"over {CHILD_TIMEOUT_S} s"}
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["no output"]
        return {"error": lines[-1][:200]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _table(trees: list[tuple[str, Path]], head: list[str], rows: list, cells, repeat: int = 1) -> list[str]:
    """Markdown rows: each (model, dtype, child arguments) measured on every tree in turn (interleaved), `repeat`
    rounds of them, each tree's row the median of its rounds (`_median`)."""
    several = len(trees) > 1
    lines = ["| " + " | ".join((["tree"] if several else []) + head) + " |", "|" + "---|" * (len(head) + several)]
    for model, dtype, child in rows:
        runs: dict[str, list[dict]] = {label: [] for label, _ in trees}
        for _ in range(repeat):
            for label, tree in trees:
                runs[label].append(run_child(tree, child))
        for label, _ in trees:
            r = _median(runs[label])
            row = [model, dtype, *([r["error"]] if "error" in r else cells(r))]
            row += [""] * (len(head) - len(row))
            lines.append("| " + " | ".join(([label] if several else []) + row) + " |")
            print(lines[-1], flush=True)
    return lines


def _median(runs: list[dict]) -> dict:
    """One row from several runs of the same child: the median of each figure in seconds, microseconds or MB,
    the rest from the first run; an error if any run failed, or if the runs' plans or cycles differ (planning must not
    depend on the machine's load)."""
    failed = [r for r in runs if "error" in r]
    if failed:
        return failed[0]
    first = runs[0]
    if any((r.get("plan"), r.get("cycles")) != (first.get("plan"), first.get("cycles")) for r in runs):
        return {"error": "plans differ between runs: " + ", ".join(str(r.get("plan")) for r in runs)}
    row = {k: statistics.median(r[k] for r in runs) for k in first if k.endswith(("_s", "_us", "_mb"))}
    for figure in ("measured", "built"):
        if first.get(figure):
            row[figure] = [first[figure][0], statistics.median(r[figure][1] for r in runs)]
    return {**first, **row}


def _plan_cells(r: dict) -> list[str]:
    kernels, seconds = r["measured"] or (0, 0.0)
    builds, build_s = r.get("built") or (0, 0.0)
    return [
        f"{r['plan_s']:.2f}",
        f"{r['jit_s']:.2f}",
        f"{r['wall_s']:.1f}",
        f"{builds} / {build_s:.1f}",
        f"{kernels} / {seconds:.1f}",
        str(r["pairs"]),
        f"{r['peak_rss_mb']:.0f}",
        "not run" if r["cycles"] is None else f"{r['cycles']:,}",
        f"`{r['plan']}`",
        f"`{r['chosen']}`",
    ]


def _dispatch_cells(r: dict) -> list[str]:
    return [str(r["kernels"]), f"{r['wall_us']:.1f}", f"{r['cpu_us']:.1f}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help="name:size:dtype,... (zoo models)")
    ap.add_argument("--dispatch", default=",".join(DISPATCH), help="bundled|zoo:name:dtype,... ('' for none)")
    ap.add_argument("--baseline", type=Path, help="another source tree, measured side by side")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--no-run", action="store_true", help="plan and JIT only: no simulated first run (no cycles)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds per tree, interleaved; rows are their medians")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        sys.path.insert(0, os.getcwd())  # the tree measured (`bench.zoo` of that tree)
        kind, *rest = args.child
        result = plan_child(*rest) if kind == "plan" else dispatch_child(*rest)
        print(json.dumps(result))
        return
    trees = [("this", ROOT)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    start = time.perf_counter()
    head = ["model", "dtype", "plan s (CPU)", "JIT s (CPU)", "wall s", "built kernels / s", "measured kernels / s"]
    head += ["pairs", "peak RSS MB"]
    head += ["cycles", "plan", "chosen"]
    plans = [(name, size, dtype) for name, size, dtype in (m.split(":") for m in filter(None, args.models.split(",")))]
    mode = "plan" if args.no_run else "run"
    if not 1 <= args.repeat <= MAX_REPEAT:
        ap.error(f"--repeat must be 1..{MAX_REPEAT}")
    rows = [(f"{n} ({s})", d, ["plan", n, s, d, mode]) for n, s, d in plans]
    lines = _table(trees, head, rows, _plan_cells, args.repeat)
    dhead = ["model", "dtype", "kernels", "dispatch us/kernel wall", "dispatch us/kernel CPU"]
    items = [m.split(":") for m in filter(None, args.dispatch.split(","))]
    drows = [(f"{n} ({k})", d, ["dispatch", k, n, d]) for k, n, d in items]
    dlines = _table(trees, dhead, drows, _dispatch_cells, args.repeat)
    machine = (
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, load average "
        f"{os.getloadavg()[0]:.1f} at the end (wall times on a shared machine)"
    )
    base = f"; baseline tree `{args.baseline}`" if args.baseline else ""
    args.out.write_text(
        "# Planning, JIT and dispatch cost\n\n"
        f"`python bench/bench_planning.py` on `base`, {machine}{base}; {time.perf_counter() - start:.0f} s. "
        "Dynamic policy, validation off, each model in its own process (`peak RSS` is that process's, after "
        + ("planning and JIT; `--no-run`: no simulated run, no cycles" if args.no_run else "planning, JIT and one run")
        + "). `wall s`: plan + JIT in wall seconds; `built`: candidate kernels generated while planning and their "
        "host seconds; `measured`: kernels simulated while planning and their host seconds; `pairs`: pipelined "
        "pairs taken; `cycles`: the plan's simulated cycles; "
        "`plan`: digest of the plan (groups, schedules, predictions, reasons, pairs); `chosen`: digest of the "
        "kernels it runs (groups with their schedules, pairs).\n\n"
        + "\n".join(lines)
        + "\n\nCache-hit dispatch (median over "
        f"{WARM_CALLS} warm calls, host execution, simulation excluded):\n\n" + "\n".join(dlines) + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
