"""CAOS's train loop: nothing is learned by gradient; one step fits the served bank.

The bank is a closed-form function of the config (the labelled set is drawn from the "bank"
stream), so every preset declares ``steps = 1``: the step featurises the labelled set, computes
the leave-one-out scores and checkpoints them. The loop keeps the platform's contract all the
same: a resumed run continues after its last checkpoint, and the base config's fault injection
(``fail_at_step``) fires at the step it names.
"""

from __future__ import annotations

import numpy as np
import torch

from nshot.train.trainer import Recipe, train

from .config import CAOSConfig
from .model import fit_bank


class CAOSRecipe(Recipe):
    """One closed-form step: fit the bank; a resume redoes it (no weights are restored)."""

    def build(self) -> None:
        self.bank_state: dict[str, torch.Tensor] = {}
        self.bank_extra: dict | None = None

    def step(self, step: int) -> dict[str, float]:
        cfg = self.cfg
        ref, bank, extra = fit_bank(cfg)  # the same bank at every step: it is closed-form
        q = np.quantile(bank.loo_sorted, [0.1, 0.5, 0.9])
        self.bank_state = {
            "ref": torch.from_numpy(ref.astype(np.float32)),
            "loo_sorted": torch.from_numpy(bank.loo_sorted.astype(np.float32)),
        }
        self.bank_extra = extra
        return {
            "n": float(bank.n),
            "k": float(bank.k),
            "loo_q10": q[0],
            "loo_q50": q[1],
            "loo_q90": q[2],
            **{f"q_hat_a{round(a * 100):02d}": min(bank.q_hat(a), 1e9) for a in cfg.alphas},
        }

    def state(self) -> dict[str, torch.Tensor]:
        return self.bank_state

    def extra(self) -> dict | None:
        return self.bank_extra


def train_loop(cfg: CAOSConfig) -> None:
    train(CAOSRecipe(cfg))
