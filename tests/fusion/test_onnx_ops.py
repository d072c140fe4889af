"""Each operator real exports use, imported and run by the reference interpreter, against onnxruntime (an
independent implementation) on small generated models; hypothesis varies shapes, axes and broadcasting."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from fusion.onnx_import.importer import import_model
from fusion.reference.interpreter import run

RNG = np.random.default_rng(7)
F = TensorProto.FLOAT


def _vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def check(nodes, feeds: dict[str, np.ndarray], outputs, inits=(), atol=1e-6, opset=17) -> None:
    """Import, run the reference, compare every output (values and dtype) with onnxruntime."""
    dtypes = {np.dtype(np.float32): F, np.dtype(np.int64): TensorProto.INT64, np.dtype(np.bool_): TensorProto.BOOL}
    inputs = [_vi(k, list(v.shape), dtypes[v.dtype]) for k, v in feeds.items()]
    graph = helper.make_graph(nodes, "ops", inputs, [helper.ValueInfoProto(name=o) for o in outputs], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    got = run(import_model(model), feeds)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for name, want in zip(outputs, session.run(outputs, feeds), strict=True):
        assert got[name].dtype == want.dtype, (name, got[name].dtype, want.dtype)
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=atol, err_msg=name)


def _x(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("Neg", {}),
        ("Abs", {}),
        ("Reciprocal", {}),
        ("Sin", {}),
        ("Cos", {}),
        ("Sigmoid", {}),
        ("Sqrt", {}),
        ("HardSwish", {}),
        ("HardSigmoid", {}),
        ("HardSigmoid", {"alpha": 0.25, "beta": 0.4}),
    ],
)
def test_unary(op, attrs) -> None:
    x = _x(2, 3, 5) * 4
    if op == "Sqrt":
        x = np.abs(x)
    check([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x}, ["y"])


@pytest.mark.parametrize(("low", "high"), [(0.0, 6.0), (None, 0.5), (-1.0, None), (None, None)])
def test_clip_relu6_and_open_bounds(low, high) -> None:
    inits = [_const("lo", np.float32(low if low is not None else 0)), _const("hi", np.float32(high or 0))]
    names = ["x", "lo" if low is not None else "", "hi" if high is not None else ""]
    check([helper.make_node("Clip", names, ["y"])], {"x": _x(3, 7) * 8}, ["y"], inits)


@pytest.mark.parametrize("exponent", [np.float32(3.0), np.int64(3), np.float32(2.0), np.float32(0.5), np.int64(-2)])
def test_pow_with_any_constant_exponent(exponent) -> None:
    x = np.abs(_x(4, 6)) + 0.5
    check([helper.make_node("Pow", ["x", "e"], ["y"])], {"x": x}, ["y"], [_const("e", exponent)])


def test_comparisons_not_cast_where_on_a_mask() -> None:
    nodes = [
        helper.make_node("Cast", ["x"], ["xi"], to=TensorProto.INT64),
        helper.make_node("Less", ["x", "z"], ["lt"]),
        helper.make_node("LessOrEqual", ["x", "z"], ["le"]),
        helper.make_node("Greater", ["x", "z"], ["gt"]),
        helper.make_node("GreaterOrEqual", ["x", "z"], ["ge"]),
        helper.make_node("Equal", ["xi", "k"], ["eq"]),
        helper.make_node("Not", ["eq"], ["ne"]),
        helper.make_node("And", ["lt", "ne"], ["both"]),
        helper.make_node("Or", ["gt", "eq"], ["either"]),
        helper.make_node("Cast", ["both"], ["bothf"], to=F),
        helper.make_node("Where", ["either", "x", "fill"], ["w"]),
    ]
    x = np.round(_x(3, 4) * 3).astype(np.float32)
    inits = [_const("z", np.zeros((1, 4), np.float32)), _const("k", np.int64(1)), _const("fill", np.float32(-1e9))]
    check(nodes, {"x": x}, ["lt", "le", "gt", "ge", "eq", "ne", "bothf", "xi", "w"], inits)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(1, 3), min_size=1, max_size=3),
    st.lists(st.integers(1, 3), min_size=1, max_size=3),
    st.data(),
)
def test_where_and_expand_broadcast(a, b, data) -> None:
    """Where over three operands of broadcastable shapes; Expand both ways (to a larger and a smaller shape)."""
    out = np.broadcast_shapes(tuple(a), tuple(b)) if _broadcastable(a, b) else None
    if out is None:
        return
    c = [data.draw(st.sampled_from([1, d])) for d in out]
    cond = RNG.random(c) > 0.5
    nodes = [
        helper.make_node("Where", ["c", "a", "b"], ["w"]),
        helper.make_node("Expand", ["a", "shape"], ["e"]),
        helper.make_node("Expand", ["w", "ones"], ["e1"]),
    ]
    inits = [_const("shape", np.array(b, np.int64)), _const("ones", np.ones(1, np.int64))]
    check(nodes, {"c": cond, "a": _x(*a), "b": _x(*b)}, ["w", "e", "e1"], inits)


def _broadcastable(a, b) -> bool:
    try:
        np.broadcast_shapes(tuple(a), tuple(b))
    except ValueError:
        return False
    return True


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=4),
    st.data(),
    st.sampled_from(["ReduceSum", "ReduceMax", "ReduceMean"]),
    st.integers(0, 1),
)
def test_reductions_with_keepdims_variants(shape, data, op, keepdims) -> None:
    rank = len(shape)
    axes = data.draw(st.lists(st.integers(-rank, rank - 1), min_size=0, max_size=rank, unique=True))
    if len({a % rank for a in axes}) != len(axes):
        return
    inputs = ["x", "axes"] if axes else ["x"]
    inits = [_const("axes", np.array(axes, np.int64))] if axes else []
    opset = 18  # axes as an input for all three
    check([helper.make_node(op, inputs, ["y"], keepdims=keepdims)], {"x": _x(*shape)}, ["y"], inits, opset=opset)


def test_reduce_sum_noop_with_empty_axes_and_int64() -> None:
    x = RNG.integers(-5, 5, (3, 4)).astype(np.int64)
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["noop"], noop_with_empty_axes=1),
        helper.make_node("ReduceSum", ["x", "ax"], ["s"], keepdims=0),
    ]
    check(nodes, {"x": x}, ["noop", "s"], [_const("ax", np.array([1], np.int64))])


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [-2, 0, 1, 5])
def test_trilu(upper, k) -> None:
    check(
        [helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper)],
        {"x": _x(2, 4, 6)},
        ["y"],
        [_const("k", np.int64(k))],
    )


@pytest.mark.parametrize(("start", "limit", "delta"), [(0, 10, 1), (10, 0, -3), (2, 3, 5), (0.5, 2.0, 0.25)])
def test_range(start, limit, delta) -> None:
    dtype = np.int64 if isinstance(start, int) else np.float32
    inits = [_const(k, dtype(v)) for k, v in (("s", start), ("l", limit), ("d", delta))]
    nodes = [
        helper.make_node("Range", ["s", "l", "d"], ["r"]),
        helper.make_node("Cast", ["r"], ["rf"], to=F),
        helper.make_node("Add", ["x", "rf"], ["y"]),
    ]
    length = max(int(np.ceil((limit - start) / delta)), 0)
    check(nodes, {"x": _x(2, length)}, ["y"], inits)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.data())
def test_gather_elements(shape, data) -> None:
    rank = len(shape)
    axis = data.draw(st.integers(-rank, rank - 1))
    idx_shape = [data.draw(st.integers(1, d)) for d in shape]
    idx_shape[axis] = data.draw(st.integers(1, 4))
    dim = shape[axis]
    idx = RNG.integers(-dim, dim, idx_shape).astype(np.int64)
    nodes = [helper.make_node("GatherElements", ["x", "i"], ["y"], axis=axis)]
    check(nodes, {"x": _x(*shape)}, ["y"], [_const("i", idx)])


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("indices", [np.int64(-1), np.array([[0, -2], [1, 1]], np.int64), np.array([2, 0], np.int64)])
def test_gather_any_constant_indices_any_axis(axis, indices) -> None:
    check([helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)], {"x": _x(3, 3, 4)}, ["y"], [_const("i", indices)])


@pytest.mark.parametrize(
    ("starts", "ends", "axes", "steps"),
    [([-1], [-1000], [1], [-1]), ([0, 1], [9, -1], [2, 0], [2, 1]), ([-3], [2**62], [-1], [1]), ([3], [0], [2], [-2])],
)
def test_slice_steps_and_negative_indices(starts, ends, axes, steps) -> None:
    inits = [_const(k, np.array(v, np.int64)) for k, v in (("s", starts), ("e", ends), ("a", axes), ("t", steps))]
    check([helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])], {"x": _x(3, 4, 5)}, ["y"], inits)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("pads", [[0, 1, 2, 0, 2, 1], [1, 0, 0, 0, 0, 0]])
def test_pad(mode, pads) -> None:
    inits = [_const("p", np.array(pads, np.int64)), _const("v", np.float32(1.5))]
    inputs = ["x", "p", "v"] if mode == "constant" else ["x", "p"]
    check([helper.make_node("Pad", inputs, ["y"], mode=mode)], {"x": _x(2, 3, 4)}, ["y"], inits)


def test_pad_with_axes_input() -> None:
    inits = [_const("p", np.array([1, 2], np.int64)), _const("ax", np.array([-1], np.int64))]
    check([helper.make_node("Pad", ["x", "p", "", "ax"], ["y"])], {"x": _x(2, 3)}, ["y"], inits, opset=18)


@pytest.mark.parametrize(
    "attrs",
    [
        {"pads": [1, 1]},
        {"strides": [2], "dilations": [2], "pads": [2, 1]},
        {"auto_pad": "SAME_UPPER", "strides": [2]},
        {"group": 2},
    ],
)
def test_conv1d(attrs) -> None:
    cin = 4
    w = _x(6, cin // attrs.get("group", 1), 3)
    check(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)],
        {"x": _x(2, cin, 11)},
        ["y"],
        [_const("w", w), _const("b", _x(6))],
        atol=1e-5,
    )


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize(
    ("shape", "attrs"),
    [
        ((2, 3, 9), {"kernel_shape": [3], "strides": [2]}),
        ((1, 2, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ((1, 2, 6, 5), {"kernel_shape": [2, 3], "ceil_mode": 1, "strides": [2, 2]}),
    ],
)
def test_pools(op, shape, attrs) -> None:
    check([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": _x(*shape)}, ["y"])


def test_global_average_pool_flatten_identity() -> None:
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Identity", ["f"], ["y"]),
    ]
    check(nodes, {"x": _x(2, 3, 4, 5)}, ["y"])


def test_silu_as_exported() -> None:
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])]
    check(nodes, {"x": _x(4, 8)}, ["y"])


def test_shape_size_constant_of_shape_range_fold_from_input_shape() -> None:
    """Shape-derived values computed from a run-time input's type alone (no data needed)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], start=-2),
        helper.make_node("ConstantOfShape", ["s"], ["ones"], value=numpy_helper.from_array(np.ones(1, np.float32))),
        helper.make_node("Size", ["x"], ["n"]),
        helper.make_node("Cast", ["n"], ["nf"], to=F),
        helper.make_node("Div", ["ones", "nf"], ["scaled"]),
        helper.make_node("Mul", ["x", "scaled"], ["y"]),
    ]
    check(nodes, {"x": _x(2, 3, 4)}, ["y"])


def test_integer_division_truncates_like_onnx() -> None:
    a = np.array([7, -7, 7, -7, 0], np.int64)
    b = np.array([2, 2, -2, -2, 3], np.int64)
    check([helper.make_node("Div", ["a", "b"], ["y"])], {"a": a, "b": b}, ["y"])


def test_onnx_model_with_only_a_shape_output_stays_a_node() -> None:
    """A graph output the import could fold is still written by a node (the lowering runs outputs)."""
    model = helper.make_model(
        helper.make_graph([helper.make_node("Shape", ["x"], ["y"])], "g", [_vi("x", [2, 3])], [_vi("y", None)]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    graph = import_model(model)
    assert [n.op.value for n in graph.nodes] == ["Shape"]
    np.testing.assert_array_equal(run(graph, {"x": _x(2, 3)})["y"], [2, 3])


def test_integer_clip_and_casts_truncate_like_onnx() -> None:
    x = np.array([[-2.7, -0.5, 0.0, 0.4, 3.9, 100.0]], np.float32)
    nodes = [
        helper.make_node("Cast", ["x"], ["xi"], to=TensorProto.INT64),
        helper.make_node("Clip", ["xi", "lo", "hi"], ["ci"]),
        helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BOOL),
        helper.make_node("Cast", ["xb"], ["bf"], to=F),
        helper.make_node("Cast", ["ci"], ["y"], to=TensorProto.INT32),
    ]
    check(nodes, {"x": x}, ["xi", "ci", "bf", "y"], [_const("lo", np.int64(-1)), _const("hi", np.int64(3))])
