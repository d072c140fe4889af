"""The vector unit against the simulator's vector semantics: every integer op, dtype and operand mode."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from isa import DType, make
from rtl.replay import run_cases
from rtl.stimulus import per_channel_operands, vector_case
from rtl.units import LANE_BINARY, LANE_REDUCE, LANE_UNARY, VECTOR
from simulator.config import PRESETS
from simulator.semantics import vector as sem

pytestmark = pytest.mark.rtl

LIMITS = {DType.i8: (-128, 127), DType.i32: (-(2**31), 2**31 - 1)}


def _operand(rng: np.random.Generator, dtype: DType, n: int) -> np.ndarray:
    """Random values with the extremes (min, max, -1, 0, 1) mixed in."""
    lo, hi = LIMITS[dtype]
    x = rng.integers(lo, hi, n, endpoint=True, dtype=np.int64)
    corners = np.array([lo, hi, -1, 0, 1, lo + 1, hi - 1])
    pick = rng.random(n) < 0.3
    x[pick] = rng.choice(corners, pick.sum())
    return x.astype(dtype.numpy)


def _binary_cases(cfg, rng):
    cases = []
    for dtype in (DType.i8, DType.i32):
        for op in LANE_BINARY:
            for suffix in ("", ".vs"):
                n = int(rng.integers(1, 5 * cfg.vector_lanes))
                a = _operand(rng, dtype, n)
                if op in ("sll", "srl", "sra"):
                    b = rng.integers(-40, 40, n).astype(dtype.numpy)
                else:
                    b = _operand(rng, dtype, n)
                scalar = int(b[0]) if suffix else 0
                rhs = scalar if suffix else b
                expected = sem.binary(op, a, rhs, dtype)
                ins = make(f"v.{op}{suffix}", 1, 2, 3, n, int(dtype))
                cases.append(
                    vector_case(
                        cfg, f"v.{op}{suffix} {dtype.name} n={n}", ins, a, expected, b=None if suffix else b, rs2=scalar
                    )
                )
                chained = make(f"vc.{op}{suffix}", 1, 2, 3)
                cases.append(
                    vector_case(
                        cfg,
                        f"vc.{op}{suffix} {dtype.name} n={n}",
                        chained,
                        a,
                        expected,
                        b=None if suffix else b,
                        rs2=scalar,
                        dtype=dtype,
                        chained=True,
                    )
                )
    return cases


def _other_cases(cfg, rng):
    cases = []
    for dtype in (DType.i8, DType.i32):
        for op in LANE_UNARY:
            n = int(rng.integers(1, 5 * cfg.vector_lanes))
            a = _operand(rng, dtype, n)
            cases.append(
                vector_case(
                    cfg, f"v.{op} {dtype.name}", make(f"v.{op}", 1, 2, n, int(dtype)), a, sem.unary(op, a, dtype)
                )
            )
            cases.append(
                vector_case(
                    cfg,
                    f"vc.{op} {dtype.name}",
                    make(f"vc.{op}", 1, 2),
                    a,
                    sem.unary(op, a, dtype),
                    dtype=dtype,
                    chained=True,
                )
            )
        for lo, hi in ((-20, 30), (-1000, 1000), (50, -50), (-(2**31), 2**31 - 1)):
            n = int(rng.integers(1, 5 * cfg.vector_lanes))
            a = _operand(rng, dtype, n)
            cases.append(
                vector_case(
                    cfg,
                    f"v.clip {dtype.name} [{lo}, {hi}]",
                    make("v.clip", 1, 2, 3, 4, n, int(dtype)),
                    a,
                    sem.clip(a, lo, hi, dtype),
                    rs2=lo,
                    rs3=hi,
                )
            )
        for op in LANE_REDUCE:
            for period in (1, 3, cfg.vector_lanes, 2 * cfg.vector_lanes + 1):
                rows = int(rng.integers(1, 4))
                a = _operand(rng, dtype, rows * period)
                cases.append(
                    vector_case(
                        cfg,
                        f"v.{op} {dtype.name} period={period}",
                        make(f"v.{op}", 1, 2, rows * period, period, int(dtype)),
                        a,
                        sem.reduce(op, a, period, dtype),
                        period=period,
                    )
                )
                cases.append(
                    vector_case(
                        cfg,
                        f"vc.{op} {dtype.name} period={period}",
                        make(f"vc.{op}", 1, 2, period),
                        a,
                        sem.reduce(op, a, period, dtype),
                        dtype=dtype,
                        period=period,
                    )
                )
    for mult, shift in ((1, 0), (3, 1), (1 << 20, 24), (-7, 5), (2**31 - 1, 63), (-(2**31), 31), (123456, 17)):
        n = int(rng.integers(1, 5 * cfg.vector_lanes))
        x = _operand(rng, DType.i32, n)
        expected = sem.requantize(x, mult, shift)
        cases.append(
            vector_case(
                cfg, f"v.rqnt mult={mult} shift={shift}", make("v.rqnt", 1, 2, 3, shift, n), x, expected, rs2=mult
            )
        )
        cases.append(
            vector_case(
                cfg,
                f"vc.rqnt mult={mult} shift={shift}",
                make("vc.rqnt", 1, 2, 3, shift),
                x,
                expected,
                rs2=mult,
                chained=True,
            )
        )
    for mnemonic, period in itertools.product(("v.rqnt.vr", "v.rqnt.vc"), (1, 3, cfg.vector_lanes + 1)):
        n = int(rng.integers(1, 5 * cfg.vector_lanes))
        x = _operand(rng, DType.i32, n)
        channels = n if mnemonic.endswith(".vc") else period
        table = np.stack([rng.integers(-(2**31), 2**31, channels), rng.integers(0, 64, channels)], axis=1)
        table = table.astype(np.int32)
        mults, shifts = per_channel_operands(mnemonic, table, period, n)
        channel = np.arange(n) // period if mnemonic.endswith(".vc") else np.arange(n) % period
        expected = sem.requantize_channels(x, table, channel)
        label = f"{mnemonic} period={period}"
        cases.append(vector_case(cfg, label, make(mnemonic, 1, 2, 3, n, period), x, expected, b=mults, c=shifts))
    return cases


@pytest.mark.parametrize("config", ["tiny", "base"])
def test_vector_unit_matches_simulator(config: str, tmp_path) -> None:
    cfg = PRESETS[config]
    rng = np.random.default_rng(4)
    cases = _binary_cases(cfg, rng) + _other_cases(cfg, rng)
    report = run_cases(VECTOR, cfg, cases, vcd_dir=tmp_path)
    assert report.ok, report.first_mismatch()
    assert len(report.verdicts) == len(cases)
