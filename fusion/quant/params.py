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


MIN_SCALE = 2.0**-100  # 1 / scale must be a finite float32 (`v.qnt` multiplies by it): below, 0 * inf is NaN


def scale_for(max_abs: float) -> float:
    """The symmetric int8 scale for a tensor whose largest magnitude is max_abs (1.0 for an all-zero tensor);
    at least MIN_SCALE (values below it, under 1e-30, quantize to 0)."""
    return max(float(max_abs) / QMAX, MIN_SCALE) if max_abs > 0 else 1.0


MSE_CANDIDATES = 64  # clipping ranges tried by `mse_scale`: max|x| * f, f evenly spaced in [MSE_LOWEST, 1]
MSE_LOWEST = 0.25
MSE_BINS = 2048  # histogram of |x| the search prices the candidates on


def quantization_mse(x: np.ndarray, scale: float) -> float:
    """Mean squared error of x against its int8 round trip at `scale` (the `v.qnt` rule, saturating), in float64."""
    return _round_trip_errors(x, (scale,))[0]


def _round_trip_errors(x: np.ndarray, scales: tuple[float, ...]) -> list[float]:
    """`quantization_mse` at each scale, bit for bit: x converted once for all of them and the round trip done in
    place (calibration prices whole activation tensors, megabytes each, twice per value)."""
    x32, x64 = np.asarray(x, np.float32), np.asarray(x, np.float64)
    out = []
    for scale in scales:
        q = x32 * np.float32(1.0 / scale)  # `quantize_tensor`, then back to float64 less x, squared
        np.rint(q, out=q)
        np.clip(q, -128, 127, out=q)
        back = q.astype(np.float64)  # (whole numbers in int8's range by now, or NaN where x is: as its int8 would)
        back *= scale
        back -= x64
        back *= back
        out.append(float(np.mean(back)))
    return out


def mse_scale(x: np.ndarray) -> float:
    """The scale among max|x| * f / 127 (f in [0.25, 1]) with the least squared round-trip error.

    Clipping a few large values buys finer steps for the bulk of a tensor (the MSE calibrators of deployed int8
    toolchains). The candidates are priced on a histogram of |x| (a step d costs d^2 / 12 per unclipped value, a
    clipped one its distance to the clip); the winner is then checked exactly against max-abs, so the result
    never has more error than max-abs on x.
    """
    magnitude = np.abs(np.ravel(np.asarray(x, np.float32))).astype(np.float64)
    top = float(magnitude.max()) if magnitude.size else 0.0
    if top == 0:
        return scale_for(top)
    counts, edges = np.histogram(magnitude, bins=MSE_BINS, range=(0.0, top))
    centers = (edges[:-1] + edges[1:]) / 2
    clips = top * np.linspace(1.0, MSE_LOWEST, MSE_CANDIDATES)[:, None]
    over = np.maximum(centers[None, :] - clips, 0.0)
    rounding = np.where(over > 0, 0.0, (clips / QMAX) ** 2 / 12)
    cost = (counts[None, :] * (rounding + over**2)).sum(axis=1)
    best = scale_for(float(clips[int(np.argmin(cost)), 0]))
    widest = scale_for(top)
    best_error, widest_error = _round_trip_errors(x, (best, widest))
    return best if best_error < widest_error else widest


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


def quantize_bias(bias: np.ndarray, input_scale: float, weight_scale: float | np.ndarray) -> np.ndarray:
    """A bias in accumulator units (scale input_scale * weight_scale, per element when weight_scale is an array
    of per-channel scales), rounded half to even, saturated to int32."""
    q = np.rint(np.asarray(bias, np.float64) / (input_scale * weight_scale))
    return np.clip(q, -(2**31), 2**31 - 1).astype(np.int32)


@dataclass(frozen=True)
class QuantParams:
    """What calibration measured: the int8 scale of every float value of a graph (activations and constants), by
    value name, and, by matrix node name, the mean input window its bias correction needs
    (`fusion.quant.bias_correction`; a node without one is not corrected). Means are tuples: hashable, and equal
    params compare equal."""

    scales: Mapping[str, float] = field(default_factory=dict)
    window_means: Mapping[str, tuple[tuple[float, ...], ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.scales.items() if not (math.isfinite(v) and v > 0)}
        if bad:
            raise QuantizationError(f"scales must be positive and finite: {bad}")
        means = {k: tuple(tuple(float(x) for x in row) for row in v) for k, v in self.window_means.items()}
        odd = sorted(k for k, v in means.items() if not all(math.isfinite(x) for row in v for x in row))
        if odd:
            raise QuantizationError(f"window means must be finite: {odd}")
        object.__setattr__(self, "scales", MappingProxyType(dict(self.scales)))
        object.__setattr__(self, "window_means", MappingProxyType(means))

    def __reduce__(self) -> tuple:
        return (QuantParams, (dict(self.scales), dict(self.window_means)))

    def window_mean(self, node: str) -> np.ndarray | None:
        """The node's mean input window (float64; 2-D for a Conv: one row per group), or None: not corrected."""
        rows = self.window_means.get(node)
        return None if rows is None else np.array(rows, np.float64)

    def scale(self, value: str) -> float:
        if value not in self.scales:
            raise QuantizationError(f"value {value!r} has no calibrated scale; calibrate the graph it belongs to")
        return self.scales[value]
