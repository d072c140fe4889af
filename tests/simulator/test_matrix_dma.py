"""Matrix-unit and DMA instructions: values against numpy, cycles against the contract's formulas."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from sim_helpers import local, machine, run_asm, unit_slices

from isa.enums import Unit
from isa.memory_map import LOCAL_ACC_BASE as ACC
from simulator import PRESETS, SimulatorTrap
from simulator.counters import aggregate, snapshot
from simulator.semantics.scalar import bits_from_f32
from simulator.timing import matmul_cycles

CFG = PRESETS["tiny"]  # N = 4, L = 4, DRAM: latency 20, 8 B/cycle, 16 B bursts
N = CFG.array_size
RNG = np.random.default_rng(3)


def i8(*shape: int) -> np.ndarray:
    return RNG.integers(-128, 128, shape, dtype=np.int8)


def simulate_counters(m):
    return aggregate(m, snapshot(m), 0, len(m.count), m.halt_cycle)


def durations(m, unit: int) -> dict[str, int]:
    return {m.instructions[pc].mnemonic: finish - start for pc, start, finish in unit_slices(m, unit)}


def test_preload_mm_mma_accumulate_int8() -> None:
    a1, a2, w1, w2 = i8(6, 4), i8(6, 3), i8(4, 3), i8(3, 3)
    src = f"""li x1, 0
li x2, 64
li x3, 128
li x4, 192
li x5, {ACC}
mx.preload x2, 4, 3, i8
mx.mm x5, x1, 6
mx.preload x4, 3, 3, i8
mx.mma x5, x3, 6
halt
"""
    m = machine(src, local={0: a1, 64: w1, 128: a2, 192: w2})
    want = a1.astype(np.int64) @ w1 + a2.astype(np.int64) @ w2
    assert np.array_equal(local(m, ACC, 18, np.int32).reshape(6, 3), want)
    slices = unit_slices(m, Unit.matrix)
    assert [f - s for _, s, f in slices] == [N, 6 + 2 * N - 1, N, 6 + 2 * N - 1]
    assert m.transactions[1][2]["a"].shape == (6, 4)


@pytest.mark.parametrize("dtype", [np.int8, np.float32])
def test_strided_matmul_reads_k_slices_of_a_dense_tile_in_place(dtype) -> None:
    """mx.mm.s / mx.mma.s over the k-slices of a dense 5 x 10 tile (row stride 10 elements) give its product with
    the stacked weights, in the cycles of mx.mm / mx.mma, reading exactly the slices' bytes (not the gaps)."""
    size = np.dtype(dtype).itemsize
    a = i8(5, 10).astype(dtype)
    w = i8(10, 3).astype(dtype)
    slices = [(0, 4), (4, 4), (8, 2)]
    src = [f"li x1, 0\nli x3, {10 * size}\nli x5, {ACC}"]
    for i, (k0, kb) in enumerate(slices):
        src.append(f"li x2, {256 + 64 * i}\nmx.preload x2, {kb}, 3, {'i8' if size == 1 else 'f32'}")
        src.append(f"li x1, {k0 * size}\n{'mx.mm.s' if i == 0 else 'mx.mma.s'} x5, x1, x3, 5")
    weights = {256 + 64 * i: w[k0 : k0 + kb] for i, (k0, kb) in enumerate(slices)}
    m = machine("\n".join([*src, "halt", ""]), local={0: a, **weights})
    acc_dt = np.int32 if size == 1 else np.float32
    np.testing.assert_allclose(local(m, ACC, 15, acc_dt).reshape(5, 3), a.astype(np.float64) @ w, rtol=1e-5)
    durs = [f - s for pc, s, f in unit_slices(m, Unit.matrix) if m.instructions[pc].mnemonic.startswith("mx.mm")]
    assert durs == [matmul_cycles(CFG, 5)] * 3
    counters = simulate_counters(m)
    assert counters.spad_read_bytes == 5 * 10 * size + sum(kb * 3 * size for _, kb in slices)
    assert [t[2]["a"].shape for t in m.transactions if "a" in t[2]] == [(5, kb) for _, kb in slices]


def test_strided_matmul_checks_its_stride_and_span() -> None:
    base = f"li x5, {ACC}\nli x2, 64\nmx.preload x2, 4, 4, f32\nli x1, 0\n"
    with pytest.raises(SimulatorTrap, match="row stride -4"):
        machine(base + "li x3, -4\nmx.mm.s x5, x1, x3, 2\nhalt\n")
    with pytest.raises(SimulatorTrap, match="row stride 6"):
        machine(base + "li x3, 6\nmx.mm.s x5, x1, x3, 2\nhalt\n")
    with pytest.raises(SimulatorTrap, match="outside the scratchpad"):
        machine(base + f"li x3, {CFG.spad_bytes}\nmx.mm.s x5, x1, x3, 2\nhalt\n")
    machine(base + "li x3, 0\nmx.mm.s x5, x1, x3, 3\nhalt\n")  # stride 0: one row read three times


def test_fp32_matmul() -> None:
    a, w = RNG.standard_normal((5, 4)).astype(np.float32), RNG.standard_normal((4, 4)).astype(np.float32)
    m = machine(
        f"li x1, 0\nli x2, 128\nli x5, {ACC}\nmx.preload x2, 4, 4, f32\nmx.mm x5, x1, 5\nhalt\n", local={0: a, 128: w}
    )
    np.testing.assert_allclose(local(m, ACC, 20, np.float32).reshape(5, 4), a.astype(np.float64) @ w, rtol=1e-5)


def test_stream_to_vector_chain_overlaps() -> None:
    a, w = i8(8, 4), i8(4, 4)
    src = """li x1, 0
li x2, 64
mx.preload x2, 4, 4, i8
mx.mms x1, 8
vc.lds v1, 32
vc.relu v2, v1
li x3, 1024
vc.st x3, v2
halt
"""
    m = machine(src, local={0: a, 64: w})
    want = np.maximum(a.astype(np.int64) @ w, 0)
    assert np.array_equal(local(m, 1024, 32, np.int32).reshape(8, 4), want)
    ((_, mms_start, mms_end),) = [s for s in unit_slices(m, Unit.matrix) if m.instructions[s[0]].mnemonic == "mx.mms"]
    ((_, lds_start, lds_end),) = [s for s in unit_slices(m, Unit.vector) if m.instructions[s[0]].mnemonic == "vc.lds"]
    last_row_ready = mms_start + 7 + 2 * N - 1
    assert lds_start == mms_start  # the consumer starts with the stream ...
    assert lds_end == max(lds_start + 32 // CFG.vector_lanes, last_row_ready + 1) + 1  # ... and ends after its last row
    assert lds_end <= mms_end + 1  # overlapped: not after a full second pass


def _overflow_program(rows: int) -> str:
    """mx.mms of `rows` rows while the vector unit is busy with a 64-beat copy in another bank."""
    return f"""li x1, 0
li x2, 64
li x4, 8192
mx.preload x2, 4, 4, i8
v.copy x4, x4, 256, i32
mx.mms x1, {rows}
vc.lds v1, {rows * 4}
li x3, 9216
vc.st x3, v1
halt
"""


@pytest.mark.parametrize("depth", [1, 4, 6])
def test_a_full_stream_fifo_stalls_the_array(depth: int) -> None:
    """Rows pile up while vc.lds waits; once `depth` rows wait, row i leaves only after row i - depth is taken.

    vc.lds starts at s long after the first rows are ready, then takes one row per cycle (row q at s + q), so
    row i >= depth leaves at s + i - depth + 1 and mx.mms ends the cycle after its last row leaves.
    """
    rows, cfg = 16, replace(CFG, stream_fifo_depth=depth)
    a, w = i8(rows, 4), i8(4, 4)
    m = machine(_overflow_program(rows), config=cfg, local={0: a, 64: w})
    assert np.array_equal(local(m, 9216, rows * 4, np.int32).reshape(rows, 4), a.astype(np.int64) @ w)
    ((_, mms_start, mms_end),) = [s for s in unit_slices(m, Unit.matrix) if m.instructions[s[0]].mnemonic == "mx.mms"]
    ((_, lds_start, lds_end),) = [s for s in unit_slices(m, Unit.vector) if m.instructions[s[0]].mnemonic == "vc.lds"]
    assert lds_start > mms_start + depth + 2 * N  # the first `depth` rows wait in the FIFO
    assert mms_end == lds_start + rows - depth + 1
    assert lds_end == lds_start + rows + 1  # one row per beat, latency 1
    counters = simulate_counters(m)
    assert counters.matrix_stall_stream_full == mms_end - mms_start - matmul_cycles(cfg, rows) > 0
    assert counters.vector_stall_stream_full == 0 and counters.scalar_stall_stream_full == 0


def test_a_deep_enough_fifo_never_stalls() -> None:
    rows = 16
    m = machine(_overflow_program(rows), config=replace(CFG, stream_fifo_depth=rows), local={0: i8(rows, 4)})
    ((_, mms_start, mms_end),) = [s for s in unit_slices(m, Unit.matrix) if m.instructions[s[0]].mnemonic == "mx.mms"]
    assert mms_end - mms_start == matmul_cycles(CFG, rows)
    assert simulate_counters(m).matrix_stall_stream_full == 0


@pytest.mark.parametrize(
    ("rows", "between", "deadlock"),
    [
        (8, "v.copy x1, x1, 4, i8", True),  # waits for the bank mx.mms holds, vc.lds waits behind it
        (4, "v.copy x1, x1, 4, i8", False),  # the rows fit the FIFO: mx.mms finishes, then the copy, then vc.lds
        (8, "v.copy x4, x4, 4, i8", False),  # another bank: no wait on the matrix unit
    ],
)
def test_a_consumer_stuck_behind_the_full_stream_is_a_deadlock(rows: int, between: str, deadlock: bool) -> None:
    src = f"li x1, 0\nli x2, 64\nli x4, 8192\nmx.preload x2, 4, 4, i8\nmx.mms x1, {rows}\n{between}\n"
    src += f"vc.lds v1, {rows * 4}\nhalt\n"
    if deadlock:
        with pytest.raises(SimulatorTrap, match="deadlock: .*mx.mms at pc 4 waits for room in the stream FIFO"):
            machine(src)
    else:
        machine(src)


@pytest.mark.parametrize("rows", [0, CFG.stream_fifo_depth, CFG.stream_fifo_depth + 1])
def test_rows_nobody_takes_fit_the_fifo_or_never_let_halt_finish(rows: int) -> None:
    src = f"li x2, 64\nmx.preload x2, 4, 4, i8\nmx.mms x0, {rows}\nhalt\n"
    if rows > CFG.stream_fifo_depth:
        with pytest.raises(SimulatorTrap, match="deadlock: the units can never go idle"):
            machine(src)
    else:
        m = machine(src)
        assert durations(m, Unit.matrix)["mx.mms"] == matmul_cycles(CFG, rows)


def test_an_empty_stream_before_a_real_one_changes_nothing() -> None:
    a, w = i8(2, 4), i8(4, 4)
    head = "li x1, 0\nli x2, 64\nmx.preload x2, 4, 4, i8\n"
    plain = machine(head + "mx.mms x1, 2\nvc.lds v1, 8\nhalt\n", local={0: a, 64: w})
    empty_first = machine(head + "mx.mms x1, 0\nmx.mms x1, 2\nvc.lds v1, 8\nhalt\n", local={0: a, 64: w})
    assert np.array_equal(plain.v[1], (a.astype(np.int64) @ w).ravel())
    assert np.array_equal(empty_first.v[1], plain.v[1])
    assert durations(empty_first, Unit.vector)["vc.lds"] == durations(plain, Unit.vector)["vc.lds"]


def test_stream_underflow_traps() -> None:
    with pytest.raises(SimulatorTrap, match="stream underflow"):
        machine("vc.lds v1, 4\nhalt\n")


def _drain_program(flags: str, act: str, out: str, scale_bits: int, shift: int, cols: int = 4) -> str:
    return f"""li x1, {ACC}
li x2, 512
li x3, {ACC + 256}
li x4, {scale_bits}
li x6, 1024
ep.cfg x2, x3, x4, {shift}, {act}, {flags}, {out}
mx.drain x6, x1, 3, {cols}
halt
"""


def test_drain_int_epilogue_bias_residual_relu_requantize() -> None:
    acc = RNG.integers(-5000, 5000, (3, 4)).astype(np.int32)
    bias = RNG.integers(-500, 500, 4).astype(np.int32)
    res = RNG.integers(-500, 500, (3, 4)).astype(np.int32)
    m = machine(_drain_program("bias_res", "relu", "i8", 5, 6), local={ACC: acc, 512: bias, ACC + 256: res})
    t = np.maximum(acc.astype(np.int64) + bias + res, 0)
    want = np.clip((t * 5 + 32) >> 6, -128, 127)
    assert local(m, 1024, 12, np.int8).reshape(3, 4).tolist() == want.tolist()
    assert durations(m, Unit.matrix) == {"ep.cfg": 1, "mx.drain": 3 + 3}


def test_drain_float_epilogue_gelu() -> None:
    acc = RNG.standard_normal((3, 4)).astype(np.float32)
    src = f"li x1, 0\nli x2, 64\nli x5, {ACC + 512}\nmx.preload x2, 1, 1, f32\n" + _drain_program(
        "none", "gelu", "f32", bits_from_f32(2.0), 0
    )
    m = machine(src, local={ACC: acc})
    gelu = np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))
    np.testing.assert_allclose(
        local(m, 1024, 12, np.float32).reshape(3, 4), 2 * gelu(acc.astype(np.float64)), rtol=1e-5
    )


@pytest.mark.parametrize(("out", "dtype"), [("i8", np.int8), ("i32", np.int32), ("f32", np.float32)])
def test_strided_drain_writes_column_panels_in_place(out: str, dtype) -> None:
    """Two mx.drain.s of 3 x 4 and 3 x 2 accumulator panels (row stride 6 elements) assemble a dense 3 x 6 tile
    in place, in the cycles of mx.drain, writing exactly the panels' bytes: the bytes between their rows (the
    other panel, a guard column) keep their values."""
    size = np.dtype(dtype).itemsize
    f32 = dtype is np.float32
    acc = (RNG.standard_normal((3, 6)) * 100).astype(np.float32) if f32 else RNG.integers(-99, 99, (3, 6))
    acc = acc.astype(np.float32 if f32 else np.int32)
    guard = np.full(3 * 7, 7, dtype)  # a 3 x 7 tile: the panels fill its first 6 columns (stride 7 elements)
    pre = "li x9, 64\nmx.preload x9, 1, 1, f32\n" if f32 else ""
    src = f"{pre}li x2, 0\nli x4, {bits_from_f32(1.0) if f32 else 1}\nep.cfg x2, x2, x4, 0, none, none, {out}\nli x3, {7 * size}\n"
    src += f"li x1, {ACC}\nli x6, 1024\nmx.drain.s x6, x1, x3, 3, 4\n"
    src += f"li x1, {ACC + 48}\nli x6, {1024 + 4 * size}\nmx.drain.s x6, x1, x3, 3, 2\nhalt\n"
    m = machine(src, local={ACC: acc[:, :4], ACC + 48: acc[:, 4:], 1024: guard})
    want = np.full((3, 7), 7, dtype)
    want[:, :6] = acc
    assert local(m, 1024, 21, dtype).reshape(3, 7).tolist() == want.tolist()
    durs = [f - s for pc, s, f in unit_slices(m, Unit.matrix) if m.instructions[pc].mnemonic == "mx.drain.s"]
    assert durs == [3 + 3, 3 + 3]
    assert simulate_counters(m).spad_write_bytes == 3 * 6 * size
    assert [t[2]["out_stride"] for t in m.transactions if "out_stride" in t[2]] == [7 * size] * 2


def test_strided_drain_checks_its_stride_and_span() -> None:
    base = f"li x2, 0\nli x4, 1\nep.cfg x2, x2, x4, 0, none, none, i32\nli x1, {ACC}\nli x6, 0\n"
    with pytest.raises(SimulatorTrap, match="row stride -4"):
        machine(base + "li x3, -4\nmx.drain.s x6, x1, x3, 2, 2\nhalt\n")
    with pytest.raises(SimulatorTrap, match="row stride 6"):
        machine(base + "li x3, 6\nmx.drain.s x6, x1, x3, 2, 2\nhalt\n")
    with pytest.raises(SimulatorTrap, match="overlaps its rows"):
        machine(base + "li x3, 4\nmx.drain.s x6, x1, x3, 2, 2\nhalt\n")
    with pytest.raises(SimulatorTrap, match="outside the scratchpad"):
        machine(base + f"li x3, {CFG.spad_bytes}\nmx.drain.s x6, x1, x3, 2, 2\nhalt\n")
    machine(base + "li x3, 0\nmx.drain.s x6, x1, x3, 1, 2\nhalt\n")  # one row: the stride is not used


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (f"li x1, 0\nli x5, {ACC}\nmx.mm x5, x1, 4\nhalt\n", "before any mx.preload"),
        ("li x1, 0\nli x5, 256\nmx.preload x1, 4, 4, i8\nmx.mm x5, x1, 4\nhalt\n", "not an accumulator address"),
        ("li x1, 0\nmx.preload x1, 5, 4, i8\nhalt\n", "exceeds the 4 x 4 array"),
        (f"li x1, {ACC}\nli x6, 0\nmx.drain x6, x1, 2, 2\nhalt\n", "before any ep.cfg"),
        (_drain_program("none", "none", "i32", 1, 0, cols=8), "exceeds the 4-wide array"),
        (_drain_program("none", "tanh", "i8", 1, 0), "needs the f32 path"),
        (f"li x5, {ACC}\nli x1, 0\nmx.preload x1, 4, 4, i8\nmx.mm x5, x1, 1000\nhalt\n", "outside the scratchpad"),
    ],
)
def test_matrix_faults(source: str, message: str) -> None:
    with pytest.raises(SimulatorTrap, match=message):
        machine(source)


def _dma_cycles(rows: int, row_bytes: int, stride: int) -> int:
    """The contract's rule, restated: latency + bursts * burst / bandwidth."""
    contiguous = rows <= 1 or stride == row_bytes
    bursts = -(-rows * row_bytes // 16) if contiguous else rows * -(-row_bytes // 16)
    return 20 + -(-bursts * 16 // 8)


def test_dma_strided_load_store_and_timing() -> None:
    matrix = RNG.integers(-(2**31), 2**31, (8, 16), dtype=np.int64).astype(np.int32)
    src = """.kernel k
.input m: i32[8, 16] @ M
.output tile: i32[3, 5] @ T
.output whole: i32[8, 16] @ W
li x1, 0
li x2, M + 2 * 64 + 4 * 4
li x3, 64
dma.ld x1, x2, x3, 3, 5, i32
li x4, 512
li x5, M
dma.ld x4, x5, x3, 8, 16, i32
sync.push ld, st
sync.pop ld, st
li x6, T
li x7, 20
dma.st x6, x1, x7, 3, 5, i32
li x6, W
dma.st x6, x4, x3, 8, 16, i32
halt
.endkernel
.data
M: .zero 512
T: .zero 60
W: .zero 512
"""
    r = run_asm(src, inputs={"m": matrix}, checked=True, trace=True)
    assert np.array_equal(r.outputs["tile"], matrix[2:5, 4:9])
    assert np.array_equal(r.outputs["whole"], matrix)
    slices = [
        e for e in r.trace_events() if e["ph"] == "X" and e["tid"] == Unit.load and e["name"].startswith("dma.ld")
    ]
    assert [e["args"]["end_cycle"] - e["args"]["start_cycle"] for e in slices] == [
        _dma_cycles(3, 20, 64),
        _dma_cycles(8, 64, 64),
    ]
    assert r.counters.dram_read_bytes == 3 * 20 + 512 and r.counters.dram_write_bytes == 60 + 512


def test_transposing_load() -> None:
    data = i8(4, 6)
    src = """.kernel k
.input a: i8[4, 6] @ A
.output t: i8[6, 4] @ T
li x1, 0
li x2, A
li x3, 6
dma.ldt x1, x2, x3, 4, 6, i8
sync.push ld, st
sync.pop ld, st
li x4, T
li x5, 4
dma.st x4, x1, x5, 6, 4, i8
halt
.endkernel
.data
A: .zero 24
T: .zero 24
"""
    r = run_asm(src, inputs={"a": data}, trace=True)
    assert np.array_equal(r.outputs["t"], data.T)
    (load,) = [
        e for e in r.trace_events() if e["ph"] == "X" and e["tid"] == Unit.load and e["name"].startswith("dma.ld")
    ]
    assert load["args"]["end_cycle"] - load["args"]["start_cycle"] == _dma_cycles(4, 6, 6) + 2


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("li x1, 1\nli x2, 0\nli x3, 16\ndma.ld x1, x2, x3, 1, 4, i32\nhalt\n", "misaligned local access"),
        ("li x1, 0\nli x2, 2\nli x3, 16\ndma.ld x1, x2, x3, 1, 4, i32\nhalt\n", "misaligned DRAM access"),
        ("li x1, 0\nli x2, 0x3ffff0\nli x3, 64\ndma.ld x1, x2, x3, 2, 4, i32\nhalt\n", "outside the"),
        (f"li x1, {ACC}\nli x2, 0\nli x3, 4\ndma.ld x1, x2, x3, 1, 4, i8\nhalt\n", "accumulator holds 4-byte"),
        ("li x1, 16380\nli x2, 0\nli x3, 16\ndma.ld x1, x2, x3, 1, 4, i32\nhalt\n", "outside the scratchpad"),
    ],
)
def test_dma_faults(source: str, message: str) -> None:
    with pytest.raises(SimulatorTrap, match=message):
        machine(source)
