"""What the store path computes besides the copy: the zero-tile count of `dma.stz`."""

from __future__ import annotations

import numpy as np


def zero_tiles(block: np.ndarray, n: int) -> int:
    """All-zero n x n tiles of a rows x cols block, tiled from its first row and column; edge tiles (partly outside
    the block) count as tiles. Zero means == 0, so an f32 -0.0 is zero and a NaN is not."""
    if block.size == 0:
        return 0
    nonzero = block != 0
    bands = np.logical_or.reduceat(nonzero, np.arange(0, block.shape[0], n), axis=0)
    tiles = np.logical_or.reduceat(bands, np.arange(0, block.shape[1], n), axis=1)
    return int(tiles.size - np.count_nonzero(tiles))
