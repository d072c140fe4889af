"""Post-training calibration: run the fp32 reference on sample inputs and take each value's max magnitude."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from fusion.graph.ir import DataType, Graph
from fusion.quant.params import QuantizationError, QuantParams, scale_for
from fusion.reference.interpreter import evaluate


def calibrate(graph: Graph, samples: Iterable[Mapping[str, np.ndarray]]) -> QuantParams:
    """Scales (max|x| / 127) for every float32 value, over all samples; constants from their own data."""
    floats = [v for v, t in graph.types.items() if t.dtype == DataType.float32]
    peak = dict.fromkeys(floats, 0.0)
    count = 0
    for sample in samples:
        env = evaluate(graph, sample)
        for v in floats:
            if env[v].size:
                peak[v] = max(peak[v], float(np.max(np.abs(env[v]))))
        count += 1
    if count == 0:
        raise QuantizationError("calibration needs at least one sample input")
    return QuantParams({v: scale_for(m) for v, m in peak.items()})
