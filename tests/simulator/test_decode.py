"""The numpy decoder (`simulator.decode`) against the table's scalar one (`isa.decode`): the same instruction, or
the same error, for words of every row with random fields and random stray bits; and the machine's decoded text
(one decode per distinct word, loop ends, illegal words by pc)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from assembler.source import assemble
from isa import INSTRUCTIONS, EncodingError, decode
from simulator import decode as sim_decode
from simulator.dispatch import instruction_unit
from simulator.machine import decode_text


@st.composite
def words(draw: st.DrawFn) -> int:
    """A word of a random row with random field bits, sometimes with one more random bit flipped (a reserved
    bit, another row's opcode, an out-of-range field)."""
    spec = draw(st.sampled_from(INSTRUCTIONS))
    word = spec.match
    for field in spec.fields:
        word |= draw(st.integers(0, (1 << field.width) - 1)) << field.lo
    if draw(st.booleans()):
        word ^= 1 << draw(st.integers(0, 63))
    return word


def _scalar(word: int) -> object:
    try:
        ins = decode(word)
    except EncodingError as err:
        return str(err)
    return ins, instruction_unit(ins)


def _vector(word: int) -> object:
    try:
        return sim_decode._decode_missing([word])[word]
    except EncodingError as err:
        return str(err)


@settings(max_examples=300, deadline=None)
@given(st.lists(words(), min_size=1, max_size=40))
def test_numpy_decode_is_the_scalar_decode(batch: list[int]) -> None:
    scalar = [_scalar(w) for w in batch]
    assert [_vector(w) for w in batch] == scalar
    legal = [w for w, s in zip(batch, scalar, strict=True) if not isinstance(s, str)]
    assert sim_decode._decode_missing(legal) == {w: _scalar(w) for w in legal}  # many words of many rows at once


def test_decoded_text_maps_words_to_pcs_with_loop_ends_and_illegal_words() -> None:
    obj = assemble("li x1, 3\nloopi 4, end\naddi x2, x2, 1\naddi x2, x2, 1\nend: halt\n")
    text = decode_text([*obj.text[:2], 0xFF, *obj.text[2:], obj.text[0]])
    assert [i and i.mnemonic for i in text.instructions] == ["li", "loopi", None, "addi", "addi", "halt", "li"]
    assert text.loop_ends == {1 + 3} and set(text.errors) == {2} and "illegal instruction" in text.errors[2]
    assert text.instructions[0] is text.instructions[6] and text.instructions[3] is text.instructions[4]
