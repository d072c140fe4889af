"""ONNX import: every problem in one error, opset and shape checks, and op mappings checked against onnx's own
reference runtime (onnx.reference.ReferenceEvaluator)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from fusion.errors import GraphError, UnsupportedModelError
from fusion.onnx_import.importer import import_model
from fusion.reference.interpreter import run
from isa.errors import DynfuseError

RNG = np.random.default_rng(0)


def _model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "t", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _compare_with_onnx(model: onnx.ModelProto, feeds: dict[str, np.ndarray], atol=1e-5) -> None:
    graph = import_model(model)
    got = run(graph, feeds)
    want = ReferenceEvaluator(model).run(None, feeds)
    for name, value in zip(graph.outputs, want, strict=True):
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=atol)


def test_all_unsupported_nodes_are_reported_together() -> None:
    """Unsupported nodes in three successive layers, each feeding the next through supported nodes, plus a
    custom-domain op and an unsupported attribute value: every one is listed, with a hint, in one error."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="ok"),
        helper.make_node("Hardmax", ["a"], ["b"], name="layer1_hardmax"),
        helper.make_node("Relu", ["b"], ["b2"], name="between"),
        helper.make_node("BatchNormalization", ["b2", "s", "s", "s", "s"], ["c"], name="bn_train", training_mode=1),
        helper.make_node("Tile", ["c", "r"], ["d"], name="layer3_tiler"),
        helper.make_node("Softmax", ["d"], ["d2"], name="after_tile"),
        helper.make_node("CumSum", ["d2", "ax"], ["d3"], name="layer4_cumsum"),
        helper.make_node("Foo", ["d3"], ["e"], name="custom", domain="com.example"),
    ]
    model = _model(
        nodes,
        [_vi("x", [1, 2, 3, 3])],
        [_vi("e", None)],
        [
            _init("s", np.ones(2, np.float32)),
            _init("r", np.ones(4, np.int64)),
            _init("ax", np.array(1, np.int64)),
        ],
    )
    with pytest.raises(UnsupportedModelError) as info:
        import_model(model)
    err = info.value
    assert isinstance(err, DynfuseError)
    found = {(p.node, p.op_type, p.kind) for p in err.problems}
    assert found == {
        ("layer1_hardmax", "Hardmax", "op"),
        ("bn_train", "BatchNormalization", "feature"),
        ("layer3_tiler", "Tile", "op"),
        ("layer4_cumsum", "CumSum", "op"),
        ("custom", "Foo", "op"),
    }
    message = str(err)
    assert all(name in message for name in ("layer4_cumsum", "bn_train", "com.example::Foo", "training_mode"))
    assert "converters.py" in message and "custom domain" in message  # hints


def test_a_problem_after_an_unsupported_node_is_found() -> None:
    """A supported op misused downstream of an unknown one is still checked (it reads a typed placeholder)."""
    nodes = [
        helper.make_node("Hardmax", ["x"], ["a"], name="unknown"),
        helper.make_node("Softmax", ["a"], ["b"], name="bad_axis", axis=7),
    ]
    model = _model(nodes, [_vi("x", [2, 3])], [_vi("b", None)])
    with pytest.raises(UnsupportedModelError) as info:
        import_model(model)
    assert {p.node for p in info.value.problems} == {"unknown", "bad_axis"}


def test_old_opset_is_rejected() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])], opset=11)
    with pytest.raises(UnsupportedModelError, match="opset 11 < 13"):
        import_model(model)


def test_symbolic_dims_need_input_shapes() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["batch", 4])], [_vi("y", ["batch", 4])])
    with pytest.raises(UnsupportedModelError, match="input_shapes"):
        import_model(model)
    graph = import_model(model, input_shapes={"x": (3, 4)})
    assert graph.types["y"].shape == (3, 4)
    unshaped = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", None)], [_vi("y", None)])
    with pytest.raises(UnsupportedModelError, match="no shape"):
        import_model(unshaped)
    assert import_model(unshaped, input_shapes={"x": (5,)}).types["y"].shape == (5,)


def test_non_constant_shape_operand_is_a_clear_error_unless_bound() -> None:
    model = _model(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        [_vi("x", [2, 6]), _vi("s", [2], TensorProto.INT64)],
        [_vi("y", None)],
    )
    with pytest.raises(UnsupportedModelError, match="must be a constant"):
        import_model(model)
    graph = import_model(model, bind={"s": np.array([3, -1], np.int64)})
    assert graph.inputs == ("x",) and graph.types["y"].shape == (3, 4)


def test_declared_output_shape_must_match() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2, 3])], [_vi("y", [3, 2])])
    with pytest.raises(GraphError, match="declares shape"):
        import_model(model)


def test_unreadable_file_is_a_dynfuse_error(tmp_path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf at all")
    with pytest.raises(DynfuseError, match="cannot read"):
        import_model(bad)


@pytest.mark.parametrize(
    ("trans_a", "trans_b", "alpha", "beta"), [(0, 0, 1.0, 1.0), (1, 1, 0.5, 2.0), (0, 1, 1.0, 0.0)]
)
def test_gemm_variants(trans_a, trans_b, alpha, beta) -> None:
    a = RNG.standard_normal((5, 3) if trans_a else (3, 5)).astype(np.float32)
    b = RNG.standard_normal((4, 5) if trans_b else (5, 4)).astype(np.float32)
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=trans_a, transB=trans_b, alpha=alpha, beta=beta)
    model = _model(
        [node],
        [_vi("a", list(a.shape))],
        [_vi("y", [3, 4])],
        [_init("b", b), _init("c", RNG.standard_normal(4).astype(np.float32))],
    )
    _compare_with_onnx(model, {"a": a})


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_conv_and_pool_auto_pad(auto_pad) -> None:
    x = RNG.standard_normal((1, 2, 7, 6)).astype(np.float32)
    w = RNG.standard_normal((3, 2, 3, 2)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], auto_pad=auto_pad, strides=[2, 1]),
        helper.make_node("MaxPool", ["c"], ["m"], auto_pad=auto_pad, kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["m"], ["y"]),
    ]
    model = _model(nodes, [_vi("x", [1, 2, 7, 6])], [_vi("y", None)], [_init("w", w)])
    _compare_with_onnx(model, {"x": x})


def test_layout_ops_against_onnx() -> None:
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    nodes = [
        helper.make_node("Unsqueeze", ["x", "ax0"], ["u"]),
        helper.make_node("Squeeze", ["u", "ax0"], ["s"]),
        helper.make_node("Flatten", ["s"], ["f"], axis=2),
        helper.make_node("Split", ["x", "sizes"], ["p", "q"], axis=2),
        helper.make_node("Concat", ["q", "p"], ["cat"], axis=-1),
        helper.make_node("Slice", ["cat", "st", "en", "axes", "steps"], ["sl"]),
        helper.make_node("Gather", ["sl", "idx"], ["g"], axis=1),
        helper.make_node("Transpose", ["g"], ["t"]),
        helper.make_node("ReduceMean", ["t"], ["r"], axes=[0], keepdims=0),
        helper.make_node("Constant", [], ["k"], value_float=2.0),
        helper.make_node("Pow", ["r", "k"], ["y"]),
    ]
    inits = [
        _init("ax0", np.array([0], np.int64)),
        _init("sizes", np.array([1, 3], np.int64)),
        _init("st", np.array([-1, 0], np.int64)),
        _init("en", np.array([-100, 4], np.int64)),
        _init("axes", np.array([2, 0], np.int64)),
        _init("steps", np.array([-2, 1], np.int64)),
        _init("idx", np.array([[2, -1]], np.int64)),
    ]
    model = _model(nodes, [_vi("x", [2, 3, 4])], [_vi("y", None), _vi("f", None)], inits, opset=17)
    _compare_with_onnx(model, {"x": x})


def test_malformed_nodes_are_reported_not_crashed_on() -> None:
    nodes = [
        helper.make_node("Reshape", ["x"], ["a"], name="no_shape"),
        helper.make_node("MaxPool", ["x"], ["b"], name="no_kernel"),
        helper.make_node("Relu", ["ghost"], ["c"], name="reads_ghost"),
    ]
    model = _model(nodes, [_vi("x", [1, 1, 4, 4])], [_vi("a", None), _vi("b", None), _vi("c", None)])
    with pytest.raises(UnsupportedModelError) as info:
        import_model(model)
    assert {p.node for p in info.value.problems} == {"no_shape", "no_kernel", "reads_ghost"}
