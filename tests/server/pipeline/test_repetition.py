"""The stop rule for replies that repeat themselves, and a looping reply through the pipeline."""

from __future__ import annotations

import pytest

from server.pipeline.chunks import FirstChunkCutter
from server.pipeline.repetition import loop_end


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("Alemanete, açaí, açaí, açaí, açaí, ", "Alemanete, açaí,"),
        ("I like it. I like it. I like it. ", "I like it."),
        ("The cat sat on the mat and the cat sat down. ", None),
        ("No, no, no, that is wrong. ", None),  # three of one word is English
        ("very very very ", None),
        ("one two, one two, One two", None),  # the last word may still grow
        ("one two, one two, One two ", "one two,"),
        ("Portuguese. Thank you, Thank you, Thank you, Thank ", "Portuguese. Thank you,"),
        ("", None),
    ],
)
def test_a_loop_ends_after_its_first_saying(text: str, kept: str | None) -> None:
    end = loop_end(text)
    assert (None if end is None else text[:end]) == kept


def test_the_cutter_keeps_what_was_cut_and_ends_its_buffer_with_the_reply() -> None:
    def split(buffer: str) -> tuple[list[str], str]:
        head, dot, rest = buffer.partition(". ")
        return ([head + "."], rest) if dot else ([], buffer)

    cutter = FirstChunkCutter(split, first_words=20)
    text = "Hello there. Brazil speaks açaí, açaí, açaí, "
    assert cutter.feed(text[:13]) == ["Hello there."]
    cutter.feed(text[13:30])
    end = loop_end(text + "açaí ")
    assert end is not None
    cutter.end_with(text[:end], 30)
    assert cutter.flush() == ["Brazil speaks açaí,"]
