"""Quantization parameters and how they are chosen; shared by the lowering and the reference interpreter.

Symmetric per-tensor int8: real = scale * q with q in [-127, 127] (-128 only appears by saturation). A scale is
max|x| / 127 over the calibration data. A real rescale factor r (e.g. s_in * s_w / s_out) is applied to an
int32 accumulator as (mult, shift) with r ~= mult / 2^shift, by the requantize rule of docs/architecture.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from fusion.errors import FusionError

QMAX = 127
MULT_BITS = 31  # mult in [2^30, 2^31): fits a 32-bit register as a positive value
MAX_SHIFT = 63  # the ISA's shift field is 6 bits


class QuantizationError(FusionError):
    """A value has no calibrated scale, or a rescale factor does not fit (mult, shift)."""


def scale_for(max_abs: float) -> float:
    """The symmetric int8 scale for a tensor whose largest magnitude is max_abs (1.0 for an all-zero tensor)."""
    return float(max_abs) / QMAX if max_abs > 0 else 1.0


def requant_params(real: float) -> tuple[int, int]:
    """(mult, shift) with real ~= mult / 2^shift, mult in [2^30, 2^31) and 1 <= shift <= 63.

    From frexp(real) = f * 2^e (f in [0.5, 1)): mult = round(f * 2^31), shift = 31 - e. A factor too small for
    shift 63 keeps shift 63 and a smaller mult (possibly 0: everything rounds to zero); one >= 2^30 is an error.
    """
    if not math.isfinite(real) or real <= 0:
        raise QuantizationError(f"rescale factor must be positive and finite, got {real}")
    frac, exp = math.frexp(real)
    mult = round(frac * (1 << MULT_BITS))
    if mult == 1 << MULT_BITS:
        mult, exp = mult >> 1, exp + 1
    shift = MULT_BITS - exp
    if shift < 1:
        raise QuantizationError(f"rescale factor {real} is too large for the requantizer (needs shift >= 1)")
    if shift > MAX_SHIFT:
        mult, shift = mult >> (shift - MAX_SHIFT), MAX_SHIFT
    return mult, shift


def quantize_tensor(x: np.ndarray, scale: float) -> np.ndarray:
    """f32 -> int8 as `v.qnt` does: sat8(round_half_even(x * f32(1 / scale))), in float32."""
    inv = np.float32(1.0 / scale)
    return np.clip(np.rint(np.asarray(x, np.float32) * inv), -128, 127).astype(np.int8)


def quantize_bias(bias: np.ndarray, input_scale: float, weight_scale: float) -> np.ndarray:
    """A bias in accumulator units (scale input_scale * weight_scale), rounded half to even, saturated to int32."""
    q = np.rint(np.asarray(bias, np.float64) / (input_scale * weight_scale))
    return np.clip(q, -(2**31), 2**31 - 1).astype(np.int32)


@dataclass(frozen=True)
class QuantParams:
    """The int8 scale of every float value of a graph (activations and constants), by value name."""

    scales: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.scales.items() if not (math.isfinite(v) and v > 0)}
        if bad:
            raise QuantizationError(f"scales must be positive and finite: {bad}")
        object.__setattr__(self, "scales", MappingProxyType(dict(self.scales)))

    def __reduce__(self) -> tuple:
        return (QuantParams, (dict(self.scales),))

    def scale(self, value: str) -> float:
        if value not in self.scales:
            raise QuantizationError(f"value {value!r} has no calibrated scale; calibrate the graph it belongs to")
        return self.scales[value]
