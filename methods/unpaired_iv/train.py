"""unpaired_iv's train loop: nothing is learned by gradient; one step fits the data set.

SplitUP and its baselines are closed-form estimators, so every preset declares ``steps = 1``:
the step computes the sufficient statistics of one data set (:func:`load_data`), fits SplitUP
(dense and ℓ1) and the baselines, reports the errors and the condition number of C_XX, and
checkpoints β̂, Ŝ, the standard errors and the statistics. The loop keeps the platform's
contract all the same: a resumed run continues after its last checkpoint, and the base config's
fault injection (``fail_at_step``) fires at the step it names.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from nshot.method import NshotError
from nshot.train.trainer import Recipe, train

from . import estimators as E
from .config import UnpairedIVConfig
from .data import Replication, card_split, generate, load_path


def load_data(cfg: UnpairedIVConfig) -> Replication:
    """The data set ``train_loop`` and ``data()`` use: replication ``cfg.seed`` of the
    generator in ``cfg.fit_setting``, one random Card half split, or ``cfg.data_path``."""
    if cfg.data_source == "path":
        return load_path(cfg.data_path or "")
    if cfg.data_source == "card":
        return card_split(np.random.default_rng([cfg.seed, 31, 0]))
    m, r = cfg.env_small if cfg.fit_setting == "env_small" else cfg.env_large
    rng = np.random.default_rng([cfg.seed, 101])
    return generate(
        m,
        r,
        cfg.d,
        cfg.s_star,
        rng,
        beta_value=cfg.beta_value,
        confounding=cfg.confounding,
        rank=cfg.rank,
        loading_seed=cfg.seed,
    )


def fit_data(data: Replication, cfg: UnpairedIVConfig) -> dict[str, Any]:
    """SplitUP (dense and ℓ1) with standard errors, and the baselines, on one data set."""
    prep = E.prepare(data.x_env, data.x, data.y_env, data.y, data.x_latent)
    if prep.m < 2:
        raise NshotError(
            f"data: {prep.m} environment(s) are shared by both samples with r_e >= 2; need 2"
        )
    rng = np.random.default_rng([cfg.seed, 5])
    mom = E.crossfold_moments(prep, cfg.folds, cfg.repeats, cfg.analytic, cfg.weight, rng)
    try:
        dense = E.solve_dense(mom)
    except E.EstimationError:
        dense = None
    if cfg.lam_select and prep.m >= 10:
        lam = E.select_lambda(
            prep, cfg.folds, cfg.repeats, cfg.analytic, rng, cfg.refit_threshold, cfg.psd_eps
        )
    else:
        lam = cfg.lam(prep.n_x)
    l1 = E.solve_l1(mom, lam, cfg.refit_threshold, cfg.psd_eps, cfg.cd_tol)
    out: dict[str, Any] = {
        "prep": prep,
        "moments": mom,
        "dense": dense,
        "l1": l1,
        "lam": lam,
        "two_sample": E.two_sample_2sls(prep),
        "oracle": E.oracle_paired_2sls(prep) if prep.x_latent is not None else None,
        "cond": E.condition_number(mom.cxx),
    }
    return out


def _errors(fits: dict[str, Any], beta: np.ndarray | None) -> dict[str, float]:
    if beta is None:
        return {}
    out: dict[str, float] = {}
    for name, b in (
        ("crossfold_gmm", None if fits["dense"] is None else fits["dense"].beta),
        ("crossfold_gmm_l1", fits["l1"].beta),
        ("two_sample_2sls", fits["two_sample"]),
        ("oracle_paired_2sls", fits["oracle"]),
    ):
        if b is not None:
            out[f"error_{name}"] = float(np.linalg.norm(np.asarray(b) - beta))
    return out


class UnpairedIVRecipe(Recipe):
    """One closed-form step: fit the data set; a resume redoes it (no weights are restored)."""

    def build(self) -> None:
        self.fit_state: dict[str, torch.Tensor] = {}
        self.fit_extra: dict[str, Any] | None = None

    def step(self, step: int) -> dict[str, float]:
        """Fit the data set (the same fit at every step: it is closed-form)."""
        cfg = self.cfg
        t0 = time.time()
        data = load_data(cfg)
        fits = fit_data(data, cfg)
        prep, dense, l1 = fits["prep"], fits["dense"], fits["l1"]
        d = prep.d
        nan = np.full(d, np.nan)
        support = np.zeros(d, dtype=np.int64)
        support[l1.support] = 1
        state = {
            "beta": torch.from_numpy(nan if dense is None else dense.beta),
            "se": torch.from_numpy(nan if dense is None else dense.se),
            "beta_l1": torch.from_numpy(l1.beta),
            "se_l1": torch.from_numpy(l1.se),
            "support_l1": torch.from_numpy(support),
            "beta_two_sample": torch.from_numpy(np.asarray(fits["two_sample"], float)),
            "c_xx": torch.from_numpy(fits["moments"].cxx),
            "c_xy": torch.from_numpy(fits["moments"].cxy),
        }
        if fits["oracle"] is not None:
            state["beta_oracle"] = torch.from_numpy(np.asarray(fits["oracle"], float))
        if data.beta is not None:
            state["beta_star"] = torch.from_numpy(np.asarray(data.beta, float))
        metrics = {
            "n_envs_used": float(prep.m),
            "n_x": float(prep.n_x),
            "n_y": float(prep.n),
            "cond_cxx": fits["cond"] if np.isfinite(fits["cond"]) else 1e308,
            "lam": float(fits["lam"]),
            "support_size": float(len(l1.support)),
            **_errors(fits, data.beta),
            "wall_s": time.time() - t0,
        }
        labels = data.labels
        self.fit_state = state
        self.fit_extra = {
            "data_source": cfg.data_source,
            "n_envs_used": prep.m,
            "dropped_envs": [labels[i] if labels else int(i) for i in prep.dropped],
            "cond_cxx": metrics["cond_cxx"],
            "lam": float(fits["lam"]),
            "support_l1": [int(i) for i in l1.support],
            "estimator": {
                "folds": cfg.folds,
                "repeats": cfg.repeats,
                "analytic": cfg.analytic,
                "weight": cfg.weight,
                "se": "environment-clustered delta-method sandwich",
            },
            "info": {k: v for k, v in data.info.items() if isinstance(v, int | float | str | None)},
        }
        return metrics

    def state(self) -> dict[str, torch.Tensor]:
        return self.fit_state

    def extra(self) -> dict[str, Any] | None:
        return self.fit_extra


def train_loop(cfg: UnpairedIVConfig) -> None:
    train(UnpairedIVRecipe(cfg))
