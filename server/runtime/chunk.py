"""Chunks (units of generated output) and the stage messages that carry them between stages."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from enum import Enum
from typing import Generic, TypeVar

from server.errors import InvalidTransition
from server.runtime.stage import Stage

log = logging.getLogger(__name__)

P = TypeVar("P")


class ChunkState(Enum):
    """Lifecycle of a chunk: ``pending -> committed | discarded``."""

    PENDING = "pending"
    COMMITTED = "committed"
    DISCARDED = "discarded"


_CHUNK_TRANSITIONS = {
    ChunkState.PENDING: frozenset({ChunkState.COMMITTED, ChunkState.DISCARDED}),
    ChunkState.COMMITTED: frozenset[ChunkState](),
    ChunkState.DISCARDED: frozenset[ChunkState](),
}


@dataclass(frozen=True)
class WordTiming:
    """One spoken word of a chunk, in samples (48 kHz) from the chunk's first sample."""

    word: str
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(
                f"word {self.word!r}: need 0 <= start <= end, got {self.start}..{self.end}"
            )


@dataclass(frozen=True)
class PhonemeTiming:
    """One phoneme (or pause) of a chunk's audio, in samples (48 kHz) from its first sample."""

    phoneme: str
    start: int
    end: int


@dataclass(frozen=True)
class Chunk:
    """A sentence of output: its text, the epoch and conditions it was made under, its audio length.

    ``duration`` (samples) and ``audio_complete`` are known once TTS delivered all its audio;
    ``heard_text`` is set on commit: the whole text, or the played prefix after a barge-in.
    """

    chunk_id: int
    epoch: int
    text: str
    conditions_version: int
    state: ChunkState = ChunkState.PENDING
    words: tuple[WordTiming, ...] = ()
    phonemes: tuple[PhonemeTiming, ...] = ()
    duration: int = 0
    audio_complete: bool = False
    heard_text: str = ""
    played: int = 0


def transition_chunk(chunk: Chunk, new: ChunkState, **changes: object) -> Chunk:
    """The one place a chunk's state changes; logs ``old -> new``."""
    if new not in _CHUNK_TRANSITIONS[chunk.state]:
        raise InvalidTransition(f"chunk {chunk.chunk_id}: {chunk.state.value} -> {new.value}")
    log.debug(
        "chunk %d (epoch %d): %s -> %s", chunk.chunk_id, chunk.epoch, chunk.state.value, new.value
    )
    return replace(chunk, state=new, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class StageMessage(Generic[P]):
    """What passes between stages: the payload plus who it is for and what it was made under."""

    session_id: str
    chunk_id: int
    epoch: int
    stage: Stage
    conditions_version: int
    payload: P
