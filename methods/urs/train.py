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

from .config import URSConfig
from .model import URSNet, build_model, rollout, solve
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


def train_step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, cfg: URSConfig, step: int, rank: int = 0
) -> dict[str, float]:
    rng = np.random.default_rng([cfg.seed, step, rank])
    n, batch = size_at(cfg, step, rng)
    inst = generate_mixed(cfg.seen_variants, n, batch, rng, cfg.train_layouts)
    for group in opt.param_groups:
        group["lr"] = lr_at(cfg, step)
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(int(rng.integers(2**31)))
    if isinstance(model, URSNet):
        env, logp = rollout(model, inst, cfg.train_starts, 1, mode="sample", generator=gen)
    else:  # RolloutModule, possibly inside DDP: its forward is the rollout
        env, logp = model(inst, cfg.train_starts, gen)
    reward = -env.cost.float()
    adv = reward - reward.mean(-1, keepdim=True)
    loss = -(adv * logp).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    return {"loss": float(loss.detach()), "train_cost": float(env.cost.mean()), "n": n}


class RolloutModule(torch.nn.Module):
    """Wraps URSNet so that DDP's ``forward`` is the sampled rollout (gradient sync on backward)."""

    def __init__(self, net: URSNet) -> None:
        super().__init__()
        self.net = net

    def forward(self, inst: Instances, starts: int, gen: torch.Generator):
        return rollout(self.net, inst, starts, 1, mode="sample", generator=gen)


def validation_set(cfg: URSConfig) -> list[Instances]:
    n = cfg.train_sizes[0]
    per = max(1, cfg.val_instances // len(cfg.seen_variants))
    return [generate(v, n, per, cfg.test_seed + 7) for v in cfg.seen_variants]


def validate(net: URSNet, sets: list[Instances], starts: int) -> float:
    net.eval()
    costs = [s["cost"] for inst in sets for s in solve(net, inst, starts, aug=1)]
    net.train()
    return float(np.mean(costs))


def train_in_process(cfg: URSConfig, log=None) -> tuple[URSNet, list]:
    """The same training without Ray Train (benchmarks, notebooks)."""
    net = build_model(cfg)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    hist = []
    t0 = time.time()
    for step in range(1, cfg.steps + 1):
        m = train_step(net, opt, cfg, step)
        if step % cfg.log_every == 0 and log:
            log(f"step {step} loss {m['loss']:.3f} cost {m['train_cost']:.3f} "
                f"({time.time() - t0:.0f}s)")  # fmt: skip
        hist.append(m)
    return net, hist
