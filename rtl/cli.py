"""`dynfuse cosim`: replay programs' matrix/vector transactions on the RTL and compare values and cycles."""

from __future__ import annotations

import argparse
from pathlib import Path

from isa.errors import DynfuseError
from rtl.corpus import example_programs, record_file, record_random
from rtl.cosim import cosimulate
from simulator.config import PRESETS, load_config
from simulator.inputs import parse_input_args


def register(subparsers: argparse._SubParsersAction) -> None:
    cosim = subparsers.add_parser(
        "cosim", help="run programs on the simulator and replay their unit transactions on the RTL (Icarus)"
    )
    cosim.add_argument("programs", type=Path, nargs="*", metavar="PROGRAM", help="assembly (.s) or binary (.bin)")
    cosim.add_argument("--config", default="tiny", help=f"preset ({', '.join(PRESETS)}) or a .toml file")
    cosim.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="a kernel .input tensor (repeatable); the others get seeded random values as in sim --random-inputs",
    )
    cosim.add_argument(
        "--examples",
        action="store_true",
        help="also replay every program in examples/ (its examples/<config>/ variant where there is one)",
    )
    cosim.add_argument("--random", type=int, default=0, metavar="COUNT", help="also replay COUNT random programs")
    cosim.add_argument("--seed", type=int, default=0, help="seed of the random inputs and programs")
    cosim.add_argument("--vcd-dir", type=Path, help="where mismatch waveforms go (default: the build cache)")
    cosim.set_defaults(run=run_cosim)


def run_cosim(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    inputs = parse_input_args(args.input)
    programs = [*args.programs, *(example_programs(cfg.name) if args.examples else [])]
    runs = [record_file(path, cfg, inputs, args.seed) for path in programs]
    runs += [record_random(args.seed + i, cfg) for i in range(args.random)]
    if not runs:
        raise DynfuseError("cosim needs at least one PROGRAM, --examples or --random COUNT")
    reports = cosimulate(cfg, runs, args.vcd_dir)
    for report in reports:
        print("\n".join(report.lines()))
    total = sum(r.compared for r in reports)
    values = sum(r.value_mismatches for r in reports)
    cycles = sum(r.cycle_mismatches for r in reports)
    print(f"total: {total} transactions compared, {values} value mismatches, {cycles} cycle mismatches")
    return 0 if values == 0 and cycles == 0 else 1
