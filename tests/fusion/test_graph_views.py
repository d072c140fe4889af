"""Text dump and Graphviz DOT show every node, value and edge of a graph."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from fusion_helpers import MODELS_DIR

from fusion.graph.dot import to_dot
from fusion.graph.dump import dump
from fusion.onnx_import.importer import import_model
from simulator.config import load_config


@pytest.fixture(scope="module")
def graph():
    return import_model(MODELS_DIR / "resnet_block.onnx")


def test_dump_lists_every_node_with_types_and_costs(graph) -> None:
    text = dump(graph, load_config("base"))
    for node in graph.nodes:
        line = next(ln for ln in text.splitlines() if f"# {node.name} " in ln)
        assert f"= {node.op.value}(" in line and "cycles=" in line
        assert all(f"%{v}: {graph.types[v]}" in line for v in node.outputs)
    assert text.splitlines()[-2] == f"  return {', '.join('%' + v for v in graph.outputs)}"


def test_dot_has_one_box_per_node_and_one_edge_per_use(graph) -> None:
    text = to_dot(graph, load_config("base"))
    assert len(re.findall(r"shape=box", text)) == len(graph.nodes)
    uses = sum(1 for n in graph.nodes for v in n.inputs if not graph.is_constant(v)) + len(graph.outputs)
    assert text.count(" -> ") == uses
    with_consts = to_dot(graph, show_constants=True)
    assert with_consts.count(" -> ") == sum(len(n.inputs) for n in graph.nodes) + len(graph.outputs)


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")
def test_dot_is_accepted_by_graphviz(graph) -> None:
    subprocess.run(["dot", "-Tsvg"], input=to_dot(graph), text=True, check=True, capture_output=True)
