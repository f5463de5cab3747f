"""A reply chunk's speech queued for playback piece by piece as the speech engine makes it,
within the lookahead budget, its mouth shapes registered with it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable

from server.avatar.lipsync import LipSync, cues_for
from server.clock import Clock
from server.pipeline.seams import SpeechAudio, TurnTrace
from server.runtime.chunk import Chunk, PhonemeTiming
from server.runtime.session import ChunkAudio, Session
from server.runtime.stage import Stage


class Voicing:
    """Delivers the speech of one session's reply chunks."""

    def __init__(
        self,
        session: Session,
        lipsync: LipSync,
        clock: Clock,
        announce: Callable[[int], None],
        wait_for_room: Callable[[], Awaitable[None]],
    ) -> None:
        """``announce(chunk_id)``: its audio was queued (events for what it holds);
        ``wait_for_room``: returns once the lookahead budget has room."""
        self._session = session
        self._lipsync = lipsync
        self._clock = clock
        self._announce = announce
        self._wait_for_room = wait_for_room

    async def deliver(
        self,
        chunk: Chunk,
        pieces: AsyncGenerator[SpeechAudio, None],
        limit_s: float,
        trace: TurnTrace,
    ) -> bool:
        """``chunk``'s speech, each piece queued as it comes (``limit_s``: the longest wait for
        one); the first sets ``trace.first_tts_ms``. False: the chunk went stale."""
        session, offset = self._session, 0
        phonemes: tuple[PhonemeTiming, ...] = ()
        async with contextlib.aclosing(pieces):
            while True:
                async with asyncio.timeout(limit_s):
                    audio = await anext(pieces, None)
                if audio is None:
                    return True
                if trace.first_tts_ms is None:
                    trace.first_tts_ms = self._clock.now_ms()
                phonemes = audio.phonemes or phonemes  # the first piece has the chunk's
                cues = cues_for(phonemes, audio.pcm, offset)
                if offset == 0:
                    appearance = session.conditions.appearance
                    self._lipsync.add_chunk(chunk.chunk_id, chunk.epoch, appearance, cues)
                else:
                    self._lipsync.extend(chunk.chunk_id, cues)
                offset, pcm = offset + len(audio.pcm), audio.pcm
                while True:
                    payload = ChunkAudio(pcm, audio.words, audio.phonemes, final=audio.last)
                    accepted = session.deliver_audio(session.message(chunk, Stage.TTS, payload))
                    if accepted is None:
                        return False
                    self._announce(chunk.chunk_id)
                    pcm = pcm[accepted:]
                    if len(pcm) == 0:
                        break
                    await self._wait_for_room()
