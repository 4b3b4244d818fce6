"""SCGFM as an nshot Method: pre-training of the bases under Ray Train, few-shot evaluation,
serving and the reproduction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from nshot.method import Method, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint
from nshot.train.limits import ModelBudget

from .claims import CLAIMS
from .config import VERSION, ScgfmConfig
from .model import N_STATS, load_model
from .train import train_loop


@register
class ScgfmMethod(Method):
    name = "scgfm"
    paper = "SCGFM: structure-centric graph foundation model via geometric bases (ICML 2026)"
    area = "graphs"
    version = VERSION
    Config = ScgfmConfig
    claims = CLAIMS

    def data(self, cfg: ScgfmConfig) -> dict[str, pa.Table]:
        from .data import data_tables

        return data_tables(cfg)

    def train_loop(self, cfg: ScgfmConfig) -> None:
        """Pre-train the bases Θ and the decoder f on the source graphs (see
        :func:`.train.train_loop`)."""
        train_loop(cfg)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: ScgfmConfig) -> dict[str, float]:
        """Few-shot accuracies of the checkpoint's frozen bases on the target families (both
        feature variants), the held-out source graphs and the molecules when available."""
        from .experiments import evaluate_model

        model, solver, tau = load_model(checkpoint)
        return evaluate_model(model, solver, tau, cfg)

    def predictor(self, checkpoint: LoadedCheckpoint):
        from .serve import ScgfmPredictor

        return ScgfmPredictor(checkpoint)

    def model_budget(self, cfg: ScgfmConfig, extra: dict[str, Any] | None = None) -> ModelBudget:
        """Θ (K·M·M) and the decoder; activations: the plans of one request at its caps."""
        from . import serve

        shape = (extra or {}).get("shape") or {
            "n_bases": cfg.n_bases, "basis_size": cfg.basis_size, "hidden": cfg.decoder_hidden,
        }  # fmt: skip
        k, m, h = (int(shape.get(x, 0)) for x in ("n_bases", "basis_size", "hidden"))
        if not (2 <= k <= 64 and 2 <= m <= 32 and 1 <= h <= 1024):
            raise ValueError(f"extra.shape out of range: {shape}")
        params = k * m * m + (k * h + h) + (h * N_STATS + N_STATS)
        buffers = 1 + 2 * N_STATS
        act = 8 * serve.MAX_GRAPHS * k * serve.MAX_NODES * m
        return ModelBudget(params=params, activation_bytes=act, weights_numel=params + buffers)

    def experiments(self, cfg: ScgfmConfig, workdir: Path) -> ResultsTable:
        from .experiments import run_experiments

        return run_experiments(cfg, workdir)
