"""`dynfuse sim`: run a program (.s or .bin) on a machine config and report its counters."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from isa.errors import DynfuseError
from simulator.config import PRESETS, MachineConfig, load_config
from simulator.errors import SimulatorTrap
from simulator.inputs import parse_input_args, random_inputs
from simulator.run import RunResult, check_tensors_fit, load_program, simulate

DEFAULT_MAX_CYCLES = 10_000_000  # ~8 s of a runaway loop on this simulator (the presets' watchdogs allow ~12 min)


def cycle_limited(cfg: MachineConfig, max_cycles: int | None) -> MachineConfig:
    """The config with the run's cycle budget: --max-cycles, else the config's watchdog capped at the default."""
    if max_cycles is not None and (isinstance(max_cycles, bool) or max_cycles < 1):
        raise DynfuseError(f"--max-cycles must be >= 1, got {max_cycles}")
    return replace(cfg, max_cycles=max_cycles or min(cfg.max_cycles, DEFAULT_MAX_CYCLES))


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
    sim.add_argument(
        "--max-cycles",
        type=int,
        metavar="N",
        help=f"stop a run past N cycles (default: the config's watchdog, at most {DEFAULT_MAX_CYCLES:,})",
    )
    sim.set_defaults(run=run_sim)


def run_sim(args: argparse.Namespace) -> int:
    cfg = cycle_limited(load_config(args.config), args.max_cycles)
    program = load_program(args.program)
    check_tensors_fit(program, cfg)  # before random inputs are allocated for the declared shapes
    inputs = parse_input_args(args.input)
    if args.random_inputs is not None:
        inputs = random_inputs(program, args.random_inputs, inputs)
    try:
        result = simulate(program, cfg, inputs, checked=args.checked, trace=bool(args.trace))
    except SimulatorTrap as trap:
        if "watchdog" in trap.reason and args.max_cycles is None:
            raise DynfuseError(f"{trap} (a longer run: --max-cycles N)") from None
        raise
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
