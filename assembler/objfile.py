"""The assembled program as plain data: what the binary format stores and the simulator loads.

Text is a tuple of encoded 64-bit words; decoding is `isa.decode`. Text
addresses are instruction indices; data addresses are DRAM byte addresses.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from isa import DType, Extension, Instruction, decode


class Section(enum.Enum):
    text = "text"
    data = "data"


@dataclass(frozen=True)
class Symbol:
    name: str
    section: Section
    value: int  # instruction index (text) or DRAM byte address (data)


MAX_TENSOR_RANK = 32  # dimensions of a kernel tensor (numpy holds at most 64)


@dataclass(frozen=True)
class TensorDecl:
    """A kernel input or output living in DRAM."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    address: int  # DRAM byte address, row-major dense

    @property
    def nbytes(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count * self.dtype.size


@dataclass(frozen=True)
class KernelMeta:
    """A `.kernel` block: its text range and the guard metadata the fusion engine dispatches on."""

    name: str
    start: int  # first instruction index
    end: int  # one past the last instruction index
    inputs: tuple[TensorDecl, ...] = ()
    outputs: tuple[TensorDecl, ...] = ()
    attrs: tuple[tuple[str, str], ...] = ()  # e.g. ("sparsity", "dense"), ("config", "<hash>")

    def attr(self, key: str, default: str | None = None) -> str | None:
        return dict(self.attrs).get(key, default)


@dataclass(frozen=True)
class ObjectFile:
    text: tuple[int, ...]
    data: bytes = b""
    data_base: int = 0
    symbols: tuple[Symbol, ...] = ()
    kernels: tuple[KernelMeta, ...] = ()
    _decoded: list[Instruction] = field(default_factory=list, init=False, repr=False, compare=False)

    def instructions(self) -> list[Instruction]:
        """Decoded text (cached); raises EncodingError on an invalid word."""
        if len(self._decoded) != len(self.text):
            self._decoded[:] = [decode(word) for word in self.text]
        return self._decoded

    def extensions(self) -> set[Extension]:
        return {instruction.spec.extension for instruction in self.instructions()}

    def symbol(self, name: str) -> Symbol:
        for sym in self.symbols:
            if sym.name == name:
                return sym
        raise KeyError(name)
