"""A procedural 2D avatar: a friendly head-and-shoulders bust drawn with Pillow, lip-synced.

:class:`ProceduralAvatar` implements the server's ``AvatarRenderer`` seam structurally (this
package does not import ``server``): ``render(state)`` reads ``state.viseme`` (the Oculus
viseme id, 0..14, as in ``server.avatar.seam.Viseme``), ``state.expression`` (an enum whose
``.value`` is ``idle``/``listening``/``thinking``/``speaking``/``smile``/``surprise``, or that
string), and the floats of ``server.avatar.seam.FaceState``.

How it stays cheap (about 1 ms a frame at 512x512): the backdrop, bust and head are drawn
once per look, 3-4x supersampled; eyes, brows and mouth are sprites drawn per quantised pose
(viseme weight and blink in 8 steps, gaze 0.1, angles 0.5 degree) and cached; a frame is
composed from them with a few small alpha composites and one affine warp of the head (roll
and sub-pixel motion). Whole frames are kept in an LRU cache keyed by the quantised state.
Everything is a pure function of the quantised state, so frames are byte-identical for equal
states, in any renderer instance.

``python -m models.avatar --write-samples docs/avatar`` writes sample frames as PNG.
"""

from __future__ import annotations

import argparse
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import cv2
import numpy as np
import numpy.typing as npt
from PIL import Image

from models.avatar_face import (
    EXPRESSIONS,
    MOODS,
    VISEME_NAMES,
    VISEME_SHAPES,
    EyeParts,
    brows,
    eye,
    iris,
    mouth,
)
from models.avatar_looks import CX, LOOKS, Look
from models.avatar_parts import backdrop, glasses, head_layers, nose
from models.avatar_pen import Sprite

__all__ = [
    "EXPRESSIONS",
    "VISEME_NAMES",
    "VISEME_SHAPES",
    "FaceLike",
    "Pose",
    "ProceduralAvatar",
    "write_samples",
]

MIN_SIDE = 128  # pixels
DESIGN = 512.0  # the character is designed on a square of this many units
WEIGHT_STEPS = 8  # viseme weight and blink are drawn in this many steps
ANGLE_STEP = 0.5  # degrees
MAX_TURN = 10.0  # yaw and pitch are clamped to +-this, degrees
MAX_TILT = 8.0  # roll, degrees
GAZE_STEP = 0.1
YAW_UNITS = 1.5  # features move this far (design units) per degree of yaw
PITCH_UNITS = 1.3  # ... and per degree of pitch
WARMED = ("idle", "listening", "thinking", "speaking")  # the turn's expressions: warmed
GAZE_UNITS = (7.5, 4.5)  # iris travel at gaze 1, design units
PIVOT = (CX, 330.0)  # the head tilts (roll) about this point, design units
# Parallax: how far each layer moves per unit of yaw/pitch motion (x, y). The face's front
# (nose, then eyes and mouth) moves most, hair at the back moves against the turn.
HEAD_MOVES = (0.2, 0.25)  # the whole head, sub-pixel (in the warp)
HAIR_BACK_MOVES = -0.2  # x only, relative to the face outline
FEATURES_MOVE = (0.8, 0.75)
NOSE_MOVES = (1.0, 0.85)
HAIR_FRONT_MOVES = (0.15, 0.35)


class FaceLike(Protocol):
    """What the renderer reads of a face state (``server.avatar.seam.FaceState`` has it all)."""

    @property
    def appearance(self) -> str: ...
    @property
    def viseme(self) -> int: ...
    @property
    def viseme_weight(self) -> float: ...
    @property
    def expression(self) -> object: ...
    @property
    def blink(self) -> float: ...
    @property
    def head_yaw(self) -> float: ...
    @property
    def head_pitch(self) -> float: ...
    @property
    def head_roll(self) -> float: ...
    @property
    def gaze_x(self) -> float: ...
    @property
    def gaze_y(self) -> float: ...


@dataclass(frozen=True)
class Pose:
    """A face state without the server (samples); same fields and meaning as FaceState."""

    appearance: str
    viseme: int = 0
    viseme_weight: float = 0.0
    expression: str = "idle"
    blink: float = 0.0
    head_yaw: float = 0.0
    head_pitch: float = 0.0
    head_roll: float = 0.0
    gaze_x: float = 0.0
    gaze_y: float = 0.0


@dataclass(frozen=True)
class Key:
    """A face state quantised: equal keys draw identical frames."""

    look: int
    viseme: int
    weight: int  # 0..WEIGHT_STEPS
    expression: str
    blink: int  # 0..WEIGHT_STEPS
    yaw: int  # half degrees
    pitch: int
    roll: int
    gaze_x: int  # tenths
    gaze_y: int


def _steps(value: float, step: float, low: float, high: float) -> int:
    v = float(value)
    v = 0.0 if not math.isfinite(v) else min(high, max(low, v))
    return round(v / step)


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(Generic[K, V]):
    """A bounded, thread-safe least-recently-used cache with hit counts."""

    def __init__(self, capacity: int) -> None:
        self._items: OrderedDict[K, V] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get_or_make(self, key: K, make: Callable[[], V]) -> V:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                self.hits += 1
                return self._items[key]
            self.misses += 1
        value = make()  # outside the lock: equal keys make equal values
        with self._lock:
            value = self._items.setdefault(key, value)
            self._items.move_to_end(key)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)
        return value


@dataclass(frozen=True)
class _Assets:
    """Everything drawn once for one look at this renderer's size."""

    look: Look
    backdrop: npt.NDArray[np.uint8]  # (h, w, 3) RGB, the whole frame
    hair_back: Sprite
    skin: Sprite
    hair_front: Sprite
    nose: Sprite
    glasses: Sprite | None
    irises: tuple[Sprite, Sprite]  # viewer's left, right
    underlay: Image.Image  # alpha 0, colours of the head's edges: no dark fringes when warped


class ProceduralAvatar:
    """Draws the avatar; deterministic and thread-safe (see the module docstring)."""

    def __init__(self, width: int = 512, height: int = 512, frame_cache: int = 64) -> None:
        if width < MIN_SIDE or height < MIN_SIDE:
            raise ValueError(
                f"avatar size must be at least {MIN_SIDE}x{MIN_SIDE}, got {width}x{height}"
            )
        self._w, self._h = int(width), int(height)
        self._s = min(self._w, self._h) / DESIGN
        self._ox = round((self._w - DESIGN * self._s) / 2)
        self._oy = self._h - round(DESIGN * self._s)
        self._assets: list[_Assets | None] = [None] * len(LOOKS)
        self._build = threading.Lock()
        self.frames: Lru[Key, npt.NDArray[np.uint8]] = Lru(frame_cache)
        # mouths and brows: every pose of every look fits (a mouth is ~35 kB at 512x512)
        poses = len(EXPRESSIONS) * ((len(VISEME_SHAPES) - 1) * WEIGHT_STEPS + 2)
        self._sprites: Lru[tuple[object, ...], Sprite] = Lru(len(LOOKS) * poses)
        self._eyes: Lru[tuple[object, ...], EyeParts] = Lru(1024)  # lids per blink step
        self._gazes: Lru[tuple[object, ...], Sprite] = Lru(1024)  # whole eyes per gaze
        self._bases: Lru[tuple[int, int], Image.Image] = Lru(64)

    @property
    def appearances(self) -> tuple[str, ...]:
        return tuple(look.name for look in LOOKS)

    @property
    def size(self) -> tuple[int, int]:
        return (self._w, self._h)

    def look_index(self, appearance: str) -> int:
        """The index of a look by name; ``default`` is the first. Unknown names: ValueError."""
        if appearance == "default":
            return 0
        for i, look in enumerate(LOOKS):
            if look.name == appearance:
                return i
        known = ", ".join(self.appearances)
        raise ValueError(f"unknown avatar appearance {appearance!r}; known: {known} (or 'default')")

    def quantise(self, state: FaceLike) -> Key:
        """The cache key of ``state``: what the frame depends on, rounded to drawing steps."""
        expression = getattr(state.expression, "value", state.expression)
        if expression not in MOODS:
            raise ValueError(f"unknown expression {expression!r}; known: {', '.join(EXPRESSIONS)}")
        viseme = int(state.viseme)
        if not 0 <= viseme < len(VISEME_SHAPES):
            raise ValueError(f"viseme id {viseme} is not in 0..{len(VISEME_SHAPES) - 1}")
        weight = _steps(state.viseme_weight, 1 / WEIGHT_STEPS, 0.0, 1.0)
        return Key(
            look=self.look_index(state.appearance),
            viseme=viseme if weight else 0,
            weight=weight if viseme else 0,
            expression=str(expression),
            blink=_steps(state.blink, 1 / WEIGHT_STEPS, 0.0, 1.0),
            yaw=_steps(state.head_yaw, ANGLE_STEP, -MAX_TURN, MAX_TURN),
            pitch=_steps(state.head_pitch, ANGLE_STEP, -MAX_TURN, MAX_TURN),
            roll=_steps(state.head_roll, ANGLE_STEP, -MAX_TILT, MAX_TILT),
            gaze_x=_steps(state.gaze_x, GAZE_STEP, -1.0, 1.0),
            gaze_y=_steps(state.gaze_y, GAZE_STEP, -1.0, 1.0),
        )

    def render(self, state: FaceLike) -> npt.NDArray[np.uint8]:
        """The (height, width, 3) uint8 RGB frame for ``state``; read-only, shared."""
        key = self.quantise(state)
        return self.frames.get_or_make(key, lambda: self._compose(key))

    def warm(
        self,
        appearance: str = "default",
        stop: threading.Event | None = None,
        pace: Callable[[], None] | None = None,
    ) -> None:
        """Draw every mouth and lid sprite of a look's turn expressions now, so that no frame
        has to (a momentary cue's, smile or surprise, is drawn when first shown).

        Returns early once ``stop`` is set (a server shutting down while it warms up).
        ``pace`` is called after each sprite and may block (the server holds the warm-up
        there while sessions are live: drawing holds the GIL, which the event loop needs).
        """
        look = self.look_index(appearance)
        assets = self._assets_of(look)

        def stopping() -> bool:
            if pace is not None:
                pace()
            return stop is not None and stop.is_set()

        reach = math.ceil(abs(HAIR_BACK_MOVES) * MAX_TURN * YAW_UNITS * self._s)
        for dx in range(-reach, reach + 1):
            self._head_base(assets, look, dx)
            if stopping():
                return
        for expression in WARMED:
            for blink in range(WEIGHT_STEPS + 1):
                for side in (-1, 1):
                    self._eye_parts(assets, side, blink, expression)
                    if stopping():
                        return
            self._brows(assets, expression)
            self._mouth(assets, 0, 0, expression)
            for viseme in range(1, len(VISEME_SHAPES)):
                for weight in range(1, WEIGHT_STEPS + 1):
                    self._mouth(assets, viseme, weight, expression)
                    if stopping():
                        return

    # -- assets and sprites ---------------------------------------------------------------

    def _assets_of(self, index: int) -> _Assets:
        found = self._assets[index]
        if found is not None:
            return found
        with self._build:
            found = self._assets[index]
            if found is None:
                found = self._draw_assets(LOOKS[index])
                self._assets[index] = found
            return found

    def _draw_assets(self, look: Look) -> _Assets:
        s = self._s
        frame = (-self._ox / s, -self._oy / s, (self._w - self._ox) / s, (self._h - self._oy) / s)
        head = head_layers(look, s)
        underlay = Image.new("RGBA", head.skin.image.size, (0, 0, 0, 0))
        _put(underlay, head.hair_back, head.skin.x, head.skin.y)
        underlay.alpha_composite(head.skin.image)
        return _Assets(
            look=look,
            backdrop=np.asarray(backdrop(look, s, frame), dtype=np.uint8).copy(),
            hair_back=head.hair_back,
            skin=head.skin,
            hair_front=_trim(head.hair_front),
            nose=nose(look, s),
            glasses=glasses(look, s) if look.glasses else None,
            irises=(iris(look, s, -1), iris(look, s, 1)),
            underlay=_bleed(underlay),
        )

    def _mouth(self, a: _Assets, viseme: int, weight: int, expression: str) -> Sprite:
        def make() -> Sprite:
            mood = MOODS[expression]
            target = VISEME_SHAPES[viseme]
            full = replace(target, smile=mood.smile * (1 - target.round) * 0.5)
            shape = mood.rest.toward(full, weight / WEIGHT_STEPS)
            return mouth(a.look, self._s, shape)

        return self._sprites.get_or_make(("mouth", a.look.name, viseme, weight, expression), make)

    def _brows(self, a: _Assets, expression: str) -> Sprite:
        mood = MOODS[expression]
        return self._sprites.get_or_make(
            ("brows", a.look.name, expression),
            lambda: brows(a.look, self._s, mood.left, mood.right),
        )

    def _eye_parts(self, a: _Assets, side: int, blink: int, expression: str) -> EyeParts:
        pose = MOODS[expression].eyes
        return self._eyes.get_or_make(
            (a.look.name, side, blink, expression),
            lambda: eye(a.look, self._s, side, blink / WEIGHT_STEPS, pose),
        )

    def _eye(self, a: _Assets, side: int, key: Key) -> Sprite:
        """One eye: the iris at the gaze offset, clipped to the lids, lids over it."""

        def make() -> Sprite:
            parts = self._eye_parts(a, side, key.blink, key.expression)
            ball = parts.under
            pupil = a.irises[0 if side < 0 else 1]
            dx = round(key.gaze_x * GAZE_STEP * GAZE_UNITS[0] * self._s)
            dy = round(key.gaze_y * GAZE_STEP * GAZE_UNITS[1] * self._s)
            layer = Image.new("RGBA", ball.image.size, (0, 0, 0, 0))
            layer.paste(pupil.image, (pupil.x - ball.x + dx, pupil.y - ball.y + dy))
            px = np.array(layer)
            px[..., 3] = (px[..., 3].astype(np.uint16) * parts.aperture // 255).astype(np.uint8)
            out = ball.image.copy()
            out.alpha_composite(Image.fromarray(px))
            out.alpha_composite(parts.over.image)
            return Sprite(out, ball.x, ball.y)

        k = (a.look.name, side, key.blink, key.expression, key.gaze_x, key.gaze_y)
        return self._gazes.get_or_make(k, make)

    def _head_base(self, a: _Assets, look: int, dx: int) -> Image.Image:
        """Hair behind the face shifted ``dx`` pixels, the face over it; RGB bled under alpha 0."""

        def make() -> Image.Image:
            base = a.underlay.copy()
            _put(base, a.hair_back, a.skin.x - dx, a.skin.y)
            base.alpha_composite(a.skin.image)
            return base

        return self._bases.get_or_make((look, dx), make)

    # -- one frame --------------------------------------------------------------------------

    def _compose(self, key: Key) -> npt.NDArray[np.uint8]:
        a = self._assets_of(key.look)
        s = self._s
        u = key.yaw * ANGLE_STEP * YAW_UNITS * s  # pixels
        v = key.pitch * ANGLE_STEP * PITCH_UNITS * s
        head = self._head_base(a, key.look, round(HAIR_BACK_MOVES * u)).copy()
        hx, hy = a.skin.x, a.skin.y
        fx, fy = round(FEATURES_MOVE[0] * u), round(FEATURES_MOVE[1] * v)
        _put(head, a.nose, hx - round(NOSE_MOVES[0] * u), hy - round(NOSE_MOVES[1] * v))
        for side in (-1, 1):
            _put(head, self._eye(a, side, key), hx - fx, hy - fy)
        _put(head, self._mouth(a, key.viseme, key.weight, key.expression), hx - fx, hy - fy)
        _put(head, self._brows(a, key.expression), hx - fx, hy - fy)
        if a.glasses is not None:
            _put(head, a.glasses, hx - fx, hy - fy)
        front = (round(HAIR_FRONT_MOVES[0] * u), round(HAIR_FRONT_MOVES[1] * v))
        _put(head, a.hair_front, hx - front[0], hy - front[1])
        px, py = PIVOT[0] * s - hx, PIVOT[1] * s - hy
        m = cv2.getRotationMatrix2D((px, py), -key.roll * ANGLE_STEP, 1.0)
        m[0, 2] += HEAD_MOVES[0] * u
        m[1, 2] += HEAD_MOVES[1] * v
        warped = cv2.warpAffine(
            np.asarray(head),
            m,
            head.size,
            flags=cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_CONSTANT,
            borderValue=(0, 0, 0, 0),
        )
        out = a.backdrop.copy()
        x0, y0 = self._ox + hx, self._oy + hy
        region = out[y0 : y0 + warped.shape[0], x0 : x0 + warped.shape[1]]
        alpha = warped[..., 3]
        a3 = cv2.merge((alpha, alpha, alpha))
        fg = cv2.multiply(cv2.cvtColor(warped, cv2.COLOR_RGBA2RGB), a3, scale=1 / 255)
        bg = cv2.multiply(region, cv2.bitwise_not(a3), scale=1 / 255)
        cv2.add(fg, bg, dst=region)
        out.setflags(write=False)
        return out


def _put(dst: Image.Image, sprite: Sprite, x0: int, y0: int) -> None:
    """Composite ``sprite`` onto ``dst`` whose top-left is at (x0, y0), clipping at its edges."""
    x, y = sprite.x - x0, sprite.y - y0
    sx, sy = max(0, -x), max(0, -y)
    dst.alpha_composite(sprite.image, (x + sx, y + sy), (sx, sy))


def _trim(sprite: Sprite) -> Sprite:
    """The sprite cropped to its visible pixels."""
    box = sprite.image.getchannel("A").getbbox()
    if box is None:
        return sprite
    return Sprite(sprite.image.crop(box), sprite.x + box[0], sprite.y + box[1])


def _bleed(img: Image.Image) -> Image.Image:
    """A copy, fully transparent, coloured like the nearest visible pixels."""
    px = np.array(img)
    alpha = px[..., 3:].astype(np.float32) / 255
    rgb = px[..., :3].astype(np.float32)
    near = cv2.GaussianBlur(rgb * alpha, (0, 0), 3) / np.maximum(
        cv2.GaussianBlur(alpha, (0, 0), 3)[..., None], 1e-3
    )
    clear = px[..., 3] == 0
    px[..., :3][clear] = np.clip(near[clear], 0, 255).astype(np.uint8)
    px[..., 3] = 0
    return Image.fromarray(px)


SAMPLES: dict[str, Pose] = {
    "ada_idle": Pose("ada", gaze_x=-0.1, head_yaw=1.0),
    "ada_aa": Pose(
        "ada", viseme=10, viseme_weight=1.0, expression="speaking", head_yaw=-2, head_roll=1
    ),
    "ada_listening": Pose("ada", expression="listening", head_roll=2.5, head_pitch=1, gaze_y=0.1),
    "ada_thinking": Pose("ada", expression="thinking", gaze_x=0.55, gaze_y=-0.45, head_roll=-1.5),
    "ada_smile": Pose("ada", expression="smile", head_roll=1.5, head_yaw=0.5),
    "milo_idle": Pose("milo", head_yaw=-1.5, gaze_x=0.1),
    "milo_speaking_o": Pose(
        "milo", viseme=13, viseme_weight=1.0, expression="speaking", head_yaw=3
    ),
    "milo_surprise": Pose("milo", expression="surprise", head_pitch=-1.5),
    "milo_thinking": Pose(
        "milo", expression="thinking", gaze_x=0.55, gaze_y=-0.45, head_roll=-1.5, head_pitch=-1.5
    ),
}


def write_samples(folder: Path, size: tuple[int, int] = (512, 512)) -> list[Path]:
    """Render SAMPLES to ``folder`` as PNG; returns the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    renderer = ProceduralAvatar(*size)
    written = []
    for name, pose in SAMPLES.items():
        path = folder / f"{name}.png"
        Image.fromarray(renderer.render(pose)).save(path, optimize=True)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--write-samples", type=Path, metavar="DIR", help="write sample PNGs")
    parser.add_argument("--size", default="512x512", help="WIDTHxHEIGHT of the samples")
    args = parser.parse_args(argv)
    if args.write_samples is None:
        parser.error("nothing to do (try --write-samples docs/avatar)")
    w, h = (int(n) for n in args.size.lower().split("x"))
    for path in write_samples(args.write_samples, (w, h)):
        print(path)


if __name__ == "__main__":
    main()
