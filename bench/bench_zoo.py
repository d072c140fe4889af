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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `bench.zoo` from a script run as `python bench/bench_zoo.py`

from bench.zoo import NAMES, prefetch, spec, zoo_model  # noqa: E402

POLICIES = ("none", "static", "dynamic")
DTYPES = ("fp32", "int8")
RESULTS = Path(__file__).parent / "results" / "zoo.md"
CHILD_TIMEOUT_S = 3600


def measure(name: str, size: str, dtype: str, config: str) -> dict:
    """One model at one size and dtype under each policy (in this process)."""
    from fusion.cost.roofline import model_roofline
    from fusion.engine.engine import EngineOptions, FusionEngine
    from fusion.engine.validation import ValidationPolicy
    from fusion.lower.compiler import load_graph

    entry = zoo_model(name, size)
    graph = load_graph(entry.onnx_path)
    inputs = {graph.inputs[0]: entry.input}
    row: dict = {"policies": {}}
    for policy in POLICIES:
        options = EngineOptions(policy=policy, validation=ValidationPolicy("off"))
        engine = FusionEngine(graph, config, dtype, options)
        start = time.perf_counter()
        result = engine.run(inputs)
        wall = time.perf_counter() - start
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
        }
    row["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def measure_in_child(name: str, size: str, dtype: str, config: str) -> dict:
    """`measure` in a child process: its own peak RSS, and a crash or timeout becomes the row's error."""
    command = [sys.executable, __file__, "--child", name, size, dtype, "--config", config]
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
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, size, dtype, row in rows:
        label = name if size == "small" else f"{name} ({size})"
        label += " " + "x".join(map(str, spec(name).shape(size)[1:]))
        if "error" in row:
            lines.append(f"| {label} | {dtype} | " + " | ".join(["-"] * (len(head) - 3)) + f" | {_cell(row['error'])}")
            continue
        p, bound = row["policies"], row["bound"]
        none, static, dyn = p["none"], p["static"], p["dynamic"]
        dram = "/".join(_mb(p[k]["dram_bytes"]) for k in POLICIES)
        ratios = "/".join(f"{p[k]['dram_bytes'] / row['compulsory']:.1f}" for k in POLICIES)
        cells = [
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
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _cell(text: str) -> str:
    return "failed: " + text.replace("|", "\\|")[:300] + " |"


def write_results(args: argparse.Namespace, rows: list, planned: int, seconds: float) -> None:
    machine = (
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.1f} at the end (timings are wall time on a shared machine)"
    )
    command = "python bench/bench_zoo.py " + " ".join(sys.argv[1:])
    partial = "" if len(rows) == planned else f" (partial: {len(rows)} of {planned} rows)"
    args.out.write_text(
        "# Model zoo benchmark\n\n"
        f"`{command}` on `{args.config}`, {machine}; {seconds:.0f} s{partial}. "
        "Models: `bench/zoo` (random weights, seeded; docs/zoo.md), small inputs unless marked. Cycles are "
        "simulated (sum over the plan's kernels, validation off); `(roofline)` is the model's roofline bound / "
        "cycles, the bound being max(total MACs / peak MACs per cycle, compulsory DRAM bytes / DRAM bytes per "
        "cycle) with compulsory = graph inputs, weights as the kernels read them and outputs, each once "
        "(`fusion.cost.roofline`, the number `dynfuse fuse --report/--compare/--json` prints). DRAM MB are per "
        "policy with their ratio to the compulsory bytes. `plan s` / `JIT s` are the dynamic policy's planning "
        "and kernel compile (wall), `sim s` the rest of its run (simulating the kernels, host data movement), "
        "`peak RSS` the measuring process's maximum resident set over its three policies. A failed model is a "
        "row with the error its run ended with.\n\n" + "\n".join(table(rows)) + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="base")
    ap.add_argument("--models", help=f"comma-separated (default: all): {', '.join(NAMES)}")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--full", action="store_true", help="also the full-size inputs (resnet18 at 224x224)")
    ap.add_argument("--sizes", help="comma-separated sizes to measure (default: small, plus full with --full)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--child", nargs=3, metavar=("NAME", "SIZE", "DTYPE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        name, size, dtype = args.child
        print(json.dumps(measure(name, size, dtype, args.config)))
        return 0
    names = args.models.split(",") if args.models else list(NAMES)
    dtypes = args.dtypes.split(",")
    sizes = tuple(args.sizes.split(",")) if args.sizes else ("small", "full") if args.full else ("small",)
    jobs = [(n, s, d) for s in sizes for n in names if s in spec(n).sizes for d in dtypes]
    start = time.perf_counter()
    for size in sizes:
        prefetch(tuple(names), size)
    rows = []
    for name, size, dtype in jobs:
        row = measure_in_child(name, size, dtype, args.config)
        rows.append((name, size, dtype, row))
        status = row.get("error") or f"dynamic {row['policies']['dynamic']['cycles']:,} cycles"
        print(f"{name} {size} {dtype}: {status} ({row.get('wall_s', 0):.0f} s)", flush=True)
        write_results(args, rows, len(jobs), time.perf_counter() - start)  # a partial table survives a stop
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
