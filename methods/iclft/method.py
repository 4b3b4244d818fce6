"""iclft as an nshot Method: the contract wired to the package's modules (training in
``train.py``, evaluation in ``evaluation.py``, the predictor in ``serve.py``, the comparison in
``experiments.py``). Nothing in the package imports this module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from nshot.method import Method, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint
from nshot.train.limits import ModelBudget, meta_counts

from . import data as D
from .claims import CLAIMS
from .config import ICLFTConfig, row_name
from .evaluation import evaluate_model
from .experiments import run_experiments
from .model import ICLFTBundle, load_model
from .serve import MAX_CONTEXT, MAX_QUERIES, ICLFTPredictor
from .train import train_loop


@register
class ICLFTMethod(Method):
    name = "iclft"
    paper = (
        "Fine-tuning versus in-context learning in linear attention "
        "(preserving ICL under fine-tuning; ICML 2026)"
    )
    area = "in-context (few-shot) learning / fine-tuning"
    version = "1"
    Config = ICLFTConfig
    claims = CLAIMS

    def data(self, cfg: ICLFTConfig) -> dict[str, pa.Table]:
        return D.tables(cfg)

    def train_loop(self, cfg: ICLFTConfig) -> None:
        train_loop(cfg)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: ICLFTConfig) -> dict[str, float]:
        bundle, extra = load_model(checkpoint)
        theta0 = torch.tensor(extra["theta0"], dtype=torch.float64)
        seed = int(checkpoint.config.get("seed", cfg.seed))
        cfg = cfg.replace(d=int(extra["d"]), sigma2=float(extra.get("sigma2", cfg.sigma2)))
        out: dict[str, float] = {}
        for row in extra.get("trained", []):
            net = bundle.models[row]
            for key, v in evaluate_model(net, cfg, seed, theta0, random=True).items():
                out[f"{row}/{key}"] = v
        return out

    def predictor(self, checkpoint: LoadedCheckpoint) -> ICLFTPredictor:
        return ICLFTPredictor.from_checkpoint(checkpoint)

    def model_budget(self, cfg: ICLFTConfig, extra: dict[str, Any] | None = None) -> ModelBudget:
        """One linear-attention model of width ``d + 2`` per recorded row (else per variant and
        the pretrained one); activations: ``MAX_CONTEXT`` context tokens and ``MAX_QUERIES``
        queries of one request, a few copies each, and one ``(d+2)²`` matrix per model."""
        extra = extra or {}
        d = extra.get("d", cfg.d)
        rows = extra.get("rows", ["pretrained", *(row_name(v) for v in cfg.variants)])
        if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= 256:
            raise ValueError(f"extra.d must be an integer in [1, 256], got {d!r}")
        if (
            not isinstance(rows, list)
            or not 1 <= len(rows) <= 64
            or not all(isinstance(r, str) and r for r in rows)
        ):
            raise ValueError("extra.rows must be a list of 1 to 64 model names")
        params, state = meta_counts(lambda: ICLFTBundle(d, rows))
        tokens = MAX_CONTEXT + MAX_QUERIES
        act = 4 * (8 * tokens * (d + 2) + len(rows) * 4 * (d + 2) ** 2)
        return ModelBudget(params=params, activation_bytes=act, weights_numel=state)

    def experiments(self, cfg: ICLFTConfig, workdir: Path) -> ResultsTable:
        return run_experiments(cfg, workdir)
