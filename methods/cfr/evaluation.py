"""Scoring a class's test images with a trained CFR model, and the paper's metrics (§4.1)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .config import CfrConfig
from .data import Split, load_class
from .features import make_extractors
from .metrics import aupro, image_auroc, pixel_auroc
from .model import CfrModel


@dataclass
class TestFeatures:
    split: Split
    f2: torch.Tensor  # n × H × W × C2
    f3: torch.Tensor  # n × H × W × C3
    valid: torch.Tensor  # n × H × W bool


def class_test_features(
    cfg: CfrConfig, cls: str, split: str = "test", device: torch.device | str | None = None
) -> TestFeatures:
    """The frozen features of a class's split, extracted on ``device`` (default: the CPU) and
    kept on the CPU."""
    test = load_class(cfg, cls)[split]
    ext = make_extractors(cfg, device)
    f2, f3 = ext(test.rgb, test.xyz)
    return TestFeatures(test, f2, f3, ext.valid(test.xyz, f3))


def score_images(
    model: CfrModel, feats: TestFeatures, system: str, theta: float | None, seed: int
) -> dict[str, np.ndarray]:
    """Per test image: the AUPRO map, the pixel map, the image score and the replaced
    fraction of valid pixels (the random control draws from a generator seeded by ``seed``)."""
    gen = torch.Generator().manual_seed(seed)
    out = [model.score(feats.f2[i], feats.f3[i], feats.valid[i], system, theta, gen)
           for i in range(len(feats.split))]  # fmt: skip
    return {
        "aupro_map": np.stack([s.aupro_map.numpy() for s in out]),
        "pixel_map": np.stack([s.pixel_map.numpy() for s in out]),
        "image_score": np.array([s.image_score for s in out]),
        "replaced": np.array([s.replaced / max(s.valid, 1) for s in out]),
    }


def metrics(
    scores: dict[str, np.ndarray], split: Split, thresholds: int | None
) -> dict[str, float]:
    """I-AUROC, P-AUROC, AUPRO@30 %/10 % (``thresholds`` thresholds; None: the exact curve) and
    the replaced fraction on normal test images."""
    normal = split.label == 0
    return {
        "i_auroc": image_auroc(scores["image_score"], split.label),
        "p_auroc": pixel_auroc(scores["pixel_map"], split.mask),
        "aupro30": aupro(scores["aupro_map"], split.mask, 0.3, thresholds),
        "aupro10": aupro(scores["aupro_map"], split.mask, 0.1, thresholds),
        "replaced_frac_normal": float(scores["replaced"][normal].mean()),
    }


def evaluate_model(
    model: CfrModel, cfg: CfrConfig, cls: str, device: torch.device | str | None = None
) -> dict[str, float]:
    """The metrics of ``cfg.system`` on the test images of class ``cls`` (features extracted
    on ``device``)."""
    feats = class_test_features(cfg, cls, device=device)
    theta = None if cfg.theta_mode == "quantile" else cfg.theta
    scores = score_images(model, feats, cfg.system, theta, cfg.infer_seed)
    return metrics(scores, feats.split, cfg.pro_thresholds)


def validation_metrics(
    model: CfrModel, cfg: CfrConfig, feats: TestFeatures, banks_built: bool
) -> dict[str, float]:
    """AUPRO@30 % and I-AUROC of ``cfg.system`` on the class's validation images; before the
    banks exist (during stage 1) those of the mappings alone (no replacement). None when the
    validation images are all normal (MVTec 3D-AD's)."""
    if len(set(feats.split.label.tolist())) < 2:
        return {}
    system = cfg.system
    if not banks_built:
        system = "cfm" if system == "cfm" else "cfr_cyclic_only"
    theta = None if cfg.theta_mode == "quantile" else cfg.theta
    m = metrics(score_images(model, feats, system, theta, cfg.infer_seed), feats.split,
                cfg.pro_thresholds)  # fmt: skip
    return {"val_aupro30": m["aupro30"], "val_i_auroc": m["i_auroc"]}
