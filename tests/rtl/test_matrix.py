"""The matrix unit (PE array + skew/de-skew) against the simulator's matmul semantics and timing."""

from __future__ import annotations

import numpy as np
import pytest

from isa import DType
from rtl.replay import run_cases
from rtl.stimulus import MatrixOp, matmul_case, matrix_run_case, preload_case
from rtl.units import MATRIX
from simulator import timing
from simulator.config import PRESETS
from simulator.semantics.matrix import accumulate, matmul

pytestmark = pytest.mark.rtl
I32 = np.iinfo(np.int32)


def _tiles(rng: np.random.Generator, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(activations, weights) pairs: random shapes, plus the extremes that stress the i32 accumulator."""
    full = np.full((3, n), -128, dtype=np.int8), np.full((n, n), -128, dtype=np.int8)  # largest positive sums
    mixed = np.full((2, n), 127, dtype=np.int8), np.full((n, n), -128, dtype=np.int8)  # largest negative sums
    single = rng.integers(-128, 128, (1, n), dtype=np.int8), rng.integers(-128, 128, (n, n), dtype=np.int8)
    pairs = [full, mixed, single]
    for _ in range(4):
        rows, k, cols = int(rng.integers(1, 3 * n)), int(rng.integers(1, n + 1)), int(rng.integers(1, n + 1))
        pairs.append(
            (rng.integers(-128, 128, (rows, k), dtype=np.int8), rng.integers(-128, 128, (k, cols), dtype=np.int8))
        )
    return pairs


@pytest.mark.parametrize("config", ["tiny", "base"])
def test_matrix_unit_matches_simulator(config: str, tmp_path) -> None:
    cfg = PRESETS[config]
    cases = []
    rng = np.random.default_rng(1)
    for i, (a, w) in enumerate(_tiles(rng, cfg.array_size)):
        cases.append(preload_case(cfg, f"preload {i} {w.shape}", w))
        cases.append(matmul_case(cfg, f"matmul {i} {a.shape} @ {w.shape}", a, matmul(a, w, DType.i8)))
        cases.append(matmul_case(cfg, f"matmul {i} again (weights stay)", a[::-1], matmul(a[::-1], w, DType.i8)))
        product = matmul(a, w, DType.i8)
        acc = rng.integers(I32.min, I32.max, product.shape, endpoint=True, dtype=np.int64).astype(np.int32)
        acc[0] = I32.max  # wraps on any positive product
        cases.append(matmul_case(cfg, f"mma {i}", a, accumulate(acc, product), acc=acc))
    report = run_cases(MATRIX, cfg, cases, vcd_dir=tmp_path)
    assert report.ok, report.first_mismatch()


def _run(cfg, rng, rows: list[int], shifts: dict[int, int] | None = None) -> list[MatrixOp]:
    """A preload per matmul (the i-th matmul of `rows` rows), plus a second matmul on the last weights, scheduled
    by the simulator's rules; `shifts` moves the i-th instruction's start by some cycles (breaking a rule)."""
    n = cfg.array_size
    ops, weights, inputs, last, acc, w = [], 0, 0, 0, None, None
    plan = [("p", 0)] + [x for i, r in enumerate(rows) for x in ((("p", 0),) if i else ()) + (("m", r),)]
    plan.append(("m", rows[-1]))
    for i, (kind, r) in enumerate(plan):
        if kind == "p":
            start = timing.preload_start(last, weights)
            w = rng.integers(-128, 128, (n, n), dtype=np.int8)
        else:
            start = timing.matmul_start(last, inputs, weights)
        start += (shifts or {}).get(i, 0)
        last = start
        if kind == "p":
            weights = start + timing.preload_cycles(cfg)
            ops.append(MatrixOp(start, timing.preload_cycles(cfg), w=w))
            continue
        inputs = start + timing.matmul_input_cycles(cfg, r)
        a = rng.integers(-128, 128, (r, n), dtype=np.int8)
        product = matmul(a, w, DType.i8)
        if acc is not None and acc.shape == product.shape:  # mx.mma into the rows the previous matmul wrote
            ops.append(MatrixOp(start, timing.matmul_cycles(cfg, r), a=a, product=accumulate(acc, product), acc=acc))
        else:
            ops.append(MatrixOp(start, timing.matmul_cycles(cfg, r), a=a, product=product))
        acc = ops[-1].product
    return ops


@pytest.mark.parametrize("config", ["tiny", "base"])
def test_overlapped_preloads_and_back_to_back_matmuls_match(config: str, tmp_path) -> None:
    """Preloads shifting in under running matmuls, matmuls entering right behind each other (row counts below, at
    and above N: preload-bound and input-bound), an mx.mma into rows still in flight: values and cycles exact."""
    cfg = PRESETS[config]
    n = cfg.array_size
    rng = np.random.default_rng(5)
    runs = [_run(cfg, rng, rows) for rows in ([n, n, n], [1, 2, n - 1], [2 * n + 1, 3, n + 2, n + 2])]
    assert all(max(op.start + op.charged for op in ops) < sum(op.charged for op in ops) for ops in runs)  # overlap
    cases = [matrix_run_case(cfg, f"run {i}", ops) for i, ops in enumerate(runs)]
    report = run_cases(MATRIX, cfg, cases, vcd_dir=tmp_path)
    assert report.ok, report.first_mismatch()


def test_each_rule_is_tight_one_cycle_early_breaks_the_values(tmp_path) -> None:
    """A matmul one cycle before its preload's weights are in, or a preload one cycle before the matmul that switches
    to the previous weights, computes wrong values on the RTL: the timing rules allow no less."""
    cfg = PRESETS["tiny"]
    n = cfg.array_size
    # p, m, p, m (one cycle early), m
    matmul_plan = ([1, n], {3: -1})
    # p, m (3N rows: the next preload is free early), p, m (switches at 4N), p (one cycle before it), m, m
    preload_plan = ([3 * n, 1, 1], {4: -1})
    cases = []
    for shifted in (False, True):  # on the rules' schedule the same runs match
        for name, (rows, shift) in (("matmul", matmul_plan), ("preload", preload_plan)):
            ops = _run(cfg, np.random.default_rng(6), rows, shift if shifted else None)
            cases.append(matrix_run_case(cfg, f"{name} early" if shifted else name, ops))
    report = run_cases(MATRIX, cfg, cases, vcd_dir=tmp_path)
    assert [v.value is not None for v in report.verdicts] == [False, False, True, True]
