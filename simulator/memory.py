"""DRAM, scratchpad and accumulator as numpy byte arrays, with checked address resolution.

Every access goes through `local()` or `dram_rows()`, which enforce range, alignment and the
accumulator's 4-byte entries, and report which banks an access touches (a bit mask over scratchpad
banks then accumulator banks) so the timing engine can arbitrate them.
"""

from __future__ import annotations

import numpy as np

from assembler.objfile import ObjectFile
from isa.enums import DType
from isa.errors import DynfuseError
from isa.memory_map import ACC_ELEMENT_BYTES, LOCAL_ACC_BASE
from simulator.config import MachineConfig
from simulator.errors import Fault

# numpy element type by DType value (an instruction's dtype field), without an enum call per instruction built
NUMPY_DTYPES: tuple[np.dtype, ...] = tuple(DType(v).numpy for v in range(len(DType)))
RESOLVED_ACCESSES = 4096  # distinct (address, count, dtype) local accesses kept resolved (then cleared)


class Memory:
    def __init__(self, cfg: MachineConfig, obj: ObjectFile, values: bool = True) -> None:
        """`values` False (a run without values, `Machine.values`): the data section is checked but not copied in
        (nothing reads DRAM's values; a planning kernel's weights are megabytes)."""
        self.cfg = cfg
        self.dram = np.zeros(cfg.dram_bytes, dtype=np.uint8)
        self.spad = np.zeros(cfg.spad_bytes, dtype=np.uint8)
        self.acc = np.zeros(cfg.acc_bytes, dtype=np.uint8)
        end = obj.data_base + len(obj.data)
        if obj.data_base < 0 or end > cfg.dram_bytes:
            raise DynfuseError(
                f"data section [{obj.data_base}, {end}) does not fit the {cfg.dram_bytes}-byte DRAM "
                f"of config {cfg.name!r}"
            )
        if values:
            self.dram[obj.data_base : end] = np.frombuffer(obj.data, dtype=np.uint8)
        self._spad_bytes = cfg.spad_bytes
        self._acc_bytes = cfg.acc_bytes
        self._spad_bank_bytes = cfg.spad_bank_bytes
        self._acc_bank_bytes = cfg.acc_bank_bytes
        self._acc_bank0 = cfg.spad_banks
        self.banks_of_mask: dict[int, tuple[int, ...]] = {}  # see `banks`
        self.resolved: dict[tuple[int, int, np.dtype], tuple[np.ndarray, int, bool, int, int]] = {}  # see `local`
        self._strided: dict[tuple[int, int, int, int, np.dtype, bool], tuple[np.ndarray, int, bool, np.ndarray]] = {}
        # one typed view of each local memory per element type: an access is then a single slice
        self._typed = {
            (is_acc, np.dtype(d.numpy)): (self.acc if is_acc else self.spad).view(d.numpy)
            for is_acc in (False, True)
            for d in DType
        }

    def local(self, addr: int, count: int, dtype: np.dtype) -> tuple[np.ndarray, int, bool, int, int]:
        """A typed view of `count` elements at local address `addr`: (view, bank mask, is_acc, shadow offset, bytes).
        Resolved accesses are kept (a kernel touches few distinct buffers, each many times); the view is of the
        memory itself, so a kept one reads and writes what a new one would."""
        key = (addr, count, dtype)
        found = self.resolved.get(key)
        if found is not None:
            return found
        found = self._resolve(addr, count, dtype)
        if len(self.resolved) >= RESOLVED_ACCESSES:
            self.resolved.clear()
        self.resolved[key] = found
        return found

    def _resolve(self, addr: int, count: int, dtype: np.dtype) -> tuple[np.ndarray, int, bool, int, int]:
        size = dtype.itemsize
        nbytes = count * size
        if addr >= 0 and addr + nbytes <= self._spad_bytes:
            off, bank_bytes, bank0, is_acc = addr, self._spad_bank_bytes, 0, False
        elif addr >= LOCAL_ACC_BASE and addr - LOCAL_ACC_BASE + nbytes <= self._acc_bytes:
            off, bank_bytes, bank0, is_acc = addr - LOCAL_ACC_BASE, self._acc_bank_bytes, self._acc_bank0, True
            if size != ACC_ELEMENT_BYTES:
                raise Fault(f"accumulator holds 4-byte elements; {dtype} access at {addr:#x} is not allowed")
        else:
            raise Fault(
                f"local access of {nbytes} bytes at {addr:#x} is outside the scratchpad "
                f"[0, {self._spad_bytes:#x}) and the accumulator "
                f"[{LOCAL_ACC_BASE:#x}, {LOCAL_ACC_BASE + self._acc_bytes:#x})"
            )
        if off % size:
            raise Fault(f"misaligned local access: address {addr:#x} is not a multiple of {size} ({dtype})")
        typed = self._typed.get((is_acc, dtype))
        if typed is None:
            raise Fault(f"local memory holds i8, i32 or f32 elements, not {dtype}")
        first = off // size
        view = typed[first : first + count]
        if nbytes == 0:
            return view, 0, is_acc, off, 0
        mask = ((2 << ((off + nbytes - 1) // bank_bytes)) - (1 << (off // bank_bytes))) << bank0
        return view, mask, is_acc, off + self._spad_bytes if is_acc else off, nbytes

    def local_rows(
        self, addr: int, rows: int, count: int, stride: int, dtype: np.dtype, write: bool = False
    ) -> tuple[np.ndarray, int, bool, np.ndarray]:
        """A (rows, count) typed view of rows `stride` bytes apart from local address `addr` (the matrix unit's
        strided A operand; `write`: a strided drain's output, whose rows may not overlap): (view, mask of the banks
        the rows touch, is_acc, shadow offsets of exactly the bytes accessed). The rows' span is checked as one
        access; kept resolved like `local`."""
        key = (addr, rows, count, stride, dtype, write)
        found = self._strided.get(key)
        if found is not None:
            return found
        size = dtype.itemsize
        if stride < 0 or stride % size:
            raise Fault(f"row stride {stride} of a local access must be a non-negative multiple of {size} ({dtype})")
        if write and stride < count * size:
            raise Fault(f"row stride {stride} of a local write overlaps its rows of {count * size} bytes")
        span, _, is_acc, shadow, _ = self._resolve(addr, (rows - 1) * (stride // size) + count, dtype)
        view = np.lib.stride_tricks.as_strided(span, shape=(rows, count), strides=(stride, size), writeable=write)
        starts = shadow + stride * np.arange(rows)
        first = starts - (self._spad_bytes if is_acc else 0)  # offsets within the scratchpad or accumulator
        bank_bytes, bank0 = (self._acc_bank_bytes, self._acc_bank0) if is_acc else (self._spad_bank_bytes, 0)
        lo, hi = first // bank_bytes, (first + count * size - 1) // bank_bytes  # each row's first and last bank
        mask = int(np.bitwise_or.reduce((np.left_shift(2, hi) - np.left_shift(1, lo)) << bank0))
        found = view, mask if count else 0, is_acc, (starts[:, None] + np.arange(count * size)).ravel()
        if len(self._strided) >= RESOLVED_ACCESSES:
            self._strided.clear()
        self._strided[key] = found
        return found

    def banks(self, mask: int) -> tuple[int, ...]:
        """The bank ids of a mask (cached: programs use few distinct masks)."""
        banks = self.banks_of_mask.get(mask)
        if banks is None:
            banks = self.banks_of_mask[mask] = tuple(b for b in range(mask.bit_length()) if mask >> b & 1)
        return banks

    def dram_rows(self, addr: int, rows: int, row_bytes: int, stride: int, align: int) -> np.ndarray:
        """A (rows, row_bytes) uint8 view of a strided DRAM region."""
        self.check_dram_rows(addr, rows, row_bytes, stride, align)
        if rows == 0 or row_bytes == 0:
            return self.dram[0:0].reshape(rows, row_bytes)
        end = addr + (rows - 1) * stride + row_bytes
        if stride == row_bytes:
            return self.dram[addr:end].reshape(rows, row_bytes)
        if stride > row_bytes and addr + rows * stride <= self.cfg.dram_bytes:
            return self.dram[addr : addr + rows * stride].reshape(rows, stride)[:, :row_bytes]
        return np.lib.stride_tricks.as_strided(self.dram[addr:], shape=(rows, row_bytes), strides=(stride, 1))

    def check_dram_rows(self, addr: int, rows: int, row_bytes: int, stride: int, align: int) -> None:
        """The faults of `dram_rows` (a run without values makes no view: `simulator.dispatch.TIMED`)."""
        if addr < 0 or stride < 0:
            raise Fault(f"negative DRAM address {addr} or stride {stride}")
        if addr % align or stride % align:
            raise Fault(f"misaligned DRAM access: address {addr:#x} and stride {stride} must be multiples of {align}")
        if rows == 0 or row_bytes == 0:
            return
        end = addr + (rows - 1) * stride + row_bytes
        if end > self.cfg.dram_bytes:
            raise Fault(f"DRAM access [{addr:#x}, {end:#x}) is outside the {self.cfg.dram_bytes:#x}-byte DRAM")

    def dram_word(self, addr: int) -> np.ndarray:
        """The 4-byte int32 view at `addr` (scalar `lw`/`sw`/`dispatch`)."""
        if addr < 0 or addr + 4 > self.cfg.dram_bytes:
            raise Fault(f"DRAM word access at {addr:#x} is outside the {self.cfg.dram_bytes:#x}-byte DRAM")
        if addr % 4:
            raise Fault(f"misaligned DRAM word access at {addr:#x}")
        return self.dram[addr : addr + 4].view(np.int32)
