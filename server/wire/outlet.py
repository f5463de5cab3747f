"""Where a conversation's events go: the attached link, or a bounded queue until a link
takes them (before its channel opens, or while the connection is lost).

Events are made once, in the native dialect; a link on the ``oai-events`` channel gets each
translated (once, in order) by the conversation's RealtimeWire as it leaves the queue. Every
event handed to a link gets the conversation's next ``event_id`` (``event_00001`` on), in the
order they are sent, whatever the dialect.

A link may take events and lose them with its connection (the path died before the server
knew). A client that resumes says the last ``event_id`` it received, and the events the lost
link took after it are sent again (the last ``MAX_SENT``), with new ids, right after the new
link's ``session.created``.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from server.errors import BadRequest
from server.wire.link import Link

log = logging.getLogger(__name__)

MAX_PENDING = 256  # events kept for a link that is not open (or not there); the oldest go first
MAX_SENT = 256  # events a link took, kept to send again to a client that did not get them
Event = dict[str, Any]
EVENT_ID = re.compile(r"event_(\d{1,12})")


def event_number(event_id: object) -> int:
    """The number of an ``event_id`` this server gave (``event_00042`` -> 42); BadRequest for
    anything else (a client's ``last_event_id``)."""
    match = EVENT_ID.fullmatch(event_id) if isinstance(event_id, str) else None
    if match is None:
        raise BadRequest('"last_event_id" must be an event_id the server sent, like "event_00042"')
    return int(match.group(1))


@dataclass(frozen=True)
class _Piece:
    """One event as the link's dialect has it; ``again``: a link's own ``session.created``
    is never sent again (its resume token is used up)."""

    event: Event
    again: bool = True


class Outlet:
    """Events out, in order, whichever link carries them."""

    def __init__(self) -> None:
        self.link: Link | None = None
        self.pending: deque[Event] = deque(maxlen=MAX_PENDING)
        self._ready: deque[_Piece] = deque()  # translated, waiting for the link to take them
        self._sent: deque[tuple[int, _Piece]] = deque(maxlen=MAX_SENT)  # (number, piece) taken
        self._numbered = 0  # event ids given so far
        self.translate: Callable[[Event], list[Event]] | None = None  # None: native dialect
        self.opened = False  # the link's events channel is open (its dialect known)

    def kept(self) -> int:
        """Events held here: waiting for a link, or taken and kept to send again."""
        return len(self.pending) + len(self._ready) + len(self._sent)

    def attach(self, link: Link | None) -> None:
        """``link`` carries the events from when its channel opens (None: no link)."""
        self.link, self.opened = link, False

    def send(self, event: Event) -> None:
        """Send ``event`` now, or keep it (after whatever is kept already)."""
        self.pending.append(event)
        self.flush()

    def open(
        self,
        first: Event,
        translate: Callable[[Event], list[Event]] | None,
        after: int | None = None,
    ) -> int:
        """The link's channel opened, speaking the native dialect (``translate`` None) or
        another: ``first``, then the events a lost link took after the client's last event
        (``after``: its number; None: the client did not say), then everything kept, in order.
        Returns how many events are sent again."""
        if translate != self.translate:  # what a link of the other dialect took is not sent again
            self._sent.clear()
        self.translate, self.opened = translate, True
        again = [] if after is None else self._taken_after(after)
        head = [
            _Piece(e, again=False) for e in ([first] if translate is None else translate(first))
        ]
        self._ready.extendleft(reversed(head + again))  # before what an old link left untaken
        if again:
            log.info("%d events the lost connection took are sent again", len(again))
        self.flush()
        return len(again)

    def _taken_after(self, after: int) -> list[_Piece]:
        """The events a link took after number ``after``, taken back to be sent again (with
        new ids: a later resume counts them where they are sent now)."""
        kept = [(number, piece) for number, piece in self._sent if number <= after]
        again = [piece for number, piece in self._sent if number > after and piece.again]
        self._sent = deque(kept, maxlen=MAX_SENT)
        return again

    def flush(self) -> int:
        """Hand the kept events to the link, in order, while it takes them; how many are
        still kept (a link stops taking them while its path looks dead)."""
        link = self.link if self.opened else None
        while link is not None:
            if not self._ready:
                if not self.pending:
                    break
                event = self.pending.popleft()
                events = [event] if self.translate is None else self.translate(event)
                self._ready.extend(_Piece(e) for e in events)
                continue
            piece = self._ready[0]
            number = self._numbered + 1
            if not link.send({**piece.event, "event_id": f"event_{number:05d}"}):
                break
            self._numbered = number
            self._sent.append((number, piece))
            self._ready.popleft()
        return len(self.pending) + len(self._ready)
