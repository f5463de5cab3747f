"""The response in progress: its chunks, their audio, what of them was heard. No I/O.

A ``Response`` belongs to one ``Session`` (server/runtime/session.py), which decides when a
response starts, ends or is interrupted; this module keeps the chunk bookkeeping that goes
with it. Media positions are samples at 48 kHz.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from server.errors import UnknownChunk, UnknownItem
from server.runtime.chunk import Chunk, ChunkState, PhonemeTiming, WordTiming, transition_chunk
from server.runtime.events import (
    ItemTruncated,
    OutputAudioCleared,
    OutputAudioPaused,
    OutputAudioResumed,
    OutputAudioStarted,
    OutputAudioStopped,
    ResponseCreated,
    ResponseDone,
    ResponseStatus,
    SessionEvent,
)
from server.runtime.history import History
from server.runtime.media import samples_to_ms
from server.runtime.playback import PCM, PlaybackBuffer, PlayedSpan
from server.runtime.turn import TurnState


@dataclass(frozen=True)
class ChunkAudio:
    """A piece of a chunk's synthesized audio (int16 mono 48 kHz).

    ``words``, ``phonemes``: timings relative to the chunk's first sample, if the TTS gives
    them (phonemes drive the avatar's mouth).
    ``final``: this is the chunk's last piece.
    """

    pcm: PCM
    words: tuple[WordTiming, ...] = ()
    phonemes: tuple[PhonemeTiming, ...] = ()
    final: bool = False


@dataclass(frozen=True)
class Cut:
    """What an interruption did to the response's chunks: the ids of those discarded unplayed,
    and where the item was cut (if any of it was heard): in the chunk playing, or at the start
    of the first unplayed one."""

    discarded: tuple[int, ...]
    truncated: ItemTruncated | None


def heard_prefix(chunk: Chunk, played: int) -> str:
    """The text of ``chunk`` the user heard after ``played`` samples of it.

    With word timings: the words whose audio ended by then. Without: the share of characters
    equal to the share of audio played, cut back to a whole word.
    """
    if chunk.audio_complete and played >= chunk.duration:
        return chunk.text
    if chunk.words:
        return " ".join(w.word for w in chunk.words if w.end <= played)
    if chunk.duration <= 0 or played <= 0:
        return ""
    limit = int(len(chunk.text) * min(1.0, played / chunk.duration))
    words: list[str] = []
    pos = 0
    for word in chunk.text.split():
        end = chunk.text.index(word, pos) + len(word)
        if end > limit:
            break
        words.append(word)
        pos = end
    return " ".join(words)


def word_ends_ms(chunk: Chunk, text: str, played: int) -> tuple[float, ...]:
    """Where each word of ``text`` (what was heard of ``chunk``) ended, in ms from the chunk's
    first sample: the TTS's word timings when they match the words, else spread evenly over the
    ``played`` samples."""
    words = text.split()
    if chunk.words and len(chunk.words) >= len(words):
        return tuple(samples_to_ms(w.end) for w in chunk.words[: len(words)])
    if not words:
        return ()
    step = samples_to_ms(played) / len(words)
    return tuple(step * (n + 1) for n in range(len(words)))


class Response:
    """The chunks of a session's responses and the state of the one in progress.

    ``epoch``: of the response in progress, None between responses. Played text goes to
    ``history``, audio to ``playback``, events to ``events`` (all the session's own).
    """

    def __init__(
        self,
        session_id: str,
        playback: PlaybackBuffer[Any],
        history: History,
        events: deque[SessionEvent],
    ) -> None:
        self._session_id = session_id
        self._playback = playback
        self._history = history
        self._events = events
        self._chunks: dict[int, Chunk] = {}
        self._next_chunk_id = 1
        self.epoch: int | None = None
        self.response_id = ""  # of the response in progress (or the last one)
        self.item_id = ""  # its assistant item
        self.audio_started = False  # its first audio went out
        self.heard_samples = 0  # of its audio played so far
        self.generation_done = False
        self.status = ResponseStatus.COMPLETED

    # --- chunks ---------------------------------------------------------------------------
    def chunk(self, chunk_id: int) -> Chunk:
        try:
            return self._chunks[chunk_id]
        except KeyError:
            raise UnknownChunk(f"session {self._session_id[:8]}: no chunk {chunk_id}") from None

    def pending(self) -> tuple[Chunk, ...]:
        return tuple(c for c in self._chunks.values() if c.state is ChunkState.PENDING)

    def open(self, epoch: int, text: str, conditions_version: int) -> Chunk:
        """A new chunk of ``text`` for the response of ``epoch``."""
        chunk = Chunk(self._next_chunk_id, epoch, text.strip(), conditions_version)
        self._next_chunk_id += 1
        self._chunks[chunk.chunk_id] = chunk
        return chunk

    def waiting_for(self, state: TurnState) -> str:
        """The stage the turn in ``state`` waits for: ``speech`` (the user speaks), ``asr`` (no
        reply yet), ``tts`` (the newest chunk has text but no speech), ``llm`` (more text) or
        ``playback`` (everything is generated)."""
        if state is TurnState.USER_SPEAKING:
            return "speech"
        if state is TurnState.PAUSED:
            return "interruption"  # the voice over the reply is being judged
        if self.epoch is None:  # no reply yet: the final transcript
            return "asr" if state is TurnState.THINKING else "playback"
        chunks = [c for c in self._chunks.values() if c.epoch == self.epoch]
        if self.generation_done:
            return "playback"
        if chunks and chunks[-1].state is ChunkState.PENDING and chunks[-1].duration == 0:
            return "tts"
        return "llm"

    # --- the response's course --------------------------------------------------------------
    def begin(
        self, epoch: int, response_id: str = "", item_id: str = "", output: str = "audio"
    ) -> None:
        """Generation of the response of ``epoch`` (``response_id``, making the assistant item
        ``item_id``; ``output``: ``audio`` or ``text``) begins."""
        self.epoch = epoch
        self.response_id, self.item_id = response_id, item_id
        self.audio_started, self.heard_samples = False, 0
        self.generation_done = False
        self.status = ResponseStatus.COMPLETED
        self._playback.begin_response(epoch)
        self._events.append(ResponseCreated(epoch, response_id, item_id, output))

    def add_audio(self, chunk_id: int, epoch: int, audio: ChunkAudio) -> int:
        """Queue audio of a chunk within the lookahead budget; the samples accepted (a prefix)."""
        chunk = self.chunk(chunk_id)
        accepted = self._playback.push_audio(chunk.chunk_id, epoch, audio.pcm)
        complete = audio.final and accepted == len(audio.pcm)
        self._set(
            replace(
                chunk,
                duration=chunk.duration + accepted,
                audio_complete=complete,
                words=audio.words or chunk.words,
                phonemes=audio.phonemes or chunk.phonemes,
            )
        )
        self._commit_played_out()  # a chunk without sound is played out as it arrives
        self._maybe_end_stream()
        return accepted

    def finish(self, status: ResponseStatus) -> None:
        """No more chunks will come: a chunk without audio is discarded, one with some is
        complete with what it has."""
        self.status = status
        self.generation_done = True
        for chunk in self.pending():
            if chunk.audio_complete:
                continue
            if chunk.duration == 0:  # its audio never came (e.g. the engine failed)
                self._set(transition_chunk(chunk, ChunkState.DISCARDED))
            else:  # what was delivered is all there will be
                self._set(replace(chunk, audio_complete=True))
        self._maybe_end_stream()

    def played(self, span: PlayedSpan) -> bool:
        """``span`` of a chunk was played; a chunk played to its end is committed to history.

        Returns whether the span belonged to a pending chunk.
        """
        chunk = self._chunks.get(span.chunk_id)
        if chunk is None or chunk.state is not ChunkState.PENDING:
            return False
        if chunk.epoch == self.epoch:
            if not self.audio_started:
                self.audio_started = True
                self._events.append(OutputAudioStarted(chunk.epoch, self.response_id))
            self.heard_samples += span.samples
        chunk = replace(chunk, played=max(chunk.played, span.start + span.samples))
        self._set(chunk)
        self._commit_played_out()
        return True

    def pause(self) -> None:
        """Voice over the reply: its audio holds at the cursor, every chunk is kept."""
        if self._playback.pause():
            cursor = samples_to_ms(self._playback.playback_cursor)
            heard = samples_to_ms(self.heard_samples)
            epoch = self._playback.epoch
            self._events.append(
                OutputAudioPaused(epoch, self.response_id, self.item_id, heard, cursor)
            )

    def resume(self, reason: str) -> None:
        """The voice was no interruption (``reason``): the audio plays on where it paused."""
        held = samples_to_ms(self._playback.resume())
        heard = samples_to_ms(self.heard_samples)
        epoch = self._playback.epoch
        self._events.append(
            OutputAudioResumed(epoch, self.response_id, self.item_id, heard, held, reason)
        )

    def show(self, chunk_id: int) -> None:
        """A chunk of a text-only reply was sent: it is committed whole (there is no audio)."""
        chunk = replace(self.chunk(chunk_id), audio_complete=True)
        self._commit(chunk, chunk.text, truncated=False)

    def settle(self) -> bool:
        """When the response is generated and every chunk played: ``response.done`` and no
        response in progress. Returns whether it settled now."""
        if self.epoch is None or not self.generation_done or self.pending():
            return False
        epoch, self.epoch = self.epoch, None
        self.generation_done = False
        if self.audio_started:
            self._events.append(OutputAudioStopped(epoch, self.response_id))
        self._events.append(self._done(epoch, self.status))
        self._forget_settled()
        return True

    def interrupt(self, old_epoch: int, status: ResponseStatus) -> Cut:
        """An interruption ended epoch ``old_epoch``: a chunk in play is committed up to what
        was heard, unplayed ones are discarded, a response in progress ends with ``status``.
        The playback buffer must already be flushed."""
        discarded: list[int] = []
        truncated: ItemTruncated | None = None
        for chunk in self.pending():
            if chunk.played > 0:
                text = heard_prefix(chunk, chunk.played)
                self._commit(chunk, text, truncated=True)
                truncated = ItemTruncated(
                    old_epoch,
                    chunk.chunk_id,
                    samples_to_ms(chunk.played),
                    text,
                    self.item_id,
                    samples_to_ms(self.heard_samples),
                )
                self._events.append(truncated)
            else:
                self._set(transition_chunk(chunk, ChunkState.DISCARDED))
                discarded.append(chunk.chunk_id)
        if truncated is None and discarded and self.epoch == old_epoch and self.heard_samples:
            # cut between two chunks: the item was heard to the end of the last one played,
            # and its unplayed words are gone all the same
            self._history.commit_agent_text(old_epoch, "", True, self.item_id)
            heard_ms = samples_to_ms(self.heard_samples)
            truncated = ItemTruncated(old_epoch, discarded[0], 0.0, "", self.item_id, heard_ms)
            self._events.append(truncated)
        if self.epoch is not None:
            if self.audio_started:
                self._events.append(OutputAudioCleared(self.epoch, self.response_id))
            self._events.append(self._done(self.epoch, status))
        self.epoch = None
        self.generation_done = False
        self._forget_settled()
        return Cut(tuple(discarded), truncated)

    # --- internals --------------------------------------------------------------------------
    def _set(self, chunk: Chunk) -> None:
        self._chunks[chunk.chunk_id] = chunk

    def _commit(self, chunk: Chunk, text: str, truncated: bool) -> None:
        self._set(transition_chunk(chunk, ChunkState.COMMITTED, heard_text=text))
        played = min(chunk.played, chunk.duration) if chunk.duration else chunk.played
        ends = word_ends_ms(chunk, text, played)
        item_id = self.item_id if chunk.epoch == self.epoch else ""
        self._history.commit_agent_text(
            chunk.epoch, text, truncated, item_id, ends, samples_to_ms(played)
        )

    def _done(self, epoch: int, status: ResponseStatus) -> ResponseDone:
        """``response.done`` of the response of ``epoch``, with what of it was heard."""
        try:
            heard = self._history.item(self.item_id).text if self.item_id else ""
        except UnknownItem:
            heard = ""
        return ResponseDone(epoch, status, self.response_id, self.item_id, heard)

    def _commit_played_out(self) -> None:
        """Commit, in order, the pending chunks played to their end (all their audio came and
        was played). A chunk whose speech has no samples (text the voice says nothing for:
        "**", "-") is played out once every chunk before it is: no pull of the playback ever
        spans it, and left pending it would hold the reply open for good."""
        for chunk in self.pending():
            if not (chunk.audio_complete and chunk.played >= chunk.duration):
                return
            self._commit(chunk, chunk.text, truncated=False)
            self._playback.forget_chunk(chunk.chunk_id)

    def _maybe_end_stream(self) -> None:
        if (
            self.epoch is not None
            and self.generation_done
            and all(c.audio_complete for c in self.pending())
        ):
            self._playback.end_response(self.epoch)

    def _forget_settled(self) -> None:
        """Drop committed/discarded chunks; history already holds what they contributed."""
        self._chunks = {k: c for k, c in self._chunks.items() if c.state is ChunkState.PENDING}
