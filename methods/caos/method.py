"""CAOS as an nshot Method: the bank is fitted under Ray Train, trials run as Ray tasks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from nshot.conformal import agg_k
from nshot.method import Method, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint

from .claims import CLAIMS
from .config import CAOSConfig
from .data import data_tables, make_pool, trial_rng
from .model import load_model
from .train import train_loop


@register
class CAOSMethod(Method):
    name = "caos"
    paper = "CAOS: Conformal Aggregation of One-Shot Predictors (ICML 2026)"
    area = "one-shot conformal prediction"
    version = "1"
    Config = CAOSConfig
    claims = CLAIMS

    def data(self, cfg: CAOSConfig) -> dict[str, pa.Table]:
        return data_tables(cfg)

    def train_loop(self, cfg: CAOSConfig) -> None:
        """Nothing trains: one step featurises the labelled set, computes the LOO scores and
        checkpoints them (``train.py``)."""
        train_loop(cfg)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: CAOSConfig) -> dict[str, float]:
        """Coverage and size of the checkpoint's bank on fresh images (conditional on that
        bank), and of the marginal trial protocol over ``min(trials, 100)`` fresh banks."""
        from .core import SYSTEMS, run_trials

        model = load_model(checkpoint)
        ref, bank = model.ref, model.bank
        pool = make_pool(cfg)
        F, Y = pool.sample(trial_rng(cfg, 0, "serve-eval"), min(400, cfg.n_test * 20))
        T = agg_k(1.0 - F @ ref.T, bank.k)
        out: dict[str, float] = {}
        for a in cfg.alphas:
            sfx = f"a{round(a * 100):02d}"
            sets = T <= bank.q_hat(a)
            out[f"bank_coverage_{sfx}"] = float(sets[np.arange(len(Y)), Y].mean())
            out[f"bank_size_{sfx}"] = float(sets.sum(1).mean())
        trials = min(cfg.trials, 100)
        res = run_trials(cfg.model_dump(), list(range(trials)), cfg.n, full=False)
        for a, alpha in enumerate(cfg.alphas):
            sfx = f"a{round(alpha * 100):02d}"
            for s, name in enumerate(SYSTEMS[:4]):
                out[f"{name}_coverage_{sfx}"] = float(res["coverage"][:, s, a].mean())
                out[f"{name}_size_{sfx}"] = float(res["size"][:, s, a].mean())
        return out

    def predictor(self, checkpoint: LoadedCheckpoint):
        from .serve import CAOSPredictor

        return CAOSPredictor(checkpoint)

    def experiments(self, cfg: CAOSConfig, workdir: Path) -> ResultsTable:
        from .experiments import run_experiments

        return run_experiments(cfg, workdir)
