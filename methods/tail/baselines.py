"""Non-learned baselines on the same preprocessed features, batched over episodes.

Inputs are the unprojected, preprocessed features of :func:`episodes.make_batch`
(``support_f [B, n, d]``, ``support_y [B, n]`` in ``0..K-1``, ``query_f [B, q, d]``), as torch
tensors or numpy arrays.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "protohead_logits",
    "linear_probe_predict",
    "nearest_centroid_predict",
    "per_episode_accuracy",
    "episode_accuracy",
]


def _np(a: np.ndarray | torch.Tensor) -> np.ndarray:
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


def protohead_logits(
    support_f: np.ndarray | torch.Tensor,
    support_y: np.ndarray | torch.Tensor,
    query_f: np.ndarray | torch.Tensor,
    K: int,
) -> torch.Tensor:
    """ProtoHead: cosine similarity of each query to each class mean of the normalised support.

    Returns ``[B, q, K]`` (cosines in ``[-1, 1]``; argmax is the prediction).
    """
    s = F.normalize(torch.as_tensor(_np(support_f), dtype=torch.float32), dim=-1)
    q = F.normalize(torch.as_tensor(_np(query_f), dtype=torch.float32), dim=-1)
    y = torch.as_tensor(_np(support_y), dtype=torch.long)
    onehot = F.one_hot(y, K).to(s.dtype)  # [B, n, K]
    counts = onehot.sum(1).clamp_min(1.0)  # [B, K]
    protos = torch.einsum("bnk,bnd->bkd", onehot, s) / counts[..., None]
    return torch.einsum("bqd,bkd->bqk", q, F.normalize(protos, dim=-1))


def linear_probe_predict(
    support_f: np.ndarray | torch.Tensor,
    support_y: np.ndarray | torch.Tensor,
    query_f: np.ndarray | torch.Tensor,
    K: int | None = None,
    C: float = 1.0,
) -> np.ndarray:
    """LinearProbe: scikit-learn ``LogisticRegression`` fitted per episode on its support.

    Returns predicted labels ``[B, q]`` (int64).
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    sf, sy, qf = _np(support_f), _np(support_y), _np(query_f)
    preds = np.empty(qf.shape[:2], dtype=np.int64)
    for b in range(sf.shape[0]):
        clf = LogisticRegression(C=C, max_iter=1000)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf.fit(sf[b], sy[b])
        preds[b] = clf.predict(qf[b])
    return preds


def per_episode_accuracy(
    pred: np.ndarray | torch.Tensor, query_y: np.ndarray | torch.Tensor
) -> np.ndarray:
    """Accuracy of each episode: ``pred`` is ``[B, q]`` labels or ``[B, q, K]`` scores."""
    p, y = _np(pred), _np(query_y)
    if p.ndim == y.ndim + 1:
        p = p.argmax(-1)
    return (p == y).mean(axis=-1)


def episode_accuracy(
    pred: np.ndarray | torch.Tensor, query_y: np.ndarray | torch.Tensor | None = None
) -> tuple[float, float]:
    """Mean episode accuracy and its 95 % CI half-width ``1.96·std/√episodes``.

    ``pred`` is ``[B, q]`` labels or ``[B, q, K]`` scores with ``query_y [B, q]``, or, with
    ``query_y=None``, a 1-d array of per-episode accuracies.
    """
    p = _np(pred)
    acc = p.astype(np.float64) if query_y is None else per_episode_accuracy(p, query_y)
    if len(acc) == 0:
        raise ValueError("no episodes to score")
    return float(acc.mean()), float(1.96 * acc.std() / math.sqrt(len(acc)))


def nearest_centroid_predict(
    support_x: np.ndarray, support_y: np.ndarray, query_x: np.ndarray, K: int
) -> np.ndarray:
    """Nearest centroid for one episode of raw features: every feature standardised by the
    support's mean and standard deviation (:func:`episodes.standardise`, the rule TAIL's
    predictor applies), then the class mean nearest in Euclidean distance.

    ``support_x [n, d]``, ``support_y [n]`` in ``0..K-1``, ``query_x [q, d]`` -> labels ``[q]``.
    """
    from .episodes import standardise

    s, q = standardise(support_x, query_x)
    y = np.asarray(support_y)
    centroids = np.stack([s[y == k].mean(axis=0) for k in range(K)])
    # ‖q - c‖² = ‖q‖² - 2 q·c + ‖c‖²; the first term is the same for every class
    scores = 2.0 * q @ centroids.T - (centroids**2).sum(axis=1)
    return scores.argmax(axis=1)
