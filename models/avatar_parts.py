"""The static layers of the procedural avatar: backdrop and bust, head (skin, hair), nose, glasses.

Each builder draws once per look and scale (design units, see models/avatar_pen.py); the
renderer caches the results. Moving features (eyes, brows, mouth) are in models/avatar_face.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from models.avatar_looks import CHIN, CX, EAR_Y, EYE_DX, EYE_Y, FACE_TOP, NECK_HALF, NOSE_Y, Look
from models.avatar_pen import (
    WHITE,
    Box,
    Pen,
    Point,
    Sprite,
    bezier,
    both,
    invert,
    minus,
    mix,
    path,
    union,
)

HEAD_BOX: Box = (92.0, 36.0, 420.0, 392.0)  # every head layer covers this, design units


@dataclass(frozen=True)
class HeadLayers:
    """Hair behind the face, the face itself (ears, shading), hair in front of it."""

    hair_back: Sprite
    skin: Sprite
    hair_front: Sprite


def face_outline(look: Look, n: int = 48) -> list[Point]:
    """The face contour, clockwise from the crown: a round skull over a tapering jaw."""
    yc, hh, a = (FACE_TOP + CHIN) / 2, (CHIN - FACE_TOP) / 2, look.face_half
    right: list[Point] = []
    for i in range(n):
        v = -math.cos(math.pi * i / (n - 1))
        w = a * math.sqrt(max(0.0, 1 - v * v)) if v < 0 else a * (1 - v**look.jaw) ** 0.62
        right.append((CX + w, yc + v * hh))
    left = [(2 * CX - x, y) for x, y in reversed(right)]
    return right + left


def _shade_hair(pen: Pen, m: Image.Image, look: Look, dark: float) -> None:
    """Fill a hair mask: base colour, darker low and at the rim, for volume."""
    pen.paint(m, mix(look.hair, look.hair_dark, dark))
    low = pen.ramp((CX, 120), (CX, 360))
    pen.paint(both(m, low), look.hair_dark, 0.55)
    rim = both(m, invert(pen.blur(m, 7)))
    pen.paint(rim, look.hair_dark, 0.6)


def _bob(pen: Pen, look: Look) -> tuple[Image.Image, Image.Image]:
    """A chin-length bob with a side-swept fringe: (behind the face, in front of it)."""
    back = pen.oval(CX, 196, 120, 126)
    pen.poly(
        path(
            [(136, 196), (376, 196)],
            bezier((376, 196), (382, 280), (382, 330), (356, 352)),
            bezier((356, 352), (320, 360), (192, 360), (156, 352)),
            bezier((156, 352), (130, 330), (130, 280), (136, 196)),
        ),
        back,
    )
    back = minus(back, pen.rounded((CX - NECK_HALF + 1, 290, CX + NECK_HALF - 1, 420), 2))
    front = pen.poly(
        bezier((214, 84), (290, 58), (376, 96), (378, 200))
        + bezier((378, 200), (382, 276), (382, 330), (356, 352))
        + bezier((356, 352), (344, 326), (340, 284), (342, 236))
        + bezier((342, 236), (342, 200), (330, 170), (300, 154))
        + bezier((300, 154), (262, 138), (232, 122), (214, 96))
        + bezier((214, 96), (206, 130), (186, 150), (170, 176))
        + bezier((170, 176), (166, 220), (168, 300), (156, 352))
        + bezier((156, 352), (130, 330), (130, 280), (134, 196))
        + bezier((134, 196), (134, 120), (170, 88), (214, 84))
    )
    return back, front


def _bob_texture(pen: Pen, look: Look, front: Image.Image) -> None:
    sheen = pen.stroke(bezier((168, 134), (200, 92), (280, 80), (346, 124)), 9)
    pen.paint(both(front, pen.blur(sheen, 4)), look.hair_sheen, 0.55)
    strands = pen.blank()
    for dx in (-8, 4, 16, 30):
        pen.stroke(
            bezier((216 + dx, 92), (260 + dx, 110), (330 + dx / 2, 150), (360, 230)), 1.2, strands
        )
    for dx in (0, 10, 20):
        pen.stroke(
            bezier((206 - dx, 100), (180 - dx, 150), (160 - dx / 2, 230), (150, 320)), 1.2, strands
        )
        pen.stroke(bezier((360 + dx / 3, 200), (366, 260), (364, 300), (354, 340)), 1.0, strands)
    pen.paint(both(front, pen.blur(strands, 0.6)), look.hair_sheen, 0.35)


def _jitter(rng: np.random.Generator, centres: list[Point], r: float) -> list[tuple[Point, float]]:
    out = []
    for x, y in centres:
        jx, jy, jr = rng.uniform(-1.5, 1.5, 3)
        out.append(((x + jx, y + jy), r + jr))
    return out


def _curly(pen: Pen, look: Look) -> tuple[Image.Image, Image.Image]:
    """Short curly hair: (the cap behind, the scalloped hairline in front)."""
    rng = np.random.default_rng(7)
    back = pen.oval(CX, 150, 106, 88)
    pen.poly([(158, 150), (354, 150), (352, 212), (160, 212)], back)
    rim = [(CX + 106 * math.cos(t), 150 + 90 * math.sin(t)) for t in np.linspace(-3.25, 0.11, 22)]
    for (x, y), r in _jitter(rng, rim, 15.0):
        pen.oval(x, y, r, r, back)
    line = [(x, 136 + ((x - CX) / 92) ** 2 * 52) for x in np.linspace(166, 346, 13)]
    front = pen.poly([*line, (356, 110), (356, 40), (156, 40), (156, 110)])
    for (x, y), r in _jitter(rng, line, 10.0):
        pen.oval(x, y, r, r, front)
    return back, both(front, back)


def _curly_texture(pen: Pen, look: Look, m: Image.Image, seed: int) -> None:
    """Little C-shaped curls: a light arc over a dark one."""
    rng = np.random.default_rng(seed)
    lights, darks = pen.blank(), pen.blank()
    for _ in range(90):
        x, y = rng.uniform(150, 362), rng.uniform(60, 210)
        if ((x - CX) / 106) ** 2 + ((y - 150) / 90) ** 2 > 1.1:
            continue
        r, t0 = rng.uniform(4.0, 6.5), rng.uniform(0, 2 * math.pi)
        arc = [(x + r * math.cos(t), y + r * math.sin(t)) for t in np.linspace(t0, t0 + 3.6, 10)]
        pen.stroke(arc, 1.5, lights)
        pen.stroke([(px + 0.8, py + 1.6) for px, py in arc], 1.6, darks)
    pen.paint(both(m, pen.blur(darks, 0.8)), look.hair_dark, 0.45)
    pen.paint(both(m, pen.blur(lights, 0.7)), look.hair_sheen, 0.32)
    top = pen.stroke(bezier((176, 116), (200, 74), (286, 62), (330, 92)), 12)
    pen.paint(both(m, pen.blur(top, 7)), look.hair_sheen, 0.35)


def head_layers(look: Look, scale: float) -> HeadLayers:
    """Hair and skin of the head, all on HEAD_BOX."""
    pens = [Pen(HEAD_BOX, scale, 3) for _ in range(3)]
    back_pen, skin_pen, front_pen = pens
    if look.hair_style == "bob":
        back, front = _bob(back_pen, look)
    else:
        back, front = _curly(back_pen, look)
    _shade_hair(back_pen, back, look, 0.45)
    _shade_hair(front_pen, front, look, 0.0)
    if look.hair_style == "bob":
        _bob_texture(front_pen, look, front)
    else:
        _curly_texture(back_pen, look, back, 11)
        _curly_texture(front_pen, look, front, 11)
    _draw_skin(skin_pen, look, front)
    return HeadLayers(back_pen.sprite(), skin_pen.sprite(), front_pen.sprite())


def _draw_skin(pen: Pen, look: Look, hair_front: Image.Image) -> None:
    ears = pen.blank()
    for side in (-1, 1):
        ex = CX + side * (look.face_half - 1)
        pen.oval(ex, EAR_Y, 12, 21, ears)
    pen.paint(ears, mix(look.skin, look.skin_shadow, 0.25))
    inner = pen.blank()
    for side in (-1, 1):
        pen.oval(CX + side * (look.face_half + 3), EAR_Y + 1, 5.5, 13, inner)
    pen.paint(pen.blur(inner, 2), look.skin_shadow, 0.6)
    face = pen.poly(face_outline(look))
    pen.paint(face, look.skin)
    pen.paint(both(face, pen.ramp((CX - 30, 0), (CX + 110, 0))), look.skin_shadow, 0.35)
    pen.paint(both(face, invert(pen.blur(face, 11))), look.skin_shadow, 0.75)
    pen.paint(both(face, pen.ramp((0, 290), (0, CHIN + 10))), look.skin_shadow, 0.25)
    cast = pen.blur(
        hair_front.transform(hair_front.size, Image.Transform.AFFINE, (1, 0, 0, 0, 1, -6 * pen.k)),
        5,
    )
    pen.paint(both(face, cast), look.skin_shadow, 0.55)
    glow = pen.oval(232, 150, 42, 26)
    pen.oval(206, 250, 16, 10, glow)
    pen.oval(CX, CHIN - 14, 16, 7, glow)
    pen.paint(both(face, pen.blur(glow, 9)), WHITE, 0.22)
    blush = pen.oval(CX - 52, 272, 19, 11)
    pen.oval(CX + 52, 272, 19, 11, blush)
    pen.paint(both(face, pen.blur(blush, 7)), look.blush, 0.35)


def nose(look: Look, scale: float) -> Sprite:
    """The nose: a shaded bridge and a soft underside; moves with the features."""
    pen = Pen((CX - 30, NOSE_Y - 40, CX + 30, NOSE_Y + 16), scale)
    y = NOSE_Y
    bridge = pen.stroke(
        bezier((CX + 6, y - 32), (CX + 9, y - 20), (CX + 10, y - 10), (CX + 9, y - 3)), 5
    )
    pen.paint(pen.blur(bridge, 3.2), look.skin_shadow, 0.3)
    under = pen.oval(CX + 1, y + 6, 11, 3)
    pen.paint(pen.blur(under, 2.2), look.skin_shadow, 0.45)
    tip = pen.stroke(
        bezier((CX - 11, y - 1), (CX - 5, y + 6), (CX + 5, y + 6), (CX + 11, y - 1)), 1.8
    )
    for side in (-1, 1):
        pen.stroke(
            bezier(
                (CX + side * 10, y - 6),
                (CX + side * 14, y - 3),
                (CX + side * 14, y + 2),
                (CX + side * 10, y + 3),
            ),
            1.6,
            tip,
        )
    pen.paint(pen.blur(tip, 0.8), look.skin_shadow, 0.55)
    pen.paint(pen.blur(pen.oval(CX - 3, y - 4, 5, 4), 2.2), WHITE, 0.35)
    return pen.sprite()


def glasses(look: Look, scale: float) -> Sprite:
    """Round-cornered glasses with thin temples and a faint glare."""
    pen = Pen((CX - 104, EYE_Y - 32, CX + 104, EYE_Y + 30), scale)
    frame, lens = pen.blank(), pen.blank()
    for side in (-1, 1):
        ex = CX + side * EYE_DX
        box = (ex - 30, EYE_Y - 24, ex + 30, EYE_Y + 22)
        pen.rounded(box, 23, frame)
        pen.rounded((box[0] + 3.4, box[1] + 3.4, box[2] - 3.4, box[3] - 3.4), 20, lens)
        pen.stroke([(ex + side * 29, EYE_Y - 8), (CX + side * 92, EYE_Y - 10)], 3.2, frame)
    frame = minus(frame, lens)
    pen.stroke(
        bezier(
            (CX - 16, EYE_Y - 8), (CX - 8, EYE_Y - 14), (CX + 8, EYE_Y - 14), (CX + 16, EYE_Y - 8)
        ),
        3.6,
        frame,
    )
    pen.paint(lens, WHITE, 0.06)
    glare = pen.blank()
    for side in (-1, 1):
        ex = CX + side * EYE_DX
        pen.poly(
            [
                (ex - 4, EYE_Y - 19),
                (ex + 8, EYE_Y - 19),
                (ex - 12, EYE_Y + 18),
                (ex - 22, EYE_Y + 18),
            ],
            glare,
        )
    pen.paint(both(lens, pen.blur(glare, 1.5)), WHITE, 0.16)
    pen.paint(frame, (34, 44, 58))
    pen.paint(both(frame, pen.ramp((0, EYE_Y - 10), (0, EYE_Y - 22))), (110, 130, 150), 0.6)
    return pen.sprite()


def backdrop(look: Look, scale: float, frame: Box) -> Image.Image:
    """Background, bust (neck, shoulders, clothes) and soft shadows: the frame's still part.

    ``frame`` is the whole frame in design units (it may reach beyond the design square).
    """
    pen = Pen(frame, scale, 2)
    full = pen.poly(
        [(frame[0], frame[1]), (frame[2], frame[1]), (frame[2], frame[3]), (frame[0], frame[3])]
    )
    pen.paint(full, look.bg_bottom)
    pen.paint(invert(pen.ramp((0, 40), (0, 512))), look.bg_top)
    pen.paint(pen.blur(pen.oval(CX - 10, 190, 170, 170), 60), look.glow, 0.75)
    bokeh = pen.oval(70, 110, 34, 34)
    pen.oval(450, 80, 22, 22, bokeh)
    pen.oval(430, 300, 40, 40, bokeh)
    pen.oval(60, 330, 18, 18, bokeh)
    pen.paint(pen.blur(bokeh, 6), look.glow, 0.35)
    top = 374.0  # where the neck meets the shoulders
    torso = pen.poly(
        bezier((28, 540), (32, 462), (70, 424), (150, 410))
        + bezier((150, 410), (192, 402), (212, 392), (CX - NECK_HALF + 2, top))
        + bezier((CX + NECK_HALF - 2, top), (300, 392), (320, 402), (362, 410))
        + bezier((362, 410), (442, 424), (480, 462), (484, 540))
    )
    shadow = union(torso, pen.oval(CX + 2, 214, 118, 138))
    shifted = shadow.transform(
        shadow.size, Image.Transform.AFFINE, (1, 0, -14 * pen.k, 0, 1, -6 * pen.k)
    )
    pen.paint(pen.blur(shifted, 16), look.cloth_dark, 0.22)
    neck = pen.poly(
        path(
            [(CX - NECK_HALF, 290), (CX + NECK_HALF, 290)],
            bezier(
                (CX + NECK_HALF, 290),
                (CX + NECK_HALF, 350),
                (CX + NECK_HALF + 2, 380),
                (CX + 60, 412),
            ),
            [(CX + 40, 470), (CX - 40, 470)],
            bezier(
                (CX - 60, 412),
                (CX - NECK_HALF - 2, 380),
                (CX - NECK_HALF, 350),
                (CX - NECK_HALF, 290),
            ),
        )
    )
    pen.paint(neck, mix(look.skin, look.skin_shadow, 0.15))
    pen.paint(both(neck, pen.blur(pen.oval(CX, 336, 64, 44), 16)), look.skin_shadow, 0.7)
    pen.paint(both(neck, invert(pen.ramp((CX - 44, 0), (CX - 14, 0)))), look.skin_shadow, 0.25)
    if look.hair_style == "bob":
        hole = pen.oval(CX, 384, 54, 40)
        cloth = minus(torso, hole)
        trim = minus(both(torso, pen.oval(CX, 384, 62, 47)), hole)
        pen.paint(both(neck, pen.blur(pen.oval(CX, 420, 60, 14), 6)), look.skin_shadow, 0.5)
    else:
        cloth = minus(torso, pen.poly([(CX - 34, 360), (CX, 452), (CX + 34, 360)]))
        trim = pen.blank()
        for side in (-1, 1):
            pen.poly(
                [
                    (CX + side * 27, 372),
                    (CX + side * 2, 446),
                    (CX + side * 32, 458),
                    (CX + side * 62, 400),
                ],
                trim,
            )
    pen.paint(cloth, look.cloth)
    pen.paint(both(cloth, pen.ramp((120, 410), (420, 520))), look.cloth_dark, 0.55)
    pen.paint(both(cloth, invert(pen.blur(torso, 10))), look.cloth_dark, 0.5)
    pen.paint(both(cloth, pen.blur(pen.oval(150, 430, 60, 18), 14)), look.cloth_trim, 0.5)
    if look.hair_style != "bob":
        pen.paint(both(cloth, pen.blur(trim, 5)), look.cloth_dark, 0.5)
    pen.paint(trim, look.cloth_trim)
    pen.paint(both(trim, pen.ramp((0, 372), (0, 460))), look.cloth, 0.45)
    if look.hair_style != "bob":
        for y in (476, 504):
            pen.paint(pen.oval(CX, y, 3.2, 3.2), look.cloth_trim)
    return pen.sprite().image.convert("RGB")
