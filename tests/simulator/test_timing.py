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


def test_pipelined_matrix_rules() -> None:
    n = BASE.array_size
    assert T.matmul_input_cycles(BASE, 16) == 16  # occupancy: the rows; the 2N - 1 skew is latency
    assert T.matmul_start(5, 40, 21) == 40 and T.matmul_start(5, 20, 21) == 21 and T.matmul_start(50, 20, 21) == 50
    assert T.preload_start(7, 30) == 30 and T.matrix_drained_start(7, 99) == 99
    # one tile alone is the serial preload + matmul; every further tile adds max(N, rows), not N + rows + 2N - 1
    for rows in (1, 4, 16, 40):
        one = T.matrix_segment_cycles(BASE, 1, 1, rows)
        assert one == T.preload_cycles(BASE) + T.matmul_cycles(BASE, rows)
        assert T.matrix_segment_cycles(BASE, 9, 1, rows) - one == 8 * max(n, rows)
    # 16-row tiles on base (transformers at 16 tokens): 16 cycles per tile instead of 16 + 16 + 31
    assert T.matrix_segment_cycles(BASE, 288, 1, 16) == 16 + 288 * 16 + 31
    assert T.matrix_segment_cycles(BASE, 3, 2, 10) == 16 + 2 * (10 + 16) + 20 + 31  # the preload hides under one
    assert T.matrix_segment_cycles(BASE, 0, 1, 16) == 0
    for tiles, per_tile, rows in ((1, 1, 1), (5, 3, 7), (288, 1, 4), (2, 2, 64)):
        bound = T.matrix_lower_bound(BASE, tiles, tiles * per_tile * rows)
        assert bound <= T.matrix_segment_cycles(BASE, tiles, per_tile, rows)


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
