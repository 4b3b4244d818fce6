"""Offline data for FRONT: scikit-learn's digits, split three ways by seed.

``ancestry_train`` (50 %), ``descendant_train`` (30 %) and ``test`` (20 %), stratified by digit:
the ancestry and its descendants learn the same task from disjoint images. Descendant tasks:
``digits`` (ten classes, the ancestry's head transfers) and ``parity`` (digit mod 2, a new head).
``img_size=16`` upsamples the 8×8 images bilinearly, so the descendant has 64 patches where the
ancestry had 16 and its position embedding is transferred by DCT padding.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F

from .config import FrontConfig

SPLITS = ("ancestry_train", "descendant_train", "test")
SHARES = (0.5, 0.3, 0.2)


@cache
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.images / 16.0).astype(np.float32), d.target.astype(np.int64)


def split_indices(seed: int) -> dict[str, np.ndarray]:
    """Stratified 50/30/20 split of the 1 797 digits, by ``seed``."""
    _, y = _digits()
    rng = np.random.default_rng([seed, 8080])
    parts: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(y == c))
        a = round(len(idx) * SHARES[0])
        b = a + round(len(idx) * SHARES[1])
        for s, part in zip(SPLITS, (idx[:a], idx[a:b], idx[b:]), strict=True):
            parts[s].append(part)
    return {s: np.sort(np.concatenate(p)) for s, p in parts.items()}


@dataclass
class Split:
    x: torch.Tensor  # [N, 1, S, S] in [0, 1]
    y: torch.Tensor  # [N]
    num_classes: int


def load_split(split: str, seed: int, *, task: str = "digits", img_size: int = 8) -> Split:
    """One split as tensors, for ``task`` (digits or parity) at ``img_size`` (8 or 16)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {SPLITS}")
    images, labels = _digits()
    idx = split_indices(seed)[split]
    x = torch.from_numpy(images[idx]).unsqueeze(1)
    if img_size != 8:
        x = F.interpolate(x, size=(img_size, img_size), mode="bilinear", align_corners=False)
    y = torch.from_numpy(labels[idx])
    if task == "parity":
        return Split(x, y % 2, 2)
    if task != "digits":
        raise ValueError(f"unknown task {task!r}; choose digits or parity")
    return Split(x, y, 10)


def data_tables(cfg: FrontConfig) -> dict[str, pa.Table]:
    """The three splits as Arrow tables (``image``: the flattened pixels, ``label``)."""
    out = {}
    for s in SPLITS:
        size = 8 if s == "ancestry_train" else cfg.img_size
        task = "digits" if s == "ancestry_train" else cfg.task
        sp = load_split(s, cfg.seed, task=task, img_size=size)
        out[s] = pa.table(
            {
                "image": [row.tolist() for row in sp.x.flatten(1).numpy()],
                "label": sp.y.numpy(),
            }
        )
    return out
