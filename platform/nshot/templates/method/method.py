"""skeleton as an nshot Method: the face the platform talks to."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from nshot.method import Method, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint

from .claims import CLAIMS
from .config import SkeletonConfig
from .data import examples, tables
from .model import episode_accuracies, load_model
from .serve import SkeletonPredictor
from .train import train_loop


@register
class SkeletonMethod(Method):
    name = "skeleton"
    paper = "Prototypical networks (the nshot new template: put your paper's title here)"
    paper_url = "https://arxiv.org/abs/1703.05175"  # where the paper can be read
    area = "few-shot classification"
    version = "1"  # raise it when a checkpoint of the old code no longer loads
    Config = SkeletonConfig
    claims = CLAIMS

    def data(self, cfg: SkeletonConfig) -> dict[str, pa.Table]:
        return tables(cfg)

    def train_loop(self, cfg: SkeletonConfig) -> None:
        train_loop(cfg)

    def evaluate(
        self,
        checkpoint: LoadedCheckpoint,
        cfg: SkeletonConfig,
    ) -> dict[str, float]:
        """Accuracy on ``eval_episodes`` episodes of held-out classes, with its 95 % interval,
        and the raw-feature baseline's on the same episodes."""
        model, _ = load_model(checkpoint)
        test = examples(cfg, "test")
        out = {}
        for key, embed in (("acc", model), ("raw_prototypes_acc", None)):
            accs = np.array(episode_accuracies(embed, cfg, *test, seed=cfg.seed))
            out[key] = float(accs.mean())
            out[f"{key}_ci95"] = float(1.96 * accs.std() / np.sqrt(len(accs)))
        return out

    def predictor(self, checkpoint: LoadedCheckpoint) -> SkeletonPredictor:
        return SkeletonPredictor(checkpoint)

    def experiments(self, cfg: SkeletonConfig, workdir: Path) -> ResultsTable:
        from .experiments import run_experiments

        return run_experiments(cfg, workdir)
