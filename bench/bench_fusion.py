"""Fusion engine: none / static / dynamic (/ oracle) on the bundled models, plus sparse and drifting data.

Reports simulated cycles, DRAM bytes, energy and the roofline bound per policy, the speedup ratios, planning and
JIT compile latency, and the cache-hit dispatch overhead per kernel (host time, simulation excluded).
Usage: python bench/bench_fusion.py [--dtype int8] [--config base]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from fusion.cost.roofline import model_roofline
from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.validation import ValidationPolicy
from fusion.engine.workers import available_cores
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower.compiler import load_graph

MODELS = Path(__file__).resolve().parents[1] / "tests" / "fusion" / "models"
NAMES = ("mlp", "encoder_post_d64", "encoder_pre_d64", "encoder_post_d128", "resnet_block")
ORACLE = ("mlp",)
RESULTS = Path(__file__).parent / "results"
WARM_CALLS = 21
PLAN_REPEATS = 3
POOL_WORKERS = max(2, available_cores())  # the compile pool, measured even where it is not the default


def _engine(
    graph, policy: str, dtype: str, config: str, samples, pipeline: bool = True, workers: int | None = None
) -> FusionEngine:
    # host execution: this bench measures the kernels one by one (their sum, pipelined pairs, per-kernel dispatch);
    # the plan as one program is bench_program.py's
    options = EngineOptions(policy=policy, validation=ValidationPolicy("off"), pipeline=pipeline, execution="host")
    if workers is not None:
        options = replace(options, workers=workers)
    return FusionEngine(graph, config, dtype, options, samples=samples)


def plan_ms(graph, dtype: str, config: str, inputs) -> dict[int, float]:
    """The dynamic policy's planning time in this process (workers=1) and on the compile pool, best of
    PLAN_REPEATS each, interleaved so both see the same machine load."""
    best = {1: float("inf"), POOL_WORKERS: float("inf")}
    for _ in range(PLAN_REPEATS):
        for workers in best:
            engine = _engine(graph, "dynamic", dtype, config, [inputs], workers=workers)
            engine.run(inputs)
            engine.close()
            best[workers] = min(best[workers], engine.plan_seconds * 1e3)
    return best


def measure_model(name: str, dtype: str, config: str) -> dict:
    graph = load_graph(MODELS / f"{name}.onnx")
    inputs = {graph.inputs[0]: np.load(MODELS / f"{name}.npz")["input"]}
    row: dict = {"model": name}
    for policy in ("none", "static", "dynamic", *(("oracle",) if name in ORACLE else ())):
        engine = _engine(graph, policy, dtype, config, [inputs])
        result = engine.run(inputs)
        row[policy] = result
        if policy == "dynamic":
            row["plan_ms"] = plan_ms(graph, dtype, config, inputs)
            row["jit_ms"] = engine.compile_seconds * 1e3
            row["codegen_ms"] = engine.codegen_seconds * 1e3
            per_kernel = []
            for _ in range(WARM_CALLS):
                warm = engine.run(inputs)
                per_kernel.append(warm.dispatch_seconds / len(warm.records))
            row["dispatch_us"] = 1e6 * float(np.median(per_kernel))
            row["roofline"] = model_roofline(engine.graph, engine.config, engine.mc.qplan).cycles
            row["pairs"] = len(engine.plan.pipelined)
            row["unpaired"] = _engine(graph, policy, dtype, config, [inputs], pipeline=False).run(inputs).cycles
    return row


def sparse_rows(dtype: str, config: str) -> list[tuple[str, int, int]]:
    """A Linear+ReLU layer fed ReLU-sparse activations (dead channel groups, ~85% zeros), then drifting data."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("linear_relu")
    x = b.input("x", (64, 256))
    w = b.constant((rng.standard_normal((256, 128)) / 16).astype(np.float32))
    bias = b.constant((rng.standard_normal(128) * 0.1).astype(np.float32))
    b.output(b.op(OpType.Relu, b.op(OpType.Gemm, x, w, bias)))
    graph = b.build()
    dense = {"x": rng.standard_normal((64, 256)).astype(np.float32)}
    sparse = np.maximum(rng.standard_normal((64, 256)), 0).astype(np.float32)
    for g in rng.permutation(16)[:12]:
        sparse[:, g * 16 : (g + 1) * 16] = 0
    sparse_in = {"x": sparse}
    dyn = _engine(graph, "dynamic", dtype, config, [dense, sparse_in])
    static = _engine(graph, "static", dtype, config, [dense, sparse_in])
    rows = [
        (
            "sparse (%.0f%% zeros)" % (100 * np.mean(sparse == 0)),
            dyn.run(sparse_in).cycles,
            static.run(sparse_in).cycles,
        )
    ]
    drift_dyn = drift_static = 0
    for inputs in (dense, sparse_in, dense, sparse_in, sparse_in, dense):
        drift_dyn += dyn.run(inputs).cycles
        drift_static += static.run(inputs).cycles
    rows.append(("drifting dense/sparse x6", drift_dyn, drift_static))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dtype", default="int8", choices=("int8", "fp32"))
    ap.add_argument("--config", default="base")
    args = ap.parse_args()
    start = time.perf_counter()
    rows = [measure_model(n, args.dtype, args.config) for n in NAMES]
    sparse = sparse_rows(args.dtype, args.config)
    table = Table(title=f"fusion policies ({args.dtype}, {args.config})")
    head = [
        "model",
        "none cyc",
        "static cyc",
        "dynamic cyc",
        "unpipelined / pairs",
        "oracle cyc",
        "dyn/none",
        "dyn/static",
        "dyn vs oracle",
        "DRAM none/static/dyn",
        "energy dyn uJ",
        "roofline",
        f"plan ms 1 / {POOL_WORKERS} workers",
        "JIT ms",
        "codegen ms",
        "dispatch us/kernel",
    ]
    for h in head:
        table.add_column(h, justify="right")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        none, static, dyn = r["none"], r["static"], r["dynamic"]
        oracle = r.get("oracle")
        cells = [
            r["model"],
            str(none.cycles),
            str(static.cycles),
            str(dyn.cycles),
            f"{r['unpaired']} / {r['pairs']}",
            str(oracle.cycles) if oracle else "-",
            f"{none.cycles / dyn.cycles:.2f}x",
            f"{static.cycles / dyn.cycles:.2f}x",
            f"{dyn.cycles / oracle.cycles - 1:+.1%}" if oracle else "-",
            f"{none.dram_bytes}/{static.dram_bytes}/{dyn.dram_bytes}",
            f"{dyn.energy_pj / 1e6:.2f}",
            f"{r['roofline']:.0f}",
            " / ".join(f"{ms:.0f}" for ms in r["plan_ms"].values()),
            f"{r['jit_ms']:.1f}",
            f"{r['codegen_ms']:.1f}",
            f"{r['dispatch_us']:.1f}",
        ]
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    sp = Table(title="sparse and drifting activations (Linear 256->128 + ReLU)")
    for h in ("data", "dynamic cycles", "static cycles", "static/dynamic"):
        sp.add_column(h, justify="right")
    sp_lines = ["| data | dynamic cycles | static cycles | static/dynamic |", "|---|---|---|---|"]
    for name, d, s in sparse:
        cells = [name, str(d), str(s), f"{s / d:.2f}x"]
        sp.add_row(*cells)
        sp_lines.append("| " + " | ".join(cells) + " |")
    console = Console()
    console.print(table)
    console.print(sp)
    machine = (
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.1f} at the end (timings are wall time on a shared machine)"
    )
    results = RESULTS / ("fusion.md" if args.dtype == "int8" else f"fusion_{args.dtype}.md")
    results.write_text(
        "# Fusion engine benchmark\n\n"
        f"`python bench/bench_fusion.py --dtype {args.dtype} --config {args.config}` on {machine}; "
        f"{time.perf_counter() - start:.0f} s. Cycles are simulated (sum over the plan's kernels); `plan ms` is the "
        "dynamic policy's planning (candidate generation, codegen of every candidate schedule, cost model), best of "
        f"{PLAN_REPEATS}, with kernels built in this process (1 worker) and on the compile pool (forked worker "
        "processes, measured interleaved with the former), `JIT ms` "
        "the compile of the chosen kernels through the cache (wall time on the worker pool; planning already built "
        "them), `codegen ms` the cold codegen + link time of exactly those kernels (summed), `dispatch us/kernel` "
        "the median host time of a cache-hit dispatch (data-class check, cache lookup, guard), simulation "
        "excluded. Roofline: the model's bound (`fusion.cost.roofline`: max(MACs / N^2, compulsory DRAM bytes / "
        "bytes per cycle), the same for every policy). `unpipelined / "
        "pairs`: the dynamic plan's cycles without pipelined pairs (`EngineOptions(pipeline=False)`: every group its "
        "own program ending in a fence) / the number of complementary pairs it runs as one program.\n\n"
        + "\n".join(lines)
        + "\n\n"
        + "\n".join(sp_lines)
        + "\n"
    )
    console.print(f"wrote {results}")


if __name__ == "__main__":
    main()
