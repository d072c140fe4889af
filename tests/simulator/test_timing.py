from dataclasses import replace

import pytest

from isa import INSTRUCTIONS
from simulator import PRESETS
from simulator import timing as T

BASE = PRESETS["base"]  # N = 16, L = 16, 32 B/cycle, latency 100, 64 B bursts


def test_every_table_timing_name_has_a_rule() -> None:
    assert {spec.timing for spec in INSTRUCTIONS} <= set(T.TIMING_RULES)


def test_matrix_rules_follow_the_systolic_schedule() -> None:
    assert T.preload_cycles(BASE) == 16
    assert T.matmul_cycles(BASE, 1) == 1 + 31
    assert T.matmul_cycles(BASE, 128) == 128 + 2 * 16 - 1
    assert T.stream_row_ready(BASE, 100, 0) == 131
    assert T.stream_row_ready(BASE, 100, 127) == 100 + T.matmul_cycles(BASE, 128) - 1
    assert T.drain_cycles(BASE, 64, 3) == 67


def test_vector_rules() -> None:
    assert T.vector_cycles(BASE, 256, 2) == 16 + 2
    assert T.vector_cycles(BASE, 257, 2) == 17 + 2
    assert T.chain_op_cycles(BASE, 3) == 3
    # a stream consumer cannot finish before the last row exists, nor before it has taken every element
    assert T.chain_stream_finish(BASE, 0, 256, 200, 1) == 202
    assert T.chain_stream_finish(BASE, 0, 4096, 200, 1) == 257


def test_dma_contiguous_packs_bursts_and_strided_rows_pay_per_row() -> None:
    contiguous = T.dma_cycles(BASE, 64, 16, 16)  # 1 KiB in 16 bursts
    strided = T.dma_cycles(BASE, 64, 16, 512)  # 64 rows of 16 B, one burst each
    assert contiguous == 100 + 16 * 64 // 32
    assert strided == 100 + 64 * 64 // 32
    assert strided > contiguous
    assert T.dma_bursts(BASE, 1, 100, 4096) == 2  # a single row is contiguous whatever the stride
    assert T.dma_transposed_cycles(BASE, 16, 16, 512, 2) == T.dma_cycles(BASE, 16, 16, 512) + 2


@pytest.mark.parametrize("bandwidth", [8, 32, 64])
def test_dma_scales_with_bandwidth(bandwidth: int) -> None:
    cfg = replace(BASE, dram_bytes_per_cycle=bandwidth)
    assert T.dma_transfer_cycles(cfg, 1, 4096, 4096) == -(-4096 // bandwidth)


def test_scalar_rules() -> None:
    assert T.scalar_cycles(BASE) == 1
    assert T.branch_cycles(BASE, False) == 1
    assert T.branch_cycles(BASE, True) == 1 + BASE.branch_penalty
    assert T.scalar_mem_cycles(BASE) == 1 + BASE.dram_latency
    assert T.sync_cycles(BASE) == 0
