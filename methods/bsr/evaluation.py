"""Stage 2: subject-level few-shot fine-tuning (paper §3 protocols, reconstructed).

For a target subject, k trials per class are drawn by seed as the support; the rest are the
query. Band powers are z-scored with the support's statistics only (never the query's), rendered
through the montage's matrix (A, or B for the cross-montage protocol) and classified by a
VideoMAE fine-tuned on the support: all weights with layer-wise lr decay (``bsr``,
``videomae_scratch`` without pretraining) or a frozen encoder with a linear head
(``bsr_linear_probe``).
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.metrics import balanced_accuracy_score, cohen_kappa_score

from .config import BsrConfig
from .data import NormStats
from .model import build_classifier, encode, layer_decay_groups, smoothed_ce
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
             seed: int, linear_probe: bool = False) -> torch.nn.Module:  # fmt: skip
    """A classifier fine-tuned for ``ft_epochs`` on the support videos."""
    torch.manual_seed(seed)
    clf = build_classifier(cfg, encoder_state)
    lr = cfg.ft_base_lr * cfg.ft_batch / 256
    if linear_probe:
        for p in clf.videomae.parameters():
            p.requires_grad_(False)
        params = [p for p in clf.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=lr * 10, weight_decay=0.0)
    else:
        opt = torch.optim.AdamW(layer_decay_groups(clf, cfg, lr, 0.05), lr=lr)
    yt = torch.from_numpy(np.asarray(y, dtype=np.int64))
    gen = torch.Generator().manual_seed(seed)
    n = len(yt)
    total = cfg.ft_epochs * max(1, -(-n // cfg.ft_batch))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + np.cos(np.pi * min(s / max(total, 1), 1.0)))
    )
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


@torch.no_grad()
def predict_proba(clf: torch.nn.Module, videos: torch.Tensor, batch: int = 64) -> np.ndarray:
    out = [torch.softmax(clf(pixel_values=videos[s : s + batch]).logits, -1)
           for s in range(0, len(videos), batch)]  # fmt: skip
    return torch.cat(out).numpy()


@torch.no_grad()
def embeddings(model: torch.nn.Module, videos: torch.Tensor, batch: int = 64) -> np.ndarray:
    return torch.cat([encode(model, videos[s : s + batch])
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
    state = None if system == "videomae_scratch" else encoder_state
    clf = finetune(cfg, state, clips.videos(sup), labels[sup], seed,
                   linear_probe=system == "bsr_linear_probe")  # fmt: skip
    pred = predict_proba(clf, clips.videos(qry)).argmax(1)
    return scores(labels[qry], pred)
