"""Conformal prediction with aggregated one-shot predictors (CAOS) and its split references.

Shared by the ``caos`` method and by ``nshot serve <method> --conformal caos``, which wraps any
served few-shot classifier whose predictor exposes one-shot embeddings (TAIL does).

Notation (the CAOS paper's method: one-shot scores aggregated, calibrated leave-one-out). ``n`` labelled examples, each inducing a
one-shot predictor with nonconformity score ``s_i(x, y)`` (lower is more plausible).

* ``M[j, i] = s_i(X_j, Y_j)``: the labelled score matrix (its diagonal is the self-score).
* ``A_k(v)``: the sum of the ``k`` smallest entries of ``v``.
* Leave-one-out calibration ``S_j = A_k(M[j, [n] minus {j}])``; the threshold ``q̂`` is the
  ``r``-th smallest ``S_j`` with ``r = ceil((1 - alpha)(n + 1))`` (``+inf`` when ``r > n``).
* Test scores ``T[y] = A_k(s_1(x, y), ..., s_n(x, y))``; the set is ``{y : T[y] <= q̂}``.

Why coverage holds: adding the test point as example ``n+1``, the symmetric scores
``S*_j = A_k`` over ``[n+1]`` minus ``{j}`` are exchangeable, ``S*_{n+1}`` is the test score, and
``S*_j <= S_j`` for ``j <= n`` (the ``k`` smallest of a superset are no larger), so ``q* <= q̂``
and ``P(Y in C(X)) >= 1 - alpha``. The asymmetry (calibration uses ``n-1`` predictors, the test
``n``) is what the argument uses; do not "fix" it.

All functions are numpy and vectorised over leading batch axes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "agg_k",
    "loo_scores",
    "no_loo_scores",
    "conformal_rank",
    "threshold",
    "CAOSBank",
    "class_score_matrix",
    "class_test_scores",
    "classification_sets",
    "full_conformal_sets",
]

INF = float("inf")


@dataclass
class OneShotEpisode:
    """One few-shot classification request as frozen per-row features (what a predictor's
    ``one_shot_embeddings`` returns for prediction sets around it)."""

    support_emb: np.ndarray  # [n, D]
    support_labels: np.ndarray  # [n] class indices into `classes`
    query_emb: np.ndarray  # [q, D]
    classes: list[Any]  # class names, in the predictor's order
    support_field: str = "support"  # the request field holding the support set (errors name it)


def _check_alpha(alpha: float) -> None:
    if not (0.0 < float(alpha) < 1.0) or not math.isfinite(float(alpha)):
        raise ValueError(f"alpha: must lie in (0, 1), got {alpha}")


def agg_k(scores: np.ndarray, k: int, axis: int = -1) -> np.ndarray:
    """``A_k``: the sum of the ``k`` smallest entries along ``axis`` (needs ``k <= size``)."""
    scores = np.asarray(scores)
    size = scores.shape[axis]
    if not 1 <= k <= size:
        raise ValueError(f"k: must lie in [1, {size}] for {size} scores, got {k}")
    if k == size:
        return scores.sum(axis=axis)
    part = np.partition(scores, k - 1, axis=axis)
    return np.take(part, np.arange(k), axis=axis).sum(axis=axis)


def loo_scores(M: np.ndarray, k: int) -> np.ndarray:
    """Leave-one-out calibration scores ``S_j = A_k(M[..., j, [n] minus {j}])``, shape ``[..., n]``.

    Row ``j`` never sees column ``j`` (its own predictor, whose self-score is 0): the diagonal is
    replaced by ``+inf`` so that it cannot be among the ``k <= n - 1`` smallest.
    """
    M = np.asarray(M, dtype=np.float64)
    n = M.shape[-1]
    if M.shape[-2] != n:
        raise ValueError(f"M: must be square in its last two axes, got {M.shape}")
    if not 1 <= k <= n - 1:
        raise ValueError(f"k: must lie in [1, n - 1] = [1, {n - 1}] for n = {n}, got {k}")
    M = M.copy()
    idx = np.arange(n)
    M[..., idx, idx] = INF
    return agg_k(M, k, axis=-1)


def no_loo_scores(M: np.ndarray, k: int) -> np.ndarray:
    """The negative control: ``A_k(M[j, :])`` keeps row ``j``'s own predictor (invalid by design)."""
    return agg_k(np.asarray(M, dtype=np.float64), k, axis=-1)


def conformal_rank(n: int, alpha: float) -> int:
    """``r = ceil((1 - alpha)(n + 1))``, rounded to 9 decimals first so that an exact-integer
    product (n = 9, alpha = 0.1 -> 9) does not land one rank off in floating point."""
    _check_alpha(alpha)
    return int(math.ceil(round((1.0 - float(alpha)) * (n + 1), 9)))


def threshold(scores: np.ndarray, alpha: float) -> np.ndarray:
    """``q̂``: the ``r``-th smallest calibration score along the last axis (``+inf`` if ``r > n``)."""
    scores = np.asarray(scores, dtype=np.float64)
    n = scores.shape[-1]
    r = conformal_rank(n, alpha)
    if r > n:
        return np.full(scores.shape[:-1], INF)
    return np.partition(scores, r - 1, axis=-1)[..., r - 1]


@dataclass
class CAOSBank:
    """A calibrated CAOS model: the sorted LOO scores; any ``alpha`` is served without refitting."""

    loo_sorted: np.ndarray  # (n,) ascending
    k: int

    @classmethod
    def fit(cls, M: np.ndarray, k: int) -> CAOSBank:
        return cls(np.sort(loo_scores(M, k)), int(k))

    @property
    def n(self) -> int:
        return int(self.loo_sorted.shape[0])

    def q_hat(self, alpha: float) -> float:
        r = conformal_rank(self.n, alpha)
        return INF if r > self.n else float(self.loo_sorted[r - 1])

    def sets(self, T: np.ndarray, alpha: float) -> np.ndarray:
        """Boolean membership ``T <= q̂`` (non-strict: discrete scores need it)."""
        return np.asarray(T) <= self.q_hat(alpha)


def full_conformal_sets(
    row_scores: np.ndarray, new_col: np.ndarray, T: np.ndarray, k: int, alpha: float
) -> np.ndarray:
    """Full conformal with the aggregated score (exact, for every candidate label at once).

    ``row_scores``: ``[n, n]`` labelled matrix ``M``; ``new_col``: ``[n, L]`` the scores
    ``s_{n+1}(X_j, Y_j)`` that the test point's predictor, for candidate ``y``, gives the labelled
    examples; ``T``: ``[L]`` test scores. With ``(x, y)`` added as example ``n + 1``,
    ``S*_j = A_k`` of row ``j`` over ``[n+1]`` minus ``{j}``, and ``y`` is kept when the test
    score is among the ``r`` smallest of the ``n + 1`` symmetric scores.
    """
    M = np.asarray(row_scores, dtype=np.float64).copy()
    n = M.shape[0]
    idx = np.arange(n)
    M[idx, idx] = INF
    srt = np.sort(M, axis=1)[:, :k]  # k smallest of each LOO row
    sum_k = srt.sum(axis=1)  # (n,)
    sum_km1 = sum_k - srt[:, k - 1]
    kth = srt[:, k - 1]
    c = np.asarray(new_col, dtype=np.float64)  # (n, L)
    s_star = np.where(c < kth[:, None], sum_km1[:, None] + c, sum_k[:, None])  # (n, L)
    r = conformal_rank(n, alpha)
    less = (s_star < np.asarray(T)[None, :]).sum(axis=0)
    return less <= r - 1


# --------------------------------------------------------------------------- classification


def _unit(x: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / (np.linalg.norm(x, axis=-1, keepdims=True) + eps)


def class_score_matrix(emb: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The classification analogue: ``s_i(x, y) = 1 - cos(e(x), e(X_i))`` if ``y == Y_i`` else 2.

    Returns ``M[j, i] = s_i(X_j, Y_j)`` for unit-normalised embeddings ``emb [n, D]``.
    """
    e = _unit(emb)
    labels = np.asarray(labels)
    same = labels[:, None] == labels[None, :]
    return np.where(same, 1.0 - e @ e.T, 2.0)


def class_test_scores(
    support_emb: np.ndarray,
    support_labels: np.ndarray,
    query_emb: np.ndarray,
    n_classes: int,
    k: int,
) -> np.ndarray:
    """``T [q, C]``: ``A_k`` over the ``n`` one-shot predictors for every query and class."""
    e, qe = _unit(support_emb), _unit(query_emb)
    labels = np.asarray(support_labels)
    dist = 1.0 - qe @ e.T  # (q, n)
    onehot = labels[None, :] == np.arange(n_classes)[:, None]  # (C, n)
    s = np.where(onehot[None, :, :], dist[:, None, :], 2.0)  # (q, C, n)
    return agg_k(s, k, axis=-1)


def classification_sets(
    support_emb: np.ndarray,
    support_labels: Sequence[int] | np.ndarray,
    query_emb: np.ndarray,
    n_classes: int,
    alpha: float,
    k: int = 1,
) -> dict[str, Any]:
    """CAOS prediction sets for one few-shot classification episode (labels ``0..C-1``).

    Returns ``{"sets": bool [q, C], "q_hat": float, "T": [q, C], "n": n}``.
    """
    labels = np.asarray(support_labels, dtype=np.int64)
    n = len(labels)
    if n < k + 1:
        raise ValueError(f"support: CAOS needs at least k + 1 = {k + 1} labelled examples, got {n}")
    bank = CAOSBank.fit(class_score_matrix(support_emb, labels), k)
    T = class_test_scores(support_emb, labels, query_emb, n_classes, k)
    q = bank.q_hat(alpha)
    return {"sets": T <= q, "q_hat": q, "T": T, "n": n}
