"""Few-shot evaluation on held-out targets (the paper's protocol at the preset's scale).

Per test target, ``eval_draws`` support draws (k positives + k negatives, by seed); the
queries are the target's other labelled molecules, stratified and capped at ``eval_queries``.
Every system sees the same draws for a seed. ROC-AUC per episode, averaged per target, then
over targets; ΔAUPRC = average precision − the queries' active fraction (FS-Mol's metric);
the AUC on activity-cliff queries alone; the gates' ROC-AUC separating informative auxiliaries
from injected distractors.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from .config import RecogConfig
from .data import Episode, Track, sample_episode
from .model import RecogModel, episode_tensors

# a system answers an episode with query probabilities and (optionally) the gates π_a
Answer = tuple[np.ndarray, np.ndarray | None]
System = Callable[[Episode], Answer]


def model_system(model: torch.nn.Module) -> System:
    model.eval()

    @torch.no_grad()
    def answer(ep: Episode) -> Answer:
        out = model(**episode_tensors(ep))
        gates = None if out.gates is None else out.gates.numpy()
        return torch.sigmoid(out.logits).numpy(), gates

    return answer


def _logreg(xs: np.ndarray, ys: np.ndarray, xq: np.ndarray) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression(C=1.0, max_iter=500)
    clf.fit(xs, ys.astype(int))
    return clf.predict_proba(xq)[:, 1]


def fp_logreg(ep: Episode) -> Answer:
    """ECFP4 + logistic regression fitted on the support only."""
    return _logreg(ep.xs, ep.ys, ep.xq), None


def auxlabel_logreg(ep: Episode) -> Answer:
    """Logistic regression on the molecules' auxiliary label vectors (unmeasured → 0.5):
    context without a graph."""
    fs, fq = np.nan_to_num(ep.ls, nan=0.5), np.nan_to_num(ep.lq, nan=0.5)
    if fs.shape[1] == 0:
        return np.full(len(fq), 0.5), None
    return _logreg(fs, ep.ys, fq), None


def _auc(y: np.ndarray, p: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    if len(set(y.tolist())) < 2:
        return math.nan
    return float(roc_auc_score(y, p))


def _dauprc(y: np.ndarray, p: np.ndarray) -> float:
    from sklearn.metrics import average_precision_score

    if len(set(y.tolist())) < 2:
        return math.nan
    return float(average_precision_score(y, p) - y.mean())


def _target_mean(per: dict[int, list[float]]) -> float:
    means = [np.nanmean(v) for v in per.values() if np.isfinite(v).any()]
    return float(np.mean(means)) if means else math.nan


def episodes_for(
    track: Track, cfg: RecogConfig, k: int, seed: int, *, n_distractors: int | None = None
):
    """The evaluation episodes of a seed: ``(target, draw, Episode)``."""
    nd = cfg.n_distractors if n_distractors is None else n_distractors
    for t in track.test_targets:
        for d in range(cfg.eval_draws):
            rng = np.random.default_rng([seed, 7001, t, d, k])
            ep = sample_episode(track, t, k, cfg.eval_queries, rng, n_aux=cfg.n_aux,
                                n_distractors=nd, stratified=True,
                                fresh_distractors=cfg.distractor_identity == "fresh")  # fmt: skip
            yield t, d, ep


def evaluate_setting(
    system: System, track: Track, cfg: RecogConfig, k: int, seed: int, *,
    n_distractors: int | None = None,
) -> dict[str, float]:  # fmt: skip
    """Mean AUC, ΔAUPRC, cliff AUC and gate AUC of ``system`` at k shots."""
    auc: dict[int, list[float]] = {}
    dap: dict[int, list[float]] = {}
    cliff: dict[int, list[float]] = {}
    gate_scores: list[float] = []
    gate_labels: list[int] = []
    per_target: dict[str, float] = {}
    for t, _, ep in episodes_for(track, cfg, k, seed, n_distractors=n_distractors):
        probs, gates = system(ep)
        auc.setdefault(t, []).append(_auc(ep.yq, probs))
        dap.setdefault(t, []).append(_dauprc(ep.yq, probs))
        if ep.cliff_q is not None and ep.cliff_q.sum() >= 2:
            cliff.setdefault(t, []).append(_auc(ep.yq[ep.cliff_q], probs[ep.cliff_q]))
        if gates is not None:
            gate_scores += gates.tolist()
            gate_labels += (~ep.distractor).astype(int).tolist()
    for t, v in auc.items():
        per_target[track.props[t]] = float(np.nanmean(v))
    gate_auc = _auc(np.array(gate_labels), np.array(gate_scores)) if gate_scores else math.nan
    return {
        "auc": _target_mean(auc),
        "dauprc": _target_mean(dap),
        "auc_cliff": _target_mean(cliff) if cliff else math.nan,
        "gate_auc": gate_auc,
        "per_target": per_target,
        "gate_mean_informative": float(np.mean([s for s, y in zip(gate_scores, gate_labels) if y]))
        if gate_scores else math.nan,
        "gate_mean_distractor": float(np.mean([s for s, y in zip(gate_scores, gate_labels) if not y]))
        if gate_scores and not all(gate_labels) else math.nan,
    }  # fmt: skip


def evaluate_system(
    system: System, track: Track, cfg: RecogConfig, seed: int, *, uses_context: bool
) -> dict[str, object]:
    """The table's metrics for one system and seed: 1-shot (with the distractors, and without
    them for ``distractor_drop`` when the system reads the context) and 10-shot when the config
    evaluates it (else the largest k)."""
    k1 = min(cfg.shots)
    main = evaluate_setting(system, track, cfg, k1, seed)
    out: dict[str, object] = {
        "auc_1shot": main["auc"],
        "dauprc_1shot": main["dauprc"],
        "auc_1shot_cliff": main["auc_cliff"],
        "gate_auc": main["gate_auc"],
        "distractor_drop": math.nan,
        "auc_10shot": math.nan,
    }
    detail: dict[str, object] = {"per_target_1shot": main["per_target"],
                                 "gate_mean_informative": main["gate_mean_informative"],
                                 "gate_mean_distractor": main["gate_mean_distractor"]}  # fmt: skip
    if uses_context and cfg.n_distractors > 0:
        clean = evaluate_setting(system, track, cfg, k1, seed, n_distractors=0)
        out["distractor_drop"] = clean["auc"] - main["auc"]
        detail["auc_1shot_no_distractors"] = clean["auc"]
    kmax = max(cfg.shots)
    if kmax != k1:
        big = evaluate_setting(system, track, cfg, kmax, seed)
        out["auc_10shot"] = big["auc"]
        detail["per_target_10shot"] = big["per_target"]
    out["detail"] = detail
    return out


def validation_auc(model: RecogModel, track: Track, cfg: RecogConfig, target: int) -> float:
    """Mean query AUC on 4 fixed episodes of a held-out training target."""
    system = model_system(model)
    aucs = []
    for d in range(4):
        rng = np.random.default_rng([cfg.seed, 5003, target, d])
        ep = sample_episode(track, target, min(cfg.shots), min(cfg.eval_queries, 64), rng,
                            n_aux=cfg.n_aux, n_distractors=cfg.n_distractors, stratified=True,
                            fresh_distractors=cfg.distractor_identity == "fresh")  # fmt: skip
        aucs.append(_auc(ep.yq, system(ep)[0]))
    return float(np.nanmean(aucs))


def leakage_max_abs_diff(model: torch.nn.Module, track: Track, cfg: RecogConfig, seed: int = 0):
    """Predictions for one evaluation episode per test target, before and after every query's
    label on that target is flipped in the label matrix itself (and the track's pair
    statistics rebuilt from it): the largest absolute difference of any query probability
    (0.0 when no query label reaches the prediction, the support/query draw and the auxiliary
    choice being the same)."""
    import copy

    from .data import make_episode, pair_counts

    system = model_system(model)
    worst = 0.0
    k = min(cfg.shots)
    where = {s: i for i, s in enumerate(track.smiles)}
    for t in track.test_targets:
        rng = np.random.default_rng([seed, 7001, t, 0, k])
        ep = sample_episode(track, t, k, cfg.eval_queries, rng, n_aux=cfg.n_aux,
                            n_distractors=cfg.n_distractors, stratified=True,
                            fresh_distractors=cfg.distractor_identity == "fresh")  # fmt: skip
        support = np.array([where[s] for s in ep.smiles_s])
        queries = np.array([where[s] for s in ep.smiles_q])
        flipped = copy.copy(track)
        labels = track.labels.copy()
        labels[queries, t] = 1.0 - labels[queries, t]
        flipped.labels = labels
        if track.aux_labels is track.labels:
            flipped.aux_labels = labels
        context = flipped.aux_labels.copy()
        context[:, track.test_targets] = np.nan
        flipped.pair_counts = pair_counts(context)
        ep2 = make_episode(flipped, t, support, queries, ep.aux)
        ep2.aux_ids = ep.aux_ids  # the same embeddings (fresh distractor identities)
        assert np.all(ep2.yq == 1.0 - ep.yq)
        p1, g1 = system(ep)
        p2, g2 = system(ep2)
        worst = max(worst, float(np.abs(p1 - p2).max()))
        if g1 is not None:
            worst = max(worst, float(np.abs(g1 - g2).max()))
    return worst
