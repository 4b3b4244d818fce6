"""Printed digit glyphs with captions: the numerals as a captioned source for the tiny CLIP.

The ten numerals "0" … "9" printed in DejaVu Sans (the TrueType file shipped inside
matplotlib, a core dependency: nothing is downloaded) at a random height and position, in one
of the shapes source's colours (:data:`nshot.data.shapes.COLOURS`) on one of its plain
backgrounds (:data:`nshot.data.shapes.BACKGROUNDS`), with the same colour jitter and pixel
noise, each captioned ``"a photo of the number seven"`` or ``"a photo of a seven"``
(:data:`GLYPH_TEMPLATES`). A real CLIP's web data holds printed numerals beside the words
that name them; the tiny CLIP's shapes never show that pairing, so no amount of training on
them can teach it (recipe 9 of :mod:`nshot.train.clip` adds these images).

A glyph's outline is read once from the font file (matplotlib's ``TextPath``: the font's
unhinted outlines, its curves flattened to polygons), rasterised by the even-odd rule on a
fine grid (:data:`GLYPH_GRID` rows over the glyph's height), and each image samples that
grid at 4 × 4 points per pixel. Everything after reading the outline is plain NumPy, so the
same seed gives the same bytes wherever the same font file is installed.

::

    d = render_glyphs(64, seed=0)                       # image uint8 [64, 32, 32, 3], digit, ...
    table = glyphs_table(10_000, seed=0)                # cached Parquet under NSHOT_CACHE
    alpha = glyph_alpha(7, 32, x0=8, y0=4, height=24)   # coverage of one printed "7"
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pyarrow as pa

from nshot.data.cache import cached_table
from nshot.data.shapes import (
    _BACKGROUND_JITTER,
    _COLOUR_JITTER,
    _NOISE_STD,
    _SUPERSAMPLE,
    BACKGROUNDS,
    COLOURS,
    _inside_polygon,
)

__all__ = [
    "DIGIT_WORDS",
    "FONT_FILE",
    "GLYPH_HEIGHTS",
    "GLYPH_TEMPLATES",
    "glyph_alpha",
    "glyph_caption",
    "glyph_mask",
    "glyph_width",
    "glyphs_arrays",
    "glyphs_table",
    "render_glyphs",
]

VERSION = "1"

#: The numerals' words, index = the digit.
DIGIT_WORDS: tuple[str, ...] = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
)
#: Caption forms of a printed numeral (one drawn per image and pre-training step).
GLYPH_TEMPLATES: tuple[str, ...] = ("a photo of the number {digit}", "a photo of a {digit}")
#: The font: DejaVu Sans, as matplotlib ships it (``mpl-data/fonts/ttf``).
FONT_FILE = "DejaVuSans.ttf"
#: A glyph's height (its ink's bounding box) as a fraction of the image side.
GLYPH_HEIGHTS: tuple[float, float] = (0.45, 0.85)
#: Rows of the fine grid each glyph is rasterised on (columns in proportion).
GLYPH_GRID = 256


def glyph_caption(digit: int, template: int = 0) -> str:
    """The caption of numeral ``digit`` in form ``template`` of :data:`GLYPH_TEMPLATES`."""
    return GLYPH_TEMPLATES[template].format(digit=DIGIT_WORDS[digit])


def _font_path() -> Path:
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf" / FONT_FILE


@functools.lru_cache(maxsize=10)
def glyph_mask(digit: int) -> np.ndarray:
    """The ink of numeral ``digit`` (bool ``[GLYPH_GRID, w]``, row 0 at the top) over its tight
    bounding box, ``w`` in proportion to the glyph's width: the font's outline filled by the
    even-odd rule, sampled at each cell's centre."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath

    if not 0 <= int(digit) <= 9:
        raise ValueError(f"digit must be 0..9, got {digit}")
    path = TextPath((0, 0), str(int(digit)), size=1.0, prop=FontProperties(fname=_font_path()))
    polys = [np.asarray(p, dtype=np.float64) for p in path.to_polygons()]
    pts = np.concatenate(polys)
    (x0, y0), (x1, y1) = pts.min(0), pts.max(0)
    rows = GLYPH_GRID
    cols = max(1, round(rows * (x1 - x0) / (y1 - y0)))
    v = y1 - (np.arange(rows) + 0.5) * (y1 - y0) / rows  # y up in the font
    u = x0 + (np.arange(cols) + 0.5) * (x1 - x0) / cols
    uu, vv = np.meshgrid(u, v)
    inside = np.zeros(uu.shape, dtype=bool)
    for poly in polys:  # even-odd over every contour: the counters of 0, 4, 6, 8, 9 stay empty
        inside ^= _inside_polygon(uu, vv, poly)
    return inside


def glyph_alpha(digit: int, side: int, *, x0: float, y0: float, height: float) -> np.ndarray:
    """Coverage in [0, 1] (float32 ``[side, side]``) of numeral ``digit`` whose ink box has
    its top-left corner at pixel coordinates ``(x0, y0)`` (x right, y down) and is ``height``
    pixels tall (the width in the font's proportion); 4 × 4 supersampled."""
    mask = glyph_mask(digit)
    rows, cols = mask.shape
    width = height * cols / rows
    ss = _SUPERSAMPLE
    coords = (np.arange(side * ss) + 0.5) / ss
    r = np.floor((coords - y0) / height * rows).astype(np.int64)
    c = np.floor((coords - x0) / width * cols).astype(np.int64)
    ok_r, ok_c = (r >= 0) & (r < rows), (c >= 0) & (c < cols)
    ink = np.zeros((side * ss, side * ss), dtype=bool)
    ink[np.ix_(ok_r, ok_c)] = mask[np.ix_(r[ok_r], c[ok_c])]
    return ink.astype(np.float32).reshape(side, ss, side, ss).mean(axis=(1, 3))


def glyph_width(digit: int, height: float) -> float:
    """The width in pixels of numeral ``digit`` printed ``height`` pixels tall."""
    rows, cols = glyph_mask(digit).shape
    return height * cols / rows


def render_glyphs(n: int, *, seed: int = 0, side: int = 32) -> dict[str, np.ndarray]:
    """``n`` captioned printed numerals drawn with ``numpy.random.default_rng([seed, 9])``:
    the digit, colour and background uniform, the height uniform in :data:`GLYPH_HEIGHTS`
    of the side, the ink box anywhere at least a pixel inside the image. Returns ``image``
    (uint8 ``[n, side, side, 3]``), ``digit``, ``colour``, ``background`` (int8 indices),
    ``height``, ``x0``, ``y0`` (float32 pixels) and ``caption`` (template 0)."""
    if n < 1 or side < 8:
        raise ValueError(f"need n >= 1 and side >= 8, got n={n}, side={side}")
    rng = np.random.default_rng([seed, 9])
    digit = rng.integers(0, len(DIGIT_WORDS), n)
    colour = rng.integers(0, len(COLOURS), n)
    background = rng.integers(0, len(BACKGROUNDS), n)
    lo, hi = GLYPH_HEIGHTS
    height = (lo + (hi - lo) * rng.random(n)) * side
    width = np.array([glyph_width(int(d), h) for d, h in zip(digit, height, strict=True)])
    x0 = 1.0 + (side - 2.0 - width) * rng.random(n)
    y0 = 1.0 + (side - 2.0 - height) * rng.random(n)
    fg_jitter = rng.integers(-_COLOUR_JITTER, _COLOUR_JITTER + 1, (n, 3))
    bg_jitter = rng.integers(-_BACKGROUND_JITTER, _BACKGROUND_JITTER + 1, (n, 3))
    fg = np.array(list(COLOURS.values()), dtype=np.float32)[colour] + fg_jitter
    bg = np.array(list(BACKGROUNDS.values()), dtype=np.float32)[background] + bg_jitter
    images = np.empty((n, side, side, 3), dtype=np.uint8)
    for i in range(n):
        alpha = glyph_alpha(int(digit[i]), side, x0=x0[i], y0=y0[i], height=height[i])[..., None]
        img = bg[i] * (1 - alpha) + fg[i] * alpha + rng.normal(0, _NOISE_STD, (side, side, 3))
        images[i] = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    return {
        "image": images,
        "digit": digit.astype(np.int8),
        "colour": colour.astype(np.int8),
        "background": background.astype(np.int8),
        "height": height.astype(np.float32),
        "x0": x0.astype(np.float32),
        "y0": y0.astype(np.float32),
        "caption": np.array([glyph_caption(int(d)) for d in digit], dtype=object),
    }


def glyphs_table(n: int, *, seed: int = 0, side: int = 32) -> pa.Table:
    """:func:`render_glyphs` as a cached, verified Parquet table (under ``$NSHOT_CACHE``).

    Columns: ``image`` (binary, ``side * side * 3`` uint8 bytes, H × W × RGB), ``label``
    (int64, the digit), ``digit``, ``colour``, ``background`` (int8), ``caption`` (string)."""

    def build() -> pa.Table:
        d = render_glyphs(n, seed=seed, side=side)
        flat = d["image"].reshape(n, -1)
        return pa.table(
            {
                "image": pa.array([row.tobytes() for row in flat], type=pa.binary()),
                "label": pa.array(d["digit"].astype(np.int64), type=pa.int64()),
                "digit": pa.array(d["digit"], type=pa.int8()),
                "colour": pa.array(d["colour"], type=pa.int8()),
                "background": pa.array(d["background"], type=pa.int8()),
                "caption": pa.array(d["caption"].tolist(), type=pa.string()),
            }
        )

    return cached_table(f"glyphs-n{n}-s{seed}-{side}px", build, version=VERSION)


def glyphs_arrays(table: pa.Table, *, uint8: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(images, labels)`` of a :func:`glyphs_table` (as :func:`nshot.data.shapes.shapes_arrays`:
    ``[n, 3, side, side]``, float32 in [0, 1] or uint8) and the int64 digits."""
    from nshot.data.shapes import shapes_arrays

    return shapes_arrays(table, uint8=uint8)
