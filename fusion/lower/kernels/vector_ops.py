"""Vector-unit building blocks shared by the elementwise, normalization and window kernels.

Each function emits memory-to-memory `v.*` instructions on dense local tiles. On the int8 path a non-linear op
runs on float32: an int8 tile is dequantized exactly as the reference does, f32(q) * f32(scale).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fusion.lower.emitter import Emitter, f32_bits
from isa.enums import DType


def dequantize(em: Emitter, dst: int, src: int, n: int, scale: float) -> None:
    em.b.v_cvt(*em.regs(dst, src), n, "i8", "f32")
    em.b.v_mul_vs(*em.regs(dst, dst, f32_bits(scale)), n, "f32")


def quantize_tile(em: Emitter, dst: int, src: int, n: int, scale: float) -> None:
    """dst[0:n] = the float32 src quantized at `scale` as the reference quantizes: sat8(round_half_even(x *
    f32(1 / scale))) (in place when dst == src: int8 i lands at byte i, read from byte 4i)."""
    em.b.v_qnt(*em.regs(dst, src, f32_bits(1.0 / scale)), n)


def fill(em: Emitter, dst: int, n: int, dtype: DType, value: float) -> None:
    """dst[0:n] = value: clear the bits with an integer multiply by zero, then add the value."""
    if dtype is DType.i8:
        em.b.v_mul_vs(*em.regs(dst, dst), 0, n, "i8")
        if value:
            em.b.v_add_vs(*em.regs(dst, dst, int(value)), n, "i8")
        return
    em.b.v_mul_vs(*em.regs(dst, dst), 0, n, "i32")
    if value:
        em.b.v_add_vs(*em.regs(dst, dst, f32_bits(value)), n, "f32")


def lowest(dtype: DType) -> float:
    """The dtype's lowest value, what a max's padding holds: -128 for int8, -inf for float32."""
    return -128.0 if dtype is DType.i8 else -math.inf


def max_of(em: Emitter, dst: int, sources: Sequence[int], n: int, dtype: DType) -> None:
    """dst[0:n] = the elementwise max of the source tiles, folded in order (a copy of a lone source)."""
    first, *rest = sources
    if not rest:
        em.b.v_copy(*em.regs(dst, first), n, dtype.name)
        return
    em.b.v_max(*em.regs(dst, first, rest[0]), n, dtype.name)
    for src in rest[1:]:
        em.b.v_max(*em.regs(dst, dst, src), n, dtype.name)
