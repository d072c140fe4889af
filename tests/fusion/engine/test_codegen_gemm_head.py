"""A one-row GEMM (a classifier on its class token, ViT's head) loads its narrow packed weight panel whole, zero
padding and all, in one dense DMA (`gemm.panel_width`), together with the bias before it (`gemm.coalesced`: the
bias's alignment padding read along): one load instead of a bias load and a strided one of a row per weight row.
Race-checked against the (quantized) reference."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_codegen_gemm_cut import _run  # a linear + relu group run race-checked against the reference


def test_vit_head_loads_bias_and_weight_panel_in_one_dma() -> None:
    """1 x 64 @ 64 x 10 (int8): the 64 x 16 padded panel and the 10-column bias (40 bytes, padded to 64) come in
    one DMA beside A's; the bytes read are the padded panel's and the bias's padding."""
    kernel, run = _run(1, 64, 10, "int8", {"resident_a": True, "panels": 0})
    loads = [i for i in kernel.program.instructions() if i.mnemonic == "dma.ld"]
    assert len(loads) == 2  # A, and bias + padding + panel
    assert run.dram_read_bytes == 64 * 4 + 64 + 64 * 16


def test_narrow_panels_of_many_rows_or_fp32_stay_strided() -> None:
    """More than one row: the accumulator rows would not be the drained ones; fp32: a 16-wide row is one burst
    either way (no gain), so the panel keeps its 10 columns."""
    for m, dtype in ((2, "int8"), (1, "fp32")):
        kernel, run = _run(m, 64, 10, dtype, {"resident_a": True, "panels": 0})
        es = 1 if dtype == "int8" else 4
        assert run.dram_read_bytes == m * 64 * 4 + 64 * 10 * es + 10 * 4


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    k=st.integers(1, 80),
    n=st.integers(1, 40),
    schedule=st.sampled_from(({}, {"panels": 0}, {"resident_a": True}, {"resident_a": True, "panels": 0})),
)
def test_one_row_gemms_match_the_reference(dtype, k, n, schedule) -> None:
    _run(1, k, n, dtype, schedule)
