"""Unpaired IV estimators (SplitUP and the baselines): pure numpy / scipy.

Two independent samples share the environments (a one-hot instrument): the X-sample gives
``(env, X)`` and the Y-sample ``(env, Y)``. Everything is computed from per-environment sums
formed by scatter-add over the environment index (``np.bincount`` with weights); the one-hot
instrument matrix is never materialised.

Notation, after :func:`prepare` dropped unusable environments and centred X̃ and Y by
their own sample means: ``S_e = Σ_{j∈e} X̃_j`` (X-sample), ``T_e = Σ_{i∈e} Y_i`` (Y-sample),
``r_e``/``n_e`` the unit counts, ``m`` environments, ``ñ``/``n`` units. Then

* ``C_XY = m B̂ᵀ W â = (m/(ñ n)) Σ_e w_e S_e T_e``
* split form:    ``C_XX = m K/((K−1) ñ²) · mean_h Σ_e w_e (S_e S_eᵀ − Σ_k S_{e,k} S_{e,k}ᵀ)``
* analytic form: ``C_XX = (m/ñ²) Σ_e w_e r_e/(r_e−1) (S_e S_eᵀ − Σ_{j∈e} X̃_j X̃_jᵀ)``

(the split form is the paper's ``m/[K(K−1)] Σ_{h≠k} B̂_hᵀ W B̂_k`` with ``B̂_h = (K/ñ) Σ_{j∈h}``).
Both are sums of per-environment terms, which is what the standard error uses.

Standard errors (crossfold rows). ``β̂ − β* = C_XX⁻¹ Σ_e ψ_e(β*)`` exactly, with
``ψ_e(β) = b_e − A_e β`` the environment's contribution to ``C_XY − C_XX β``. Environments are
independent (the two samples are independent, environments are drawn i.i.d., the fold splits are
stratified within environment) and ``E ψ_e(β*) = 0`` because both moments are unbiased. So the
environment-clustered sandwich ``V̂ = m/(m−d) · C_XX⁻¹ (Σ_e ψ̂_e ψ̂_eᵀ) C_XX⁻ᵀ`` with
``ψ̂_e = ψ_e(β̂)`` is a consistent delta-method variance as m → ∞ at fixed r. It includes the
extra noise of the finite number of random splits (the ψ_e are those of the estimator actually
used). For the ℓ1 row the same sandwich is taken on the selected support (naive post-selection
inference: it is conditional on Ŝ and zero off Ŝ).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import numpy as np
from scipy import linalg as sla

Weight = Literal["identity", "optimal"]
F = TypeVar("F", bound=Callable[..., Any])
_LOCAL = threading.local()
_CONTROLLER: Any = None


def one_blas_thread(fn: F) -> F:
    """Run ``fn`` with numpy/scipy's BLAS limited to one thread.

    The products here are small (d × m times m × d); a multi-threaded OpenBLAS gains nothing on
    them and, on a loaded machine (a Ray worker per core, or a test run beside other jobs), its
    spinning threads made one SplitUP fit 30× slower. Re-entrant calls skip the switch.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        global _CONTROLLER
        if getattr(_LOCAL, "limited", False):
            return fn(*args, **kwargs)
        if _CONTROLLER is None:
            from threadpoolctl import ThreadpoolController

            _CONTROLLER = ThreadpoolController()
        _LOCAL.limited = True
        try:
            with _CONTROLLER.limit(limits=1, user_api="blas"):
                return fn(*args, **kwargs)
        finally:
            _LOCAL.limited = False

    return wrapper  # type: ignore[return-value]


class EstimationError(ValueError):
    """The data do not identify the estimate (too few environments, singular C_XX)."""


# --------------------------------------------------------------------------- data preparation


def env_sum(env: np.ndarray, values: np.ndarray, m: int) -> np.ndarray:
    """Per-environment sums by scatter-add: ``out[e] = Σ_{i: env_i = e} values_i``.

    ``values`` is ``(n,)`` or ``(n, d)``; the result is ``(m,)`` or ``(m, d)``.
    """
    if values.ndim == 1:
        return np.bincount(env, weights=values, minlength=m)
    out = np.empty((m, values.shape[1]))
    for k in range(values.shape[1]):
        out[:, k] = np.bincount(env, weights=values[:, k], minlength=m)
    return out


@dataclass
class Prepared:
    """Two unpaired samples on a common environment index ``0..m-1`` (units of dropped
    environments removed), each centred by its own sample mean."""

    x_env: np.ndarray  # (ñ,) int
    x: np.ndarray  # (ñ, d)
    y_env: np.ndarray  # (n,) int
    y: np.ndarray  # (n,)
    m: int
    r_x: np.ndarray  # (m,) X-sample units per environment
    n_y: np.ndarray  # (m,) Y-sample units per environment
    used: np.ndarray  # (m,) original codes of the used environments
    dropped: list[int] = field(default_factory=list)  # original codes dropped
    x_latent: np.ndarray | None = None  # (n, d): the Y-sample's X, for the paired oracles only

    @property
    def d(self) -> int:
        return self.x.shape[1]

    @property
    def n_x(self) -> int:
        return self.x.shape[0]

    @property
    def n(self) -> int:
        return self.y.shape[0]

    def subset(self, envs: np.ndarray) -> Prepared:
        """The environments ``envs`` (new codes) only; centring is kept as it is."""
        keep = np.zeros(self.m, bool)
        keep[envs] = True
        new = np.full(self.m, -1)
        new[keep] = np.arange(int(keep.sum()))
        xm, ym = keep[self.x_env], keep[self.y_env]
        return Prepared(
            x_env=new[self.x_env[xm]],
            x=self.x[xm],
            y_env=new[self.y_env[ym]],
            y=self.y[ym],
            m=int(keep.sum()),
            r_x=self.r_x[keep],
            n_y=self.n_y[keep],
            used=self.used[keep],
            x_latent=None if self.x_latent is None else self.x_latent[ym],
        )


def prepare(
    x_env: np.ndarray,
    x: np.ndarray,
    y_env: np.ndarray,
    y: np.ndarray,
    x_latent: np.ndarray | None = None,
    min_r: int = 2,
) -> Prepared:
    """Keep the environments present in both samples with ``r_e >= min_r`` X-sample units,
    re-index them ``0..m-1`` and centre X̃ and Y (and the oracle's latent X) by their own means.

    ``x_env``/``y_env`` are non-negative integer codes (the caller maps labels to codes).
    """
    x_env = np.asarray(x_env, dtype=np.int64)
    y_env = np.asarray(y_env, dtype=np.int64)
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if x_env.shape[0] != x.shape[0] or y_env.shape[0] != y.shape[0]:
        raise ValueError("env codes and samples differ in length")
    if (x_env.size and x_env.min() < 0) or (y_env.size and y_env.min() < 0):
        raise ValueError("env codes must be non-negative")
    n_codes = int(max(x_env.max(initial=-1), y_env.max(initial=-1)) + 1)
    r_x = np.bincount(x_env, minlength=n_codes)
    n_y = np.bincount(y_env, minlength=n_codes)
    keep = (r_x >= min_r) & (n_y >= 1)
    dropped = np.flatnonzero(((r_x > 0) | (n_y > 0)) & ~keep).tolist()
    m = int(keep.sum())
    new = np.full(n_codes, -1, dtype=np.int64)
    new[keep] = np.arange(m)
    xm, ym = keep[x_env], keep[y_env]
    x, y = x[xm], y[ym]
    x = x - x.mean(0) if x.shape[0] else x
    y = y - y.mean() if y.shape[0] else y
    lat = None
    if x_latent is not None:
        lat = np.asarray(x_latent, dtype=np.float64).reshape(len(ym), -1)[ym]
        lat = lat - lat.mean(0) if lat.shape[0] else lat
    return Prepared(
        x_env=new[x_env[xm]],
        x=x,
        y_env=new[y_env[ym]],
        y=y,
        m=m,
        r_x=r_x[keep],
        n_y=n_y[keep],
        used=np.flatnonzero(keep),
        dropped=dropped,
        x_latent=lat,
    )


def stratified_folds(env: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Fold of every unit, split within each environment: a random order inside the environment,
    fold = (rank + a random per-environment offset) mod K. Every fold of an environment with
    ``r_e >= K`` units is non-empty, and fold sizes differ by at most one."""
    n = env.shape[0]
    order = np.argsort(env + rng.random(n), kind="stable")  # by env, random within env
    se = env[order]
    rank = np.arange(n) - np.searchsorted(se, se, side="left")
    offset = rng.integers(0, k, size=int(env.max(initial=-1)) + 1)
    folds = np.empty(n, dtype=np.int64)
    folds[order] = (rank + offset[se]) % k
    return folds


# --------------------------------------------------------------------------- moments


@dataclass
class Moments:
    """``C_XX``, ``C_XY`` and what is needed for per-environment contributions ψ_e(β)."""

    cxx: np.ndarray  # (d, d)
    cxy: np.ndarray  # (d,)
    prep: Prepared
    kind: str  # "split" | "analytic" | "two_sample"
    w: np.ndarray  # (m,) environment weights (mean 1)
    S: np.ndarray  # (m, d) X-sample sums
    T: np.ndarray  # (m,) Y-sample sums
    fold_sums: list[np.ndarray] = field(default_factory=list)  # H arrays (m, K, d)
    folds: int = 2

    @property
    def m(self) -> int:
        return self.prep.m

    def psi(self, beta: np.ndarray, idx: np.ndarray | None = None) -> np.ndarray:
        """``(m, d)``: each environment's contribution to ``C_XY − C_XX β`` (restricted to the
        coordinates ``idx`` with β zero elsewhere when ``idx`` is given)."""
        p = self.prep
        S, T, w = self.S, self.T, self.w
        full = np.zeros(S.shape[1])
        if idx is None:
            full[:] = beta
        else:
            full[idx] = beta
        b = (p.m / (p.n_x * p.n)) * (w * T)[:, None] * S
        Sb = S @ full
        if self.kind == "analytic":
            xb = p.x @ full
            inner = env_sum(p.x_env, p.x * xb[:, None], p.m)
            r = p.r_x.astype(float)
            Ab = (p.m / p.n_x**2) * (w * r / (r - 1))[:, None] * (S * Sb[:, None] - inner)
        elif self.kind == "split":
            k = self.folds
            acc = np.zeros_like(S)
            for fs in self.fold_sums:  # (m, K, d)
                acc += S * Sb[:, None] - np.einsum("mkd,mk->md", fs, fs @ full)
            wx = w * split_correction(p.r_x, k)
            Ab = (p.m * k / ((k - 1) * p.n_x**2)) * wx[:, None] * acc / len(self.fold_sums)
        else:  # two-sample: m B̂ᵀ W B̂
            Ab = (p.m / p.n_x**2) * w[:, None] * S * Sb[:, None]
        out = b - Ab
        return out if idx is None else out[:, idx]


def _weights(prep: Prepared, weight: Weight, beta0: np.ndarray | None) -> np.ndarray:
    """Environment weights, normalised to mean 1.

    ``identity``: all ones (the paper's unit weights). ``optimal``: 1/variance of each
    environment's moment ``â_e − B̂_e β``, ``v_e = n_e s²_{Y,e}/n² + r_e β̃ᵀ Σ̂_X β̃ / ñ²``, with the
    Y-part from the environment's own Y-sample variance (pooled when n_e < 2) and the X-part from
    the pooled within-environment covariance of the X-sample at a first-step estimate β̃ (the
    identity-weighted estimate). Estimating the X-part per environment would correlate the
    weights with the U-statistic in C_XX and bias it; the Y-sample variance is independent of the
    X-sample and (for Gaussian data) of the environment's Y mean.
    """
    if weight == "identity":
        return np.ones(prep.m)
    m = prep.m
    n_y = prep.n_y.astype(float)
    ty = env_sum(prep.y_env, prep.y, m)
    ty2 = env_sum(prep.y_env, prep.y**2, m)
    ss = ty2 - ty**2 / np.maximum(n_y, 1)
    dof = np.maximum(n_y - 1, 0)
    pooled_y = ss.sum() / max(dof.sum(), 1)
    s2y = np.where(n_y >= 2, ss / np.maximum(dof, 1), pooled_y)
    beta0 = np.zeros(prep.d) if beta0 is None else beta0
    xb = prep.x @ beta0
    r = prep.r_x.astype(float)
    sx = env_sum(prep.x_env, xb, m)
    ssx = env_sum(prep.x_env, xb**2, m) - sx**2 / r
    pooled_x = ssx.sum() / max((r - 1).sum(), 1)
    v = n_y * s2y / prep.n**2 + r * pooled_x / prep.n_x**2
    v = np.maximum(v, 1e-300)
    w = 1.0 / v
    return w / w.mean()


@one_blas_thread
def crossfold_moments(
    prep: Prepared,
    folds: int = 2,
    repeats: int = 10,
    analytic: bool = False,
    weight: Weight = "identity",
    rng: np.random.Generator | None = None,
    beta0: np.ndarray | None = None,
) -> Moments:
    """SplitUP's moments: C_XX from K stratified folds averaged over H random splits
    (or the analytic H → ∞ form), C_XY unsplit."""
    if prep.m < 1:
        raise EstimationError("no environment is shared by both samples with r_e >= 2")
    if folds < 2:
        raise ValueError("folds: must be >= 2")
    if not analytic and folds > int(prep.r_x.min()):
        raise ValueError(
            f"folds: {folds} folds but an environment has only {int(prep.r_x.min())} X-sample "
            "units; every fold needs a unit of every environment"
        )
    rng = np.random.default_rng(0) if rng is None else rng
    m, d = prep.m, prep.d
    S = env_sum(prep.x_env, prep.x, m)
    T = env_sum(prep.y_env, prep.y, m)
    if weight == "optimal" and beta0 is None:
        first = crossfold_moments(prep, folds, repeats, analytic, "identity", rng)
        beta0 = np.linalg.lstsq(first.cxx, first.cxy, rcond=None)[0]
    w = _weights(prep, weight, beta0)
    cxy = (m / (prep.n_x * prep.n)) * (S.T @ (w * T))
    fold_sums: list[np.ndarray] = []
    if analytic:
        r = prep.r_x.astype(float)
        we = w * r / (r - 1)
        inner = (prep.x * we[prep.x_env][:, None]).T @ prep.x
        cxx = (m / prep.n_x**2) * ((S * we[:, None]).T @ S - inner)
        kind = "analytic"
    else:
        wx = w * split_correction(prep.r_x, folds)
        acc = np.zeros((d, d))
        sws = (S * wx[:, None]).T @ S
        for _ in range(repeats):
            f = stratified_folds(prep.x_env, folds, rng)
            fs = env_sum(prep.x_env * folds + f, prep.x, m * folds).reshape(m, folds, d)
            fold_sums.append(fs)
            fw = (fs * np.sqrt(wx)[:, None, None]).reshape(m * folds, d)
            acc += sws - fw.T @ fw
        cxx = (m * folds / ((folds - 1) * prep.n_x**2)) * acc / repeats
        kind = "split"
    cxx = 0.5 * (cxx + cxx.T)
    return Moments(cxx, cxy, prep, kind, w, S, T, fold_sums, folds)


def split_correction(r: np.ndarray, k: int) -> np.ndarray:
    """Per-environment factor that keeps the split form unbiased when K does not divide r_e.

    A pair of units of environment e lands in different folds with probability
    ``P_e = 1 − Σ_h c_h(c_h − 1)/(r_e(r_e − 1))`` (fold sizes c_h = ⌊r_e/K⌋ or ⌈r_e/K⌉), so the
    paper's ``m/[K(K−1)] Σ_{h≠k} B̂_hᵀ B̂_k`` weights the pair products by ``K/(K−1)·P_e``, which
    equals the analytic ``r_e/(r_e − 1)`` exactly when K divides r_e (the factor is then 1, as in
    every generated setting) and is a little smaller otherwise (1.2 vs 1.25 at r_e = 5, K = 2).
    """
    r = r.astype(float)
    lo = np.floor(r / k)
    n_hi = r - lo * k  # folds with ⌈r/K⌉ units
    same = (n_hi * (lo + 1) * lo + (k - n_hi) * lo * (lo - 1)) / (r * (r - 1))
    corr = (r / (r - 1)) / (k / (k - 1) * (1.0 - same))
    return np.where(r % k == 0, 1.0, corr)  # exactly 1 when K divides r_e


@one_blas_thread
def two_sample_moments(prep: Prepared) -> Moments:
    """The two-sample IV moments ``m B̂ᵀB̂`` and ``m B̂ᵀâ`` (noise in B̂ multiplies itself)."""
    m = prep.m
    S = env_sum(prep.x_env, prep.x, m)
    T = env_sum(prep.y_env, prep.y, m)
    cxx = (m / prep.n_x**2) * (S.T @ S)
    cxy = (m / (prep.n_x * prep.n)) * (S.T @ T)
    return Moments(cxx, cxy, prep, "two_sample", np.ones(m), S, T)


# --------------------------------------------------------------------------- fits


@dataclass
class Fit:
    beta: np.ndarray
    se: np.ndarray | None = None
    support: np.ndarray | None = None  # indices, for the ℓ1 fits
    cond: float = float("nan")
    lam: float | None = None
    info: dict[str, Any] = field(default_factory=dict)


@one_blas_thread
def condition_number(c: np.ndarray) -> float:
    ev = np.abs(np.linalg.eigvalsh(0.5 * (c + c.T)))
    return float(ev.max() / ev.min()) if ev.min() > 0 else float("inf")


MAX_COND = 1e12


@one_blas_thread
def sandwich_se(mom: Moments, beta: np.ndarray, idx: np.ndarray | None = None) -> np.ndarray:
    """Environment-clustered delta-method standard errors (module docstring)."""
    c = mom.cxx if idx is None else mom.cxx[np.ix_(idx, idx)]
    k = c.shape[0]
    if k == 0:
        return np.zeros(0)
    psi = mom.psi(beta, idx)
    meat = psi.T @ psi * (mom.m / max(mom.m - k, 1))
    cinv = np.linalg.inv(c)
    v = cinv @ meat @ cinv.T
    return np.sqrt(np.maximum(np.diag(v), 0.0))


@one_blas_thread
def solve_dense(mom: Moments, se: bool = True, max_cond: float = MAX_COND) -> Fit:
    """``β̂ = C_XX⁻¹ C_XY``; a singular C_XX raises :class:`EstimationError` with its condition
    number rather than returning a garbage solve."""
    cond = condition_number(mom.cxx)
    if not np.isfinite(cond) or cond > max_cond:
        raise EstimationError(
            f"C_XX is singular (condition number {cond:.3g}): the environments do not identify "
            f"all {mom.cxx.shape[0]} coefficients"
        )
    beta = np.linalg.solve(mom.cxx, mom.cxy)
    return Fit(beta, sandwich_se(mom, beta) if se else None, None, cond)


@one_blas_thread
def psd_project(c: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """C projected onto the PSD cone, eigenvalues clipped at ``eps``."""
    ev, vec = np.linalg.eigh(0.5 * (c + c.T))
    return (vec * np.maximum(ev, eps)) @ vec.T


@one_blas_thread
def lasso_quadratic(
    c: np.ndarray,
    q: np.ndarray,
    lam: float,
    tol: float = 1e-10,
    max_iter: int = 20_000,
    beta0: np.ndarray | None = None,
    slow_after: int = 300,
) -> np.ndarray:
    """``argmin_β βᵀCβ − 2βᵀq + λ‖β‖₁`` by cyclic coordinate descent (C PSD, positive diagonal):
    ``β_j ← soft(q_j − Σ_{l≠j} C_jl β_l, λ/2) / C_jj`` until the largest change is below tol."""
    d = q.shape[0]
    beta = np.zeros(d) if beta0 is None else beta0.astype(float).copy()
    diag = np.diag(c).copy()
    if np.any(diag <= 0):
        raise EstimationError("the quadratic form has a non-positive diagonal entry")
    half = lam / 2.0
    grad = c @ beta  # maintained C β
    for it in range(max_iter):
        delta = 0.0
        for j in range(d):
            old = beta[j]
            rho = q[j] - grad[j] + diag[j] * old
            new = np.sign(rho) * max(abs(rho) - half, 0.0) / diag[j]
            if new != old:
                grad += c[:, j] * (new - old)
                beta[j] = new
                delta = max(delta, abs(new - old))
        if delta < tol:
            break
        if it % 25 == 24:  # try the exact solution on the current active set and signs
            exact = _active_set_solution(c, q, half, beta)
            if exact is not None:
                return exact
        if it + 1 >= slow_after:  # an ill-conditioned C: coordinate descent crawls
            path = lasso_homotopy(c, q, lam)
            if _kkt_ok(c, q, half, path):
                return path
            slow_after = max_iter
            obj = lambda b: float(b @ c @ b - 2 * b @ q + lam * np.abs(b).sum())  # noqa: E731
            if obj(path) < obj(beta):  # keep the better of the two approximate minimisers
                return path
    return beta


def _kkt_ok(c: np.ndarray, q: np.ndarray, half: float, beta: np.ndarray) -> bool:
    g = q - c @ beta
    act = beta != 0
    scale = half * 1e-6 + 1e-10
    on = np.all(np.abs(g[act] - half * np.sign(beta[act])) <= scale)
    return bool(on and np.all(np.abs(g[~act]) <= half + scale))


@one_blas_thread
def lasso_homotopy(c: np.ndarray, q: np.ndarray, lam: float) -> np.ndarray:
    """The same lasso solved exactly by the homotopy (LARS-lasso) path on the quadratic form,
    from μ = max|q| down to μ = λ/2 (μ: the common |q_j − (Cβ)_j| on the active set). Used when
    coordinate descent converges too slowly (C⁺ with eigenvalues near the floor)."""
    d = q.shape[0]
    target = lam / 2.0
    beta = np.zeros(d)
    corr = q.copy()
    mu = float(np.max(np.abs(corr)))
    if mu <= target:
        return beta
    active = [int(np.argmax(np.abs(corr)))]
    for _ in range(20 * d + 20):
        off = np.setdiff1d(np.arange(d), np.array(active))
        if off.size:  # numerical drift: an inactive coordinate already at the bound joins now
            viol = np.abs(corr[off]) - mu
            if viol.max() > 1e-12 * max(mu, 1.0):
                active.append(int(off[np.argmax(viol)]))
        a_idx = np.array(active)
        s = np.sign(corr[a_idx])
        try:
            v = np.linalg.solve(c[np.ix_(a_idx, a_idx)], s)
        except np.linalg.LinAlgError:
            break
        a = c[:, a_idx] @ v  # corr_j(t) = corr_j − t a_j as μ falls by t
        t_best, event = mu - target, None
        off = np.setdiff1d(np.arange(d), a_idx)
        for sign in (1.0, -1.0):  # corr_j − t a_j = ±(μ − t)
            den = a[off] - sign
            with np.errstate(divide="ignore", invalid="ignore"):
                t = (corr[off] - sign * mu) / den
            ok = np.isfinite(t) & (t > 1e-14) & (t < t_best)
            if ok.any():
                k = int(np.argmin(np.where(ok, t, np.inf)))
                t_best, event = float(t[k]), ("add", int(off[k]))
        with np.errstate(divide="ignore", invalid="ignore"):
            t = -beta[a_idx] / v
        ok = np.isfinite(t) & (t > 1e-14) & (t < t_best)
        if ok.any():
            k = int(np.argmin(np.where(ok, t, np.inf)))
            t_best, event = float(t[k]), ("drop", int(a_idx[k]))
        beta[a_idx] += t_best * v
        mu -= t_best
        if event is None:
            break
        if event[0] == "add":
            active.append(event[1])
        else:
            active.remove(event[1])
            beta[event[1]] = 0.0
        corr = q - c @ beta
    return beta


def _active_set_solution(
    c: np.ndarray, q: np.ndarray, half: float, beta: np.ndarray
) -> np.ndarray | None:
    """The lasso's exact minimiser if the current active set and signs are the optimal ones:
    ``β_A = C_AA⁻¹ (q_A − (λ/2) s_A)`` with unchanged signs and the KKT condition
    ``|q_j − (Cβ)_j| <= λ/2`` off A; ``None`` when the check fails."""
    act = np.flatnonzero(beta != 0)
    s = np.sign(beta[act])
    out = np.zeros_like(beta)
    if act.size:
        try:
            out[act] = np.linalg.solve(c[np.ix_(act, act)], q[act] - half * s)
        except np.linalg.LinAlgError:
            return None
        if np.any(np.sign(out[act]) != s):
            return None
    off = np.setdiff1d(np.arange(q.shape[0]), act)
    slack = np.abs(q[off] - c[off] @ out)
    if np.any(slack > half * (1 + 1e-9) + 1e-12):
        return None
    return out


def lam_rule(n_x: int, c: float = 20.0) -> float:
    """λ = c · 2/√ñ (40/√ñ at c = 20)."""
    return c * 2.0 / np.sqrt(n_x)


@one_blas_thread
def solve_l1(
    mom: Moments,
    lam: float,
    threshold: float = 1e-8,
    psd_eps: float = 1e-6,
    tol: float = 1e-10,
    se: bool = True,
) -> Fit:
    """ℓ1 fit on the PSD-projected quadratic form, support ``|β̂_j| > threshold``, refit
    ``β̂_Ŝ = C⁺[Ŝ,Ŝ]⁻¹ C_XY[Ŝ]`` (zero off Ŝ)."""
    cp = psd_project(mom.cxx, psd_eps)
    b = lasso_quadratic(cp, mom.cxy, lam, tol=tol)
    idx = np.flatnonzero(np.abs(b) > threshold)
    beta = np.zeros_like(b)
    s = None
    if idx.size:
        beta[idx] = np.linalg.solve(cp[np.ix_(idx, idx)], mom.cxy[idx])
        if se:
            s = np.zeros_like(b)
            s[idx] = sandwich_se(mom, beta[idx], idx)
    elif se:
        s = np.zeros_like(b)
    return Fit(beta, s, idx, condition_number(mom.cxx), lam, {"lasso": b})


@one_blas_thread
def select_lambda(
    prep: Prepared,
    folds: int,
    repeats: int,
    analytic: bool,
    rng: np.random.Generator,
    threshold: float = 1e-8,
    psd_eps: float = 1e-6,
    holdout: float = 0.2,
    steps: int = 11,
) -> float:
    """λ by held-out environments: fit on 80 % of the environments along
    ``λ_max·2^{-t}``, t = 0..10, and pick the λ whose refit has the smallest held-out moment
    residual ``‖â_val − B̂_val β‖²``."""
    perm = rng.permutation(prep.m)
    n_val = max(1, int(round(holdout * prep.m)))
    val, tr = np.sort(perm[:n_val]), np.sort(perm[n_val:])
    ptr, pval = prep.subset(tr), prep.subset(val)
    mom = crossfold_moments(ptr, folds, repeats, analytic, "identity", rng)
    a_val = env_sum(pval.y_env, pval.y, pval.m) / pval.n
    b_val = env_sum(pval.x_env, pval.x, pval.m) / pval.n_x
    lam_max = 2.0 * np.max(np.abs(mom.cxy)) + 1e-12
    best, best_lam = np.inf, lam_max
    for t in range(steps):
        lam = lam_max * 2.0**-t
        fit = solve_l1(mom, lam, threshold, psd_eps, se=False)
        res = float(np.sum((a_val - b_val @ fit.beta) ** 2))
        if res < best - 1e-15:
            best, best_lam = res, lam
    return best_lam


# --------------------------------------------------------------------------- baselines


def _solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    try:
        return np.linalg.solve(a, b)
    except np.linalg.LinAlgError:
        return np.linalg.lstsq(a, b, rcond=None)[0]


@one_blas_thread
def two_sample_2sls(prep: Prepared) -> np.ndarray:
    """First stage on the X-sample (environment means X̄_e), second stage on the Y-sample:
    ``β̂ = (Σ_i X̄_e X̄_eᵀ)⁻¹ Σ_i X̄_e Y_i``."""
    S = env_sum(prep.x_env, prep.x, prep.m)
    xbar = S / prep.r_x[:, None]
    T = env_sum(prep.y_env, prep.y, prep.m)
    return _solve((xbar * prep.n_y[:, None]).T @ xbar, xbar.T @ T)


@one_blas_thread
def split_sample_iv(prep: Prepared, rng: np.random.Generator) -> np.ndarray:
    """Split-sample IV carried to unpaired data (Angrist–Krueger's unbiased SSIV): one random
    half split of the X-sample within environment; first stage X̄ᴬ_e on half A, the other half's
    means X̄ᴮ_e in the denominator: ``β̂ = (Σ_e n_e X̄ᴬ_e X̄ᴮ_eᵀ)⁻¹ Σ_e X̄ᴬ_e T_e``. Consistent
    (independent halves), but it uses one split, one direction and half the X-sample in the
    numerator, so it is noisier than SplitUP."""
    m, d = prep.m, prep.d
    f = stratified_folds(prep.x_env, 2, rng)
    fs = env_sum(prep.x_env * 2 + f, prep.x, m * 2).reshape(m, 2, d)
    cnt = np.bincount(prep.x_env * 2 + f, minlength=m * 2).reshape(m, 2).astype(float)
    xa, xb = fs[:, 0] / cnt[:, :1], fs[:, 1] / cnt[:, 1:]
    T = env_sum(prep.y_env, prep.y, m)
    return _solve((xa * prep.n_y[:, None]).T @ xb, xa.T @ T)


def _latent(prep: Prepared) -> np.ndarray:
    if prep.x_latent is None:
        raise ValueError("the paired oracles need the Y-sample's latent X")
    return prep.x_latent


@one_blas_thread
def oracle_paired_2sls(prep: Prepared) -> np.ndarray:
    """Paired 2SLS with the m environment dummies on the Y-sample with its latent X revealed:
    ``β̂ = (Σ_i X̄_e X_iᵀ)⁻¹ Σ_i X̄_e Y_i`` (equals linearmodels' IV2SLS with const + m−1 dummies)."""
    L = _latent(prep)
    SL = env_sum(prep.y_env, L, prep.m)
    T = env_sum(prep.y_env, prep.y, prep.m)
    n = prep.n_y.astype(float)[:, None]
    return _solve((SL / n).T @ SL, (SL / n).T @ T)


@one_blas_thread
def jive_paired(prep: Prepared) -> np.ndarray:
    """Paired jackknife IV (JIVE1, leave-one-out environment means) on the oracle's data:
    ``β̂ = (Σ_i X̂_{−i} X_iᵀ)⁻¹ Σ_i X̂_{−i} Y_i`` with ``X̂_{−i} = (S_e − X_i)/(n_e − 1)``. The
    leave-one-out first stage removes the many-instrument bias of paired 2SLS."""
    L = _latent(prep)
    m = prep.m
    SL = env_sum(prep.y_env, L, m)
    T = env_sum(prep.y_env, prep.y, m)
    n = prep.n_y.astype(float)
    inv = np.where(n >= 2, 1.0 / np.maximum(n - 1, 1), 0.0)
    a = (SL * inv[:, None]).T @ SL - (L * inv[prep.y_env][:, None]).T @ L
    b = (SL * inv[:, None]).T @ T - (L * inv[prep.y_env][:, None]).T @ prep.y
    return _solve(a, b)


@one_blas_thread
def liml_paired(prep: Prepared) -> np.ndarray:
    """Paired LIML with the environment dummies (const as exogenous regressor), closed form:
    κ = smallest root of det(WᵀW − κ WᵀM_Z W) = 0 for W = [Y, X] centred (M_Z: within-
    environment residuals), ``β̂ = (XᵀX − κ XᵀM_Z X)⁻¹ (XᵀY − κ XᵀM_Z Y)``."""
    L = _latent(prep)
    W = np.column_stack([prep.y, L])
    SW = env_sum(prep.y_env, W, prep.m)
    n = prep.n_y.astype(float)
    wtw = W.T @ W
    within = wtw - (SW / n[:, None]).T @ SW
    kappa = float(sla.eigh(wtw, within, eigvals_only=True)[0])
    a = wtw[1:, 1:] - kappa * within[1:, 1:]
    b = wtw[1:, 0] - kappa * within[1:, 0]
    return _solve(a, b)


# --------------------------------------------------------------------------- metrics


def support_f1(pred: np.ndarray, true: np.ndarray) -> float:
    """F1 = 2TP/(2TP + FP + FN) of two boolean masks (1 when both are empty)."""
    tp = int(np.sum(pred & true))
    fp = int(np.sum(pred & ~true))
    fn = int(np.sum(~pred & true))
    den = 2 * tp + fp + fn
    return 1.0 if den == 0 else 2 * tp / den
