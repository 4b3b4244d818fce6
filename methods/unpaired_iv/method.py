"""Unpaired IV (SplitUP) as an nshot Method.

Nothing trains: ``train_loop`` (``train.py``; one Ray Train worker, or in-process with
``--workers 0``) computes the sufficient statistics of one data set, fits SplitUP, its ℓ1 version and the
baselines, reports the errors and the condition number of C_XX, and checkpoints β̂, Ŝ, the
standard errors and the statistics (safetensors + JSON). ``experiments()`` runs the paper's
comparison with its replications as Ray tasks.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from nshot.method import Method, ResultsTable, register

from . import estimators as E
from .claims import CLAIMS
from .config import UnpairedIVConfig
from .serve import UnpairedIVPredictor
from .train import load_data, train_loop

if TYPE_CHECKING:
    from nshot.train.checkpoint import LoadedCheckpoint


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
