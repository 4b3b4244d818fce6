"""The paper's unnormalised DCT-II and its exact inverse, in torch.

``dct``: ``X_k = Σ_{n<N} x_n cos(πk(2n+1)/(2N))``, which equals ``scipy.fft.dct(x, type=2) / 2``
(no ``norm``). ``idct``: ``x_n = X_0/N + (2/N) Σ_{k≥1} X_k cos(πk(2n+1)/(2N))``. ``dct2``/``idct2``
transform the last two dimensions (rows, then columns). The transforms multiply by a cosine
matrix (cached per length and device), computed in float64; results come back in the input's
floating dtype (float64 for integer input). They are differentiable.

The DCT is deliberately *not* orthonormal: FRONT's depth-amplitude effect depends on it.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

__all__ = ["dct", "dct2", "idct", "idct2", "dct_matrix", "idct_matrix"]


@lru_cache(maxsize=64)
def _cos_matrix(n: int, device: torch.device) -> torch.Tensor:
    # normal tensors even if first built under inference mode (they are reused under autograd)
    with torch.inference_mode(False), torch.no_grad():
        k = torch.arange(n, dtype=torch.float64, device=device)[:, None]
        i = torch.arange(n, dtype=torch.float64, device=device)[None, :]
        return torch.cos(math.pi * k * (2 * i + 1) / (2 * n))  # [k, n]


@lru_cache(maxsize=64)
def _inv_matrix(n: int, device: torch.device) -> torch.Tensor:
    with torch.inference_mode(False), torch.no_grad():
        w = torch.full((n, 1), 2.0 / n, dtype=torch.float64, device=device)
        w[0, 0] = 1.0 / n
        return _cos_matrix(n, device) * w  # [k, n]


def dct_matrix(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The float64 DCT-II matrix ``M[k, n]`` (``dct(x) = M @ x`` for a vector x)."""
    return _cos_matrix(int(n), torch.device(device))


def idct_matrix(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The float64 inverse as ``W[k, n]`` (``idct(X) = W.T @ X`` for a vector X)."""
    return _inv_matrix(int(n), torch.device(device))


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    return x.dtype if x.is_floating_point() else torch.float64


def _along(x64: torch.Tensor, dim: int, inverse: bool) -> torch.Tensor:
    """Transform a float64 tensor along ``dim`` (no dtype conversion)."""
    n = x64.shape[dim]
    if n == 0:
        return x64.clone()
    mat = _inv_matrix(n, x64.device) if inverse else _cos_matrix(n, x64.device)
    moved = x64.movedim(dim, -1)
    # forward: X_k = Σ_n M[k, n] x_n ; inverse: x_n = Σ_k W[k, n] X_k
    out = moved @ (mat if inverse else mat.T)
    return out.movedim(-1, dim)


def dct(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Unnormalised DCT-II of ``x`` along ``dim`` (= ``scipy.fft.dct(x, type=2) / 2``)."""
    return _along(x.to(torch.float64), dim, inverse=False).to(_out_dtype(x))


def idct(X: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Exact inverse of :func:`dct` along ``dim``."""
    return _along(X.to(torch.float64), dim, inverse=True).to(_out_dtype(X))


def dct2(x: torch.Tensor) -> torch.Tensor:
    """2-D DCT over the last two dimensions (along rows, then along columns)."""
    if x.dim() < 2:
        raise ValueError(f"dct2 needs at least 2 dimensions, got shape {tuple(x.shape)}")
    y = _along(_along(x.to(torch.float64), -1, inverse=False), -2, inverse=False)
    return y.to(_out_dtype(x))


def idct2(X: torch.Tensor) -> torch.Tensor:
    """Exact inverse of :func:`dct2`."""
    if X.dim() < 2:
        raise ValueError(f"idct2 needs at least 2 dimensions, got shape {tuple(X.shape)}")
    y = _along(_along(X.to(torch.float64), -1, inverse=True), -2, inverse=True)
    return y.to(_out_dtype(X))
