"""Drift detection: which profiled tensors changed enough that the kernels planned for them must be re-planned.

A change counts when the shape or dtype changes (the guard no longer holds), the sparsity class changes (a
different kernel variant is best), or the value range grows or shrinks beyond `range_ratio` (int8 scales
calibrated on the old range would clip or waste precision).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fusion.engine.profile import TensorProfile


@dataclass(frozen=True)
class DriftThresholds:
    range_ratio: float = 2.0  # max|x| changing by more than this factor (either way) is drift
    zero_tile_delta: float = 0.25  # a zero-tile fraction change this large is drift even within a class
    clip_margin: float = 1.1  # int8: max|x| beyond this factor of the calibrated one would saturate: re-calibrate


@dataclass(frozen=True)
class Drift:
    tensor: str
    reason: str


def drift_between(name: str, old: TensorProfile, new: TensorProfile, limits: DriftThresholds) -> Drift | None:
    if old.shape != new.shape or old.dtype != new.dtype:
        return Drift(name, f"shape/dtype {old.dtype}{list(old.shape)} -> {new.dtype}{list(new.shape)}")
    if old.sparsity != new.sparsity:
        return Drift(name, f"sparsity class {old.sparsity} -> {new.sparsity}")
    if abs(old.zero_tile_fraction - new.zero_tile_fraction) >= limits.zero_tile_delta:
        return Drift(name, f"zero-tile fraction {old.zero_tile_fraction:.2f} -> {new.zero_tile_fraction:.2f}")
    if range_drifted(old, new, limits):
        return Drift(name, f"range max|x| {old.max_abs:.3g} -> {new.max_abs:.3g}")
    return None


def range_drifted(old: TensorProfile, new: TensorProfile, limits: DriftThresholds) -> bool:
    """max|x| changed by more than `range_ratio` either way (or from zero)."""
    a, b = old.max_abs, new.max_abs
    return min(a, b) == 0.0 and max(a, b) > 0.0 or min(a, b) > 0 and max(a, b) / min(a, b) > limits.range_ratio


def outgrew_calibration(calibrated: TensorProfile, live: TensorProfile, limits: DriftThresholds) -> bool:
    """int8 scales calibrated on `calibrated` no longer fit `live`: its range grew past `clip_margin` (values
    would saturate: wrong answers) or drifted by `range_ratio` (precision wasted). Asked of every call against the
    calibration's profiles, whatever other drift the call shows, so a range creeping call by call is caught."""
    return live.max_abs > limits.clip_margin * calibrated.max_abs or range_drifted(calibrated, live, limits)


def detect_drift(
    old: Mapping[str, TensorProfile], new: Mapping[str, TensorProfile], limits: DriftThresholds
) -> tuple[Drift, ...]:
    """Drifts of tensors profiled both times (a tensor seen for the first time is not drift)."""
    found = (drift_between(k, old[k], new[k], limits) for k in new if k in old)
    return tuple(d for d in found if d is not None)
