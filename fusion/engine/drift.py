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
    a, b = old.max_abs, new.max_abs
    if min(a, b) == 0.0 and max(a, b) > 0.0 or min(a, b) > 0 and max(a, b) / min(a, b) > limits.range_ratio:
        return Drift(name, f"range max|x| {a:.3g} -> {b:.3g}")
    return None


def detect_drift(
    old: Mapping[str, TensorProfile], new: Mapping[str, TensorProfile], limits: DriftThresholds
) -> tuple[Drift, ...]:
    """Drifts of tensors profiled both times (a tensor seen for the first time is not drift)."""
    found = (drift_between(k, old[k], new[k], limits) for k in new if k in old)
    return tuple(d for d in found if d is not None)
