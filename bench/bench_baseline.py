"""The unfused baseline: what every end-to-end model costs on the simulated accelerator without fusion.

Per model and dtype: simulated cycles, DRAM bytes (read + write), energy, the roofline lower bound (cycles no
schedule can beat: max(MACs / N^2, DRAM bytes / bytes per cycle)) and how close the baseline gets to it,
instructions, kernels, and wall-clock compile time. These are the numbers the fusion engine must beat.
Prints a table and writes bench/results/baseline.md.
Run: python bench/bench_baseline.py [--config base]

`--zoo resnet18:small,mobilenet_v2:small,resnet18:full` measures zoo CNNs instead (int8 by default, `--dtypes`),
calibrated on and run with the zoo's stored input, and writes bench/results/baseline_zoo.md (`--out`).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from fusion.graph.cost import node_cost
from fusion.lower.compiler import ALIAS_OPS, compile, load_graph

MODELS_DIR = Path(__file__).resolve().parents[1] / "tests" / "fusion" / "models"
MODELS = ("mlp", "encoder_post_d64", "encoder_pre_d64", "encoder_post_d128", "resnet_block")
RESULTS = Path(__file__).parent / "results" / "baseline.md"
ZOO_RESULTS = Path(__file__).parent / "results" / "baseline_zoo.md"
COLUMNS = (
    "model",
    "dtype",
    "cycles",
    "DRAM bytes",
    "energy (uJ)",
    "roofline cycles",
    "roofline %",
    "node roofline",
    "instructions",
    "kernels",
    "compile (s)",
)


def node_roofline(graph, config, dtype: str) -> int:
    """Sum over kernels of each node's analytic roofline (its compulsory DRAM traffic and MACs alone)."""
    elem = 1 if dtype == "int8" else None
    return sum(node_cost(graph, n, config, elem).cycles for n in graph.nodes if n.op not in ALIAS_OPS)


def measure(name: str, dtype: str, config: str) -> tuple[str, ...]:
    data = np.load(MODELS_DIR / f"{name}.npz")
    return measure_graph(name, load_graph(MODELS_DIR / f"{name}.onnx"), data["input"], dtype, config)


def measure_zoo(name: str, size: str, dtype: str, config: str) -> tuple[str, ...]:
    """A zoo model (exported first if the cache lacks it) on its stored input."""
    from bench.zoo import zoo_model

    entry = zoo_model(name, size)
    return measure_graph(f"{name} ({size})", load_graph(entry.onnx_path), entry.input, dtype, config)


def measure_graph(name: str, graph, x: np.ndarray, dtype: str, config: str) -> tuple[str, ...]:
    inputs = {graph.inputs[0]: x}
    start = time.perf_counter()
    model = compile(graph, config, dtype, samples=[inputs] if dtype == "int8" else None, cleanup=False)
    seconds = time.perf_counter() - start
    _, c = model.run(inputs)
    return (
        name,
        dtype,
        f"{c.cycle:,}",
        f"{c.dram_read_bytes + c.dram_write_bytes:,}",
        f"{c.energy_total_pj / 1e6:.2f}",
        f"{c.roofline_bound_cycles:,.0f}",
        f"{100 * c.roofline_fraction:.1f}",
        f"{node_roofline(model.graph, model.config, dtype):,}",
        f"{c.instret:,}",
        str(len(model.kernels)),
        f"{seconds:.3f}",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="base", help="machine preset or .toml")
    parser.add_argument("--zoo", default="", help="comma-separated zoo models as name:size (small or full)")
    parser.add_argument("--dtypes", default="", help="comma-separated (default: fp32,int8; int8 with --zoo)")
    parser.add_argument("--out", type=Path, default=None, help="results file (default: baseline[_zoo].md)")
    args = parser.parse_args()
    dtypes = [d for d in args.dtypes.split(",") if d] or (["int8"] if args.zoo else ["fp32", "int8"])
    if args.zoo:
        models = [item.partition(":") for item in args.zoo.split(",") if item]
        rows = [measure_zoo(m, size or "small", d, args.config) for m, _, size in models for d in dtypes]
    else:
        rows = [measure(name, dtype, args.config) for name in MODELS for dtype in dtypes]
    table = Table(title=f"unfused baseline on '{args.config}'")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("model", "dtype") else "right")
    for row in rows:
        table.add_row(*row)
    Console().print(table)
    command = " ".join(["python bench/bench_baseline.py", *(sys.argv[1:] or ["--config", args.config])])
    machine = platform.processor() or platform.machine()
    lines = [
        "# Unfused baseline" + (" on zoo CNNs" if args.zoo else ""),
        "",
        f"`{command}` on {machine}, "
        f"Python {platform.python_version()}. Every node is its own kernel (base ISA, DRAM in and out, "
        "double-buffered tiles); inputs are the stored test (or zoo) inputs of each model; int8 is calibrated on them.",
        "Roofline cycles: max(MACs / N^2, DRAM bytes / bytes per cycle) for this run's own traffic; "
        "roofline % = roofline cycles / cycles. Node roofline: the sum of `fusion.graph.cost` per-node bounds "
        "(each node's own inputs, weights and outputs moved once; int8 at 1 byte per element). "
        "Compile time is wall clock (import and clean-up excluded).",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]
    (args.out or (ZOO_RESULTS if args.zoo else RESULTS)).write_text("\n".join(lines))


if __name__ == "__main__":
    main()
