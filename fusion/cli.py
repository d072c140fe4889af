"""`dynfuse graph` (import an ONNX model, show its dataflow graph with costs, DOT) and `dynfuse onnx-conformance`."""

from __future__ import annotations

import argparse
from pathlib import Path

from fusion.errors import FusionError
from fusion.graph.dot import to_dot
from fusion.graph.dump import dump
from fusion.onnx_import.conformance import ensure_node_tests, format_table, run_all
from fusion.onnx_import.importer import import_model
from fusion.passes.pipeline import cleanup
from simulator.config import load_config


def _shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    """NAME=D1,D2,... -> (NAME, (D1, D2, ...))."""
    name, sep, dims = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, tuple(int(d) for d in dims.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=D1,D2,..., got {text!r}") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    graph = subparsers.add_parser("graph", help="import an ONNX model and print its dataflow graph with costs")
    graph.add_argument("model", type=Path, help="ONNX model file (opset >= 13)")
    graph.add_argument(
        "--input-shape",
        type=_shape_arg,
        action="append",
        default=[],
        metavar="NAME=D1,D2,...",
        help="concrete shape for an input with symbolic dims (repeatable)",
    )
    graph.add_argument("--cleanup", action="store_true", help="run the clean-up passes first")
    graph.add_argument("--config", default="base", help="machine preset or .toml for the cost column")
    graph.add_argument("--dot", type=Path, help="also write Graphviz DOT to this file")
    graph.set_defaults(run=run_graph)
    conf = subparsers.add_parser("onnx-conformance", help="run ONNX's backend node tests through import + reference")
    conf.add_argument("--cache", type=Path, default=Path(".onnx_node_tests"), help="where generated cases are kept")
    conf.add_argument("--verbose", action="store_true", help="also list every skipped case with its reason")
    conf.set_defaults(run=run_conformance)


def run_graph(args: argparse.Namespace) -> int:
    if not args.model.exists():
        raise FusionError(f"no such model file: {args.model}")
    shapes = dict(args.input_shape)
    if len(shapes) != len(args.input_shape):
        twice = sorted({n for n, _ in args.input_shape if [m for m, _ in args.input_shape].count(n) > 1})
        raise FusionError(f"--input-shape {twice[0]} is given twice")
    g = import_model(args.model, input_shapes=shapes)
    unknown = sorted(set(shapes) - set(g.inputs))
    if unknown:
        raise FusionError(
            f"--input-shape {unknown[0]}: the model has no input of that name (inputs: {', '.join(g.inputs)})"
        )
    if args.cleanup:
        g = cleanup(g)
    config = load_config(args.config)
    print(dump(g, config))
    if args.dot:
        args.dot.write_text(to_dot(g, config))
    return 0


def run_conformance(args: argparse.Namespace) -> int:
    results = run_all(ensure_node_tests(args.cache))
    print(format_table(results))
    for r in results:
        if r.status == "fail" or (args.verbose and r.status == "skip"):
            print(f"{r.status} {r.name}: {r.reason}")
    return 1 if any(r.status == "fail" for r in results) else 0
