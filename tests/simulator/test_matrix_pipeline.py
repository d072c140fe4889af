"""The pipelined matrix unit: double-buffered weights, back-to-back matmuls, and who waits for the results."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_helpers import local, machine, unit_slices

from isa import BY_MNEMONIC
from isa.enums import Unit
from isa.memory_map import LOCAL_ACC_BASE
from simulator import PRESETS, SimulatorTrap
from simulator import timing as T

TINY = PRESETS["tiny"]  # N = 4
N = TINY.array_size
ACC = LOCAL_ACC_BASE
SETUP = f"li x1, 0\nli x2, 256\nli x3, {ACC}\nli x4, {ACC + 1024}\nli x5, 512\n"


def matrix_ops(m) -> list[tuple[str, int, int]]:
    return [(m.instructions[pc].mnemonic, s, f) for pc, s, f in unit_slices(m, Unit.matrix)]


def test_back_to_back_matmuls_pay_the_skew_once() -> None:
    rows, k = 6, 3
    m = machine(SETUP + "mx.preload x1, 4, 4, i8\n" + f"mx.mm x3, x2, {rows}\n" * k + "halt\n")
    ops = matrix_ops(m)
    (_, p, _), mms = ops[0], ops[1:]
    assert [s for _, s, _ in mms] == [p + N + i * rows for i in range(k)]
    assert mms[-1][2] - mms[0][1] == rows * k + 2 * N - 1
    assert mms[-1][2] - p == T.matrix_segment_cycles(TINY, 1, k, rows)


def test_a_preload_overlapped_with_a_running_matmul_adds_nothing() -> None:
    rows = 2 * N
    tiles = f"mx.preload x1, 4, 4, i8\nmx.mm x3, x2, {rows}\nmx.preload x5, 4, 4, i8\nmx.mm x4, x2, {rows}\n"
    m = machine(SETUP + tiles + "halt\n")
    (_, p1, _), (_, m1, _), (_, p2, p2_end), (_, m2, m2_end) = matrix_ops(m)
    assert p2 == m1  # the next tile's weights shift in while the array computes
    assert m2 == m1 + rows and p2_end < m2  # so the second matmul starts right behind the first one's rows
    assert m2_end - p1 == T.matrix_segment_cycles(TINY, 2, 1, rows) == N + 2 * rows + 2 * N - 1


def test_a_matmul_waits_for_its_preload() -> None:
    m = machine(SETUP + "mx.preload x1, 4, 4, i8\nmx.mm x3, x2, 1\nmx.preload x5, 4, 4, i8\nmx.mm x4, x2, 1\nhalt\n")
    (_, p1, _), (_, m1, _), (_, p2, _), (_, m2, _) = matrix_ops(m)
    assert (m1, p2, m2) == (p1 + N, p1 + N, p1 + 2 * N)  # preload-bound: one tile per N cycles


def test_semantics_do_not_change_each_matmul_uses_the_latest_preload() -> None:
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, (8, 4), dtype=np.int8)
    w1, w2 = (rng.integers(-128, 128, (4, 4), dtype=np.int8) for _ in range(2))
    src = SETUP + (
        "mx.preload x1, 4, 4, i8\nmx.mm x3, x2, 8\nmx.preload x5, 4, 4, i8\nmx.mma x3, x2, 8\nmx.mm x4, x2, 8\nhalt\n"
    )
    m = machine(src, local={0: w1, 256: a, 512: w2})
    wide = a.astype(np.int32)
    assert np.array_equal(local(m, ACC, 32, np.int32).reshape(8, 4), wide @ w1 + wide @ w2)
    assert np.array_equal(local(m, ACC + 1024, 32, np.int32).reshape(8, 4), wide @ w2)
    (_, _, _), (_, m1, m1_end), _, (_, m2, _), (_, m3, _) = matrix_ops(m)
    assert m2 == m1 + 8 < m1_end  # mx.mma into the same rows: the read-modify-write follows the rows out in order
    assert m3 == m2 + 8


def test_a_drain_waits_for_the_last_matmuls_results() -> None:
    src = SETUP + "mx.preload x1, 4, 4, i8\nmx.mm x3, x2, 4\nmx.mm x4, x2, 4\nli x6, 1\n"
    src += "ep.cfg x0, x0, x6, 0, none, none, i32\nmx.drain x5, x4, 4, 4\nmx.preload x1, 4, 4, i8\nhalt\n"
    (_, _, mm2_end), (_, cfg, _), (_, drain, drain_end), (_, p, _) = matrix_ops(machine(src))[2:]
    assert cfg < mm2_end  # a configuration write needs no result
    assert drain == mm2_end  # the drain reads the accumulator: it waits for the results, not for the input
    assert drain_end == drain + T.drain_cycles(TINY, 4, BY_MNEMONIC["mx.drain"].latency)
    assert p == drain_end  # a drain holds the whole unit


def test_a_token_from_the_matrix_unit_means_the_results_are_in() -> None:
    body = "mx.preload x1, 4, 4, i8\nmx.mm x3, x2, 8\n"
    read = "li x7, 1024\nv.relu x7, x3, 32, i32\nhalt\n"
    m = machine(SETUP + body + "sync.push mx, vx\nsync.pop mx, vx\n" + read, checked=True)
    _, (_, mm, mm_end), (_, push, _) = matrix_ops(m)
    ((_, vx, _),) = [s for s in unit_slices(m, Unit.vector) if m.instructions[s[0]].mnemonic == "v.relu"]
    assert mm_end == mm + T.matmul_cycles(TINY, 8) and push == vx == mm_end
    with pytest.raises(SimulatorTrap, match="data race"):  # reading the accumulator with no token: flagged
        machine(SETUP + body + read, checked=True)


def test_a_stream_starts_on_an_empty_array() -> None:
    src = SETUP + "mx.preload x1, 4, 4, i8\nmx.mm x3, x2, 2\nmx.mms x2, 2\nli x7, 1024\nvc.lds v1, 8\nhalt\n"
    (_, _, mm_end), (_, mms, _) = matrix_ops(machine(src))[1:]
    assert mms == mm_end  # a full-FIFO freeze of the mx.mms then stalls no other matmul's rows


def test_an_operand_in_the_accumulator_waits_for_the_results() -> None:
    src = SETUP + "mx.preload x1, 4, 4, f32\nmx.mm x3, x2, 4\nmx.mm x4, x3, 4\nhalt\n"
    (_, first, first_end), (_, second, _) = matrix_ops(machine(src))[1:]
    assert second == first_end != first + 4


@settings(max_examples=40, deadline=None)
@given(tiles=st.integers(1, 5), per_tile=st.integers(1, 3), rows=st.integers(1, 3 * N))
def test_segment_rule_is_the_simulated_time(tiles: int, per_tile: int, rows: int) -> None:
    tile = "mx.preload x1, 4, 4, i8\n" + f"mx.mm x3, x2, {rows}\n" * per_tile
    ops = matrix_ops(machine(SETUP + tile * tiles + "halt\n"))
    assert max(f for _, _, f in ops) - ops[0][1] == T.matrix_segment_cycles(TINY, tiles, per_tile, rows)


@settings(max_examples=40, deadline=None)
@given(tiles=st.lists(st.lists(st.integers(0, 3 * N), min_size=1, max_size=3), min_size=1, max_size=5))
def test_lower_bound_holds_for_any_split(tiles: list[list[int]]) -> None:
    src = "".join("mx.preload x1, 4, 4, i8\n" + "".join(f"mx.mm x3, x2, {r}\n" for r in rows) for rows in tiles)
    ops = matrix_ops(machine(SETUP + src + "halt\n"))
    span = max(f for _, _, f in ops) - ops[0][1]
    assert span >= T.matrix_lower_bound(TINY, len(tiles), sum(map(sum, tiles)))
