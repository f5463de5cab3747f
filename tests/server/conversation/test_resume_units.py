"""Resume, piece by piece, on a fake clock: tokens, the event outlet, a detached
conversation's deadlines, the registry's resume window."""

from __future__ import annotations

from typing import Any

import pytest

from server.clock import FakeClock
from server.config import load_config
from server.conversation.conversation import Conversation
from server.conversation.resume import ResumeTicket, Resumption, split_token
from server.errors import BadRequest, NotFound, ResumeExpired, ResumeRefused
from server.http.registry import SessionRegistry
from server.metrics import Metrics
from server.runtime.turn import TurnState
from server.wire.outlet import MAX_PENDING, Outlet, event_number
from tests.support.detectors import deaf_detector


class Link:
    """A transport stand-in: its channel is open or not."""

    def __init__(self, open_: bool = True) -> None:
        self.open = open_
        self.sent: list[dict[str, Any]] = []

    def send(self, event: dict[str, Any]) -> bool:
        if self.open:
            self.sent.append(event)
        return self.open

    def media_ms(self) -> float | None:
        return None


def test_a_token_works_once_and_names_its_session() -> None:
    ticket = ResumeTicket("w1-abc")
    token = ticket.issue()
    session_id, secret = split_token(token)
    assert session_id == "w1-abc" and len(secret) >= 32  # 192 bits, URL-safe base64
    assert not ticket.redeem(secret[:-1] + ("A" if secret[-1] != "A" else "B"))
    assert ticket.redeem(secret)
    assert not ticket.redeem(secret)  # used up
    ticket.reinstate(secret)  # its connection could not be made: valid again
    newer = ticket.issue()
    assert not ticket.redeem(secret) and ticket.redeem(split_token(newer)[1])
    for bad in ("", "no-dot", ".secret", "id.", "x" * 300 + ".y"):
        with pytest.raises(BadRequest):
            split_token(bad)


def test_events_wait_for_a_link_and_come_in_order_after_session_created() -> None:
    outlet = Outlet()
    for i in range(3):
        outlet.send({"type": "e", "i": i})
    link = Link(open_=False)
    outlet.attach(link)
    outlet.send({"type": "e", "i": 3})
    assert link.sent == []
    link.open = True
    outlet.open({"type": "session.created"}, None)
    assert [e.get("i") for e in link.sent] == [None, 0, 1, 2, 3]
    outlet.send({"type": "e", "i": 4})
    assert link.sent[-1]["i"] == 4 and not outlet.pending
    link.open = False  # the path looks dead: the link takes nothing and the events wait
    outlet.send({"type": "e", "i": 5})
    assert link.sent[-1]["i"] == 4 and outlet.flush() == 1
    link.open = True  # it recovers: the next flush hands them over, in order
    assert outlet.flush() == 0 and link.sent[-1]["i"] == 5
    outlet.attach(None)
    for i in range(MAX_PENDING + 10):
        outlet.send({"type": "e", "i": i})
    assert len(outlet.pending) == MAX_PENDING and outlet.pending[0]["i"] == 10  # bounded


async def test_a_detached_conversation_waits_and_its_deadlines_wait_too() -> None:
    clock = FakeClock(1_000.0)
    config = load_config()
    detector = deaf_detector()
    conversation = Conversation("s" * 32, config, detector, None, Metrics(), clock=clock)
    link = Link()
    conversation.attach(link)
    conversation.link_open(audio=True, video=False, resumed=None, dialect="native")
    created = link.sent[0]
    assert created["type"] == "session.created" and created["resumed"] is False
    assert created["session"]["resume_token"].startswith("s" * 32 + ".")
    conversation.session.submit_text("hello")  # thinking: its deadline runs
    assert conversation.session.state is TurnState.THINKING
    conversation.detach(link)
    assert not conversation.attached and conversation.detached_since_ms == 1_000.0
    clock.advance(config.runtime.thinking_timeout_ms + 5_000)
    await conversation.enforce_deadline()  # nobody to tell: the deadline waits
    assert conversation.session.state is TurnState.THINKING
    conversation.emit({"type": "kept"})
    again = Link()
    conversation.attach(again)
    assert conversation.session.overdue() is None  # the time away did not count
    conversation.link_open(audio=True, video=False, resumed=Resumption(), dialect="native")
    assert [e["type"] for e in again.sent] == ["session.created", "kept"]
    assert again.sent[0]["resumed"] is True
    assert again.sent[0]["session"]["resume_token"] != created["session"]["resume_token"]
    clock.advance(config.runtime.thinking_timeout_ms)
    assert conversation.session.overdue() is not None
    await conversation.close()


async def test_the_registry_ends_a_conversation_its_client_did_not_resume() -> None:
    clock = FakeClock(0.0)
    config = load_config(overrides={"session.resume_window_s": "30"})
    registry = SessionRegistry(config, lambda: None, None, Metrics(), clock=clock)  # type: ignore[arg-type,return-value]
    detector = deaf_detector()
    conversation = Conversation("c" * 32, config, detector, None, Metrics(), clock=clock)
    registry.conversations[conversation.session_id] = conversation
    link = Link()
    conversation.attach(link)
    conversation.link_open(audio=True, video=False, resumed=None, dialect="native")
    token = link.sent[0]["session"]["resume_token"]
    conversation.detach(link)
    clock.advance(29_999)
    assert registry.expired() == []
    clock.advance(1)
    assert registry.expired() == [conversation.session_id]
    await registry.close(conversation.session_id)
    with pytest.raises(ResumeExpired):
        await registry.resume(token, "v=0")
    with pytest.raises(NotFound):
        await registry.resume("d" * 32 + ".secret", "v=0")


async def test_a_wrong_token_changes_nothing() -> None:
    config = load_config()
    registry = SessionRegistry(config, lambda: None, None, Metrics())  # type: ignore[arg-type,return-value]
    detector = deaf_detector()
    conversation = Conversation("e" * 32, config, detector, None, Metrics())
    registry.conversations[conversation.session_id] = conversation
    link = Link()
    conversation.attach(link)
    conversation.link_open(audio=True, video=False, resumed=None, dialect="native")
    token = link.sent[0]["session"]["resume_token"]
    with pytest.raises(ResumeRefused):
        await registry.resume(conversation.session_id + ".not-the-secret", "v=0")
    assert conversation.attached and split_token(token)[0] == conversation.session_id
    assert conversation.ticket.redeem(split_token(token)[1])  # still valid
    await conversation.close()


def test_a_new_link_gets_session_created_before_what_the_old_one_left_untaken() -> None:
    outlet = Outlet()
    old = Link()
    outlet.attach(old)
    outlet.open({"type": "session.created", "n": 1}, lambda e: [{**e, "ga": True}])
    old.open = False  # the path died: these were translated for it but never taken
    outlet.send({"type": "e", "i": 0})
    outlet.send({"type": "e", "i": 1})
    new = Link()
    outlet.attach(new)
    outlet.open({"type": "session.created", "n": 2}, lambda e: [{**e, "ga": True}])
    assert [(e["type"], e.get("n", e.get("i"))) for e in new.sent] == [
        ("session.created", 2),
        ("e", 0),
        ("e", 1),
    ]
    assert all(e["ga"] for e in new.sent)


def ids(events: list[dict[str, Any]]) -> list[int]:
    return [event_number(e["event_id"]) for e in events]


def test_a_resumed_client_gets_again_what_the_lost_link_took_after_its_last_event() -> None:
    outlet = Outlet()
    old = Link()
    outlet.attach(old)
    outlet.open({"type": "session.created", "n": 1}, None)
    for i in range(5):
        outlet.send({"type": "e", "i": i})
    assert ids(old.sent) == [1, 2, 3, 4, 5, 6]  # every event numbered in the order sent
    # the client got up to i=1 (event 3); the path died and took i=2..4 with it unseen
    outlet.attach(None)
    outlet.send({"type": "e", "i": 5})
    new = Link()
    outlet.attach(new)
    assert outlet.open({"type": "session.created", "n": 2}, None, after=3) == 3
    shown = [(e["type"], e.get("n", e.get("i"))) for e in new.sent]
    assert shown == [("session.created", 2), ("e", 2), ("e", 3), ("e", 4), ("e", 5)]
    assert ids(new.sent) == [7, 8, 9, 10, 11]  # new ids, after the old link's
    # that link died at once too: the client's last is still event 3, and it gets each
    # event once, never the used-up session.created
    third = Link()
    outlet.attach(third)
    assert outlet.open({"type": "session.created", "n": 3}, None, after=3) == 4
    assert [e.get("n", e.get("i")) for e in third.sent] == [3, 2, 3, 4, 5]
    # a client that got everything, or does not say, gets nothing again
    for after in (ids(third.sent)[-1], None):
        fourth = Link()
        outlet.attach(fourth)
        assert outlet.open({"type": "session.created"}, None, after=after) == 0
        assert [e["type"] for e in fourth.sent] == ["session.created"]


def test_events_a_link_of_the_other_dialect_took_are_not_sent_again() -> None:
    outlet = Outlet()
    old = Link()
    outlet.attach(old)
    outlet.open({"type": "session.created"}, lambda e: [{**e, "ga": True}])
    outlet.send({"type": "e", "i": 0})
    new = Link()
    outlet.attach(new)
    assert outlet.open({"type": "session.created"}, None, after=1) == 0
    assert [e["type"] for e in new.sent] == ["session.created"]


@pytest.mark.parametrize("given", ["event_00042", "event_7"])
def test_a_last_event_id_is_one_the_server_sends(given: str) -> None:
    assert event_number(given) == int(given.split("_")[1])


@pytest.mark.parametrize("bad", ["", "42", "event_", "event_-1", "evt_00001", 42, None, "event_1 "])
def test_a_malformed_last_event_id_is_refused(bad: object) -> None:
    with pytest.raises(BadRequest, match="last_event_id"):
        event_number(bad)
