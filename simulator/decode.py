"""A program's words decoded with numpy, one ISA row at a time, and shared across runs.

`isa.decode` takes a few microseconds per word in Python, and a generated kernel's text is about half distinct
words (immediates and addresses), so a planner that simulates hundreds of kernels spends much of its set-up
there. Here each row's words are split into fields with array operations by the rules of `isa.decode` (the
row found by opcode, mask and match; reserved bits clear; signed fields and 32-bit immediates sign-extended;
every value in its field's range and an allowed dtype); a word they do not decode cleanly goes through
`isa.decode` itself, which raises its own error. Decoded words are kept in a bounded table shared by every run
(`DECODE_CACHE_WORDS`): an instruction and its unit are a function of the word alone.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from itertools import islice, repeat

import numpy as np

from isa import INSTRUCTIONS, Instruction, InstructionSpec, Kind, decode
from isa.enums import Unit
from isa.fields import WORD_BITS
from simulator.dispatch import instruction_unit

DECODE_CACHE_WORDS = 1 << 17  # distinct words kept decoded across runs (~40 MB at most)
Decoded = tuple[Instruction, Unit]

_OPCODE_MASK = np.uint64(0xFF)
_WORD_MASK = (1 << WORD_BITS) - 1
_ROWS_BY_OPCODE: dict[int, list[int]] = {}
for _row, _spec in enumerate(INSTRUCTIONS):
    _ROWS_BY_OPCODE.setdefault(_spec.opcode, []).append(_row)

_table: dict[int, Decoded] = {}
_lock = threading.Lock()


def decoded(word: int) -> Decoded:
    """One word's instruction and unit (shared table); EncodingError for an illegal word (never kept)."""
    found = _table.get(word)
    return found if found is not None else decode_words([word])[word]


def decode_words(words: Sequence[int]) -> dict[int, Decoded]:
    """Each distinct word's instruction and unit, from the shared table or decoded now (then kept). Raises
    EncodingError (`isa.decode`'s) for the first illegal word."""
    distinct = list(dict.fromkeys(words))
    known = list(map(_table.get, distinct))
    missing = [w for w, found in zip(distinct, known, strict=True) if found is None]
    if not missing:
        return dict(zip(distinct, known, strict=True))
    fresh = _decode_missing(missing)
    with _lock:
        _table.update(fresh)
        excess = len(_table) - DECODE_CACHE_WORDS
        if excess > 0:  # the oldest entries go first
            for old in list(islice(_table, excess)):
                del _table[old]
    table = dict(zip(distinct, known, strict=True))
    table.update(fresh)  # (the missing words' None replaced)
    return table


def _decode_missing(words: list[int]) -> dict[int, Decoded]:
    """Words by numpy where they decode cleanly, the rest by `isa.decode` (which raises for an illegal one)."""
    try:
        array, fits = np.array(words, dtype=np.uint64), None
    except OverflowError:  # a word outside [0, 2**64): left to isa.decode, which says what is wrong
        fits = np.array([0 <= w <= _WORD_MASK for w in words], dtype=bool)
        array = np.array([w if ok else 0 for w, ok in zip(words, fits.tolist(), strict=True)], dtype=np.uint64)
    rows = _rows(array)
    order = np.argsort(rows, kind="stable")
    ends = np.cumsum(np.bincount(rows + 1, minlength=len(INSTRUCTIONS) + 1))
    clean = np.zeros(len(words), dtype=bool)
    out: dict[int, Decoded] = {}
    for row in np.flatnonzero(np.diff(ends, prepend=0)[1:]).tolist():  # (rows + 1: 0 holds the unmatched)
        at = order[ends[row] : ends[row + 1]]
        spec = INSTRUCTIONS[row]
        values, ok = _fields(spec, array[at])
        if fits is not None:
            ok &= fits[at]
        at = at[ok]
        clean[at] = True
        operands = zip(*(v[ok].tolist() for v in values), strict=True) if spec.fields else repeat((), len(at))
        decoded_row = list(map(Instruction, repeat(spec), operands))
        units = repeat(spec.unit) if spec.unit is not None else map(instruction_unit, decoded_row)
        pairs = zip(decoded_row, units, strict=False)  # (units: repeated when the row has one)
        out.update(zip(array[at].tolist(), pairs, strict=True))  # (dict.update over zips: no loop in Python)
    for i in np.flatnonzero(~clean).tolist():
        ins = decode(words[i])  # raises EncodingError for an illegal word
        out[words[i]] = (ins, instruction_unit(ins))
    return out


def _rows(words: np.ndarray) -> np.ndarray:
    """Each word's row of the table (-1: none), by opcode, mask and match as `isa.decode` looks it up."""
    opcode = (words & _OPCODE_MASK).astype(np.intp)
    rows = np.full(len(words), -1, dtype=np.intp)
    for op in np.unique(opcode).tolist():
        candidates = _ROWS_BY_OPCODE.get(op, ())
        sel = opcode == op
        for row in candidates:
            spec = INSTRUCTIONS[row]
            hit = sel & (rows < 0) & ((words & np.uint64(spec.mask)) == np.uint64(spec.match))
            rows[hit] = row
    return rows


def _fields(spec: InstructionSpec, words: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """The field values (int64 columns) of words of one row, and which words decode cleanly: no reserved bit
    set, every value in range (`check_range`)."""
    ok = (words & np.uint64(~spec.used_mask & _WORD_MASK)) == 0
    values = []
    for field in spec.fields:
        raw = ((words >> np.uint64(field.lo)) & np.uint64((1 << field.width) - 1)).astype(np.int64)
        if field.signed:
            raw = np.where(raw >> (field.width - 1) != 0, raw - (1 << field.width), raw)
        elif field.kind is Kind.imm32:
            raw = np.where(raw >> 31 != 0, raw - (1 << 32), raw)
        lo, hi = field.value_range
        ok &= (raw >= lo) & (raw <= hi)
        if field.name == "dtype" and spec.dtypes:
            ok &= np.isin(raw, [int(d) for d in spec.dtypes])
        values.append(raw)
    return values, ok
