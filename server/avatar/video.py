"""The avatar's video source: the face for media time t, rendered off the event loop.

The frame for time t shows the viseme of the audio at output position t (the playback buffer
knows what was handed out and what is queued), in the appearance of the chunk playing then.
After a barge-in the buffer holds nothing, so the next frame is the listening face; during an
underrun the face keeps its idle motion with the mouth at rest: never a frozen or black frame.

Frames leave in the encoder's own pixel format (YUV 4:2:0), converted in the render worker on
one thread. Handed an RGB frame, the VP8 encoder converts it itself, and libswscale then
starts and ends two slice threads for every frame (50 threads a second a session at 25 fps):
about 0.6 ms more CPU a frame, and the encoding thread waits on them, on the cores the event
loop needs (benchmarks/avatar_bench.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

import av
import numpy as np
import numpy.typing as npt
from av.video.reformatter import VideoReformatter

from server.avatar.face import Attention, FaceAnimator
from server.avatar.gestures import NO_CUE, Gestures
from server.avatar.lipsync import LipSync
from server.avatar.seam import AvatarRenderer, Expression, FaceState, Viseme
from server.runtime.media import VIDEO_TIME_BASE, ms_to_samples
from server.runtime.session import Session
from server.runtime.turn import TurnState

EXPRESSIONS = {
    TurnState.LISTENING: Expression.IDLE,
    TurnState.USER_SPEAKING: Expression.LISTENING,
    TurnState.THINKING: Expression.THINKING,
    TurnState.AGENT_SPEAKING: Expression.SPEAKING,
    TurnState.PAUSED: Expression.LISTENING,  # it stopped to hear the user
}


class AvatarVideo:
    """A :class:`server.rtc.tracks.FrameSource` that draws the avatar of one session."""

    def __init__(
        self,
        session: Session,
        lipsync: LipSync,
        animator: FaceAnimator,
        renderer: AvatarRenderer,
        attention: Callable[[], Attention | None] = lambda: None,
        shed: Callable[[], bool] = lambda: False,
        on_shed: Callable[[], None] = lambda: None,
        gestures: Gestures | None = None,
    ) -> None:
        """``shed``: whether optional work must give way now; then, while the face is idle
        (no speech playing), every other frame repeats the last one instead of drawing a new
        one (``on_shed`` counts each). ``gestures``: the face cues shown on purpose (a smile,
        a look at the user), over the turn's expression and gaze while they last."""
        self._session = session
        self._shed = shed
        self._on_shed = on_shed
        self._last_yuv: npt.NDArray[np.uint8] | None = None
        self._to_yuv = YuvConverter()
        self._speaking = False
        self._lipsync = lipsync
        self._animator = animator
        self._renderer = renderer
        self._attention = attention
        self._gestures = gestures
        self.last_state: FaceState | None = None
        self.frames = 0

    def state_at(self, media_ms: float) -> FaceState:
        """What the face shows at ``media_ms`` (ms on the session media clock)."""
        session = self._session
        appearance = session.conditions.appearance
        expression = EXPRESSIONS[session.state]
        viseme, weight = Viseme.SIL, 0.0
        located = session.playback.locate(ms_to_samples(media_ms))
        self._speaking = located is not None
        if located is not None and session.state is not TurnState.USER_SPEAKING:
            chunk_id, offset = located
            expression = Expression.SPEAKING
            viseme, weight = self._lipsync.at(chunk_id, offset)
            appearance = self._lipsync.appearance(chunk_id) or appearance
        cue = self._gestures.now() if self._gestures is not None else NO_CUE
        state = self._animator.face(
            media_ms,
            appearance,
            expression,
            viseme,
            weight,
            self._attention(),
            shown=cue.expression,
            look=cue.gaze,
        )
        self.last_state = state
        return state

    async def __call__(self, media_ms: float) -> av.VideoFrame:
        state = self.state_at(media_ms)
        idle = not self._speaking
        if idle and self.frames % 2 and self._last_yuv is not None and self._shed():
            yuv = self._last_yuv  # half rate while idle under load
            self._on_shed()
        else:
            yuv = await asyncio.get_running_loop().run_in_executor(None, self._draw, state)
            self._last_yuv = yuv
        self.frames += 1
        return av.VideoFrame.from_ndarray(yuv, format="yuv420p")

    def _draw(self, state: FaceState) -> npt.NDArray[np.uint8]:
        """The face drawn and converted (a render worker; CPU heavy)."""
        return self._to_yuv(self._renderer.render(state))


class YuvConverter:
    """RGB pictures (H x W x 3) to YUV 4:2:0 planes stacked as PyAV keeps them ((H * 3 / 2) x
    W), on the calling thread only: libswscale's default starts slice threads for every
    picture. One converter per video source (it is not safe to share between threads)."""

    def __init__(self) -> None:
        self._reformatter = VideoReformatter()

    def __call__(self, rgb: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
        frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
        yuv = self._reformatter.reformat(frame, format="yuv420p", threads=1)
        return np.asarray(yuv.to_ndarray(), dtype=np.uint8)  # no copy: it is uint8


def frame_cost_ms(renderer: AvatarRenderer, fps: int, frames: int = 8) -> float:
    """The least CPU time (ms, this thread's) to draw one avatar frame and VP8-encode it, as
    a live track does, of ``frames``. CPU, not wall time: what a frame takes from the
    machine's CPU, whatever else runs; under a CPU quota a frame's wall time also holds the
    throttled rest of a period (calibrations in the slow profile timed 2.5-14.4 ms for the
    same 2-3 ms frame). The least, not the median: a frame drawn while another thread holds
    the GIL or the cache costs more CPU time too (1.2-1.4 ms alone here, medians of 1.9-3.5
    ms beside a Python thread that spins, in the slow profile), and the calibration counts
    that contention apart (the whole video path's cost, the share left to each stage). The
    encoder runs on this thread up to 640x480 (aiortc gives larger frames more threads, whose
    share this does not count). Blocking and CPU heavy: call it in a worker thread. The first
    frame (the default look's sprites drawn) is not counted."""
    from server.avatar.encoder import FaceEncoder

    encoder, to_yuv = FaceEncoder(), YuvConverter()
    state = FaceState(renderer.appearances[0], expression=Expression.SPEAKING)
    times = []
    for i in range(frames + 1):
        started = time.thread_time()
        rgb = renderer.render(replace(state, viseme_weight=(i % 3) / 2, blink=(i % 2) * 0.5))
        frame = av.VideoFrame.from_ndarray(to_yuv(rgb), format="yuv420p")
        frame.pts = i * round(1 / (fps * VIDEO_TIME_BASE))
        frame.time_base = VIDEO_TIME_BASE
        encoder.encode(frame)
        if i:
            times.append((time.thread_time() - started) * 1000)
    return min(times)
