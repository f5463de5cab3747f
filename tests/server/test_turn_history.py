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
    context = history.context(budget_tokens=6)
    assert context[0].cache_class is CacheClass.ANCHOR and context[0].text == "persona"
    recent = [e for e in context if e.cache_class is CacheClass.RECENT]
    # the window slides: the oldest turn (2 tokens) no longer fits in 6
    assert [e.text for e in recent] == ["three four five six", "seven eight"]
    assert context[-1].cache_class is CacheClass.CURRENT and context[-1].text == "nine"


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
