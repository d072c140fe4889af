"""Numerics against independent oracles: Python integers, float64 numpy, and hand-written cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from sim_helpers import py_alu

from isa.enums import Activation, DType
from simulator.errors import Fault
from simulator.semantics import matrix as M
from simulator.semantics import scalar as S
from simulator.semantics import vector as V

i8s = arrays(np.int8, st.integers(1, 64), elements=st.integers(-128, 127))
i32s = arrays(np.int32, st.integers(1, 64), elements=st.integers(-(2**31), 2**31 - 1))
int32 = st.integers(-(2**31), 2**31 - 1)


def wrap(v: int) -> int:
    return (v + 2**31) % 2**32 - 2**31


def sat(v: int) -> int:
    return max(-128, min(127, v))


PY_OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "max": max, "min": min}


@settings(max_examples=60)
@given(a=i8s, data=st.data(), op=st.sampled_from(sorted(PY_OPS)))
def test_i8_binary_saturates(a: np.ndarray, data, op: str) -> None:
    b = data.draw(arrays(np.int8, a.shape, elements=st.integers(-128, 127)))
    want = [sat(PY_OPS[op](int(x), int(y))) for x, y in zip(a, b, strict=True)]
    got = V.binary(op, a, b, DType.i8)
    assert got.dtype == np.int8 and got.tolist() == want


@settings(max_examples=60)
@given(a=i32s, b=int32, op=st.sampled_from(sorted(PY_OPS)))
def test_i32_binary_wraps_with_scalar_operand(a: np.ndarray, b: int, op: str) -> None:
    want = [wrap(PY_OPS[op](int(x), b)) for x in a]
    assert V.binary(op, a, b, DType.i32).tolist() == want


@settings(max_examples=60)
@given(a=i32s, s=st.integers(0, 40))
def test_i32_shifts(a: np.ndarray, s: int) -> None:
    amount = s & 31
    assert V.binary("sll", a, s, DType.i32).tolist() == [wrap(int(x) << amount) for x in a]
    assert V.binary("sra", a, s, DType.i32).tolist() == [int(x) >> amount for x in a]
    assert V.binary("srl", a, s, DType.i32).tolist() == [wrap((int(x) % 2**32) >> amount) for x in a]


@settings(max_examples=40)
@given(a=i8s, s=st.integers(0, 7))
def test_i8_shifts_saturate_left(a: np.ndarray, s: int) -> None:
    assert V.binary("sll", a, s, DType.i8).tolist() == [sat(int(x) << s) for x in a]
    assert V.binary("srl", a, s, DType.i8).tolist() == [
        ((int(x) % 256) >> s) - (256 if ((int(x) % 256) >> s) > 127 else 0) for x in a
    ]


def test_float_only_ops_refuse_integers() -> None:
    with pytest.raises(Fault, match="div needs dtype f32"):
        V.binary("div", np.ones(2, np.int32), np.ones(2, np.int32), DType.i32)
    with pytest.raises(Fault, match="exp needs dtype f32"):
        V.unary("exp", np.ones(2, np.int8), DType.i8)
    with pytest.raises(Fault, match="needs an integer dtype"):
        V.binary("sll", np.ones(2, np.float32), 1, DType.f32)


def test_unary_integer_edges() -> None:
    assert V.unary("neg", np.array([-128, 5], np.int8), DType.i8).tolist() == [127, -5]
    assert V.unary("abs", np.array([-128], np.int8), DType.i8).tolist() == [127]
    assert V.unary("neg", np.array([-(2**31)], np.int32), DType.i32).tolist() == [-(2**31)]
    assert V.unary("relu", np.array([-3, 0, 4], np.int32), DType.i32).tolist() == [0, 0, 4]


@settings(max_examples=40)
@given(a=arrays(np.float32, st.integers(1, 32), elements=st.floats(-8, 8, width=32)))
def test_float_unary_match_float64_references(a: np.ndarray) -> None:
    ref = a.astype(np.float64)
    cases = {
        "exp": np.exp(ref),
        "tanh": np.tanh(ref),
        "sigmoid": 1 / (1 + np.exp(-ref)),
        "erf": np.array([math.erf(v) for v in ref]),
        "sqrt": np.sqrt(np.abs(ref)),
        "relu": np.maximum(ref, 0),
    }
    for op, want in cases.items():
        arg = np.abs(a) if op == "sqrt" else a
        got = V.unary(op, arg, DType.f32)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-7)


@settings(max_examples=60)
@given(x=i32s, mult=int32, shift=st.integers(0, 40))
def test_requantize_matches_python_integers(x: np.ndarray, mult: int, shift: int) -> None:
    want = [sat((int(v) * mult + ((1 << (shift - 1)) if shift else 0)) >> shift) for v in x]
    assert V.requantize(x, mult, shift).tolist() == want


def test_quantize_rounds_half_to_even_and_saturates() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 300.0, -300.0, np.nan, np.inf], np.float32)
    assert V.quantize(x, 1.0).tolist() == [0, 2, 2, 0, -2, 127, -128, 0, 127]


def test_convert_rounds_and_saturates() -> None:
    f = np.array([2.5, 3.5, -2.5, 1e10, -1e10, np.nan], np.float32)
    assert V.convert(f, DType.f32, DType.i32).tolist() == [2, 4, -2, 2**31 - 1, -(2**31), 0]
    assert V.convert(f, DType.f32, DType.i8).tolist() == [2, 4, -2, 127, -128, 0]
    assert V.convert(np.array([300, -300, 5], np.int32), DType.i32, DType.i8).tolist() == [127, -128, 5]
    assert V.convert(np.array([-128], np.int8), DType.i8, DType.f32).tolist() == [-128.0]


@settings(max_examples=40)
@given(rows=st.integers(1, 6), period=st.integers(1, 8), data=st.data())
def test_reductions(rows: int, period: int, data) -> None:
    a = data.draw(arrays(np.int8, rows * period, elements=st.integers(-128, 127)))
    table = a.astype(np.int64).reshape(rows, period)
    assert V.reduce("rsum", a, period, DType.i8).tolist() == table.sum(1).tolist()
    assert V.reduce("rsum", a, period, DType.i8).dtype == np.int32
    assert V.reduce("rmax", a, period, DType.i8).tolist() == table.max(1).tolist()
    assert V.reduce("rmin", a, period, DType.i8).tolist() == table.min(1).tolist()
    with pytest.raises(Fault, match="do not split"):
        V.reduce("rsum", np.zeros(7, np.int8), 2, DType.i8)


def test_clip_saturates_bounds_for_i8() -> None:
    a = np.array([-100, 0, 100], np.int8)
    assert V.clip(a, -1000, 50, DType.i8).tolist() == [-100, 0, 50]
    assert V.clip(np.array([1.5, -3.0], np.float32), -1.0, 1.0, DType.f32).tolist() == [1.0, -1.0]


@settings(max_examples=40)
@given(rows=st.integers(1, 20), k=st.integers(1, 16), cols=st.integers(1, 16), data=st.data())
def test_int8_matmul_is_exact(rows: int, k: int, cols: int, data) -> None:
    a = data.draw(arrays(np.int8, (rows, k), elements=st.integers(-128, 127)))
    w = data.draw(arrays(np.int8, (k, cols), elements=st.integers(-128, 127)))
    got = M.matmul(a, w, DType.i8)
    assert got.dtype == np.int32
    assert np.array_equal(got, a.astype(np.int64) @ w.astype(np.int64))


def test_fp32_matmul_sums_in_array_order() -> None:
    a = np.array([[1e8, 1.0, -1e8]], np.float32)
    w = np.ones((3, 1), np.float32)
    # ((0 + 1e8) + 1) - 1e8 in fp32 loses the 1: the column adds one product per PE, in k order
    assert M.matmul(a, w, DType.f32).tolist() == [[0.0]]
    rng = np.random.default_rng(0)
    a, w = rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal((7, 3)).astype(np.float32)
    np.testing.assert_allclose(M.matmul(a, w, DType.f32), a.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)


def _column_sums(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The array's order spelled out: from +0, each rounded product added in k order, one numpy step per k."""
    total = np.zeros((a.shape[0], w.shape[1]), np.float32)
    with np.errstate(all="ignore"):
        for k in range(a.shape[1]):
            total += a[:, k : k + 1] * w[k]
    return total


SPECIAL = st.sampled_from([0.0, -0.0, 1.5, -2.0, 3e38, -3e38, np.inf, -np.inf, np.nan])


@settings(max_examples=60)
@given(rows=st.integers(1, 8), k=st.integers(0, 8), cols=st.integers(1, 8), data=st.data())
def test_fp32_matmul_of_zero_activations_is_bit_exact(rows: int, k: int, cols: int, data) -> None:
    """Zero (+-0) activations, the planner's inputs, against the summation order spelled out: +0 sums where the
    weights are finite, and whatever the order gives where they are not (0 x inf is NaN)."""
    a = data.draw(arrays(np.float32, (rows, k), elements=st.sampled_from([0.0, -0.0])))
    w = data.draw(arrays(np.float32, (k, cols), elements=st.one_of(st.floats(-1e3, 1e3, width=32), SPECIAL)))
    got, want = M.matmul(a, w, DType.f32), _column_sums(a, w)
    assert got.dtype == np.float32 and got.tobytes() == want.tobytes()


def test_accumulate_wraps() -> None:
    acc = np.array([[2**31 - 1]], np.int32)
    assert M.accumulate(acc, np.array([[1]], np.int32)).tolist() == [[-(2**31)]]


def test_integer_epilogue_bias_relu_requantize() -> None:
    acc = np.array([[100, -300], [50, 7]], np.int32)
    bias = np.array([10, 20], np.int32)
    res = np.array([[1, 1], [1, 1]], np.int32)
    got = M.epilogue(acc, bias, res, Activation.relu, 3, 2, DType.i8)
    want = [[sat((max(v, 0) * 3 + 2) >> 2) for v in row] for row in (acc + bias + res).tolist()]
    assert got.tolist() == want
    assert M.epilogue(acc, None, None, Activation.none, 0, 0, DType.i32).tolist() == acc.tolist()
    scale = S.bits_from_f32(0.5)
    assert M.epilogue(acc, None, None, Activation.none, scale, 0, DType.f32).tolist() == [[50.0, -150.0], [25.0, 3.5]]
    with pytest.raises(Fault, match="gelu needs the f32 path"):
        M.epilogue(acc, None, None, Activation.gelu, 1, 0, DType.i8)


def test_float_epilogue_gelu() -> None:
    acc = np.array([[-1.0, 0.0, 2.0]], np.float32)
    got = M.epilogue(acc, None, None, Activation.gelu, S.bits_from_f32(1.0), 0, DType.f32)
    want = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in (-1.0, 0.0, 2.0)]
    np.testing.assert_allclose(got[0], want, rtol=1e-6)
    with pytest.raises(Fault, match="drains only to f32"):
        M.epilogue(acc, None, None, Activation.none, 1, 0, DType.i8)


@settings(max_examples=80)
@given(a=int32, b=int32, op=st.sampled_from(sorted(S.ALU)))
def test_scalar_alu_against_python(a: int, b: int, op: str) -> None:
    if op in ("div", "rem") and b == 0:
        with pytest.raises(Fault, match="division by zero"):
            S.ALU[op](a, b)
        return
    assert S.ALU[op](a, b) == py_alu(op, a, b)


def test_f32_bits_round_trip() -> None:
    for value in (0.0, -1.5, 3.25e-5, 1e30):
        assert S.f32_from_bits(S.bits_from_f32(value)) == np.float32(value)
