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

from nshot.train import session

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


def train_loop(cfg: TailConfig) -> None:
    ctx = session.context()
    model = session.prepare_model(build_model(cfg))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    restored = session.restore(model, opt)
    start = restored.step if restored else 0
    extra = restored.extra if restored else {"history": [], "resumed_from": []}
    if restored:
        extra["resumed_from"] = [*extra.get("resumed_from", []), start]
    modality = modality_a()
    window_loss = window_acc = 0.0
    window_n = window_samples = 0
    model.train()
    for step in range(start + 1, cfg.steps + 1):
        session.maybe_inject_fault(step, restored)
        rng = train_rng(cfg.seed, step, ctx.rank)
        K, shots = sample_task_shape(cfg, rng)
        source, standardised = modality, False
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
        inputs = {k: batch[k].to(ctx.device) for k in MODEL_INPUTS}
        target = batch["query_y"].to(ctx.device)
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step)
        logits = model(**inputs)
        loss = F.cross_entropy(logits.reshape(-1, K), target.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            window_loss += float(loss)
            window_acc += float((logits.argmax(-1) == target).float().mean())
        window_n += 1
        window_samples += cfg.batch_episodes
        is_ckpt = step % cfg.checkpoint_every == 0 or step == cfg.steps
        if step % cfg.log_every == 0 or is_ckpt:
            metrics = {
                "loss": window_loss / window_n,
                "episode_acc": window_acc / window_n,
                "lr": lr_at(cfg, step),
                "active_dictionary": active_dictionary_size(cfg, step - 1),
            }
            extra["history"].append({"step": step, **metrics})
            session.report(
                metrics,
                step=step,
                model=model,
                optimizer=opt,
                extra=extra,
                checkpoint=is_ckpt,
                samples=window_samples,
            )
            window_loss = window_acc = 0.0
            window_n = window_samples = 0
