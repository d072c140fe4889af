"""A GEMM's A row block loaded with ONE DMA and cut into its k-slice tiles on the vector unit (`gemm.cut_a`), where
the timing rules say the strided per-k-slice DMAs cost more: ViT's 17-token projections. Every schedule, odd row
counts, float and int8 A (the int8 quantization is the cut), race-checked against the (quantized) reference."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import context, linear_relu_graph, run_group
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion.engine.codegen.gemm import FusedGemm, split_a
from fusion.engine.plan import Group
from fusion.lower.kernels.gemm import Operand
from fusion.lower.views import dense
from isa.enums import DType
from simulator.config import load_config


def _run(m: int, k: int, n: int, dtype: str, schedule: dict, seed: int = 0):
    graph = linear_relu_graph(m, k, n, seed=seed)
    x = {"x": np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32)}
    mc = context(graph, x, dtype)
    kernel, run, env = run_group(mc, Group(("fc", "relu"), "epilogue", **schedule), x)  # race-checked
    if dtype == "int8":
        np.testing.assert_array_equal(run.outputs["relu"], env["relu"])
    else:
        np.testing.assert_allclose(run.outputs["relu"], env["relu"], rtol=1e-5, atol=1e-5)
    return kernel, run


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_vit_projection_loads_its_17_token_block_once(dtype: str) -> None:
    """17 x 64 @ 64 x 64: one DMA brings all of A (instead of four strided k-slices of 17 rows)."""
    kernel, run = _run(17, 64, 64, dtype, {"resident_a": True, "panels": 0})
    cuts = [i for i in kernel.program.instructions() if i.mnemonic in ("v.copy", "v.qnt")]
    assert len(cuts) == 17 * 4  # one per row and k-slice
    assert run.dram_read_bytes == 17 * 64 * 4 + 64 * 64 * (1 if dtype == "int8" else 4) + 64 * 4


def test_the_cut_is_taken_only_where_the_timing_rules_say_it_pays() -> None:
    """Few rows: the saved DMA latencies win; many rows: the per-row copies would cost more, and a single k-slice
    has nothing to cut."""
    cfg = load_config("base")

    def gemm(m: int, k: int, quantize: float | None) -> FusedGemm:
        a = Operand(dense(0, (m, k), DType.f32), quantize)
        b = Operand(dense(1 << 20, (k, 64), DType.f32), None)
        return FusedGemm(a, b, dense(2 << 20, (m, 64), DType.f32))

    assert split_a(cfg, gemm(17, 64, None), 17) and split_a(cfg, gemm(17, 64, 0.1), 17)
    assert not split_a(cfg, gemm(256, 256, None), 256)
    assert not split_a(cfg, gemm(17, 16, None), 17)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 40),
    k=st.integers(17, 100),
    n=st.integers(1, 40),
    schedule=st.sampled_from(({}, {"panels": 0}, {"resident_a": True}, {"tile_m": 16})),
)
def test_every_schedule_with_or_without_the_cut_matches_the_reference(dtype, m, k, n, schedule) -> None:
    _run(m, k, n, dtype, schedule)
