"""The selectable looks of the procedural avatar: palettes and shape parameters.

Colours are sRGB; lengths are design units (the character is drawn on a 512-unit square).
"""

from __future__ import annotations

from dataclasses import dataclass

from models.avatar_pen import Rgb

# The face, in design units: the vertical centre line and where the features sit.
CX = 256.0
FACE_TOP = 96.0
CHIN = 344.0
EYE_Y = 226.0
EYE_DX = 45.0  # eye centre distance from the centre line
BROW_Y = 196.0
NOSE_Y = 264.0
MOUTH_Y = 296.0
EAR_Y = 232.0
NECK_HALF = 30.0


@dataclass(frozen=True)
class Look:
    """One appearance: palette and style switches."""

    name: str
    skin: Rgb
    skin_shadow: Rgb
    blush: Rgb
    lip: Rgb
    lip_dark: Rgb
    hair: Rgb
    hair_dark: Rgb
    hair_sheen: Rgb
    iris: Rgb
    iris_dark: Rgb
    lash: Rgb
    brow: Rgb
    bg_top: Rgb
    bg_bottom: Rgb
    glow: Rgb
    cloth: Rgb
    cloth_dark: Rgb
    cloth_trim: Rgb
    hair_style: str  # "bob" | "curly"
    glasses: bool
    face_half: float  # half of the face width at the cheekbones
    jaw: float  # jaw exponent: higher = squarer jaw
    eye_tilt: float  # outer eye corners lifted, units
    lashes: bool
    brow_width: float  # brow thickness at the inner end, units
    brow_arch: float  # how high the brow arches, units


ADA = Look(
    name="ada",
    skin=(246, 204, 178),
    skin_shadow=(214, 148, 124),
    blush=(240, 140, 130),
    lip=(206, 104, 108),
    lip_dark=(160, 70, 78),
    hair=(52, 34, 32),
    hair_dark=(28, 18, 18),
    hair_sheen=(126, 92, 80),
    iris=(150, 96, 52),
    iris_dark=(74, 44, 26),
    lash=(40, 26, 26),
    brow=(72, 48, 42),
    bg_top=(255, 242, 228),
    bg_bottom=(244, 196, 166),
    glow=(255, 250, 240),
    cloth=(196, 92, 70),
    cloth_dark=(140, 56, 44),
    cloth_trim=(222, 124, 96),
    hair_style="bob",
    glasses=False,
    face_half=92.0,
    jaw=2.4,
    eye_tilt=1.6,
    lashes=True,
    brow_width=4.8,
    brow_arch=8.5,
)

MILO = Look(
    name="milo",
    skin=(176, 118, 86),
    skin_shadow=(124, 74, 52),
    blush=(196, 102, 84),
    lip=(150, 84, 76),
    lip_dark=(108, 54, 50),
    hair=(40, 30, 28),
    hair_dark=(18, 13, 13),
    hair_sheen=(108, 84, 72),
    iris=(96, 60, 38),
    iris_dark=(44, 26, 18),
    lash=(24, 16, 16),
    brow=(34, 24, 22),
    bg_top=(226, 240, 248),
    bg_bottom=(150, 186, 212),
    glow=(246, 252, 255),
    cloth=(54, 88, 128),
    cloth_dark=(30, 52, 82),
    cloth_trim=(86, 126, 170),
    hair_style="curly",
    glasses=True,
    face_half=93.0,
    jaw=2.7,
    eye_tilt=0.0,
    lashes=False,
    brow_width=7.0,
    brow_arch=6.0,
)

LOOKS: tuple[Look, ...] = (ADA, MILO)
