"""BoTorch integration of the TNP surrogate.

:class:`TNPModel` wraps a trained, frozen :class:`~.model.TNP` with a fixed few-shot context as a
``botorch.models.model.Model``. Its posterior is in **raw f units** (the TNP's z-scored ``μ, σ``
mapped back with the family stats: ``mean = f_mean + f_std·μ``, ``variance = (f_std·σ)²``), so
``best_f`` and ``ξ`` are raw-unit values too (e.g. the best observed accuracy plus 0.01). Every
query point is an independent TNP target (the TNP-D mask makes targets independent), so the
covariance over a q-batch is diagonal and a point's posterior never depends on the other points.

Proposals:

* :func:`propose_discrete` — PI over a discrete candidate set with
  ``ProbabilityOfImprovement(best_f = f_best + ξ)`` evaluated in float64 (BoTorch's ``Phi`` is
  ``ndtr``), already-evaluated candidates excluded, exact ties broken by the posterior mean. The
  argmax is taken directly (not ``optimize_acqf_discrete``) because the tie-break by μ needs both
  PI and μ per candidate; ``optimize_acqf_discrete`` would return the first maximiser.
* :func:`propose_continuous` — ``optimize_acqf`` over ``[0, 1]^D``. It maximises
  ``LogProbabilityOfImprovement`` (same maximiser as PI, but gradients do not vanish where PI
  underflows).
* :func:`gp_propose_continuous` / :func:`gp_propose_discrete` — the GP fallback
  (``SingleTaskGP`` + ``LogExpectedImprovement``) used when no TNP checkpoint fits.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from botorch.acquisition.analytic import (
    LogExpectedImprovement,
    LogProbabilityOfImprovement,
    ProbabilityOfImprovement,
)
from botorch.exceptions.errors import ModelFittingError
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.model import Model
from botorch.optim import optimize_acqf
from botorch.posteriors.gpytorch import GPyTorchPosterior
from gpytorch.distributions import MultivariateNormal
from gpytorch.mlls import ExactMarginalLogLikelihood
from linear_operator.operators import DiagLinearOperator
from linear_operator.utils.errors import NanError, NotPSDError
from torch import Tensor

from .model import TNP, normalise_h

__all__ = [
    "TNPModel",
    "fit_gp",
    "gp_propose_continuous",
    "gp_propose_discrete",
    "propose_continuous",
    "propose_discrete",
    "single_thread",
    "FIT_ERRORS",
    "standardise",
]


FIT_ERRORS = (ModelFittingError, NotPSDError, NanError)  # GP fits that fail on degenerate data


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """``torch.set_num_threads(1)`` for the block (GP fitting is faster with one thread)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _pad_h(
    h: Tensor | np.ndarray | None, h_mask: Tensor | np.ndarray | None, n: int, t_h: int, d_h: int
) -> np.ndarray:
    """Raw ``h [n, T, d_h]`` (``[n, T]``: one channel) -> ``[n, t_h, d_h]`` float32 with NaN
    frames as padding (frames with ``h_mask`` False become NaN too); ``None`` -> all padding."""
    out = np.full((n, t_h, d_h), np.nan, np.float32)
    if h is None:
        return out
    arr = h.detach().cpu().numpy() if torch.is_tensor(h) else np.asarray(h)
    arr = arr.astype(np.float32)
    if arr.ndim == 2:
        arr = arr[..., None]
    if arr.ndim != 3 or arr.shape[0] != n or arr.shape[2] != d_h or arr.shape[1] > t_h:
        raise ValueError(f"h has shape {tuple(arr.shape)}; expected [{n}, T <= {t_h}, {d_h}]")
    if h_mask is not None:
        hm = h_mask.detach().cpu().numpy() if torch.is_tensor(h_mask) else np.asarray(h_mask)
        arr = np.where(hm.astype(bool).reshape(arr.shape[:2])[..., None], arr, np.nan)
    out[:, : arr.shape[1]] = arr
    return out


# ----------------------------------------------------------------------------------------------
# the TNP as a BoTorch model


class TNPModel(Model):
    """A frozen TNP with a fixed context as a single-output BoTorch model (raw f units).

    ``X [n, D]`` in ``[0, 1]^D``, ``f [n]`` raw, ``h [n, T, d_h]`` raw (``T ≤ T_h``; non-finite
    frames, or frames with ``h_mask`` False, are padding; ``None`` for an f-only TNP). The TNP
    is put in eval mode and is *not* registered as a submodule, so acquisition functions that
    call ``.to(X)`` (float64) never cast the shared network: queries are cast to float32 for
    the TNP and the outputs back to the query dtype (gradients flow through both casts).
    """

    _num_outputs = 1

    def __init__(
        self,
        tnp: TNP,
        stats: dict[str, Any],
        X: Tensor | np.ndarray,
        f: Tensor | np.ndarray,
        h: Tensor | np.ndarray | None = None,
        h_mask: Tensor | np.ndarray | None = None,
        max_targets: int = 512,
    ) -> None:
        super().__init__()
        tnp.eval()
        self._net = (tnp,)  # a tuple: not registered, so never cast or returned by parameters()
        self.stats = dict(stats)
        self.max_targets = int(max_targets)
        cfg = tnp.cfg
        X = torch.as_tensor(np.asarray(X, dtype=np.float32) if not torch.is_tensor(X) else X)
        X = X.detach().to(torch.float32).reshape(-1, cfg.x_dim)
        f = torch.as_tensor(np.asarray(f, dtype=np.float64) if not torch.is_tensor(f) else f)
        f = f.detach().to(torch.float64).reshape(-1)
        n = X.shape[0]
        if f.shape[0] != n:
            raise ValueError(f"context has {n} designs but {f.shape[0]} f values")
        if not torch.isfinite(f).all() or not torch.isfinite(X).all():
            raise ValueError("context X and f must be finite")
        self.train_X, self.train_f = X, f
        # h: raw copy kept for with_context, normalised + padded to T_h for the TNP
        t_h, d_h = cfg.h_len, cfg.h_dim
        if h is None and cfg.use_h and n:
            raise ValueError("this TNP uses h (use_h=True): pass h for the context")
        raw_h = _pad_h(h, h_mask, n, t_h, d_h)
        self.train_h = raw_h
        hz, hm = normalise_h(raw_h, self.stats)
        self._hc = torch.from_numpy(hz)
        self._h_mask = torch.from_numpy(hm)
        self._fc = ((f - self.stats["f_mean"]) / self.stats["f_std"]).to(torch.float32)

    @property
    def tnp(self) -> TNP:
        return self._net[0]

    @property
    def num_outputs(self) -> int:
        return 1

    @property
    def batch_shape(self) -> torch.Size:
        return torch.Size([])

    @property
    def best_f(self) -> float:
        """Best raw f in the context (``-inf`` for an empty context)."""
        return float(self.train_f.max()) if self.train_f.numel() else -math.inf

    def predict_z(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """``X [M, D]`` -> ``(μ [M], σ [M])`` in z units, float32, chunked over targets."""
        net = self.tnp
        p = next(net.parameters())
        xc = self.train_X.to(p)[None]
        fc = self._fc.to(p)[None]
        hc = self._hc.to(p)[None] if net.cfg.use_h else None
        hm = self._h_mask.to(p.device)[None]
        mus, sigmas = [], []
        for start in range(0, X.shape[0], self.max_targets):
            xt = X[start : start + self.max_targets].to(p)[None]
            mu, sigma = net(xc, fc, hc, xt, None, hm)
            mus.append(mu[0])
            sigmas.append(sigma[0])
        if not mus:
            empty = X.new_zeros(0, dtype=p.dtype)
            return empty, empty
        return torch.cat(mus), torch.cat(sigmas)

    def posterior(
        self,
        X: Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool | Tensor = False,
        posterior_transform: Any = None,
        **kwargs: Any,
    ) -> GPyTorchPosterior:
        """``X [..., q, D]`` -> ``GPyTorchPosterior`` over ``[..., q, 1]`` with a diagonal
        ``MultivariateNormal`` in raw f units. ``observation_noise`` is accepted and ignored:
        the TNP is trained on noisy f, so σ already predicts an observation."""
        if output_indices is not None and list(output_indices) != [0]:
            raise ValueError(f"TNPModel has one output; got output_indices={output_indices}")
        if X.dim() < 2 or X.shape[-1] != self.tnp.cfg.x_dim:
            raise ValueError(
                f"X must have shape [..., q, {self.tnp.cfg.x_dim}], got {tuple(X.shape)}"
            )
        lead = X.shape[:-1]
        mu, sigma = self.predict_z(X.reshape(-1, X.shape[-1]))
        mu = mu.to(X.dtype).reshape(lead)
        sigma = sigma.to(X.dtype).reshape(lead)
        mean = self.stats["f_mean"] + self.stats["f_std"] * mu
        var = (self.stats["f_std"] * sigma) ** 2
        posterior = GPyTorchPosterior(MultivariateNormal(mean, DiagLinearOperator(var)))
        if posterior_transform is not None:
            return posterior_transform(posterior)
        return posterior

    def with_context(
        self,
        X: Tensor | np.ndarray,
        f: Tensor | np.ndarray,
        h: Tensor | np.ndarray | None = None,
        h_mask: Tensor | np.ndarray | None = None,
    ) -> TNPModel:
        """A new model whose context is this one's plus ``(X [k, D], f [k], h [k, T, d_h])``."""
        k = int(np.asarray(f).size if not torch.is_tensor(f) else f.numel())
        X_new = torch.as_tensor(np.asarray(X, np.float32) if not torch.is_tensor(X) else X)
        X_new = X_new.detach().to(torch.float32).reshape(k, self.tnp.cfg.x_dim)
        f_new = torch.as_tensor(np.asarray(f, np.float64) if not torch.is_tensor(f) else f)
        f_new = f_new.detach().to(torch.float64).reshape(k)
        t_h, d_h = self.tnp.cfg.h_len, self.tnp.cfg.h_dim
        if h is None and self.tnp.cfg.use_h and k:
            raise ValueError("this TNP uses h (use_h=True): pass h for the new context")
        h_new = _pad_h(h, h_mask, k, t_h, d_h)
        return TNPModel(
            self.tnp,
            self.stats,
            torch.cat([self.train_X, X_new]),
            torch.cat([self.train_f, f_new]),
            np.concatenate([self.train_h, h_new]),
            max_targets=self.max_targets,
        )

    def condition_on_observations(self, X: Tensor, Y: Tensor, **kwargs: Any) -> TNPModel:
        """BoTorch spelling of :meth:`with_context`: ``Y [k, 1]`` raw f, ``h=`` keyword."""
        return self.with_context(X, Y.reshape(-1), kwargs.get("h"), kwargs.get("h_mask"))


# ----------------------------------------------------------------------------------------------
# proposals with the TNP


@torch.no_grad()
def acquisition_values(
    model: TNPModel, candidates: Tensor, best_f: float, xi: float = 0.01
) -> tuple[Tensor, Tensor]:
    """``(PI [N], μ [N])`` in float64 for ``candidates [N, D]`` (raw units)."""
    cand = candidates.to(torch.float64)
    acq = ProbabilityOfImprovement(model, best_f=float(best_f) + float(xi))
    pi = acq(cand.unsqueeze(-2))
    mean = model.posterior(cand).mean.reshape(-1)
    return pi, mean


def argmax_tiebreak(primary: Tensor, secondary: Tensor) -> int:
    """Index of the largest ``primary``; exact ties broken by the largest ``secondary``."""
    top = primary == primary.max()
    masked = torch.where(top, secondary, torch.full_like(secondary, -math.inf))
    return int(masked.argmax())


def propose_discrete(
    model: TNPModel,
    candidates: Tensor | np.ndarray,
    evaluated: Tensor | np.ndarray,
    xi: float = 0.01,
    best_f: float | None = None,
) -> int:
    """Index (into ``candidates [N, D]``) of the unevaluated candidate of largest PI.

    ``evaluated [N]`` bool marks candidates that may not be proposed again. ``best_f`` (raw
    units) defaults to the best f in the model's context; PI uses ``best_f + xi``."""
    cand = torch.as_tensor(
        np.asarray(candidates) if not torch.is_tensor(candidates) else candidates
    )
    done = torch.as_tensor(np.asarray(evaluated) if not torch.is_tensor(evaluated) else evaluated)
    done = done.to(torch.bool).reshape(-1)
    if done.shape[0] != cand.shape[0]:
        raise ValueError(f"evaluated has {done.shape[0]} entries for {cand.shape[0]} candidates")
    free = torch.nonzero(~done).reshape(-1)
    if free.numel() == 0:
        raise ValueError("every candidate has been evaluated")
    if best_f is None:
        best_f = model.best_f
    if not math.isfinite(best_f):
        # empty context: PI is meaningless, take the largest predicted mean
        _, mean = acquisition_values(model, cand[free], 0.0, xi)
        return int(free[int(mean.argmax())])
    pi, mean = acquisition_values(model, cand[free], best_f, xi)
    return int(free[argmax_tiebreak(pi, mean)])


def propose_continuous(
    model: TNPModel,
    dim: int,
    best_f: float | None = None,
    xi: float = 0.01,
    seed: int = 0,
    n_raw: int = 512,
    restarts: int = 4,
) -> Tensor:
    """``optimize_acqf`` of log-PI (``best_f + xi``, raw units) over ``[0, 1]^dim`` -> ``[dim]``
    (float64)."""
    if best_f is None:
        best_f = model.best_f
    bounds = torch.stack([torch.zeros(dim), torch.ones(dim)]).to(torch.float64)
    acq = LogProbabilityOfImprovement(model, best_f=float(best_f) + float(xi))
    with torch.enable_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x, _ = optimize_acqf(
            acq,
            bounds=bounds,
            q=1,
            num_restarts=restarts,
            raw_samples=n_raw,
            options={"seed": int(seed), "maxiter": 100},
        )
    return x.detach().reshape(dim)


# ----------------------------------------------------------------------------------------------
# GP fallback / baseline


def standardise(y: Tensor) -> Tensor:
    """z-score ``y`` (mean 0; std 1 when fewer than two points or constant y)."""
    y = y.to(torch.float64)
    if y.numel() < 2:
        return y - y.mean()
    std = y.std()
    return (y - y.mean()) / (std if float(std) > 1e-9 else 1.0)


def fit_gp(X: Tensor, y: Tensor) -> SingleTaskGP:
    """``SingleTaskGP`` on ``X [n, D]`` and standardised ``y [n]`` (float64, one thread).

    Fitting runs with gradients enabled even inside ``torch.no_grad()``; a fitting failure on
    degenerate data (``FIT_ERRORS``) leaves the prior hyperparameters in place."""
    X = X.to(torch.float64)
    Y = standardise(y).reshape(-1, 1)
    gp = SingleTaskGP(X, Y, outcome_transform=None)
    mll = ExactMarginalLogLikelihood(gp.likelihood, gp)
    with single_thread(), torch.enable_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fit_gpytorch_mll(mll)
        except FIT_ERRORS:  # degenerate data: keep the prior hyperparameters
            pass
    gp.eval()
    return gp


def gp_propose_continuous(
    X_obs: Tensor | np.ndarray, y_obs: Tensor | np.ndarray, dim: int, seed: int = 0
) -> Tensor:
    """Next point in ``[0, 1]^dim`` (float64 ``[dim]``) by ``SingleTaskGP`` + log-EI.

    No observation: a seeded uniform point. One or two observations: the GP is fitted anyway
    (y standardised with std 1); if that fails, a seeded uniform point is returned."""
    X = torch.as_tensor(np.asarray(X_obs) if not torch.is_tensor(X_obs) else X_obs)
    y = torch.as_tensor(np.asarray(y_obs) if not torch.is_tensor(y_obs) else y_obs)
    X = X.to(torch.float64).reshape(-1, dim)
    y = y.to(torch.float64).reshape(-1)
    gen = torch.Generator().manual_seed(int(seed))
    if X.shape[0] == 0:
        return torch.rand(dim, generator=gen, dtype=torch.float64)
    try:
        gp = fit_gp(X, y)
        acq = LogExpectedImprovement(gp, best_f=float(standardise(y).max()))
        bounds = torch.stack([torch.zeros(dim), torch.ones(dim)]).to(torch.float64)
        with single_thread(), torch.enable_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            x, _ = optimize_acqf(
                acq,
                bounds=bounds,
                q=1,
                num_restarts=4,
                raw_samples=256,
                options={"seed": int(seed), "maxiter": 100},
            )
        x = x.detach().reshape(dim)
        if not torch.isfinite(x).all():
            raise FloatingPointError("non-finite candidate")
        return x.clamp(0.0, 1.0)
    except Exception:  # noqa: BLE001 - degenerate data: explore instead of failing the sweep
        return torch.rand(dim, generator=gen, dtype=torch.float64)


def gp_propose_discrete(X_obs: Tensor, y_obs: Tensor, candidates: Tensor, evaluated: Tensor) -> int:
    """Index of the unevaluated candidate of largest log-EI (ties: largest posterior mean)."""
    free = torch.nonzero(~evaluated.to(torch.bool)).reshape(-1)
    if free.numel() == 0:
        raise ValueError("every candidate has been evaluated")
    y = y_obs.to(torch.float64).reshape(-1)
    gp = fit_gp(X_obs, y)
    cand = candidates[free].to(torch.float64)
    acq = LogExpectedImprovement(gp, best_f=float(standardise(y).max()))
    with single_thread(), torch.no_grad():
        lei = acq(cand.unsqueeze(-2))
        mean = gp.posterior(cand).mean.reshape(-1)
    lei = torch.nan_to_num(lei, nan=-math.inf)
    return int(free[argmax_tiebreak(lei, mean)])
