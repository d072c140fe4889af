"""Bad ONNX input is one clear error naming the node and attribute (issue #13 item 12), never a traceback:
attributes of the wrong type, zero or huge window attributes, repeated Unsqueeze axes, truncated initializers,
missing external data, zero-size dims."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from dynfuse.cli import main
from fusion.errors import FusionError, UnsupportedModelError
from fusion.onnx_import.importer import import_model

X4 = [1, 2, 4, 4]


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "bad", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _attr(name: str, value) -> AttributeProto:
    """An attribute of exactly the type `value` has (helper.make_attribute infers it), to put where another
    type is expected."""
    return helper.make_attribute(name, value)


def _node(op: str, inputs, outputs, name: str, **attrs) -> onnx.NodeProto:
    node = helper.make_node(op, inputs, outputs, name=name)
    node.attribute.extend(_attr(k, v) for k, v in attrs.items())
    return node


def _w(shape, name="w"):
    return numpy_helper.from_array(np.ones(shape, np.float32), name)


def _one_problem(model: onnx.ModelProto, node: str, *words: str) -> str:
    with pytest.raises(UnsupportedModelError) as info:
        import_model(model)
    problems = info.value.problems
    assert [p.node for p in problems] == [node], str(info.value)
    text = str(problems[0])
    assert "\n" not in text and all(w in text for w in words), text
    return text


CASES = {
    "gemm_alpha_string": (
        [_node("Gemm", ["x", "w"], ["y"], "gemm", alpha="two")],
        [_vi("x", [2, 3])],
        [_w((3, 4))],
        ("alpha", "float", "STRING"),
    ),
    "gemm_transB_float": (
        [_node("Gemm", ["x", "w"], ["y"], "gemm", transB=1.5)],
        [_vi("x", [2, 3])],
        [_w((4, 3))],
        ("transB", "int", "FLOAT"),
    ),
    "conv_strides_floats": (
        [_node("Conv", ["x", "w"], ["y"], "conv", strides=[1.0, 1.0])],
        [_vi("x", X4)],
        [_w((3, 2, 3, 3))],
        ("strides", "list of ints", "FLOATS"),
    ),
    "conv_strides_zero": (
        [_node("Conv", ["x", "w"], ["y"], "conv", strides=[0, 0])],
        [_vi("x", X4)],
        [_w((3, 2, 3, 3))],
        ("strides", "outside"),
    ),
    "conv_group_infinite": (
        [_node("Conv", ["x", "w"], ["y"], "conv", group=float("inf"))],
        [_vi("x", X4)],
        [_w((3, 2, 3, 3))],
        ("group", "int", "FLOAT"),
    ),
    "conv_pads_huge": (
        [_node("Conv", ["x", "w"], ["y"], "conv", pads=[2**62, 0, 0, 0])],
        [_vi("x", X4)],
        [_w((3, 2, 3, 3))],
        ("pads", "outside"),
    ),
    "transpose_perm_string": (
        [_node("Transpose", ["x"], ["y"], "tr", perm="0,1")],
        [_vi("x", [2, 3])],
        [],
        ("perm", "list of ints", "STRING"),
    ),
    "layernorm_epsilon_string": (
        [_node("LayerNormalization", ["x", "s"], ["y"], "ln", epsilon="tiny")],
        [_vi("x", [2, 3])],
        [_w((3,), "s")],
        ("epsilon", "float", "STRING"),
    ),
    "layernorm_axis_float": (
        [_node("LayerNormalization", ["x", "s"], ["y"], "ln", axis=1.0)],
        [_vi("x", [2, 3])],
        [_w((3,), "s")],
        ("axis", "int", "FLOAT"),
    ),
    "batchnorm_epsilon_ints": (
        [_node("BatchNormalization", ["x", "s", "s", "s", "s"], ["y"], "bn", epsilon=[1, 2])],
        [_vi("x", X4)],
        [_w((2,), "s")],
        ("epsilon", "float", "INTS"),
    ),
    "maxpool_kernel_floats": (
        [_node("MaxPool", ["x"], ["y"], "pool", kernel_shape=[2.0, 2.0])],
        [_vi("x", X4)],
        [],
        ("kernel_shape", "list of ints", "FLOATS"),
    ),
    "averagepool_pads_string": (
        [_node("AveragePool", ["x"], ["y"], "pool", kernel_shape=[2, 2], pads="same")],
        [_vi("x", X4)],
        [],
        ("pads", "list of ints", "STRING"),
    ),
    "averagepool_strides_zero": (
        [_node("AveragePool", ["x"], ["y"], "pool", kernel_shape=[2, 2], strides=[0, 1])],
        [_vi("x", X4)],
        [],
        ("strides", "outside"),
    ),
    "unsqueeze_repeated_axes": (
        [_node("Unsqueeze", ["x", "axes"], ["y"], "unsq")],
        [_vi("x", [2, 3])],
        [numpy_helper.from_array(np.array([0, 0], np.int64), "axes")],
        ("Unsqueeze axes", "repeat"),
    ),
    "softmax_axis_huge": (
        [_node("Softmax", ["x"], ["y"], "sm", axis=2**63 - 1)],
        [_vi("x", [2, 3])],
        [],
        ("axis", "outside"),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_attribute_is_one_line_naming_node_and_attribute(case: str) -> None:
    nodes, inputs, inits, words = CASES[case]
    _one_problem(_model(nodes, inputs, [_vi("y", None)], inits), nodes[0].name, *words)


def test_truncated_initializer_names_it() -> None:
    w = _w((4, 4))
    w.raw_data = w.raw_data[:10]
    model = _model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [_vi("x", [4, 4])], [_vi("y", None)], [w])
    with pytest.raises(UnsupportedModelError) as info:
        import_model(model)
    assert any("initializer 'w'" in str(p) and "truncated" in str(p) for p in info.value.problems), str(info.value)


def _external_model(tmp_path, drop: bool):
    model = _model(
        [helper.make_node("Add", ["x", "w"], ["y"], name="add")], [_vi("x", [4, 4])], [_vi("y", None)], [_w((4, 4))]
    )
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="w.bin", size_threshold=0)
    if drop:
        os.remove(tmp_path / "w.bin")
    return path


def test_missing_external_data_file_is_a_clear_error(tmp_path) -> None:
    path = _external_model(tmp_path, drop=True)
    with pytest.raises(FusionError, match=r"cannot read ONNX model .*w\.bin") as info:
        import_model(path)
    assert "\n" not in str(info.value)
    # the same model held in memory without its external data: the initializer is named
    model = onnx.load(str(path), load_external_data=False)
    with pytest.raises(UnsupportedModelError, match=r"initializer 'w'.*external file 'w.bin'"):
        import_model(model)
    intact = tmp_path / "intact"
    intact.mkdir()
    assert import_model(_external_model(intact, drop=False)).outputs == ("y",)


def test_zero_size_dimension_names_the_value() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="r")], [_vi("x", [2, 0, 3])], [_vi("y", None)])
    with pytest.raises(UnsupportedModelError, match=r"'x'.*zero-size"):
        import_model(model)
    sliced = _model(
        [helper.make_node("Slice", ["x", "s", "e"], ["y"], name="empty_slice")],
        [_vi("x", [2, 3])],
        [_vi("y", None)],
        [numpy_helper.from_array(np.array([2], np.int64), "s"), numpy_helper.from_array(np.array([2], np.int64), "e")],
    )
    with pytest.raises(UnsupportedModelError, match=r"empty_slice.*empty"):
        import_model(sliced)


def test_cli_prints_one_error_and_exits_nonzero(tmp_path, capsys) -> None:
    nodes, inputs, inits, _ = CASES["conv_strides_zero"]
    path = tmp_path / "bad.onnx"
    onnx.save(_model(nodes, inputs, [_vi("y", None)], inits), str(path))
    assert main(["graph", str(path)]) != 0
    err = capsys.readouterr().err
    assert "strides" in err and "Traceback" not in err
