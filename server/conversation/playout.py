"""What the link's tracks pull from a conversation, and what the conversation learns from
what was sent: underruns, lookahead, frame lateness, first audio, barge-in reactions.

The bookkeeping alone: it sends nothing and starts nothing. The conversation carries out what
follows from a pull (the echo canceller's far end, room in the lookahead budget, the events
the session emitted) and sends the reaction events it returns."""

from __future__ import annotations

from collections import deque

import av
import numpy as np
import numpy.typing as npt

from server.avatar.video import AvatarVideo
from server.clock import Clock
from server.metrics import Metrics
from server.pipeline.seams import TurnTrace
from server.runtime.media import samples_to_ms
from server.runtime.session import Session
from server.wire.outbound import BargeInReaction

LOOKAHEAD_SAMPLE_FRAMES = 25  # sample the lookahead every 0.5 s of output


class Playout:
    """The output side of one conversation: audio pulls, faces, what was sent."""

    def __init__(
        self,
        session: Session,
        avatar: AvatarVideo | None,
        metrics: Metrics,
        clock: Clock,
    ) -> None:
        self._session = session
        self._avatar = avatar
        self._metrics = metrics
        self._clock = clock
        self.base_ms = 0.0  # the playback cursor (ms) when the current link attached
        self.send_log: deque[float] = deque(maxlen=3000)  # lateness (s) of recent audio frames
        self.barge_in_reactions_ms: list[float] = []  # from the gate's voice onset
        self.barge_in_confirmed_reactions_ms: list[float] = []  # from the confirmed voice
        self._barge_onset_ms: float | None = None
        self._barge_confirmed_ms = 0.0
        self._pulls = 0
        self._underruns_seen = 0

    def barged_in(self, onset_ms: float, confirmed_ms: float) -> None:
        """Speech interrupted a reply: its reaction is timed until the output goes quiet."""
        self._barge_onset_ms, self._barge_confirmed_ms = onset_ms, confirmed_ms

    def pull_audio(self, n: int) -> npt.NDArray[np.int16]:
        """The next ``n`` samples (48 kHz) for the link's audio track."""
        session = self._session
        pulled = session.pull_audio(n)
        underruns = session.playback.underruns
        if underruns > self._underruns_seen:
            self._metrics.underruns.inc(underruns - self._underruns_seen)
            self._underruns_seen = underruns
        self._pulls += 1
        if self._pulls % LOOKAHEAD_SAMPLE_FRAMES == 0 and session.playback.streaming:
            self._metrics.lookahead.observe(session.playback.slack_ms / 1000)
        return pulled.pcm

    async def face_at(self, media_ms: float) -> av.VideoFrame:
        """The avatar's picture at ``media_ms`` on the link's media clock (needs a renderer)."""
        assert self._avatar is not None
        return await self._avatar(media_ms + self.base_ms)

    def on_cursor_held(self, samples: int) -> None:
        """``samples`` (48 kHz) of media time passed on the link without the playback cursor:
        the audio track woke too late and skipped them (server/rtc/tracks.py), or sent silence
        while the client's audio had stopped (server/rtc/peer.py). The client heard a gap, and
        the reply goes on from where it stopped. The media clock is now that much further
        ahead of the cursor (the face follows the cursor)."""
        self.base_ms -= samples_to_ms(samples)

    def on_sent(
        self, lateness_s: float, pcm: npt.NDArray[np.int16], trace: TurnTrace | None
    ) -> BargeInReaction | None:
        """The link's audio track sent a frame ``lateness_s`` late, during the reply of
        ``trace`` (its first audio is stamped); the reaction to a barge-in once the output
        went quiet."""
        self._metrics.frame_lateness.observe(lateness_s)
        if trace is not None and trace.first_audio_ms is None and pcm.any():
            trace.first_audio_ms = self._clock.now_ms()
        self.send_log.append(lateness_s)
        if self._barge_onset_ms is not None and not pcm.any():
            now = self._clock.now_ms()
            reaction = now - self._barge_onset_ms
            self._barge_onset_ms = None
            confirmed = now - self._barge_confirmed_ms
            self.barge_in_reactions_ms.append(reaction)
            self.barge_in_confirmed_reactions_ms.append(confirmed)
            self._metrics.barge_in_reaction.observe(reaction / 1000)
            return BargeInReaction(round(reaction, 1), round(confirmed, 1))
        return None
