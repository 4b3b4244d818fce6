"""Closed-form references of the paper's analysis, in float64 NumPy. Used by tests and as the
reference lines of ``experiments()``; training never reads them.

Notation: ``D = d + 2``; a token is ``[1, x, y]``; ``M = QᵀK``; ``v`` is V's last row
``[v_1, v_x, v_y]``; for a prompt of n demonstrations ``ŷ = z_qᵀ M S v`` with
``S = Σ_m z_m z_mᵀ / (n+1)`` over all n+1 tokens. x ~ N(0, I_d), y = θᵀx + ε, ε ~ N(0, σ²).

Two families have exact test errors (derived here, checked by Monte Carlo in the tests):

* the *V-family*: ``M = α·I`` on the x–x block and 0 elsewhere, ``v_1 = 0``. With
  ``g = α v_x`` and ``w = α v_y``, ``ŷ = x_qᵀ[(x_q x_qᵀ + Σ_i x_i x_iᵀ) g + w Σ_i y_i x_i]/(n+1)``.
  It contains the pretrained optimum (g = 0, w = c) and the V-only ZS optimum (g = θ0/(d+4)).
  With ``u = g + wθ``, ``T = (n+1)ŷ``::

      E[T²]   = (d+2)(d+4)‖g‖² + 2n(d+2) gᵀu + n[(d+2)‖u‖² + w²σ²d] + n(n−1)‖u‖²
      E[T y]  = (d+2) θᵀg + n θᵀu
      MSE(n)  = E[T²]/(n+1)² − 2 E[T y]/(n+1) + ‖θ‖² + σ²

* the *all-parameter ZS family* (indexed by c > 0): ``M = e_0 e_0ᵀ / c``, ``v = [0, cθ0, 1]``,
  ``ŷ = (θ0ᵀx_q + Σ_i (θ0ᵀx_i + y_i/c))/(n+1)``::

      MSE(n) = (‖θ0‖² + n(‖θ0 + θ/c‖² + σ²/c²))/(n+1)² − 2 θ0ᵀθ/(n+1) + ‖θ‖² + σ²

The pretraining optimum in the V-family is ``w = c* = (N+1)/(N+1+d(1+σ²))`` (0.792 for d = 5,
N = 20, σ² = 0.1): it depends on θ only through E[θθᵀ] = I/d, so it holds for both task
distributions. The often-quoted coefficient ``a = N/(N+1+d)`` (0.769), the optimum of the 1/N-normalised,
noise-free model; its parameters produce the prediction ``a/(n+1)·Σ y_i x_iᵀ x_q`` exactly,
and its error at n = 20 differs from the optimum's by < 0.001.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

Array = np.ndarray


def spec_a(d: int, n_pt: int) -> float:
    """The often-quoted pretrained coefficient ``a = N/(N+1+d)`` (1/N normalisation, no noise)."""
    return n_pt / (n_pt + 1 + d)


def pretrained_coef(d: int, n_pt: int, sigma2: float) -> float:
    """The exact pretraining optimum ``c*`` of the (n+1)-normalised model with label noise."""
    return (n_pt + 1) / (n_pt + 1 + d * (1 + sigma2))


def pretrained_params(d: int, a: float) -> tuple[Array, Array, Array]:
    """Q, K, V with ``QᵀK`` = a·I on the x–x block (0 elsewhere) and ``V[d+1, d+1] = 1``."""
    D = d + 2
    Q = np.zeros((D, D))
    Q[1 : d + 1, 1 : d + 1] = np.eye(d)
    K = a * Q
    V = np.zeros((D, D))
    V[d + 1, d + 1] = 1.0
    return Q, K, V


def zs_all_params(theta0: Array, c: float) -> tuple[Array, Array, Array]:
    """A member of the all-parameter ZS optimum family: ``(QᵀK)[0,0] = 1/c``, ``v = [0, cθ0, 1]``."""
    d = len(theta0)
    D = d + 2
    Q = np.zeros((D, D))
    Q[0, 0] = 1.0
    K = Q / c
    V = np.zeros((D, D))
    V[d + 1, 1 : d + 1] = c * np.asarray(theta0, float)
    V[d + 1, d + 1] = 1.0
    return Q, K, V


def vonly_zs_params(theta0: Array, a: float, w: float = 1.0) -> tuple[Array, Array, Array]:
    """V-only ZS optimum: Q, K pretrained (scale a), ``a·v_x = θ0/(d+4)``, ``v_y = w``."""
    d = len(theta0)
    Q, K, V = pretrained_params(d, a)
    V[d + 1, 1 : d + 1] = np.asarray(theta0, float) / ((d + 4) * a)
    V[d + 1, d + 1] = w
    return Q, K, V


def predict(Q: Array, K: Array, V: Array, Z: Array) -> Array:
    """Reference forward (float64): ``Out = Z + (ZQᵀ)(ZKᵀ)ᵀ(ZVᵀ)/(n+1)``; returns ``Out[:, -1, -1]``."""
    Z = np.asarray(Z, float)
    L = Z.shape[-2]
    out = Z + (Z @ Q.T) @ np.swapaxes(Z @ K.T, -1, -2) @ (Z @ V.T) / L
    return out[:, -1, -1]


def err_vfamily(n: int, theta: Array, g: Array, w: float, sigma2: float) -> float:
    """Exact test MSE at n demonstrations of the V-family model ``(g, w)`` on task ``theta``."""
    theta = np.asarray(theta, float)
    g = np.asarray(g, float) * np.ones_like(theta)
    d = len(theta)
    u = g + w * theta
    ET2 = (
        (d + 2) * (d + 4) * (g @ g)
        + 2 * n * (d + 2) * (g @ u)
        + n * ((d + 2) * (u @ u) + w * w * sigma2 * d)
        + n * (n - 1) * (u @ u)
    )
    ETy = (d + 2) * (theta @ g) + n * (theta @ u)
    return float(ET2 / (n + 1) ** 2 - 2 * ETy / (n + 1) + theta @ theta + sigma2)


def err_pretrained(n: int, d: int, c: float, sigma2: float, t: float = 1.0) -> float:
    """MSE of ``ŷ = c/(n+1)·Σ y_i x_iᵀx_q`` on any task of squared norm ``t``."""
    theta = np.zeros(d)
    theta[0] = np.sqrt(t)
    return err_vfamily(n, theta, np.zeros(d), c, sigma2)


def err_zs_all(n: int, theta: Array, theta0: Array, c: float, sigma2: float) -> float:
    """Exact test MSE at n demonstrations of the all-parameter ZS family member ``c``."""
    theta, theta0 = np.asarray(theta, float), np.asarray(theta0, float)
    s = theta0 + theta / c
    ET2 = theta0 @ theta0 + n * (s @ s + sigma2 / c**2)
    return float(ET2 / (n + 1) ** 2 - 2 * (theta0 @ theta) / (n + 1) + theta @ theta + sigma2)


def vonly_zs_floor(d: int, sigma2: float, t: float = 1.0) -> float:
    """The V-only ZS error floor ``2‖θ0‖²/(d+4) + σ²`` (0.322 for d = 5, unit θ0, σ² = 0.1)."""
    return 2 * t / (d + 4) + sigma2


def vonly_fs_optimum(d: int, n_fs: int, sigma2: float, lam: float) -> tuple[float, float]:
    """``(γ, w)`` minimising ``L_ZS + λ·L_FS(n_fs)`` over the V-family with ``g = γθ0``
    (unit θ0): where the auxiliary FS loss pulls the ICL weight w at constant weight λ."""
    theta = np.zeros(d)
    theta[0] = 1.0

    def f(z: Array) -> float:
        g = z[0] * theta
        return err_vfamily(0, theta, g, z[1], sigma2) + lam * err_vfamily(
            n_fs, theta, g, z[1], sigma2
        )

    z = _quadratic_argmin(f, 2)
    return float(z[0]), float(z[1])


def _quadratic_argmin(f: Callable[[Array], float], k: int) -> Array:
    """Exact minimiser of a quadratic function of k variables from its values."""
    e = np.eye(k)
    f0 = f(np.zeros(k))
    H = np.empty((k, k))
    grad = np.empty(k)
    for i in range(k):
        grad[i] = (f(e[i]) - f(-e[i])) / 2
        for j in range(k):
            H[i, j] = f(e[i] + e[j]) - f(e[i]) - f(e[j]) + f0
    return np.linalg.solve(H, -grad)


def reference_curves(
    d: int, n_pt: int, sigma2: float, ns: Iterable[int], t: float = 1.0
) -> dict[str, dict[str, dict[int, float]]]:
    """Closed-form error curves (target θ0 and unseen −θ0, ‖θ0‖² = t) of the pretrained
    optimum and of the V-only ZS optimum (w kept at the pretrained c*)."""
    c = pretrained_coef(d, n_pt, sigma2)
    theta0 = np.zeros(d)
    theta0[0] = np.sqrt(t)
    g = theta0 / (d + 4)
    out: dict[str, dict[str, dict[int, float]]] = {}
    for name, (gg, w) in {"pretrained_optimum": (0 * g, c), "vonly_zs_optimum": (g, c)}.items():
        out[name] = {
            "target": {n: err_vfamily(n, theta0, gg, w, sigma2) for n in ns},
            "unseen": {n: err_vfamily(n, -theta0, gg, w, sigma2) for n in ns},
        }
    return out
