"""The avatar's video source: the face for media time t, rendered off the event loop.

The frame for time t shows the viseme of the audio at output position t (the playback buffer
knows what was handed out and what is queued), in the appearance of the chunk playing then.
After a barge-in the buffer holds nothing, so the next frame is the listening face; during an
underrun the face keeps its idle motion with the mouth at rest: never a frozen or black frame.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import av

from server.avatar import AvatarRenderer, Expression, FaceState, Viseme
from server.face import Attention, FaceAnimator
from server.lipsync import LipSync
from server.media import ms_to_samples
from server.session import Session
from server.turn import TurnState

EXPRESSIONS = {
    TurnState.LISTENING: Expression.IDLE,
    TurnState.USER_SPEAKING: Expression.LISTENING,
    TurnState.THINKING: Expression.THINKING,
    TurnState.AGENT_SPEAKING: Expression.SPEAKING,
}


class AvatarVideo:
    """A :class:`server.tracks.FrameSource` that draws the avatar of one session."""

    def __init__(
        self,
        session: Session,
        lipsync: LipSync,
        animator: FaceAnimator,
        renderer: AvatarRenderer,
        attention: Callable[[], Attention | None] = lambda: None,
    ) -> None:
        self._session = session
        self._lipsync = lipsync
        self._animator = animator
        self._renderer = renderer
        self._attention = attention
        self.last_state: FaceState | None = None
        self.frames = 0

    def state_at(self, media_ms: float) -> FaceState:
        """What the face shows at ``media_ms`` (ms on the session media clock)."""
        session = self._session
        appearance = session.conditions.appearance
        expression = EXPRESSIONS[session.state]
        viseme, weight = Viseme.SIL, 0.0
        located = session.playback.locate(ms_to_samples(media_ms))
        if located is not None and session.state is not TurnState.USER_SPEAKING:
            chunk_id, offset = located
            expression = Expression.SPEAKING
            viseme, weight = self._lipsync.at(chunk_id, offset)
            appearance = self._lipsync.appearance(chunk_id) or appearance
        state = self._animator.face(
            media_ms, appearance, expression, viseme, weight, self._attention()
        )
        self.last_state = state
        return state

    async def __call__(self, media_ms: float) -> av.VideoFrame:
        state = self.state_at(media_ms)
        rgb = await asyncio.get_running_loop().run_in_executor(None, self._renderer.render, state)
        self.frames += 1
        return av.VideoFrame.from_ndarray(rgb, format="rgb24")
