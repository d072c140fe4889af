"""`TextCache`: text and data sections shared by the programs of one model.

A model's repeated layers generate the same instructions into different programs (other constants, other
kernel metadata), and the schedules of one layer's kernels carry the same weights: a caller that builds many
programs passes one cache to `ProgramBuilder`, and programs with an equal text (data section) then hold one
tuple of words (one bytes object), so a planner holding every candidate of a ResNet keeps each once instead of
per schedule. Texts are looked up by the encoded words themselves (a tuple hash and, on a hit, an equality
test: exact), after encoding: a digest of the operands taken before encoding, to skip the encoder on a hit,
cost a planner more than it saved (a third of the encoder's time per program, for 2-7% of texts found).
Bounded by entries and words (bytes), least recently used out first; thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

MAX_TEXTS = 1024
MAX_WORDS = 1 << 21  # words kept (~80 MB as Python ints at most, most of it shared with live programs)
MAX_DATA_BYTES = 1 << 28  # data section bytes kept (shared with the live programs holding them)
SAMPLE = 257  # a data section's bytes its key hashes: every SAMPLE-th (`_Section`)


class TextCache:
    def __init__(self, max_texts: int = MAX_TEXTS, max_words: int = MAX_WORDS, max_data: int = MAX_DATA_BYTES) -> None:
        if max_texts < 1 or max_words < 1 or max_data < 1:
            raise ValueError("text cache bounds must be positive")
        self.max_texts, self.max_words, self.max_data = max_texts, max_words, max_data
        self.hits = self.misses = 0
        self._texts: OrderedDict[tuple[int, ...], tuple[int, ...]] = OrderedDict()  # a text -> itself
        self._words = 0
        self._data: OrderedDict[_Section, bytes] = OrderedDict()
        self._data_bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._texts)

    def shared_text(self, words: tuple[int, ...]) -> tuple[int, ...]:
        """`words`, or an equal text kept before (one tuple for equal texts); kept least recently used out first
        within `max_texts` texts and `max_words` words (the newest is kept even over the bound alone)."""
        with self._lock:
            kept = self._texts.setdefault(words, words)
            if kept is words:
                self.misses += 1
                self._words += len(words)
            else:
                self.hits += 1
            self._texts.move_to_end(kept)
            while len(self._texts) > 1 and (len(self._texts) > self.max_texts or self._words > self.max_words):
                old, _ = self._texts.popitem(last=False)
                self._words -= len(old)
            return kept

    def shared_data(self, data: bytes) -> bytes:
        """`data`, or an equal data section kept before (one object for equal images); kept least recently used
        out first within `max_data` bytes (a section over the bound alone is not kept)."""
        if not data or len(data) > self.max_data:
            return data
        key = _Section(data)
        with self._lock:
            kept = self._data.setdefault(key, data)
            if kept is data:
                self._data_bytes += len(data)
            self._data.move_to_end(key)
            while self._data and self._data_bytes > self.max_data:
                _, old = self._data.popitem(last=False)
                self._data_bytes -= len(old)
            return kept


class _Section:
    """A data section as a key of `TextCache._data`: hashed by its length and every SAMPLE-th byte, equal by all
    of its bytes (hashing every byte of a model's sections, megabytes of weights each, cost a planner more than
    the rest of their sharing; sections of one length that sample alike are then told apart by comparing them,
    which stops at their first difference)."""

    __slots__ = ("data", "_hash")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._hash = hash((len(data), data[::SAMPLE]))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Section) and self.data == other.data
