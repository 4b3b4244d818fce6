"""skeleton's training: episodic training of the embedding, as a recipe of nshot's trainer.

Step ``s`` draws its episodes from a generator seeded by ``(seed, s, rank)``, so a run resumed
from the checkpoint of step ``k`` sees the episodes an uninterrupted run sees from step
``k + 1`` on; with the optimizer state in the checkpoint, it ends with the same weights.
The trainer (:mod:`nshot.train.trainer`) owns the rest: the device, DDP, resume, checkpoints,
fault injection, windowed metrics and progress. :func:`fit` runs the same recipe without Ray
Train, for the comparison's jobs.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from nshot.train.trainer import Recipe, train

from .config import SkeletonConfig
from .data import episode, examples
from .model import SkeletonModel, build_model, prototype_logits


class SkeletonRecipe(Recipe):
    """Adam on the mean query cross-entropy of ``batch_episodes`` episodes per step."""

    def build(self) -> None:
        self.model = build_model(self.cfg)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.cfg.lr)
        self.data = examples(self.cfg, "train")
        self.samples_per_step = self.cfg.batch_episodes

    def loss(self, step: int, micro: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.cfg
        rng = np.random.default_rng([cfg.seed, step, self.rank])
        loss = torch.zeros((), device=self.device)
        correct = 0.0
        for _ in range(cfg.batch_episodes):
            sx, sy, qx, qy = (
                torch.from_numpy(a).to(self.device) for a in episode(*self.data, cfg, rng)
            )
            logits = prototype_logits(self.forward(sx), sy, self.forward(qx), cfg.ways)
            loss = loss + F.cross_entropy(logits, qy) / cfg.batch_episodes
            correct += float((logits.argmax(1) == qy).float().mean()) / cfg.batch_episodes
        return loss, {"loss": loss.item(), "episode_acc": correct}


def train_loop(cfg: SkeletonConfig) -> None:
    """What Ray Train runs on each worker (and in-process with ``--workers 0``)."""
    train(SkeletonRecipe(cfg))


def fit(cfg: SkeletonConfig) -> SkeletonModel:
    """The model ``train_loop`` trains on one worker, trained here without Ray Train."""
    return train(SkeletonRecipe(cfg), session=False).model.eval()
