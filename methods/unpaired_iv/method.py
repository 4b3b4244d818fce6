"""Unpaired IV (SplitUP) as an nshot Method.

Nothing trains: ``train_loop`` (one Ray Train worker, or in-process with ``--workers 0``)
computes the sufficient statistics of one data set, fits SplitUP, its ℓ1 version and the
baselines, reports the errors and the condition number of C_XX, and checkpoints β̂, Ŝ, the
standard errors and the statistics (safetensors + JSON). ``experiments()`` runs the paper's
comparison with its replications as Ray tasks.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from nshot.method import Method, NshotError, ResultsTable, register

from . import estimators as E
from .claims import CLAIMS
from .config import UnpairedIVConfig
from .data import Replication, card_split, generate, load_path
from .serve import UnpairedIVPredictor

if TYPE_CHECKING:
    from nshot.train.checkpoint import LoadedCheckpoint


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


def train_loop(cfg: UnpairedIVConfig) -> None:
    import torch

    from nshot.train import session

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
    extra = {
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
    session.report(metrics, step=1, model=state, extra=extra, checkpoint=True)


def _f1(pred: np.ndarray, true: np.ndarray) -> float:
    return E.support_f1(pred.astype(bool), true.astype(bool))


@register
class UnpairedIVMethod(Method):
    name = "unpaired_iv"
    paper = "Many experiments, few repetitions, unpaired data, and sparse effects (SplitUP)"
    area = "causal inference / instrumental variables"
    version = "1"
    Config = UnpairedIVConfig
    claims = CLAIMS

    def data(self, cfg: UnpairedIVConfig) -> dict[str, pa.Table]:
        """The data set ``train_loop`` fits: the X-sample, the Y-sample, and (generated or Card
        data) the Y-sample's latent X that only the paired oracle sees, and β*."""
        data = load_data(cfg)
        labels = data.labels
        env_x = [labels[i] for i in data.x_env] if labels else data.x_env.tolist()
        env_y = [labels[i] for i in data.y_env] if labels else data.y_env.tolist()
        out = {
            "x_sample": pa.table(
                {"env": env_x, **{f"x_{j}": data.x[:, j] for j in range(data.x.shape[1])}}
            ),
            "y_sample": pa.table({"env": env_y, "y": data.y}),
        }
        if data.x_latent is not None:
            out["y_sample_latent_x"] = pa.table(
                {
                    "env": env_y,
                    **{f"x_{j}": data.x_latent[:, j] for j in range(data.x_latent.shape[1])},
                }
            )
        if data.beta is not None:
            out["beta_star"] = pa.table({"beta": data.beta})
        return out

    def train_loop(self, cfg: UnpairedIVConfig) -> None:
        train_loop(cfg)

    def predictor(self, checkpoint: LoadedCheckpoint) -> UnpairedIVPredictor:
        return UnpairedIVPredictor.from_checkpoint(checkpoint)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: UnpairedIVConfig) -> dict[str, float]:
        """Errors of the checkpointed estimates against β* (generated data), support F1 and
        exact support of the ℓ1 fit, and the share of coordinates whose 95 % interval covers
        β*; for data without a known β*, the estimates and standard errors."""
        w = {k: v.numpy() for k, v in checkpoint.weights().items()}
        out: dict[str, float] = {
            "cond_cxx": float(checkpoint.metrics.get("cond_cxx", float("nan"))),
            "n_envs_used": float(checkpoint.metrics.get("n_envs_used", float("nan"))),
        }
        beta = w.get("beta_star")
        if beta is None:
            for j, (b, s) in enumerate(zip(w["beta"], w["se"])):
                out[f"beta_{j}"] = float(b)
                out[f"se_{j}"] = float(s)
            return out
        true = beta != 0
        names = {
            "crossfold_gmm": "beta",
            "crossfold_gmm_l1": "beta_l1",
            "two_sample_2sls": "beta_two_sample",
            "oracle_paired_2sls": "beta_oracle",
        }
        for name, key in names.items():
            if key in w:
                out[f"error_{name}"] = float(np.linalg.norm(w[key] - beta))
                out[f"l1_error_{name}"] = float(np.abs(w[key] - beta).sum())
        pred = w["support_l1"].astype(bool)
        out["support_f1"] = _f1(pred, true)
        out["exact_support"] = float(np.array_equal(pred, true))
        if np.all(np.isfinite(w["beta"])):
            out["se_covered_frac"] = float(np.mean(np.abs(w["beta"] - beta) <= 1.96 * w["se"]))
        return out

    def experiments(self, cfg: UnpairedIVConfig, workdir: Path) -> ResultsTable:
        from .experiments import run_experiments

        return run_experiments(cfg, workdir)
