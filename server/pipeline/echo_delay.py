"""The echo path's delay, and the verdict whether what is heard follows what was sent.

The delay is the lag at which the level envelopes of what was sent and what was heard correlate best
(every 0.5 s, over the last 3 s heard while the avatar talked). Of the last ``VERDICTS`` estimates:
what is heard does not follow what was sent where ``UNCORRELATED`` or more found no delay, and fewer
than ``FOUND`` or fewer than half found one: a client that cancels its own echo in a room with a
steady sound, such as Chromium's beeping fake microphone, on which the canceller and the gain learn
an echo that is not there and the gate would hide the user; a periodic beep now and then correlates
with speech at some lag by chance, a real echo path at nearly every estimate. But an echo not yet
judged, or judged to come back, is judged gone only where at most ``LOST`` of those estimates found
it (none: up to 4 s of the avatar talking without a find; a beeping room's verdict may then wait for
a chance find to leave the last eight): a late server's client plays the avatar in fits and starts
(its playout runs dry every second or two and resumes at a new delay), the echo's envelope then
follows what was sent less closely, and the estimates missed it for 3.5 s at a time (slow profile: r
0.2-0.5 at every lag; and once one find, then misses, at its first estimates); the gate, opened by
them, let the echo through and the avatar interrupted itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

MAX_LAG_FRAMES = 60  # echo delays up to 600 ms
DELAY_FRAMES = 300  # the delay is estimated over the last 3 s heard while the avatar talked
DELAY_EVERY = 50  # frames between estimates
DELAY_CORRELATION = 0.5  # the envelopes' correlation at the lag that makes it the delay
KEPT_CORRELATION = 0.4  # or, while an echo is believed to come back, that keeps it found
VERDICTS = 8  # the last estimates (4 s of the avatar talking) that decide whether echo comes back
FOUND = 2  # of them, found a delay (and at least half did): the echo comes back
UNCORRELATED = 2  # of them, found none (and fewer than FOUND or than half found one): none does
LOST = 0  # of them at most, found one: an echo not believed gone is (none: a find holds it)
FAR_ENVELOPE_FRAMES = 25  # the far end's envelope: its loudest in the last 250 ms
HEARD_ENVELOPE_FRAMES = 5  # and what was heard: its loudest in the last 50 ms
LEVEL_FLOOR_DB = 30.0  # levels below it (about -60 dBFS, a microphone's own noise) count as it


class EchoDelay:
    """The echo path's delay in 10 ms frames: the lag (0 to ``MAX_LAG_FRAMES``) at which the
    far end's level envelope best predicts what was heard while the avatar talked (a Pearson
    correlation of the dB levels of at least ``DELAY_CORRELATION``), as last found (an
    estimate that finds none keeps it); None until found. It keeps, of its last ``VERDICTS``
    estimates that could find one (both envelopes moved), whether each did, and judges from
    them whether the echo comes back (``echo``). Where the 10 ms levels do not correlate
    well enough at any lag, their envelopes are tried: the loudest level of the last
    ``FAR_ENVELOPE_FRAMES`` sent and of the last ``HEARD_ENVELOPE_FRAMES`` heard. A playout
    that moves by a few frames (a client's jitter buffer under a late server) blurs the
    correlation of the levels more than of the envelopes. On 14 replies recorded in the slow
    profile the levels found the delay in 115 of 155 estimates, the envelopes in 139, either
    in 146; with Chromium's beeping microphone heard in place of the echo, in 23, 21 and 34
    of 1,240. While an echo is believed to come back, a correlation of ``KEPT_CORRELATION``
    counts as a find: a late server's client resumes its playout at a new delay every second
    or two, and a 3 s window then holds several (on 51 slow replies, the best lag of 87 % of
    the estimates correlated above 0.4 and 69 % above 0.5; of the beeping microphone's, 10
    and 1.3 %). Levels below ``LEVEL_FLOOR_DB`` count as it: digital silence (a playout run
    dry, the zeros of a stretch the track skipped) weighed 60 dB below any microphone's noise
    in the correlation; and the far end's envelope spans 250 ms, longer than such a stretch
    (200-240 ms), which the client may not play. On 61 slow replies the estimates found the
    echo in 917 of 1,040 without both, 1,034 with them; the beeping microphone in 3.9 and
    1.2 % of its estimates."""

    def __init__(self) -> None:
        self._far: deque[float] = deque(maxlen=DELAY_FRAMES + MAX_LAG_FRAMES + 1)  # dB
        self._sent = 0  # far frames so far
        self._heard: deque[tuple[int, float]] = deque(maxlen=DELAY_FRAMES)  # (sent by then, dB)
        self._since = 0
        self.lag: int | None = None
        self._verdicts: deque[bool] = deque(maxlen=VERDICTS)  # the last estimates: found one
        self.echo: bool | None = None  # whether what is heard follows what was sent (judge)

    def sent(self, level_db: float) -> None:
        self._far.append(max(level_db, LEVEL_FLOOR_DB))
        self._sent += 1

    def heard(self, level_db: float) -> None:
        """A frame heard while the avatar talked."""
        self._heard.append((self._sent, max(level_db, LEVEL_FLOOR_DB)))
        self._since += 1
        if self._since >= DELAY_EVERY and len(self._heard) >= DELAY_FRAMES // 2:
            self._since = 0
            found = self._estimate()
            self.lag = self.lag if found is None else found
            self.echo = judge(self._verdicts, self.echo)

    def _estimate(self) -> int | None:
        """The best lag of the 10 ms levels where it correlates well enough, else of the
        envelopes (see the class; computed only then: this runs on the event loop), else
        None; a verdict kept where a lag could be tried."""
        far = np.array(self._far)
        first = self._sent - len(far)  # the index of far[0] among every frame sent
        at = np.array([sent for sent, _ in self._heard]) - 1 - first  # latest sent, in far
        heard = np.array([level for _, level in self._heard])
        levels = best_lag(far, heard, at)
        # a lower bar keeps an echo found than finds one (see the class)
        bar = KEPT_CORRELATION if self.echo else DELAY_CORRELATION
        if levels is not None and levels[1] > bar:
            self._verdicts.append(True)
            return levels[0]
        far_envelope = loudest(far, FAR_ENVELOPE_FRAMES)
        envelopes = best_lag(far_envelope, loudest(heard, HEARD_ENVELOPE_FRAMES), at)
        if levels is None and envelopes is None:
            return None  # a lag is only found (or missed) where one was tried
        found = envelopes[0] if envelopes and envelopes[1] > bar else None
        self._verdicts.append(found is not None)
        return found


def best_lag(
    far: npt.NDArray[np.float64], heard: npt.NDArray[np.float64], at: npt.NDArray[np.int64]
) -> tuple[int, float] | None:
    """The lag (0 to ``MAX_LAG_FRAMES``) at which the levels ``far`` (dB, in the order sent)
    best predict those ``heard`` (dB; the one heard at ``i`` when ``far[at[i]]`` was the
    latest sent), with its Pearson correlation; None where no lag has ``DELAY_FRAMES`` / 2
    frames heard with both levels moving. Every lag at once (one pass of numpy, not one per
    lag: this runs on the event loop, and 61 correlations one by one held it about 6 ms on
    a 2-core AVX2 host, each 0.5 s of each session's talk)."""
    lags = np.arange(MAX_LAG_FRAMES + 1)[:, None]
    index = at[None, :] - lags  # (lag, frame heard): the far frame it would echo
    ok = index >= 0
    counted = ok.sum(axis=1)
    usable = counted >= DELAY_FRAMES // 2  # a prefix of the lags: at never decreases
    if not usable.any():
        return None
    ok, index, counted = ok[usable], index[usable], counted[usable]
    x = np.where(ok, far[np.maximum(index, 0)], 0.0)
    y = np.where(ok, heard[None, :], 0.0)
    mean_x = x.sum(axis=1) / counted
    mean_y = y.sum(axis=1) / counted
    dx = np.where(ok, x - mean_x[:, None], 0.0)
    dy = np.where(ok, y - mean_y[:, None], 0.0)
    var_x = np.square(dx).sum(axis=1)
    var_y = np.square(dy).sum(axis=1)
    moved = (np.sqrt(var_x / counted) >= 1e-6) & (np.sqrt(var_y / counted) >= 1e-6)
    if not moved.any():
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        r = (dx * dy).sum(axis=1) / np.sqrt(var_x * var_y)
    r = np.where(moved, r, -np.inf)
    best = int(np.argmax(r))  # the first of equals, as the shortest lag
    return best, float(r[best])


def judge(verdicts: Collection[bool], believed: bool | None) -> bool | None:
    """Whether what is heard follows what was sent, by the last estimates (``verdicts``:
    whether each found a delay) and what was ``believed`` before them: it does where ``FOUND``
    or more of them found a delay and at least half did; it does not where not and
    ``UNCORRELATED`` or more found none, except that unless it was believed not to, it does
    not only where at most ``LOST`` found one; else as believed."""
    found = sum(verdicts)
    missed = len(verdicts) - found
    if found >= FOUND and found >= missed:
        return True
    if missed >= UNCORRELATED and (believed is False or found <= LOST):
        return False
    return believed


def loudest(levels: npt.NDArray[np.float64], frames: int) -> npt.NDArray[np.float64]:
    """Each of ``levels`` (dB) replaced by the loudest of it and the ``frames`` - 1 before it
    (of those there are, at the start)."""
    if not len(levels):
        return levels
    padded = np.concatenate([np.full(frames - 1, levels[0]), levels])
    envelope: npt.NDArray[np.float64] = sliding_window_view(padded, frames).max(axis=1)
    return envelope
