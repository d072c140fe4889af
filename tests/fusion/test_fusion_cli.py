"""`dynfuse graph` prints the imported graph and reports bad models as one clean error."""

from __future__ import annotations

import onnx
from fusion_helpers import MODELS_DIR
from onnx import TensorProto, helper

from dynfuse.cli import main


def test_graph_command_prints_nodes_and_writes_dot(tmp_path, capsys) -> None:
    dot = tmp_path / "g.dot"
    assert main(["graph", str(MODELS_DIR / "resnet_block.onnx"), "--cleanup", "--dot", str(dot)]) == 0
    out = capsys.readouterr().out
    assert out.count("= Conv(") == 2 and "BatchNorm" not in out and "cycles=" in out
    assert dot.read_text().startswith("digraph")


def test_graph_command_lists_unsupported_nodes(tmp_path, capsys) -> None:
    nodes = [helper.make_node("Hardmax", ["x"], ["a"], name="c1"), helper.make_node("Det", ["a"], ["y"], name="s1")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "bad", [x], [y])), str(path))
    assert main(["graph", str(path)]) == 1
    err = capsys.readouterr().err
    assert "'c1' (Hardmax)" in err and "'s1' (Det)" in err and "Traceback" not in err


def test_conformance_command_prints_the_table(request, capsys) -> None:
    cache = request.config.cache.mkdir(f"onnx_node_tests_{onnx.__version__}")
    assert main(["onnx-conformance", "--cache", str(cache)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["operator", "pass", "skip", "fail"] and "Conv" in out


def test_input_shape_for_no_input_or_given_twice_is_an_error(capsys) -> None:
    model = str(MODELS_DIR / "mlp.onnx")
    assert main(["graph", model, "--input-shape", "bogus=1,2"]) == 1
    assert "--input-shape bogus: the model has no input of that name (inputs: input)" in capsys.readouterr().err
    assert main(["graph", model, "--input-shape", "input=4,32", "--input-shape", "input=2,32"]) == 1
    assert "--input-shape input is given twice" in capsys.readouterr().err
