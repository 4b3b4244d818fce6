"""What the URS network (:mod:`.model`) and the MTPOMO baseline (:mod:`.mtpomo`) share: the
decoder state's width, the per-instance InstanceNorm and the policy interface the rollout
decodes with."""

from __future__ import annotations

import torch
from torch import nn

from .env import Env
from .representation import Instances

STATE_DIM = 7


class InstanceNorm(nn.Module):
    """InstanceNorm over the nodes of each instance (per channel, affine)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))
        self.b = nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, A, V, d]
        mu = x.mean(2, keepdim=True)
        var = x.var(2, keepdim=True, unbiased=False)
        return (x - mu) / torch.sqrt(var + 1e-5) * self.w + self.b


class RoutingNet(nn.Module):
    """A policy the rollout decodes with: ``encode(inst, dist, aug)`` once per instance batch,
    then ``logits(encoded, env, mask)`` per step (URS here; MTPOMO in :mod:`.mtpomo`)."""

    def encode(self, inst: Instances, dist: torch.Tensor, aug: int = 1):  # noqa: ANN201
        raise NotImplementedError

    def logits(self, enc, env: Env, mask: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        raise NotImplementedError
