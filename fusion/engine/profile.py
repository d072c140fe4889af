"""Runtime data analysis: a cheap, sampled profile of each live tensor.

A profile holds what decides which kernel fits the data: shape and dtype (the guard), the fraction of zeros
and of all-zero tiles at the matrix unit's tile size (whether zero-tile skipping pays), the value range (whether
the int8 scales still fit) and a coarse histogram. Large tensors are profiled on a row sample; everything is
vectorised numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HIST_BINS = 8
SAMPLE_ROWS = 256
SPARSE_TILE_FRACTION = 0.25  # at least this fraction of all-zero tiles: the "sparse" data class


@dataclass(frozen=True)
class TensorProfile:
    shape: tuple[int, ...]
    dtype: str
    zero_fraction: float
    zero_tile_fraction: float  # all-zero (tile x tile) blocks of the tensor seen as a matrix (rows, last dim)
    min: float
    max: float
    histogram: tuple[int, ...]  # HIST_BINS counts over [min, max] of the sample

    @property
    def sparsity(self) -> str:
        """The data class a kernel is specialised for: "sparse" when zero-tile skipping can pay."""
        return "sparse" if self.zero_tile_fraction >= SPARSE_TILE_FRACTION else "dense"

    @property
    def max_abs(self) -> float:
        return max(abs(self.min), abs(self.max))


def as_matrix(x: np.ndarray) -> np.ndarray:
    """The tensor as rows x last dim (how the matrix unit reads an activation)."""
    if x.ndim == 0:
        return x.reshape(1, 1)
    return x.reshape(-1, x.shape[-1])


def zero_tile_fraction(x: np.ndarray, tile: int) -> float:
    """Fraction of all-zero tile x tile blocks (edge blocks, partly outside the tensor, count as blocks). Exact;
    a tensor with fewer zeros than its smallest block holds no all-zero block and is answered from one count
    (the dispatch table asks this of every GEMM group's dense operand on every call)."""
    m = as_matrix(x)
    if m.size == 0:
        return 0.0
    smallest = (m.shape[0] % tile or tile) * (m.shape[1] % tile or tile)
    if m.size - np.count_nonzero(m) < smallest:
        return 0.0
    nonzero = m != 0
    bands = np.logical_or.reduceat(nonzero, np.arange(0, nonzero.shape[0], tile), axis=0)
    blocks = np.logical_or.reduceat(bands, np.arange(0, nonzero.shape[1], tile), axis=1)
    return float(1.0 - blocks.mean())


def data_class(x: np.ndarray, tile: int) -> tuple[str, float]:
    """(sparsity class, zero-tile fraction) only: the cheap check the dispatch table runs on every call."""
    fraction = zero_tile_fraction(x, tile)
    return ("sparse" if fraction >= SPARSE_TILE_FRACTION else "dense"), fraction


def _sample(x: np.ndarray, tile: int, rng: np.random.Generator) -> np.ndarray:
    """Whole tile-row bands of the matrix view, so tile statistics stay unbiased."""
    m = as_matrix(x)
    bands = -(-m.shape[0] // tile)
    if m.shape[0] <= SAMPLE_ROWS:
        return m
    keep = np.sort(rng.choice(bands, size=max(1, SAMPLE_ROWS // tile), replace=False))
    rows = (keep[:, None] * tile + np.arange(tile)[None, :]).reshape(-1)
    return m[rows[rows < m.shape[0]]]


def profile_tensor(x: np.ndarray, tile: int, seed: int = 0) -> TensorProfile:
    """Profile one tensor; `tile` is the matrix unit's array size."""
    array = np.asarray(x)
    sample = _sample(array, tile, np.random.default_rng(seed))
    finite = (sample[np.isfinite(sample)] if sample.dtype.kind == "f" else sample.reshape(-1)).astype(np.float64)
    lo = float(finite.min()) if finite.size else 0.0
    hi = float(finite.max()) if finite.size else 0.0
    top = hi if hi > lo else lo + max(1.0, abs(lo))  # (float64: a float32 range near 3.4e38 has room to widen)
    hist, _ = np.histogram(finite, bins=HIST_BINS, range=(lo, top))
    return TensorProfile(
        shape=tuple(int(d) for d in array.shape),
        dtype=str(array.dtype),
        zero_fraction=float(np.mean(sample == 0)) if sample.size else 0.0,
        zero_tile_fraction=zero_tile_fraction(sample, tile),
        min=lo,
        max=hi,
        histogram=tuple(int(c) for c in hist),
    )
