"""A model with nodes no kernel generator runs: `dynfuse run` and `dynfuse fuse` exit non-zero with one error
naming every such node and why, never a traceback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dynfuse.cli import main


def _model(path: Path) -> None:
    nodes = [
        helper.make_node("Sin", ["x"], ["s"], name="sin"),
        helper.make_node("Less", ["s", "zero"], ["c"], name="less"),
        helper.make_node("Where", ["c", "s", "x"], ["w"], name="where"),
        helper.make_node("Relu", ["w"], ["r"], name="relu"),
        helper.make_node("Cos", ["r"], ["y"], name="cos"),
    ]
    graph = helper.make_graph(
        nodes,
        "unsupported",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize(
    "command", [["run"], ["fuse", "--policy", "dynamic", "--workers", "1"], ["fuse", "--policy", "none"]]
)
def test_every_unsupported_node_in_one_error(tmp_path: Path, capsys, command: list[str]) -> None:
    _model(tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    code = main([command[0], str(tmp_path / "m.onnx"), "--input", f"x={tmp_path / 'x.npy'}", *command[1:]])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    assert "4 unsupported node(s)" in err
    assert all(f"'{name}'" in err for name in ("sin", "less", "where", "cos")) and "'relu'" not in err
    assert "constant condition" in err
