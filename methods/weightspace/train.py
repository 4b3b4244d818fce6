"""Training of the OCE meta-network (one recipe of :mod:`nshot.train.trainer`, run in process
by the experiments and under Ray Train by ``train_loop``), its evaluation, and the oracle floors
(the paper's capacity analysis).

Step ``s`` draws the ``s``-th batch of a generator seeded by ``seed``; a resumed run draws the
batches of the steps it skips, so it sees what an uninterrupted run would have seen."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from nshot.train.trainer import Recipe
from nshot.train.trainer import train as train_recipe

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
    dev = x.device  # the data follow the grid (the model's device)
    for i in range(0, len(data), 512):
        d = data.subset(slice(i, i + 512))
        eW1, eb1, eW2, eb2, deltas = model(*(t.to(dev) for t in (d.W1, d.b1, d.W2, d.b2)))
        out.append(rel_mse(render(eW1, eb1, eW2, eb2, x).mean(1), d.target.to(dev)))
        seps.append(copy_separation_flat(deltas) * len(d))
    model.train()
    return {"rel_mse": float(torch.cat(out).mean()), "copy_separation": sum(seps) / len(data)}


class WeightspaceRecipe(Recipe):
    """The OCE meta-network trained end to end through rendering: Adam ``lr`` with a cosine
    decay to ``lr_min`` over ``steps``, batch ``batch`` (each worker takes its slice), gradient
    clipping; the training loss, the test rel_mse and the copy separation every ``eval_every``
    steps (checkpoints every ``checkpoint_every``, a multiple of it).

    ``model``/``train``/``test``/``seed`` given: a row of the experiments, trained in-process
    on what the caller built (``on_eval(step, row)`` sees every evaluation)."""

    def __init__(
        self,
        cfg: WeightspaceConfig,
        model: DeepSetsOCE | None = None,
        train: INRSet | None = None,
        test: INRSet | None = None,
        *,
        seed: int | None = None,
        on_eval: Callable[[int, dict[str, float]], None] | None = None,
    ) -> None:
        super().__init__(cfg)
        self.model, self.train_set, self.test_set = model, train, test
        self.seed = cfg.seed if seed is None else seed
        self.on_eval = on_eval

    def build(self) -> None:
        cfg = self.cfg
        if self.model is None:
            torch.manual_seed(cfg.seed)
            self.model = build(cfg)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        if self.train_set is None or self.test_set is None:
            self.train_set, self.test_set = splits(cfg)
        self.clip_grad_norm = cfg.clip
        self.samples_per_step = cfg.batch // self.world_size
        self.x = grid(cfg).float().to(self.device)
        self.gen = torch.Generator().manual_seed(self.seed * 7919 + 1)
        self.history: list[dict[str, float]] = []
        self.resumed_from: list[int] = []

    def schedule(self) -> tuple[int, int, int]:
        cfg = self.cfg
        return int(cfg.steps), int(cfg.eval_every), int(cfg.checkpoint_every)

    def on_restore(self, restored) -> None:  # noqa: ANN001
        self.resumed_from = [*restored.extra.get("resumed_from", []), restored.step]
        for _ in range(restored.step):  # continue the batch sequence of the resumed run
            torch.randint(len(self.train_set), (self.cfg.batch,), generator=self.gen)

    def lr_at(self, step: int) -> float:
        cfg = self.cfg
        t = min(step, cfg.steps) / cfg.steps
        return cfg.lr_min + 0.5 * (cfg.lr - cfg.lr_min) * (1 + math.cos(math.pi * t))

    def loss(self, step: int, micro: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.cfg
        idx = torch.randint(len(self.train_set), (cfg.batch,), generator=self.gen)
        d = self.train_set.subset(idx[self.rank :: self.world_size])
        for g in self.optimizer.param_groups:
            g["lr"] = self.lr_at(step - 1)
        W1, b1, W2, b2, target = (t.to(self.device) for t in (d.W1, d.b1, d.W2, d.b2, d.target))
        pred = oce_render(self.forward, W1, b1, W2, b2, self.x)
        loss = ((pred - target) ** 2).mean()
        return loss, {"loss": float(loss.detach())}

    def on_report(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        ev = evaluate_model(self.model, self.test_set, self.x)
        metrics = {**metrics, "test_rel_mse": ev["rel_mse"],
                   "copy_separation": ev["copy_separation"]}  # fmt: skip
        row = {"step": float(step), **metrics}
        self.history.append(row)
        if self.on_eval is not None:
            self.on_eval(step, row)
        return metrics

    def extra(self) -> dict[str, Any]:
        cfg, model = self.cfg, self.model
        return {"model": model.describe(), "params": count_params(model), "task": cfg.task,
                "grid": cfg.grid, "radius": cfg.radius,
                "resumed_from": self.resumed_from}  # fmt: skip


def train_model(
    model: DeepSetsOCE,
    train: INRSet,
    test: INRSet,
    cfg: WeightspaceConfig,
    *,
    seed: int,
    on_eval: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, Any]:
    """Train ``model`` in this process (a row of the experiments) with the recipe a worker
    runs (:class:`WeightspaceRecipe`); ``on_eval(step, row)`` sees every evaluation."""
    t0 = time.time()
    recipe = WeightspaceRecipe(cfg, model, train, test, seed=seed, on_eval=on_eval)
    train_recipe(recipe, session=False)
    return {"history": recipe.history, "seconds": time.time() - t0}


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
    """Train one (backbone, k) configuration end to end through rendering under Ray Train:
    every worker takes its slice of each batch (DDP averages the gradients)."""
    train_recipe(WeightspaceRecipe(cfg))


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
