"""POMO REINFORCE training of URS under Ray Train.

Each step draws a fresh batch (seeded by ``(seed, step, rank)``) mixing the seen variants
uniformly, runs ``train_starts`` sampled rollouts per instance from distinct first customers,
and minimises ``−A · Σ_t log p_t`` with the shared baseline ``A = R − mean_rollouts R``
(R = −cost). With several workers every rank draws its own batch and DDP averages the
gradients (data-parallel). The learning rate is a pure function of the step and the optimizer
state is checkpointed, so a resumed run continues exactly.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from nshot.train.trainer import Recipe, train

from .config import URSConfig
from .model import RoutingNet, build_model, rollout, solve
from .representation import Instances, generate, generate_mixed


def lr_at(cfg: URSConfig, step: int) -> float:
    return cfg.lr * (0.1 if step > cfg.lr_decay_at * cfg.steps else 1.0)


def size_at(cfg: URSConfig, step: int, rng: np.random.Generator) -> tuple[int, int]:
    """(customers, batch) of a step: train_sizes[0] first, then uniform in [min, max] with the
    batch shrunk as batch·(N0/N)²."""
    n0 = cfg.train_sizes[0]
    if len(cfg.train_sizes) == 1 or step <= cfg.stage1_frac * cfg.steps:
        return n0, cfg.batch_size
    n = int(rng.integers(min(cfg.train_sizes), max(cfg.train_sizes) + 1))
    return n, max(1, round(cfg.batch_size * (n0 / n) ** 2))


def rollout_loss(
    model: torch.nn.Module, cfg: URSConfig, step: int, rank: int = 0
) -> tuple[torch.Tensor, dict[str, float]]:
    """The REINFORCE loss of step ``step``'s batch (the learning rate of ``step`` is set by the
    caller) and its numbers: loss, mean training cost and the batch's customer count ``n``."""
    rng = np.random.default_rng([cfg.seed, step, rank])
    n, batch = size_at(cfg, step, rng)
    inst = generate_mixed(cfg.seen_variants, n, batch, rng, cfg.train_layouts)
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(int(rng.integers(2**31)))
    if isinstance(model, RoutingNet):
        env, logp = rollout(model, inst, cfg.train_starts, 1, mode="sample", generator=gen)
    else:  # RolloutModule, possibly inside DDP: its forward is the rollout
        env, logp = model(inst, cfg.train_starts, gen)
    reward = -env.cost.float()
    adv = reward - reward.mean(-1, keepdim=True)
    loss = -(adv * logp).mean()
    return loss, {"loss": float(loss.detach()), "train_cost": float(env.cost.mean()), "n": n}


def train_step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, cfg: URSConfig, step: int, rank: int = 0
) -> dict[str, float]:
    """One Adam step on :func:`rollout_loss` with the gradient clipped to ``grad_clip``."""
    for group in opt.param_groups:
        group["lr"] = lr_at(cfg, step)
    loss, stats = rollout_loss(model, cfg, step, rank)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    return stats


class RolloutModule(torch.nn.Module):
    """Wraps the network so that DDP's ``forward`` is the sampled rollout (gradient sync on backward)."""

    def __init__(self, net: RoutingNet) -> None:
        super().__init__()
        self.net = net

    def forward(self, inst: Instances, starts: int, gen: torch.Generator):
        return rollout(self.net, inst, starts, 1, mode="sample", generator=gen)


def validation_set(cfg: URSConfig) -> list[Instances]:
    n = cfg.train_sizes[0]
    per = max(1, cfg.val_instances // len(cfg.seen_variants))
    return [generate(v, n, per, cfg.test_seed + 7) for v in cfg.seen_variants]


def validate(net: RoutingNet, sets: list[Instances], starts: int) -> float:
    net.eval()
    costs = [s["cost"] for inst in sets for s in solve(net, inst, starts, aug=1)]
    net.train()
    return float(np.mean(costs))


class URSRecipe(Recipe):
    """POMO REINFORCE on the config's network (URS, or MTPOMO with ``arch="mtpomo"``): Adam at the step's learning rate (:func:`lr_at`), the gradient
    clipped to ``grad_clip``; at each report the validation cost on the seen variants, the
    learning rate and a history of the reports (kept in the checkpoint's extra state)."""

    def __init__(self, cfg: URSConfig, log=None) -> None:  # noqa: ANN001
        super().__init__(cfg)
        self.log = log
        self.clip_grad_norm = cfg.grad_clip
        self.samples_per_step = cfg.batch_size

    def build(self) -> None:
        cfg = self.cfg
        self.model = build_model(cfg)
        self.forward = RolloutModule(self.model)  # DDP's forward is the rollout
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        self.history: list[dict] = []
        self.resumed_from: list[int] = []
        self.steps_seen: list[dict[str, float]] = []  # every step's numbers (in-process runs)
        self.val = validation_set(cfg) if self.session else None
        self._t0 = time.time()

    def on_restore(self, restored) -> None:  # noqa: ANN001
        self.history = list(restored.extra.get("history", []))
        self.resumed_from = [*restored.extra.get("resumed_from", []), restored.step]

    def loss(self, step: int, micro: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.cfg, step)
        loss, stats = rollout_loss(self.forward, self.cfg, step, self.rank)
        self._n = stats.pop("n")
        return loss, stats

    def step(self, step: int) -> dict[str, float]:
        stats = super().step(step)
        if not self.session:
            self.steps_seen.append({**stats, "n": self._n})
            if self.log and step % self.cfg.log_every == 0:
                self.log(f"step {step} loss {stats['loss']:.3f} cost {stats['train_cost']:.3f} "
                         f"({time.time() - self._t0:.0f}s)")  # fmt: skip
        return stats

    def on_report(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        if not self.session:
            return metrics
        metrics = {
            **metrics,
            "val_cost": validate(self.model, self.val, self.cfg.train_starts),
            "lr": lr_at(self.cfg, step),
        }
        self.history.append({"step": step, **metrics})
        return metrics

    def extra(self) -> dict:
        return {"history": self.history, "resumed_from": self.resumed_from}


def train_loop(cfg: URSConfig) -> None:
    """POMO training under Ray Train: every worker trains on its own batches (DDP averages the
    gradients); a report every ``log_every`` steps, a checkpoint every ``checkpoint_every``."""
    train(URSRecipe(cfg))


def train_in_process(cfg: URSConfig, log=None) -> tuple[RoutingNet, list]:
    """The same training without Ray Train (benchmarks, notebooks): the net and every step's
    numbers."""
    recipe = train(URSRecipe(cfg, log), session=False)
    return recipe.model, recipe.steps_seen
