"""A MaxPool taken into the Conv kernel before it (ResNet's stem: Conv + ReLU + MaxPool): computed on chip from
the Conv's drained rows where the schedule keeps a spare bank for the pooled rows in flight (`RowPool`: the Conv's
output never reaches DRAM), else read from the Conv's channels-last output scratch instead of from an NCHW tensor
in DRAM (`pool_steps`, below).

The Conv schedules drain [pixels, Cout] tiles to a DRAM scratch and then bring it back as NCHW; the unfused MaxPool
reads that NCHW tensor again, pads it, stores every computed position and picks the output pixels by a copy (the
stem at 224 in int8: 0.8 MB written as NCHW, then 1.0 MB for the pool). Here the pool reads the scratch directly.
For horizontal stride s, the input columns a tap reads for consecutive output columns are s apart: a strided DMA
(row stride s x C) brings one column phase of an input row as a dense [positions, C] tile, channels last, so each
kernel tap (kh, kw) is ONE `v.max` of a whole phase tile shifted by whole rows of C elements (no channel mixes
with another, no position is computed and dropped). Columns outside the image are filled with the dtype's lowest
value (as the reference pads) and rows outside it are skipped. One step per output row stores the [OW', C] result
to a pooled channels-last scratch, which the Conv's transposing loads then bring to NCHW (`conv.to_nchw`): 1/s^2
of the bytes they moved before. A max commutes with the int8 requantization (monotone): bit-exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fusion.engine.codegen.gemm import k_slices
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.emitter import Emitter, Step
from fusion.lower.kernels.vector_ops import fill, lowest, max_of
from fusion.lower.kernels.windows import Window, window_of
from fusion.lower.local_alloc import TileArena, largest_fitting
from fusion.lower.views import View
from isa.enums import DType, Unit
from simulator.config import MachineConfig


def split_pool(nodes: Sequence[Node]) -> tuple[Sequence[Node], Node | None]:
    """The Conv's drained nodes and the trailing MaxPool the kernel pools its output with (None: no pool)."""
    if nodes[-1].op != OpType.MaxPool:
        return nodes, None
    return nodes[:-1], nodes[-1]


def pooled_bytes(graph: Graph, pool: Node, dtype: DType) -> int:
    """The pooled channels-last scratch: every image's output pixels x channels (computed on chip, `RowPool`:
    its rows stride_w x as wide)."""
    return int(np.prod(graph.types[pool.outputs[0]].shape)) * window_of(graph, pool).strides[-1] * dtype.size


@dataclass(frozen=True)
class _Columns:
    """One column phase of the kernel's taps: input column s * (q + a) + phase for output column q and tap
    offset a (tile row q + a - first); `taps`: the (a - first) of the kw taps in this phase."""

    phase: int
    taps: tuple[int, ...]


@dataclass(frozen=True)
class PoolGeometry:
    w: Window
    first: int  # the smallest tap offset a (in strides; negative with left padding)
    span: int  # rows of a phase tile: OW' + the taps' offset range
    phases: tuple[_Columns, ...]

    @staticmethod
    def of(graph: Graph, pool: Node) -> PoolGeometry:
        w = window_of(graph, pool)
        if w.s != 2 or len(pool.outputs) != 1:
            raise CodegenError(f"node {pool.name!r}: the Conv kernel pools 2-D MaxPools with one output only")
        (_, kw), (_, sw), (_, dw), left = w.kernel, w.strides, w.dilations, w.pads[1]
        offsets = [divmod(t * dw - left, sw) for t in range(kw)]
        first = min(a for a, _ in offsets)
        phases = tuple(
            _Columns(p, tuple(a - first for a, q in offsets if q == p)) for p in sorted({q for _, q in offsets})
        )
        g = PoolGeometry(w, first, w.out_spatial[1] + max(a for a, _ in offsets) - first, phases)
        g.check()
        return g

    def check(self) -> None:
        """Every output pixel reads at least one row and one column inside the image (else the reference's max is
        over padding only)."""
        w = self.w
        for axis in (0, 1):
            at = np.arange(w.out_spatial[axis])[:, None] * w.strides[axis]
            at = at + np.arange(w.kernel[axis]) * w.dilations[axis] - w.pads[axis]
            if not ((at >= 0) & (at < w.in_shape[2 + axis])).any(axis=1).all():
                raise CodegenError("a MaxPool window reading only padding is not pooled in the Conv kernel")

    def rows(self, r: int) -> list[int]:
        """The input rows inside the image that output row r reads."""
        (kh, _), (sh, _), (dh, _) = self.w.kernel, self.w.strides, self.w.dilations
        return [h for t in range(kh) if 0 <= (h := r * sh + t * dh - self.w.pads[0]) < self.w.in_shape[2]]

    def band_rows(self, r0: int, count: int) -> list[int]:
        """The input rows inside the image that output rows [r0, r0 + count) read, in order."""
        return sorted({h for r in range(r0, r0 + count) for h in self.rows(r)})

    def inside(self, phase: int) -> tuple[int, int]:
        """The tile rows [lo, hi) of a phase whose input columns are inside the image."""
        sw, width = self.w.strides[1], self.w.in_shape[3]
        lo = max(0, -self.first)
        hi = min(self.span, (width - 1 - phase) // sw - self.first + 1)
        return lo, max(lo, hi)


def pool_steps(cfg: MachineConfig, g: PoolGeometry, src: View, dst: View, rotation: int) -> list[Step]:
    """src [n, H * W, C] -> dst [n, OH' * OW', C], both channels-last: one step per band of output rows, each
    input row the band reads loaded once (one DMA per column phase) and max-reduced over its column taps once
    (separable: then each output row is the max of its rows' reductions)."""
    n, _, c = src.shape
    dt, (oh, ow), es = src.dtype, g.w.out_spatial, src.dtype.size
    probe = TileArena(cfg, 0)

    def sizes(rows: int) -> list[int]:
        inputs = max(len(g.band_rows(r0, min(rows, oh - r0))) for r0 in range(0, oh, rows))
        return [g.span * c * es] * (inputs * len(g.phases)) + [ow * c * es] * (inputs + rows)

    rows = largest_fitting(oh, lambda r: probe.fits(sizes(r)))  # fewer input rows read twice
    if rows == 0:
        raise CodegenError(f"one pooled row's phase tiles of {c} channels do not fit a buffer slot")
    steps = []
    for img in range(n):
        image = src.index((img,))
        for r0, count in k_slices(oh, rows):
            arena = TileArena(cfg, len(steps), rotation)
            inputs = g.band_rows(r0, count)
            tiles = {h: [arena.tile(g.span * c * es) for _ in g.phases] for h in inputs}
            reduced = {h: arena.tile(ow * c * es) for h in inputs}
            result = arena.tile(count * ow * c * es)
            loads, pads = [], []
            for h in inputs:
                for col, tile in zip(g.phases, tiles[h], strict=True):
                    lo, hi = g.inside(col.phase)
                    start = h * g.w.in_shape[3] + g.w.strides[1] * (lo + g.first) + col.phase
                    if hi > lo:
                        loads.append((image.slice(0, start, hi - lo, g.w.strides[1]), tile + lo * c * es))
                    pads += [(tile, lo * c), (tile + hi * c * es, (g.span - hi) * c)]
            maxes = [
                (
                    reduced[h],
                    tuple(tile + a * c * es for col, tile in zip(g.phases, tiles[h], strict=True) for a in col.taps),
                )
                for h in inputs
            ]
            maxes += [
                (result + i * ow * c * es, tuple(reduced[h] for h in g.rows(r)))
                for i, r in enumerate(range(r0, r0 + count))
            ]
            body = _MaxBand(dt, ow * c, tuple((t, k) for t, k in pads if k), tuple(maxes))
            steps.append(
                Step(loads, [(Unit.vector, body)], [(result, dst.index((img,)).slice(0, r0 * ow, count * ow))])
            )
    return steps


@dataclass(frozen=True)
class _MaxBand:
    """Fill the padding columns with the lowest value, then each (destination, sources): the max of the sources
    (n elements each), in order (the input rows' reductions before the output rows that read them)."""

    dtype: DType
    n: int
    pads: tuple[tuple[int, int], ...]
    maxes: tuple[tuple[int, tuple[int, ...]], ...]

    def __call__(self, em: Emitter) -> None:
        for tile, count in self.pads:
            fill(em, tile, count, self.dtype, lowest(self.dtype))
        for dst, sources in self.maxes:
            max_of(em, dst, sources, self.n, self.dtype)


@dataclass(frozen=True)
class RowPool:
    """The MaxPool computed on chip from the Conv's drained rows, so the Conv's output never reaches DRAM.

    Each drained output row [OW, tn] (pixel-major, one Cout tile) is max-reduced over the pool's column taps at
    EVERY column j, P[j] = max over taps t of row[j + t * dw - left] (taps outside the image skipped): each tap is
    one `v.max` of a contiguous run shifted by whole pixels, no strided access. Output column q is P[q * sw], so
    the kept columns are picked by the transposing loads to NCHW (`conv.to_nchw` with step sw), which read only
    them. Vertically, every pooled row's running max V[p] lives in a ring of tiles that persists across bands
    (`ring` per Cout tile, in the spare bank): a Conv row starting a pooled row is reduced straight into it, a
    later one maxed into it, and the pooled row's last Conv row stores it, `pitch` = sw * OW' pixels wide (its
    columns past the Conv's are never picked). The ring is long enough that a tile is rewritten only DEPTH steps
    after the step storing it (`run_pipeline`'s credits order the two)."""

    g: PoolGeometry
    height: int  # the Conv's output rows (the pool's input)
    width: int  # the Conv's output columns
    pitch: int  # pixels of a pooled row in the scratch: sw * OW'
    ring: int  # pooled rows in flight per Cout tile

    @staticmethod
    def of(g: PoolGeometry, images: int, rows: int, steps_per_band: int, depth: int) -> RowPool:
        """The pool of `images` Conv outputs computed in bands of `rows` rows, `steps_per_band` steps each."""
        (oh, ow), sw = g.w.out_spatial, g.w.strides[1]
        height, width = g.w.in_shape[2], g.w.in_shape[3]
        per_image = -(-height // rows)  # bands of one image: its rows [0, rows), [rows, 2 rows), ...
        spans = [(img, g.rows(p)) for img in range(images) for p in range(oh)]
        first = [img * per_image + hs[0] // rows for img, hs in spans]  # the band (over images) of each
        last = [img * per_image + hs[-1] // rows for img, hs in spans]
        ring = 1
        while any((first[i + ring] - last[i]) * steps_per_band < depth for i in range(len(spans) - ring)):
            ring += 1
        return RowPool(g, height, width, sw * ow, ring)

    def contributions(self, h: int) -> list[tuple[int, bool, bool]]:
        """(pooled row, first, last) for every pooled row Conv row h belongs to."""
        (kh, _), (sh, _), (dh, _) = self.g.w.kernel, self.g.w.strides, self.g.w.dilations
        found = []
        for t in range(kh):
            p, r = divmod(h + self.g.w.pads[0] - t * dh, sh)
            if r == 0 and 0 <= p < self.g.w.out_spatial[0]:
                rows = self.g.rows(p)
                found.append((p, h == rows[0], h == rows[-1]))
        return sorted(found)

    def column_taps(self) -> list[tuple[int, int, int]]:
        """(first column j, columns, shift d) of each column tap: P[j] = max(P[j], row[j + d]) over its run, the
        widest run first (it initialises P by a copy)."""
        (_, kw), (_, dw), left = self.g.w.kernel, self.g.w.dilations, self.g.w.pads[1]
        runs = []
        for t in range(kw):
            d = t * dw - left
            lo, hi = max(0, -d), min(self.pitch, self.width - d)
            if hi > lo:
                runs.append((lo, hi - lo, d))
        return sorted(runs, key=lambda r: -r[1])

    def tile_bytes(self, tn: int, dtype: DType) -> int:
        return self.pitch * tn * dtype.size

    def emit_row(self, em: Emitter, row: int, dst: int, tn: int, dtype: DType) -> None:
        """dst[j] (pitch pixels of tn channels) = the max over the column taps of row[j + d]: the widest tap
        copied, the columns it leaves filled with the lowest value, then a `v.max` per other tap."""
        es, (lo, count, d), *rest = dtype.size, *self.column_taps()
        em.b.v_copy(*em.regs(dst + lo * tn * es, row + (lo + d) * tn * es), count * tn, dtype.name)
        for a, b in ((0, lo), (lo + count, self.pitch)):
            if b > a:
                fill(em, dst + a * tn * es, (b - a) * tn, dtype, lowest(dtype))
        for lo, count, d in rest:
            at = dst + lo * tn * es
            em.b.v_max(*em.regs(at, at, row + (lo + d) * tn * es), count * tn, dtype.name)
