"""Drawn test faces for the vision stage, and a camera track that shows one."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from aiortc.mediastreams import VideoStreamTrack
from av import VideoFrame
from PIL import Image, ImageDraw, ImageFilter

Rgb = npt.NDArray[np.uint8]

BACKGROUND = (70, 80, 95)
SKIN = (225, 180, 150)
HAIR = (50, 35, 25)


def draw_face(
    width: int = 640,
    height: int = 480,
    cx: float = 320,
    cy: float = 240,
    face_w: float = 160,
    features: bool = True,
) -> Rgb:
    """An RGB frame with a frontal face of width ``face_w`` px centred on (cx, cy) px.

    ``features=False`` draws the same head without brows, eyes, nose and mouth.
    """
    img = Image.new("RGB", (width, height), BACKGROUND)
    d = ImageDraw.Draw(img)
    s = face_w / 160  # the face is designed 160 units wide

    def box(x0: float, y0: float, x1: float, y1: float) -> tuple[float, float, float, float]:
        return (cx + x0 * s, cy + y0 * s, cx + x1 * s, cy + y1 * s)

    def pt(x: float, y: float) -> tuple[float, float]:
        return (cx + x * s, cy + y * s)

    d.rectangle(box(-35, 80, 35, 200), fill=(200, 150, 120))  # neck
    d.ellipse(box(-150, 150, 150, 330), fill=(40, 60, 120))  # shoulders
    d.ellipse(box(-88, -125, 88, 60), fill=HAIR)  # hair behind the head
    d.ellipse(box(-80, -100, 80, 110), fill=SKIN)  # face
    d.chord(box(-84, -122, 84, -20), 180, 360, fill=HAIR)  # fringe
    if features:
        for side in (-1, 1):
            x = side * 36
            d.ellipse(box(x - 24, -44, x + 24, -34), fill=(60, 40, 30))  # brow
            d.ellipse(box(x - 24, -30, x + 24, -6), fill=(190, 145, 120))  # eye socket
            d.ellipse(box(x - 18, -26, x + 18, -10), fill=(240, 240, 235))  # eye white
            d.ellipse(box(x - 8, -26, x + 8, -10), fill=(70, 50, 35))  # iris
            d.ellipse(box(x - 4, -22, x + 4, -14), fill=(10, 10, 10))  # pupil
            d.polygon([pt(side * 6, -5), pt(side * 16, 30), pt(side * 8, 32)], fill=(195, 150, 125))
            d.ellipse(box(side * 12 - 4, 28, side * 12 + 4, 34), fill=(120, 80, 70))  # nostril
        d.ellipse(box(-30, 52, 30, 66), fill=(160, 70, 70))  # lips
        d.line([pt(-28, 59), pt(28, 59)], fill=(90, 30, 30), width=max(1, round(3 * s)))
    img = img.filter(ImageFilter.GaussianBlur(2 * s))
    return np.asarray(img, dtype=np.uint8)


class StillCamera(VideoStreamTrack):
    """A client camera (30 fps, paced by aiortc) showing ``image`` until it is swapped."""

    def __init__(self, image: Rgb) -> None:
        super().__init__()
        self.image = image

    async def recv(self) -> VideoFrame:
        pts, time_base = await self.next_timestamp()
        frame = VideoFrame.from_ndarray(self.image, format="rgb24")
        frame.pts, frame.time_base = pts, time_base
        return frame
