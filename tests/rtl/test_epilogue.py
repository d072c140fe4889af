"""The drain epilogue (bias/residual -> activation -> requantize, one multiplier or one per column) against the
simulator's epilogue semantics."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from isa import BY_MNEMONIC, Activation, DType, EpilogueFlags, make
from rtl.replay import run_cases
from rtl.stimulus import drain_case
from rtl.units import EPILOGUE
from simulator.config import PRESETS
from simulator.semantics.matrix import epilogue

pytestmark = pytest.mark.rtl
I32 = np.iinfo(np.int32)
DRAIN_LATENCY = BY_MNEMONIC["mx.drain"].latency


def _acc(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    x = rng.integers(-(1 << 20), 1 << 20, (rows, cols), dtype=np.int64)
    x[rng.random((rows, cols)) < 0.2] = rng.choice([I32.min, I32.max, -1, 0, 1])
    return x.astype(np.int32)


def _table(rng: np.random.Generator, cols: int, mult: int, shift: int) -> np.ndarray:
    """Per-column (mult, shift) pairs: the given pair in column 0, the rest random (shifts 0..63, any sign)."""
    pairs = np.stack([rng.integers(-(2**31), 2**31, cols), rng.integers(0, 64, cols)], axis=1)
    pairs[0] = (mult, shift)
    return pairs.astype(np.int32)


@pytest.mark.parametrize("config", ["tiny", "base"])
def test_epilogue_matches_simulator(config: str, tmp_path) -> None:
    cfg = PRESETS[config]
    rng = np.random.default_rng(7)
    cases = []
    settings = itertools.product(EpilogueFlags, (Activation.none, Activation.relu), (DType.i8, DType.i32))
    for flags, act, dtype in settings:
        if flags & EpilogueFlags.pc and dtype is not DType.i8:
            continue  # a per-column requantizer drains to i8 only (the simulator faults otherwise)
        for mult, shift in ((1, 0), (77, 12), (-3, 2), (2**31 - 1, 40)):
            rows, cols = int(rng.integers(1, 2 * cfg.array_size)), int(rng.integers(1, cfg.array_size + 1))
            acc = _acc(rng, rows, cols)
            bias = _acc(rng, 1, cols)[0] if flags & EpilogueFlags.bias else None
            res = _acc(rng, rows, cols) if flags & EpilogueFlags.res else None
            table = _table(rng, cols, mult, shift) if flags & EpilogueFlags.pc else None
            word = make("ep.cfg", 1, 2, 3, shift, int(act), int(flags), int(dtype))
            expected = epilogue(acc, bias, res, act, mult, shift, dtype, table)
            label = f"drain {flags.name} {act.name} {dtype.name} mult={mult} shift={shift}"
            cases.append(
                drain_case(
                    cfg, label, word, mult, acc, expected, bias=bias, residual=res, table=table, latency=DRAIN_LATENCY
                )
            )
    report = run_cases(EPILOGUE, cfg, cases, vcd_dir=tmp_path)
    assert report.ok, report.first_mismatch()
