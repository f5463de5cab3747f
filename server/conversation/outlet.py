"""Where a conversation's events go: the attached link, or a bounded queue until a link
takes them (before its channel opens, or while the connection is lost)."""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from server.conversation.link import Link

log = logging.getLogger(__name__)

MAX_PENDING = 256  # events kept for a link that is not open (or not there); the oldest go first


class Outlet:
    """Events out, in order, whichever link carries them."""

    def __init__(self) -> None:
        self.link: Link | None = None
        self.pending: deque[dict[str, Any]] = deque(maxlen=MAX_PENDING)

    def send(self, event: dict[str, Any]) -> None:
        """Send ``event`` now, or keep it (after whatever is kept already)."""
        link = self.link
        if link is not None and not self.flush() and link.send(event):
            return
        self.pending.append(event)

    def open(self, first: dict[str, Any]) -> None:
        """The link's channel opened: ``first``, then everything kept, in order."""
        self.pending.appendleft(first)
        self.flush()

    def flush(self) -> int:
        """Hand the kept events to the link, in order, while it takes them; how many are
        still kept (a link stops taking them while its path looks dead)."""
        link = self.link
        while link is not None and self.pending and link.send(self.pending[0]):
            self.pending.popleft()
        return len(self.pending)
