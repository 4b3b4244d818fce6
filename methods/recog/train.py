"""ReCoG's episodic training (first-order: one Adam step per episode, no inner loop).

A step is one episode on a meta-training target: the target, k, the support, the queries and
the auxiliaries come from a generator seeded by ``(seed, step, rank)``, and torch's own random
state (dropout, Gumbel noise, hidden edges) is reseeded from it, so a run resumed at step s sees
the episodes an uninterrupted run sees. The last training target is held out for the validation
AUC. Loss: query BCE + ``lambda_rel`` · L_rel (CPR) + ``beta`` · L_IB (CGIB).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from nshot.train.trainer import Recipe, train

from .config import RecogConfig
from .data import Track, sample_episode, track_for
from .evaluation import validation_auc
from .model import RecogModel, build_model, episode_tensors


def meta_targets(track: Track) -> tuple[list[int], int]:
    """Training targets for episodes, and the held-out one for validation."""
    return track.train_targets[:-1], track.train_targets[-1]


def new_model(cfg: RecogConfig, track: Track, system: str | None = None) -> torch.nn.Module:
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    model = build_model(cfg, len(track.props), system)
    if isinstance(model, RecogModel):
        model.pair_counts.copy_(torch.from_numpy(np.array(track.pair_counts, dtype=np.float32)))
    return model


def episode_loss(
    model: torch.nn.Module, track: Track, cfg: RecogConfig, step: int, rank: int = 0
) -> tuple[torch.Tensor, dict[str, float]]:
    targets, _ = meta_targets(track)
    rng = np.random.default_rng([cfg.seed, step, rank])
    torch.manual_seed(int(rng.integers(2**31)))
    t = int(rng.choice(targets))
    k = int(rng.choice(cfg.shots))
    ep = sample_episode(track, t, k, cfg.query, rng, n_aux=cfg.n_aux,
                        n_distractors=cfg.n_distractors,
                        fresh_distractors=cfg.distractor_identity == "fresh")  # fmt: skip
    device = next(model.parameters()).device  # the worker's device: inputs follow the model
    out = model(**episode_tensors(ep, device))
    cls = F.binary_cross_entropy_with_logits(out.logits, torch.from_numpy(ep.yq).to(device))
    loss = cls + cfg.lambda_rel * out.loss_rel + cfg.beta * out.loss_ib
    return loss, {"loss": float(loss.detach()), "cls": float(cls.detach()),
                  "rel": float(out.loss_rel.detach()),
                  "ib": float(out.loss_ib.detach())}  # fmt: skip


class RecogRecipe(Recipe):
    """One Adam step per episode on the loss of :func:`episode_loss`; the validation AUC on the
    held-out training target every ``val_every`` steps and at the end."""

    def __init__(self, cfg: RecogConfig, track: Track | None = None, system: str | None = None):
        super().__init__(cfg)
        self.track, self.system = track, system
        self.samples_per_step = 1

    def build(self) -> None:
        cfg = self.cfg
        if self.track is None:
            self.track = track_for(cfg)
        self.model = new_model(cfg, self.track, self.system)
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True
        )
        self.last_val = 0.5

    def on_restore(self, restored) -> None:  # noqa: ANN001
        self.last_val = float(restored.metrics.get("val_auc", 0.5))

    def loss(self, step: int, micro: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
        loss, stats = episode_loss(self.forward, self.track, self.cfg, step, self.rank)
        if self.forward is not self.model:  # every parameter takes part in DDP's reduction
            loss = loss + 0.0 * sum(p.sum() for p in self.model.parameters())
        return loss, stats

    def step(self, step: int) -> dict[str, float]:
        stats = super().step(step)
        if self.session and (step % self.cfg.val_every == 0 or step == self.cfg.steps):
            self.last_val = validation_auc(self.model, self.track, self.cfg,
                                           meta_targets(self.track)[1])  # fmt: skip
            self.model.train()
        return stats

    def on_report(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        return {**metrics, "val_auc": self.last_val}

    def extra(self) -> dict:
        return {"props": property_record(self.track), "system": self.cfg.system}


def fit_model(cfg: RecogConfig, track: Track, system: str | None = None) -> torch.nn.Module:
    """Train ``cfg.steps`` episodes in this process (a row of the experiments) and return the
    model."""
    return train(RecogRecipe(cfg, track, system), session=False).model


def property_record(track: Track) -> dict:
    """What a checkpoint keeps about the properties (names, kinds, split)."""
    return {
        "track": track.name,
        "names": list(track.props),
        "kinds": list(track.kinds),
        "train_targets": [track.props[j] for j in track.train_targets],
        "test_targets": [track.props[j] for j in track.test_targets],
    }


def train_loop(cfg: RecogConfig) -> None:
    """Episodic training under Ray Train: every worker trains on its own episodes (DDP averages
    the gradients); loss every ``log_every`` episodes, the validation AUC on the held-out
    training target every ``val_every``, a checkpoint every ``checkpoint_every`` and at the end."""
    train(RecogRecipe(cfg))
