"""Anomaly-detection metrics: I-AUROC, P-AUROC and AUPRO@α (the MVTec 3D-AD protocol).

AUPRO@α: for a threshold t, PRO(t) is the mean over every ground-truth connected component C
(8-connectivity, over all anomalous test images) of the fraction of C scoring ≥ t, and FPR(t)
the fraction of all ground-truth-normal pixels scoring ≥ t. PRO is integrated over
FPR ∈ [0, α] by the trapezoidal rule, interpolating the curve at FPR = α, and divided by α.
:func:`aupro` computes the exact curve (every distinct score is a threshold);
``thresholds=n`` uses n thresholds at evenly spaced ranks of the pooled scores, as the
evaluation code of the benchmark's papers does with 99.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage
from sklearn.metrics import roc_auc_score

EIGHT = np.ones((3, 3), dtype=int)


def _component_weights(masks: np.ndarray) -> tuple[np.ndarray, int]:
    """Per pixel: 1 / |C| for the component C it belongs to (0 for normal pixels)."""
    weights = np.zeros(masks.shape, dtype=np.float64)
    n_comp = 0
    for i, m in enumerate(masks):
        lab, n = ndimage.label(m, structure=EIGHT)
        if n == 0:
            continue
        sizes = np.bincount(lab.ravel())
        w = np.where(lab > 0, 1.0 / sizes[lab], 0.0)
        weights[i] = w
        n_comp += n
    return weights, n_comp


def pro_curve(
    maps: np.ndarray, masks: np.ndarray, thresholds: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(FPR, PRO) points in increasing FPR, starting at (0, 0); ``thresholds=None``: exact."""
    maps = np.asarray(maps, dtype=np.float64)
    masks = np.asarray(masks, dtype=bool)
    if maps.shape != masks.shape:
        raise ValueError(f"maps {maps.shape} and masks {masks.shape} differ in shape")
    weights, n_comp = _component_weights(masks)
    if n_comp == 0:
        raise ValueError("no anomalous pixel in the ground truth: PRO is undefined")
    normal = ~masks
    n_normal = int(normal.sum())
    if n_normal == 0:
        raise ValueError("no normal pixel in the ground truth: FPR is undefined")
    s = maps.ravel()
    if thresholds is None:
        order = np.argsort(-s, kind="stable")
        s_sorted = s[order]
        fp = np.cumsum(normal.ravel()[order]) / n_normal
        pro = np.cumsum(weights.ravel()[order]) / n_comp
        # the curve's points are the ends of runs of equal scores
        last = np.r_[s_sorted[1:] != s_sorted[:-1], True]
        fpr, pr = fp[last], pro[last]
    else:
        ts = np.quantile(s, np.linspace(1.0, 0.0, thresholds), method="lower")
        ts = np.unique(ts)[::-1]
        fpr = np.array([(normal.ravel() & (s >= t)).sum() / n_normal for t in ts])
        pr = np.array([(weights.ravel() * (s >= t)).sum() / n_comp for t in ts])
    return np.r_[0.0, fpr], np.r_[0.0, pr]


def aupro(
    maps: np.ndarray, masks: np.ndarray, alpha: float = 0.3, thresholds: int | None = None
) -> float:
    """Normalised area under the PRO curve up to FPR ``alpha``."""
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must lie in (0, 1], got {alpha}")
    fpr, pro = pro_curve(maps, masks, thresholds)
    # cut at alpha: the curve is monotone in FPR; interpolate at FPR = alpha
    keep = fpr <= alpha
    x, y = fpr[keep], pro[keep]
    if x[-1] < alpha:
        j = int(np.searchsorted(fpr, alpha, side="right"))
        if j < len(fpr):
            x0, x1, y0, y1 = fpr[j - 1], fpr[j], pro[j - 1], pro[j]
            ya = y0 + (y1 - y0) * (alpha - x0) / (x1 - x0)
        else:
            ya = pro[-1]
        x, y = np.r_[x, alpha], np.r_[y, ya]
    return float(np.trapezoid(y, x) / alpha)


def image_auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    return float(roc_auc_score(np.asarray(labels).astype(int), np.asarray(scores)))


def pixel_auroc(maps: np.ndarray, masks: np.ndarray) -> float:
    return float(roc_auc_score(np.asarray(masks).ravel().astype(int), np.asarray(maps).ravel()))
