"""Seeded calibration inputs with tile-structured sparsity (whole all-zero tiles, what zero-skip kernels skip)."""

from __future__ import annotations

import numpy as np

SPARSITY_LEVELS = (0.0, 0.0, 0.25, 0.5, 0.9)  # dense twice as often: most activations are dense


def sparse_input(rng: np.random.Generator, shape: tuple[int, ...], level: float, tile: int) -> np.ndarray:
    """Standard-normal data with each `tile` x `tile` tile of the last two dims zeroed with probability `level`."""
    data = rng.standard_normal(shape).astype(np.float32)
    if level <= 0:
        return data
    flat = data.reshape(-1, shape[-1]) if data.ndim != 1 else data.reshape(1, -1)
    rows, cols = flat.shape
    keep = rng.random((-(-rows // tile), -(-cols // tile))) >= level
    mask = np.repeat(np.repeat(keep, tile, axis=0), tile, axis=1)[:rows, :cols]
    return (flat * mask).reshape(shape)
