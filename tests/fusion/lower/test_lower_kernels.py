"""Each kernel generator on single-node graphs, in the simulator's checked (race-detecting) mode, on the tiny
machine (4x4 array, 8 KiB buffer halves) so shapes that are not multiples of the tile sizes are the norm:
fp32 within FP32_TOL of the reference, int8 bit-exact against the quantized reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lower_helpers import check_both, check_fp32, random_inputs

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower.compiler import compile
from fusion.reference.quantized import run_quantized

SETTINGS = settings(max_examples=12, deadline=None, derandomize=True)


def _graph(op: OpType, shapes: list[tuple[int, ...]], consts: list[np.ndarray] = (), **attrs):
    b = GraphBuilder(op.value.lower())
    ins = [b.input(f"x{i}", s) for i, s in enumerate(shapes)]
    ins += [b.constant(c) for c in consts]
    b.output(b.op(op, *ins, **attrs))
    return b.build()


def _w(*shape: int, seed: int = 1) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * 0.5).astype(np.float32)


@SETTINGS
@given(st.integers(1, 23), st.integers(1, 21), st.integers(1, 19))
def test_gemm_with_bias_any_shape(m: int, k: int, n: int) -> None:
    check_both(_graph(OpType.Gemm, [(m, k)], [_w(k, n), _w(n, seed=2)]))


@pytest.mark.parametrize(
    ("a", "b"),
    [((2, 3, 5, 7), (7, 6)), ((3, 5), (2, 5, 4)), ((2, 1, 3, 4), (1, 3, 4, 5)), ((6,), (6, 3)), ((4, 6), (6,))],
)
def test_batched_matmul_of_two_activations(a, b) -> None:
    check_both(_graph(OpType.MatMul, [a, b]))


def test_gemm_bias_per_row_and_full_tile() -> None:
    check_both(_graph(OpType.Gemm, [(6, 5)], [_w(5, 7), _w(6, 1, seed=3)]))
    check_both(_graph(OpType.Gemm, [(6, 5)], [_w(5, 7), _w(6, 7, seed=4)]))


def test_gemm_larger_than_the_accumulator_half() -> None:
    check_both(_graph(OpType.MatMul, [(300, 9)], [_w(9, 10)]))


shapes = st.lists(st.integers(1, 6), min_size=1, max_size=4).map(tuple)


@SETTINGS
@given(shapes, st.data(), st.sampled_from([OpType.Add, OpType.Sub, OpType.Mul, OpType.Div]))
def test_binary_broadcasting(out_shape, data, op) -> None:
    """The second operand drops leading dims and sets random dims to 1 (numpy broadcasting)."""
    keep = data.draw(st.integers(0, len(out_shape)))
    other = tuple(d if data.draw(st.booleans()) else 1 for d in out_shape[len(out_shape) - keep :])
    pair = [out_shape, other] if data.draw(st.booleans()) else [other, out_shape]
    positive = op == OpType.Div
    check_both(_graph(op, pair), positive=positive)


@pytest.mark.parametrize("op", [OpType.Mul, OpType.Add, OpType.Sub, OpType.Div])
def test_scalar_constant_operand(op) -> None:
    check_both(_graph(op, [(3, 7)], [np.array([0.37], np.float32)]))


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        (OpType.Relu, {}),
        (OpType.Sigmoid, {}),
        (OpType.Tanh, {}),
        (OpType.Erf, {}),
        (OpType.Exp, {}),
        (OpType.Gelu, {"approximate": "none"}),
        (OpType.Gelu, {"approximate": "tanh"}),
    ],
)
def test_unary(op, attrs) -> None:
    check_both(_graph(op, [(5, 37)], **attrs))


def test_sqrt_and_pow_square() -> None:
    check_both(_graph(OpType.Sqrt, [(3, 50)]), positive=True)
    check_both(_graph(OpType.Pow, [(3, 50)], [np.array([2.0], np.float32)]))


def test_relu_after_matmul_stays_int8() -> None:
    b = GraphBuilder("mm_relu")
    x = b.input("x", (7, 9))
    b.output(b.op(OpType.Relu, b.op(OpType.MatMul, x, b.constant(_w(9, 6)))))
    check_both(b.build())


def test_concat_of_int8_values_at_different_scales_dequantizes() -> None:
    b = GraphBuilder("concat_q")
    x = b.input("x", (5, 6))
    left = b.op(OpType.MatMul, x, b.constant(_w(6, 3)))
    right = b.op(OpType.MatMul, x, b.constant(_w(6, 4, seed=7) * 9))
    b.output(b.op(OpType.Concat, left, right, axis=1))
    check_both(b.build())


@pytest.mark.parametrize(
    ("shape", "axis"), [((3, 17), 1), ((2, 3, 5), 1), ((2, 5, 4), 0), ((4, 300), 1), ((2, 20, 3), 1), ((40, 3), 0)]
)
def test_softmax(shape, axis) -> None:
    """Last axis: row layout; an axis with data after it: column layout (sequential sums, as numpy)."""
    check_both(_graph(OpType.Softmax, [shape], axis=axis))


@pytest.mark.parametrize(("shape", "axis"), [((6, 19), 1), ((2, 3, 8), 1), ((2, 3, 8), 2)])
def test_layernorm(shape, axis) -> None:
    rest = shape[axis:]
    check_both(_graph(OpType.LayerNorm, [shape], [_w(*rest) + 1, _w(*rest, seed=5)], axis=axis, epsilon=1e-5))


@pytest.mark.parametrize(("axes", "keepdims"), [((1,), 1), ((2,), 0), ((1, 2), 1), ((0,), 0)])
def test_reduce_mean(axes, keepdims) -> None:
    check_both(_graph(OpType.ReduceMean, [(3, 11, 9)], axes=axes, keepdims=keepdims))


def test_reduce_mean_over_separated_axes_is_close_not_bit_exact() -> None:
    """numpy sums a (0, 2) reduction in an order of its own; the lowering sums each permuted row, so on the
    int8 path (float32 ReduceMean) results agree to float32 rounding rather than bit for bit."""
    graph = _graph(OpType.ReduceMean, [(3, 5, 9)], axes=(0, 2), keepdims=0)
    inputs = random_inputs(graph)
    check_fp32(graph, inputs)
    model = compile(graph, "tiny", "int8", samples=[inputs], cleanup=False)
    got, _ = model.run(inputs, checked=True)
    want = run_quantized(graph, inputs, model.params)[graph.outputs[0]]
    np.testing.assert_allclose(got[graph.outputs[0]], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("perm", [(1, 0, 2), (2, 0, 1), (0, 2, 1), (2, 1, 0)])
def test_transpose(perm) -> None:
    check_both(_graph(OpType.Transpose, [(3, 5, 6)], perm=perm))


def test_data_movement() -> None:
    check_both(_graph(OpType.Concat, [(2, 3, 4), (2, 5, 4), (2, 1, 4)], axis=1))
    check_both(_graph(OpType.Slice, [(6, 9)], axes=(0, 1), starts=(1, 2), ends=(5, 9), steps=(2, 3)))
    check_both(_graph(OpType.Slice, [(6, 9)], axes=(1,), starts=(7,), ends=(0,), steps=(-2,)))
    check_both(_graph(OpType.Gather, [(5, 4)], [np.array([4, 0, -1], np.int64)], axis=0))
    b = GraphBuilder("reshape_const")
    table = b.op(OpType.Reshape, b.constant(_w(3, 4)), shape=(2, 6))
    b.output(b.op(OpType.Add, b.op(OpType.Reshape, b.input("x", (12,)), shape=(2, 6)), table))
    check_both(b.build())
    b = GraphBuilder("split")
    outs = b.op_multi(OpType.Split, b.input("x", (4, 9)), n_outputs=3, axis=1, sizes=(2, 3, 4))
    b.output(*outs)
    check_both(b.build())


@pytest.mark.parametrize(
    "attrs",
    [
        {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "group": 1},
        {"strides": (2, 1), "pads": (0, 1, 2, 0), "dilations": (1, 2), "group": 1},
        {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1), "group": 2},
    ],
)
def test_conv(attrs) -> None:
    w = _w(4, 6 // attrs["group"], 3, 3)
    check_both(_graph(OpType.Conv, [(2, 6, 7, 6)], [w, _w(4, seed=9)], **attrs))


@pytest.mark.parametrize("op", [OpType.MaxPool, OpType.AveragePool])
@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1), "dilations": (1, 1), "ceil_mode": 0},
        {"kernel": (2, 3), "strides": (2, 2), "pads": (0, 0, 0, 0), "dilations": (1, 1), "ceil_mode": 1},
    ],
)
def test_pooling(op, attrs) -> None:
    if op == OpType.AveragePool:
        attrs = {**attrs, "count_include_pad": 0}
    check_both(_graph(op, [(1, 3, 7, 8)], **attrs))


def test_batchnorm_unfolded() -> None:
    c = 5
    consts = [_w(c) + 1, _w(c, seed=2), _w(c, seed=3), np.abs(_w(c, seed=4)) + 0.5]
    check_both(_graph(OpType.BatchNorm, [(2, c, 3, 4)], consts, epsilon=1e-5))
