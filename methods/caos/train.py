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

from nshot.train import session

from .config import CAOSConfig
from .model import fit_bank


def train_loop(cfg: CAOSConfig) -> None:
    restored = session.restore()
    start = restored.step if restored else 0
    for step in range(start + 1, cfg.steps + 1):
        session.maybe_inject_fault(step, restored)
        ref, bank, extra = fit_bank(cfg)  # the same bank at every step: it is closed-form
        q = np.quantile(bank.loo_sorted, [0.1, 0.5, 0.9])
        metrics = {
            "n": float(bank.n),
            "k": float(bank.k),
            "loo_q10": q[0],
            "loo_q50": q[1],
            "loo_q90": q[2],
            **{f"q_hat_a{round(a * 100):02d}": min(bank.q_hat(a), 1e9) for a in cfg.alphas},
        }
        is_ckpt = step % cfg.checkpoint_every == 0 or step == cfg.steps
        if step % cfg.log_every == 0 or is_ckpt:
            session.report(
                metrics,
                step=step,
                model={
                    "ref": torch.from_numpy(ref.astype(np.float32)),
                    "loo_sorted": torch.from_numpy(bank.loo_sorted.astype(np.float32)),
                },
                extra=extra,
                checkpoint=is_ckpt,
            )
