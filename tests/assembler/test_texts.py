"""`TextCache`: a text many programs repeat is held once (one tuple), and a program whose words differ (an
operand, a symbol's value) never takes another's words."""

from __future__ import annotations

import numpy as np
import pytest

from assembler import AssemblyError, ProgramBuilder, TextCache
from assembler.texts import SAMPLE


def _program(texts: TextCache | None, imm: int = 7, data: int = 1, pad: int = 4, kernel: str = "k") -> ProgramBuilder:
    """A kernel reading a data label; `data` changes only the data contents, `pad` the label's address."""
    b = ProgramBuilder(data_base=0, texts=texts)
    with b.kernel(kernel, inputs=[("t", "i8", (4,), "table")]):
        b.li(1, "table")
        b.addi(2, 1, imm)
        b.label(".Lloop")
        b.beq(2, 0, ".Lloop")
        b.halt()
    b.data()
    b.zero(pad)
    b.label("table")
    b.i8(np.full(4, data, dtype=np.int8))
    return b


def test_a_repeated_text_is_shared() -> None:
    texts = TextCache()
    first = _program(texts).build()
    second = _program(texts, data=2, kernel="other").build()  # other constants and metadata, the same text
    assert (texts.misses, texts.hits) == (1, 1) and second.text is first.text
    assert second == _program(None, data=2, kernel="other").build() and second.data != first.data


@pytest.mark.parametrize("change", [{"imm": -2}, {"imm": 6}, {"pad": 8}])
def test_a_program_whose_words_differ_misses(change: dict) -> None:
    texts = TextCache()
    _program(texts, imm=-1).build()  # hash(-1) == hash(-2) in CPython: texts are told apart by value
    built = _program(texts, **change).build()
    assert texts.hits == 0 and built.text == _program(None, **change).build().text


def test_a_text_with_errors_is_not_kept_and_fails_every_time() -> None:
    texts = TextCache()
    for _ in range(2):
        b = ProgramBuilder(texts=texts)
        b.addi(1, 2, 1 << 40)
        with pytest.raises(AssemblyError, match="out of range"):
            b.build()
    assert len(texts) == 0


def test_bounded_by_texts_and_words_least_recently_used_first() -> None:
    texts = TextCache(max_texts=2, max_words=10)
    a, b, c, d = tuple(range(1, 4)), tuple(range(4, 5)), tuple(range(5, 6)), tuple(range(10))  # (not constants)
    texts.shared_text(a)
    texts.shared_text(b)
    assert texts.shared_text(tuple(range(1, 4))) is a  # a hit: a is the most recently used
    texts.shared_text(c)  # three texts: b (least recently used) goes
    assert texts.shared_text(tuple(range(4, 5))) is not b and len(texts) == 2  # b kept anew; a went
    texts.shared_text(d)  # c, b and d: 12 words, over 10: c then b go
    assert len(texts) == 1 and texts.shared_text(tuple(range(10))) is d
    assert (texts.hits, texts.misses) == (2, 5)
    with pytest.raises(ValueError, match="positive"):
        TextCache(max_texts=0)


def test_equal_data_sections_are_one_object_and_bounded() -> None:
    texts = TextCache(max_data=8)
    first, second = _program(texts).build(), _program(texts, imm=3).build()  # other words, the same data
    assert second.data is first.data and second.text != first.text
    third = _program(texts, data=2).build()
    assert third.data == _program(None, data=2).build().data and third.data is not first.data

    def fresh(text: bytes) -> bytes:  # an equal bytes object that is not the literal
        return bytes(bytearray(text))

    big = fresh(b"x" * 9)
    assert texts.shared_data(big) is big and texts.shared_data(fresh(big)) is not big  # over the bound: not kept
    assert texts.shared_data(fresh(third.data)) is third.data  # and nothing was evicted for it
    kept = fresh(b"ab")
    assert texts.shared_data(kept) is kept and texts.shared_data(fresh(b"ab")) is kept
    assert texts.shared_data(fresh(third.data)) is not third.data  # evicted for "ab": over 8 bytes together


def test_data_sections_that_sample_alike_are_told_apart() -> None:
    """A section's key hashes a sample of its bytes; sections equal there but not elsewhere stay apart."""
    texts = TextCache()
    base = bytes(4 * SAMPLE)
    other = base[:1] + b"\x01" + base[2:]  # differs at byte 1, outside the sample (every SAMPLE-th byte)
    assert base[::SAMPLE] == other[::SAMPLE]
    assert texts.shared_data(base) is base and texts.shared_data(other) is other
    assert texts.shared_data(bytes(bytearray(other))) is other and texts.shared_data(bytes(len(base))) is base
