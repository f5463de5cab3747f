"""Lip-sync: viseme cues of each chunk, placed on the session's audio clock.

A chunk's phoneme timings (48 kHz samples from its first sample) become viseme cues. When the
chunk's audio enters the playback buffer its output position is known, so each cue gets a
presentation time ``pts_ms`` on the outbound audio clock: that is what ``avatar.viseme`` events
carry, and what the video frame for media time t looks up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from server.avatar.seam import Viseme, viseme_of
from server.runtime.chunk import PhonemeTiming
from server.runtime.media import pcm_level, samples_to_ms

MIN_WEIGHT = 0.35  # a sounding phoneme never shows less than this much of its shape
ATTACK_SAMPLES = 1440  # 30 ms: a cue's weight ramps in over this long (no snapping mouth)
MAX_CHUNKS = 32  # chunks remembered; the oldest (long played) go first


@dataclass(frozen=True)
class VisemeCue:
    """A mouth shape held from ``start`` to ``end`` (samples from the chunk's first sample)."""

    start: int
    end: int
    viseme: Viseme
    weight: float  # 0..1


STRESS = ("ˈ", "ˌ")  # noqa: RUF001  (IPA) timed marks before a vowel: they show that vowel
LENGTH = "ː"  # noqa: RUF001  (IPA) a timed length mark: the sound before it goes on
WORD_GAP = " "
MAX_WORD_GAP = 2880  # 60 ms: a shorter gap between words keeps the mouth's shape


def _visemes(phonemes: Sequence[PhonemeTiming]) -> list[Viseme]:
    """The viseme of each timed symbol. Engines like piper time stress and length marks and
    word gaps as symbols of their own; they belong to the sounds around them."""
    out = [viseme_of(ph.phoneme) for ph in phonemes]
    for i in range(len(phonemes) - 2, -1, -1):  # stress: the next sound (right to left)
        if phonemes[i].phoneme in STRESS:
            out[i] = out[i + 1]
    for i in range(1, len(phonemes)):  # length and short word gaps: the sound before
        ph = phonemes[i]
        short_gap = ph.phoneme == WORD_GAP and ph.end - ph.start < MAX_WORD_GAP
        if ph.phoneme == LENGTH or short_gap:
            out[i] = out[i - 1]
    return out


def cues_for(
    phonemes: Sequence[PhonemeTiming], pcm: npt.NDArray[np.int16], offset: int = 0
) -> tuple[VisemeCue, ...]:
    """Viseme cues of a chunk's audio ``pcm`` that starts ``offset`` samples into the chunk
    (a piece of its speech; 0 and all of it: the whole chunk): one per run of phonemes with
    the same viseme, cut to the audio, in the chunk's samples.

    The weight follows how loud the run is against the audio's loud parts (its RMS over the
    90th percentile of the phoneme RMS values), so stressed vowels open the mouth wider.
    """
    end = offset + len(pcm)
    spans: list[tuple[int, int, Viseme]] = []
    for ph, viseme in zip(phonemes, _visemes(phonemes), strict=True):
        start, stop = max(ph.start, offset), min(ph.end, end)
        if stop <= start:
            continue
        if spans and spans[-1][2] is viseme and spans[-1][1] == start:
            spans[-1] = (spans[-1][0], stop, viseme)
        else:
            spans.append((start, stop, viseme))
    if not spans:
        return ()
    rms = [pcm_level(pcm[s - offset : e - offset]) for s, e, _ in spans]
    sounding = [r for r, (_, _, v) in zip(rms, spans, strict=True) if v is not Viseme.SIL]
    loud = float(np.percentile(sounding, 90)) if sounding else 0.0
    cues = []
    for (start, end, viseme), level in zip(spans, rms, strict=True):
        if viseme is Viseme.SIL or loud <= 0:
            weight = 0.0 if viseme is Viseme.SIL else 1.0
        else:
            weight = min(1.0, max(MIN_WEIGHT, level / loud))
        cues.append(VisemeCue(start, end, viseme, round(weight, 2)))
    return tuple(cues)


@dataclass(frozen=True)
class _Placed:
    """A chunk's cues, and how many of them were announced."""

    epoch: int
    appearance: str
    cues: tuple[VisemeCue, ...]
    announced: int = 0  # cues already sent as events


class LipSync:
    """The cues of the chunks in flight, and which of them were announced as events."""

    def __init__(self) -> None:
        self._chunks: dict[int, _Placed] = {}

    def add_chunk(
        self, chunk_id: int, epoch: int, appearance: str, cues: tuple[VisemeCue, ...]
    ) -> None:
        """Register a chunk's cues (before its audio is queued)."""
        self._chunks[chunk_id] = _Placed(epoch, appearance, cues)
        while len(self._chunks) > MAX_CHUNKS:
            del self._chunks[next(iter(self._chunks))]

    def extend(self, chunk_id: int, cues: tuple[VisemeCue, ...]) -> None:
        """More cues of a chunk whose speech comes in pieces (after those it has)."""
        entry = self._chunks.get(chunk_id)
        if entry is not None:
            self._chunks[chunk_id] = replace(entry, cues=entry.cues + cues)

    def placed(self, chunk_id: int, position: int, queued: int) -> list[dict[str, object]]:
        """The chunk starts at output ``position`` (samples) and ``queued`` of its samples are
        in the buffer: the ``avatar.viseme`` events of cues that start in that audio."""
        entry = self._chunks.get(chunk_id)
        if entry is None:
            return []
        events = []
        index = entry.announced
        while index < len(entry.cues) and entry.cues[index].start < queued:
            cue = entry.cues[index]
            events.append(
                {
                    "type": "avatar.viseme",
                    "epoch": entry.epoch,
                    "chunk_id": chunk_id,
                    "pts_ms": round(samples_to_ms(position + cue.start), 1),
                    "duration_ms": round(samples_to_ms(cue.end - cue.start), 1),
                    "viseme": int(cue.viseme),
                    "name": cue.viseme.name.lower(),
                    "weight": cue.weight,
                }
            )
            index += 1
        self._chunks[chunk_id] = _Placed(entry.epoch, entry.appearance, entry.cues, index)
        return events

    def appearance(self, chunk_id: int) -> str | None:
        """The appearance the chunk was made under (None for an unknown chunk)."""
        entry = self._chunks.get(chunk_id)
        return None if entry is None else entry.appearance

    def at(self, chunk_id: int, offset: int) -> tuple[Viseme, float]:
        """The mouth shape ``offset`` samples into the chunk, its weight ramped in per cue."""
        entry = self._chunks.get(chunk_id)
        if entry is None:
            return Viseme.SIL, 0.0
        for cue in entry.cues:
            if cue.start <= offset < cue.end:
                ramp = min(1.0, (offset - cue.start + 1) / ATTACK_SAMPLES)
                return cue.viseme, round(cue.weight * ramp, 3)
        return Viseme.SIL, 0.0

    def drop_older(self, epoch: int) -> None:
        """Barge-in: forget every chunk of an older epoch."""
        self._chunks = {k: v for k, v in self._chunks.items() if v.epoch >= epoch}
