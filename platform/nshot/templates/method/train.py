"""skeleton's train loop: episodic training of the embedding.

Step ``s`` draws its episodes from a generator seeded by ``(seed, s, rank)``, so a run resumed
from the checkpoint of step ``k`` sees the episodes an uninterrupted run sees from step
``k + 1`` on; with the optimizer state in the checkpoint, it ends with the same weights.
:func:`fit` runs the same steps without Ray Train, for the comparison's jobs.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from nshot.train import session

from .config import SkeletonConfig
from .data import episode, examples
from .model import SkeletonModel, build_model, prototype_logits


def train_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    data: tuple[np.ndarray, np.ndarray],
    cfg: SkeletonConfig,
    rng: np.random.Generator,
    device: torch.device | str = "cpu",
) -> tuple[float, float]:
    """One optimizer step over ``batch_episodes`` episodes: ``(loss, episode accuracy)``."""
    loss = torch.zeros((), device=device)
    correct = 0.0
    for _ in range(cfg.batch_episodes):
        sx, sy, qx, qy = (torch.from_numpy(a).to(device) for a in episode(*data, cfg, rng))
        logits = prototype_logits(model(sx), sy, model(qx), cfg.ways)
        loss = loss + F.cross_entropy(logits, qy) / cfg.batch_episodes
        correct += float((logits.argmax(1) == qy).float().mean()) / cfg.batch_episodes
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item(), correct


def train_loop(cfg: SkeletonConfig) -> None:
    """What Ray Train runs on each worker (and in-process with ``--workers 0``)."""
    ctx = session.context()
    model = session.prepare_model(build_model(cfg))
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    restored = session.restore(model, opt)  # None on a fresh run
    start = restored.step if restored else 0
    data = examples(cfg, "train")
    losses, accs = [], []
    for step in range(start + 1, cfg.steps + 1):
        session.maybe_inject_fault(step, restored)  # the tests' fault injection
        rng = np.random.default_rng([cfg.seed, step, ctx.rank])
        loss, acc = train_step(model, opt, data, cfg, rng, ctx.device)
        losses.append(loss)
        accs.append(acc)
        is_ckpt = step % cfg.checkpoint_every == 0 or step == cfg.steps
        if step % cfg.log_every == 0 or is_ckpt:
            session.report(
                {"loss": float(np.mean(losses)), "episode_acc": float(np.mean(accs))},
                step=step,
                model=model,
                optimizer=opt,
                checkpoint=is_ckpt,
                samples=len(losses) * cfg.batch_episodes,
            )
            losses, accs = [], []


def fit(cfg: SkeletonConfig) -> SkeletonModel:
    """The model ``train_loop`` trains on one worker, trained here without Ray Train."""
    model = build_model(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    data = examples(cfg, "train")
    for step in range(1, cfg.steps + 1):
        train_step(model, opt, data, cfg, np.random.default_rng([cfg.seed, step, 0]))
    return model.eval()
