"""The frame of a vector-unit window kernel (depthwise Conv, MaxPool) over the UNPADDED input: no DRAM padding
phase, no DRAM scratch, no copy phase picking output pixels.

A step holds whole channels. Input rows are split by DMA into `sh` row phases (phase p = rows sh*m + p; one
row-strided DMA per phase, uniform across channels because H % sh == 0), each row at pitch W' = sw * OW in local
memory. Output row i, frame column q then reads tap (kh, kw) at phase p(kh), row i + dm(kh), column q + o(kw):
every tap is ONE vector op over the whole [channels, OH, W'] frame, shifted by dm * W' + o. Reads that fall
outside the image (the padding) land on a neighbouring row or channel, or the tile's slack: they are masked,
vertically per frame row (`.vc`, period W': zero weights / the lowest value on rows whose tap row is outside)
and horizontally per frame column (`.vr`, period W'). The kept columns q = sw * j are then compacted by a
masked period-sw reduction (`v.rsum` / `v.rmax`), so the result tile is the dense [channels, OH, OW] output,
stored with one DMA.

Masks (`Mask`) are exact for any input, Inf and NaN included: a sum's mask multiplies the float's BITS by 0 or 1
as int32 (a select: the product is +0.0 or the value itself, never Inf * 0 = NaN); a float max's mask is that
select plus an int32 add of -inf's bits where it is 0; an integer max's is a `v.min` with the lowest value.

Geometries outside this frame (H % sh != 0, OH != H / sh, a pitch sw * OW narrower than the columns read, a
channel that does not fit a buffer slot) return None: the padded-band kernels (`conv_depthwise`,
`pool_vector`) run them.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from fusion.lower.emitter import Emitter, f32_bits
from fusion.lower.views import View
from isa.enums import DType

MAX_PERIOD = (1 << 15) - 1  # the `period` field of a vector instruction
MAX_N = (1 << 16) - 1  # the `n` field


@dataclass(frozen=True)
class Tap:
    phase: int  # the input row phase it reads
    dm: int  # phase rows below the output row
    o: int  # input columns right of the frame column

    def offset(self, pitch: int) -> int:
        return self.dm * pitch + self.o


@dataclass(frozen=True)
class Frame:
    n: int
    c: int
    h: int
    w: int
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[int, int]  # top, left
    out: tuple[int, int]

    @property
    def pitch(self) -> int:
        """W': frame columns per row."""
        return self.strides[1] * self.out[1]

    @property
    def rows(self) -> int:
        """Rows of one input phase (= OH)."""
        return self.h // self.strides[0]

    @property
    def cols(self) -> int:
        """Input columns a row loads: min(W, W')."""
        return min(self.w, self.pitch)

    @property
    def positions(self) -> int:
        """Frame positions of one channel."""
        return self.out[0] * self.pitch

    def taps(self) -> list[Tap]:
        sh = self.strides[0]
        out = []
        for kh in range(self.kernel[0]):
            v = kh * self.dilations[0] - self.pads[0]
            for kw in range(self.kernel[1]):
                out.append(Tap(v % sh, v // sh, kw * self.dilations[1] - self.pads[1]))
        return out

    def slack(self) -> tuple[int, int]:
        """Elements a phase tile needs before and after its data for the taps' shifted reads."""
        offsets = [t.offset(self.pitch) for t in self.taps()]
        return max(0, -min(offsets)), max(0, max(offsets))

    def row_invalid(self, dm: int) -> list[tuple[int, int]]:
        """Output row ranges [a, b) whose tap row (phase row i + dm) is outside the image."""
        r = self.out[0]
        return [(0, max(0, -dm)), (min(r, self.rows - dm), r)]

    def col_invalid(self, o: int) -> list[tuple[int, int]]:
        """Frame column ranges [a, b) whose tap column q + o is outside the image (kept columns only matter,
        masking the others too is harmless)."""
        ranges = []
        if o < 0:
            ranges.append((0, min(self.pitch, -o)))
        if self.w - o < self.pitch:
            ranges.append((max(0, self.w - o), self.pitch))
        return ranges

    def col_mask_needed(self, o: int) -> bool:
        sw = self.strides[1]
        return any(-(-a // sw) * sw < b for a, b in self.col_invalid(o))

    def phase_view(
        self, x: View, img: int, c0: int, kb: int, p: int, first: int = 0, last: int | None = None
    ) -> list[tuple[View, int]]:
        """The DRAM views of phase p of channels [c0, c0 + kb) (one channel: its phase rows [first, last)) and
        their element offsets in the (data part of the) phase tile: rows at pitch W'. When W' > W a row's last
        W' - W elements are the next rows' first ones (masked); the last rows whose W' elements would pass the
        tensor's end (another value's bytes, which a store may be writing) are loaded alone, W elements each."""
        es = x.dtype.size
        sh = self.strides[0]
        last = self.rows if last is None else last
        base = x.index((img,)).slice(0, c0, kb)  # [kb, H, W]
        stride = sh * self.w * es
        start = base.address + p * self.w * es + first * stride
        rows = kb * (last - first)
        end = x.address + sum((n - 1) * s for n, s in zip(x.shape, x.strides, strict=True)) + es
        whole = min(rows, max(0, (end - start - self.pitch * es) // stride + 1))  # rows read whole in bounds
        head = [(View(start, (whole, self.pitch), (stride, es), x.dtype), 0)] if whole else []
        alone = [
            (View(start + r * stride, (1, self.w), (stride, es), x.dtype), r * self.pitch) for r in range(whole, rows)
        ]
        return [*head, *alone]


def lifted(
    n: int,
    c: int,
    spatial: tuple[int, ...],
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    pads: tuple[int, ...],
    out: tuple[int, ...],
) -> Frame:
    """A 1-D or 2-D window's geometry as a Frame (pads: begins then ends), 1-D lifted to height 1; whether the
    frame kernels can run it is `frame_of`'s question."""
    s = len(kernel)
    lift = (1,) * (2 - s)
    return Frame(
        n,
        c,
        *((1, spatial[0]) if s == 1 else spatial),
        kernel=(*lift, *kernel),
        strides=(*lift, *strides),
        dilations=(*lift, *dilations),
        pads=(0, pads[0]) if s == 1 else (pads[0], pads[1]),
        out=(*lift, *out),
    )


def frame_of(
    n: int,
    c: int,
    spatial: tuple[int, ...],
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    pads: tuple[int, ...],
    out: tuple[int, ...],
) -> Frame | None:
    """The frame of a 1-D or 2-D window (pads: begins then ends), or None when it does not apply."""
    if len(kernel) not in (1, 2):
        return None
    f = lifted(n, c, spatial, kernel, strides, dilations, pads, out)
    sh, sw = f.strides
    if f.h % sh or f.out[0] != f.rows:
        return None
    last_col = sw * (f.out[1] - 1) + (f.kernel[1] - 1) * f.dilations[1] - f.pads[1]
    if min(f.w, last_col + 1) > f.pitch:  # a row's columns read do not fit the pitch
        return None
    if f.pitch > MAX_PERIOD or f.out[0] * f.out[1] > MAX_PERIOD:
        return None
    return f


def value_runs(values: np.ndarray) -> list[tuple[int, int, float]]:
    """The runs (start, end, value) of equal consecutive values, for `fill_runs`."""
    edges = np.flatnonzero(np.diff(values)) + 1
    starts, ends = np.concatenate([[0], edges]), np.concatenate([edges, [len(values)]])
    return [(int(a), int(b), float(values[a])) for a, b in zip(starts, ends, strict=True)]


def fill_runs(em: Emitter, dst: int, runs: list[tuple[int, int, float]], dtype: DType) -> None:
    """dst[a:b] = value for each (a, b, value), NaN-safe (an integer multiply by zero clears the bits)."""
    for a, b, value in runs:
        if b <= a:
            continue
        n, addr = b - a, dst + a * dtype.size
        clear = DType.i8 if dtype is DType.i8 else DType.i32
        em.b.v_mul_vs(*em.regs(addr, addr), 0, n, clear.name)
        if value:
            bits = int(value) if dtype is not DType.f32 else f32_bits(value)
            em.b.v_add_vs(*em.regs(addr, addr, bits), n, dtype.name)


def repeat(em: Emitter, dst: int, period: int, count: int, dtype: DType) -> None:
    """dst[0 : period * count] = dst[0:period] repeated, by doubling copies."""
    have = 1
    while have < count:
        k = min(have, count - have)
        em.b.v_copy(*em.regs(dst + have * period * dtype.size, dst), k * period, dtype.name)
        have += k


@dataclass(frozen=True)
class Mask:
    """How masked positions are set: to 0 for a sum (`for_max` False), to the dtype's lowest value for a max.

    Tiles, each `length` elements per repeat: `name` (int32 1 on valid positions, 0 on masked ones; for an integer
    max the dtype's highest / lowest value instead) and, for a float max, `name + "v"` (int32 bits of -inf on
    masked positions, 0 elsewhere)."""

    dtype: DType  # the masked data's dtype
    for_max: bool

    @property
    def integer_max(self) -> bool:
        return self.for_max and self.dtype is not DType.f32

    def sizes(self, name: str, length: int) -> dict[str, int]:
        size = length * (self.dtype.size if self.integer_max else 4)
        return {name: size, name + "v": size} if self.for_max and not self.integer_max else {name: size}

    def build(
        self, em: Emitter, tiles: dict[str, int], name: str, invalid: list[tuple[int, int]], length: int, count: int = 1
    ) -> None:
        """The mask over [0, length) with `invalid` ranges masked, repeated `count` times."""
        if self.integer_max:
            lo, hi = (-128, 127) if self.dtype is DType.i8 else (-(1 << 31), (1 << 31) - 1)
            parts = [(name, self.dtype, hi, lo)]
        else:
            parts = [(name, DType.i32, 1, 0)]
            if self.for_max:
                parts.append((name + "v", DType.i32, 0, f32_bits(-math.inf)))
        for tile, dtype, keep, drop in parts:
            fill_runs(em, tiles[tile], [(0, length, keep)] + [(a, b, drop) for a, b in invalid], dtype)
            repeat(em, tiles[tile], length, count, dtype)

    def apply(
        self, em: Emitter, tiles: dict[str, int], name: str, dst: int, src: int, n: int, period: int, mode: str
    ) -> None:
        """dst[0:n] = src masked; mode "vr" (the mask repeats every `period`) or "vc" (one per `period`)."""
        b = em.b
        if self.integer_max:
            getattr(b, f"v_min_{mode}")(*em.regs(dst, src, tiles[name]), n, period, self.dtype.name)
            return
        getattr(b, f"v_mul_{mode}")(*em.regs(dst, src, tiles[name]), n, period, "i32")
        if self.for_max:
            getattr(b, f"v_add_{mode}")(*em.regs(dst, dst, tiles[name + "v"]), n, period, "i32")


def mask_tap(
    em: Emitter,
    mask: Mask,
    tiles: dict[str, int],
    tap: Tap,
    src: int,
    dst: int,
    n: int,
    pitch: int,
    col_masks: Collection[int],
    row_mask: bool = True,
) -> int:
    """A tap's read of `src` (n elements at its shifted address, frame rows of `pitch`) with the reads outside the
    image masked into `dst`: its row mask (`rm{dm}`, one per frame row; unless `row_mask` is off: folded into
    per-row weights) and its column mask (`cm{o}`, repeating every row). Returns where the masked read is (`src`
    when no mask applies)."""
    if row_mask and tap.dm != 0:
        mask.apply(em, tiles, f"rm{tap.dm}", dst, src, n, pitch, "vc")
        src = dst
    if tap.o in col_masks:
        mask.apply(em, tiles, f"cm{tap.o}", dst, src, n, pitch, "vr")
        src = dst
    return src
