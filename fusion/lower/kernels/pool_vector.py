"""MaxPool on the vector unit over bands of the padded input, with no window copies: each kernel tap is one
`v.max` of the whole [channels, band] tile shifted by the tap's offset (the scheme of `conv_depthwise`), the
output pixels then picked from the DRAM scratch by a copy phase."""

from __future__ import annotations

from dataclasses import dataclass

from fusion.lower.context import LowerContext
from fusion.lower.emitter import Emitter, Step
from fusion.lower.kernels.conv_depthwise import band_phases, band_positions, tap_slack
from fusion.lower.kernels.conv_geometry import ConvGeometry
from fusion.lower.kernels.vector_ops import max_of
from fusion.lower.views import View
from isa.enums import DType


def max_pool_phases(
    cx: LowerContext, g: ConvGeometry, padded: View, out: View, scratch: int
) -> list[list[Step]] | None:
    """`padded` holds the input padded with the dtype's lowest value; None when no band fits (or the output is
    stored in another dtype than the input)."""
    if out.dtype is not padded.dtype:
        return None
    es = out.dtype.size

    def sizes(kb: int, rows: int) -> list[int]:
        n = kb * band_positions(g, rows)
        return [(n + tap_slack(g)) * es, n * es]

    def step(c0: int, k: int, p: int, tiles: list[int]) -> tuple[list, _MaxBody, int]:
        return [], _MaxBody(g, out.dtype, k * p, tiles[0], tiles[1]), tiles[1]

    return band_phases(cx, g, padded, out, scratch, sizes, step)


@dataclass(frozen=True)
class _MaxBody:
    g: ConvGeometry
    dtype: DType
    n: int
    x: int
    result: int

    def __call__(self, em: Emitter) -> None:
        offsets = [self.g.offset(*divmod(t, self.g.kernel[1])) * self.dtype.size for t in range(self.g.taps)]
        max_of(em, self.result, [self.x + off for off in offsets], self.n, self.dtype)
