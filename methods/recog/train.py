"""ReCoG's episodic training (first-order: one Adam step per episode, no inner loop).

A step is one episode on a meta-training target: the target, k, the support, the queries and
the auxiliaries come from a generator seeded by ``(seed, step, rank)``, and torch's own random
state (dropout, Gumbel noise, hidden edges) is reseeded from it, so a run resumed at step s sees
the episodes an uninterrupted run sees. The last training target is held out for the validation
AUC. Loss: query BCE + ``lambda_rel`` · L_rel (CPR) + ``beta`` · L_IB (CGIB).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from nshot.train import session

from .config import RecogConfig
from .data import Track, sample_episode, track_for
from .evaluation import validation_auc
from .model import RecogModel, build_model, episode_tensors


def meta_targets(track: Track) -> tuple[list[int], int]:
    """Training targets for episodes, and the held-out one for validation."""
    return track.train_targets[:-1], track.train_targets[-1]


def new_model(cfg: RecogConfig, track: Track, system: str | None = None) -> torch.nn.Module:
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    model = build_model(cfg, len(track.props), system)
    if isinstance(model, RecogModel):
        model.pair_counts.copy_(torch.from_numpy(np.array(track.pair_counts, dtype=np.float32)))
    return model


def episode_loss(
    model: torch.nn.Module, track: Track, cfg: RecogConfig, step: int, rank: int = 0
) -> tuple[torch.Tensor, dict[str, float]]:
    targets, _ = meta_targets(track)
    rng = np.random.default_rng([cfg.seed, step, rank])
    torch.manual_seed(int(rng.integers(2**31)))
    t = int(rng.choice(targets))
    k = int(rng.choice(cfg.shots))
    ep = sample_episode(track, t, k, cfg.query, rng, n_aux=cfg.n_aux,
                        n_distractors=cfg.n_distractors)  # fmt: skip
    out = model(**episode_tensors(ep))
    cls = F.binary_cross_entropy_with_logits(out.logits, torch.from_numpy(ep.yq))
    loss = cls + cfg.lambda_rel * out.loss_rel + cfg.beta * out.loss_ib
    return loss, {"loss": float(loss.detach()), "cls": float(cls.detach()),
                  "rel": float(out.loss_rel.detach()),
                  "ib": float(out.loss_ib.detach())}  # fmt: skip


def fit_model(
    cfg: RecogConfig,
    track: Track,
    system: str | None = None,
    *,
    model: torch.nn.Module | None = None,
    opt: torch.optim.Optimizer | None = None,
    start: int = 0,
    rank: int = 0,
    forward: torch.nn.Module | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    before_step: Callable[[int], None] | None = None,
) -> torch.nn.Module:
    """Train ``cfg.steps`` episodes (from ``start``); ``forward`` is a DDP wrapper when given."""
    model = model if model is not None else new_model(cfg, track, system)
    opt = opt or torch.optim.Adam(
        model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True
    )
    fwd = forward if forward is not None else model
    model.train()
    for step in range(start + 1, cfg.steps + 1):
        if before_step is not None:
            before_step(step)
        loss, stats = episode_loss(fwd, track, cfg, step, rank)
        if forward is not None:  # every parameter takes part in DDP's reduction
            loss = loss + 0.0 * sum(p.sum() for p in model.parameters())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if on_step is not None:
            on_step(step, stats)
    return model


def property_record(track: Track) -> dict:
    """What a checkpoint keeps about the properties (names, kinds, split)."""
    return {
        "track": track.name,
        "names": list(track.props),
        "kinds": list(track.kinds),
        "train_targets": [track.props[j] for j in track.train_targets],
        "test_targets": [track.props[j] for j in track.test_targets],
    }


def train_loop(cfg: RecogConfig) -> None:
    """Episodic training under Ray Train: every worker trains on its own episodes (DDP averages
    the gradients); loss every ``log_every`` episodes, the validation AUC on the held-out
    training target every ``val_every``, a checkpoint every ``checkpoint_every`` and at the end."""
    ctx = session.context()
    torch.set_num_threads(cfg.torch_threads)
    track = track_for(cfg)
    model = new_model(cfg, track)
    opt = torch.optim.Adam(
        model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True
    )
    restored = session.restore(model, opt)
    start = restored.step if restored else 0
    ddp = session.prepare_model(model)
    _, val_target = meta_targets(track)
    extra = {"props": property_record(track), "system": cfg.system}
    window: list[dict[str, float]] = []
    last_val = [float(restored.metrics.get("val_auc", 0.5)) if restored else 0.5]

    def on_step(step: int, stats: dict[str, float]) -> None:
        window.append(stats)
        is_ckpt = step % cfg.checkpoint_every == 0 or step == cfg.steps
        if step % cfg.val_every == 0 or step == cfg.steps:
            last_val[0] = validation_auc(model, track, cfg, val_target)
            model.train()
        if step % cfg.log_every == 0 or is_ckpt:
            metrics = {k: float(np.mean([w[k] for w in window])) for k in window[0]}
            metrics["val_auc"] = last_val[0]
            session.report(metrics, step=step, model=model, optimizer=opt, extra=extra,
                           checkpoint=is_ckpt, samples=len(window))  # fmt: skip
            window.clear()

    fit_model(
        cfg, track, model=model, opt=opt, start=start, rank=ctx.rank,
        forward=ddp if ctx.world_size > 1 else None, on_step=on_step,
        before_step=lambda s: session.maybe_inject_fault(s, restored),
    )  # fmt: skip
