"""Turn detection on 16 kHz input: a cheap gate confirmed by a speech model, with hysteresis.

Every 20 ms frame is judged voiced when the gate (webrtcvad) fires and the confirming model
(Silero) agrees. ``speech_start_ms`` of consecutive voiced audio makes a speech start, stamped
with the arrival time of the first frame of the gate's voiced run that led to it (the barge-in
reaction is measured from there, so the confirming model's delay counts);
``end_of_turn_ms`` without speech makes a speech stop. Before that, ``onset_ms`` of audio
the gate alone calls voice makes an onset: the first sign of the user's voice, which pauses a
reply at once while the confirming model (and the interjection judge) decide. The confirming
model only runs while the gate has fired recently or speech is on, so silence and steady noise
cost almost nothing.

Tones are not speech: a run of voiced frames whose every frame is tonal (nearly all of its
energy in a few narrow spectral lines: a beep, a ring, a whistle, a pure tone, at any level)
never makes a speech start, even when both models call it voice. Speech has a few such frames
at most (a held vowel); the first frame that is not tonal lets its run start as usual. A tone
is judged as heard, before the echo handling, whose comfort noise in place of the avatar's echo
would break its shape.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import numpy as np
import numpy.typing as npt

from server.config import VadConfig
from server.pipeline.echo import EchoCanceller

log = logging.getLogger(__name__)

RATE_HZ = 16_000
FRAME = 320  # 20 ms at 16 kHz
Pcm16k = npt.NDArray[np.int16]

TONAL_SHARE = 0.97  # a frame is tonal when its 3 strongest spectral lines hold this much energy
TONAL_LINES = 3
TONAL_FFT = 1024  # 15.6 Hz bins at 16 kHz; a 20 ms Hann window's main lobe is +-6 bins
TONAL_LOBE_BINS = 6
_HANN = np.hanning(FRAME)
STOP_HYSTERESIS = 0.15  # speech goes on while the probability stays above threshold - this
GATE_HOLD_FRAMES = 10  # keep the confirming model running 200 ms after the gate last fired
WARMUP_WINDOWS = 2  # windows of history fed to a freshly reset model


# quiet this long while speaking: a pause (what was said may be all). Silero falls quiet about
# 45 ms after the last word; at 40 ms more, the decode that hears the end of speech starts while
# the end-of-turn model hears the utterance (at 60 ms), and its words and the LLM's verdict on
# them are mostly there by the short silence's end (benchmarks/end_of_turn_bench.py --ablate
# pause-100: at 100 ms the complete ones' silence was 272 against 246 ms at the median)
PAUSE_MS = 40.0


class SpeechGate(Protocol):
    def is_speech(self, frame: Pcm16k) -> bool: ...


class SpeechProbability(Protocol):
    window: int

    def probability(self, window: Pcm16k) -> float: ...

    def reset(self) -> None: ...


class TurnCompleteness(Protocol):
    """Whether an utterance sounds finished: the probability (0-1) that the user's turn is
    complete, from its 16 kHz audio (a model that reads prosody and words; CPU-heavy, so
    callers run it off the event loop)."""

    def probability(self, pcm: Pcm16k) -> float: ...


class VadState(Enum):
    SILENCE = "silence"
    SPEECH = "speech"


class VadEventKind(Enum):
    ONSET = "onset"  # the gate alone heard voice (not yet confirmed)
    START = "start"
    STOP = "stop"


@dataclass(frozen=True)
class VadEvent:
    """A decision: ``at_ms`` on the input timeline. On the clock (ms): ``onset_arrival_ms``, when
    the first frame the gate called voice arrived (consonant onsets included), and
    ``confirmed_arrival_ms``, when the first frame both the gate and the confirming model
    called voice arrived."""

    kind: VadEventKind
    at_ms: float
    onset_arrival_ms: float
    confirmed_arrival_ms: float = 0.0


def line_share(frame: Pcm16k, lines: int = TONAL_LINES) -> float:
    """Share (0-1) of a 20 ms frame's energy within its ``lines`` strongest spectral peaks
    (each with its window's main lobe): ~1 for tones, rings and beeps, well below for speech
    and noise; 0 for silence."""
    samples = frame.astype(np.float64)
    samples -= samples.mean()  # a DC offset is no sound
    power = np.abs(np.fft.rfft(samples * _HANN, TONAL_FFT)) ** 2
    total = float(power.sum())
    if total <= 0.0:
        return 0.0
    held = 0.0
    for _ in range(lines):
        peak = int(np.argmax(power))
        lobe = slice(max(0, peak - TONAL_LOBE_BINS), peak + TONAL_LOBE_BINS + 1)
        held += float(power[lobe].sum())
        power[lobe] = 0.0
    return held / total


class TurnDetector:
    """Feeds frames to the gate and the confirming model; emits speech start/stop events."""

    def __init__(
        self,
        gate: SpeechGate,
        confirm: SpeechProbability,
        config: VadConfig,
        completeness: TurnCompleteness | None = None,
        echo: EchoCanceller | None = None,
    ) -> None:
        """``completeness``: the end-of-turn model the conversation may ask; ``echo``: the
        session's echo canceller, which the conversation runs on the audio before it reaches
        this detector (the detector itself runs neither)."""
        self.completeness = completeness
        self.echo = echo
        self._gate = gate
        self._confirm = confirm
        self._threshold = config.silero_threshold
        self._start_frames = max(1, config.speech_start_ms // 20)
        self._stop_frames = max(1, config.end_of_turn_ms // 20)
        self._onset_frames = max(1, config.onset_ms // 20)
        self._gate_run = 0  # consecutive frames the gate called voice
        self._state = VadState.SILENCE
        self._pending = np.zeros(0, np.int16)  # not yet a whole 20 ms frame
        self._pending_heard = np.zeros(0, np.int16)  # the same, as heard
        self._window_buf = np.zeros(0, np.int16)  # not yet a whole model window
        self._history: deque[Pcm16k] = deque(maxlen=WARMUP_WINDOWS * 2)
        self._model_on = False
        self._since_gate = GATE_HOLD_FRAMES + 1
        self._prob = 0.0
        self._run = 0
        self._run_tonal = True  # every voiced frame of the current run was tonal
        self._gate_frames = 0  # frames of the gate's latest voiced run ...
        self._gate_tones = 0  # ... and how many of them were tonal
        self._run_arrival = 0.0
        self._gate_arrival = 0.0
        self._confirmed_arrival = 0.0
        self._quiet = 0
        self._samples = 0
        self.frames = 0
        self.model_windows = 0

    @property
    def state(self) -> VadState:
        return self._state

    def tune(self, threshold: float, end_of_turn_ms: int) -> None:
        """A session's own settings (OpenAI ``server_vad``): the confirming model's speech
        probability ``threshold`` (0-1) and the silence (ms) that ends a turn."""
        self._threshold = threshold
        self._stop_frames = max(1, end_of_turn_ms // 20)

    @property
    def quiet_ms(self) -> float:
        """How long the speaker has been quiet (ms), while the turn is not yet over (0 when
        not speaking, or speaking now)."""
        return self._quiet * FRAME * 1000 / RATE_HZ if self._state is VadState.SPEECH else 0.0

    @property
    def gate_tonal(self) -> bool:
        """Whether the gate's latest voiced run was a tone (a beep, a ring): at least half of
        its frames tonal (a beep's attack is not; speech has a few such frames at most)."""
        return self._gate_frames > 0 and 2 * self._gate_tones >= self._gate_frames

    @property
    def gate_quiet_ms(self) -> float:
        """How long (ms) since the gate last called a frame voice."""
        return self._since_gate * FRAME * 1000 / RATE_HZ

    @property
    def position_ms(self) -> float:
        """Input audio judged so far (ms)."""
        return self._samples * 1000 / RATE_HZ

    def end_turn(self) -> VadEvent | None:
        """The conversation ends the speech now (it judged the utterance complete): a speech
        stop at the start of the current quiet; None when not speaking."""
        if self._state is not VadState.SPEECH:
            return None
        return self._to(VadState.SILENCE, VadEventKind.STOP, self._quiet * FRAME)

    def push(self, pcm: Pcm16k, arrival_ms: float, heard: Pcm16k | None = None) -> list[VadEvent]:
        """Judge newly received 16 kHz audio that arrived at ``arrival_ms``; ``heard``: the same
        samples before the echo handling (a tone is judged there: the gate's comfort noise in
        place of the echo would break its shape), else ``pcm``."""
        data = np.concatenate([self._pending, pcm]) if len(self._pending) else pcm
        raw = data if heard is None else np.concatenate([self._pending_heard, heard])
        assert len(raw) == len(data), "heard and pcm are the same samples"
        events: list[VadEvent] = []
        n = len(data) // FRAME * FRAME
        for start in range(0, n, FRAME):
            event = self._frame(data[start : start + FRAME], arrival_ms, raw[start : start + FRAME])
            if event is not None:
                events.append(event)
        self._pending = data[n:].copy()
        self._pending_heard = raw[n:].copy()
        return events

    def _frame(self, frame: Pcm16k, arrival_ms: float, heard: Pcm16k) -> VadEvent | None:
        self.frames += 1
        self._samples += FRAME
        gate = self._gate.is_speech(frame)
        tonal = gate and line_share(heard) >= TONAL_SHARE  # judged once, for both runs
        if gate and self._since_gate > 0:
            self._gate_arrival = arrival_ms  # the gate's current voiced run began here
            self._gate_frames = self._gate_tones = 0
        if gate:
            self._gate_frames += 1
            self._gate_tones += tonal
        self._since_gate = 0 if gate else self._since_gate + 1
        self._gate_run = self._gate_run + 1 if gate else 0
        self._feed_model(frame)
        if self._state is VadState.SILENCE:
            voiced = gate and self._prob >= self._threshold
            if voiced:
                if self._run == 0:
                    self._confirmed_arrival = arrival_ms
                    # the onset is where the gate first heard this voice, even when the
                    # confirming model agreed only a few frames later
                    self._run_arrival = min(arrival_ms, self._gate_arrival)
                    self._run_tonal = True
                self._run += 1
                if self._run_tonal and not tonal:
                    self._run_tonal = False
            else:
                self._run = 0
            if self._run >= self._start_frames and not self._run_tonal:
                return self._to(VadState.SPEECH, VadEventKind.START, self._run * FRAME)
            if self._gate_run == self._onset_frames:
                at_ms = (self._samples - self._gate_run * FRAME) * 1000 / RATE_HZ
                return VadEvent(VadEventKind.ONSET, at_ms, self._gate_arrival)
            return None
        speaking = self._prob >= self._threshold - STOP_HYSTERESIS
        self._quiet = 0 if speaking else self._quiet + 1
        if self._quiet >= self._stop_frames:
            return self._to(VadState.SILENCE, VadEventKind.STOP, self._quiet * FRAME)
        return None

    def _feed_model(self, frame: Pcm16k) -> None:
        """Run the confirming model on whole windows while the gate is (recently) open."""
        wanted = self._state is VadState.SPEECH or self._since_gate <= GATE_HOLD_FRAMES
        if wanted and not self._model_on:
            self._confirm.reset()
            self._model_on = True
            history = np.concatenate(list(self._history)) if self._history else frame[:0]
            self._window_buf = history[-WARMUP_WINDOWS * self._confirm.window :]
        elif not wanted and self._model_on:
            self._model_on = False
            self._prob = 0.0
        self._history.append(frame)
        if not self._model_on:
            return
        self._window_buf = np.concatenate([self._window_buf, frame])
        size = self._confirm.window
        while len(self._window_buf) >= size:
            self._prob = self._confirm.probability(self._window_buf[:size])
            self._window_buf = self._window_buf[size:]
            self.model_windows += 1

    def _to(self, new: VadState, kind: VadEventKind, back_samples: int) -> VadEvent:
        """The one place the state changes; the event is stamped where the run began."""
        old, self._state = self._state, new
        self._run = self._quiet = 0
        at_ms = (self._samples - back_samples) * 1000 / RATE_HZ
        log.debug("vad: %s -> %s at %.0f ms", old.value, new.value, at_ms)
        return VadEvent(kind, at_ms, self._run_arrival, self._confirmed_arrival)
