"""Offline data for CAOS: the digits-landmark substitute and user-supplied features.

digits-landmark: every 8×8 scikit-learn digit (values /16) is scaled by U(0.7, 1.3), pasted at a
random offset into a zero ``canvas × canvas`` image and noised with N(0, 0.15²); its landmark is
the digit centre ``(oy + 4, ox + 4)`` as a flat index. The frozen backbone maps an image to one
feature per pixel: the ``patch × patch`` zero-padded patch around the pixel, flattened,
mean-centred and L2-normalised (ε = 1e-8).

A :class:`Pool` draws the images (features and landmarks) of a trial from a generator; the
trial protocol (``core.py``) never sees which pool it runs on.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa

from nshot.method import NshotError

from .config import CAOSConfig


@cache
def digit_images() -> np.ndarray:
    """scikit-learn's 1 797 digits as ``[1797, 8, 8]`` floats in [0, 1] (shipped, offline)."""
    from sklearn.datasets import load_digits

    return (load_digits().images / 16.0).astype(np.float64)


@cache
def digit_labels() -> np.ndarray:
    from sklearn.datasets import load_digits

    return load_digits().target.astype(np.int64)


def place_digits(
    digits: np.ndarray, rng: np.random.Generator, canvas: int = 16, noise: float = 0.15
) -> tuple[np.ndarray, np.ndarray]:
    """Paste ``[N, 8, 8]`` digits into noisy canvases; returns images ``[N, c, c]`` and landmarks
    (flat indices of the digit centres)."""
    n = digits.shape[0]
    scale = rng.uniform(0.7, 1.3, size=(n, 1, 1))
    off = rng.integers(0, canvas - 8 + 1, size=(n, 2))
    images = np.zeros((n, canvas, canvas))
    for i in range(n):
        oy, ox = off[i]
        images[i, oy : oy + 8, ox : ox + 8] = digits[i] * scale[i]
    images += rng.normal(0.0, noise, size=images.shape)
    landmarks = (off[:, 0] + 4) * canvas + (off[:, 1] + 4)
    return images, landmarks.astype(np.int64)


def patch_features(images: np.ndarray, patch: int = 7, eps: float = 1e-8) -> np.ndarray:
    """The frozen raw-patch backbone: ``[N, H, W]`` -> ``[N, H·W, patch²]`` unit-norm features."""
    images = np.asarray(images, dtype=np.float64)
    if images.ndim != 3:
        raise ValueError(f"images: expected [N, H, W], got shape {images.shape}")
    r = patch // 2
    padded = np.pad(images, ((0, 0), (r, r), (r, r)))
    win = np.lib.stride_tricks.sliding_window_view(padded, (patch, patch), axis=(1, 2))
    n, h, w = images.shape
    f = win.reshape(n, h * w, patch * patch)
    f = f - f.mean(axis=-1, keepdims=True)
    return f / (np.linalg.norm(f, axis=-1, keepdims=True) + eps)


class Pool(Protocol):
    """Where a trial's images come from: ``sample`` returns features ``[m, L, D]`` and labels."""

    name: str
    n_candidates: int

    def sample(self, rng: np.random.Generator, m: int) -> tuple[np.ndarray, np.ndarray]: ...


class DigitsLandmarkPool:
    """The offline substitute: distinct digits, each freshly placed, scaled and noised."""

    name = "digits-landmark"

    def __init__(self, canvas: int = 16, patch: int = 7, noise: float = 0.15) -> None:
        self.canvas, self.patch, self.noise = canvas, patch, noise
        self.n_candidates = canvas * canvas

    def sample(self, rng: np.random.Generator, m: int) -> tuple[np.ndarray, np.ndarray]:
        digits = digit_images()
        if m > len(digits):
            raise NshotError(f"a trial needs {m} distinct digits; only {len(digits)} exist")
        idx = rng.choice(len(digits), size=m, replace=False)
        images, landmarks = place_digits(digits[idx], rng, self.canvas, self.noise)
        return patch_features(images, self.patch), landmarks

    def images(self, rng: np.random.Generator, m: int) -> tuple[np.ndarray, np.ndarray]:
        """Raw images and landmarks (for examples and serving tests)."""
        digits = digit_images()
        idx = rng.choice(len(digits), size=m, replace=False)
        return place_digits(digits[idx], rng, self.canvas, self.noise)


class FeaturePool:
    """Precomputed per-candidate features from Parquet: ``image_id``, ``features`` (L × D),
    ``label`` (candidate index). Rows are L2-normalised per candidate on load."""

    def __init__(self, path: str | Path) -> None:
        import pyarrow.parquet as pq

        path = Path(path).expanduser()
        if not path.is_file():
            raise NshotError(f"features_path: {path} does not exist")
        table = pq.read_table(path)
        missing = {"features", "label"} - set(table.column_names)
        if missing:
            raise NshotError(f"features_path: {path} lacks column(s) {sorted(missing)}")
        feats = table.column("features").to_pylist()
        try:
            F = np.asarray(feats, dtype=np.float64)
        except ValueError:
            raise NshotError(
                "features_path: every row's features must have the same shape L x D"
            ) from None
        if F.ndim != 3:
            raise NshotError(f"features_path: features must be L x D per row, got {F.shape[1:]}")
        if not np.isfinite(F).all():
            raise NshotError("features_path: features contain NaN or inf")
        labels = np.asarray(table.column("label").to_pylist(), dtype=np.int64)
        if labels.min() < 0 or labels.max() >= F.shape[1]:
            raise NshotError(f"features_path: labels must lie in [0, {F.shape[1]})")
        self.F = F / (np.linalg.norm(F, axis=-1, keepdims=True) + 1e-8)
        self.labels = labels
        self.name = f"features:{path.name}"
        self.n_candidates = F.shape[1]

    def sample(self, rng: np.random.Generator, m: int) -> tuple[np.ndarray, np.ndarray]:
        if m > len(self.labels):
            raise NshotError(f"a trial needs {m} rows; {self.name} has {len(self.labels)}")
        idx = rng.choice(len(self.labels), size=m, replace=False)
        return self.F[idx], self.labels[idx]


def make_pool(cfg: CAOSConfig) -> Pool:
    if cfg.features_path:
        return FeaturePool(cfg.features_path)
    return DigitsLandmarkPool(cfg.canvas, cfg.patch, cfg.pixel_noise)


def trial_rng(cfg: CAOSConfig, trial: int, stream: str = "eval") -> np.random.Generator:
    """Trial ``t``'s generator. Evaluation trials use stream 1; stream 0 ("dev") is the one that
    k, the backbone and the normalisation were chosen on, so the two never overlap."""
    tag = {"dev": 0, "eval": 1, "bank": 2, "serve-eval": 3}[stream]
    return np.random.default_rng([cfg.seed, tag, trial])


def data_tables(cfg: CAOSConfig, count: int = 64) -> dict[str, pa.Table]:
    """A sample of the substitute as Arrow: image, landmark (row, col) and the digit's class."""
    pool = make_pool(cfg)
    rng = trial_rng(cfg, 0, "dev")
    if isinstance(pool, DigitsLandmarkPool):
        images, landmarks = pool.images(rng, count)
        c = pool.canvas
        return {
            "train": pa.table(
                {
                    "image": [im.ravel().tolist() for im in images],
                    "row": (landmarks // c).tolist(),
                    "col": (landmarks % c).tolist(),
                    "canvas": [c] * count,
                }
            )
        }
    F, labels = pool.sample(rng, min(count, len(pool.labels)))  # type: ignore[attr-defined]
    return {"train": pa.table({"features": [f.tolist() for f in F], "label": labels.tolist()})}
