"""Quantization parameters: (mult, shift) approximates the real factor, and quantize/requantize follow the
architecture's Numerics rules exactly (checked against Python integer arithmetic)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusion.quant.params import (
    QuantizationError,
    QuantParams,
    mse_scale,
    quantization_mse,
    quantize_bias,
    quantize_tensor,
    requant_params,
    scale_for,
)
from fusion.reference.quantized import requantize


@given(st.floats(min_value=1e-12, max_value=1e6))
def test_requant_params_are_in_range_and_accurate(real) -> None:
    mult, shift = requant_params(real)
    assert 1 <= shift <= 63 and 0 <= mult < 2**31
    if shift < 63:
        assert mult >= 2**30 and abs(mult / 2**shift - real) <= real * 2**-30
    else:
        assert abs(mult / 2**shift - real) <= 2**-63 + real * 2**-30


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan, 2.0**31])
def test_requant_params_reject_bad_factors(bad) -> None:
    with pytest.raises(QuantizationError):
        requant_params(bad)


@given(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=20), st.floats(1e-6, 100.0))
def test_requantize_matches_integer_definition(values, real) -> None:
    mult, shift = requant_params(real)
    want = [max(-128, min(127, (v * mult + (1 << (shift - 1))) >> shift)) for v in values]
    got = requantize(np.array(values, np.int32), mult, shift)
    assert got.dtype == np.int8 and got.tolist() == want


def test_quantize_rounds_half_to_even_and_saturates() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 1000.0, -1000.0], np.float32)
    assert quantize_tensor(x, 1.0).tolist() == [0, 2, 2, 0, -2, 127, -128]
    assert quantize_tensor(np.array([0.3], np.float32), 0.1).tolist() == [3]


def test_bias_and_scales() -> None:
    assert quantize_bias(np.array([1.0, -1.0]), 0.5, 0.25).tolist() == [8, -8]
    assert quantize_bias(np.array([1e30]), 1e-3, 1e-3).tolist() == [2**31 - 1]
    assert scale_for(127.0) == 1.0 and scale_for(0.0) == 1.0
    params = QuantParams({"a": 0.5})
    assert params.scale("a") == 0.5
    with pytest.raises(QuantizationError, match="no calibrated scale"):
        params.scale("b")
    with pytest.raises(QuantizationError):
        QuantParams({"a": 0.0})


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=1, max_size=200),
    st.floats(0.0, 1e3),
)
def test_mse_scale_never_has_more_error_than_max_abs(values, outlier) -> None:
    x = np.array([*values, outlier], np.float32)
    chosen = mse_scale(x)
    assert math.isfinite(chosen) and chosen > 0
    assert chosen <= scale_for(float(np.max(np.abs(x))))
    assert quantization_mse(x, chosen) <= quantization_mse(x, scale_for(float(np.max(np.abs(x)))))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-1e4, 1e4, allow_nan=False), min_size=1, max_size=200),
    st.floats(1e-3, 1e2),
    st.booleans(),
)
def test_quantization_mse_is_the_round_trip_error_bit_for_bit(values, scale, wide) -> None:
    """Its in-place form against the plain formula: quantize as `v.qnt`, back to float64, squared error, mean."""
    x = np.array(values, np.float64 if wide else np.float32)
    back = quantize_tensor(x, scale).astype(np.float64) * scale
    assert quantization_mse(x, scale) == float(np.mean((back - np.asarray(x, np.float64)) ** 2))


def test_mse_scale_clips_a_tail_and_keeps_a_grid() -> None:
    bulk = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    top = scale_for(float(np.max(np.abs(bulk))))
    assert mse_scale(bulk) < top  # a Gaussian's few largest values saturate: finer steps for the rest
    assert quantization_mse(bulk, mse_scale(bulk)) < quantization_mse(bulk, top)
    uniform = np.linspace(-1, 1, 255, dtype=np.float32)
    assert mse_scale(uniform) == scale_for(1.0)  # on the grid already: max-abs is exact
    assert mse_scale(np.zeros(3, np.float32)) == 1.0


def test_a_tiny_tensor_gets_a_scale_whose_reciprocal_is_finite() -> None:
    tiny = np.array([1e-40, 0.0, -3e-41], np.float32)
    for scale in (scale_for(float(np.max(np.abs(tiny)))), mse_scale(tiny)):
        assert np.isfinite(np.float32(1.0 / scale))
        assert quantize_tensor(tiny, scale).tolist() == [0, 0, 0]
