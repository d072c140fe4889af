"""Shadow validation: when to re-run a fused kernel's group unfused, and how to compare the two results."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fusion.engine.errors import EngineError

MODES = ("always", "every", "first", "off")


@dataclass(frozen=True)
class ValidationPolicy:
    """always; every Nth call of a kernel ("every", n); the first K calls per kernel ("first", n); off."""

    mode: str = "first"
    n: int = 1
    rtol: float = 1e-5
    atol: float = 1e-5

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise EngineError(f"validation mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.n < 1:
            raise EngineError(f"validation n must be >= 1, got {self.n}")

    @classmethod
    def parse(cls, text: str) -> ValidationPolicy:
        """ "always", "off", "every:N", "first:K"."""
        mode, _, count = text.partition(":")
        try:
            return cls(mode, int(count) if count else 1)
        except ValueError:
            raise EngineError(f"validation policy {text!r}: use always, off, every:N or first:K") from None

    def should_validate(self, call_index: int) -> bool:
        """call_index: how many times this kernel ran before (0 for its first call)."""
        if self.mode == "always":
            return True
        if self.mode == "every":
            return call_index % self.n == 0
        if self.mode == "first":
            return call_index < self.n
        return False


@dataclass(frozen=True)
class Comparison:
    ok: bool
    max_abs_diff: float
    value: str  # the output that differed most


def compare(fused: Mapping[str, np.ndarray], unfused: Mapping[str, np.ndarray], policy: ValidationPolicy) -> Comparison:
    """Integer outputs must match exactly; float outputs within (rtol, atol)."""
    worst, where, ok = 0.0, "", True
    for name, ref in unfused.items():
        got = fused[name]
        if got.shape != ref.shape:
            return Comparison(False, float("inf"), name)
        diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        d = float(diff.max()) if diff.size else 0.0
        if np.isnan(got).any() != np.isnan(ref).any() if got.dtype.kind == "f" else False:
            d = float("inf")
        if d >= worst:
            worst, where = d, name
        if ref.dtype.kind in "iu":
            ok &= bool(np.array_equal(got, ref))
        else:
            ok &= bool(np.allclose(got, ref, rtol=policy.rtol, atol=policy.atol, equal_nan=True))
    return Comparison(ok, worst, where)
