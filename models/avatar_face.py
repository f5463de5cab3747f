"""The moving features of the procedural avatar: eyes, irises, brows and the mouth.

Also what moves them: the mouth shape of each viseme and the mood of each expression.

Each builder draws one sprite for one quantised pose; the renderer caches them. Lengths are
design units (see models/avatar_pen.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt
from PIL import Image

from models.avatar_looks import BROW_Y, CX, EYE_DX, EYE_Y, MOUTH_Y, Look
from models.avatar_pen import WHITE, Pen, Point, Sprite, bezier, both, invert, mix

SCLERA = (250, 246, 242)
MOUTH_INSIDE = (74, 24, 30)
TEETH = (250, 248, 242)
TONGUE = (214, 104, 110)


@dataclass(frozen=True)
class MouthShape:
    """Mouth parameters, unitless 0..1 unless noted; :meth:`toward` blends two shapes."""

    opening: float = 0.0  # jaw opening, 1 = about 30 units
    width: float = 1.0  # relative to the rest width
    round: float = 0.0  # lips pushed forward and rounded
    upper_teeth: float = 0.0  # how much of the upper teeth shows
    lower_teeth: float = 0.0
    tongue: float = 0.0
    tongue_tip: float = 0.0  # tongue forward between the teeth (th)
    press: float = 0.0  # lips pressed together (p b m)
    tuck: float = 0.0  # lower lip under the upper teeth (f v)
    smile: float = 0.0  # -1 (corners down) .. 1 (corners up)

    def toward(self, other: MouthShape, t: float) -> MouthShape:
        """This shape moved a fraction ``t`` of the way to ``other``."""
        values = {
            f.name: getattr(self, f.name) + (getattr(other, f.name) - getattr(self, f.name)) * t
            for f in fields(self)
        }
        return MouthShape(**values)


@dataclass(frozen=True)
class EyeParts:
    """One eye at one lid pose: under the iris, the visible aperture (alpha), over it."""

    under: Sprite
    aperture: npt.NDArray[np.uint8]  # (h, w) of under.image, 255 = eyeball visible
    over: Sprite


@dataclass(frozen=True)
class EyePose:
    """Lid openness by expression: how far the upper and lower lids open (1 = at rest)."""

    upper: float
    lower: float


def eye_centre(side: int) -> Point:
    """side -1 = viewer's left eye, +1 = viewer's right."""
    return (CX + side * EYE_DX, EYE_Y)


def _lids(
    look: Look, side: int, pose: EyePose, blink: float, n: int = 25
) -> tuple[list[Point], list[Point]]:
    """Upper and lower lid edges, points by ascending x (``blink`` 0 open .. 1 shut)."""
    ex, ey = eye_centre(side)
    ew, eu, el = 22.0, 14.0 * pose.upper, 8.5 * pose.lower
    upper, lower = [], []
    for i in range(n):
        t = -1 + 2 * i / (n - 1)
        outer = max(0.0, t * side)
        lift = look.eye_tilt * outer**2 - 1.2 * (1 - t * t)
        shape = (1 - t * t) ** 0.75
        up = ey - eu * shape * (1 + 0.12 * t * side) - lift
        low = ey + el * (1 - t * t) ** 0.9 - lift
        closed = ey + 3.2 * (1 - t * t) ** 0.9 - look.eye_tilt * outer**2
        upper.append((ex + t * ew * (1 + 0.04 * outer), up + (closed - up) * blink))
        lower.append((ex + t * ew * (1 + 0.04 * outer), low + (closed - low) * blink**3))
    return upper, lower


def eye(look: Look, scale: float, side: int, blink: float, pose: EyePose) -> EyeParts:
    """The eye sprites around the iris for one lid pose (``blink`` 0 open .. 1 shut)."""
    ex, ey = eye_centre(side)
    box = (ex - 36, ey - 31, ex + 36, ey + 23)
    under, over = Pen(box, scale), Pen(box, scale)
    upper, lower = _lids(look, side, pose, blink)
    hole = under.poly(upper + lower[::-1]) if blink < 0.999 else under.blank()
    under.paint(under.blur(under.oval(ex, ey - 2, 30, 18), 7), look.skin_shadow, 0.3)
    under.paint(hole, SCLERA)
    under.paint(both(hole, invert(under.blur(hole, 3))), (196, 180, 178), 0.8)
    lid_shadow = over.ribbon(upper, [7.0] * len(upper))
    over.paint(both(hole, over.blur(lid_shadow, 2.2)), look.iris_dark, 0.45)
    widths = [0.8 + 2.6 * (1 - abs(2 * i / (len(upper) - 1) - 1) ** 2) for i in range(len(upper))]
    line = over.ribbon([(x, y - 0.6) for x, y in upper], widths)
    tip = upper[-1] if side > 0 else upper[0]
    wing = (tip[0] + side * 5.5, tip[1] - 3.5 - 2 * blink)
    over.poly([(tip[0] - side * 7, tip[1] - 2.4), wing, (tip[0] - side * 2, tip[1] + 0.6)], line)
    if look.lashes:
        for k in (0.55, 0.75, 0.9):
            base = upper[round((0.5 + side * k / 2) * (len(upper) - 1))]
            over.stroke([base, (base[0] + side * 3.5, base[1] - 3.6 + 2.5 * blink)], 0.9, line)
    over.paint(over.blur(line, 0.3), look.lash)
    low_line = over.stroke(lower[3:-2], 1.0)
    over.paint(over.blur(low_line, 0.5), look.skin_shadow, 0.55 * (1 - blink))
    crease = over.stroke(
        [
            (x, y - 6.5 - 0.5 * (1 - (x - ex) ** 2 / 484))
            for x, y in _lids(look, side, pose, 0.0)[0][4:-3]
        ],
        1.2,
    )
    over.paint(over.blur(crease, 0.6), look.skin_shadow, 0.45)
    aperture = hole.resize((under.w, under.h), Image.Resampling.BOX)
    return EyeParts(under.sprite(), np.asarray(aperture, dtype=np.uint8).copy(), over.sprite())


def iris(look: Look, scale: float, side: int) -> Sprite:
    """Iris, pupil and catch-lights, centred on the eye at rest."""
    ex, ey = eye_centre(side)
    pen = Pen((ex - 15, ey - 15, ex + 15, ey + 15), scale)
    r = 12.5
    pen.paint(pen.oval(ex, ey, r, r), look.iris_dark)
    pen.paint(pen.blur(pen.oval(ex + 1, ey + 2.5, r * 0.78, r * 0.78), 2.5), look.iris)
    pen.paint(
        pen.blur(pen.oval(ex + 1.5, ey + 5, r * 0.45, r * 0.35), 2),
        mix(look.iris, WHITE, 0.35),
        0.7,
    )
    ring = pen.stroke(
        [
            (ex + (r - 0.6) * math.cos(t), ey + (r - 0.6) * math.sin(t))
            for t in np.linspace(0, 2 * math.pi, 40)
        ],
        1.4,
    )
    pen.paint(ring, look.iris_dark, 0.8)
    pen.paint(pen.oval(ex, ey, 5.6, 5.6), (22, 14, 14))
    pen.paint(pen.oval(ex - 4.6, ey - 4.6, 3.3, 3.3), WHITE, 0.95)
    pen.paint(pen.oval(ex + 4.2, ey + 3.6, 1.4, 1.4), WHITE, 0.75)
    return pen.sprite()


@dataclass(frozen=True)
class BrowPose:
    """Offsets of one brow, units: inner end up (-) / down (+), outer end, extra arch."""

    inner: float = 0.0
    outer: float = 0.0
    arch: float = 0.0
    knit: float = 0.0  # inner end toward the centre line


def brows(look: Look, scale: float, left: BrowPose, right: BrowPose) -> Sprite:
    """Both eyebrows as one sprite: tapered arcs, softer at the inner end."""
    pen = Pen((CX - 90, BROW_Y - 30, CX + 90, BROW_Y + 18), scale)
    for side, pose in ((-1, left), (1, right)):
        xi = CX + side * (20 - pose.knit)
        xo = CX + side * 67
        yi, yo = BROW_Y + 2 + pose.inner, BROW_Y + 1 + pose.outer
        arch = look.brow_arch + pose.arch
        pts = bezier((xi, yi), ((xi + xo) / 2 + side * 6, min(yi, yo) - arch * 1.6), (xo, yo), n=20)
        widths = [
            look.brow_width * (1 - 0.62 * (i / (len(pts) - 1)) ** 1.3) for i in range(len(pts))
        ]
        m = pen.blur(pen.ribbon(pts, widths), 0.5)
        fade = pen.ramp((xi, 0), (xi + side * 16, 0))
        pen.paint(both(m, fade), look.brow)
        pen.paint(both(m, invert(fade)), look.brow, 0.72)
    return pen.sprite()


def mouth(look: Look, scale: float, shape: MouthShape, n: int = 33) -> Sprite:
    """Lips, and inside an open mouth teeth and tongue, for one :class:`MouthShape`."""
    pen = Pen((CX - 54, MOUTH_Y - 34, CX + 54, MOUTH_Y + 46), scale)
    w = 26.0 * shape.width * (1 - 0.12 * shape.round)
    h = 30.0 * shape.opening
    wi = w * (0.95 - 0.1 * shape.round)
    k = 2.0 + 1.6 * (1 - shape.round)
    xs = [w * math.sin(math.pi * (i / (n - 1) - 0.5)) for i in range(n)]

    def seam(x: float) -> float:
        return MOUTH_Y - shape.smile * 5.0 * (x / w) ** 2 + 0.8 * shape.press

    def gap(x: float) -> float:
        return max(0.0, 1 - abs(x / wi) ** k) ** (1 / k) if abs(x) < wi else 0.0

    top_in = [(CX + x, seam(x) - 0.3 * h * gap(x)) for x in xs]
    bot_in = [(CX + x, seam(x) + 0.7 * h * gap(x)) for x in xs]
    tu = 6.5 * (1 + 0.25 * shape.round - 0.45 * shape.press)
    tl = 8.5 * (1 + 0.15 * shape.round - 0.45 * shape.press - 0.4 * shape.tuck)

    def env(x: float) -> float:
        return max(0.0, 1 - (x / w) ** 2)

    up_out = [
        (px, py - tu * env(x) ** 0.6 * (1 - 0.28 * math.exp(-((x / (0.14 * w)) ** 2))))
        for (px, py), x in zip(top_in, xs, strict=True)
    ]
    lo_out = [(px, py + tl * env(x) ** 0.55) for (px, py), x in zip(bot_in, xs, strict=True)]
    pen.paint(
        pen.blur(pen.oval(CX, lo_out[n // 2][1] + 4, 0.55 * w, 4.5), 3), look.skin_shadow, 0.4
    )
    corners = pen.oval(CX - w - 1, seam(w) - 0.5, 2.2, 2.2)
    pen.oval(CX + w + 1, seam(w) - 0.5, 2.2, 2.2, corners)
    pen.paint(pen.blur(corners, 1.6), look.skin_shadow, 0.45 + 0.2 * max(0.0, shape.smile))
    if h > 0.4:
        hole = pen.poly(top_in + bot_in[::-1])
        pen.paint(hole, MOUTH_INSIDE)
        tongue_y = bot_in[n // 2][1] - 0.18 * h + (1 - shape.tongue) * 0.5 * h
        pen.paint(both(hole, pen.oval(CX, tongue_y + 2, 0.75 * wi, 0.4 * h + 3)), TONGUE)
        ut = shape.upper_teeth * min(7.5, 0.5 * h + 1.5)
        lt = shape.lower_teeth * min(5.0, 0.4 * h + 1.0)
        span = 0.8 * wi + 2.0

        def row(edge: list[Point], height: float) -> list[Point]:
            inside = [(x, y) for x, y in edge if abs(x - CX) < span]
            tall = [(x, y + height * (1 - (abs(x - CX) / span) ** 4)) for x, y in inside]
            return [(x, y - math.copysign(4, height)) for x, y in inside] + tall[::-1]

        teeth = pen.poly(row(top_in, ut)) if ut > 0.3 else pen.blank()
        if lt > 0.3:
            pen.poly(row(bot_in, -lt), teeth)
        pen.paint(both(hole, teeth), TEETH)
        gaps = pen.blank()
        for x in (-0.5, 0.0, 0.5):
            gx = CX + x * span * 0.62
            pen.stroke(
                [(gx, seam(gx - CX) - 0.3 * h - 1), (gx, seam(gx - CX) - 0.3 * h + ut * 0.8)],
                0.5,
                gaps,
            )
        pen.paint(both(both(hole, teeth), pen.blur(gaps, 0.3)), (200, 190, 186), 0.6)
        if shape.tongue_tip > 0.05:
            tip = pen.oval(CX, seam(0) + 1 + 0.15 * h, 0.5 * wi, (2 + 0.25 * h) * shape.tongue_tip)
            pen.paint(both(hole, tip), TONGUE)
        pen.paint(both(hole, invert(pen.blur(hole, 2.5))), (40, 10, 16), 0.7)
    upper = pen.poly(up_out + top_in[::-1])
    lower = pen.poly(bot_in + lo_out[::-1])
    pen.paint(upper, look.lip_dark)
    pen.paint(lower, look.lip)
    shine = pen.oval(CX - 0.12 * w, lo_out[n // 2][1] - tl * 0.55, 0.32 * w, 0.2 * tl + 0.6)
    pen.paint(both(lower, pen.blur(shine, 1.6)), WHITE, 0.4)
    pen.paint(
        both(upper, pen.blur(pen.oval(CX - 6, up_out[n // 2][1] + 1.5, 6, 1.5), 1)), WHITE, 0.18
    )
    line = pen.stroke(top_in, 1.0 + 0.8 * shape.press)
    pen.paint(pen.blur(line, 0.35), mix(look.lip_dark, MOUTH_INSIDE, 0.6), 0.85)
    if shape.smile > 0.2:
        creases = pen.blank()
        for s in (-1, 1):
            x0, y0 = CX + s * (w + 3), seam(w) - 1
            pen.stroke([(x0, y0 - 3), (x0 + s * 2, y0), (x0 + s * 1, y0 + 3)], 1.0, creases)
        pen.paint(pen.blur(creases, 0.8), look.skin_shadow, 0.35 * shape.smile)
    return pen.sprite()


# The Oculus visemes by wire id (the order of server.avatar.seam.Viseme; a server test checks it)
VISEME_NAMES: tuple[str, ...] = ("sil", "PP", "FF", "TH", "DD", "kk", "CH", "SS", "nn", "RR")
VISEME_NAMES += ("aa", "E", "I", "O", "U")
# the full shape of each viseme, by id
VISEME_SHAPES: tuple[MouthShape, ...] = (
    MouthShape(),
    MouthShape(width=0.94, press=1.0),
    MouthShape(opening=0.16, upper_teeth=1.0, tuck=1.0),
    MouthShape(opening=0.26, upper_teeth=0.9, lower_teeth=0.4, tongue=0.8, tongue_tip=1.0),
    MouthShape(opening=0.3, width=1.04, upper_teeth=0.8, lower_teeth=0.4, tongue=0.4),
    MouthShape(opening=0.45, width=1.04, upper_teeth=0.6, lower_teeth=0.3, tongue=0.6),
    MouthShape(opening=0.3, width=0.84, round=0.55, upper_teeth=1.0, lower_teeth=1.0),
    MouthShape(opening=0.15, width=1.14, upper_teeth=1.0, lower_teeth=1.0),
    MouthShape(opening=0.25, upper_teeth=0.7, lower_teeth=0.3, tongue=0.9),
    MouthShape(opening=0.3, width=0.8, round=0.7, upper_teeth=0.5, lower_teeth=0.2, tongue=0.3),
    MouthShape(opening=1.0, width=1.1, upper_teeth=0.7, lower_teeth=0.3, tongue=0.6),
    MouthShape(opening=0.6, width=1.18, upper_teeth=0.9, lower_teeth=0.5, tongue=0.5),
    MouthShape(opening=0.4, width=1.26, upper_teeth=1.0, lower_teeth=0.8, tongue=0.3),
    MouthShape(opening=0.68, width=0.76, round=1.0, upper_teeth=0.3, lower_teeth=0.1, tongue=0.4),
    MouthShape(opening=0.35, width=0.62, round=1.0, upper_teeth=0.1, tongue=0.1),
)


@dataclass(frozen=True)
class Mood:
    """How an expression sets lids, brows (viewer's left, right) and the resting smile.

    ``mouth``: the mouth at rest when it is more than closed lips with the smile (a grin, an
    open "oh"); visemes blend from it."""

    eyes: EyePose
    left: BrowPose
    right: BrowPose
    smile: float
    mouth: MouthShape | None = None

    @property
    def rest(self) -> MouthShape:
        """The mouth while no viseme moves it."""
        return self.mouth if self.mouth is not None else MouthShape(smile=self.smile)


MOODS: dict[str, Mood] = {
    "idle": Mood(EyePose(1.0, 1.0), BrowPose(), BrowPose(), 0.5),
    "listening": Mood(EyePose(1.12, 1.0), BrowPose(-5, -3.5, 1.5), BrowPose(-5, -3.5, 1.5), 0.65),
    "thinking": Mood(
        EyePose(0.86, 0.8),
        BrowPose(inner=4.5, outer=0.5, arch=-2.0, knit=4.0),
        BrowPose(inner=-2.5, outer=-6.5, arch=3.0, knit=1.0),
        -0.1,
    ),
    "speaking": Mood(EyePose(1.03, 0.86), BrowPose(-2.5, -1.5, 1), BrowPose(-2.5, -1.5, 1), 0.45),
    # a grin: cheeks up (the lower lids rise, the eyes narrow), brows relaxed, a little raised
    "smile": Mood(
        EyePose(0.9, 0.68),
        BrowPose(-2, -2.5, 1),
        BrowPose(-2, -2.5, 1),
        1.0,
        MouthShape(opening=0.16, width=1.15, upper_teeth=1.0, lower_teeth=0.2, smile=1.0),
    ),
    # eyes wide, brows high, the mouth a small open "oh"
    "surprise": Mood(
        EyePose(1.3, 1.12),
        BrowPose(-8, -6, 2.0),
        BrowPose(-8, -6, 2.0),
        0.1,
        MouthShape(opening=0.22, width=0.8, round=0.5, upper_teeth=0.3, smile=0.1),
    ),
}
EXPRESSIONS = tuple(MOODS)
