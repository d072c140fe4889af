"""`dynfuse graph` (import an ONNX model, show its dataflow graph with costs, DOT) and `dynfuse onnx-conformance`."""

from __future__ import annotations

import argparse
from pathlib import Path

from fusion.errors import FusionError
from fusion.graph.dot import to_dot
from fusion.graph.dump import dump
from fusion.input_shapes import add_input_shape_option, import_with_shapes
from fusion.onnx_import.conformance import ensure_node_tests, format_table, run_all
from fusion.passes.pipeline import cleanup
from simulator.config import load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    graph = subparsers.add_parser("graph", help="import an ONNX model and print its dataflow graph with costs")
    graph.add_argument("model", type=Path, help="ONNX model file (opset >= 13)")
    add_input_shape_option(graph)
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
    g = import_with_shapes(args.model, args.input_shape, {})
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
