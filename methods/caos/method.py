"""CAOS as an nshot Method: the bank is fitted under Ray Train, trials run as Ray tasks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from nshot.conformal import CAOSBank, agg_k
from nshot.method import Method, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint

from .claims import CLAIMS
from .config import CAOSConfig
from .data import DigitsLandmarkPool, data_tables, make_pool, trial_rng


def fit_bank(cfg: CAOSConfig) -> tuple[np.ndarray, CAOSBank, dict]:
    """Draw the labelled set of the served bank and calibrate it (leave-one-out)."""
    pool = make_pool(cfg)
    F, Y = pool.sample(trial_rng(cfg, 0, "bank"), cfg.n)
    ref = F[np.arange(cfg.n), Y]
    bank = CAOSBank.fit(1.0 - ref @ ref.T, cfg.k)
    if isinstance(pool, DigitsLandmarkPool):
        extra = {"backbone": f"patch{cfg.patch}-centred-l2", "grid": [cfg.canvas, cfg.canvas]}
    else:
        extra = {"backbone": "features", "grid": [pool.n_candidates]}
    extra.update({"k": cfg.k, "patch": cfg.patch, "pool": pool.name, "landmarks": Y.tolist()})
    return ref, bank, extra


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
        """Nothing trains: featurise the labelled set, compute the LOO scores, checkpoint them."""
        from nshot.train import session

        ref, bank, extra = fit_bank(cfg)
        q = np.quantile(bank.loo_sorted, [0.1, 0.5, 0.9])
        metrics = {
            "n": float(bank.n),
            "k": float(bank.k),
            "loo_q10": q[0],
            "loo_q50": q[1],
            "loo_q90": q[2],
            **{f"q_hat_a{round(a * 100):02d}": min(bank.q_hat(a), 1e9) for a in cfg.alphas},
        }
        session.report(
            metrics,
            step=1,
            model={
                "ref": torch.from_numpy(ref.astype(np.float32)),
                "loo_sorted": torch.from_numpy(bank.loo_sorted.astype(np.float32)),
            },
            extra=extra,
            checkpoint=True,
        )

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: CAOSConfig) -> dict[str, float]:
        """Coverage and size of the checkpoint's bank on fresh images (conditional on that
        bank), and of the marginal trial protocol over ``min(trials, 100)`` fresh banks."""
        from .core import SYSTEMS, run_trials

        w = checkpoint.weights()
        ref = w["ref"].double().numpy()
        bank = CAOSBank(w["loo_sorted"].double().numpy(), int(checkpoint.extra["k"]))
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
