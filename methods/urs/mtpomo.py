"""MTPOMO, the multi-task POMO the URS paper compares with (Liu et al., KDD 2024: "Multi-task
learning for routing problem with cross-problem zero-shot generalization"), rebuilt on this
package's environment so that it decodes every variant URS does under the same masks.

MTPOMO is POMO (Kwon et al., NeurIPS 2020) with *attribute composition*: every variant is a
combination of attributes (capacity, open routes, backhauls, distance limit, time windows), each
with its own input feature, and a variant without an attribute gets the neutral value:

- **encoder** (POMO's): a linear embedding of the depot coordinates and one of the customer
  features ``[x, y, q, e/T, l/T, s/T]`` (``q`` the signed demand: linehaul ``q_lin/Q`` or
  backhaul ``−q_back/Q``, MTPOMO's convention; windows ``[0, 1]`` and ``s = 0`` without time
  windows), then ``layers`` blocks of softmax multi-head self-attention and a feed-forward
  layer, each with a residual connection and instance normalisation (no distance bias, no
  mixed bias module, no parameter generator). Service times vary per customer in this
  generator (MTPOMO's fixes them), so ``s/T`` is a sixth customer feature;
- **decoder** (POMO's): the query is a linear map of ``[h_last; dynamic state; open]``, the
  state being the same seven numbers URS's decoder reads (remaining linehaul and backhaul
  capacity, time, route length over the limit, backhaul on the route, empty route, customers
  left) and ``open`` the open-route attribute MTPOMO adds to the context; a multi-head glimpse
  over the node embeddings (masked), its combination, then a single-head score
  ``C · tanh(g hᵀ / √d)`` with POMO's clipping ``C = 10`` and the −∞ mask after the clipping.

Mixed backhauls and multi-depot are not MTPOMO attributes: on those unseen variants it reads the
same features as for classic backhauls and one depot embedding per depot, and the environment's
masks keep its solutions feasible, as for URS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .env import Env
from .layers import STATE_DIM, InstanceNorm, RoutingNet
from .representation import Instances, udr_features

CUSTOMER_DIM = 6


def mtpomo_features(inst: Instances) -> tuple[np.ndarray, np.ndarray]:
    """Depot features [B, M, 2] (coordinates) and customer features [B, N, 6]
    ``[x, y, q, e/T, l/T, s/T]`` with ``q = q_lin/Q − q_back/Q`` (float32)."""
    node, _ = udr_features(inst)
    M = inst.num_depots
    c = node[:, M:]
    cust = np.concatenate([c[..., :2], (c[..., 2] - c[..., 3])[..., None], c[..., 4:7]], -1)
    return node[:, :M, :2], cust.astype(np.float32)


class MHALayer(nn.Module):
    """POMO's encoder block: ``h = IN(x + MHA(x))``, ``out = IN(h + FF(h))``."""

    def __init__(self, d: int, heads: int, ff: int) -> None:
        super().__init__()
        self.heads = heads
        self.wqkv = nn.Linear(d, 3 * d, bias=False)
        self.combine = nn.Linear(d, d)
        self.n1 = InstanceNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, ff), nn.ReLU(), nn.Linear(ff, d))
        self.n2 = InstanceNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, A, V, d]
        B, A, V, D = x.shape
        H = self.heads
        qkv = self.wqkv(x).reshape(B * A, V, 3, H, D // H).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])  # [BA, H, V, D/H]
        o = o.transpose(1, 2).reshape(B, A, V, D)
        h = self.n1(x + self.combine(o))
        return self.n2(h + self.ff(h))


@dataclass
class MTPOMOEncoded:
    h: torch.Tensor  # [B, A, V, d] node embeddings
    k: torch.Tensor  # [B, A, H, V, d/H] glimpse keys
    v: torch.Tensor  # [B, A, H, V, d/H] glimpse values
    e: torch.Tensor  # [B, A, d, V] single-head keys
    open: torch.Tensor  # [B] open-route attribute (float)


class MTPOMONet(RoutingNet):
    """POMO with attribute composition (see the module docstring)."""

    def __init__(
        self, d: int = 64, layers: int = 3, ff: int = 256, heads: int = 8, clip: float = 10.0
    ) -> None:
        super().__init__()
        if d % heads:
            raise ValueError(f"embedding width {d} is not a multiple of {heads} heads")
        self.d, self.heads, self.clip = d, heads, clip
        self.depot_embed = nn.Linear(2, d)
        self.node_embed = nn.Linear(CUSTOMER_DIM, d)
        self.layers = nn.ModuleList(MHALayer(d, heads, ff) for _ in range(layers))
        self.wq = nn.Linear(d + STATE_DIM + 1, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.combine = nn.Linear(d, d)

    def encode(self, inst: Instances, dist: torch.Tensor, aug: int = 1) -> MTPOMOEncoded:
        dev = dist.device
        feats = [mtpomo_features(inst.augment(a)) for a in range(aug)]
        dep = torch.as_tensor(np.stack([f[0] for f in feats], 1), device=dev)  # [B, A, M, 2]
        cust = torch.as_tensor(np.stack([f[1] for f in feats], 1), device=dev)  # [B, A, N, 6]
        x = torch.cat([self.depot_embed(dep), self.node_embed(cust)], 2)
        for layer in self.layers:
            x = layer(x)
        B, A, V, D = x.shape
        H = self.heads
        k = self.wk(x).reshape(B, A, V, H, D // H).transpose(2, 3)
        v = self.wv(x).reshape(B, A, V, H, D // H).transpose(2, 3)
        open_ = torch.as_tensor(inst.open_route.astype(np.float32), device=dev)
        return MTPOMOEncoded(h=x, k=k, v=v, e=x.transpose(-1, -2), open=open_)

    def logits(self, enc: MTPOMOEncoded, env: Env, mask: torch.Tensor) -> torch.Tensor:
        """Masked logits [B, R, V] for the current state (R = A × P rollouts)."""
        B, A, V, D = enc.h.shape
        H = self.heads
        P = env.R // A
        cur = env.cur.reshape(B, A, P)
        h_cur = torch.gather(enc.h, 2, cur[..., None].expand(-1, -1, -1, D))
        state = env.state_features().reshape(B, A, P, -1)
        open_ = enc.open[:, None, None, None].expand(B, A, P, 1)
        q = self.wq(torch.cat([h_cur, state, open_], -1))  # [B, A, P, d]
        q = q.reshape(B, A, P, H, D // H).transpose(2, 3)  # [B, A, H, P, d/H]
        m = mask.reshape(B, A, P, V)
        neg = torch.zeros(m.shape, device=q.device).masked_fill(~m, float("-inf"))
        att = torch.matmul(q, enc.k.transpose(-1, -2)) / math.sqrt(D // H) + neg[:, :, None]
        g = torch.matmul(torch.softmax(att, -1), enc.v)  # the masked multi-head glimpse
        g = self.combine(g.transpose(2, 3).reshape(B, A, P, D))
        score = torch.matmul(g, enc.e) / math.sqrt(D)
        logit = self.clip * torch.tanh(score)
        logit = logit.masked_fill(~m, float("-inf"))  # after the tanh clipping
        return logit.reshape(B, A * P, V)
