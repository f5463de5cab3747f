"""The residual echo gate: what an echo canceller leaves of the avatar's voice, kept from the
voice detector.

A linear canceller leaks while it relearns the echo path: at a session's first words, and
each time the client's playout delay moves. The gate uses what the server knows for certain,
the level of every 10 ms frame it sent, and learns from what comes back how loud the echo
alone is (the path's **gain**). A frame heard while the avatar talks is the user only if it is
louder than the echo could be: the loudest frame sent within any delay up to 600 ms, times
the gain, plus a margin. Until the gain is known the echo is assumed as loud as loud speakers
beside the microphone make it (``FIRST_GAIN_DB``). The path's **delay** is estimated too (the
lag at which the level envelopes of what was sent and what was heard correlate best), for the
session's diagnostics: bounding the window by it let users through less often in the
benchmark (a delay estimate a few frames off lets the echo's bound fall too soon or too late).

Where nothing of the avatar comes back, the audio passes untouched: the gain is below
``NO_ECHO_DB`` (a client that cancels its own echo, headphones, a quiet room), or what is
heard does not follow what was sent (the delay estimates' verdict: server/pipeline/
echo_delay.py). Untouched, because WebRTC's canceller, never finding an echo path, keeps
damping the near end while the far end plays (a steady tone over a silent microphone is wiped
out whole), and the user's words would be lost to it.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import numpy.typing as npt

from server.pipeline.echo_delay import MAX_LAG_FRAMES, EchoDelay

FAR_ACTIVE = (0.003 * 32768) ** 2  # a mean square (~-50 dBFS) above which the avatar talks
NOW_FRAMES = 10  # the avatar talks now: a frame of the last 100 ms sent was active
REVERB_FRAMES = 15  # a room's reverberation after the longest echo delay (150 ms)
GAIN_FRAMES = 300  # the gain is learnt over the last 300 frames heard while it talked (3 s)
GAIN_TRUSTED = 80  # frames (0.8 s, longer than any delay) before the learnt gain is used
ECHO_ONLY_DB = 10.0  # a frame the canceller took this much from is the echo alone
GAIN_QUANTILE = 0.99  # of those: nearly the loudest, the path's own gain
ANY_GAIN_QUANTILE = 0.9  # of every frame (the user talks over few)
FIRST_GAIN_DB = -10.0  # the echo's gain until then: loud speakers beside the microphone
NO_ECHO_DB = -40.0  # a gain below this: nothing comes back (the microphone's noise)
GATE_MARGIN_DB = 3.0  # above the bound: the echo of a far-end sound louder than the quantile
USER_ABOVE_DB = 6.0  # a frame this far above the bound of a known gain: the user talks
USER_RUN_FRAMES = 3  # frames in a row above the bound before they pass as the user's
USER_FRAMES = 30  # and for 300 ms after (frames heard while the avatar talked) nothing is learnt,
USER_BEFORE_FRAMES = 5  # nor in the 50 ms before it (a word's onset, damped the most)
WORDS_HOLD_FRAMES = 10  # the recogniser hears the user's frames as heard, and 100 ms after them
# (while no echo path is found: see ResidualEchoGate.apply)
ONSET_FRAMES = 12  # and the 120 ms before their first one (a soft onset: EchoPath.clean)
CANCELLED_DB = 20.0  # a frame the canceller took this much from is its echo (once it knows it)
FLOOR_FRAMES = 200  # the noise floor is a low quantile of the last 2 s heard (cleaned)
FLOOR_QUANTILE = 0.1
Pcm16k = npt.NDArray[np.int16]


class EchoGain:
    """The echo path's gain (dB, heard over sent) as one window of the far end sees it, from
    the frames heard while the avatar talked: the ``GAIN_QUANTILE`` of those that were the
    echo alone (the canceller took ``ECHO_ONLY_DB`` or more: not the user, whom it mostly
    keeps, and none near a frame that is surely the user's: see :meth:`learn`),
    ``FIRST_GAIN_DB`` until there are enough of them. ``any_db``, the ``ANY_GAIN_QUANTILE``
    of all of them, says whether anything comes back at all (the microphone's noise where
    nothing does; the user talks over few: a reply pauses when they do)."""

    def __init__(self, user_above_db: float = USER_ABOVE_DB) -> None:
        self._user_above_db = user_above_db  # inf: every frame the canceller took from counts
        self._alone: deque[float] = deque(maxlen=GAIN_FRAMES)
        self._all: deque[float] = deque(maxlen=GAIN_FRAMES)
        self._count = 0
        self._user_frames = 0  # left of the frames after the user talked over the avatar
        self._pending: deque[float | None] = deque()  # the last frames' ratios (None: not alone)
        self.db = FIRST_GAIN_DB
        self.any_db = FIRST_GAIN_DB  # over every frame

    def learn(self, ratio_db: float, echo_alone: bool) -> None:
        """A frame heard while the avatar talked: ``ratio_db`` over the loudest sent, and
        whether the canceller took ``ECHO_ONLY_DB`` or more from it.

        Once the gain is known, a frame ``USER_ABOVE_DB`` over the gate's bound is the user
        talking over the avatar. Neither it nor the frames in the ``USER_FRAMES`` after it and
        the ``USER_BEFORE_FRAMES`` before it count as the echo alone, whatever the canceller
        took (so a frame counts ``USER_BEFORE_FRAMES`` late). WebRTC's canceller damps a user
        talking over the far end by 10 dB and more at times, each word's first frames most:
        learnt as the echo, they made the gain +1 to +4 dB where the echo's was -10 dB (30 of
        30 syntheses offline), and the gate then hid the user from the detector while the
        avatar talked, until they had left the window (3 s of its talk). An echo that grows
        by less than ``USER_ABOVE_DB`` is still learnt."""
        self._all.append(ratio_db)
        if self.known and ratio_db > self.db + GATE_MARGIN_DB + self._user_above_db:
            self._user_frames = USER_FRAMES + 1
            self._pending.clear()
        self._user_frames = max(0, self._user_frames - 1)
        self._pending.append(ratio_db if echo_alone and not self._user_frames else None)
        if len(self._pending) > USER_BEFORE_FRAMES:
            oldest = self._pending.popleft()
            if oldest is not None:
                self._alone.append(oldest)
        self._count += 1
        if self._count % 10 or not self.trusted:
            return
        self.any_db = float(np.quantile(self._all, ANY_GAIN_QUANTILE))
        if self.known:
            self.db = float(np.quantile(self._alone, GAIN_QUANTILE))

    @property
    def trusted(self) -> bool:
        return len(self._all) >= GAIN_TRUSTED

    @property
    def known(self) -> bool:
        """The gain comes from frames of the echo alone: the canceller has found the path."""
        return len(self._alone) >= GAIN_TRUSTED


class ResidualEchoGate:
    """Silences, for the voice detector, what the canceller left of the echo while the avatar
    talks: a frame whose level as heard is below the echo's bound becomes white noise at the
    noise floor (at the frame's own level where that is lower). The bound is the loudest
    frame sent in the last 750 ms (every delay up to ``MAX_LAG_FRAMES`` and its reverberation)
    plus the gain (nearly the loudest the echo alone came back) plus ``GATE_MARGIN_DB``. The
    level is judged as heard, not after cancelling: a canceller relearning the path adds
    energy, and one not sure of it damps a user talking over the far end (WebRTC's wipes one
    out whole over a steady tone while it is still learning). Once the canceller has found
    the path, a loud frame it took ``CANCELLED_DB`` or more from is the echo's own peak, not
    the user (whom it damps far less). A frame above the bound is the user's only where the
    ``USER_RUN_FRAMES`` - 1 before it were too: right after the client's playout delay moves,
    a 10 ms peak of the echo may top the bound (1 reply in 40 in tests/models/test_echo.py),
    and the voice gate took it for an onset that paused the reply; under a late server, two
    in a row (1 of 50 full replies in the slow profile, 0.5-1.9 dB above it: a gain learnt at
    -15 dB where the path's was -10); the user's words stay above it for many frames, and
    their first 20 ms is the cost."""

    def __init__(self, user_above_db: float = USER_ABOVE_DB) -> None:
        """``user_above_db``: see :meth:`EchoGain.learn` (inf: as before 2026-12-05)."""
        self._far: deque[float] = deque(maxlen=MAX_LAG_FRAMES + REVERB_FRAMES)
        self.delay = EchoDelay()
        self._wide = EchoGain(user_above_db)  # for the window of every delay up to MAX_LAG_FRAMES
        self._floors: deque[float] = deque(maxlen=FLOOR_FRAMES)  # cleaned mean squares
        self._floor = 0.0  # the noise floor (a mean square)
        self._noise = np.random.default_rng(0)  # comfort noise in place of a silenced frame
        self.frames = 0
        self.silenced = 0  # frames
        self.since_silenced = 1 << 30  # frames heard since the last one silenced
        self._above = 0  # frames in a row heard above the echo's bound, to the last
        self.words_hold = WORDS_HOLD_FRAMES  # frames (0: the canceller's output, as before)
        self._words_held = 0  # frames left that the recogniser hears as heard
        self.onset_frames = ONSET_FRAMES  # heard again before a hold begins (0: not)
        self.hold_began = False  # the last frame applied began a words hold
        self._quiet_sent = 0  # far-end frames sent in a row below FAR_ACTIVE

    def sent(self, frame: Pcm16k) -> None:
        """A far-end frame, as the canceller got it (or would have: see ``quiet``)."""
        power = mean_square(frame)
        self._far.append(power)
        self.delay.sent(db(power))
        self._quiet_sent = self._quiet_sent + 1 if power < FAR_ACTIVE else 0

    @property
    def quiet(self) -> bool:
        """Nothing sent within any echo's reach (the last ``MAX_LAG_FRAMES`` +
        ``REVERB_FRAMES`` far-end frames all quiet): every frame heard now passes untouched,
        whatever a canceller made of it."""
        return self._quiet_sent >= MAX_LAG_FRAMES + REVERB_FRAMES

    def apply(self, heard: Pcm16k, cleaned: Pcm16k) -> tuple[Pcm16k, Pcm16k]:
        """The frame for the recogniser and for the voice detector, from ``heard`` and the
        canceller's output for it, ``cleaned``: ``heard`` for both where nothing was sent that could
        come back, where nothing comes back, and where the user is louder than the echo could be,
        for a ``USER_RUN_FRAMES``-th frame in a row (the canceller damps a user talking over the far
        end, and its output misleads both); else white noise at the noise floor for the detector
        (the voice gate calls even a faint frame of speech's shape voice, and silence would reset
        its own noise estimate: the floor's return would then sound like an onset) and ``cleaned``
        for the recogniser (the avatar's words left out of what it transcribes), except from the
        user's first frame above the bound until ``words_hold`` frames after their last, while the
        delay estimates have not found an echo: ``heard`` (a canceller that has not learnt a path
        damps the user's softer sounds to silence while the far end plays: "Mhm." was heard as
        "Okay, Kim."; one that has keeps them, and the echo under them, heard, misleads the
        recogniser more). ``hold_began`` says whether this frame began such a hold: the
        ``onset_frames`` before it were the user's soft onset, and the echo path gives them to the
        recogniser again as heard."""
        power, heard_power = mean_square(cleaned), mean_square(heard)
        self._floors.append(power)
        if self.frames % 10 == 0:
            self._floor = float(np.quantile(self._floors, FLOOR_QUANTILE))
        self.frames += 1
        self.since_silenced += 1
        recent = list(self._far)[::-1]  # lag 0 first
        wide = max(recent, default=0.0)
        talking = max(recent[:NOW_FRAMES], default=0.0) >= FAR_ACTIVE
        taken_db = db(heard_power) - db(power)  # what the canceller took from the frame
        alone = taken_db >= ECHO_ONLY_DB
        if talking:
            self.delay.heard(db(heard_power))
            self._wide.learn(db(heard_power) - db(wide), alone)
        run, self._above = self._above, 0
        self._words_held = max(0, self._words_held - 1)
        self.hold_began = False
        if self.echo_heard is False:
            return heard, heard
        if wide < FAR_ACTIVE:  # nothing sent that could still come back: nothing to cancel
            return heard, heard
        loud = db(heard_power) >= db(wide) + self._wide.db + GATE_MARGIN_DB
        above = loud and not (self._wide.known and taken_db >= CANCELLED_DB)
        self._above = run + 1 if above else 0
        if above and self.words_hold and self.delay.echo is not True:
            self.hold_began = not self._words_held
            self._words_held = self.words_hold + 1  # this frame and words_hold after it
        if self._above >= USER_RUN_FRAMES:
            return heard, heard
        self.silenced += 1
        self.since_silenced = 0
        # never louder than the frame itself: right after the user spoke the floor's window
        # still holds their words, and noise at that level over a silent microphone (a client
        # that sends digital silence) is an onset to the voice gate
        level = min(self._floor, heard_power)
        noise = self._noise.standard_normal(len(cleaned)) * np.sqrt(level)
        comfort: Pcm16k = np.clip(noise, -32768, 32767).astype(np.int16)
        return (heard if self._words_held else cleaned), comfort

    @property
    def gain_db(self) -> float | None:
        """The echo path's gain as learnt (dB, heard over the loudest sent in 600 ms), None
        before it is trusted."""
        return self._wide.db if self._wide.trusted else None

    @property
    def echo_heard(self) -> bool | None:
        """Whether any of the avatar's voice comes back: False where nothing is heard while it
        talks (once the gain is trusted) or where what is heard does not follow it (once the
        delay estimates say so), None until one of them is known."""
        if self._wide.trusted and self._wide.any_db < NO_ECHO_DB:
            return False
        if self.delay.echo is False:
            return False
        return True if self._wide.trusted else None


def mean_square(pcm: Pcm16k) -> float:
    """Mean square of int16 samples (int16 units; 0 for none). A dot product: three times
    quicker than squaring and averaging, and the same figure (each partial sum of squares of
    int16 samples, below 2**53 for any frame here, is exact in float64)."""
    if not len(pcm):
        return 0.0
    samples = pcm.astype(np.float64)
    return float(np.dot(samples, samples)) / len(samples)


def db(power: float) -> float:
    """A mean square (int16 units) in dB; 1e-3 keeps digital silence finite."""
    return 10 * math.log10(power + 1e-3)
