"""`TextCache`: encoded text sections by the digest of everything the words are a function of.

A model's repeated layers generate the same instructions into different programs (other constants, other
kernel metadata), so a caller that builds many programs passes one cache to `ProgramBuilder` and each distinct
text is encoded once; programs with the same text then share one tuple of words. The key (`link.text_key`) is a
BLAKE2b digest of the instructions' rows and operands and of the symbol values they may refer to (labels,
`.equ`s, the data base): equal digests mean equal words. Bounded by entries and words, least recently used out
first; thread-safe.

Data sections are shared the same way (`shared_data`, by their bytes): the schedules of one layer's kernels carry
the same weights (a planner holding every candidate of a ResNet keeps each image once instead of per schedule).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

MAX_TEXTS = 1024
MAX_WORDS = 1 << 21  # words kept (~80 MB as Python ints at most, most of it shared with live programs)
MAX_DATA_BYTES = 1 << 28  # data section bytes kept (shared with the live programs holding them)


class TextCache:
    def __init__(self, max_texts: int = MAX_TEXTS, max_words: int = MAX_WORDS, max_data: int = MAX_DATA_BYTES) -> None:
        if max_texts < 1 or max_words < 1 or max_data < 1:
            raise ValueError("text cache bounds must be positive")
        self.max_texts, self.max_words, self.max_data = max_texts, max_words, max_data
        self.hits = self.misses = 0
        self._texts: OrderedDict[bytes, tuple[int, ...]] = OrderedDict()
        self._words = 0
        self._data: OrderedDict[bytes, bytes] = OrderedDict()
        self._data_bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._texts)

    def get(self, key: bytes) -> tuple[int, ...] | None:
        with self._lock:
            words = self._texts.get(key)
            if words is None:
                self.misses += 1
            else:
                self.hits += 1
                self._texts.move_to_end(key)
            return words

    def put(self, key: bytes, words: tuple[int, ...]) -> tuple[int, ...]:
        """Keep `words` under `key`; returns the words kept (an equal text stored first is shared)."""
        with self._lock:
            kept = self._texts.setdefault(key, words)
            if kept is words:
                self._words += len(words)
            self._texts.move_to_end(key)
            while len(self._texts) > 1 and (len(self._texts) > self.max_texts or self._words > self.max_words):
                _, old = self._texts.popitem(last=False)
                self._words -= len(old)
            return kept

    def shared_data(self, data: bytes) -> bytes:
        """`data`, or an equal data section kept before (one object for equal images); kept least recently used
        out first within `max_data` bytes (a section over the bound alone is not kept)."""
        if not data or len(data) > self.max_data:
            return data
        with self._lock:
            kept = self._data.setdefault(data, data)
            if kept is data:
                self._data_bytes += len(data)
            self._data.move_to_end(data)
            while self._data and self._data_bytes > self.max_data:
                _, old = self._data.popitem(last=False)
                self._data_bytes -= len(old)
            return kept
