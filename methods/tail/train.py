"""TAIL's Ray Train loop: episodic training on modality A.

Every step draws a fresh batch of episodes from a generator seeded by ``(seed, step, rank)``,
so a run resumed from a checkpoint at step k sees exactly the episodes an uninterrupted run
would have seen from step k+1 on. The learning rate is a pure function of the step (linear
warm-up, then constant), and the optimizer state is checkpointed, so a resumed run ends with
the weights of an uninterrupted one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nshot.train.trainer import Recipe, train

from .config import TailConfig
from .episodes import (
    MixedGaussianModality,
    active_dictionary_size,
    make_batch,
    modality_a,
    sample_task_shape,
    train_rng,
)
from .model import TailModel

MODEL_INPUTS = ("support_x", "support_slot", "query_x", "active_slots")


def lr_at(cfg: TailConfig, step: int) -> float:
    """Linear warmup over ``warmup_steps``, then constant; with ``lr_decay_steps`` the last
    that many steps fall linearly (step ``steps`` runs at ``lr / lr_decay_steps``)."""
    left = cfg.steps - step + 1  # steps from this one to the end, this one included
    if cfg.lr_decay_steps and left <= cfg.lr_decay_steps:
        return cfg.lr * left / cfg.lr_decay_steps
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    return cfg.lr


def build_model(cfg: TailConfig) -> TailModel:
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    return TailModel(cfg)


def _mixed_tasks(cfg: TailConfig, rng) -> MixedGaussianModality:
    """One step's generated task family for ``train_tasks="A+mixed"`` (drawn from the step's
    generator, so a resumed run sees the same ones)."""
    return MixedGaussianModality(
        int(rng.integers(8, cfg.d_data + 1)),
        separation=float(rng.uniform(0.7, 1.5)),
        feature_noise=float(rng.uniform(0.5, 2.0)),
    )


class TailRecipe(Recipe):
    """Υ trained on episodes of modality A (and, with ``train_tasks="A+mixed"``, on generated
    task families half the time): AdamW, cross-entropy on the queries, the step's learning rate
    from :func:`lr_at`."""

    def build(self) -> None:
        cfg = self.cfg
        self.model = build_model(cfg)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay
        )
        self.samples_per_step = cfg.batch_episodes
        self.modality = modality_a()
        self.history: list[dict] = []
        self.resumed_from: list[int] = []

    def on_restore(self, restored) -> None:  # noqa: ANN001
        self.history = list(restored.extra.get("history", []))
        self.resumed_from = [*restored.extra.get("resumed_from", []), restored.step]

    def loss(self, step: int, micro: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.cfg
        rng = train_rng(cfg.seed, step, self.rank)
        K, shots = sample_task_shape(cfg, rng)
        source, standardised = self.modality, False
        if cfg.train_tasks == "A+mixed" and rng.random() < 0.5:
            source, standardised = _mixed_tasks(cfg, rng), True
        batch = make_batch(
            source,
            cfg,
            batch=cfg.batch_episodes,
            K=K,
            shots=shots,
            queries=cfg.queries_per_class,
            rng=rng,
            step=step - 1,
            standardised=standardised,
        )
        inputs = {k: batch[k].to(self.device) for k in MODEL_INPUTS}
        target = batch["query_y"].to(self.device)
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(cfg, step)
        logits = self.forward(**inputs)
        loss = F.cross_entropy(logits.reshape(-1, K), target.reshape(-1))
        with torch.no_grad():
            acc = float((logits.argmax(-1) == target).float().mean())
        return loss, {"loss": float(loss.detach()), "episode_acc": acc}

    def on_report(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        metrics = {
            **metrics,
            "lr": lr_at(self.cfg, step),
            "active_dictionary": active_dictionary_size(self.cfg, step - 1),
        }
        self.history.append({"step": step, **metrics})
        return metrics

    def extra(self) -> dict:
        return {"history": self.history, "resumed_from": self.resumed_from}


def train_loop(cfg: TailConfig) -> None:
    train(TailRecipe(cfg))
