"""The avatar's side of a conversation: its face (lip-sync, animation, gestures, the rendered
video source) and what it sees (the camera stage)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from server.avatar.face import FaceAnimator
from server.avatar.gestures import Gestures
from server.avatar.lipsync import LipSync
from server.avatar.seam import AvatarRenderer
from server.avatar.video import AvatarVideo
from server.clock import Clock
from server.config import Config
from server.metrics import Metrics
from server.runtime.session import Session
from server.vision.camera import CameraStage
from server.vision.sampling import PresenceTracker, VisionModel


@dataclass(frozen=True)
class Looks:
    """Lip-sync cues, the face animator, the camera stage, the video source (None without a
    renderer), the gestures (face cues shown on purpose: the built-in tools')."""

    lipsync: LipSync
    animator: FaceAnimator
    camera: CameraStage
    avatar: AvatarVideo | None
    gestures: Gestures


def looks_for(
    session: Session,
    config: Config,
    renderer: AvatarRenderer | None,
    vision: VisionModel | None,
    clock: Clock,
    metrics: Metrics,
    shed: Callable[[], bool],
    on_presence: Callable[[PresenceTracker], None],
) -> Looks:
    """``shed``: whether optional work must give way (idle frames go at half rate)."""
    sid = session.session_id
    lipsync = LipSync()
    animator = FaceAnimator(seed=int.from_bytes(sid.encode()[:8], "big"))
    camera = CameraStage(sid, config.vision, vision, clock, on_presence)
    gestures = Gestures(clock)
    avatar = None
    if renderer is not None:
        on_shed = metrics.work_shed.labels("frame").inc
        avatar = AvatarVideo(
            session,
            lipsync,
            animator,
            renderer,
            camera.attention,
            shed=shed,
            on_shed=on_shed,
            gestures=gestures,
        )
    return Looks(lipsync, animator, camera, avatar, gestures)
