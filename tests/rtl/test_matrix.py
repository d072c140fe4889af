"""The matrix unit (PE array + skew/de-skew) against the simulator's matmul semantics and timing."""

from __future__ import annotations

import numpy as np
import pytest

from isa import DType
from rtl.replay import run_cases
from rtl.stimulus import matmul_case, preload_case
from rtl.units import MATRIX
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
