"""A conversation's figures for diagnostics and benchmarks (the debug endpoint)."""

from __future__ import annotations

from typing import Any

from server.avatar.face import FaceAnimator
from server.avatar.video import AvatarVideo
from server.conversation.playout import Playout
from server.metrics import quantile
from server.runtime.media import samples_to_ms
from server.runtime.session import Session


def describe(
    session: Session,
    playout: Playout,
    turns: list[dict[str, Any]],
    avatar: AvatarVideo | None,
    animator: FaceAnimator,
    speech_starts: int,
    interjections: dict[str, object] | None = None,
) -> dict[str, Any]:
    """Cursors (ms), turn state, barge-in reactions (ms), voice over replies (``resumed`` and
    ``interrupted`` pauses, the ``words`` of the latest), stage timings of each heard reply,
    the history, and the lateness (ms) of recent audio frames."""
    cursors = session.cursors
    lateness = [late * 1000 for late in playout.send_log]
    return {
        "session_id": session.session_id,
        "turn": session.state.value,
        "epoch": session.epoch,
        "heard_until_ms": samples_to_ms(cursors.heard_until),
        "playback_cursor_ms": samples_to_ms(cursors.playback_cursor),
        "acked_playback_ms": session.acked_playback_ms,
        "underruns": session.playback.underruns,
        "speech_starts": speech_starts,
        "interjections": interjections or {},
        "barge_in_reactions_ms": list(playout.barge_in_reactions_ms),
        "barge_in_confirmed_reactions_ms": list(playout.barge_in_confirmed_reactions_ms),
        "turns": turns,
        "avatar": {
            "frames": avatar.frames if avatar is not None else 0,
            "nods": animator.nods,
            "face": repr(avatar.last_state) if avatar is not None else None,
        },
        "history": [
            {"role": t.role.value, "text": t.text, "epoch": t.epoch, "truncated": t.truncated}
            for t in session.history.turns
        ],
        "audio_frames_logged": len(lateness),
        "frame_lateness_ms": {
            "p50": quantile(lateness, 0.50),
            "p99": quantile(lateness, 0.99),
            "max": max(lateness, default=None),
        },
    }
