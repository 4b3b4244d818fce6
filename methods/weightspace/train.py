"""Training of the OCE meta-network (in process, and under Ray Train with checkpoints), its
evaluation, and the oracle floors (the paper's capacity analysis)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .backbones import copy_separation_flat, count_params
from .config import WeightspaceConfig
from .data import INRSet, grid, splits
from .model import DeepSetsOCE, load_model, oce_render, rel_mse, render

if TYPE_CHECKING:
    from nshot.train.checkpoint import LoadedCheckpoint


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
    on_step: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Adam ``lr`` with a cosine decay to ``lr_min`` over ``steps``, batch ``batch`` (each of
    ``world`` ranks takes its slice), gradient clipping; evaluates every ``eval_every``.
    ``on_step(step)`` runs at the start of every step (the Ray Train loop's fault injection)."""
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
        if on_step is not None:
            on_step(step)
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


def train_loop(cfg: WeightspaceConfig) -> None:
    """Train one (backbone, k) configuration end to end through rendering; every worker
    takes its slice of each batch (DDP averages the gradients); reports the training loss,
    the test rel_mse and the copy separation every ``eval_every`` steps and checkpoints
    every ``checkpoint_every``; resumes from the last checkpoint; honours ``fail_at_step``."""
    from nshot.train import session

    ctx = session.context()
    torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    model = build(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    restored = session.restore(model, opt)
    start = restored.step if restored else 0
    ddp = session.prepare_model(model)
    train, test = splits(cfg)
    # resumed_from: the steps this run was resumed from (one entry per resume)
    resumed = [*restored.extra.get("resumed_from", []), start] if restored else []
    extra = {"model": model.describe(), "params": count_params(model), "task": cfg.task,
             "grid": cfg.grid, "radius": cfg.radius, "resumed_from": resumed}  # fmt: skip

    def on_eval(step: int, row: dict[str, float]) -> None:
        session.report(
            {k: v for k, v in row.items() if k != "step"}, step=step, model=model,
            optimizer=opt, extra=extra,
            checkpoint=step % cfg.checkpoint_every == 0 or step == cfg.steps,
            samples=cfg.eval_every * cfg.batch // ctx.world_size,
        )  # fmt: skip

    train_model(model, train, test, cfg, seed=cfg.seed, forward=ddp, optimizer=opt,
                start=start, rank=ctx.rank, world=ctx.world_size, on_eval=on_eval,
                on_step=lambda step: session.maybe_inject_fault(step, restored))  # fmt: skip


def evaluate_checkpoint(checkpoint: LoadedCheckpoint, cfg: WeightspaceConfig) -> dict[str, float]:
    """rel_mse and copy separation on the test INRs, with the identity baseline."""
    model = load_model(checkpoint)
    data_cfg = cfg.replace(**{k: checkpoint.extra[k] for k in ("grid", "radius")
                              if k in checkpoint.extra})  # fmt: skip
    _, test = splits(data_cfg)
    x = grid(data_cfg).float()
    out = evaluate_model(model, test, x)
    ident = rel_mse(render(test.W1, test.b1, test.W2, test.b2, x), test.target)
    return {**out, "identity_rel_mse": float(ident.mean()), "k": float(model.k),
            "params": float(count_params(model))}  # fmt: skip
