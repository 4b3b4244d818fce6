"""TimeMoDE as an nshot Method: one training stage (pre-train, fine-tune, from scratch) under
Ray Train, evaluation by generated windows against held-out target windows, and a predictor of
windows from a few-shot set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from nshot.method import Method, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint

from .claims import CLAIMS
from .config import VERSION, TimeModeConfig
from .model import load_model
from .serve import TimeModePredictor
from .train import train_loop


@register
class TimeModeMethod(Method):
    name = "timemode"
    paper = "TimeMoDE: a unified generative model for scarce time series with domain experts"
    area = "time series / few-shot generation"
    version = VERSION
    Config = TimeModeConfig
    claims = CLAIMS

    def data(self, cfg: TimeModeConfig) -> dict[str, pa.Table]:
        """The pre-training corpus and the few-shot target's windows (original units)."""
        from .data import data_tables

        return data_tables(cfg)

    def train_loop(self, cfg: TimeModeConfig) -> None:
        """The stage ``cfg.stage`` of system ``cfg.system``."""
        train_loop(cfg)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: TimeModeConfig) -> dict[str, float]:
        """disc, fid_feat and pred of ``n_generate`` windows against the target's reference
        (conditioned on the target's few-shot windows, fine-tuning seed ``cfg.seed``), and
        routing_js on the checkpoint's own domains when it has a router and several domains."""
        from .experiments import evaluate_state

        state, ckpt_cfg, run = load_model(checkpoint)
        run_cfg = ckpt_cfg.replace(**{k: getattr(cfg, k) for k in TimeModeConfig.EVAL_FIELDS})
        torch.set_num_threads(run_cfg.torch_threads)
        out = evaluate_state(state, run_cfg, run_cfg.seed)
        return {k: float(v) for k, v in out.items() if v is not None and np.isfinite(v)}

    def predictor(self, checkpoint: LoadedCheckpoint) -> TimeModePredictor:
        return TimeModePredictor.from_checkpoint(checkpoint)

    def experiments(self, cfg: TimeModeConfig, workdir: Path) -> ResultsTable:
        from .experiments import run_experiments

        return run_experiments(cfg, workdir)
