"""UCAT as an nshot Method: adversarial fine-tuning of a CLIP image tower under Ray Train,
evaluation under PGD and APGD-CE, a zero-shot predictor with Dirichlet uncertainty, and the
reproduction, on the backbone the config names (the tiny CLIP, or a real one for ``paper``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from nshot.method import Method, Predictor, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint

from .claims import CLAIMS
from .config import VERSION, DirclipConfig
from .model import load_model
from .serve import DirclipPredictor
from .train import train_loop


@register
class DirclipMethod(Method):
    name = "dirclip"
    paper = "Calibrating Uncertainty for Zero-Shot Adversarial CLIP (UCAT)"
    area = "vision-language / adversarial robustness"
    version = VERSION
    Config = DirclipConfig
    claims = CLAIMS

    def data(self, cfg: DirclipConfig) -> dict[str, pa.Table]:
        """Digits train / validation / test, the rolled test digits and MNIST pooled to 8×8
        (the tiny CLIP's data; a real CLIP's images stay in their folders)."""
        from .data import data_tables

        return data_tables(cfg)

    def train_loop(self, cfg: DirclipConfig) -> None:
        """Adversarial fine-tuning of the image tower with ``cfg.loss`` (ucat, tecoa, fare,
        forward_kl, prob_kl)."""
        train_loop(cfg)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: DirclipConfig) -> dict[str, float]:
        """Clean, PGD and APGD-CE accuracy, ECE, the entropy ratio, the shifted domains (the
        digits) and the Dirichlet read-outs of the checkpoint's selected tower; with
        ``eval_paths`` (a real CLIP), the same zero-shot on each of those image folders
        (``zs/<dataset>/<metric>``, ``zs/mean/<metric>``)."""
        from nshot.train.trainer import local_device

        from .data import splits_of
        from .evaluation import evaluate_model

        model, ckpt_cfg, _ = load_model(checkpoint)
        run_cfg = ckpt_cfg.replace(**{k: getattr(cfg, k) for k in DirclipConfig.EVAL_FIELDS})
        model = model.to(local_device())
        splits = splits_of(run_cfg, model.backbone.image_size)
        return evaluate_model(model, splits, run_cfg, run_cfg.seed)

    def predictor(self, checkpoint: LoadedCheckpoint) -> Predictor:
        """Zero-shot answers of the checkpoint's tuned tower (a real CLIP's is read from the
        checkpoint's ``clip_path``, g's tuned weights put in)."""
        return DirclipPredictor.from_checkpoint(checkpoint)

    def model_budget(self, cfg: DirclipConfig, extra: dict[str, Any] | None = None):
        return None

    def experiments(self, cfg: DirclipConfig, workdir: Path) -> ResultsTable:
        from .experiments import run_experiments

        return run_experiments(cfg, workdir)
