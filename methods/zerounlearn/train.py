"""ZeroUnlearn's train loop: nothing is learned over steps; one step is the edit.

The edit is a closed form (ZeroUnlearn, or the -GD variant's inner descent) computed from the
config and the seed, so the loop is one step, reported as step 1 with the metrics of the base
model (``*_before``) and of the edited one, and a checkpoint of the edited weights (rank 0 holds
them; every other rank reports empty tensors). ``fail_at_step=1`` fails it on a first attempt
(fault injection), and a resumed run does the edit again.
"""

from __future__ import annotations

from typing import Any

import torch

from nshot.train.trainer import Recipe, train

from .config import ZeroUnlearnConfig
from .experiments import checkpoint_extra
from .pipeline import load_model, run_systems, setup

#: the system of run_systems each variant runs
SYSTEM = {"zerounlearn": "zerounlearn", "gd": "zerounlearn_gd"}


class ZeroUnlearnRecipe(Recipe):
    """One step: the seed's setup (model, facts, key statistics), the base model's metrics and
    the edit's; a resume redoes it (no weights are restored)."""

    def build(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}
        self.edit_extra: dict[str, Any] | None = None

    def schedule(self) -> tuple[int, int, int]:
        return 1, 1, 1  # one step, checkpointed

    def step(self, step: int) -> dict[str, float]:
        cfg = self.cfg
        # the model runs on the worker's device unless the config names one
        device = str(self.device) if cfg.device == "auto" else None
        s = setup(cfg, cfg.seed, load_model(cfg, device))
        system = SYSTEM.get(cfg.variant, cfg.variant)
        result = run_systems(s, ("base", system), keep=system)
        after = result["metrics"][system]
        before = result["metrics"]["base"]
        weights = result["kept"]
        if self.rank != 0:
            weights = {k: torch.zeros(0) for k in weights}
        self.weights = weights
        self.edit_extra = checkpoint_extra(s, result)
        return {**after, **{f"{k}_before": v for k, v in before.items()}}

    def state(self) -> dict[str, torch.Tensor]:
        return self.weights

    def extra(self) -> dict[str, Any] | None:
        return self.edit_extra


def train_loop(cfg: ZeroUnlearnConfig) -> None:
    """The edit on rank 0 with full weights; reports the metrics before and after."""
    train(ZeroUnlearnRecipe(cfg))
