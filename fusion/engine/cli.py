"""`dynfuse fuse model.onnx`: run a model under a fusion plan policy and report the plan.

dynfuse fuse model.onnx --input x=x.npy --policy dynamic --report
dynfuse fuse model.onnx --compare none,static,dynamic --json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from assembler.cli import register_container
from fusion.engine.cache import MAGIC, KernelCache
from fusion.engine.emit_asm import RecordingCache, emit_kernels, read_cache_entry
from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.errors import EngineError
from fusion.engine.footprint import check_fits_dram
from fusion.engine.planner import POLICIES
from fusion.engine.program_figures import of_call
from fusion.engine.program_run import EXECUTIONS, host_launches
from fusion.engine.report import PolicyReport, build_report, format_comparison, format_report
from fusion.engine.validation import ValidationPolicy
from fusion.engine.workers import default_workers
from fusion.graph.ir import Graph
from fusion.input_shapes import add_input_shape_option, import_with_shapes
from fusion.lower.cli import safe_name
from fusion.lower.compiler import load_graph
from simulator.config import PRESETS, load_config
from simulator.inputs import parse_input_args

INPUT_SEED = 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("fuse", help="run an ONNX model under a fusion plan policy and report the plan")
    p.add_argument("model", type=Path, help="ONNX model file")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="a model input (repeatable)")
    add_input_shape_option(p)
    p.add_argument("--policy", default="dynamic", choices=POLICIES, help="plan policy (default: dynamic)")
    p.add_argument("--compare", help="comma-separated policies to run side by side, e.g. none,static,dynamic")
    p.add_argument("--config", default="base", help=f"machine preset ({', '.join(PRESETS)}) or a .toml file")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "int8"), help="int8: calibrated on the inputs")
    p.add_argument("--report", action="store_true", help="print the plan: groups, strategies, cycles, cache")
    p.add_argument(
        "--execution",
        default="program",
        choices=EXECUTIONS,
        help="program: the plan as one program, dispatched on chip (default); host: kernel by kernel, a launch each",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--output-dir", type=Path, help="write each graph output as DIR/<output name>.npy")
    p.add_argument("--validate", default="first:1", help="shadow validation: always, off, every:N, first:K")
    p.add_argument("--calls", type=int, default=1, help="run the model this many times (cache hits after the first)")
    p.add_argument("--cache-dir", type=Path, help="persistent on-disk kernel cache shared by processes")
    p.add_argument(
        "--emit-asm",
        type=Path,
        metavar="DIR",
        help="write each dispatched kernel as re-assemblable DIR/NNN_<schedule>_<node>.s (DIR/<policy>/ with "
        "--compare) and DIR/kernels.tsv",
    )
    p.add_argument(
        "--cost-model",
        default="analytic",
        help="cost model ranking kernels: analytic, hpm ($DYNFUSE_HPM_MODEL, else the shipped model) or a model path",
    )
    p.add_argument(
        "--allow-rounding-change",
        action="store_true",
        help="allow int8 fusions that skip a requantization between ops (results then differ in rounding)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=default_workers(),
        help="processes generating candidate kernels while planning (default: the cores, from 4 up; 1: none)",
    )
    p.set_defaults(run=run_fuse)
    register_container(MAGIC, "kernel cache entry", read_cache_entry)  # `dynfuse disasm <key>.dfk`


def _inputs(args: argparse.Namespace) -> tuple[Graph, dict[str, np.ndarray]]:
    """The model's graph at the shapes `--input-shape`/`--input` give, and an array for every input."""
    given = parse_input_args(args.input)
    graph = load_graph(import_with_shapes(args.model, args.input_shape, given))
    check_fits_dram(graph, load_config(args.config))  # before allocating any random input
    rng = np.random.default_rng(INPUT_SEED)
    for name in graph.inputs:
        if name not in given:
            given[name] = rng.standard_normal(graph.types[name].shape).astype(np.float32)
    return graph, given


def _run_policy(
    args: argparse.Namespace, graph: Graph, policy: str, inputs: dict[str, np.ndarray]
) -> tuple[PolicyReport, dict]:
    if args.workers < 1:
        raise EngineError(f"--workers must be >= 1, got {args.workers}")
    options = EngineOptions(
        policy=policy,
        validation=ValidationPolicy.parse(args.validate),
        allow_rounding_change=args.allow_rounding_change,
        workers=args.workers,
        execution=args.execution,
    )
    from fusion.hpm.cost_model import load_cost_model  # the CLI is the edge that may pick the learned model

    cache = (RecordingCache if args.emit_asm is not None else KernelCache)(disk_dir=args.cache_dir)
    cost_model = load_cost_model(args.cost_model)
    engine = FusionEngine(graph, args.config, args.dtype, options, cost_model=cost_model, cache=cache)
    if args.calls < 1:
        raise EngineError(f"--calls must be >= 1, got {args.calls}")
    result = None
    for _ in range(args.calls):
        result = engine.run(inputs)
    assert result is not None
    if isinstance(cache, RecordingCache):
        emit_kernels(result.records, cache.used, args.emit_asm / policy if args.compare else args.emit_asm)
    engine = engine.for_inputs(inputs)  # the engine of these input shapes
    figures = None
    if result.program is not None:  # the run's own figures (what its link measured): no simulation more
        figures = of_call(result.program, host_launches(engine.graph, result.records), engine.config.launch_cycles)
    return build_report(engine, result, figures), result.outputs


def run_fuse(args: argparse.Namespace) -> int:
    if not args.model.exists():
        raise EngineError(f"no such model file: {args.model}")
    graph, inputs = _inputs(args)
    policies = [p.strip() for p in args.compare.split(",")] if args.compare else [args.policy]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise EngineError(f"unknown policy {unknown[0]!r} in --compare (known: {', '.join(POLICIES)})")
    reports, outputs = [], {}
    for policy in policies:
        rep, outs = _run_policy(args, graph, policy, inputs)
        reports.append(rep)
        outputs = outputs or outs
    if args.output_dir:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        for name, value in outputs.items():
            np.save(args.output_dir / f"{safe_name(name)}.npy", value)
    if args.json:
        body = [r.as_dict() for r in reports]
        print(json.dumps(body if len(body) > 1 else body[0], indent=2, default=str))
        return 0
    if args.report or len(reports) == 1:
        for rep in reports:
            print(format_report(rep))
            print()
    if len(reports) > 1:
        print(format_comparison(reports))
    return 0
