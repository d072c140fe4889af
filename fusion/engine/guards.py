"""Guards: a kernel runs only on data matching what it was specialised for (shapes, dtypes, data class, machine)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fusion.engine.decision import FusionDecision
from fusion.engine.kernel import Guard

HOLDS = FusionDecision.yes("guard holds")


def check_guard(guard: Guard, inputs: Mapping[str, np.ndarray], sparsity: str, config_hash: str) -> FusionDecision:
    """Whether `guard` admits these live inputs; the reason names the first mismatch."""
    if guard.config_hash != config_hash:
        return FusionDecision.no(f"machine config {config_hash} != kernel's {guard.config_hash}")
    for (name, shape), (_, dtype) in zip(guard.shapes, guard.dtypes, strict=True):
        if name not in inputs:
            return FusionDecision.no(f"input {name!r} missing")
        array = inputs[name]
        if array.shape != tuple(shape):
            return FusionDecision.no(f"{name!r} shape {tuple(array.shape)} != kernel's {tuple(shape)}")
        if array.dtype != dtype:  # (guards hold str(numpy dtype); comparing dtypes is ~20x cheaper than str())
            return FusionDecision.no(f"{name!r} dtype {array.dtype} != kernel's {dtype}")
    if guard.sparsity not in ("any", sparsity):
        return FusionDecision.no(f"data class {sparsity} != kernel's {guard.sparsity}")
    return HOLDS
