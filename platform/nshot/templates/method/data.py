"""skeleton's data: a tiny generated few-shot classification dataset.

Each class is a Gaussian around its own mean in the first ``signal_dims`` features; the other
features are noise of std ``noise``, the same for every class. Nearest class mean on the raw
features suffers from that noise; an embedding trained on other classes learns to ignore it.
Training classes and held-out classes are drawn apart (``train`` and ``test`` splits), so a
test episode holds classes the model never saw. Everything follows from ``data_seed``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .config import SkeletonConfig

SPLITS = ("train", "test")


def examples(
    cfg: SkeletonConfig,
    split: str,
) -> tuple[np.ndarray, np.ndarray]:
    """``(x [classes * per_class, dim] float32, y [classes * per_class] int64)``."""
    n_classes = cfg.train_classes if split == "train" else cfg.test_classes
    rng = np.random.default_rng([cfg.data_seed, SPLITS.index(split)])
    means = np.zeros((n_classes, cfg.dim))
    means[:, : cfg.signal_dims] = rng.normal(0.0, 1.0, (n_classes, cfg.signal_dims))
    y = np.repeat(np.arange(n_classes), cfg.per_class)
    scale = np.full(cfg.dim, cfg.noise)
    scale[: cfg.signal_dims] = 0.3
    x = means[y] + rng.normal(0.0, 1.0, (len(y), cfg.dim)) * scale
    return x.astype(np.float32), y.astype(np.int64)


def tables(cfg: SkeletonConfig) -> dict[str, pa.Table]:
    """The splits as Arrow tables (``Method.data``): one row per example."""
    out = {}
    for split in SPLITS:
        x, y = examples(cfg, split)
        out[split] = pa.table({"x": x.tolist(), "y": y})
    return out


def episode(
    x: np.ndarray,
    y: np.ndarray,
    cfg: SkeletonConfig,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One N-way K-shot episode: ``(support_x, support_y, query_x, query_y)``, labels 0..N-1."""
    classes = rng.choice(np.unique(y), cfg.ways, replace=False)
    sx, sy, qx, qy = [], [], [], []
    for label, c in enumerate(classes):
        rows = rng.permutation(np.flatnonzero(y == c))[: cfg.shots + cfg.queries]
        sx.append(x[rows[: cfg.shots]])
        qx.append(x[rows[cfg.shots :]])
        sy += [label] * cfg.shots
        qy += [label] * cfg.queries
    return np.concatenate(sx), np.array(sy), np.concatenate(qx), np.array(qy)
