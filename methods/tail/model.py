"""TAIL's meta-learner Υ with its label dictionary.

Tokens have width ``d_data + d_label``. A support token is ``[P_π f_i ; E[ρ(y_i)]]``; a query
token is ``[P_π f'_j ; u]`` with ``u`` a separate learnable "unknown label" vector. A non-causal
pre-LN transformer without positional encoding reads all tokens of an episode in one sequence
(inline queries: support rows see the support; query row j sees the support and itself), and
``W_s`` scores every dictionary entry; the logits are restricted to the episode's active entries
``ρ(Y_T)`` and returned in class order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from nshot.nn import Encoder

from .config import TailConfig
from .episodes import dictionary_slots

if TYPE_CHECKING:
    from nshot.train.checkpoint import LoadedCheckpoint

__all__ = ["TailModel", "episode_mask", "load_model"]


def episode_mask(
    n: int, q: int, attention: str = "inline", device: torch.device | str | None = None
) -> torch.Tensor:
    """Boolean mask ``[1, n+q, n+q]`` (True = may attend) for a support-then-queries sequence.

    ``inline``: support rows attend to support columns only; query row ``n+j`` attends to the
    support columns and to itself. ``causal`` (ablation): lower-triangular over the sequence.
    """
    length = n + q
    if attention == "causal":
        mask = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    elif attention == "inline":
        mask = torch.zeros(length, length, dtype=torch.bool, device=device)
        mask[:, :n] = True
        idx = torch.arange(n, length, device=device)
        mask[idx, idx] = True
    else:
        raise ValueError(f"unknown attention {attention!r}; expected 'inline' or 'causal'")
    return mask.unsqueeze(0)


class TailModel(nn.Module):
    """Υ, the label dictionary E, the unknown-label vector u and the output head W_s."""

    def __init__(self, cfg: TailConfig) -> None:
        super().__init__()
        self.d_data = cfg.d_data
        self.d_label = cfg.d_label
        self.attention = cfg.attention
        self.num_slots = dictionary_slots(cfg)  # M (fixed-slot ablation: M = max_ways)
        width = cfg.d_data + cfg.d_label
        self.label_embedding = nn.Parameter(torch.randn(self.num_slots, cfg.d_label))  # E
        self.unknown = nn.Parameter(torch.randn(cfg.d_label))  # u, never a row of E
        self.encoder = Encoder(cfg.depth, width, cfg.heads, cfg.mlp_dim, cfg.dropout)
        self.head = nn.Linear(width, self.num_slots, bias=False)  # W_s
        # (Reconstruction: initialisation.) W_s starts as the unit-normalised dictionary on its
        # label block and zero on its data block, so that s[m] initially measures how much of
        # E[m] the query's output carries. E and W_s are separate parameters, trained freely.
        # With an independent random W_s the `small` preset stays on the in-context-learning
        # plateau (chance accuracy) for all its steps; with this start it leaves it early.
        with torch.no_grad():
            self.head.weight.zero_()
            self.head.weight[:, cfg.d_data :] = F.normalize(self.label_embedding, dim=-1)

    def _tokens(
        self, support_x: torch.Tensor, support_slot: torch.Tensor, query_x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if support_x.shape[-1] != self.d_data or query_x.shape[-1] != self.d_data:
            raise ValueError(
                f"features must have width d_data={self.d_data}, got support "
                f"{support_x.shape[-1]} and query {query_x.shape[-1]}"
            )
        s = torch.cat([support_x, self.label_embedding[support_slot]], dim=-1)
        u = self.unknown.expand(*query_x.shape[:-1], self.d_label)
        return s, torch.cat([query_x, u], dim=-1)

    def _restricted_logits(self, h: torch.Tensor, active_slots: torch.Tensor) -> torch.Tensor:
        """``h [B, q, W]`` -> ``s_j[ρ(k)]`` for k in class order: ``[B, q, K]``."""
        if int(active_slots.max()) >= self.num_slots or int(active_slots.min()) < 0:
            raise ValueError(f"active dictionary slots must lie in [0, {self.num_slots})")
        w = self.head.weight[active_slots]  # [B, K, W]: only the active rows of W_s
        return torch.einsum("bqw,bkw->bqk", h, w)

    def forward(
        self,
        support_x: torch.Tensor,
        support_slot: torch.Tensor,
        query_x: torch.Tensor,
        active_slots: torch.Tensor,
    ) -> torch.Tensor:
        """Inline queries: ``[B,n,d_data], [B,n], [B,q,d_data], [B,K] -> logits [B,q,K]``."""
        s, t = self._tokens(support_x, support_slot, query_x)
        n, q = s.shape[1], t.shape[1]
        mask = episode_mask(n, q, self.attention, device=s.device)
        h = self.encoder(torch.cat([s, t], dim=1), mask)[:, n:]
        return self._restricted_logits(h, active_slots)

    def forward_per_query(
        self,
        support_x: torch.Tensor,
        support_slot: torch.Tensor,
        query_x: torch.Tensor,
        active_slots: torch.Tensor,
        query_chunk: int | None = None,
    ) -> torch.Tensor:
        """CAML-style cost baseline: every query is its own sequence ``[support ; query_j]``.

        Same inputs and outputs as :meth:`forward` (and, with the inline mask, the same logits);
        the cost is that of ``q`` sequences of length ``n + 1``. ``query_chunk`` bounds how many
        of these sequences run at once (memory only).
        """
        s, t = self._tokens(support_x, support_slot, query_x)
        b, n, width = s.shape
        q = t.shape[1]
        mask = episode_mask(n, 1, self.attention, device=s.device)
        chunk = q if query_chunk is None else max(1, query_chunk)
        outs = []
        for start in range(0, q, chunk):
            tq = t[:, start : start + chunk]  # [B, c, W]
            c = tq.shape[1]
            seq = torch.cat([s.unsqueeze(1).expand(b, c, n, width), tq.unsqueeze(2)], dim=2)
            h = self.encoder(seq.reshape(b * c, n + 1, width), mask)[:, n]
            outs.append(h.view(b, c, width))
        return self._restricted_logits(torch.cat(outs, dim=1), active_slots)


def load_model(checkpoint: LoadedCheckpoint) -> tuple[TailModel, TailConfig]:
    """The model a checkpoint holds (in eval mode) and the config it was built from."""
    cfg = TailConfig.validated(checkpoint.config)
    model = TailModel(cfg)
    model.load_state_dict(checkpoint.weights())
    return model.eval(), cfg
