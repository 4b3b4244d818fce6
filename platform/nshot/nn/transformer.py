"""A generic pre-LN transformer encoder with an explicit boolean attention mask.

Attention runs through :func:`torch.nn.functional.scaled_dot_product_attention`, where a boolean
mask entry ``True`` means "may attend" (the opposite of :class:`torch.nn.MultiheadAttention`'s
``attn_mask``). No positional encoding is added: the encoder is equivariant to any permutation of
the sequence that the mask respects.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PreLNBlock", "Encoder"]


class PreLNBlock(nn.Module):
    """``x + Attn(LN(x))`` then ``x + MLP(LN(x))`` with a GELU MLP."""

    def __init__(self, width: int, heads: int, mlp_dim: int, dropout: float = 0.0) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not divisible by heads {heads}")
        self.heads = heads
        self.dropout = dropout
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, mlp_dim),
            nn.GELU(),
            nn.Linear(mlp_dim, width),
        )
        self.drop = nn.Dropout(dropout)

    def attention(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        b, length, width = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.heads, width // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, L, Dh]
        mask = None if attn_mask is None else attn_mask.unsqueeze(1)  # broadcast over heads
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(out.transpose(1, 2).reshape(b, length, width))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.drop(self.attention(self.ln1(x), attn_mask))
        return x + self.drop(self.mlp(self.ln2(x)))


class Encoder(nn.Module):
    """``depth`` pre-LN blocks followed by a final LayerNorm.

    ``forward(x [B, L, W], attn_mask [B or 1, L, L] bool)``; ``True`` = may attend. Every row of
    the mask must allow at least one column.
    """

    def __init__(
        self, depth: int, width: int, heads: int, mlp_dim: int, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.width = width
        self.blocks = nn.ModuleList(
            PreLNBlock(width, heads, mlp_dim, dropout) for _ in range(depth)
        )
        self.ln_out = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        if attn_mask is not None:
            if attn_mask.dtype != torch.bool:
                raise TypeError(
                    f"attn_mask must be bool (True = may attend), got {attn_mask.dtype}"
                )
            if attn_mask.dim() != 3 or attn_mask.shape[-2:] != (x.shape[1], x.shape[1]):
                raise ValueError(
                    f"attn_mask must have shape [B or 1, {x.shape[1]}, {x.shape[1]}], "
                    f"got {tuple(attn_mask.shape)}"
                )
        for block in self.blocks:
            x = block(x, attn_mask)
        return self.ln_out(x)
