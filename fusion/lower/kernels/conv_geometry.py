"""A Conv's geometry over its padded input, 1-D convs lifted to 2-D with height 1: what the implicit GEMM
(`fusion.engine.codegen.conv`) and the depthwise vector kernel (`conv_depthwise`) both compute positions from.

The implicit GEMM's channels-last schedule (`codegen.conv_packed`) instead reads the input rewritten by row
phase (`positions`, `phase_rows`, `phase_width`, `row_phase`) and computes only the pixels it keeps, plus a few
past each output row's end. The band schedule and the depthwise kernel compute over the padded width: output
row r of a band starts at r * stride_h * W' (one padded input row per vertical stride step), and tap (kh, kw)
reads the input `offset(kh, kw)` positions further on, so a tap over a whole band is one contiguous run; of each
output row's computed positions every stride_w-th is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusion.graph.ir import Graph, Node


@dataclass(frozen=True)
class ConvGeometry:
    n: int
    c: int
    cout: int
    groups: int
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    padded: tuple[int, int]  # H', W' of the padded input
    out: tuple[int, int]

    @property
    def cg(self) -> int:
        return self.c // self.groups

    @property
    def coutg(self) -> int:
        return self.cout // self.groups

    @property
    def taps(self) -> int:
        return self.kernel[0] * self.kernel[1]

    @property
    def span(self) -> int:
        """Padded input rows one output row reads."""
        return (self.kernel[0] - 1) * self.dilations[0] + 1

    @property
    def pitch(self) -> int:
        """Computed positions per output row: one padded input row per vertical stride step."""
        return self.strides[0] * self.padded[1]

    @property
    def valid(self) -> int:
        """Computed positions of an output row up to its last pixel (every stride_w-th kept)."""
        return (self.out[1] - 1) * self.strides[1] + 1

    @property
    def cols(self) -> int:
        """Positions of one output row in a DRAM scratch (every stride_w-th kept)."""
        return self.strides[1] * self.out[1]

    def stream_rows(self, rows: int) -> int:
        """Computed positions of a band of `rows` output rows, up to its last pixel."""
        return (rows - 1) * self.pitch + self.valid

    def in_rows(self, rows: int) -> int:
        """Padded input rows a band of `rows` output rows reads."""
        return (rows - 1) * self.strides[0] + self.span

    @property
    def positions(self) -> int:
        """Channels-last schedule (`codegen.conv_packed`): positions computed per output row, stride_w apart (the
        first `out[1]` kept)."""
        return -(-self.padded[1] // self.strides[1])

    @property
    def phase_rows(self) -> int:
        """Channels-last schedule: padded input rows per row phase (row h is row h // stride_h of phase
        h % stride_h)."""
        return -(-self.padded[0] // self.strides[0])

    @property
    def phase_width(self) -> int:
        """Channels-last schedule: positions per input row, a multiple of stride_w (extra ones only ever read by
        positions past an output row's last pixel)."""
        return self.positions * self.strides[1]

    def row_phase(self, kh: int) -> tuple[int, int]:
        """Channels-last schedule: (row phase, rows past the output row) of the input row kernel row kh reads."""
        return divmod(kh * self.dilations[0], self.strides[0])[::-1]

    def offset(self, kh: int, kw: int) -> int:
        """How far past an output position tap (kh, kw) reads, in padded input positions."""
        return kh * self.dilations[0] * self.padded[1] + kw * self.dilations[1]


def conv_geometry(graph: Graph, node: Node, padded_shape: tuple[int, ...]) -> ConvGeometry:
    """The geometry of a 1-D or 2-D Conv whose padded input has `padded_shape` (N, C, spatial...)."""
    x, w = graph.types[node.inputs[0]].shape, graph.types[node.inputs[1]].shape
    lift = (1,) * (4 - len(w))
    return ConvGeometry(
        x[0],
        x[1],
        w[0],
        node.attr("group"),
        (*lift, *w[2:]),
        (*lift, *node.attr("strides")),
        (*lift, *node.attr("dilations")),
        (*lift, *padded_shape[2:]),
        (*lift, *graph.types[node.outputs[0]].shape[2:]),
    )
