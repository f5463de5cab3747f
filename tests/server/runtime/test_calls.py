"""The calls waiting for their output (server/runtime/calls.py) and calls in history
(server/runtime/history.py): I/O-free, no asyncio."""

from __future__ import annotations

from server.runtime.calls import CallState, PendingCalls
from server.runtime.history import CacheClass, History, Role
from server.runtime.tools import FunctionCall


def test_a_call_waits_until_its_output_an_interruption_or_its_deadline() -> None:
    calls = PendingCalls("s" * 32)
    calls.made("a", deadline_ms=1000.0)
    calls.made("b", deadline_ms=2000.0)
    assert calls.waiting == ("a", "b")
    assert calls.answered("a") and calls.state("a") is CallState.ANSWERED
    assert calls.reply_wanted()
    assert calls.due(1999.0) == ()
    assert calls.due(2000.0) == ("b",) and calls.state("b") is CallState.TIMED_OUT
    assert calls.due(5000.0) == ()  # timed out once


def test_an_output_nobody_waits_for_any_more_wants_no_reply_until_another_item() -> None:
    calls = PendingCalls()
    calls.made("a", 1000.0)
    assert calls.interrupted("the user spoke") == ("a",)
    assert calls.interrupted("again") == ()
    assert not calls.answered("a")  # late: kept by the caller, but ...
    assert not calls.reply_wanted()  # ... the response.create after it starts nothing
    calls.other_item()
    assert calls.reply_wanted()
    assert not calls.answered("never-made") and not calls.reply_wanted()
    calls.made("b", 1000.0)  # a new call: the conversation goes on
    assert calls.reply_wanted()


def test_history_keeps_calls_and_outputs_in_order_and_words_before_their_calls() -> None:
    history = History("persona", max_turns=10)
    history.add_user_item("What time is it?", 0, "item_1")
    call = FunctionCall("call_1", "get_time", "{}")
    # the reply said "Let me check." and called; the call is recorded as it is made, the
    # words once heard, and the output may come before they are
    history.add_call(call, 0, "item_3", made_by="item_2")
    history.add_call_output("call_1", "14:05", 0, "item_4")
    history.commit_agent_text(0, "Let me check.", item_id="item_2")
    roles = [(t.role, t.text, t.call is not None) for t in history.turns]
    assert roles == [
        (Role.USER, "What time is it?", False),
        (Role.ASSISTANT, "Let me check.", False),
        (Role.ASSISTANT, "", True),
        (Role.TOOL, "14:05", False),
    ]
    history.commit_agent_text(0, "It is five past two.", item_id="item_5")  # the answer
    assert history.turns[-1].text == "It is five past two."
    context = history.context(10_000)
    assert [e.cache_class for e in context][:1] == [CacheClass.ANCHOR]
    assert context[3].call == call and context[4].call_id == "call_1"
    assert history.call("call_1") is not None and history.call("call_2") is None


def test_a_full_history_forgets_its_oldest_turn_to_put_words_before_a_call() -> None:
    history = History("persona", max_turns=2)
    history.add_user_item("Lamp red.", 0, "item_1")
    history.add_call(FunctionCall("c", "set_lamp", '{"color": "red"}'), 0, "item_3", "item_2")
    history.commit_agent_text(0, "Sure.", item_id="item_2")
    assert [t.text for t in history.turns] == ["Sure.", ""]
