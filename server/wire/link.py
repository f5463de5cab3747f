"""What a conversation needs of its transport (a peer connection): events out, media time."""

from __future__ import annotations

from typing import Any, Protocol


class Link(Protocol):
    """The connection a conversation is attached to. Frames come in through
    :meth:`server.conversation.conversation.Conversation.hear`; the link's outbound tracks pull
    audio and faces from the conversation; events go out through :meth:`send`."""

    def send(self, event: dict[str, Any]) -> bool:
        """Send one event now; False when the link cannot yet (its channel is not open): the
        conversation keeps the event and hands it over later, in order."""
        ...

    def media_ms(self) -> float | None:
        """Milliseconds on the link's outbound media clock; None before its tracks started it."""
        ...
