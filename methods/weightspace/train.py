"""Training of the OCE meta-network and the oracle floors (spec §2–3)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from .backbones import copy_separation_flat
from .config import WeightspaceConfig
from .data import INRSet, grid
from .model import DeepSetsOCE, oce_render, rel_mse, render


def build(cfg: WeightspaceConfig, k: int | None = None, head_init: str | None = None):
    k = cfg.k if k is None else k
    return DeepSetsOCE(cfg.backbone_width(k), cfg.res_layers, k, head_init or cfg.head_init)


@torch.no_grad()
def evaluate_model(model: DeepSetsOCE, data: INRSet, x: torch.Tensor) -> dict[str, float]:
    model.eval()
    out = []
    seps = []
    for i in range(0, len(data), 512):
        d = data.subset(slice(i, i + 512))
        eW1, eb1, eW2, eb2, deltas = model(d.W1, d.b1, d.W2, d.b2)
        out.append(rel_mse(render(eW1, eb1, eW2, eb2, x).mean(1), d.target))
        seps.append(copy_separation_flat(deltas) * len(d))
    model.train()
    return {"rel_mse": float(torch.cat(out).mean()), "copy_separation": sum(seps) / len(data)}


def train_model(
    model: DeepSetsOCE,
    train: INRSet,
    test: INRSet,
    cfg: WeightspaceConfig,
    *,
    seed: int,
    forward: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    start: int = 0,
    rank: int = 0,
    world: int = 1,
    on_eval: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, Any]:
    """Adam ``lr`` with a cosine decay to ``lr_min`` over ``steps``, batch ``batch`` (each of
    ``world`` ranks takes its slice), gradient clipping; evaluates every ``eval_every``."""
    fwd = forward if forward is not None else model
    x = grid(cfg).float()
    opt = optimizer or torch.optim.Adam(model.parameters(), lr=cfg.lr)

    def lr_at(step: int) -> float:
        t = min(step, cfg.steps) / cfg.steps
        return cfg.lr_min + 0.5 * (cfg.lr - cfg.lr_min) * (1 + math.cos(math.pi * t))

    gen = torch.Generator().manual_seed(seed * 7919 + 1)
    for _ in range(start):  # continue the batch sequence of a resumed run
        torch.randint(len(train), (cfg.batch,), generator=gen)
    history: list[dict[str, float]] = []
    t0 = time.time()
    window: list[float] = []
    for step in range(start + 1, cfg.steps + 1):
        idx = torch.randint(len(train), (cfg.batch,), generator=gen)[rank::world]
        d = train.subset(idx)
        for g in opt.param_groups:
            g["lr"] = lr_at(step - 1)
        pred = oce_render(fwd, d.W1, d.b1, d.W2, d.b2, x)
        loss = ((pred - d.target) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        window.append(float(loss.detach()))
        if step % cfg.eval_every == 0 or step == cfg.steps:
            ev = evaluate_model(model, test, x)
            row = {"step": float(step), "loss": sum(window) / len(window),
                   "test_rel_mse": ev["rel_mse"], "copy_separation": ev["copy_separation"]}  # fmt: skip
            window = []
            history.append(row)
            if on_eval is not None:
                on_eval(step, row)
    return {"history": history, "seconds": time.time() - t0}


def fit_oracle(
    target: torch.Tensor, k: int, cfg: WeightspaceConfig, *, start: INRSet, seed: int
) -> torch.Tensor:
    """Fit k averaged 1→3→1 ReLU INRs directly to each target (no meta-network), starting from
    the input INR plus noise; best of ``oracle_restarts``; returns the per-target rel_mse."""
    x = grid(cfg).float()
    best = torch.full((len(target),), math.inf)
    g = torch.Generator().manual_seed(seed)
    for r in range(cfg.oracle_restarts):
        noise = 0.1 if r else 0.01

        def init(t: torch.Tensor, noise: float = noise) -> torch.nn.Parameter:
            rep = t[:, None].repeat_interleave(k, dim=1)
            return torch.nn.Parameter(rep + noise * torch.randn(rep.shape, generator=g))

        params = [init(start.W1), init(start.b1), init(start.W2), init(start.b2)]
        opt = torch.optim.Adam(params, lr=1e-2)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg.oracle_steps, eta_min=1e-4)
        for _ in range(cfg.oracle_steps):
            pred = render(*params, x).mean(1)
            loss = ((pred - target) ** 2).mean(-1).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        with torch.no_grad():
            best = torch.minimum(best, rel_mse(render(*params, x).mean(1), target))
    return best
