"""Per-channel requantization: the drain's `pc` epilogue flags and `v.rqnt.vr` / `v.rqnt.vc`, through real
programs, against a Python-integer oracle (round half up of x * mult / 2^shift, saturated)."""

from __future__ import annotations

import numpy as np
import pytest
from sim_helpers import local, machine, unit_slices

from isa.enums import Unit
from isa.memory_map import LOCAL_ACC_BASE as ACC
from simulator import PRESETS, SimulatorTrap
from simulator.timing import drain_cycles, vector_cycles

RNG = np.random.default_rng(16)
CFG = PRESETS["tiny"]


def durations(m, unit: int) -> dict[str, int]:
    return {m.instructions[pc].mnemonic: finish - start for pc, start, finish in unit_slices(m, unit)}


def _oracle(x: int, mult: int, shift: int) -> int:
    """Python integers: no int64 wrap to hide behind."""
    value = x * mult + ((1 << (shift - 1)) if shift else 0)
    return max(-128, min(127, value >> shift))


def _table(channels: int) -> np.ndarray:
    mults = RNG.integers(1 << 20, 1 << 31, channels)
    shifts = RNG.integers(20, 40, channels)
    return np.stack([mults, shifts], axis=1).astype(np.int32)


@pytest.mark.parametrize("flags", ["pc", "bias_pc", "res_pc", "bias_res_pc"])
def test_drain_requantizes_each_column_with_its_own_pair(flags: str) -> None:
    rows, cols = 3, 4
    acc = RNG.integers(-(1 << 20), 1 << 20, (rows, cols)).astype(np.int32)
    bias = RNG.integers(-5000, 5000, cols).astype(np.int32)
    res = RNG.integers(-5000, 5000, (rows, cols)).astype(np.int32)
    table = _table(cols)
    src = f"""li x1, {ACC}
li x2, 512
li x3, {ACC + 256}
li x4, 768
li x6, 1024
ep.cfg x2, x3, x4, 0, relu, {flags}, i8
mx.drain x6, x1, {rows}, {cols}
halt
"""
    m = machine(src, local={ACC: acc, 512: bias, ACC + 256: res, 768: table})
    t = acc.astype(np.int64) + (bias if "bias" in flags else 0) + (res if "res" in flags else 0)
    t = np.maximum(t, 0)
    want = [[_oracle(int(t[r, c]), int(table[c, 0]), int(table[c, 1])) for c in range(cols)] for r in range(rows)]
    assert local(m, 1024, rows * cols, np.int8).reshape(rows, cols).tolist() == want
    assert durations(m, Unit.matrix)["mx.drain"] == drain_cycles(CFG, rows, 3), "the table costs no cycle"


def test_per_column_drain_needs_i8_out() -> None:
    src = f"li x1, {ACC}\nli x4, 768\nli x6, 1024\nep.cfg zero, zero, x4, 0, none, pc, i32\n"
    src += "mx.drain x6, x1, 1, 4\nhalt\n"
    with pytest.raises(SimulatorTrap, match="per-column requantizer"):
        machine(src, local={ACC: np.zeros(4, np.int32), 768: _table(4)})


@pytest.mark.parametrize("per_row", [False, True])
def test_vector_per_channel_requantize(per_row: bool) -> None:
    rows, period = 5, 6
    n = rows * period
    x = RNG.integers(-(1 << 24), 1 << 24, n).astype(np.int32)
    table = _table(rows if per_row else period)
    mnemonic = "v.rqnt.vc" if per_row else "v.rqnt.vr"
    src = f"li x1, 0\nli x2, 512\nli x3, 1024\n{mnemonic} x3, x1, x2, {n}, {period}\nhalt\n"
    m = machine(src, local={0: x, 512: table})
    channel = [i // period if per_row else i % period for i in range(n)]
    want = [_oracle(int(x[i]), int(table[c, 0]), int(table[c, 1])) for i, c in enumerate(channel)]
    assert local(m, 1024, n, np.int8).tolist() == want
    assert durations(m, Unit.vector)[mnemonic] == vector_cycles(CFG, n, 3)


def test_vector_per_channel_shift_out_of_range_traps() -> None:
    table = np.array([[1, 64]], np.int32)
    src = "li x1, 0\nli x2, 512\nli x3, 1024\nv.rqnt.vr x3, x1, x2, 4, 1\nhalt\n"
    with pytest.raises(SimulatorTrap, match="outside"):
        machine(src, local={0: np.ones(4, np.int32), 512: table})
