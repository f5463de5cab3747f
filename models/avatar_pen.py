"""Anti-aliased drawing in design units for the procedural avatar (Pillow).

The character is designed on a 512-unit square ("design units"); a :class:`Pen` maps design
units to pixels at a scale, draws at ``ss`` times the resolution and downsamples once
(box filter), which is where the anti-aliasing comes from. Masks are ``L`` images of the
supersampled canvas; painting composites a colour through a mask.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageChops, ImageDraw, ImageFilter

Rgb = tuple[int, int, int]
Point = tuple[float, float]
Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in design units
WHITE: Rgb = (255, 255, 255)


@dataclass(frozen=True)
class Sprite:
    """An RGBA image placed at (x, y), pixels of the scaled design square."""

    image: Image.Image
    x: int
    y: int


def bezier(*points: Point, n: int = 24) -> list[Point]:
    """``n`` points along the Bezier curve of ``points`` (3: quadratic, 4: cubic), both ends
    included."""
    degree = len(points) - 1
    out: list[Point] = []
    for i in range(n):
        t = i / (n - 1)
        weights = [math.comb(degree, k) * t**k * (1 - t) ** (degree - k) for k in range(degree + 1)]
        out.append(
            (
                sum(w * p[0] for w, p in zip(weights, points, strict=True)),
                sum(w * p[1] for w, p in zip(weights, points, strict=True)),
            )
        )
    return out


def path(*parts: Sequence[Point]) -> list[Point]:
    """Polyline pieces joined into one outline."""
    return [p for part in parts for p in part]


def mix(a: Rgb, b: Rgb, t: float) -> Rgb:
    """Linear blend of two colours (t = 0 gives a)."""
    return (
        round(a[0] + (b[0] - a[0]) * t),
        round(a[1] + (b[1] - a[1]) * t),
        round(a[2] + (b[2] - a[2]) * t),
    )


def both(a: Image.Image, b: Image.Image) -> Image.Image:
    """Intersection of two masks."""
    return ImageChops.multiply(a, b)


def minus(a: Image.Image, b: Image.Image) -> Image.Image:
    """``a`` without ``b``."""
    return ImageChops.subtract(a, b)


def union(a: Image.Image, b: Image.Image) -> Image.Image:
    return ImageChops.lighter(a, b)


def invert(a: Image.Image) -> Image.Image:
    return ImageChops.invert(a)


class Pen:
    """Draws the design-unit ``box`` at ``scale`` pixels per unit, supersampled ``ss`` times."""

    def __init__(self, box: Box, scale: float, ss: int = 4) -> None:
        self.x0 = math.floor(box[0] * scale)
        self.y0 = math.floor(box[1] * scale)
        self.w = max(1, math.ceil(box[2] * scale) - self.x0)
        self.h = max(1, math.ceil(box[3] * scale) - self.y0)
        self.k = scale * ss
        self.ss = ss
        self.size = (self.w * ss, self.h * ss)
        self.img = Image.new("RGBA", self.size, (0, 0, 0, 0))

    def xy(self, pts: Iterable[Point]) -> list[Point]:
        """Design units -> supersampled canvas pixels."""
        ox, oy, k = self.x0 * self.ss, self.y0 * self.ss, self.k
        return [(x * k - ox, y * k - oy) for x, y in pts]

    def blank(self) -> Image.Image:
        return Image.new("L", self.size, 0)

    def poly(self, pts: Sequence[Point], into: Image.Image | None = None) -> Image.Image:
        m = into if into is not None else self.blank()
        if len(pts) >= 3:
            ImageDraw.Draw(m).polygon(self.xy(pts), fill=255)
        return m

    def oval(
        self, cx: float, cy: float, rx: float, ry: float, into: Image.Image | None = None
    ) -> Image.Image:
        m = into if into is not None else self.blank()
        (x0, y0), (x1, y1) = self.xy([(cx - rx, cy - ry), (cx + rx, cy + ry)])
        ImageDraw.Draw(m).ellipse((x0, y0, x1, y1), fill=255)
        return m

    def rounded(self, box: Box, radius: float, into: Image.Image | None = None) -> Image.Image:
        m = into if into is not None else self.blank()
        (x0, y0), (x1, y1) = self.xy([(box[0], box[1]), (box[2], box[3])])
        ImageDraw.Draw(m).rounded_rectangle((x0, y0, x1, y1), radius * self.k, fill=255)
        return m

    def stroke(
        self, pts: Sequence[Point], width: float, into: Image.Image | None = None
    ) -> Image.Image:
        """A polyline ``width`` units wide with round joints and caps."""
        m = into if into is not None else self.blank()
        px = self.xy(pts)
        w = max(1, round(width * self.k))
        draw = ImageDraw.Draw(m)
        draw.line(px, fill=255, width=w, joint="curve")
        r = w / 2
        for x, y in (px[0], px[-1]):
            draw.ellipse((x - r, y - r, x + r, y + r), fill=255)
        return m

    def ribbon(
        self, pts: Sequence[Point], widths: Sequence[float], into: Image.Image | None = None
    ) -> Image.Image:
        """A stroke whose thickness (units, across y) varies along ``pts``: tapered lines."""
        top = [(x, y - w / 2) for (x, y), w in zip(pts, widths, strict=True)]
        bottom = [(x, y + w / 2) for (x, y), w in zip(pts, widths, strict=True)]
        return self.poly(top + bottom[::-1], into)

    def blur(self, m: Image.Image, radius: float) -> Image.Image:
        """Gaussian blur of a mask, ``radius`` (the standard deviation) in design units."""
        sigma = radius * self.k
        box = m.getbbox()
        if sigma < 0.3 or box is None:
            return m
        if sigma >= 2 * self.ss:
            # wide: a blurred mask is smooth, so blur it at output resolution and scale it back
            small = m.reduce(self.ss).filter(ImageFilter.GaussianBlur(sigma / self.ss))
            return small.resize(self.size, Image.Resampling.BILINEAR)
        pad = math.ceil(3 * sigma) + 2
        box = (max(0, box[0] - pad), max(0, box[1] - pad), box[2] + pad, box[3] + pad)
        out = self.blank()
        out.paste(m.crop(box).filter(ImageFilter.GaussianBlur(sigma)), box[:2])
        return out

    def ramp(self, p0: Point, p1: Point) -> Image.Image:
        """A linear gradient mask: 0 at ``p0`` rising to 255 at ``p1`` (clamped beyond)."""
        (x0, y0), (x1, y1) = self.xy([p0, p1])
        dx, dy = x1 - x0, y1 - y0
        n2 = dx * dx + dy * dy or 1.0
        xs = np.arange(self.size[0], dtype=np.float32)[None, :]
        ys = np.arange(self.size[1], dtype=np.float32)[:, None]
        t = ((xs - x0) * dx + (ys - y0) * dy) / n2
        return Image.fromarray((np.clip(t, 0.0, 1.0) * 255).astype(np.uint8), "L")

    def paint(self, m: Image.Image, color: Rgb, alpha: float = 1.0) -> None:
        """Composite ``color`` through mask ``m`` at opacity ``alpha``."""
        box = m.getbbox()
        if box is None:
            return
        m = m.crop(box)
        if alpha < 1.0:
            m = m.point([round(v * alpha) for v in range(256)])
        layer = Image.new("RGBA", m.size, (*color, 255))
        layer.putalpha(m)
        self.img.alpha_composite(layer, box[:2])

    def sprite(self) -> Sprite:
        """The canvas downsampled to pixels (premultiplied box filter)."""
        img = self.img.resize((self.w, self.h), Image.Resampling.BOX)
        return Sprite(img, self.x0, self.y0)
