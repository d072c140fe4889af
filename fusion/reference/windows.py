"""Sliding windows over the spatial axes of an N,C,spatial... array: the im2col step of conv and pooling."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def windows(
    x: np.ndarray,
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    pads: tuple[int, ...],
    out: tuple[int, ...],
    fill: float,
) -> np.ndarray:
    """Array [N, C, *out, *kernel] of the window elements, padded with `fill` (also past the end for ceil_mode)."""
    n = len(kernel)
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    widths = [(0, 0), (0, 0)]
    for i in range(n):
        need = (out[i] - 1) * strides[i] + spans[i]
        widths.append((pads[i], max(pads[n + i], need - x.shape[2 + i] - pads[i])))
    xp = np.pad(x, widths, constant_values=fill)
    view = sliding_window_view(xp, spans, axis=tuple(range(2, 2 + n)))
    picks = (
        (slice(None), slice(None))
        + tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(out, strides, strict=True))
        + tuple(slice(None, None, d) for d in dilations)
    )
    return view[picks]
