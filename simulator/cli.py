"""`dynfuse sim`: run a program (.s or .bin) on a machine config and report its counters."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from simulator.config import PRESETS
from simulator.inputs import parse_input_args, random_inputs
from simulator.run import RunResult, load_program, simulate


def register(subparsers: argparse._SubParsersAction) -> None:
    sim = subparsers.add_parser("sim", help="simulate a program and report cycles, stalls, traffic and energy")
    sim.add_argument("program", type=Path, help="assembly source (.s) or binary object (.bin)")
    sim.add_argument("--config", default="base", help=f"preset ({', '.join(PRESETS)}) or a .toml file")
    sim.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="a kernel .input tensor from a .npy file (repeatable)",
    )
    sim.add_argument(
        "--random-inputs",
        type=int,
        metavar="SEED",
        help="fill every .input not given by --input with seeded random values (i8 full range, "
        "i32 in [-1000, 1000], f32 standard normal)",
    )
    sim.add_argument("--output-dir", type=Path, help="write each kernel .output tensor as DIR/NAME.npy")
    sim.add_argument("--trace", type=Path, help="write a Chrome trace-event JSON timeline (open in Perfetto)")
    sim.add_argument("--checked", action="store_true", help="detect unsynchronised data races between units")
    sim.add_argument("--json", action="store_true", help="print machine-readable counters instead of a table")
    sim.set_defaults(run=run_sim)


def run_sim(args: argparse.Namespace) -> int:
    program = load_program(args.program)
    inputs = parse_input_args(args.input)
    if args.random_inputs is not None:
        inputs = random_inputs(program, args.random_inputs, inputs)
    result = simulate(program, args.config, inputs, checked=args.checked, trace=bool(args.trace))
    if args.output_dir:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        for name, value in result.outputs.items():
            np.save(args.output_dir / f"{name}.npy", value)
    if args.trace:
        result.write_trace(args.trace)
    if args.json:
        print(
            json.dumps(
                {
                    "config": result.config.name,
                    "counters": result.counters.as_dict(),
                    "kernels": {k: c.as_dict() for k, c in result.kernel_counters.items()},
                },
                indent=2,
            )
        )
    else:
        _print_report(result)
    return 0


def _print_report(result: RunResult) -> None:
    console = Console()
    counters = result.counters.as_dict()
    table = Table(
        title=f"dynfuse sim on {result.config.name}: {counters['cycle']} cycles "
        f"({result.config.cycles_to_us(counters['cycle']):.2f} us)"
    )
    table.add_column("counter")
    table.add_column("run", justify="right")
    kernels = list(result.kernel_counters.items())
    for name, _ in kernels:
        table.add_column(name, justify="right")
    for key, value in counters.items():
        cells = [value] + [c.as_dict()[key] for _, c in kernels]
        if not any(cells):
            continue
        table.add_row(key, *(f"{v:.3g}" if isinstance(v, float) else str(v) for v in cells))
    console.print(table)
