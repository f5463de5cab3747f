"""A client with speakers and no echo cancellation: what it receives comes back into its mic."""

from __future__ import annotations

from collections.abc import Callable

import av
import numpy as np
import numpy.typing as npt

from client.cli import ScriptedMic
from models.vad import SileroVad, WebRtcGate
from server.config import VadConfig
from server.pipeline.echo import EchoPath
from server.pipeline.resample import resample
from server.pipeline.turn_detector import TurnDetector, VadEventKind

PCM = npt.NDArray[np.int16]
PULL = 960  # the audio track's 20 ms at 48 kHz
HEARD = 320  # the same 20 ms at 16 kHz
RATE_HZ = 48_000
ROOM_MS = 80  # the room's impulse response
JITTER_KEPT = RATE_HZ * 60 // 1000  # samples queued beyond the delay before it skips ahead


def room_response(gain_db: float, reverb: bool, seed: int = 0) -> npt.NDArray[np.float64]:
    """The path from speaker to microphone: the direct sound and, with ``reverb``, a tail of
    reflections decaying 60 dB in about 100 ms; its energy is ``gain_db``."""
    if not reverb:
        return np.array([10 ** (gain_db / 20)])
    n = RATE_HZ * ROOM_MS // 1000
    rng = np.random.default_rng(seed)
    response = rng.standard_normal(n) * np.exp(-np.arange(n) / (RATE_HZ * 0.015))
    response[0] = 3.0  # the direct path dominates
    scaled: npt.NDArray[np.float64] = response / np.sqrt(np.sum(response**2))
    return scaled * 10 ** (gain_db / 20)


class EchoingMic(ScriptedMic):
    """A :class:`ScriptedMic` that also hears the client's speaker. The frames in ``received``
    (a ClientPeer's ``audio``: (arrival, 48 kHz frame)) play back to back on the microphone's
    own clock, the first ``delay_ms`` after it arrived (when the speaker runs dry the next
    plays on arrival and the delay grows; a frame more than ``JITTER_KEPT`` past its due time
    is skipped, as a jitter buffer catches up). What the speaker plays comes back through
    :func:`room_response`, mixed with the clips the microphone plays."""

    def __init__(self, delay_ms: float, gain_db: float = -10.0, reverb: bool = True) -> None:
        super().__init__()
        self.received: list[tuple[float, npt.NDArray[np.int16]]] = []
        self._taken = 0  # frames of ``received`` already placed on the speaker's timeline
        self._delay_s = delay_ms / 1000
        self._speaker: npt.NDArray[np.float64] = np.zeros(0)  # from sample ``_start`` on
        self._start = 0  # the microphone's next sample
        self._end = 0  # where the speaker's last placed frame ends
        self._room = room_response(gain_db, reverb)
        self._tail: npt.NDArray[np.float64] = np.zeros(len(self._room) - 1)
        self.delays_ms: list[float] = []  # each played frame: arrival -> into the mic (ms)
        self.skipped = 0  # frames

    def _place(self, t0: float) -> None:
        """Put the frames that arrived since the last call on the speaker's timeline."""
        for arrival, pcm in self.received[self._taken :]:
            due = round((arrival + self._delay_s - t0) * RATE_HZ)
            # a playout buffer: the first frame when it is due, then each right after the one
            # before (continuous), or now if the speaker ran dry
            at = max(self._end, self._start) if self._end else max(due, self._start)
            if at - due > JITTER_KEPT:
                self.skipped += 1
                continue
            end = at + len(pcm) - self._start
            if end > len(self._speaker):
                self._speaker = np.concatenate([self._speaker, np.zeros(end - len(self._speaker))])
            self._speaker[at - self._start : end] = pcm
            self._end = at + len(pcm)
            self.delays_ms.append(round((at / RATE_HZ + t0 - arrival) * 1000, 1))
        self._taken = len(self.received)

    async def recv(self) -> av.AudioFrame:
        frame = await super().recv()
        assert self._t0 is not None and frame.pts is not None
        mine = frame.to_ndarray().reshape(-1).astype(np.float64)
        n = len(mine)
        self._start = frame.pts
        self._place(self._t0)
        played = np.zeros(n)
        take = min(n, len(self._speaker))
        played[:take] = self._speaker[:take]
        self._speaker = self._speaker[take:]
        self._start += n
        wet = np.convolve(played, self._room).astype(np.float64)
        wet[: len(self._tail)] += self._tail
        self._tail = wet[n:]
        mixed = np.clip(mine + wet[:n], -32768, 32767).astype(np.int16)
        out = av.AudioFrame.from_ndarray(mixed.reshape(1, -1), format="s16", layout="mono")
        out.sample_rate, out.pts, out.time_base = frame.sample_rate, frame.pts, frame.time_base
        return out


def echo_of(
    far: PCM, delay_ms: int, reverb: bool, gain_db: float = -10.0, noise_seed: int | None = None
) -> PCM:
    """What a microphone beside the speaker hears (48 kHz): ``far`` back through the room,
    ``delay_ms`` later, with the microphone's hiss (seeded by ``noise_seed``, else the delay)."""
    wet = np.convolve(far.astype(np.float64), room_response(gain_db, reverb))[: len(far)]
    delayed = np.concatenate([np.zeros(delay_ms * 48), wet])[: len(far)]
    rng = np.random.default_rng(delay_ms if noise_seed is None else noise_seed)
    noise = rng.standard_normal(len(far)) * 30  # the mic's hiss
    mic: PCM = np.clip(delayed + noise, -32768, 32767).astype(np.int16)
    return mic


def through(
    path: EchoPath, far: PCM, mic: PCM, each: Callable[[], None] | None = None
) -> tuple[PCM, PCM]:
    """``far`` sent and ``mic`` heard, 20 ms at a time in the server's order; the mic as the
    recogniser (with the echo path's rewinds) and as the voice detector hear it (16 kHz).
    ``each`` is called after each 20 ms (to follow the path's state)."""
    heard = resample(mic, 48_000, 16_000)
    words: list[PCM] = []
    voice: list[PCM] = []
    for n in range(len(far) // PULL):
        path.played(far[n * PULL : (n + 1) * PULL])
        cleaned = path.clean(heard[n * HEARD : (n + 1) * HEARD])
        if len(cleaned.rewind):  # as the server's Utterance.repair
            given = np.concatenate(words)
            given[len(given) - len(cleaned.rewind) :] = cleaned.rewind
            words = [given]
        words.append(cleaned.words)
        voice.append(cleaned.voice)
        if each is not None:
            each()
    return np.concatenate(words), np.concatenate(voice)


def detector() -> TurnDetector:
    """The turn detector as the server builds it (webrtcvad + Silero, default settings)."""
    config = VadConfig()
    return TurnDetector(WebRtcGate(config.aggressiveness), SileroVad(), config)


def voice_events(det: TurnDetector, pcm: PCM) -> list[tuple[VadEventKind, float]]:
    """The detector's events (kind, at_ms) for ``pcm`` (16 kHz), but for the gate's onsets in
    the first 100 ms (webrtcvad's noise estimate starts from nothing)."""
    found = []
    for i in range(0, len(pcm), HEARD):
        found += [(e.kind, e.at_ms) for e in det.push(pcm[i : i + HEARD], arrival_ms=i / 16)]
    return [(kind, ms) for kind, ms in found if ms > 100 or kind is not VadEventKind.ONSET]
