"""Stage 2: subject-level few-shot fine-tuning (paper §3 protocols, reconstructed).

For a target subject, k trials per class are drawn by seed as the support; the rest are the
query. Band powers are z-scored with the support's statistics only (never the query's), rendered
through the montage's matrix (A, or B for the cross-montage protocol) and classified by a
VideoMAE fine-tuned on the support: all weights with layer-wise lr decay (``bsr``,
``videomae_scratch`` without pretraining), or the frozen encoder's mean-pooled embeddings,
standardised with the support's statistics, classified by an L2-regularised logistic regression
fitted on the support (``bsr_linear_probe``, the predictor's classifier).
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.metrics import balanced_accuracy_score, cohen_kappa_score

from .config import BsrConfig
from .data import NormStats
from .model import build_classifier, encode, fit_probe, layer_decay_groups, smoothed_ce
from .train import Clips, montage_m, raw_powers


def support_split(labels: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """k trials per class (drawn by ``seed``) and the remaining trials."""
    rng = np.random.default_rng([seed, k, 11])
    sup = np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:k]
                          for c in np.unique(labels)])  # fmt: skip
    sup = np.sort(sup)
    return sup, np.setdiff1d(np.arange(len(labels)), sup)


def subject_clips(cfg: BsrConfig, eeg: np.ndarray, support: np.ndarray, montage: str,
                  scramble_seed: int | None = None) -> Clips:  # fmt: skip
    """All trials of one subject, z-scored with the statistics of its support trials only."""
    p = raw_powers(cfg, eeg, montage)
    stats = NormStats.fit(p[support])
    return Clips(stats.apply(p).astype(np.float32), montage_m(cfg, montage, scramble_seed),
                 cfg.grid)  # fmt: skip


def finetune(cfg: BsrConfig, encoder_state: dict | None, videos: torch.Tensor, y: np.ndarray,
             seed: int) -> torch.nn.Module:  # fmt: skip
    """A classifier fine-tuned for ``ft_epochs`` on the support videos: AdamW (VideoMAE's
    fine-tuning β = (0.9, 0.999), weight decay 0.05), peak lr ft_base_lr · ft_lr_ref_batch / 256
    with layer-wise decay, ``ft_warmup_epochs`` of linear warm-up, then cosine to 0."""
    torch.manual_seed(seed)
    clf = build_classifier(cfg, encoder_state)
    lr = cfg.ft_base_lr * cfg.ft_lr_ref_batch / 256
    opt = torch.optim.AdamW(layer_decay_groups(clf, cfg, lr, 0.05), lr=lr)
    yt = torch.from_numpy(np.asarray(y, dtype=np.int64))
    gen = torch.Generator().manual_seed(seed)
    n = len(yt)
    per_epoch = max(1, -(-n // cfg.ft_batch))
    total, warm = cfg.ft_epochs * per_epoch, cfg.ft_warmup_epochs * per_epoch
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: ft_lr_factor(s, warm, total))
    clf.train()
    for _ in range(cfg.ft_epochs):
        perm = torch.randperm(n, generator=gen)
        for s in range(0, n, cfg.ft_batch):
            b = perm[s : s + cfg.ft_batch]
            loss = smoothed_ce(clf(pixel_values=videos[b]).logits, yt[b], cfg.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    return clf.eval()


def ft_lr_factor(step: int, warm: int, total: int) -> float:
    """Multiplier of the peak lr at optimiser step ``step`` (0-based): linear warm-up over
    ``warm`` steps (the first step already moves), then cosine to 0 at ``total``."""
    if step < warm:
        return (step + 1) / warm
    frac = (step - warm) / max(total - warm, 1)
    return 0.5 * (1 + float(np.cos(np.pi * min(frac, 1.0))))


@torch.no_grad()
def predict_proba(clf: torch.nn.Module, videos: torch.Tensor, batch: int = 64) -> np.ndarray:
    out = [torch.softmax(clf(pixel_values=videos[s : s + batch]).logits, -1)
           for s in range(0, len(videos), batch)]  # fmt: skip
    return torch.cat(out).numpy()


@torch.no_grad()
def embeddings(model: torch.nn.Module, videos: torch.Tensor, cfg: BsrConfig,
               batch: int = 64) -> np.ndarray:  # fmt: skip
    return torch.cat([encode(model, videos[s : s + batch], cfg)
                      for s in range(0, len(videos), batch)]).numpy()  # fmt: skip


def scores(y: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    return {
        "bacc": float(balanced_accuracy_score(y, pred)),
        "kappa": float(cohen_kappa_score(y, pred)),
        "acc": float(np.mean(y == pred)),
    }


def run_videomae(cfg: BsrConfig, system: str, encoder_state: dict | None, eeg: np.ndarray,
                 labels: np.ndarray, k: int, montage: str, seed: int) -> dict[str, float]:  # fmt: skip
    """One (subject, k, montage, seed) run of a VideoMAE row; its query scores."""
    sup, qry = support_split(labels, k, seed)
    scramble = seed if system == "bsr_scrambled_positions" else None
    clips = subject_clips(cfg, eeg, sup, montage, scramble)
    if system == "bsr_linear_probe":
        emb = embeddings(
            build_classifier(cfg, encoder_state).eval(), clips.videos(slice(None)), cfg
        )
        probe = fit_probe(emb[sup], labels[sup], cfg.lr_c)
        return scores(labels[qry], probe.predict(emb[qry]))
    state = None if system == "videomae_scratch" else encoder_state
    clf = finetune(cfg, state, clips.videos(sup), labels[sup], seed)
    pred = predict_proba(clf, clips.videos(qry)).argmax(1)
    return scores(labels[qry], pred)
