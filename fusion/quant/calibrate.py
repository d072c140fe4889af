"""Post-training calibration: run the fp32 reference on sample inputs and take each value's max magnitude.

Non-finite data is an error, never folded in: `max(0.0, nan)` is 0, so one NaN would silently give a scale of 1.0
and finite garbage downstream."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from fusion.graph.ir import DataType, Graph
from fusion.quant.params import QuantizationError, QuantParams, scale_for
from fusion.reference.interpreter import evaluate


def calibrate(graph: Graph, samples: Iterable[Mapping[str, np.ndarray]]) -> QuantParams:
    """Scales (max|x| / 127) for every float32 value, over all samples; constants from their own data."""
    floats = [v for v, t in graph.types.items() if t.dtype == DataType.float32]
    floats.sort(key=lambda v: v not in graph.inputs)  # a bad input is named before the values it spoils
    peak = dict.fromkeys(floats, 0.0)
    count = 0
    for sample in samples:
        env = evaluate(graph, sample)
        for v in floats:
            if env[v].size:
                top = float(np.max(np.abs(env[v])))
                if not np.isfinite(top):
                    raise QuantizationError(_non_finite(graph, v, env[v], count))
                peak[v] = max(peak[v], top)
        count += 1
    if count == 0:
        raise QuantizationError("calibration needs at least one sample input")
    return QuantParams({v: scale_for(m) for v, m in peak.items()})


def _non_finite(graph: Graph, value: str, data: np.ndarray, sample: int) -> str:
    bad = int(np.count_nonzero(~np.isfinite(data)))
    where = "input" if value in graph.inputs else "value"
    return (
        f"calibration sample {sample}: {where} {value!r} has {bad} non-finite element(s) (NaN or inf) of "
        f"{data.size}; int8 scales need finite data"
    )
