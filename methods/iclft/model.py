"""The single-layer linear self-attention model of the paper (its setup section), its losses,
and the loader of a checkpoint's models.

``Out = Z + (1/(n+1)) · (Z Qᵀ)(Z Kᵀ)ᵀ(Z Vᵀ)`` over a prompt ``Z`` of ``n`` demonstration
tokens ``[1, x_i, y_i]`` and the query token ``[1, x_q, 0]`` (last). The prediction is the last
coordinate of the query row, ``ŷ = z_qᵀ Qᵀ K S v`` with ``S = Zᵀ Z / (n+1)`` and ``v`` the last
row of ``V``; :meth:`LinearAttention.forward` computes exactly that (``O(n d)`` per prompt) and
:meth:`LinearAttention.full` the whole output matrix (the two agree; tests check it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from nshot.errors import NshotError

from .config import SUBSETS

if TYPE_CHECKING:
    from nshot.train.checkpoint import LoadedCheckpoint

    from .config import ICLFTConfig


class LinearAttention(nn.Module):
    """One layer, one head, no mask, no softmax, residual. Parameters Q, K, V of shape D×D."""

    def __init__(self, d: int, init_std: float = 0.05) -> None:
        super().__init__()
        self.d = d
        D = d + 2
        self.Q = nn.Parameter(torch.randn(D, D) * init_std)
        self.K = nn.Parameter(torch.randn(D, D) * init_std)
        self.V = nn.Parameter(torch.randn(D, D) * init_std)

    def full(self, Z: torch.Tensor) -> torch.Tensor:
        """The whole output ``Out`` (B, n+1, D), normalised by the sequence length n+1."""
        L = Z.shape[-2]
        scores = (Z @ self.Q.T) @ (Z @ self.K.T).transpose(-1, -2)
        return Z + scores @ (Z @ self.V.T) / L

    def predict(self, Z: torch.Tensor) -> torch.Tensor:
        """``ŷ = Out[:, n, d+1]`` for prompts ``Z`` (B, n+1, D), without the n×n scores."""
        L = Z.shape[-2]
        v = self.V[-1]  # only V's last row reaches ŷ
        Sv = torch.einsum("bl,bld->bd", Z @ v, Z) / L  # S v
        qk = (Z[:, -1] @ self.Q.T) @ self.K  # z_qᵀ Qᵀ K
        return (qk * Sv).sum(-1) + Z[:, -1, -1]  # residual: the query's y entry (0)

    def forward(self, *prompts: torch.Tensor) -> tuple[torch.Tensor, ...] | torch.Tensor:
        """Predictions for one or several prompt batches (one call, so DDP sees one forward)."""
        out = tuple(self.predict(Z) for Z in prompts)
        return out[0] if len(out) == 1 else out


def set_trainable(model: LinearAttention, subset: str) -> list[nn.Parameter]:
    """Freeze every matrix outside ``subset`` ('all', 'v', 'q', 'k', 'qk'); return the rest."""
    names = SUBSETS[subset]
    out = []
    for name, p in model.named_parameters():
        p.requires_grad_(name in names)
        if name in names:
            out.append(p)
    return out


class ICLFTBundle(nn.Module):
    """The models of one run (``pretrained`` and one per fine-tuning variant), one state dict.

    Checkpoint keys are ``models.<row>.{Q,K,V}`` (rows: ``pretrained``, ``zs_v``, ...).
    """

    def __init__(self, d: int, rows: Iterable[str], init_std: float = 0.05) -> None:
        super().__init__()
        self.models = nn.ModuleDict({r: LinearAttention(d, init_std) for r in rows})


def new_model(cfg: ICLFTConfig, seed: int) -> LinearAttention:
    """A freshly initialised model (``init_std``), seeded: the start of a pretraining."""
    torch.manual_seed(seed)
    return LinearAttention(cfg.d, cfg.init_std)


def load_model(checkpoint: LoadedCheckpoint) -> tuple[ICLFTBundle, dict[str, Any]]:
    """The models of an iclft checkpoint (in eval mode) and its ``extra`` (``d``, ``rows``,
    ``trained``, ``variants``, ``theta0``, ...)."""
    extra = checkpoint.extra
    if "rows" not in extra or "d" not in extra:
        raise NshotError(f"{checkpoint.path}: not an iclft checkpoint (no model list)")
    bundle = ICLFTBundle(int(extra["d"]), extra["rows"])
    try:
        bundle.load_state_dict(checkpoint.weights())
    except RuntimeError as err:
        raise NshotError(f"{checkpoint.path}: weights do not match its model list: {err}") from None
    bundle.eval()
    return bundle, extra


def tokens(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Prompt tokens ``[1, x, y]`` (B, L, d+2) from x (B, L, d) and y (B, L); the last row is
    the query, whose y entry is set to 0."""
    Z = torch.empty(*x.shape[:-1], x.shape[-1] + 2, dtype=x.dtype, device=x.device)
    Z[..., 0] = 1.0
    Z[..., 1:-1] = x
    Z[..., -1] = y
    Z[:, -1, -1] = 0.0
    return Z


def mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((pred - target) ** 2).mean()


def effective_params(model: LinearAttention) -> dict[str, torch.Tensor]:
    """``M = QᵀK`` and ``v`` (V's last row): all that ŷ depends on (float64)."""
    with torch.no_grad():
        Q, K, V = (p.detach().double().cpu() for p in (model.Q, model.K, model.V))
        return {"M": Q.T @ K, "v": V[-1].clone()}
