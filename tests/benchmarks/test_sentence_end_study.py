"""The offline study of the words at a pause: its labelled sets and the rules it compares."""

from __future__ import annotations

from benchmarks.sentence_end_study import decide, labelled_sets
from server.conversation.unfinished import Bars


def test_the_labelled_sets_are_distinct_and_sized_as_documented() -> None:
    sets = labelled_sets()
    sizes = {name: (len(c), len(u)) for name, (c, u) in sets.items()}
    assert sizes == {"first": (40, 40), "second": (30, 30), "held_out": (20, 20)}
    said = [text for c, u in sets.values() for text in [*c, *(a for a, _ in u)]]
    assert len(said) == len(set(said))  # no sentence in two sets


def test_each_rule_decides_on_what_it_reads() -> None:
    bars = Bars(alone=0.2, with_model=0.05)

    def row(unsure: float, sure: float, words: str, p: float) -> dict[str, object]:
        return {"smart_turn": {60.0: unsure, 200.0: sure}, "words": words, "sentence_end": p}

    question = row(0.3, 0.4, "How far away is the moon?", 0.6)  # Smart Turn: unfinished
    assert not decide(question, "model and marks", bars, 0.9)
    assert decide(question, "llm", bars, 0.9) and decide(question, "llm alone", bars, 0.9)
    fragment = row(0.95, 0.95, "How many people live in?", 0.0)  # Smart Turn: complete
    assert decide(fragment, "model and marks", bars, 0.9)
    assert not decide(fragment, "llm", bars, 0.9)
    fair = row(0.3, 0.96, "Can you help me plan a picnic?", 0.1)  # complete at 200 ms
    assert decide(fair, "llm", bars, 0.9) and not decide(fair, "llm alone", bars, 0.9)
    # "Could you explain why the..." heard as "... why that?", "the" weighed in its place
    misheard = row(0.95, 0.95, "Could you explain why that?", 0.9) | {"rivals": [["the", 0.1]]}
    assert decide(misheard, "llm", bars, 0.9)
    assert not decide(misheard, "llm and last word", bars, 0.9)
    assert decide(question | {"rivals": [["there", 0.1]]}, "llm and last word", bars, 0.9)
