"""unpaired_iv's predictor: one estimation problem per request.

The request carries two unpaired tables, (environment, X) and (environment, Y); the predictor
fits SplitUP (dense) or its ℓ1 version on them and returns the estimate, its environment-
clustered standard error, the support (sparse) and what was dropped. A checkpoint supplies the
defaults for K, H, the λ rule and W. Malformed problems are rejected with a message naming the
field (HTTP 422 through the Serve app).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, Field, model_validator

from nshot.method import Predictor
from nshot.serve.schema import StrictRequest

from . import estimators as E
from .config import UnpairedIVConfig

if TYPE_CHECKING:
    from nshot.train.checkpoint import LoadedCheckpoint

Env = int | str
MAX_ROWS = 2_000_000
MAX_D = 2_000


class XSample(StrictRequest):
    env: list[Env] = Field(..., max_length=MAX_ROWS, description="environment of each X row")
    x: list[list[float]] = Field(..., max_length=MAX_ROWS, description="ñ × d covariates")


class YSample(StrictRequest):
    env: list[Env] = Field(..., max_length=MAX_ROWS, description="environment of each Y value")
    y: list[float] = Field(..., max_length=MAX_ROWS, description="n outcomes")


def _key(v: Env) -> tuple[str, Env]:
    return (type(v).__name__, v)  # 1 and "1" are different environments


class UnpairedIVRequest(StrictRequest):
    x_sample: XSample
    y_sample: YSample
    sparse: bool = Field(False, description="ℓ1 fit with post-selection refit")
    lam: float | None = Field(None, gt=0.0, description="ℓ1 penalty (default: the λ rule)")
    folds: int | None = Field(None, ge=2, le=64, description="K (default: the checkpoint's)")
    repeats: int | None = Field(None, ge=1, le=1000, description="H (default: the checkpoint's)")
    analytic: bool = Field(False, description="analytic H → ∞ form of C_XX")
    seed: int = Field(0, ge=0, description="seed of the random fold assignments")

    @model_validator(mode="after")
    def _check(self) -> UnpairedIVRequest:
        xs, ys = self.x_sample, self.y_sample
        if not xs.x:
            raise ValueError("x_sample.x: the X-sample is empty")
        d = len(xs.x[0])
        if d == 0:
            raise ValueError("x_sample.x: rows have no covariates")
        if d > MAX_D:
            raise ValueError(f"x_sample.x: {d} covariates exceed the limit of {MAX_D}")
        for i, row in enumerate(xs.x):
            if len(row) != d:
                raise ValueError(f"x_sample.x: row {i} has {len(row)} values, row 0 has {d}")
            if not all(math.isfinite(v) for v in row):
                raise ValueError(f"x_sample.x: row {i} contains NaN or inf")
        if len(xs.env) != len(xs.x):
            raise ValueError(
                f"x_sample.env: {len(xs.env)} environment labels for {len(xs.x)} rows of x"
            )
        if not ys.y:
            raise ValueError("y_sample.y: the Y-sample is empty")
        if len(ys.env) != len(ys.y):
            raise ValueError(
                f"y_sample.env: {len(ys.env)} environment labels for {len(ys.y)} values of y"
            )
        bad = [i for i, v in enumerate(ys.y) if not math.isfinite(v)]
        if bad:
            raise ValueError(f"y_sample.y: values at {bad[:10]} are NaN or inf")
        xk = [_key(e) for e in xs.env]
        shared = set(xk) & {_key(e) for e in ys.env}
        if len(shared) < 2:
            raise ValueError(
                f"y_sample.env: {len(shared)} environment(s) shared with x_sample.env; the "
                "environment instrument needs at least 2"
            )
        counts: dict[tuple[str, Env], int] = {}
        for k in xk:
            if k in shared:
                counts[k] = counts.get(k, 0) + 1
        usable = [c for c in counts.values() if c >= 2]
        if not usable:
            raise ValueError(
                "x_sample.env: every shared environment has fewer than 2 X-sample units "
                "(r_e < 2); the cross-fold moment needs r_e >= 2"
            )
        if not self.sparse and len(usable) < d:
            raise ValueError(
                f"sparse: {len(usable)} usable environments (shared, r_e >= 2) for d = {d} "
                "covariates: the dense estimator is not identified; use sparse=true"
            )
        if self.folds is not None and not self.analytic and self.folds > min(usable):
            raise ValueError(
                f"folds: {self.folds} exceeds the smallest usable r_e = {min(usable)} (X-sample "
                "units of an environment); every fold needs a unit of every environment"
            )
        return self


class UnpairedIVResponse(BaseModel):
    beta: list[float] = Field(..., description="β̂ (d)")
    se: list[float] = Field(..., description="environment-clustered standard errors (d)")
    support: list[int] | None = Field(None, description="selected coordinates (sparse)")
    n_envs_used: int
    dropped_envs: list[Env] = Field(..., description="r_e < 2 or absent from one sample")
    cond_cxx: float | None = Field(..., description="condition number of C_XX (None: inf)")
    lam: float | None = None
    folds: int
    repeats: int
    method: str


class UnpairedIVPredictor(Predictor[UnpairedIVRequest, UnpairedIVResponse]):
    Request = UnpairedIVRequest
    Response = UnpairedIVResponse

    def __init__(self, cfg: UnpairedIVConfig, info: dict[str, Any] | None = None) -> None:
        self.cfg = cfg
        self.info = info or {}

    @classmethod
    def from_checkpoint(cls, checkpoint: LoadedCheckpoint) -> UnpairedIVPredictor:
        cfg = UnpairedIVConfig.validated(checkpoint.config)
        keep = ("n_envs_used", "cond_cxx", "lam", "data_source")
        return cls(cfg, {k: checkpoint.extra[k] for k in keep if k in checkpoint.extra})

    def metadata(self) -> dict[str, Any]:
        c = self.cfg
        return {
            "folds": c.folds,
            "repeats": c.repeats,
            "weight": c.weight,
            "lam_rule": f"{c.lam_c:g} * 2 / sqrt(n_x)",
            "lam_select": c.lam_select,
            "max_rows": MAX_ROWS,
            "max_d": MAX_D,
            "checkpoint": self.info,
        }

    def example_request(self) -> dict[str, Any]:
        """A small unpaired problem from the method's own generator: 40 environments (named
        "e0".."e39") with 4 X-units and 4 other Y-units each, d = 2 covariates, β* = (1, 0) and
        a hidden confounder; the dense SplitUP fit with this checkpoint's K, H and W."""
        from .data import generate

        r = max(4, self.cfg.folds)  # every fold needs a unit of every environment
        data = generate(40, r, 2, 1, np.random.default_rng([0, 9]))
        return {
            "x_sample": {
                "env": [f"e{e}" for e in data.x_env.tolist()],
                "x": np.round(data.x, 4).tolist(),
            },
            "y_sample": {
                "env": [f"e{e}" for e in data.y_env.tolist()],
                "y": np.round(data.y, 4).tolist(),
            },
        }

    def __call__(self, request: UnpairedIVRequest) -> UnpairedIVResponse:
        cfg = self.cfg
        codes: dict[tuple[str, Env], int] = {}
        labels: list[Env] = []
        for e in list(request.x_sample.env) + list(request.y_sample.env):
            if _key(e) not in codes:
                codes[_key(e)] = len(labels)
                labels.append(e)
        x_env = np.array([codes[_key(e)] for e in request.x_sample.env], dtype=np.int64)
        y_env = np.array([codes[_key(e)] for e in request.y_sample.env], dtype=np.int64)
        prep = E.prepare(
            x_env,
            np.asarray(request.x_sample.x, dtype=float),
            y_env,
            np.asarray(request.y_sample.y, dtype=float),
        )
        folds = request.folds or cfg.folds
        repeats = request.repeats or cfg.repeats
        if not request.analytic and folds > int(prep.r_x.min()):
            raise ValueError(
                f"folds: the checkpoint's default of {folds} folds exceeds the smallest usable "
                f"r_e = {int(prep.r_x.min())}; pass folds or analytic=true"
            )
        rng = np.random.default_rng([request.seed, 5])
        mom = E.crossfold_moments(prep, folds, repeats, request.analytic, cfg.weight, rng)
        lam = None
        if request.sparse:
            if request.lam is not None:
                lam = request.lam
            elif cfg.lam_select and prep.m >= 10:
                lam = E.select_lambda(
                    prep, folds, repeats, request.analytic, rng, cfg.refit_threshold, cfg.psd_eps
                )
            else:
                lam = cfg.lam(prep.n_x)
            fit = E.solve_l1(mom, lam, cfg.refit_threshold, cfg.psd_eps, cfg.cd_tol)
            method = "crossfold_gmm_l1"
        else:
            try:
                fit = E.solve_dense(mom)
            except E.EstimationError as err:
                raise ValueError(f"x_sample: {err}; try sparse=true") from None
            method = "crossfold_gmm"
        cond = fit.cond if np.isfinite(fit.cond) else None
        return UnpairedIVResponse(
            beta=[float(v) for v in fit.beta],
            se=[float(v) for v in fit.se],
            support=[int(i) for i in fit.support] if fit.support is not None else None,
            n_envs_used=prep.m,
            dropped_envs=[labels[i] for i in prep.dropped],
            cond_cxx=cond,
            lam=lam,
            folds=folds,
            repeats=repeats,
            method=method + ("_analytic" if request.analytic else ""),
        )
