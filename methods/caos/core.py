"""One CAOS trial and its baselines, vectorised (the algorithm and the split-conformal rows).

A trial draws ``n + n_test`` images; the first ``n`` are labelled. With unit-norm per-candidate
features ``F [m, L, D]`` and landmarks ``Y``:

* reference vectors ``r_i = F(X_i)[Y_i]``; one-shot scores ``s_i(x, y) = 1 - <F(x)[y], r_i>``;
* ``M[j, i] = s_i(X_j, Y_j) = 1 - <r_j, r_i>`` (diagonal 0);
* test scores ``S[t, y, i] = s_i(X_t, y)`` and ``T = A_k`` over ``i``.

Systems (all on the same labelled set and test images):

* ``caos``: LOO calibration on all ``n``, test with all ``n`` predictors;
* ``split_conformal_agg``: first ``n // 2`` examples are the predictors, the rest calibrate;
* ``split_conformal_best``: the single predictor of the first half with the lowest mean score on
  the other first-half examples, calibrated on the second half;
* ``no_loo_control``: CAOS calibrated with row ``j``'s own predictor kept (invalid by design);
* ``full_conformal``: exact full conformal with the aggregated score (reported; ``q* <= q̂``).

A trivial set (threshold ``+inf``) holds every candidate: coverage 1 and size ``L``.
"""

from __future__ import annotations

import numpy as np

from nshot.conformal import (
    agg_k,
    full_conformal_sets,
    loo_scores,
    no_loo_scores,
    threshold,
)

SYSTEMS = (
    "caos",
    "split_conformal_best",
    "split_conformal_agg",
    "no_loo_control",
    "full_conformal",
)
GATED = SYSTEMS[:4]


def landmark_trial(
    F: np.ndarray, Y: np.ndarray, n: int, k: int, alphas: list[float], full: bool = True
) -> dict[str, np.ndarray]:
    """Coverage, size and trivial flags ``[system, alpha]`` of one trial (means over its tests)."""
    R = F[np.arange(n), Y[:n]]  # (n, D)
    M = 1.0 - R @ R.T
    Ft, Yt = F[n:], Y[n:]
    t, L = Ft.shape[0], Ft.shape[1]
    S = 1.0 - Ft @ R.T  # (t, L, n)
    T = agg_k(S, k)  # (t, L)
    h = n // 2
    kk = min(k, h)
    cal_agg = agg_k(M[h:, :h], kk)
    T_agg = agg_k(S[..., :h], kk)
    Mr = M[:h, :h]
    mean_other = (Mr.sum(axis=0) - np.diag(Mr)) / max(h - 1, 1)  # column i: predictor i on R\{i}
    best = int(np.argmin(mean_other))
    cal_best, T_best = M[h:, best], S[..., best]
    calib = {
        "caos": (loo_scores(M, k), T),
        "split_conformal_best": (cal_best, T_best),
        "split_conformal_agg": (cal_agg, T_agg),
        "no_loo_control": (no_loo_scores(M, k), T),
    }
    systems = SYSTEMS if full else GATED
    cov = np.zeros((len(systems), len(alphas)))
    size = np.zeros_like(cov)
    triv = np.zeros_like(cov)
    rows = np.arange(t)
    for a, alpha in enumerate(alphas):
        for s, name in enumerate(systems):
            if name == "full_conformal":
                sets = np.stack([full_conformal_sets(M, S[i].T, T[i], k, alpha) for i in range(t)])
                trivial = False
            else:
                cal, Tt = calib[name]
                q = float(threshold(cal, alpha))
                trivial = not np.isfinite(q)
                sets = Tt <= q
            cov[s, a] = sets[rows, Yt].mean()
            size[s, a] = sets.sum(axis=1).mean() if not trivial else float(L)
            triv[s, a] = float(trivial)
    return {"coverage": cov, "size": size, "trivial": triv}


def run_trials(
    cfg_dict: dict, trial_ids: list[int], n: int, full: bool = True
) -> dict[str, np.ndarray]:
    """Trials ``trial_ids`` of the landmark protocol (one Ray task runs one chunk)."""
    from .config import CAOSConfig
    from .data import make_pool, trial_rng

    cfg = CAOSConfig.validated(cfg_dict)
    pool = make_pool(cfg)
    outs = []
    for tid in trial_ids:
        rng = trial_rng(cfg, tid + 1_000_000 * n, "eval")
        F, Y = pool.sample(rng, n + cfg.n_test)
        outs.append(landmark_trial(F, Y, n, cfg.k, list(cfg.alphas), full=full))
    return {key: np.stack([o[key] for o in outs]) for key in outs[0]}


# --------------------------------------------------------------------------- classification


def classification_trials(cfg_dict: dict, trial_ids: list[int]) -> dict[str, np.ndarray]:
    """The digits classification analogue: 64-d pixel vectors, constant-2 score for
    other classes, ``n = cls_n``, ``k = cls_k``. Systems: caos, split_conformal_agg.

    Also cross-checks our split-conformal sets against MAPIE's ``SplitConformalClassifier``
    (LAC score on probabilities ``1 - T/2``) on the first trial of the chunk.
    """
    from sklearn.datasets import load_digits

    from nshot.conformal import class_score_matrix, class_test_scores

    from .config import CAOSConfig
    from .data import trial_rng

    cfg = CAOSConfig.validated(cfg_dict)
    X, y = load_digits(return_X_y=True)
    n, k, C = cfg.cls_n, cfg.cls_k, 10
    h = n // 2
    per_trial_cov, per_trial_size = [], []
    agree = []
    for tid in trial_ids:
        rng = trial_rng(cfg, tid, "eval")
        idx = rng.choice(len(y), size=n + cfg.n_test, replace=False)
        e, lab = X[idx].astype(np.float64), y[idx]
        es, ls, eq, lq = e[:n], lab[:n], e[n:], lab[n:]
        M = class_score_matrix(es, ls)
        T = class_test_scores(es, ls, eq, C, k)
        T_split = class_test_scores(es[:h], ls[:h], eq, C, min(k, h))
        cal_split = agg_k(M[h:, :h], min(k, h))
        loo = loo_scores(M, k)
        c_row, s_row = [], []
        for alpha in cfg.alphas:
            sets_caos = T <= threshold(loo, alpha)
            q_split = threshold(cal_split, alpha)
            sets_split = T_split <= q_split
            c_row.append(
                [
                    sets_caos[np.arange(len(lq)), lq].mean(),
                    sets_split[np.arange(len(lq)), lq].mean(),
                ]
            )
            s_row.append([sets_caos.sum(1).mean(), sets_split.sum(1).mean()])
            if tid == trial_ids[0] and np.isfinite(q_split):
                agree.append(
                    _mapie_agreement(
                        es[:h], ls[:h], es[h:], ls[h:], eq, C, min(k, h), alpha, sets_split
                    )
                )
        per_trial_cov.append(c_row)
        per_trial_size.append(s_row)
    cov = np.asarray(per_trial_cov)
    size = np.asarray(per_trial_size)
    return {"coverage": cov, "size": size, "mapie_agree": np.asarray(agree, dtype=np.float64)}


class _OneShotProba:
    """A prefit scikit-learn-style classifier for MAPIE's split conformal.

    Class ``c`` gets probability ``(1 - T_c/2) / C`` from the aggregated one-shot scores of a fixed
    reference set, and an extra never-observed class takes the remaining mass so that rows sum
    to one. MAPIE's LAC score ``1 - p_y`` is then the same increasing affine map of ``T_y`` for
    every input, so its sets over the ``C`` real classes must equal ours."""

    def __init__(self, ref_e: np.ndarray, ref_y: np.ndarray, n_classes: int, k: int) -> None:
        self.ref_e, self.ref_y, self.k = ref_e, ref_y, k
        self.n_classes = n_classes
        self.classes_ = np.arange(n_classes + 1)
        self.n_features_in_ = ref_e.shape[1]
        self.fitted_ = True

    def fit(self, X, y):  # noqa: ANN001 - sklearn protocol; prefit, nothing to fit
        return self

    def get_params(self, deep: bool = True) -> dict:
        return {}

    def predict_proba(self, X) -> np.ndarray:  # noqa: ANN001
        from nshot.conformal import class_test_scores

        X = np.asarray(X, dtype=np.float64)
        T = class_test_scores(self.ref_e, self.ref_y, X, self.n_classes, self.k)
        p = (1.0 - T / 2.0) / self.n_classes
        return np.concatenate([p, 1.0 - p.sum(axis=1, keepdims=True)], axis=1)

    def predict(self, X) -> np.ndarray:  # noqa: ANN001
        return self.predict_proba(X).argmax(1)


def _mapie_agreement(ref_e, ref_y, cal_e, cal_y, q_e, C, k, alpha, ours) -> float:  # noqa: ANN001
    """Fraction of (query, class) memberships on which MAPIE's split conformal agrees with ours."""
    import warnings

    from mapie.classification import SplitConformalClassifier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scc = SplitConformalClassifier(
            estimator=_OneShotProba(ref_e, ref_y, C, k),
            confidence_level=1.0 - alpha,
            conformity_score="lac",
            prefit=True,
        ).conformalize(cal_e, cal_y)
        _, sets = scc.predict_set(q_e)
    return float((sets[:, :C, 0] == ours).mean())
