"""Scalar-core arithmetic on 32-bit registers held as signed Python ints in [-2^31, 2^31)."""

from __future__ import annotations

import struct
from collections.abc import Callable

from simulator.errors import Fault

_MASK = 0xFFFFFFFF
_SIGN = 0x80000000


def wrap32(value: int) -> int:
    """Two's-complement wrap of any Python int to a signed 32-bit value."""
    return ((value + _SIGN) & _MASK) - _SIGN


def unsigned32(value: int) -> int:
    return value & _MASK


def f32_from_bits(value: int) -> float:
    """Reinterpret a register's 32 bits as an IEEE fp32 number (how f32 scalar operands are passed)."""
    return struct.unpack("<f", struct.pack("<I", value & _MASK))[0]


def bits_from_f32(value: float) -> int:
    return wrap32(struct.unpack("<I", struct.pack("<f", value))[0])


def _div(a: int, b: int) -> int:
    if b == 0:
        raise Fault("division by zero")
    q = abs(a) // abs(b)
    return wrap32(q if (a < 0) == (b < 0) else -q)


def _rem(a: int, b: int) -> int:
    if b == 0:
        raise Fault("division by zero")
    r = abs(a) % abs(b)
    return r if a >= 0 else -r


ALU: dict[str, Callable[[int, int], int]] = {
    "add": lambda a, b: wrap32(a + b),
    "sub": lambda a, b: wrap32(a - b),
    "and": lambda a, b: wrap32(a & b),
    "or": lambda a, b: wrap32(a | b),
    "xor": lambda a, b: wrap32(a ^ b),
    "sll": lambda a, b: wrap32(a << (b & 31)),
    "srl": lambda a, b: wrap32((a & _MASK) >> (b & 31)),
    "sra": lambda a, b: a >> (b & 31),
    "mul": lambda a, b: wrap32(a * b),
    "div": _div,
    "rem": _rem,
    "slt": lambda a, b: int(a < b),
    "sltu": lambda a, b: int((a & _MASK) < (b & _MASK)),
}

BRANCH_CONDITIONS: dict[str, Callable[[int, int], bool]] = {
    "beq": lambda a, b: a == b,
    "bne": lambda a, b: a != b,
    "blt": lambda a, b: a < b,
    "bge": lambda a, b: a >= b,
    "bltu": lambda a, b: (a & _MASK) < (b & _MASK),
    "bgeu": lambda a, b: (a & _MASK) >= (b & _MASK),
}
