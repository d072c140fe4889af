"""`TextCache`: encoded text sections by the digest of everything the words are a function of.

A model's repeated layers generate the same instructions into different programs (other constants, other
kernel metadata), so a caller that builds many programs passes one cache to `ProgramBuilder` and each distinct
text is encoded once; programs with the same text then share one tuple of words. The key (`link.text_key`) is a
BLAKE2b digest of the instructions' rows and operands and of the symbol values they may refer to (labels,
`.equ`s, the data base): equal digests mean equal words. Bounded by entries and words, least recently used out
first; thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

MAX_TEXTS = 1024
MAX_WORDS = 1 << 21  # words kept (~80 MB as Python ints at most, most of it shared with live programs)


class TextCache:
    def __init__(self, max_texts: int = MAX_TEXTS, max_words: int = MAX_WORDS) -> None:
        if max_texts < 1 or max_words < 1:
            raise ValueError("text cache bounds must be positive")
        self.max_texts, self.max_words = max_texts, max_words
        self.hits = self.misses = 0
        self._texts: OrderedDict[bytes, tuple[int, ...]] = OrderedDict()
        self._words = 0
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
