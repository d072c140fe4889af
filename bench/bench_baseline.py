"""The unfused baseline: what every end-to-end model costs on the simulated accelerator without fusion.

Per model and dtype: simulated cycles, DRAM bytes (read + write), energy, the roofline lower bound (cycles no
schedule can beat: max(MACs / N^2, DRAM bytes / bytes per cycle)) and how close the baseline gets to it,
instructions, kernels, and wall-clock compile time. These are the numbers the fusion engine must beat.
Prints a table and writes bench/results/baseline.md.
Run: python bench/bench_baseline.py [--config base]
"""

from __future__ import annotations

import argparse
import platform
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
    graph = load_graph(MODELS_DIR / f"{name}.onnx")
    inputs = {graph.inputs[0]: data["input"]}
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
    args = parser.parse_args()
    rows = [measure(name, dtype, args.config) for name in MODELS for dtype in ("fp32", "int8")]
    table = Table(title=f"unfused baseline on '{args.config}'")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("model", "dtype") else "right")
    for row in rows:
        table.add_row(*row)
    Console().print(table)
    lines = [
        "# Unfused baseline",
        "",
        f"`python bench/bench_baseline.py --config {args.config}` on {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}. Every node is its own kernel (base ISA, DRAM in and out, "
        "double-buffered tiles); inputs are the stored test inputs of each model; int8 is calibrated on them.",
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
    RESULTS.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
