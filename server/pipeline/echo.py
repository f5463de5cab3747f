"""The avatar's own voice taken out of what the client's microphone sends back.

A client without echo cancellation (speakers and a microphone in a game engine, GStreamer,
a native app, a browser with its AEC off) returns the reply's audio, delayed and coloured by
the room, into its microphone. Unchecked, the turn detector takes it for the user and the
avatar interrupts itself. The server knows exactly what it sent, and when: every sample the
link's audio track pulled (silence too) is the far end of an echo canceller, fed in the order
it went out, and each inbound frame is cleaned before the turn detector and the recogniser
hear it. The canceller estimates the echo path (delay, gain per frequency) online.

A linear canceller leaks while it relearns the path: at a session's first words, and each
time the client's playout delay moves (its jitter buffer stretching or skipping). The
residual echo gate (server/pipeline/echo_gate.py) catches those leaks for the voice detector;
the recogniser hears the cancelled audio ungated (the quieter sounds of the user's words are
kept for it), and, until an echo path is found, the user talking over the avatar as heard
(a canceller that has found no path damps their softer sounds to silence), from 120 ms
before their first loud frame: those frames, already given, are given again (the rewind).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import av
import numpy as np
import numpy.typing as npt

from server.pipeline.echo_gate import ResidualEchoGate, mean_square
from server.runtime.media import MEDIA_RATE_HZ, pcm_level

RATE_HZ = 16_000
FRAME = RATE_HZ // 100  # samples in the canceller's 10 ms frame
FAR_KEPT = 20 * FRAME  # far-end samples kept for the next inbound frame (200 ms)
ONSET_KEPT = 20  # frames heard kept for a rewind (see Cleaned; at most gate.onset_frames used)
FAR_ACTIVE_LEVEL = 0.003  # far-end RMS (0-1, ~-50 dBFS) above which the avatar is speaking
Pcm16k = npt.NDArray[np.int16]
NO_REWIND: Pcm16k = np.zeros(0, np.int16)  # shared by every Cleaned without one: read-only
NO_REWIND.flags.writeable = False


@dataclass(frozen=True)
class Cleaned:
    """Inbound 16 kHz audio after the echo handling, three views of the same samples: for
    the recogniser (``words``: cancelled), for the voice detector (``voice``: cancelled, what
    is left of the echo gated) and as it was heard (``heard``: a tone's shape, which gating
    breaks, is judged there). ``rewind``: the recogniser's last ``len(rewind)`` samples given
    before these, to be heard as this instead (the user's soft onset, found only after it:
    see EchoPath.clean); mostly empty."""

    words: Pcm16k
    voice: Pcm16k
    heard: Pcm16k
    rewind: Pcm16k = field(default_factory=lambda: NO_REWIND)


class EchoCanceller(Protocol):
    """An acoustic echo canceller on 16 kHz mono int16, in 10 ms (160-sample) frames."""

    def render(self, frame: Pcm16k) -> None:
        """A far-end frame: audio the client is about to play."""
        ...

    def capture(self, frame: Pcm16k) -> Pcm16k:
        """A microphone frame with the echo of the far end removed."""
        ...


class EchoPath:
    """One conversation's far end (what its link's audio track sent) and the cleaning of its
    inbound audio. Without a canceller, audio passes through untouched."""

    rests = True  # the canceller rests while nothing sent can come back (see clean; False:
    # it hears every frame, as before 2026-12-05: benchmarks/inbound_bench.py --ablate rest)

    def __init__(
        self, canceller: EchoCanceller | None, gate: ResidualEchoGate | None = None
    ) -> None:
        self.canceller = canceller
        self.gate = gate or ResidualEchoGate()
        self._resampler: av.AudioResampler | None = None
        self._far = np.zeros(0, np.int16)  # sent, not yet given to the canceller
        self._near = np.zeros(0, np.int16)  # heard, less than a frame
        self.far_frames = 0  # of which the avatar's voice was going out
        self._far_energy = [0.0, 0.0]  # while it was: inbound energy before and after
        self.rested_frames = 0  # inbound frames the canceller did not process (see clean)
        self._resting = False
        self._last_near: Pcm16k | None = None  # the last whole frame heard
        self._heard_before: deque[Pcm16k] = deque(maxlen=ONSET_KEPT)  # the last frames heard
        self.onsets = 0  # words holds begun: their onset given to the recogniser again

    def played(self, pcm: npt.NDArray[np.int16]) -> None:
        """Samples (48 kHz) the link's audio track just sent."""
        if self.canceller is None or not len(pcm):
            return
        if self._resampler is None:
            self._resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE_HZ)
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = MEDIA_RATE_HZ
        parts = [self._far, *(o.to_ndarray().reshape(-1) for o in self._resampler.resample(frame))]
        # what the client has not sent back within FAR_KEPT went out while its microphone
        # was silent or gone: its echo will never be heard
        self._far = np.concatenate(parts)[-FAR_KEPT:].astype(np.int16)

    def clean(self, pcm: Pcm16k) -> Cleaned:
        """Inbound 16 kHz audio without the avatar's echo: for the recogniser (cancelled), and
        for the voice detector (cancelled, and what is left of the echo gated: see
        server/pipeline/echo_gate.py). They lag by less than one 10 ms frame (a partial frame
        waits for the rest).

        While nothing the avatar sent is within any echo's reach (the residual gate's window:
        750 ms of quiet far end) every frame heard passes to both untouched, so the canceller
        rests: neither the quiet far end nor the heard frames go through it (about 60 % of
        this path's CPU, on the event loop, for every 20 ms heard while the avatar is silent:
        the user's turn). The two streams skip together, so it stays aligned; it wakes on the
        frame heard just before, so its output runs on from there."""
        canceller = self.canceller
        if canceller is None:
            return Cleaned(pcm, pcm, pcm)
        near = np.concatenate([self._near, pcm]) if len(self._near) else pcm
        whole = len(near) // FRAME * FRAME
        self._near = near[whole:].copy()
        # everything sent so far goes in first: the canceller measures the delay from there
        sent = len(self._far) // FRAME * FRAME
        far = [self._far[start : start + FRAME] for start in range(0, sent, FRAME)]
        for frame in far:
            self.gate.sent(frame)
        far_level = pcm_level(self._far[:sent])
        self._far = self._far[sent:]
        resting = self.rests and self.gate.quiet  # what it would make of these goes unused
        if resting:
            self.rested_frames += whole // FRAME
            frames = [near[i : i + FRAME] for i in range(0, whole, FRAME)]
        else:
            if self._resting and self._last_near is not None:
                # awake again: the frame heard last goes through it first (with the silence
                # sent then), so that its output runs on from there, not from before its rest
                canceller.render(np.zeros(FRAME, np.int16))
                canceller.capture(self._last_near)
            for frame in far:
                canceller.render(frame)
            frames = [canceller.capture(near[i : i + FRAME]) for i in range(0, whole, FRAME)]
        self._resting = resting
        if whole:
            self._last_near = near[whole - FRAME : whole].copy()
        cleaned = np.concatenate(frames) if frames else np.zeros(0, np.int16)
        if far_level > FAR_ACTIVE_LEVEL and whole:
            self.far_frames += len(frames)
            self._far_energy[0] += mean_square(near[:whole]) * whole
            self._far_energy[1] += mean_square(cleaned) * whole
        if not frames:
            return Cleaned(cleaned, cleaned, cleaned)
        heard = [near[i * FRAME : (i + 1) * FRAME] for i in range(len(frames))]
        words, voice, began = [], [], []
        for i, (as_heard, f) in enumerate(zip(heard, frames, strict=True)):
            for_words, for_voice = self.gate.apply(as_heard, f)
            words.append(for_words)
            voice.append(for_voice)
            if self.gate.hold_began:
                began.append(i)
        rewind = self._onsets(began, heard, words)
        self._heard_before.extend(heard)
        return Cleaned(np.concatenate(words), np.concatenate(voice), near[:whole], rewind)

    def _onsets(self, began: list[int], heard: list[Pcm16k], words: list[Pcm16k]) -> Pcm16k:
        """The recogniser hears the ``gate.onset_frames`` before each words hold begins (the
        frames at ``began``) as heard: ``words`` of this call changed in place, and the heard
        frames for those given before it returned (the rewind)."""
        depth = 0  # frames given before this call to hear again
        self.onsets += len(began)
        for at in began:
            start = at - self.gate.onset_frames
            for i in range(max(0, start), at):
                words[i] = heard[i]
            depth = max(depth, -start)
        depth = min(depth, len(self._heard_before))
        if not depth:
            return NO_REWIND
        return np.concatenate(list(self._heard_before)[-depth:])

    @property
    def masked_ms(self) -> float:
        """Inbound audio (ms) since the residual echo gate last hid a frame from the voice
        detector (the user's voice there, if any, was not heard by it); inf if never."""
        if self.canceller is None or self.gate.silenced == 0:
            return float("inf")
        return self.gate.since_silenced * 1000 * FRAME / RATE_HZ

    def restart(self) -> None:
        """A new inbound stream (a resume): what the old one left is dropped."""
        self._far = np.zeros(0, np.int16)
        self._near = np.zeros(0, np.int16)
        self._last_near = None
        self._heard_before.clear()

    def describe(self) -> dict[str, Any]:
        """Whether echo is cancelled, and by how much (dB of inbound energy removed while the
        avatar spoke: the echo, or less where the user talked over it); the echo path's gain
        and delay as learnt, and the frames the residual echo gate silenced."""
        before, after = self._far_energy
        gain = self.gate.gain_db
        removed = 10 * np.log10((before + 1.0) / (after + 1.0)) if self.far_frames else None
        # the delay last found, while the verdict is that the echo comes back
        lag = self.gate.delay.lag if self.gate.delay.echo else None
        return {
            "cancelling": self.canceller is not None,
            "frames": self.gate.frames,  # inbound frames cleaned
            "frames_while_speaking": self.far_frames,
            "removed_db": None if removed is None else round(float(removed), 1),
            "echo_gain_db": None if gain is None else round(gain, 1),
            "echo_heard": self.gate.echo_heard,
            "echo_delay_ms": None if lag is None else lag * 10,
            "echo_follows_sent": self.gate.delay.echo,  # the level envelopes correlate
            "frames_silenced": self.gate.silenced,
            "frames_rested": self.rested_frames,  # heard while the canceller rested
            "onsets_heard_again": self.onsets,  # the user's soft onset, given again as heard
        }
