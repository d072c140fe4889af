"""A dispatch-table variant its generator refuses (the planner names a zero-skip twin without building it) leaves
the planned kernel alone in the table: the call runs, in host and in program execution, on sparse data."""

from __future__ import annotations

import numpy as np
import pytest

from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType


def _wide_gemm() -> tuple:
    """fp32 Gemm with K = 1280: the fused GEMM the zero-skip twin would be does not fit a buffer half on `base`."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("wide_gemm")
    x = b.input("x", (1, 1280))
    w = (rng.standard_normal((1280, 200)) * 0.05).astype(np.float32)
    bias = rng.standard_normal(200).astype(np.float32)
    y = b.op(OpType.Gemm, x, b.constant(w, "w"), b.constant(bias, "b"), name="fc", alpha=1.0, beta=1.0)
    b.output(y)
    sparse = rng.standard_normal((1, 1280)).astype(np.float32)
    sparse[:, :1024] = 0  # most zero tiles: the call is classed sparse
    return b.build(), sparse, sparse.astype(np.float64) @ w + bias


@pytest.mark.parametrize("execution", ["host", "program"])
def test_an_unbuildable_zero_skip_twin_falls_back_to_the_planned_kernel(execution: str) -> None:
    graph, x, want = _wide_gemm()
    engine = FusionEngine(graph, "base", "fp32", EngineOptions(policy="dynamic", execution=execution))
    result = engine.run({"x": x})
    (choice,) = engine.plan.choices
    assert choice.zero_skip is not None, "the planner names a twin (else this test checks nothing)"
    np.testing.assert_allclose(result.outputs[graph.outputs[0]], want, rtol=1e-5, atol=1e-5)
