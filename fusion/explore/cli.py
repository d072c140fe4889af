"""`dynfuse explore MODEL.onnx ... --space space.toml -o DIR` (grid or `--search N`) and `dynfuse explore-merge`."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from fusion.tasks import add_runner_options, make_runner, worker_count_note
from simulator.inputs import parse_input_args


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "explore", help="design-space exploration: machines x models x policies, fused and simulated, Pareto front"
    )
    p.add_argument("models", type=Path, nargs="+", metavar="MODEL.onnx", help="ONNX models")
    p.add_argument("--space", type=Path, required=True, help="space TOML: preset, policies, dtypes, [fields]")
    p.add_argument("-o", "--output", type=Path, required=True, help="result directory (resumed if it exists)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="a model input (repeatable)")
    p.add_argument("--validate", default="first:1", help="shadow validation of fused kernels (as dynfuse fuse)")
    p.add_argument("--search", type=int, metavar="N", help="instead of the grid: N trials of a TPE search")
    p.add_argument("--objective", default="cycles * area_mm2", help="--search: expression to minimise")
    p.add_argument("--constraint", action="append", default=[], metavar="EXPR", help="--search: e.g. 'cycles <= 50000'")
    p.add_argument("--seed", type=int, default=0, help="--search: sampler seed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_runner_options(p)
    p.set_defaults(run=run_explore_cli)
    m = subparsers.add_parser("explore-merge", help="merge explore result directories (e.g. of several machines)")
    m.add_argument("dirs", type=Path, nargs="+", metavar="DIR", help="result directories of dynfuse explore")
    m.add_argument("-o", "--output", type=Path, required=True, help="merged directory (created or extended)")
    m.set_defaults(run=run_merge)


def run_explore_cli(args: argparse.Namespace) -> int:
    from fusion.engine.validation import ValidationPolicy
    from fusion.explore.objective import parse_constraint, parse_objective
    from fusion.explore.pareto import METRIC_NAMES
    from fusion.explore.run import run_explore, summary
    from fusion.explore.space import load_space
    from simulator.config import PRESETS

    space = load_space(args.space)
    ValidationPolicy.parse(args.validate)  # a bad policy is an error before any work
    inputs = parse_input_args(args.input)
    runner = make_runner(args.backend, args.workers, args.address)
    progress = not args.no_progress
    note = worker_count_note(runner, args.workers)
    if note:
        print(note)
    base = asdict(PRESETS[space.preset])
    if args.search is None:
        outcome = run_explore(args.models, space, args.output, runner, inputs, args.validate, progress)
        print("\n".join(summary(outcome, base)))
        return 1 if outcome.failures else 0
    from fusion.explore.search import run_search

    objective = parse_objective(args.objective, METRIC_NAMES)
    constraints = [parse_constraint(text, METRIC_NAMES) for text in args.constraint]
    found = run_search(
        args.models, space, args.output, runner, args.search, objective, constraints, args.seed, inputs,
        args.validate, progress,
    )  # fmt: skip
    print("\n".join(summary(found.sweep, base)))
    print(f"{found.table}: {len(found.trials)} trials of {args.objective!r}")
    best = found.best()
    if best is None or best.design is None:
        print("no trial's machine could run every model")
        return 1
    kind = "best" if best.feasible else "no trial met the constraints; least violating"
    print(
        f"{kind}: trial {best.number} [{best.design.label(base)}] {best.design.policy} {best.design.dtype}: "
        f"{args.objective} = {best.value:.6g}; {best.design.cycles} cycles, {best.design.energy_pj / 1e6:.3f} uJ, "
        f"{best.design.area_mm2:.3f} mm^2"
    )
    return 1 if found.sweep.failures else 0


def run_merge(args: argparse.Namespace) -> int:
    from fusion.explore.store import merge

    rows, conflicts = merge(args.dirs, args.output)
    print(f"{args.output}: {rows} points from {len(args.dirs)} directories")
    if conflicts:
        print(f"warning: {conflicts} points differ between directories (another engine version?); first kept")
    return 0
