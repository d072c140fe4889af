"""A timing-only run (`simulate(timing_only=True)`: no values computed or moved) against the full simulator, the
oracle: every counter, whole-run and per kernel, and every trap must be the same, on hypothesis-drawn programs
mixing every unit (values random, so the full run's data differ from the timing-only run's zeros). The kernels the
fusion engine generates: tests/fusion/engine/test_execute_timing_only.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_helpers import GEMM

from assembler.source import assemble
from isa.errors import DynfuseError
from isa.memory_map import LOCAL_ACC_BASE
from simulator import PRESETS, SimulatorTrap, simulate
from simulator.machine import Machine

CFG = PRESETS["tiny"]
N = CFG.array_size
SPAD = 12288  # general scratchpad traffic below; [SPAD, spad_bytes) holds requantizer tables, never written
DRAM = 8192  # bytes of random data the program loads from and stores to
SIZE = {"i8": 1, "i32": 4, "f32": 4}


def outcome(source: str, data: np.ndarray, timing_only: bool) -> object:
    """The run's counters (whole and per kernel), or its trap."""
    try:
        r = simulate(assemble(source), CFG, {"d": data}, timing_only=timing_only)
    except SimulatorTrap as trap:
        return str(trap)
    return r.counters, r.kernel_counters


@st.composite
def blocks(draw, state: dict) -> list[str]:
    """One piece of work: its operands' registers set, then the instruction(s)."""
    kind = draw(st.sampled_from(["ld", "ldt", "st", "preload", "mm", "mm", "mms", "drain", "vec", "sync", "misc"]))
    spad = lambda size, count: draw(st.integers(0, (SPAD - size * count) // 4)) * 4  # noqa: E731
    acc = lambda count: LOCAL_ACC_BASE + 4 * draw(st.integers(0, CFG.acc_bytes // 4 - count))  # noqa: E731
    if kind in ("ld", "ldt", "st"):
        dt = draw(st.sampled_from(["i8", "i32", "f32"] if kind != "ldt" else ["i8"]))
        rows, cols = draw(st.integers(1, 6)), draw(st.integers(1, 8))
        stride = cols * SIZE[dt] + SIZE[dt] * draw(st.integers(0, 3))
        dram = SIZE[dt] * draw(st.integers(0, (DRAM - rows * stride) // SIZE[dt]))
        local = spad(SIZE[dt], rows * cols)
        op = {"ld": "dma.ld x1, x2, x3", "ldt": "dma.ldt x1, x2, x3", "st": "dma.st x2, x1, x3"}[kind]
        return [f"li x1, {local}", f"li x2, D + {dram}", f"li x3, {stride}", f"{op}, {rows}, {cols}, {dt}"]
    if kind == "preload":
        dt = draw(st.sampled_from(["i8", "f32"]))
        k, cols = draw(st.integers(1, N)), draw(st.integers(1, N))
        state["weights"] = (dt, k, cols)
        return [f"li x4, {spad(SIZE[dt], k * cols)}", f"mx.preload x4, {k}, {cols}, {dt}"]
    if kind in ("mm", "mms") and state.get("weights"):
        dt, k, cols = state["weights"]
        rows = draw(st.integers(0 if kind == "mm" else 1, 8))
        src = [f"li x5, {spad(SIZE[dt], rows * k)}"]
        if kind == "mms":
            count = rows * cols
            dest = spad(4, count)
            return src + ["mx.mms x5, " + str(rows), f"vc.lds v1, {count}", f"li x6, {dest}", "vc.st x6, v1"]
        op = draw(st.sampled_from(["mx.mm", "mx.mma", "mx.mm.s", "mx.mma.s"]))
        if op.endswith(".s"):  # A's rows `stride` bytes apart (a gap, none, or overlapping rows)
            stride = SIZE[dt] * draw(st.integers(0, 2 * k))
            src = [f"li x5, {spad(1, max(rows - 1, 0) * stride + rows * k * SIZE[dt])}", f"li x18, {stride}"]
            return src + [f"li x6, {acc(rows * cols)}", f"{op} x6, x5, x18, {rows}"]
        return src + [f"li x6, {acc(rows * cols)}", f"{op} x6, x5, {rows}"]
    if kind == "drain" and state.get("weights"):
        dt = state["weights"][0]
        rows, cols = draw(st.integers(1, 6)), draw(st.integers(1, N))
        if dt == "i8":
            act, out = draw(st.sampled_from(["none", "relu"])), draw(st.sampled_from(["i8", "i32", "f32"]))
        else:
            act, out = draw(st.sampled_from(["none", "relu", "gelu", "tanh", "sigmoid"])), "f32"
        flags = [f for f in ("bias", "res") if draw(st.booleans())]
        if out == "i8" and dt == "i8" and draw(st.booleans()):
            flags.append("pc")
        table = SPAD + 4 * draw(st.integers(0, (CFG.spad_bytes - SPAD) // 4 - 2 * cols))
        mult = table if "pc" in flags else draw(st.integers(0, 1 << 20))
        cfg = [
            f"li x7, {acc(cols)}",
            f"li x8, {acc(rows * cols)}",
            f"li x9, {mult}",
            f"ep.cfg x7, x8, x9, {draw(st.integers(0, 20))}, {act}, {'_'.join(flags) or 'none'}, {out}",
            f"li x11, {acc(rows * cols)}",
        ]
        if draw(st.booleans()):  # mx.drain.s: the rows `stride` bytes apart (dense, or a gap)
            stride = SIZE[out] * (cols + draw(st.integers(0, 2 * cols)))
            dest = spad(1, (rows - 1) * stride + cols * SIZE[out])
            return cfg + [f"li x10, {dest}", f"li x18, {stride}", f"mx.drain.s x10, x11, x18, {rows}, {cols}"]
        return cfg + [f"li x10, {spad(SIZE[out], rows * cols)}", f"mx.drain x10, x11, {rows}, {cols}"]
    if kind == "vec":
        dt = draw(st.sampled_from(["i8", "i32", "f32"]))
        n = draw(st.integers(1, 64))
        a, b, d = (spad(4, n) for _ in range(3))
        ops = [f"v.add x12, x13, x14, {n}, {dt}", f"v.relu x12, x13, {n}, {dt}"]
        period = draw(st.integers(1, 8))
        ops += [f"v.rqnt.vr x12, x13, x15, {n}, {period}", f"v.rqnt.vc x12, x13, x15, {n}, {period}"]
        # every vector family (a period that does not split n faults in both runs alike)
        dt2 = draw(st.sampled_from(["i8", "i32", "f32"]))
        ops += [f"v.mul.vs x12, x13, x14, {n}, {dt}", f"v.mul.vr x12, x13, x14, {n}, {period}, {dt}"]
        ops += [f"v.add.vc x12, x13, x14, {n}, {period}, {dt}", f"v.rsum x12, x13, {n}, {period}, {dt}"]
        ops += [f"v.rmax x12, x13, {n}, {period}, {dt}", f"v.clip x12, x13, x14, x15, {n}, {dt}"]
        ops += [f"v.cvt x12, x13, {n}, {dt}, {dt2}", f"v.rqnt x12, x13, x14, 7, {n}", f"v.qnt x12, x13, x14, {n}"]
        ops += [f"v.neg x12, x13, {n}, {dt}", f"v.copy x12, x13, {n}, {dt}"] + [f"v.exp x12, x13, {n}, f32"]
        table = SPAD + 4 * draw(st.integers(0, (CFG.spad_bytes - SPAD) // 4 - 2 * n))
        return [f"li x12, {d}", f"li x13, {a}", f"li x14, {b}", f"li x15, {table}", draw(st.sampled_from(ops))]
    if kind == "sync":
        src, dst = draw(st.sampled_from([("ld", "mx"), ("mx", "vx"), ("vx", "st"), ("mx", "st"), ("ld", "vx")]))
        state.setdefault("tokens", []).append((src, dst))
        return [f"sync.push {src}, {dst}"]
    pending = state.get("tokens", [])
    choice = draw(st.sampled_from(["pop", "fence", "zero_test", "loop"]))
    if choice == "pop" and pending:
        return ["sync.pop {}, {}".format(*pending.pop(0))]
    label = state["labels"] = state.get("labels", 0) + 1
    if choice == "zero_test":  # a value steers control flow: the timing-only run computes values
        return [f"li x15, {spad(1, 16)}", f"bz.tile x15, 16, i8, L{label}", "addi x16, x16, 1", f"L{label}:"]
    if choice == "loop":
        return [f"loopi 3, L{label}", "addi x17, x17, 1", "nop", f"L{label}:"]
    return ["fence"]


@st.composite
def programs(draw) -> str:
    state: dict = {}
    lines = [".kernel k", f".input d: i8[{DRAM}] @ D"]
    for _ in range(draw(st.integers(1, 30))):
        lines += draw(blocks(state))
    lines += ["sync.pop {}, {}".format(*t) for t in state.get("tokens", [])]
    return "\n".join([*lines, "halt", ".endkernel", ".data", f"D: .zero {DRAM}", ""])


@settings(max_examples=200, deadline=None)
@given(programs(), st.integers(0, 2**32 - 1))
def test_timing_only_counts_what_the_full_simulation_counts(source: str, seed: int) -> None:
    data = np.random.default_rng(seed).integers(-128, 128, DRAM, dtype=np.int8)
    assert outcome(source, data, True) == outcome(source, data, False)


def test_values_are_off_only_when_no_value_steers_control() -> None:
    plain = assemble(".kernel k\nli x1, 0\nhalt\n.endkernel\n")
    steered = assemble(".kernel k\nli x1, 0\nbz.tile x1, 4, i8, 2\nnop\nhalt\n.endkernel\n")
    assert not Machine(plain, CFG, timing_only=True).values
    assert Machine(steered, CFG, timing_only=True).values
    assert Machine(plain, CFG).values
    gemm = assemble(GEMM)
    assert simulate(gemm, CFG, timing_only=True).outputs == {} and simulate(gemm, CFG).outputs.keys() == {"c"}
    with pytest.raises(DynfuseError, match="cannot record transactions"):
        simulate(plain, CFG, timing_only=True, record_transactions=True)


VECTOR_FORMS = [
    "v.add x12, x13, x14, {n}, {dt}",
    "v.mul.vs x12, x13, x14, {n}, {dt}",
    "v.mul.vr x12, x13, x14, {n}, {period}, {dt}",
    "v.add.vc x12, x13, x14, {n}, {period}, {dt}",
    "v.rsum x12, x13, {n}, {period}, {dt}",
    "v.rmax x12, x13, {n}, {period}, {dt}",
    "v.clip x12, x13, x14, x15, {n}, {dt}",
    "v.cvt x12, x13, {n}, {dt}, i32",
    "v.cvt x12, x13, {n}, {dt}, i8",
    "v.neg x12, x13, {n}, {dt}",
    "v.relu x12, x13, {n}, {dt}",
    "v.rqnt x12, x13, x14, 7, {n}",
    "v.qnt x12, x13, x14, {n}",
]


@pytest.mark.parametrize("form", VECTOR_FORMS)
@pytest.mark.parametrize("dt", ["i8", "i32", "f32"])
@pytest.mark.parametrize("period", [4, 5])  # 5 does not split n = 48: a fault in both runs
def test_timing_only_vector_results_have_the_full_results_size_and_type(form: str, dt: str, period: int) -> None:
    """Each vector form's result written without values: as many bytes, in the same banks, as the full run's."""
    op = form.format(n=48, period=period, dt=dt)
    source = "\n".join(
        [".kernel k", f".input d: i8[{DRAM}] @ D", "li x12, 1024", "li x13, 4096", "li x14, 8192", "li x15, 3", op]
        + ["halt", ".endkernel", ".data", f"D: .zero {DRAM}", ""]
    )
    data = np.zeros(DRAM, dtype=np.int8)
    assert outcome(source, data, True) == outcome(source, data, False)
