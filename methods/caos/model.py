"""CAOS's "model": the served bank of one-shot predictors and its leave-one-out scores.

Nothing is learned by gradient: :func:`fit_bank` draws the labelled set, takes the reference
vector ``r_i = F(X_i)[Y_i]`` of every example and the sorted leave-one-out calibration scores
(``nshot.conformal.CAOSBank``); :func:`load_model` rebuilds that bank from a checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from nshot.conformal import CAOSBank
from nshot.train.checkpoint import LoadedCheckpoint

from .config import CAOSConfig
from .data import DigitsLandmarkPool, make_pool, trial_rng


@dataclass
class CAOSModel:
    """A bank as served: reference vectors ``ref [n, D]``, the LOO scores, the candidate grid
    (``[canvas, canvas]`` for images, ``[L]`` for a feature bank) and the backbone."""

    ref: np.ndarray
    bank: CAOSBank
    grid: tuple[int, ...]
    patch: int
    backbone: str


def fit_bank(cfg: CAOSConfig) -> tuple[np.ndarray, CAOSBank, dict[str, Any]]:
    """Draw the labelled set of the served bank and calibrate it (leave-one-out)."""
    pool = make_pool(cfg)
    F, Y = pool.sample(trial_rng(cfg, 0, "bank"), cfg.n)
    ref = F[np.arange(cfg.n), Y]
    bank = CAOSBank.fit(1.0 - ref @ ref.T, cfg.k)
    if isinstance(pool, DigitsLandmarkPool):
        extra = {"backbone": f"patch{cfg.patch}-centred-l2", "grid": [cfg.canvas, cfg.canvas]}
    else:
        extra = {"backbone": "features", "grid": [pool.n_candidates]}
    extra.update({"k": cfg.k, "patch": cfg.patch, "pool": pool.name, "landmarks": Y.tolist()})
    return ref, bank, extra


def load_model(checkpoint: LoadedCheckpoint) -> CAOSModel:
    """The bank a checkpoint of ``train_loop`` holds (a ``ValueError`` for any other)."""
    w = checkpoint.weights()
    ex = checkpoint.extra
    if "ref" not in w or "loo_sorted" not in w or "k" not in ex:
        raise ValueError(f"{checkpoint.path}: not a caos bank checkpoint")
    return CAOSModel(
        ref=w["ref"].double().numpy(),
        bank=CAOSBank(w["loo_sorted"].double().numpy(), int(ex["k"])),
        grid=tuple(int(g) for g in ex["grid"]),
        patch=int(ex.get("patch", 7)),
        backbone=str(ex.get("backbone", "patch")),
    )
