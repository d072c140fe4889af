"""Closed sets of names the ISA encodes as small integers.

Each enum's integer values are part of the binary encoding: never renumber a
member, only append.
"""

from __future__ import annotations

import enum

import numpy as np


class DType(enum.IntEnum):
    """Element types of tensors in DRAM, scratchpad, accumulator and vector registers."""

    i8 = 0
    i32 = 1
    f32 = 2

    @property
    def numpy(self) -> np.dtype:
        return _NUMPY[self]

    @property
    def size(self) -> int:
        return _NUMPY[self].itemsize


_NUMPY = {DType.i8: np.dtype(np.int8), DType.i32: np.dtype(np.int32), DType.f32: np.dtype(np.float32)}


class Unit(enum.IntEnum):
    """Functional units; each has its own in-order instruction queue."""

    scalar = 0
    load = 1
    matrix = 2
    vector = 3
    store = 4


UNIT_SHORT_NAMES: dict[str, Unit] = {
    "sc": Unit.scalar,
    "ld": Unit.load,
    "mx": Unit.matrix,
    "vx": Unit.vector,
    "st": Unit.store,
}


class Extension(enum.Enum):
    """ISA extensions; a program can be checked for which ones it uses."""

    base = "base"
    fusion = "fusion"


class Activation(enum.IntEnum):
    """Activation applied by the fused matmul epilogue."""

    none = 0
    relu = 1
    gelu = 2
    tanh = 3
    sigmoid = 4


class EpilogueFlags(enum.IntEnum):
    """Which optional operands the fused epilogue reads. Bit 0: a per-column bias; bit 1: a residual; bit 2
    (`pc`): a per-column requantizer, i.e. rs3 holds the local address of a table of (mult, shift) int32 pairs,
    one per column (per-output-channel int8), instead of one multiplier."""

    none = 0
    bias = 1
    res = 2
    bias_res = 3
    pc = 4
    bias_pc = 5
    res_pc = 6
    bias_res_pc = 7


class Counter(enum.IntEnum):
    """Performance counters readable by `rdcnt`; names match the simulator's counter dict."""

    cycle = 0
    instret = 1
    dram_read_bytes = 2
    dram_write_bytes = 3
    macs = 4
    vector_elem_ops = 5
    matrix_busy = 6
    vector_busy = 7
    load_busy = 8
    store_busy = 9
