"""skeleton's model: an embedding network and the nearest-prototype rule.

A prototype is the mean embedding of a class's support examples; a query's logits are minus its
squared distances to the prototypes (prototypical networks). The same rule on the raw features
(``embed=None``) is the baseline of the comparison.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from .config import SkeletonConfig
from .data import episode

if TYPE_CHECKING:
    from nshot.train.checkpoint import LoadedCheckpoint


class SkeletonModel(nn.Module):
    def __init__(self, cfg: SkeletonConfig) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(cfg.dim, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, cfg.embed)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def build_model(cfg: SkeletonConfig) -> SkeletonModel:
    torch.manual_seed(cfg.seed)  # the same initial weights on every worker
    return SkeletonModel(cfg)


def prototype_logits(
    support: torch.Tensor, support_y: torch.Tensor, query: torch.Tensor, n_classes: int
) -> torch.Tensor:
    """``[queries, n_classes]``: minus the squared distance to each class's mean support row."""
    onehot = torch.nn.functional.one_hot(support_y, n_classes).to(support.dtype)
    protos = onehot.T @ support / onehot.sum(0).unsqueeze(1)
    return -torch.cdist(query, protos).pow(2)


Embed = Callable[[torch.Tensor], torch.Tensor] | None


@torch.no_grad()
def episode_accuracies(
    embed: Embed,
    cfg: SkeletonConfig,
    x: np.ndarray,
    y: np.ndarray,
    seed: int,
    permute: bool = False,
) -> list[float]:
    """Accuracy on ``cfg.eval_episodes`` episodes of ``(x, y)`` drawn from ``seed`` (the same
    episodes for every ``embed``); ``permute``: the query labels shuffled (a negative control)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(cfg.eval_episodes):
        sx, sy, qx, qy = (torch.from_numpy(a) for a in episode(x, y, cfg, rng))
        if permute:
            qy = qy[torch.from_numpy(rng.permutation(len(qy)))]
        if embed is not None:
            sx, qx = embed(sx), embed(qx)
        pred = prototype_logits(sx, sy, qx, cfg.ways).argmax(1)
        out.append(float((pred == qy).float().mean()))
    return out


def load_model(
    checkpoint: LoadedCheckpoint,
) -> tuple[SkeletonModel, SkeletonConfig]:
    """The model and config a checkpoint of ``train_loop`` holds, ready to evaluate."""
    cfg = SkeletonConfig.validated(checkpoint.config)
    model = SkeletonModel(cfg)
    model.load_state_dict(checkpoint.weights())
    return model.eval(), cfg
