"""Canonicalisation demo (the paper's Theorem 6.3): sort hidden neurons by bias, then any MLP.

On general-position (GP) inputs — biases pairwise distinct within each hidden layer — the sorted
form is a canonical representative of the hidden-permutation orbit, so an MLP on it is exactly
invariant and continuous; where two biases tie the sort order flips and the output jumps.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .backbones import Layers, permute_hidden


def canonical_perms(layers: Sequence[tuple[Tensor, Tensor]]) -> list[Tensor]:
    """Per hidden layer, the stable ascending argsort of its biases: [B, d_l] each."""
    return [torch.sort(b, dim=1, stable=True).indices for _, b in layers[:-1]]


def canonicalise(layers: Sequence[tuple[Tensor, Tensor]]) -> Layers:
    """Sort each hidden layer's neurons by bias (ascending, stable; ties keep index order).

    The rows of W_l, b_l and the columns of W_{l+1} move consistently, so the realised function
    is unchanged.
    """
    return permute_hidden(layers, canonical_perms(layers))


def quantise(t: Tensor, bits: int) -> Tensor:
    """Round to ``bits`` significant mantissa bits (leading bit included), unbounded exponent.

    ``bits=11`` matches float16's significand and ``bits=8`` bfloat16's (without their exponent
    range limits); zero stays zero.
    """
    if bits < 1:
        raise ValueError(f"bits must be >= 1, got {bits}")
    mant, expo = torch.frexp(t)  # t = mant * 2**expo, |mant| in [0.5, 1)
    scale = float(2**bits)
    return torch.ldexp(torch.round(mant * scale) / scale, expo)


def in_general_position(layers: Sequence[tuple[Tensor, Tensor]], bits: int | None = None) -> Tensor:
    """Bool [B]: biases within each hidden layer pairwise distinct (after ``quantise(b, bits)``)."""
    bsz = layers[0][0].shape[0]
    ok = torch.ones(bsz, dtype=torch.bool, device=layers[0][0].device)
    for _, b in layers[:-1]:
        q = b if bits is None else quantise(b, bits)
        s = torch.sort(q, dim=1).values
        if s.shape[1] > 1:
            ok &= (s[:, 1:] != s[:, :-1]).all(dim=1)
    return ok


class CanonMLP(nn.Module):
    """MLP on the flattened bias-sorted weights: invariant to hidden permutations on GP inputs."""

    def __init__(self, widths: Sequence[int], hidden: int = 64, depth: int = 2, out_dim: int = 1):
        super().__init__()
        self.widths = list(widths)
        n_in = sum(a * b + b for a, b in itertools.pairwise(widths))
        dims = [n_in] + [hidden] * depth
        mods: list[nn.Module] = []
        for a, b in itertools.pairwise(dims):
            mods += [nn.Linear(a, b), nn.ReLU()]
        mods.append(nn.Linear(dims[-1], out_dim))
        self.net = nn.Sequential(*mods)

    @staticmethod
    def flatten(layers: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
        """[B, N]: W_1, b_1, ..., W_L, b_L flattened in order."""
        return torch.cat([t.reshape(t.shape[0], -1) for wb in layers for t in wb], dim=1)

    def forward(self, layers: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
        return self.net(self.flatten(canonicalise(layers)))


__all__ = ["CanonMLP", "canonical_perms", "canonicalise", "in_general_position", "quantise"]
