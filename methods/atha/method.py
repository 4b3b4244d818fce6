"""ATHA as an nshot Method: the tiny CLIP's pre-training under Ray Train, episodes of CoOp +
LoRA with the tail-head token update in evaluation, experiments and serving."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from nshot.method import Method, ResultsTable, register

from .claims import CLAIMS
from .config import VERSION, AthaConfig
from .model import Backbone, load_model
from .serve import AthaPredictor
from .train import episode_accuracy, train_loop


@register
class AthaMethod(Method):
    name = "atha"
    paper = "ATHA: adaptive tail-head alignment for CLIP cross-domain few-shot learning"
    area = "vision-language / few-shot"
    version = VERSION
    Config = AthaConfig
    claims = CLAIMS

    def data(self, cfg: AthaConfig) -> dict[str, pa.Table]:
        """The target domains' image pools (``image`` bytes 32 × 32 × 3, ``label``)."""
        from .data import domain_table

        return {d: domain_table(d, cfg.pool_per_class, cfg.seed) for d in cfg.domains}

    def train_loop(self, cfg: AthaConfig) -> None:
        """Contrastive pre-training of the tiny CLIP the episodes start from."""
        train_loop(cfg)

    def evaluate(self, checkpoint, cfg: AthaConfig) -> dict[str, float]:
        """1-shot accuracy of ATHA and of CoOp + LoRA on ``eval_episodes`` episodes per
        domain (the same episodes), their paired gain, and the zero-shot precondition."""
        clip, ckpt_cfg = load_model(checkpoint)
        fixed = set(AthaConfig.EVAL_FIELDS)
        run_cfg = ckpt_cfg.replace(**{k: getattr(cfg, k) for k in fixed})
        out = episode_accuracy(Backbone(clip), run_cfg, ["atha", "coop_lora"])
        if "acc_src_8way" in checkpoint.metrics:
            out["acc_src_8way"] = float(checkpoint.metrics["acc_src_8way"])
        return out

    def predictor(self, checkpoint) -> AthaPredictor:
        return AthaPredictor.from_checkpoint(checkpoint)

    def experiments(self, cfg: AthaConfig, workdir: Path) -> ResultsTable:
        from .experiments import run_experiments

        return run_experiments(cfg, workdir)
