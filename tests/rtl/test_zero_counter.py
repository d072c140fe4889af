"""The store path's zero-tile counter (rtl/hdl/zero_counter.v) against the simulator.

A sequence of store-unit words (dma.stz, dma.st, zc.clr) with random blocks of zero and non-zero tiles is run
twice: on the RTL, beats streamed one row chunk at a time with random idle cycles between them, and in the
simulator as a program that reads the counter (`zc.rd`) after each store. The RTL's count after each store must
equal the simulator's register, and it must be final the cycle after the store's last beat (every beat taken in
its cycle: counting adds no cycle to the store, as `dma.stz`'s timing rule says).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from isa import DType, encode, make
from rtl import build as rtl_build
from rtl.jobs import Item, Job, Watch, pack
from rtl.units import ACC_BITS, ZERO_COUNTER
from simulator.config import PRESETS, MachineConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "simulator"))
from sim_helpers import machine  # noqa: E402 - the simulator tests' helper: run a program with local memory set

pytestmark = pytest.mark.rtl
BY_NUMPY = {d.numpy: d for d in DType}


def _block(rng: np.random.Generator, n: int, dtype: DType) -> np.ndarray:
    rows, cols = (int(v) for v in rng.integers(1, 3 * n + 2, 2))
    values = {DType.i8: (0, 1, -1, 127, -128), DType.i32: (0, 1, -1, 1 << 30), DType.f32: (0.0, -0.0, 1.5, np.nan)}
    block = rng.choice(np.array(values[dtype], dtype=dtype.numpy), (rows, cols))
    zero = rng.random((-(-rows // n), -(-cols // n))) < rng.random()
    block[np.kron(zero, np.ones((n, n), dtype=bool))[:rows, :cols]] = 0
    return block


def _lanes(block: np.ndarray, n: int) -> np.ndarray:
    """The block's beats: one n-element row chunk each, row-major, as ACC_W-bit lanes (f32 as its bits)."""
    rows, cols = block.shape
    wide = block.view(np.int32) if block.dtype == np.float32 else block.astype(np.int64)
    padded = np.zeros((rows, -(-cols // n) * n), dtype=np.int64)
    padded[:, :cols] = wide
    return padded.reshape(-1, n)


def _sequence(cfg: MachineConfig, seed: int) -> list[tuple[str, np.ndarray]]:
    """(mnemonic, block) per store; a zc.clr now and then before one."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(14):
        dtype = DType(int(rng.integers(0, 3)))
        mnemonic = str(rng.choice(["dma.stz", "dma.stz", "dma.st"]))
        out.append((mnemonic, _block(rng, cfg.array_size, dtype), bool(rng.random() < 0.25)))
    n = cfg.array_size
    signed_zeros = np.full((n + 1, 2 * n), -0.0, dtype=np.float32)  # -0.0 tiles are zero tiles, NaN ones are not
    signed_zeros[n, n] = np.nan
    return [*out, ("dma.stz", signed_zeros, False)]


def _simulated_counts(cfg: MachineConfig, sequence) -> list[int]:
    """The simulator's counter after each store (`zc.rd` into its own register), one program."""
    lines, local, dram, arrays = [".kernel k"], 0, 0, {}
    for k, (mnemonic, block, clear) in enumerate(sequence):
        rows, cols = block.shape
        if clear:
            lines.append("zc.clr")
        lines += [f"li x1, {local}", f"li x2, OUT + {dram}", f"li x3, {block.nbytes // rows}"]
        lines += [f"{mnemonic} x2, x1, x3, {rows}, {cols}, {BY_NUMPY[block.dtype].name}", f"zc.rd x{5 + k}"]
        arrays[local] = block
        local += -(-block.nbytes // 64) * 64
        dram += -(-block.nbytes // 64) * 64
    lines += ["halt", ".endkernel", ".data", f"OUT: .zero {dram}"]
    m = machine("\n".join(lines) + "\n", cfg, arrays)
    return [m.x[5 + k] for k in range(len(sequence))]


def _items(cfg: MachineConfig, sequence, seed: int) -> tuple[list[Item], list[int]]:
    """One item per store: (zc.clr,) the store's word, then its beats with random gaps; the last beat's offset."""
    rng = np.random.default_rng(seed + 1)
    n, items, lasts = cfg.array_size, [], []
    for mnemonic, block, clear in sequence:
        words = ([encode(make("zc.clr"))] if clear else []) + [
            encode(make(mnemonic, 0, 0, 0, *block.shape, BY_NUMPY[block.dtype]))
        ]
        beats = _lanes(block, n)
        gaps = rng.integers(0, 3, len(beats)) * (rng.random(len(beats)) < 0.3)  # idle cycles before a beat
        valid = np.concatenate([np.r_[np.zeros(g, dtype=bool), True] for g in gaps])
        data = np.zeros((len(valid), n), dtype=np.int64)
        data[valid] = beats
        start = [1] * len(words) + [0] * len(valid)
        instr = words + [words[-1]] * len(valid)
        lasts.append(len(words) + int(np.flatnonzero(valid)[-1]))
        drive = {
            "start": start,
            "instr": instr,
            "in_valid": [0] * len(words) + valid.astype(int).tolist(),
            "in_data": [0] * len(words) + pack(data, ACC_BITS),
        }
        items.append(Item(f"{mnemonic} {block.dtype} {block.shape}", {}, drive, (Watch(("done",), ("count",), 1),), 8))
    return items, lasts


@pytest.mark.parametrize("config", ["tiny", "base"])
def test_zero_counter_counts_as_the_simulator_and_adds_no_cycle(config: str) -> None:
    cfg = PRESETS[config]
    sequence = _sequence(cfg, seed=11)
    assert any(m == "dma.st" for m, *_ in sequence) and any(c for *_, c in sequence)
    expected = _simulated_counts(cfg, sequence)
    assert len(set(expected)) > 3  # the sequence counts, clears and passes plain stores
    items, lasts = _items(cfg, sequence, seed=11)
    built = rtl_build.build(ZERO_COUNTER.toplevel, ZERO_COUNTER.params(cfg))
    idle = {"start": 0, "in_valid": 0, "in_data": 0, "instr": 0}
    results = rtl_build.run(built, Job(ZERO_COUNTER.toplevel, tuple(items), idle))
    for item, result, want, last in zip(items, results, expected, lasts, strict=True):
        ((done,),) = result.events
        assert done.values["count"] == want, item.label
        assert done.offset == last + 1, item.label  # final the cycle after the last beat
