"""`dynfuse compile` (ONNX -> accelerator binary, unfused baseline) and `dynfuse run` (compile, simulate,
print the outputs and counters)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from assembler.binary import save
from fusion.errors import FusionError
from fusion.input_shapes import add_input_shape_option, import_with_shapes
from fusion.lower.compiler import DTYPES, CompiledModel, compile, load_graph
from simulator.config import PRESETS
from simulator.inputs import parse_input_args

CALIBRATION_SEED = 0
SUMMARY_COUNTERS = (
    "cycle",
    "instret",
    "macs",
    "dram_read_bytes",
    "dram_write_bytes",
    "energy_total_pj",
    "roofline_bound_cycles",
    "roofline_fraction",
)


def register(subparsers: argparse._SubParsersAction) -> None:
    comp = subparsers.add_parser("compile", help="compile an ONNX model to an accelerator binary (unfused baseline)")
    _common(comp)
    comp.add_argument("-o", "--output", type=Path, required=True, help="binary object file to write")
    comp.add_argument(
        "--calibrate",
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="int8: a calibration input (repeatable); default: standard-normal inputs with seed 0",
    )
    comp.set_defaults(run=run_compile)
    run = subparsers.add_parser("run", help="compile an ONNX model, simulate it, print outputs and counters")
    _common(run)
    run.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="a model input (repeatable)")
    run.add_argument("--output-dir", type=Path, help="write each graph output as DIR/<output name>.npy")
    run.add_argument("--json", action="store_true", help="print the counters as JSON")
    run.add_argument("--checked", action="store_true", help="simulate in checked (race-detecting) mode")
    run.set_defaults(run=run_model)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path, help="ONNX model file")
    add_input_shape_option(p)
    p.add_argument("--config", default="base", help=f"machine preset ({', '.join(PRESETS)}) or a .toml file")
    p.add_argument(
        "--dtype",
        default="fp32",
        choices=DTYPES,
        help="fp32, or int8: post-training quantization calibrated on the run's inputs (compile: on --calibrate)",
    )


def _model_path(path: Path) -> Path:
    if not path.exists():
        raise FusionError(f"no such model file: {path}")
    return path


def run_compile(args: argparse.Namespace) -> int:
    given = parse_input_args(args.calibrate)
    graph = load_graph(import_with_shapes(_model_path(args.model), args.input_shape, given, "--calibrate"))
    samples = None
    if args.dtype == "int8":
        rng = np.random.default_rng(CALIBRATION_SEED)
        samples = [given or {v: rng.standard_normal(graph.types[v].shape).astype(np.float32) for v in graph.inputs}]
    model = compile(graph, args.config, args.dtype, samples=samples, cleanup=False)
    assert isinstance(model, CompiledModel)
    save(model.program, args.output)
    print(
        f"{args.model} -> {args.output}: {len(model.kernels)} kernels, {len(model.program.text)} instructions, "
        f"{len(model.program.data)} constant bytes, {model.memory.arena_bytes} activation bytes "
        f"(without reuse {model.memory.naive_bytes}), {args.dtype} on {model.config.name}, "
        f"compiled in {model.compile_seconds:.2f} s"
    )
    return 0


def safe_name(name: str) -> str:
    """A graph output name usable as a file name (path separators and odd characters become '_')."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")
    return cleaned or "output"


def run_model(args: argparse.Namespace) -> int:
    given = parse_input_args(args.input)
    model = compile(import_with_shapes(_model_path(args.model), args.input_shape, given), args.config, args.dtype)
    outputs, counters = model.run(given, checked=args.checked)
    if args.output_dir:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        for name, value in outputs.items():
            np.save(args.output_dir / f"{safe_name(name)}.npy", value)
    values = counters.as_dict()
    if args.json:
        print(json.dumps({"model": str(args.model), "dtype": args.dtype, "counters": values}, indent=2))
        return 0
    for name, value in outputs.items():
        head = ", ".join(f"{v:.4g}" for v in value.reshape(-1)[:6])
        print(
            f"output {name}: shape {list(value.shape)} min {value.min():.4g} max {value.max():.4g} "
            f"mean {value.mean():.4g} [{head}{', ...' if value.size > 6 else ''}]"
        )
    for key in SUMMARY_COUNTERS:
        v = values[key]
        print(f"  {key:<22} {v:.4g}" if isinstance(v, float) else f"  {key:<22} {v}")
    return 0
