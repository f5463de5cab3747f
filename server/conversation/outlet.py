"""Where a conversation's events go: the attached link, or a bounded queue until a link
takes them (before its channel opens, or while the connection is lost).

Events are made once, in the native dialect; a link on the ``oai-events`` channel gets each
translated (once, in order) by the conversation's RealtimeWire as it leaves the queue.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from server.conversation.link import Link

log = logging.getLogger(__name__)

MAX_PENDING = 256  # events kept for a link that is not open (or not there); the oldest go first
Event = dict[str, Any]


class Outlet:
    """Events out, in order, whichever link carries them."""

    def __init__(self) -> None:
        self.link: Link | None = None
        self.pending: deque[Event] = deque(maxlen=MAX_PENDING)
        self._ready: deque[Event] = deque()  # translated, waiting for the link to take them
        self.translate: Callable[[Event], list[Event]] | None = None  # None: native dialect
        self.opened = False  # the link's events channel is open (its dialect known)

    def attach(self, link: Link | None) -> None:
        """``link`` carries the events from when its channel opens (None: no link)."""
        self.link, self.opened = link, False

    def send(self, event: Event) -> None:
        """Send ``event`` now, or keep it (after whatever is kept already)."""
        self.pending.append(event)
        self.flush()

    def open(self, first: Event, translate: Callable[[Event], list[Event]] | None) -> None:
        """The link's channel opened, speaking the native dialect (``translate`` None) or
        another: ``first``, then everything kept, in order."""
        self.translate, self.opened = translate, True
        head = [first] if translate is None else translate(first)
        self._ready.extendleft(reversed(head))  # before what an old link left untaken too
        self.flush()

    def flush(self) -> int:
        """Hand the kept events to the link, in order, while it takes them; how many are
        still kept (a link stops taking them while its path looks dead)."""
        link = self.link if self.opened else None
        while link is not None:
            if not self._ready:
                if not self.pending:
                    break
                event = self.pending.popleft()
                self._ready.extend([event] if self.translate is None else self.translate(event))
                continue
            if not link.send(self._ready[0]):
                break
            self._ready.popleft()
        return len(self.pending) + len(self._ready)
