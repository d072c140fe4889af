"""Vector-unit building blocks shared by the elementwise, normalization and window kernels.

Each function emits memory-to-memory `v.*` instructions on dense local tiles. On the int8 path a non-linear op
runs on float32: an int8 tile is dequantized exactly as the reference does, f32(q) * f32(scale).
"""

from __future__ import annotations

from fusion.lower.emitter import Emitter, f32_bits
from isa.enums import DType


def dequantize(em: Emitter, dst: int, src: int, n: int, scale: float) -> None:
    em.b.v_cvt(*em.regs(dst, src), n, "i8", "f32")
    em.b.v_mul_vs(*em.regs(dst, dst, f32_bits(scale)), n, "f32")


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
