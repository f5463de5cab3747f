"""What a session shows the scheduler: the runtime writes it, the scheduler reads it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SessionView:
    """What the scheduler knows of a session at one instant.

    ``slack_ms``: buffered playback ahead of its cursor (time until it underruns).
    ``waiting_since_ms``: end of the user's turn while the reply has not started playing, or
    when a reply paused while the voice over it is judged.
    ``paused``: a reply is paused while the voice over it is judged: its speech waits, so
    that the hearing of that voice gets the cores first.
    """

    session_id: str
    epoch: int
    slack_ms: float
    budget_ms: float
    waiting_since_ms: float | None = None
    paused: bool = False
