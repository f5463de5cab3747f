"""Face detection on camera frames: OpenCV's Haar cascade, bundled with opencv-python-headless.

The cascade file ships in the OpenCV 4.x wheels (``cv2/data/haarcascade_frontalface_default.xml``);
OpenCV 5 dropped both the cascade files and ``CascadeClassifier`` from its main package, so this
needs ``opencv-python-headless<5``. Nothing is downloaded at run time.

Positions are in frame units: ``x`` -1 (viewer's left) .. 1 (viewer's right), ``y`` -1 (top) ..
1 (bottom), ``size`` = face width / frame width.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import cv2
import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

CASCADE_FILE = "haarcascade_frontalface_default.xml"


class FaceDetectorUnavailable(RuntimeError):
    """The installed OpenCV cannot run the Haar cascade (missing class or cascade file)."""


@dataclass(frozen=True)
class DetectedFace:
    """A face in frame units (see the module docstring)."""

    x: float
    y: float
    size: float


class _Cascade(Protocol):
    """The part of ``cv2.CascadeClassifier`` used here."""

    def empty(self) -> bool: ...

    def detectMultiScale(  # OpenCV's names, keyword arguments included
        self,
        image: npt.NDArray[Any],
        scaleFactor: float = ...,
        minNeighbors: int = ...,
        flags: int = ...,
        minSize: tuple[int, int] = ...,
    ) -> Sequence[Sequence[int]]: ...


def cascade_path(name: str = CASCADE_FILE) -> Path:
    """The bundled cascade file inside the installed cv2 package."""
    package_dir = Path(cv2.__file__).parent
    data = getattr(cv2, "data", None)
    candidates = [Path(str(getattr(data, "haarcascades", package_dir / "data"))) / name]
    candidates += sorted(package_dir.rglob(name))
    for path in candidates:
        if path.is_file():
            return path
    raise FaceDetectorUnavailable(
        f"OpenCV {cv2.__version__} ships no {name} (OpenCV 5 dropped the Haar cascades from "
        "its main package; install opencv-python-headless<5)"
    )


def _load_cascade(path: Path) -> _Cascade:
    factory = getattr(cv2, "CascadeClassifier", None)
    if factory is None:
        raise FaceDetectorUnavailable(
            f"OpenCV {cv2.__version__} has no CascadeClassifier (moved out of the main package "
            "in OpenCV 5; install opencv-python-headless<5)"
        )
    cascade = cast(_Cascade, factory(str(path)))
    if cascade.empty():
        raise FaceDetectorUnavailable(f"the Haar cascade {path} did not load")
    return cascade


class HaarFaceDetector:
    """The largest frontal face in an RGB frame, or None.

    Satisfies ``server.vision.sampling.VisionModel``.

    Works on a grey copy shrunk so its longer side is <= ``max_side`` px; faces narrower than
    ``min_face_px`` at that size are not found. Thread-safe: each thread gets its own cascade
    (OpenCV's cascade objects must not be shared between threads).
    """

    def __init__(
        self,
        path: Path | None = None,
        max_side: int = 320,
        min_face_px: int = 24,
        scale_factor: float = 1.1,
        min_neighbors: int = 5,
    ) -> None:
        if max_side < min_face_px or min_face_px < 1:
            raise ValueError(f"vision: need 1 <= min_face_px ({min_face_px}) <= max_side")
        self._path = path if path is not None else cascade_path()
        self._max_side = max_side
        self._min_face_px = min_face_px
        self._scale_factor = scale_factor
        self._min_neighbors = min_neighbors
        self._local = threading.local()
        self._cascade()  # fail now, not on the first frame
        log.info("face detector: Haar cascade %s (OpenCV %s)", self._path.name, cv2.__version__)

    def _cascade(self) -> _Cascade:
        cascade: _Cascade | None = getattr(self._local, "cascade", None)
        if cascade is None:
            cascade = _load_cascade(self._path)
            self._local.cascade = cascade
        return cascade

    def observe(self, rgb: npt.NDArray[np.uint8]) -> DetectedFace | None:
        """The largest face in an RGB (height x width x 3) frame, or None."""
        if rgb.ndim != 3 or rgb.shape[2] != 3:
            raise ValueError(f"vision: expected an RGB frame (h, w, 3), got shape {rgb.shape}")
        height, width = rgb.shape[:2]
        grey = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
        scale = min(1.0, self._max_side / max(height, width))
        if scale < 1.0:
            size = (max(1, round(width * scale)), max(1, round(height * scale)))
            grey = cv2.resize(grey, size, interpolation=cv2.INTER_AREA)
        # no histogram equalisation: the cascade normalises each window by its contrast already,
        # and equalising made false faces in a real photo (scikit-image's astronaut)
        found = self._cascade().detectMultiScale(
            grey,
            scaleFactor=self._scale_factor,
            minNeighbors=self._min_neighbors,
            minSize=(self._min_face_px, self._min_face_px),
        )
        if len(found) == 0:
            return None
        fx, fy, fw, fh = (int(v) for v in max(found, key=lambda r: int(r[2]) * int(r[3])))
        small_h, small_w = grey.shape[:2]
        return DetectedFace(
            x=(fx + fw / 2) / small_w * 2.0 - 1.0,
            y=(fy + fh / 2) / small_h * 2.0 - 1.0,
            size=fw / small_w,
        )
