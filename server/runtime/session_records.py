"""The frozen records a session hands out: its cursors, an overdue turn, a barge-in."""

from __future__ import annotations

from dataclasses import dataclass

from server.runtime.events import ItemTruncated
from server.runtime.turn import TurnState


@dataclass(frozen=True)
class Cursors:
    """The four cursors, in samples at 48 kHz on the session media clock."""

    heard_until: int
    prefilled_until: int
    generation_cursor: int
    playback_cursor: int


@dataclass(frozen=True)
class Overdue:
    """A turn state past its deadline by ``waited_ms`` (ms): ``stage`` is what it was waiting
    for (``speech``: the user's own turn; ``asr``, ``llm``, ``tts``: an engine; ``playback``:
    the reply playing)."""

    state: TurnState
    stage: str
    waited_ms: float


@dataclass(frozen=True)
class BargeIn:
    """What a bump did: the epochs, discarded chunks, the chunk cut mid-play (if any) and the
    queued output flushed (samples at 48 kHz)."""

    old_epoch: int
    new_epoch: int
    reason: str
    discarded: tuple[int, ...]
    truncated: ItemTruncated | None
    flushed_samples: int
