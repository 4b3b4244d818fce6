"""A captioned source domain for the tiny CLIP: rendered shapes with captions.

Images of 8 shapes (:data:`SHAPES`) in 8 colours (:data:`COLOURS`), two sizes, random position
and a small rotation, on a plain black, white or grey background with a little pixel noise, each
with the caption ``"a photo of a {size} {colour} {shape} on a {background} background"`` (the
source domain of the atha method's offline substitute, a reconstruction of the paper's CLIP
pre-training data at toy scale). Everything is plain NumPy: a shape is a polygon or an analytic
disc/ring, rasterised with 4 × 4 supersampling for anti-aliasing, so the same seed gives the same
bytes on every machine.

Eight (shape, colour) pairs, :data:`HELDOUT_COMBOS` (one per shape and one per colour), are left
out of the ``train`` split and marked in the ``test`` split: zero-shot accuracy on them measures
composition, not recall.

::

    table = shapes_table(20_000, seed=0, split="train")     # cached Parquet under NSHOT_CACHE
    images, labels = shapes_arrays(table)                     # float32 [n, 3, 32, 32] in [0, 1]
    captions = table.column("caption").to_pylist()
    variant = caption_text(shape=0, colour=2, size=1, background=0, template=2)

:func:`shape_alpha` (the coverage mask of one shape) is public so that target domains drawn from
the same shapes (textured, outlined) reuse the geometry.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pyarrow as pa

from nshot.data.cache import DataError, cached_table

__all__ = [
    "BACKGROUNDS",
    "CAPTION_TEMPLATES",
    "COLOURS",
    "DRAWING_STROKES",
    "DRAWING_TEMPLATES",
    "HELDOUT_COMBOS",
    "SHAPES",
    "SIZES",
    "caption_text",
    "caption_vocabulary",
    "drawing_alpha",
    "drawing_caption",
    "drawings_table",
    "render_drawings",
    "render_shapes",
    "shape_alpha",
    "shapes_arrays",
    "shapes_table",
]

VERSION = "2"
#: the version of the line drawings (:func:`render_drawings`)
DRAWINGS_VERSION = "1"

SHAPES: tuple[str, ...] = (
    "circle",
    "square",
    "triangle",
    "star",
    "cross",
    "ring",
    "diamond",
    "arrow",
)
#: colour name -> RGB (0..255)
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (40, 70, 225),
    "yellow": (240, 220, 40),
    "orange": (245, 140, 20),
    "purple": (140, 50, 190),
    "pink": (250, 130, 190),
    "cyan": (40, 210, 220),
}
BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "black": (15, 15, 15),
    "white": (240, 240, 240),
    "grey": (128, 128, 128),
}
#: size word -> shape radius as a fraction of the image side
#: (radius 0.17-0.25 at first: a from-scratch ViT with 4-pixel patches did not learn the small
#: shapes' identity within the ``small`` pre-training budget, even with a supervised shape loss)
SIZES: dict[str, tuple[float, float]] = {"small": (0.22, 0.30), "large": (0.34, 0.44)}
#: (shape index, colour index) pairs never shown in the ``train`` split
HELDOUT_COMBOS: tuple[tuple[int, int], ...] = tuple((s, (s + 3) % 8) for s in range(8))

#: Caption forms; template 0 is the full caption. Pre-training samples one per image and
#: step (fewer attributes in the shorter forms), so class-name prompts like "a photo of a circle"
#: are in the caption distribution (a reconstruction; CLIP's alt-texts vary the same way).
CAPTION_TEMPLATES: tuple[str, ...] = (
    "a photo of a {size} {colour} {shape} on a {background} background",
    "a photo of a {colour} {shape}",
    "a photo of a {shape}",
    "a {size} {shape}",
    "a {colour} {shape} on a {background} background",
    "a photo of a {size} {colour} {shape}",
    "a {shape} on a {background} background",
)

#: Caption forms of a line drawing of a shape (:func:`render_drawings`).
DRAWING_TEMPLATES: tuple[str, ...] = ("a drawing of a {shape}",)
#: A drawing's stroke width in pixels (uniform in this range): at least a pixel, and below the
#: half-width of the thinnest parts at the small size (the cross's arms, 2.1 pixels; the
#: ring's band, 1.6), so that every shape keeps an interior of background.
DRAWING_STROKES: tuple[float, float] = (1.0, 1.6)

_SUPERSAMPLE = 4
_MAX_ROTATION_DEG = 15.0
_COLOUR_JITTER = 18
_BACKGROUND_JITTER = 10
_NOISE_STD = 3.0


def caption_text(*, shape: int, colour: int, size: int, background: int, template: int = 0) -> str:
    """The caption of one image's attributes (indices into the tuples above) in one of
    :data:`CAPTION_TEMPLATES`."""
    return CAPTION_TEMPLATES[template].format(
        shape=SHAPES[shape],
        colour=list(COLOURS)[colour],
        size=list(SIZES)[size],
        background=list(BACKGROUNDS)[background],
    )


def caption_vocabulary() -> list[str]:
    """Every word the captions use, in a fixed order."""
    words: list[str] = []
    for t in CAPTION_TEMPLATES:
        for w in re.sub(r"\{\w+\}", " ", t).split():
            if w not in words:
                words.append(w)
    for group in (SHAPES, list(COLOURS), list(SIZES), list(BACKGROUNDS)):
        words += [w for w in group if w not in words]
    return words


# --------------------------------------------------------------------------------------------
# geometry


def _polygon(sides: int, inner: float | None = None, phase: float = math.pi / 2) -> np.ndarray:
    """A regular polygon (or, with ``inner``, a star) of outer radius 1, first vertex up."""
    n = sides * (2 if inner is not None else 1)
    ang = phase + np.arange(n) * 2 * math.pi / n
    rad = np.ones(n) if inner is None else np.where(np.arange(n) % 2 == 0, 1.0, inner)
    return np.stack([rad * np.cos(ang), rad * np.sin(ang)], axis=1)


_POLYGONS: dict[str, np.ndarray] = {
    "square": np.array([[-0.8, -0.8], [0.8, -0.8], [0.8, 0.8], [-0.8, 0.8]]),
    "triangle": _polygon(3),
    "star": _polygon(5, inner=0.45),
    "diamond": np.array([[0.0, 1.0], [0.75, 0.0], [0.0, -1.0], [-0.75, 0.0]]),
    "cross": np.array(
        [
            [-0.3, 1.0],
            [0.3, 1.0],
            [0.3, 0.3],
            [1.0, 0.3],
            [1.0, -0.3],
            [0.3, -0.3],
            [0.3, -1.0],
            [-0.3, -1.0],
            [-0.3, -0.3],
            [-1.0, -0.3],
            [-1.0, 0.3],
            [-0.3, 0.3],
        ]
    ),
    "arrow": np.array(
        [
            [-1.0, 0.25],
            [0.15, 0.25],
            [0.15, 0.7],
            [1.0, 0.0],
            [0.15, -0.7],
            [0.15, -0.25],
            [-1.0, -0.25],
        ]
    ),
}


def _inside_polygon(x: np.ndarray, y: np.ndarray, poly: np.ndarray) -> np.ndarray:
    """Even-odd rule (ray casting to +x) for points ``(x, y)`` against the closed ``poly``."""
    inside = np.zeros(x.shape, dtype=bool)
    px, py = poly[:, 0], poly[:, 1]
    qx, qy = np.roll(px, -1), np.roll(py, -1)
    for x0, y0, x1, y1 in zip(px, py, qx, qy, strict=True):
        if y0 == y1:
            continue
        crosses = (y0 > y) != (y1 > y)
        xi = x0 + (y - y0) * (x1 - x0) / (y1 - y0)
        inside ^= crosses & (x < xi)
    return inside


def _unit_mask(shape: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if shape == "circle":
        return x * x + y * y <= 1.0
    if shape == "ring":
        r2 = x * x + y * y
        return (r2 <= 1.0) & (r2 >= 0.55**2)
    return _inside_polygon(x, y, _POLYGONS[shape])


def shape_alpha(
    shape: str | int,
    side: int,
    *,
    cx: float,
    cy: float,
    radius: float,
    angle: float = 0.0,
) -> np.ndarray:
    """Coverage in [0, 1] (float32 ``[side, side]``) of one shape of outer ``radius`` pixels,
    centred at pixel coordinates ``(cx, cy)`` (x right, y down), rotated by ``angle`` radians
    counter-clockwise; 4 × 4 supersampled."""
    mask = _shape_mask(shape, side, cx=cx, cy=cy, radius=radius, angle=angle)
    ss = _SUPERSAMPLE
    return mask.astype(np.float32).reshape(side, ss, side, ss).mean(axis=(1, 3))


def _shape_mask(
    shape: str | int, side: int, *, cx: float, cy: float, radius: float, angle: float
) -> np.ndarray:
    """The shape's inside (bool ``[side * 4, side * 4]``) at the 4 × 4 supersampling points."""
    name = SHAPES[shape] if isinstance(shape, int | np.integer) else shape
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; choose from {SHAPES}")
    ss = _SUPERSAMPLE
    coords = (np.arange(side * ss) + 0.5) / ss
    px, py = np.meshgrid(coords, coords)  # py is the row coordinate (down)
    dx, dy = (px - cx) / radius, (cy - py) / radius  # y up
    c, s = math.cos(angle), math.sin(angle)
    ux, uy = c * dx + s * dy, -s * dx + c * dy  # rotate the points by -angle
    return _unit_mask(name, ux, uy)


def drawing_alpha(
    shape: str | int,
    side: int,
    *,
    cx: float,
    cy: float,
    radius: float,
    angle: float = 0.0,
    stroke: float = 1.5,
) -> np.ndarray:
    """Coverage in [0, 1] (float32 ``[side, side]``) of the outline of one shape (as
    :func:`shape_alpha`): the points of the shape within ``stroke`` pixels of its edge (a
    line of that width drawn along the inside of every edge, the ring's inner edge too), so
    the shape's interior keeps the background; 4 × 4 supersampled."""
    from scipy.ndimage import distance_transform_edt

    mask = _shape_mask(shape, side, cx=cx, cy=cy, radius=radius, angle=angle)
    ss = _SUPERSAMPLE
    line = mask & (distance_transform_edt(mask) <= stroke * ss)
    return line.astype(np.float32).reshape(side, ss, side, ss).mean(axis=(1, 3))


# --------------------------------------------------------------------------------------------
# rendering


def render_shapes(
    n: int, *, seed: int = 0, side: int = 32, split: str = "train"
) -> dict[str, np.ndarray]:
    """``n`` captioned images drawn with ``numpy.random.default_rng(seed)``.

    ``split="train"`` never draws a pair of :data:`HELDOUT_COMBOS`; ``split="test"`` draws shape
    and colour uniformly (about 1 in 8 images is a held-out pair). Returns ``image`` (uint8
    ``[n, side, side, 3]``), ``shape``, ``colour``, ``size``, ``background`` (int8 indices),
    ``heldout`` (bool) and ``caption`` (the full caption, template 0).
    """
    a = _draw_attributes(np.random.default_rng(seed), n, side, split)
    images = np.empty((n, side, side, 3), dtype=np.uint8)
    for i in range(n):
        alpha = shape_alpha(
            int(a["shape"][i]), side, cx=a["cx"][i], cy=a["cy"][i], radius=a["radius"][i],
            angle=a["angle"][i],
        )[..., None]  # fmt: skip
        images[i] = _paint(a["rng"], alpha, a["fg"][i], a["bg"][i])
    return _attribute_columns(a, images, caption_text)


def _draw_attributes(rng: np.random.Generator, n: int, side: int, split: str) -> dict:
    """The random attributes of ``n`` shapes (the draws of :func:`render_shapes`, in order)."""
    if n < 1 or side < 8:
        raise ValueError(f"need n >= 1 and side >= 8, got n={n}, side={side}")
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    shape = rng.integers(0, len(SHAPES), n)
    if split == "train":  # 7 allowed colours per shape: skip the held-out one
        held = np.array([dict(HELDOUT_COMBOS)[s] for s in range(len(SHAPES))])
        pick = rng.integers(0, len(COLOURS) - 1, n)
        colour = pick + (pick >= held[shape])
    else:
        colour = rng.integers(0, len(COLOURS), n)
    size = rng.integers(0, len(SIZES), n)
    background = rng.integers(0, len(BACKGROUNDS), n)
    lo = np.array([v[0] for v in SIZES.values()])[size]
    hi = np.array([v[1] for v in SIZES.values()])[size]
    radius = (lo + (hi - lo) * rng.random(n)) * side
    margin = radius + 1.0
    cx = margin + (side - 2 * margin) * rng.random(n)
    cy = margin + (side - 2 * margin) * rng.random(n)
    angle = np.deg2rad(rng.uniform(-_MAX_ROTATION_DEG, _MAX_ROTATION_DEG, n))
    fg_jitter = rng.integers(-_COLOUR_JITTER, _COLOUR_JITTER + 1, (n, 3))
    bg_jitter = rng.integers(-_BACKGROUND_JITTER, _BACKGROUND_JITTER + 1, (n, 3))
    fg = np.array(list(COLOURS.values()), dtype=np.float32)[colour] + fg_jitter
    bg = np.array(list(BACKGROUNDS.values()), dtype=np.float32)[background] + bg_jitter
    return {"rng": rng, "shape": shape, "colour": colour, "size": size,
            "background": background, "radius": radius, "cx": cx, "cy": cy, "angle": angle,
            "fg": fg, "bg": bg}  # fmt: skip


def _paint(rng: np.random.Generator, alpha: np.ndarray, fg: np.ndarray, bg: np.ndarray):
    """One uint8 image: ``fg`` over ``bg`` by coverage ``alpha`` ``[side, side, 1]``, plus
    the pixel noise."""
    side = alpha.shape[0]
    img = bg * (1 - alpha) + fg * alpha + rng.normal(0, _NOISE_STD, (side, side, 3))
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def _attribute_columns(a: dict, images: np.ndarray, caption) -> dict[str, np.ndarray]:
    combos = set(HELDOUT_COMBOS)
    pairs = zip(a["shape"], a["colour"], strict=True)
    heldout = np.array([(int(s), int(c)) in combos for s, c in pairs])
    rows = zip(a["shape"], a["colour"], a["size"], a["background"], strict=True)
    captions = [
        caption(shape=int(s), colour=int(c), size=int(z), background=int(b)) for s, c, z, b in rows
    ]
    return {
        "image": images,
        "shape": a["shape"].astype(np.int8),
        "colour": a["colour"].astype(np.int8),
        "size": a["size"].astype(np.int8),
        "background": a["background"].astype(np.int8),
        "heldout": heldout,
        "caption": np.array(captions, dtype=object),
    }


def drawing_caption(*, shape: int, template: int = 0, **_: int) -> str:
    """The caption of a line drawing of shape ``shape`` (:data:`DRAWING_TEMPLATES`)."""
    return DRAWING_TEMPLATES[template].format(shape=SHAPES[shape])


def render_drawings(
    n: int, *, seed: int = 0, side: int = 32, split: str = "train"
) -> dict[str, np.ndarray]:
    """``n`` captioned line drawings of the shapes, drawn with
    ``numpy.random.default_rng([seed, 8])``: the attributes of :func:`render_shapes` (shape,
    colour with the same held-out pairs, size, position, ±15° rotation, background, jitter
    and noise), each shape's outline only (:func:`drawing_alpha`, a stroke of width uniform
    in :data:`DRAWING_STROKES` pixels) in its colour, its interior the background. Returns
    the columns of :func:`render_shapes` (``caption``: "a drawing of a star") and
    ``radius``, ``cx``, ``cy``, ``angle``, ``stroke`` (float32)."""
    a = _draw_attributes(np.random.default_rng([seed, 8]), n, side, split)
    stroke = a["rng"].uniform(*DRAWING_STROKES, n)
    images = np.empty((n, side, side, 3), dtype=np.uint8)
    for i in range(n):
        alpha = drawing_alpha(
            int(a["shape"][i]), side, cx=a["cx"][i], cy=a["cy"][i], radius=a["radius"][i],
            angle=a["angle"][i], stroke=stroke[i],
        )[..., None]  # fmt: skip
        images[i] = _paint(a["rng"], alpha, a["fg"][i], a["bg"][i])
    out = _attribute_columns(a, images, drawing_caption)
    for k in ("radius", "cx", "cy", "angle"):
        out[k] = a[k].astype(np.float32)
    out["stroke"] = stroke.astype(np.float32)
    return out


def drawings_table(n: int, *, seed: int = 0, side: int = 32, split: str = "train") -> pa.Table:
    """:func:`render_drawings` as a cached, verified Parquet table with the columns of
    :func:`shapes_table`."""
    return cached_table(
        f"drawings-{split}-n{n}-s{seed}-{side}px",
        lambda: _table(render_drawings(n, seed=seed, side=side, split=split)),
        version=DRAWINGS_VERSION,
    )


def _table(d: dict[str, np.ndarray]) -> pa.Table:
    flat = d["image"].reshape(len(d["image"]), -1)
    return pa.table(
        {
            "image": pa.array([row.tobytes() for row in flat], type=pa.binary()),
            "label": pa.array(d["shape"].astype(np.int64), type=pa.int64()),
            "shape": pa.array(d["shape"], type=pa.int8()),
            "colour": pa.array(d["colour"], type=pa.int8()),
            "size": pa.array(d["size"], type=pa.int8()),
            "background": pa.array(d["background"], type=pa.int8()),
            "heldout": pa.array(d["heldout"], type=pa.bool_()),
            "caption": pa.array(d["caption"].tolist(), type=pa.string()),
        }
    )


def shapes_table(n: int, *, seed: int = 0, side: int = 32, split: str = "train") -> pa.Table:
    """:func:`render_shapes` as a cached, verified Parquet table (under ``$NSHOT_CACHE``).

    Columns: ``image`` (binary, ``side * side * 3`` uint8 bytes, row-major H × W × RGB),
    ``label`` (int64, the shape index), ``shape``, ``colour``, ``size``, ``background`` (int8),
    ``heldout`` (bool), ``caption`` (string). 20,000 images at 32² take about half a minute
    to render on one core, once.
    """

    return cached_table(
        f"shapes-{split}-n{n}-s{seed}-{side}px",
        lambda: _table(render_shapes(n, seed=seed, side=side, split=split)),
        version=VERSION,
    )


def shapes_arrays(table: pa.Table, *, uint8: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(images, labels)`` of a :func:`shapes_table`: float32 ``[n, 3, side, side]`` in [0, 1]
    (or the raw uint8 values with ``uint8=True``) and int64 shape labels ``[n]``."""
    raw = table.column("image").to_pylist()
    if not raw:
        raise DataError("the shapes table has no rows")
    side = math.isqrt(len(raw[0]) // 3)
    if side * side * 3 != len(raw[0]) or any(len(r) != len(raw[0]) for r in raw):
        raise DataError("column 'image' must hold side * side * 3 bytes in every row")
    flat = np.frombuffer(b"".join(raw), dtype=np.uint8).reshape(len(raw), side, side, 3)
    chw = np.ascontiguousarray(flat.transpose(0, 3, 1, 2))
    images = chw if uint8 else chw.astype(np.float32) / 255.0
    return images, table.column("label").to_numpy().astype(np.int64)
