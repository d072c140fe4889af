"""The vector recipes of the zoo's elementwise ops, their movement and reduction kernels, on single-node graphs
in the simulator's checked mode on the tiny machine: fp32 bit-identical to the reference interpreter (each
recipe follows the reference op by op), int8 bit-exact against the quantized reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lower_helpers import check_fp32, check_int8, random_inputs

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower.compiler import compile
from fusion.lower.errors import UnsupportedOpError
from fusion.lower.kernels.recipes import instructions_per_element
from fusion.reference.interpreter import run

SETTINGS = settings(max_examples=8, deadline=None, derandomize=True)
shapes = st.lists(st.integers(1, 9), min_size=1, max_size=4).map(tuple)


def _graph(op: OpType, in_shape: tuple[int, ...], consts: list[np.ndarray] = (), matmul: bool = False, **attrs):
    """op(x, *consts); with `matmul`, x goes through a MatMul first, so the int8 path feeds the op int8 data."""
    b = GraphBuilder(op.value.lower())
    x = b.input("x", in_shape)
    if matmul:
        w = np.random.default_rng(4).standard_normal((in_shape[-1], in_shape[-1])).astype(np.float32)
        x = b.op(OpType.MatMul, x, b.constant(w))
    b.output(b.op(op, x, *(b.constant(c) for c in consts), **attrs))
    return b.build()


def check_exact(graph, inputs, config: str = "tiny") -> None:
    """fp32 bit for bit against the reference interpreter (within FP32_TOL after a MatMul, which sums in another
    order than numpy), int8 bit-exact against the quantized reference."""
    if any(n.op == OpType.MatMul for n in graph.nodes):
        check_fp32(graph, inputs, config)
    else:
        got, _ = compile(graph, config, "fp32", cleanup=False).run(inputs, checked=True)
        want = run(graph, inputs)
        for name in graph.outputs:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    check_int8(graph, inputs, config)


UNARY = [
    (OpType.Neg, {}),
    (OpType.Abs, {}),
    (OpType.Reciprocal, {}),
    (OpType.Sigmoid, {}),
    (OpType.Clip, {"min": 0.0, "max": 6.0}),
    (OpType.Clip, {"min": -0.5, "max": float("inf")}),
    (OpType.HardSigmoid, {"alpha": 0.2, "beta": 0.5}),
    (OpType.HardSwish, {}),
    (OpType.Gelu, {"approximate": "tanh"}),
]


@SETTINGS
@given(shapes, st.sampled_from(range(len(UNARY))), st.integers(0, 3), st.booleans())
def test_unary_recipes(shape, which, seed, matmul) -> None:
    op, attrs = UNARY[which]
    matmul = matmul and op != OpType.Reciprocal  # 1/x magnifies the MatMul's fp32 summation order near 0
    graph = _graph(op, shape, matmul=matmul, **attrs)
    inputs = {"x": (np.random.default_rng(seed).standard_normal(shape) * 4).astype(np.float32)}
    check_exact(graph, inputs)


@pytest.mark.parametrize("exponent", [3.0, 4.0, 1.0, -1.0, -2.0, 0.5, 2.0])
def test_pow_with_a_constant_exponent(exponent) -> None:
    """Integer exponents as multiplies left to right (the reciprocal after, for negative ones): bit for bit
    against that definition written out here, and against the reference interpreter, which defines float32
    integer powers the same way (so int8 chains through Pow are bit-exact too)."""
    graph = _graph(OpType.Pow, (4, 13), [np.array(exponent, np.float32)])
    inputs = random_inputs(graph, positive=exponent == 0.5)
    got = compile(graph, "tiny", "fp32", cleanup=False).run(inputs, checked=True)[0][graph.outputs[0]]
    x = inputs["x"]
    if exponent == 0.5:
        oracle = np.sqrt(x)
    else:
        oracle = x
        for _ in range(int(abs(exponent)) - 1):
            oracle = oracle * x
        oracle = np.float32(1) / oracle if exponent < 0 else oracle
    np.testing.assert_array_equal(got, oracle)
    np.testing.assert_allclose(got, np.power(x, np.float32(exponent)), rtol=4e-7 * abs(exponent))
    check_exact(graph, inputs)


def test_pow_refuses_what_the_vector_unit_cannot_compute() -> None:
    graph = _graph(OpType.Pow, (4, 5), [np.array(2.5, np.float32)])
    with pytest.raises(UnsupportedOpError, match="no log"):
        compile(graph, "tiny", "fp32", cleanup=False)


def _where_graph(shape, cond: np.ndarray, other: np.ndarray | None):
    """where(cond, x, other) with a constant condition; `other` a constant, or None for a second input."""
    b = GraphBuilder("where")
    w = np.random.default_rng(4).standard_normal((shape[-1], shape[-1])).astype(np.float32)
    x = b.op(OpType.MatMul, b.input("x", shape), b.constant(w))  # int8 scores on the int8 path
    y = b.input("y", shape) if other is None else b.constant(other)
    b.output(b.op(OpType.Where, b.constant(cond), x, y))
    return b.build()


@SETTINGS
@given(st.integers(1, 3), st.integers(1, 12), st.sampled_from(["scalar", "tensor", "input"]), st.integers(0, 9))
def test_where_with_a_constant_mask(heads, t, other_kind, seed) -> None:
    """GPT-2's causal mask: scores kept on and below the diagonal, a large negative value above it."""
    shape = (heads, t, t)
    cond = np.tril(np.ones((t, t), bool))[None]
    other = {
        "scalar": np.array(np.finfo(np.float32).min, np.float32),
        "tensor": np.random.default_rng(seed).standard_normal((1, t, t)).astype(np.float32),
        "input": None,
    }[other_kind]
    graph = _where_graph(shape, cond, other)
    check_exact(graph, random_inputs(graph, seed))


def test_where_masks_keep_infinities_and_signed_zeros() -> None:
    cond = np.array([[True, False, True, False]])
    b = GraphBuilder("where_edges")
    b.output(b.op(OpType.Where, b.constant(cond), b.input("x", (1, 4)), b.input("y", (1, 4))))
    graph = b.build()
    inputs = {
        "x": np.array([[-0.0, 1.0, -np.inf, 2.0]], np.float32),
        "y": np.array([[5, -np.inf, 3, -0.0]], np.float32),
    }
    got, _ = compile(graph, "tiny", "fp32", cleanup=False).run(inputs, checked=True)
    want = np.where(cond, inputs["x"], inputs["y"])
    np.testing.assert_array_equal(np.signbit(got[graph.outputs[0]]), np.signbit(want))
    np.testing.assert_array_equal(got[graph.outputs[0]], want)


def test_where_refuses_a_condition_computed_at_run_time() -> None:
    b = GraphBuilder("where_dyn")
    x = b.input("x", (2, 3))
    cond = b.op(OpType.Less, x, b.constant(np.array(0.0, np.float32)))
    b.output(b.op(OpType.Where, cond, x, b.constant(np.array(0.0, np.float32))))
    with pytest.raises(UnsupportedOpError, match="Less"):
        compile(b.build(), "tiny", "fp32", cleanup=False)


@SETTINGS
@given(shapes, st.data())
def test_expand_broadcasts_in_the_dma(shape, data) -> None:
    """GQA repeats KV heads: a size-1 dim (or a missing leading one) expanded."""
    src = tuple(d if data.draw(st.booleans()) else 1 for d in shape)[data.draw(st.integers(0, len(shape) - 1)) :]
    graph = _graph(OpType.Expand, src, shape=shape, matmul=data.draw(st.booleans()))
    check_exact(graph, random_inputs(graph))


def test_expand_of_int8_data_stays_int8() -> None:
    b = GraphBuilder("mm_expand")
    h = b.op(OpType.MatMul, b.input("x", (1, 5, 6)), b.constant(np.ones((6, 4), np.float32)))
    b.output(b.op(OpType.Expand, h, shape=(3, 5, 4)))
    model = check_int8(b.build(), random_inputs(b.build()))
    assert model.plan.scales[model.graph.outputs[0]] is not None


@pytest.mark.parametrize("op", [OpType.ReduceSum, OpType.ReduceMax, OpType.ReduceMean])
@pytest.mark.parametrize(("axes", "keepdims"), [((1,), 1), ((2,), 0), ((1, 2), 1), ((0,), 0)])
def test_reductions(op, axes, keepdims) -> None:
    graph = _graph(op, (3, 11, 9), axes=axes, keepdims=keepdims)
    check_exact(graph, random_inputs(graph))


def test_reduce_max_of_int8_data_stays_int8() -> None:
    b = GraphBuilder("mm_max")
    h = b.op(OpType.MatMul, b.input("x", (4, 6)), b.constant(np.ones((6, 5), np.float32)))
    b.output(b.op(OpType.ReduceMax, h, axes=(1,), keepdims=1))
    model = check_int8(b.build(), random_inputs(b.build()))
    assert model.plan.scales[model.graph.outputs[0]] is not None


@pytest.mark.parametrize("value", [0.0, -1.5])
def test_pad_constant(value) -> None:
    graph = _graph(OpType.Pad, (2, 3, 5), pads=(0, 1, 2, 0, 2, 1), mode="constant", value=value)
    check_exact(graph, random_inputs(graph))


def test_cast_between_float_types_is_an_alias_and_refuses_int() -> None:
    graph = _graph(OpType.Cast, (3, 4), to="float32")
    model = compile(graph, "tiny", "fp32", cleanup=False)
    assert not model.kernels  # no kernel: the output shares the input's bytes
    check_exact(graph, random_inputs(graph))
    with pytest.raises(UnsupportedOpError, match="int64"):
        compile(_graph(OpType.Cast, (3, 4), to="int64"), "tiny", "fp32", cleanup=False)


def test_every_unsupported_node_is_listed_once() -> None:
    b = GraphBuilder("two_bad")
    x = b.input("x", (2, 3))
    h = b.op(OpType.Sin, x, name="sin")
    h = b.op(OpType.Pow, h, b.constant(np.array(1.5, np.float32)), name="pow")
    b.output(b.op(OpType.Cos, h, name="cos"))
    with pytest.raises(UnsupportedOpError) as err:
        compile(b.build(), "tiny", "fp32", cleanup=False)
    assert all(name in str(err.value) for name in ("'sin'", "'pow'", "'cos'")) and "3 unsupported" in str(err.value)


@pytest.mark.parametrize(
    ("op", "consts", "attrs", "expected"),
    [
        (OpType.HardSwish, [], {}, 4),
        (OpType.Gelu, [], {"approximate": "none"}, 5),
        (OpType.Gelu, [], {"approximate": "tanh"}, 9),
        (OpType.Pow, [np.array(3.0, np.float32)], {}, 2),
        (OpType.Neg, [], {}, 1),
    ],
)
def test_recipe_cost_is_counted_from_what_it_emits(op, consts, attrs, expected) -> None:
    graph = _graph(op, (3, 5), consts, **attrs)
    node = graph.nodes[-1]
    assert instructions_per_element(graph, node) == expected
    model = compile(graph, "tiny", "fp32", cleanup=False)
    vector = [i.mnemonic for i in model.program.instructions() if i.mnemonic.startswith("v.")]
    assert len(vector) == expected  # one tile of 15 elements: each instruction once


@pytest.mark.parametrize(("upper", "k"), [(0, 0), (1, 0), (0, -1), (1, 2)])
def test_trilu_keeps_a_triangle_of_the_last_two_axes(upper, k) -> None:
    graph = _graph(OpType.Trilu, (2, 5, 7), matmul=True, upper=upper, k=k)
    check_exact(graph, random_inputs(graph))
    graph = _graph(OpType.Trilu, (3, 4), upper=upper, k=k)  # infinities kept or zeroed exactly (fp32 only)
    inputs = {"x": np.array(np.arange(12).reshape(3, 4) - 5.5, np.float32) * np.float32(np.inf)}
    got, _ = compile(graph, "tiny", "fp32", cleanup=False).run(inputs, checked=True)
    np.testing.assert_array_equal(got[graph.outputs[0]], run(graph, inputs)[graph.outputs[0]])


@pytest.mark.parametrize(
    "attrs",
    [
        {"strides": (1,), "pads": (1, 1), "dilations": (1,), "group": 1},
        {"strides": (2,), "pads": (1, 0), "dilations": (1,), "group": 1},
        {"strides": (1,), "pads": (2, 2), "dilations": (2,), "group": 3},
    ],
)
def test_conv1d(attrs) -> None:
    """A speech front end's Conv1d: the baseline's windows are 1-D views of the padded input."""
    w = (np.random.default_rng(3).standard_normal((6, 6 // attrs["group"], 3)) * 0.3).astype(np.float32)
    bias = np.random.default_rng(4).standard_normal(6).astype(np.float32)
    graph = _graph(OpType.Conv, (2, 6, 11), [w, bias], **attrs)
    inputs = random_inputs(graph)
    check_fp32(graph, inputs)
    check_int8(graph, inputs)


@pytest.mark.parametrize("op", [OpType.MaxPool, OpType.AveragePool])
def test_pooling_1d(op) -> None:
    attrs = {"kernel": (3,), "strides": (2,), "pads": (1, 1), "dilations": (1,), "ceil_mode": 0}
    if op == OpType.AveragePool:
        attrs["count_include_pad"] = 0
    graph = _graph(op, (1, 4, 9), matmul=True, **attrs)
    check_exact(graph, random_inputs(graph))


@pytest.mark.parametrize("mode", ["edge", "reflect"])
@pytest.mark.parametrize("pads", [(0, 1, 2, 0, 2, 1), (1, 0, 3, 1, 2, 0)])
def test_pad_edge_and_reflect(mode, pads) -> None:
    graph = _graph(OpType.Pad, (2, 3, 5), matmul=True, pads=pads, mode=mode, value=0.0)
    check_exact(graph, random_inputs(graph))
