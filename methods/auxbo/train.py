"""Meta-training of auxbo's TNP: in-process for the experiments (:func:`meta_train`), under Ray
Train for ``nshot train auxbo`` (:func:`train_loop`); both keep the step whose held-back NLL is
lowest when ``select_tasks`` > 0."""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
import torch

from nshot.errors import NshotError
from nshot.train.trainer import Recipe
from nshot.train.trainer import train as train_recipe

from .config import AuxBOConfig
from .data import load_family
from .model import (
    TNP,
    TNPConfig,
    evaluate_prediction,
    family_stats,
    nll_loss,
    sample_batch,
    save_tnp,
)
from .taskstore import Task


def _log(msg: str) -> None:
    print(f"[auxbo] {msg}", file=sys.stderr, flush=True)


def tnp_config(cfg: AuxBOConfig, tasks: list[Task], use_h: bool | None = None) -> TNPConfig:
    t = tasks[0]
    return TNPConfig(
        x_dim=int(t.X.shape[1]),
        h_len=int(t.h.shape[1]),
        h_dim=int(t.h.shape[2]),
        d=cfg.d,
        heads=cfg.heads,
        layers_h=cfg.layers_h,
        layers=cfg.layers,
        use_h=cfg.use_h if use_h is None else use_h,
    )


def batch_shape(cfg: AuxBOConfig, tasks: list[Task]) -> tuple[int, int]:
    """``(n_max, m_targets)`` that fit the smallest task (history tasks can be small)."""
    smallest = min(len(t.f) for t in tasks)
    if smallest < 2:
        raise NshotError("every task needs at least 2 evaluated designs")
    m = min(cfg.m_targets, smallest - 1)
    return max(1, min(cfg.n_max, smallest - m)), m


SELECT_CONTEXTS = (1, 2, 5, 10)  # context sizes whose mean NLL picks the step (select_tasks)


def selection_split(cfg: AuxBOConfig, train: list[Task]) -> tuple[list[Task], list[Task]]:
    """``(fit, select)``: ``cfg.select_tasks`` history tasks held back (seeded) for picking the
    meta-training step; ``select`` is empty when ``select_tasks`` is 0."""
    k = cfg.select_tasks
    if k == 0:
        return list(train), []
    if k >= len(train):
        raise NshotError(
            f"select_tasks={k} leaves no history task to train on ({len(train)} history tasks)"
        )
    perm = np.random.default_rng([cfg.seed, 7919]).permutation(len(train))
    held = set(int(i) for i in perm[:k])
    fit = [t for i, t in enumerate(train) if i not in held]
    return fit, [train[i] for i in sorted(held)]


def selection_nll(
    model: TNP,
    tasks: list[Task],
    m: int,
    stats: dict[str, Any],
    seed: int,
    h_shuffle: bool = False,
) -> float:
    """Mean NLL over :data:`SELECT_CONTEXTS` (those that fit) on held-back history tasks
    (``h_shuffle``: with every context h taken from another design of the same task)."""
    smallest = min(len(t.f) for t in tasks)
    sizes = tuple(n for n in SELECT_CONTEXTS if n + m <= smallest) or (1,)
    pred = evaluate_prediction(
        model, tasks, sizes, min(m, smallest - max(sizes)), stats, seed=seed, h_shuffle=h_shuffle
    )
    return float(np.mean([pred[n]["nll"] for n in sizes]))


class AuxBORecipe(Recipe):
    """Meta-training of the TNP: Adam on the Gaussian NLL of a batch of history tasks per step
    (drawn from ``(seed, step, rank)``), the gradient clipped to ``grad_clip``; with
    ``select_tasks`` > 0 the held-back tasks' NLL every ``select_every`` steps picks the step
    whose weights are kept.

    Under Ray Train (no ``tasks`` given) it reads the config's family, reports the NLL and MSE
    on the first ``eval_tasks`` held-out tasks (and the selection) and checkpoints the family's
    description; in-process (:func:`meta_train`) it trains on the given tasks and keeps the
    mean loss of every ``log_every`` steps."""

    def __init__(
        self,
        cfg: AuxBOConfig,
        tasks: list[Task] | None = None,
        stats: dict[str, Any] | None = None,
        use_h: bool | None = None,
        *,
        h_shuffle: bool = False,
        progress: str | None = None,
    ) -> None:
        super().__init__(cfg)
        self.tasks, self.stats, self.use_h = tasks, stats, use_h
        self.h_shuffle, self.progress = h_shuffle, progress
        self.clip_grad_norm = cfg.grad_clip
        self.samples_per_step = cfg.batch_tasks

    def build(self) -> None:
        cfg = self.cfg
        self.test: list[Task] = []
        self.info: dict[str, Any] = {}
        if self.tasks is None:  # the config's family (a Ray Train run)
            self.tasks, self.test, self.info = load_family(cfg)
            self.stats = family_stats(self.tasks)
        tasks = self.tasks
        self.tcfg = tnp_config(cfg, tasks, self.use_h)
        torch.manual_seed(cfg.seed)
        self.model = TNP(self.tcfg)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        self.n_max, self.m = batch_shape(cfg, tasks)
        self.fit, self.held = selection_split(cfg, tasks)  # held: picks the step that is kept
        self.best: tuple[float, int, dict[str, torch.Tensor]] | None = None
        self.curve_steps: list[int] = []
        self.curve_nll: list[float] = []
        self.losses: list[float] = []
        self.window: list[float] = []
        self.selected: tuple[int, float] | None = None  # (step, its held-back NLL)
        self.t0 = time.time()
        if self.session:
            self.val = self.test[: cfg.eval_tasks]
            self.n_val = min(5, self.n_max, min(len(t.f) for t in self.val) - 1)

    def schedule(self) -> tuple[int, int, int]:
        steps, log_every, checkpoint_every = super().schedule()
        if not self.session:  # the loss is averaged over every log_every steps (and the last)
            return steps, log_every, log_every
        return steps, log_every, checkpoint_every

    def is_report(self, step: int) -> bool:
        """Every ``log_every`` steps, and a run that selects its kept step reports at every
        selection too."""
        if self.session and self.held and step % self.cfg.select_every == 0:
            return True
        return super().is_report(step)

    def loss(self, step: int, micro: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.cfg
        rng = np.random.default_rng([cfg.seed, step, self.rank])
        batch = sample_batch(
            self.fit, cfg.batch_tasks, self.n_max, self.m, rng, self.stats,
            h_shuffle=self.h_shuffle,
        )  # fmt: skip
        loss = nll_loss(self.forward, batch)  # through the DDP wrapper when there is one
        return loss, {"loss": float(loss.detach())}

    def step(self, step: int) -> dict[str, float]:
        self.forward.train()
        stats = super().step(step)
        self.window.append(stats["loss"])
        last = self.schedule()[0]
        if self.held and (step % self.cfg.select_every == 0 or step == last):
            net = self.model
            sel = selection_nll(net, self.held, self.m, self.stats, self.cfg.seed,
                                h_shuffle=self.h_shuffle)  # fmt: skip
            net.train()
            self.curve_steps.append(step)
            self.curve_nll.append(sel)
            if self.best is None or sel < self.best[0]:
                state = {k: v.detach().clone() for k, v in net.state_dict().items()}
                self.best = (sel, step, state)
            if step == last and self.session:  # the final checkpoint holds the kept weights
                net.load_state_dict(self.best[2])
                sel = self.best[0]
                _log(f"kept step {self.best[1]} (held-back nll {self.best[0]:.3f})")
            self.selected = (step, sel)
        return stats

    def on_report(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        loss = float(np.mean(self.window or [float("nan")]))
        self.window = []
        if not self.session:
            self.losses.append(loss)
            if self.progress:
                sel = f", held-back nll {self.curve_nll[-1]:.3f}" if self.curve_nll else ""
                _log(
                    f"{self.progress}: step {step}/{self.cfg.steps} nll {loss:.3f}{sel} "
                    f"({time.time() - self.t0:.0f}s)"
                )
            return {**metrics, "loss": loss}
        net = self.model
        net.eval()
        pred = evaluate_prediction(net, self.val, n_ctx_list=(self.n_val,), m_targets=self.m,
                                   stats=self.stats, seed=self.cfg.seed)  # fmt: skip
        out = {"loss": loss, "val_nll": pred[self.n_val]["nll"],
               "val_mse": pred[self.n_val]["mse"]}  # fmt: skip
        if self.best is not None:
            selected = self.selected is not None and self.selected[0] == step
            out.update(
                select_nll=self.selected[1] if selected else self.best[0], kept_step=self.best[1]
            )
        return out

    def extra(self) -> dict[str, Any]:
        info = self.info
        return {
            "tnp": self.tcfg.to_dict(),
            "stats": self.stats,
            "family": self.cfg.family,
            "space": info.get("space"),
            "space_hash": info.get("space_hash"),
            "history_method": info.get("method"),
            "tasks": {"train": len(self.fit), "held_back": len(self.held), "test": len(self.test)},
        }


def meta_train(
    cfg: AuxBOConfig,
    train: list[Task],
    stats: dict[str, Any],
    use_h: bool,
    *,
    progress: str | None = None,
    selection: dict[str, Any] | None = None,
    h_shuffle: bool = False,
) -> tuple[TNP, list[float]]:
    """Meta-train one TNP in-process (used by experiments(); train_loop reports through Ray).

    ``h_shuffle`` (needs ``use_h``): every context h, in training and in the step selection, is
    the h of another random design of the same task, so the model can learn what the set of h
    values says about the task but nothing about the individual design (the ``h_set`` control).
    With ``cfg.select_tasks`` > 0 the model is trained on the other history tasks and the
    returned weights are those of the evaluated step (every ``cfg.select_every``) with the
    lowest :func:`selection_nll` on the held-back ones; ``selection`` (a dict, if given)
    receives ``best_step``, ``best_nll``, ``steps`` and ``nll`` (the curve)."""
    if h_shuffle and not use_h:
        raise ValueError("h_shuffle needs a model that reads h (use_h=True)")
    recipe = AuxBORecipe(cfg, train, stats, use_h, h_shuffle=h_shuffle, progress=progress)
    train_recipe(recipe, session=False)
    model, best = recipe.model, recipe.best
    if best is not None:
        model.load_state_dict(best[2])
        if progress:
            _log(f"{progress}: kept step {best[1]} (held-back nll {best[0]:.3f})")
        if selection is not None:
            selection.update(
                best_step=best[1], best_nll=best[0], steps=recipe.curve_steps,
                nll=recipe.curve_nll, tasks=[t.name for t in recipe.held],
            )  # fmt: skip
    model.eval()
    return model, recipe.losses


def train_loop(cfg: AuxBOConfig) -> None:
    """Meta-train the TNP on the config's family under Ray Train: every ``checkpoint_every``
    steps a checkpoint, the held-back tasks pick the step that is kept (``select_tasks``), and a
    history family also saves the surrogate the Tune searcher reads."""
    recipe = train_recipe(AuxBORecipe(cfg))
    info = recipe.info
    if cfg.family == "history" and recipe.rank == 0 and info.get("space_hash"):
        from .searcher import surrogate_dir_for_hash

        extra = recipe.extra()
        folder = save_tnp(
            recipe.model, recipe.stats, surrogate_dir_for_hash(info["space_hash"]),
            extra={k: extra[k] for k in ("space", "space_hash", "history_method")},
        )  # fmt: skip
        _log(f"surrogate for space {info['space_hash']} saved to {folder}")
