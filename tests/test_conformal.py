"""nshot.conformal (CAOS core) and the conformal wrapper of served few-shot classifiers."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binom

from nshot.conformal import (
    CAOSBank,
    agg_k,
    class_score_matrix,
    classification_sets,
    conformal_rank,
    full_conformal_sets,
    loo_scores,
    no_loo_scores,
    threshold,
)
from nshot.method import NshotError


def test_agg_k_monotone_under_added_scores():
    """(a) A_k over J ∪ {new} is never above A_k over J."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        n, k = rng.integers(3, 12), rng.integers(1, 3)
        v = rng.uniform(0, 2, size=(5, n))
        w = np.concatenate([v, rng.uniform(0, 2, size=(5, 1))], axis=1)
        assert np.all(agg_k(w, k) <= agg_k(v, k) + 1e-12)


def test_loo_row_never_sees_its_own_column():
    """(b) Perturbing column j of M leaves S_j unchanged (and changes others)."""
    rng = np.random.default_rng(1)
    M = rng.uniform(0, 2, size=(8, 8))
    np.fill_diagonal(M, 0.0)
    S = loo_scores(M, 3)
    for j in range(8):
        P = M.copy()
        P[:, j] = -5.0  # would be the smallest score of every row that can see it
        Sp = loo_scores(P, 3)
        assert Sp[j] == pytest.approx(S[j])
        assert np.all(np.delete(Sp, j) < np.delete(S, j))
    # the negative control keeps the self-score 0
    assert np.all(no_loo_scores(M, 3) <= S)


def test_rank_with_exact_integer_product():
    """(c) n = 9, alpha = 0.1: (1 - alpha)(n + 1) = 9 exactly, so q̂ is the 9th smallest."""
    assert conformal_rank(9, 0.1) == 9
    assert conformal_rank(10, 0.05) == 11  # > n: trivial
    scores = np.arange(9, dtype=float)[::-1]
    assert threshold(scores, 0.1) == 8.0
    assert np.isinf(threshold(np.arange(10.0), 0.05))
    with pytest.raises(ValueError, match="alpha"):
        conformal_rank(10, 1.0)
    with pytest.raises(ValueError, match="k"):
        loo_scores(np.zeros((3, 3)), 3)


def test_split_threshold_matches_crepes():
    """(d) Our split-conformal sets equal crepes' on 200 random score sets (non-integer ranks)."""
    from crepes import ConformalClassifier

    rng = np.random.default_rng(2)
    checked = 0
    for _ in range(200):
        n_cal = int(rng.integers(5, 40))
        alpha = float(rng.choice([0.05, 0.1, 0.2, 0.3]))
        if abs((1 - alpha) * (n_cal + 1) - round((1 - alpha) * (n_cal + 1))) < 1e-9:
            continue  # crepes' float p-value comparison differs exactly there (a known pitfall)
        cal = rng.uniform(0, 2, size=n_cal)
        test = rng.uniform(0, 2, size=(10, 6))
        cc = ConformalClassifier()
        cc.fit(cal)
        theirs = cc.predict_set(test, confidence=1 - alpha, smoothing=False).astype(bool)
        ours = test <= threshold(cal, alpha)
        assert np.array_equal(ours, theirs), (n_cal, alpha)
        checked += 1
    assert checked > 150


def test_full_conformal_is_never_larger_than_caos():
    rng = np.random.default_rng(3)
    for _ in range(50):
        n, L, k = 12, 30, 2
        R = rng.normal(size=(n, 5))
        R /= np.linalg.norm(R, axis=1, keepdims=True)
        C = rng.normal(size=(L, 5))
        C /= np.linalg.norm(C, axis=1, keepdims=True)
        M = 1 - R @ R.T
        S = 1 - C @ R.T  # (L, n): s_i(x, y) for every candidate y
        T = agg_k(S, k)
        bank = CAOSBank.fit(M, k)
        for alpha in (0.1, 0.3):
            full = full_conformal_sets(M, S.T, T, k, alpha)
            assert np.all(full <= bank.sets(T, alpha))  # subset of the CAOS set


def _episode(rng: np.random.Generator, n_per: int, classes: int = 4, q: int = 1, d: int = 6):
    protos = rng.normal(size=(classes, d))
    y = np.repeat(np.arange(classes), n_per)
    x = protos[y] + 1.2 * rng.normal(size=(len(y), d))
    yq = rng.integers(0, classes, size=q)
    xq = protos[yq] + 1.2 * rng.normal(size=(q, d))
    return x, y, xq, yq


def test_classification_coverage_is_valid_with_a_fixed_seed_budget():
    """Marginal coverage over 600 fresh episodes is not below 1 - alpha minus a binomial
    tolerance (one-sided, p = 0.001); the LOO-free control under-covers on the same episodes."""
    rng = np.random.default_rng(4)
    alpha, trials = 0.1, 600
    covered, control = 0, 0
    for _ in range(trials):
        x, y, xq, yq = _episode(rng, n_per=5)
        out = classification_sets(x, y, xq, 4, alpha, k=1)
        covered += int(out["sets"][0, yq[0]])
        q_bad = threshold(no_loo_scores(class_score_matrix(x, y), 1), alpha)
        control += int(out["T"][0, yq[0]] <= q_bad)
    floor = binom.ppf(0.001, trials, 1 - alpha) / trials
    assert covered / trials >= floor
    assert covered / trials <= 0.97  # not trivially conservative
    assert control / trials < 1 - alpha - 0.1


def test_wrapper_refuses_a_predictor_without_embeddings(untrained_tail_checkpoint):
    from pydantic import BaseModel

    from nshot.method import Predictor
    from nshot.serve.conformal import ConformalPredictor

    class Plain(Predictor):  # a predictor that is not a few-shot classifier
        Request = Response = BaseModel

        def __call__(self, request):
            return request

    assert not Plain.has_one_shot_embeddings()
    with pytest.raises(NshotError, match="one-shot embeddings"):
        ConformalPredictor(Plain(), "caos", 0.1)
    from nshot.methods.tail.serve import TailPredictor
    from nshot.train.checkpoint import load_checkpoint

    tail = TailPredictor.from_checkpoint(load_checkpoint(untrained_tail_checkpoint))
    with pytest.raises(NshotError, match="alpha"):
        ConformalPredictor(tail, "caos", 1.5)
    with pytest.raises(NshotError, match="unknown"):
        ConformalPredictor(tail, "aps", 0.1)


def test_tail_conformal_sets_cover_even_an_untrained_model(untrained_tail_checkpoint):
    """Validity does not depend on the backbone: digits episodes through an untrained TAIL."""
    from nshot.methods.tail.episodes import digits_modality
    from nshot.methods.tail.serve import TailPredictor
    from nshot.serve.conformal import ConformalPredictor
    from nshot.train.checkpoint import load_checkpoint

    tail = TailPredictor.from_checkpoint(load_checkpoint(untrained_tail_checkpoint))
    cp = ConformalPredictor(tail, "caos", alpha=0.2, k=1)
    mod = digits_modality()
    rng = np.random.default_rng(5)
    hits = total = 0
    for _ in range(60):
        xs, ys, xq, yq = mod.sample(3, 4, 2, rng)
        req = cp.Request(support_x=xs.tolist(), support_y=ys.tolist(), query_x=xq.tolist())
        r = cp(req)
        assert r.labels == tail(req).labels  # the classifier's own answer is unchanged
        assert r.n_calibration == 12 and r.k == 1 and r.alpha == 0.2
        assert all(set(s) <= set(ys.tolist()) for s in r.sets)
        hits += sum(int(y in s) for y, s in zip(yq.tolist(), r.sets))
        total += len(yq)
    assert hits / total >= binom.ppf(0.001, total, 0.8) / total
    # per-request alpha overrides the served one; a smaller alpha gives sets at least as large
    req = cp.Request(
        support_x=xs.tolist(), support_y=ys.tolist(), query_x=xq.tolist(), conformal_alpha=0.05
    )
    wide = cp(req)
    assert wide.alpha == 0.05 and all(a >= b for a, b in zip(wide.set_sizes, r.set_sizes))
    assert r.empty == [size == 0 for size in r.set_sizes]
    # an empty set is flagged, not refused: at a large alpha a query unlike every support row of
    # every class (tight clusters around two axes, the query opposite both) gets no class
    g = np.random.default_rng(0)
    sx = np.concatenate([np.eye(6)[[0] * 8], np.eye(6)[[1] * 8]]) + 0.01 * g.normal(size=(16, 6))
    far = cp.Request(support_x=sx.tolist(), support_y=[0] * 8 + [1] * 8,
                     query_x=[(-np.eye(6)[0] - np.eye(6)[1]).tolist(), sx[0].tolist()],
                     conformal_alpha=0.5)  # fmt: skip
    out = cp(far)
    assert out.empty[0] and out.sets[0] == [] and out.set_sizes[0] == 0
    assert not out.empty[1] and 0 in out.sets[1]
    cp2 = ConformalPredictor(tail, "caos", alpha=0.2, k=2)
    two = cp2.Request(support_x=[xs[0].tolist(), xs[4].tolist()], support_y=[0, 1],
                      query_x=xq.tolist())  # fmt: skip
    with pytest.raises(ValueError, match="support_y: .*k \\+ 1 = 3"):
        cp2(two)
