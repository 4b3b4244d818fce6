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
from nshot.train import session

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
    torch.manual_seed(cfg.seed)
    fit, held = selection_split(cfg, train)
    model = TNP(tnp_config(cfg, train, use_h))
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    n_max, m = batch_shape(cfg, train)
    losses = []
    t0 = time.time()
    window = []
    best: tuple[float, int, dict[str, torch.Tensor]] | None = None
    curve_steps: list[int] = []
    curve_nll: list[float] = []
    train = fit
    for step in range(1, cfg.steps + 1):
        rng = np.random.default_rng([cfg.seed, step])
        batch = sample_batch(train, cfg.batch_tasks, n_max, m, rng, stats, h_shuffle=h_shuffle)
        loss = nll_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        window.append(float(loss.detach()))
        if held and (step % cfg.select_every == 0 or step == cfg.steps):
            val = selection_nll(model, held, m, stats, cfg.seed, h_shuffle=h_shuffle)
            model.train()
            curve_steps.append(step)
            curve_nll.append(val)
            if best is None or val < best[0]:
                best = (val, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
        if step % cfg.log_every == 0 or step == cfg.steps:
            losses.append(float(np.mean(window)))
            window = []
            if progress:
                sel = f", held-back nll {curve_nll[-1]:.3f}" if curve_nll else ""
                _log(
                    f"{progress}: step {step}/{cfg.steps} nll {losses[-1]:.3f}{sel} "
                    f"({time.time() - t0:.0f}s)"
                )
    if best is not None:
        model.load_state_dict(best[2])
        if progress:
            _log(f"{progress}: kept step {best[1]} (held-back nll {best[0]:.3f})")
        if selection is not None:
            selection.update(
                best_step=best[1], best_nll=best[0], steps=curve_steps, nll=curve_nll,
                tasks=[t.name for t in held],
            )  # fmt: skip
    model.eval()
    return model, losses


def train_loop(cfg: AuxBOConfig) -> None:
    """Meta-train the TNP on the config's family under Ray Train: every ``checkpoint_every``
    steps a checkpoint, the held-back tasks pick the step that is kept (``select_tasks``), and a
    history family also saves the surrogate the Tune searcher reads."""
    ctx = session.context()
    train, test, info = load_family(cfg)
    stats = family_stats(train)
    tcfg = tnp_config(cfg, train)
    torch.manual_seed(cfg.seed)
    model = session.prepare_model(TNP(tcfg))
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    restored = session.restore(model, opt)
    start = restored.step if restored else 0
    n_max, m = batch_shape(cfg, train)
    train, held = selection_split(cfg, train)  # held: picks the step that is kept
    best: tuple[float, int, dict[str, torch.Tensor]] | None = None
    val = test[: cfg.eval_tasks]
    n_val = min(5, n_max, min(len(t.f) for t in val) - 1)
    extra = {
        "tnp": tcfg.to_dict(),
        "stats": stats,
        "family": cfg.family,
        "space": info.get("space"),
        "space_hash": info.get("space_hash"),
        "history_method": info.get("method"),
        "tasks": {"train": len(train), "held_back": len(held), "test": len(test)},
    }
    window = []
    for step in range(start + 1, cfg.steps + 1):
        session.maybe_inject_fault(step, restored)
        rng = np.random.default_rng([cfg.seed, step, ctx.rank])
        batch = sample_batch(train, cfg.batch_tasks, n_max, m, rng, stats)
        model.train()
        loss = nll_loss(model, batch)  # through the DDP wrapper when there is one
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        window.append(float(loss.detach()))
        is_ckpt = step % cfg.checkpoint_every == 0 or step == cfg.steps
        select = bool(held) and (step % cfg.select_every == 0 or step == cfg.steps)
        if select:
            net = session.unwrap(model)
            sel = selection_nll(net, held, m, stats, cfg.seed)
            if best is None or sel < best[0]:
                best = (sel, step, {k: v.detach().clone() for k, v in net.state_dict().items()})
            if step == cfg.steps:  # the final checkpoint holds the selected step's weights
                net.load_state_dict(best[2])
                sel = best[0]
                _log(f"kept step {best[1]} (held-back nll {best[0]:.3f})")
        if step % cfg.log_every == 0 or is_ckpt or select:
            net = session.unwrap(model)
            net.eval()
            pred = evaluate_prediction(
                net, val, n_ctx_list=(n_val,), m_targets=m, stats=stats, seed=cfg.seed
            )
            metrics = {"loss": float(np.mean(window or [float("nan")])),
                       "val_nll": pred[n_val]["nll"], "val_mse": pred[n_val]["mse"]}  # fmt: skip
            if best is not None:
                metrics.update(select_nll=sel if select else best[0], kept_step=best[1])
            window = []
            session.report(
                metrics,
                step=step,
                model=model,
                optimizer=opt,
                extra=extra,
                checkpoint=is_ckpt,
                samples=cfg.batch_tasks,
            )
    if cfg.family == "history" and ctx.rank == 0 and info.get("space_hash"):
        from .searcher import surrogate_dir_for_hash

        folder = save_tnp(
            session.unwrap(model), stats, surrogate_dir_for_hash(info["space_hash"]),
            extra={k: extra[k] for k in ("space", "space_hash", "history_method")},
        )  # fmt: skip
        _log(f"surrogate for space {info['space_hash']} saved to {folder}")
