"""The playback buffer: output waiting to be played, bounded by the lookahead budget.

Positions are integer samples at 48 kHz on the session media clock. ``playback_cursor`` counts
every sample handed to the outbound track (silence included), ``generation_cursor`` is the
cursor plus what is buffered; their difference (the slack) never exceeds the budget.
A pause holds what is buffered: the pulls give silence and consume nothing until
:meth:`PlaybackBuffer.resume`, which plays on from the exact sample where the pause held it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from server.runtime.media import samples_to_ms

log = logging.getLogger(__name__)

V = TypeVar("V")
PCM = npt.NDArray[np.int16]
RECENT_SPANS = 64  # played spans remembered for locate() (a few seconds of 20 ms pulls)


@dataclass(frozen=True)
class PlayedSpan:
    """``samples`` samples of a chunk, from ``start`` (offset in the chunk), were played."""

    chunk_id: int
    epoch: int
    start: int
    samples: int


@dataclass(frozen=True)
class Pull:
    """One pull of audio: the samples to send and which chunks they came from."""

    pcm: PCM
    spans: tuple[PlayedSpan, ...]
    underrun: bool
    cursor: int


@dataclass
class _Segment:
    chunk_id: int
    epoch: int
    pcm: PCM
    offset: int  # offset of pcm[0] within its chunk (samples)


class PlaybackBuffer(Generic[V]):
    """Audio (int16 mono 48 kHz) and optional video frames per chunk, in play order."""

    def __init__(
        self, budget_samples: int, fade_samples: int = 0, epoch: Callable[[], int] = lambda: 0
    ) -> None:
        """``epoch``: the session's current epoch (it lives there alone); audio of an older
        one is refused, and :meth:`flush` follows a new one."""
        if budget_samples <= 0:
            raise ValueError("budget_samples must be > 0")
        self.budget = budget_samples
        self.fade_samples = fade_samples
        self._epoch = epoch
        self._flushed_epoch = epoch()  # the epoch whose audio the buffer holds
        self.playback_cursor = 0
        self.underruns = 0
        self.underrun_samples = 0
        self.rejected_stale = 0
        self._segments: deque[_Segment] = deque()
        self._buffered = 0
        self._chunk_fill: dict[int, int] = {}  # chunk_id -> samples pushed so far
        self._chunk_start: dict[int, int] = {}  # chunk_id -> position of its first sample
        self._video: dict[int, list[tuple[int, V]]] = {}
        self._playing: tuple[int, int] | None = None  # (chunk_id, offset) last sample played
        self._recent: deque[tuple[int, PlayedSpan]] = deque(maxlen=RECENT_SPANS)  # (position, span)
        self._fade_tail: PCM | None = None
        self._streaming = False
        self._started = False
        self._in_gap = False
        self._paused_at: int | None = None  # the cursor when a pause began

    # --- state -------------------------------------------------------------------------
    @property
    def buffered(self) -> int:
        """Samples queued ahead of the playback cursor."""
        return self._buffered

    @property
    def generation_cursor(self) -> int:
        return self.playback_cursor + self._buffered

    @property
    def space(self) -> int:
        """Samples that may still be pushed within the lookahead budget."""
        return max(0, self.budget - self._buffered)

    @property
    def slack_ms(self) -> float:
        """Buffered playback (ms) ahead of the cursor: how long until an underrun."""
        return samples_to_ms(self._buffered)

    @property
    def streaming(self) -> bool:
        """True between :meth:`begin_response` and :meth:`end_response`."""
        return self._streaming

    @property
    def paused(self) -> bool:
        """True between :meth:`pause` and :meth:`resume` (or a flush)."""
        return self._paused_at is not None

    @property
    def playing_chunk(self) -> int | None:
        """Chunk whose audio the last pull ended in (None when silent)."""
        return self._playing[0] if self._playing else None

    # --- producer side -----------------------------------------------------------------
    def begin_response(self, epoch: int) -> None:
        """A response of ``epoch`` starts streaming; gaps after its first sample are underruns."""
        if epoch == self.epoch:
            self._streaming, self._started, self._in_gap = True, False, False

    def end_response(self, epoch: int) -> None:
        """All audio of the response was pushed; a short pull from now on is just its end."""
        if epoch == self.epoch:
            self._streaming = False

    def push_audio(self, chunk_id: int, epoch: int, pcm: PCM) -> int:
        """Queue audio of a chunk; returns how many samples fit within the budget (a prefix).

        Audio of an epoch older than the buffer's is refused (0) and counted.
        """
        if epoch < self.epoch:
            self.rejected_stale += 1
            return 0
        if epoch > self.epoch:
            raise ValueError(f"buffer at epoch {self.epoch} got audio of future epoch {epoch}")
        take = min(len(pcm), self.space)
        if take == 0:
            return 0
        filled = self._chunk_fill.get(chunk_id, 0)
        if chunk_id not in self._chunk_start:
            self._chunk_start[chunk_id] = self.generation_cursor
        self._segments.append(_Segment(chunk_id, epoch, np.asarray(pcm[:take], np.int16), filled))
        self._chunk_fill[chunk_id] = filled + take
        self._buffered += take
        return take

    def push_video(self, chunk_id: int, epoch: int, offset: int, frame: V) -> bool:
        """Queue a video frame shown from ``offset`` samples into the chunk; False if refused.

        Refused when stale or when the frame lies beyond the lookahead budget.
        """
        if epoch < self.epoch:
            self.rejected_stale += 1
            return False
        start = self._chunk_start.get(chunk_id, self.generation_cursor)
        if start + offset > self.playback_cursor + self.budget:
            return False
        frames = self._video.setdefault(chunk_id, [])
        frames.append((offset, frame))
        frames.sort(key=lambda item: item[0])
        return True

    # --- consumer side (the paced outbound track) --------------------------------------
    def pull(self, n: int) -> Pull:
        """Take the next ``n`` samples; silence fills whatever is missing."""
        out = np.zeros(n, np.int16)
        filled = 0
        spans: list[PlayedSpan] = []
        if self._fade_tail is not None:
            tail, self._fade_tail = self._fade_tail[:n], None
            out[: len(tail)] = tail
            filled = n  # the fade replaces this frame; flushed audio never plays on
        if self._paused_at is not None:  # held: silence, nothing consumed, no underrun
            self._playing = None
            self.playback_cursor += n
            return Pull(out, (), False, self.playback_cursor)
        while filled < n and self._segments:
            seg = self._segments[0]
            take = min(n - filled, len(seg.pcm))
            out[filled : filled + take] = seg.pcm[:take]
            span = PlayedSpan(seg.chunk_id, seg.epoch, seg.offset, take)
            spans.append(span)
            self._recent.append((self.playback_cursor + filled, span))
            self._playing = (seg.chunk_id, seg.offset + take)
            filled += take
            self._buffered -= take
            if take == len(seg.pcm):
                self._segments.popleft()
            else:
                self._segments[0] = _Segment(
                    seg.chunk_id, seg.epoch, seg.pcm[take:], seg.offset + take
                )
        if spans and self._streaming:
            self._started = True
        short = n - filled
        underrun = short > 0 and self._streaming and self._started
        if underrun:
            self.underrun_samples += short
            if not self._in_gap:
                self.underruns += 1
                log.warning(
                    "playback underrun at %d (%.0f ms short)",
                    self.playback_cursor,
                    samples_to_ms(short),
                )
        self._in_gap = underrun
        if short > 0 and not spans:
            self._playing = None
        self.playback_cursor += n
        return Pull(out, tuple(spans), underrun, self.playback_cursor)

    def video_at(self) -> V | None:
        """The frame for what is playing now, or None (idle frame) when nothing is."""
        if self._playing is None:
            return None
        chunk_id, offset = self._playing
        current: V | None = None
        for frame_offset, frame in self._video.get(chunk_id, ()):
            if frame_offset > offset:
                break
            current = frame
        return current

    def chunk_position(self, chunk_id: int) -> int | None:
        """Output position (samples) of a queued chunk's first sample; None if not queued."""
        return self._chunk_start.get(chunk_id)

    def locate(self, position: int) -> tuple[int, int] | None:
        """Which chunk, and how many samples into it, the audio at output ``position`` is:
        audio handed out recently or still queued; None where it is (or will be) silence."""
        if position < self.playback_cursor:
            for start, span in reversed(self._recent):
                if start <= position < start + span.samples:
                    return span.chunk_id, span.start + position - start
                if start + span.samples <= position:
                    return None
            return None
        ahead = position - self.playback_cursor
        if self._fade_tail is not None:
            return None
        for seg in self._segments:
            if ahead < len(seg.pcm):
                return seg.chunk_id, seg.offset + ahead
            ahead -= len(seg.pcm)
        return None

    def pause(self) -> bool:
        """Hold playback at the cursor: the next pull fades out a copy of the audio due there
        (not counted as played), then silence; nothing queued is consumed. False if already
        paused."""
        if self._paused_at is not None:
            return False
        self._paused_at = self.playback_cursor
        if self.fade_samples and self._segments and self._fade_tail is None:
            self._fade_tail = _ramp(self._head(self.fade_samples), fade_in=False)
        return True

    def resume(self) -> int:
        """Play on from the exact sample where :meth:`pause` held it, fading in; the queued
        chunks' output positions move later by the pause. Returns the pause's length (samples;
        0 if none)."""
        if self._paused_at is None:
            return 0
        held, self._paused_at = self.playback_cursor - self._paused_at, None
        self._fade_tail = None  # a fade still unplayed is moot: the audio goes on
        for chunk_id in self._chunk_start:
            self._chunk_start[chunk_id] += held
        if self.fade_samples and self._segments:
            seg = self._segments[0]
            faded = seg.pcm.copy()
            head = faded[: self.fade_samples]
            faded[: len(head)] = _ramp(head, fade_in=True)
            self._segments[0] = _Segment(seg.chunk_id, seg.epoch, faded, seg.offset)
        self._in_gap = False
        return held

    @property
    def epoch(self) -> int:
        """The session's current epoch."""
        return self._epoch()

    def flush(self) -> int:
        """Barge-in: the session started a new epoch: drop everything queued (older epochs'
        audio is refused from now on); returns samples dropped.

        The first ``fade_samples`` of the dropped audio are played faded to zero so the cut
        does not click; they are not counted as played.
        """
        new_epoch = self._epoch()
        if new_epoch <= self._flushed_epoch:
            raise ValueError(f"flush at epoch {new_epoch}, already flushed for it: no new epoch")
        dropped = self._buffered
        if self.fade_samples and self._segments and self._paused_at is None:
            self._fade_tail = _ramp(self._head(self.fade_samples), fade_in=False)
        self._paused_at = None  # a paused reply is already silent: nothing fades
        self._segments.clear()
        self._buffered = 0
        self._chunk_fill.clear()
        self._chunk_start.clear()
        self._video.clear()
        self._playing = None
        self._streaming = self._started = self._in_gap = False
        self._flushed_epoch = new_epoch
        return dropped

    def forget_chunk(self, chunk_id: int) -> None:
        """Drop the bookkeeping of a chunk that has played out completely."""
        self._chunk_fill.pop(chunk_id, None)
        self._chunk_start.pop(chunk_id, None)
        self._video.pop(chunk_id, None)

    def _head(self, n: int) -> PCM:
        """The first ``n`` queued samples (fewer if less is queued)."""
        return np.concatenate([s.pcm for s in self._segments])[:n]


def _ramp(pcm: PCM, fade_in: bool) -> PCM:
    """``pcm`` faded linearly from silence (``fade_in``) or to silence."""
    ramp = np.linspace(1.0, 0.0, len(pcm), endpoint=False)
    if fade_in:
        ramp = ramp[::-1]
    return (pcm.astype(np.float32) * ramp).astype(np.int16)
