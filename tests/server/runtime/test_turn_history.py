from __future__ import annotations

import pytest

from server.clock import FakeClock
from server.errors import InvalidTransition
from server.runtime.history import CacheClass, History, Role
from server.runtime.turn import TRANSITIONS, TurnDeadlines, TurnMachine, TurnState


def test_every_state_has_a_way_back_to_listening() -> None:
    for state, targets in TRANSITIONS.items():
        assert targets, state
        assert state is TurnState.LISTENING or TurnState.LISTENING in targets


def test_turn_machine_logs_and_rejects(caplog: pytest.LogCaptureFixture) -> None:
    machine = TurnMachine("abcdef0123", FakeClock(), TurnDeadlines(1000, 1000, 1000))
    with caplog.at_level("INFO"):
        machine.to(TurnState.USER_SPEAKING, "speech started")
    assert "listening -> user_speaking (speech started)" in caplog.text
    with pytest.raises(InvalidTransition):
        machine.to(TurnState.AGENT_SPEAKING, "nope")
    assert machine.state is TurnState.USER_SPEAKING


def test_context_has_anchor_recent_window_and_current() -> None:
    history = History("persona", max_turns=10, count_tokens=lambda t: len(t.split()))
    history.set_user_text("one two")
    history.end_user_turn(0)
    history.commit_agent_text(0, "three four five")
    history.commit_agent_text(0, "six")
    history.set_user_text("seven eight")
    history.end_user_turn(0)
    history.set_user_text("nine")  # the turn in progress
    context = history.context(budget_tokens=8)
    assert context[0].cache_class is CacheClass.ANCHOR and context[0].text == "persona"
    recent = [e for e in context if e.cache_class is CacheClass.RECENT]
    assert [e.text for e in recent] == ["one two", "three four five six", "seven eight"]
    assert context[-1].cache_class is CacheClass.CURRENT and context[-1].text == "nine"
    # the window slides: 8 tokens no longer fit in 6, and it keeps what fits in half of 6
    recent = [e for e in history.context(budget_tokens=6) if e.cache_class is CacheClass.RECENT]
    assert [e.text for e in recent] == ["seven eight"]


def test_the_recent_window_keeps_its_start_until_the_turns_no_longer_fit() -> None:
    """The prompt before the newest turns stays the one the engine cached: the window moves
    on in steps of half its budget, not a turn at a time."""
    history = History("persona", max_turns=100, count_tokens=lambda t: len(t.split()))
    windows = []
    for n in range(1, 10):
        history.add_user_item(f"turn {n} words", 0, f"item-{n}")  # 3 tokens each
        recent = [e.text for e in history.context(10) if e.cache_class is CacheClass.RECENT]
        windows.append([int(text.split()[1]) for text in recent])
    assert windows == [
        [1], [1, 2], [1, 2, 3],
        [4], [4, 5], [4, 5, 6],  # 12 tokens > 10: only what fits in 5 is kept
        [7], [7, 8], [7, 8, 9],
    ]  # fmt: skip
    # a turn longer than half the budget is still kept when it fits the whole
    history.add_user_item("one two three four five six seven eight", 0, "long")
    recent = [e.text for e in history.context(10) if e.cache_class is CacheClass.RECENT]
    assert recent == ["one two three four five six seven eight"]


def test_anchor_is_pinned_even_with_zero_budget() -> None:
    history = History("persona", max_turns=10)
    history.set_user_text("hello")
    history.end_user_turn(0)
    assert [e.role for e in history.context(budget_tokens=0)] == [Role.SYSTEM]


def test_agent_text_of_a_new_epoch_starts_a_new_turn() -> None:
    history = History("p", max_turns=3)
    history.commit_agent_text(0, "old reply", truncated=True)
    history.commit_agent_text(1, "new reply")
    assert [t.text for t in history.turns] == ["old reply", "new reply"]
    assert history.turns[0].truncated and not history.turns[1].truncated
    for n in range(5):
        history.commit_agent_text(2 + n, f"r{n}")
    assert len(history.turns) == 3  # bounded


def test_the_recent_window_moves_on_in_a_step_when_the_history_forgets_its_first_turn() -> None:
    history = History("persona", max_turns=6, count_tokens=lambda t: len(t.split()))
    windows = []
    for n in range(1, 12):
        history.add_user_item(f"turn {n}", 0, f"item-{n}")  # the budget is never the limit
        recent = [e.text for e in history.context(1000) if e.cache_class is CacheClass.RECENT]
        windows.append([int(text.split()[1]) for text in recent])
    assert windows == [
        [1], [1, 2], [1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6],
        [5, 6, 7],  # turn 1 is forgotten: half of the 6 turns the history keeps
        [5, 6, 7, 8], [5, 6, 7, 8, 9], [5, 6, 7, 8, 9, 10],
        [9, 10, 11],
    ]  # fmt: skip


def test_make_room_moves_the_window_on_before_the_next_turn_would_push_it_over() -> None:
    """In the quiet after a reply the window moves on if it is nearly full, so that the user's
    next turn does not move it while the reply waits."""
    history = History("persona", max_turns=100, count_tokens=lambda t: len(t.split()))
    for n in range(1, 5):
        history.add_user_item(f"turn {n} words", 0, f"item-{n}")  # 12 tokens of 16
    assert not history.make_room(16)  # 14 of 16 may be used before it moves
    assert [t.seq for t in history.recent_window(16)] == [1, 2, 3, 4]
    history.add_user_item("turn 5 words", 0, "item-5")  # 15: less than 2 left
    assert [t.seq for t in history.recent_window(16)] == [1, 2, 3, 4, 5]  # still fits
    assert history.make_room(16)
    assert [t.seq for t in history.recent_window(16)] == [4, 5]  # what fits in 8
    history.add_user_item("turn 6 words", 0, "item-6")
    assert [t.seq for t in history.recent_window(16)] == [4, 5, 6]  # the start stays
