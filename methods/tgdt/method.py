"""TG-DT as an nshot Method: one system trained under Ray Train on the PointRobot (or Meta-World)
offline data, evaluated by zero-shot rollouts on the held-out goals, and a predictor of the next
action from a description, the trajectory so far and a target return."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from nshot.method import Method, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint

from .claims import CLAIMS
from .config import VERSION, TGDTConfig
from .model import load_model
from .serve import TGDTPredictor
from .train import train_loop


@register
class TGDTMethod(Method):
    name = "tgdt"
    paper = "TG-DT: text-guided decision transformer for zero-shot offline meta-RL"
    area = "reinforcement learning"
    version = VERSION
    Config = TGDTConfig
    claims = CLAIMS
    packages = ("metaworld", "mujoco")  # the Meta-World track's simulator (the metaworld extra)

    def data(self, cfg: TGDTConfig) -> dict[str, pa.Table]:
        """The episodes (PointRobot, or Meta-World with ``env=metaworld``): ``train`` (training
        goals) and ``test`` (held-out goals)."""
        from .data import data_table

        t = data_table(cfg)
        held = pa.compute.greater_equal(t.column("task"), cfg.n_train_tasks)
        return {"train": t.filter(pa.compute.invert(held)), "test": t.filter(held)}

    def train_loop(self, cfg: TGDTConfig) -> None:
        train_loop(cfg)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: TGDTConfig) -> dict[str, float]:
        """Zero-shot rollouts on the held-out goals: norm_score, return, retrieval_top1,
        tbm_auc and leak_delta where the system has them, and the data-sharing row's
        norm_score (``share_norm_score``) for text-conditioned systems."""
        from .data import load_data
        from .evaluation import evaluate_model

        model, ckpt_cfg = load_model(checkpoint)
        run_cfg = ckpt_cfg.replace(**{k: getattr(cfg, k) for k in TGDTConfig.EVAL_FIELDS})
        torch.set_num_threads(run_cfg.torch_threads)
        rows = evaluate_model(model, run_cfg, load_data(run_cfg), run_cfg.seed, share=True)
        out = {k: v for k, v in rows[ckpt_cfg.system].items() if v is not None}
        for row, vals in rows.items():
            if row != ckpt_cfg.system:
                out["share_norm_score"] = vals["norm_score"]
        return {k: float(v) for k, v in out.items() if np.isfinite(v)}

    def predictor(self, checkpoint: LoadedCheckpoint) -> TGDTPredictor:
        return TGDTPredictor.from_checkpoint(checkpoint)

    def experiments(self, cfg: TGDTConfig, workdir: Path) -> ResultsTable:
        from .experiments import run_experiments

        return run_experiments(cfg, workdir)
