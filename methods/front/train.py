"""Training and initialisation of FRONT's ancestry and descendant ViTs.

One loop trains both: AdamW with a cosine schedule over the whole run, a seeded shuffle, and
the test accuracy after every epoch (``acc_init`` before the first). On several Ray Train
workers each rank takes its slice of every global batch and DDP averages the gradients.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from nshot.errors import NshotError
from nshot.nn.vit import ViT, vit_flops_per_image
from nshot.train import session
from nshot.train.checkpoint import LoadedCheckpoint, load_checkpoint, save_checkpoint

from .config import VERSION, FrontConfig
from .data import Split, load_split
from .model import load_model


def ancestry_vit(cfg: FrontConfig) -> ViT:
    return ViT(
        img_size=8, patch=cfg.patch, in_chans=1, num_classes=10,
        width=cfg.anc_width, depth=cfg.anc_depth, heads=cfg.anc_heads,
    )  # fmt: skip


def descendant_vit(cfg: FrontConfig) -> ViT:
    return ViT(
        img_size=cfg.img_size, patch=cfg.patch, in_chans=1,
        num_classes=2 if cfg.task == "parity" else 10,
        width=cfg.width, depth=cfg.depth, heads=cfg.heads,
    )  # fmt: skip


@torch.no_grad()
def accuracy(model: torch.nn.Module, split: Split, batch: int = 512) -> float:
    was = model.training
    model.eval()
    hits = 0
    for i in range(0, len(split.y), batch):
        hits += int((model(split.x[i : i + batch]).argmax(-1) == split.y[i : i + batch]).sum())
    model.train(was)
    return hits / max(len(split.y), 1)


@dataclass
class History:
    acc_init: float
    acc: list[float] = field(default_factory=list)  # after each epoch
    loss: list[float] = field(default_factory=list)
    seconds: float = 0.0
    flops_per_epoch: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "acc_init": self.acc_init,
            "acc": list(self.acc),
            "loss": list(self.loss),
            "seconds": self.seconds,
            "flops_per_epoch": self.flops_per_epoch,
        }


def train_classifier(
    model: torch.nn.Module,
    train: Split,
    test: Split,
    *,
    epochs: int,
    lr: float,
    weight_decay: float,
    batch: int,
    seed: int,
    warmup_epochs: int = 0,
    forward: torch.nn.Module | None = None,
    penalty: Callable[[], torch.Tensor] | None = None,
    rank: int = 0,
    world: int = 1,
    on_epoch: Callable[[int, History], None] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    start_epoch: int = 0,
    before_epoch: Callable[[int], None] | None = None,
) -> History:
    """Train ``model`` for ``epochs`` on ``train``; ``forward`` is the module that runs the
    batches (a DDP wrapper of ``model``), ``penalty`` an extra loss term (the refinement's
    spectral regulariser). A resumed run passes its restored ``optimizer`` and the epochs
    already done as ``start_epoch``: the schedule and the shuffle continue where they were.
    ``before_epoch(epoch)`` runs before each epoch (the train loop's fault injection)."""
    fwd = forward if forward is not None else model
    opt = optimizer or torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    n = len(train.y)
    steps_per_epoch = max(1, math.ceil(n / batch))
    total = epochs * steps_per_epoch
    warm = min(warmup_epochs * steps_per_epoch, total // 2)

    def schedule(s: int) -> float:  # linear warm-up, then cosine to zero
        if s < warm:
            return (s + 1) / warm
        return 0.5 * (1.0 + math.cos(math.pi * min(s - warm, total - warm) / (total - warm)))

    for g in opt.param_groups:  # the schedule's base lr (a restored group holds a decayed lr)
        g["initial_lr"] = lr
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: schedule(s + start_epoch * steps_per_epoch)
    )
    gen = torch.Generator().manual_seed(seed)
    hist = History(acc_init=accuracy(model, test))
    if isinstance(model, ViT):
        hist.flops_per_epoch = vit_flops_per_image(model) * n
    t0 = time.time()
    model.train()
    for _ in range(start_epoch):
        torch.randperm(n, generator=gen)
    for epoch in range(start_epoch + 1, epochs + 1):
        if before_epoch is not None:
            before_epoch(epoch)
        order = torch.randperm(n, generator=gen)
        losses = []
        for s in range(steps_per_epoch):
            idx = order[s * batch : (s + 1) * batch]
            idx = idx[rank::world] if world > 1 else idx
            loss = F.cross_entropy(fwd(train.x[idx]), train.y[idx])
            if penalty is not None:
                loss = loss + penalty()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
        hist.loss.append(sum(losses) / len(losses))
        hist.acc.append(accuracy(model, test))
        if on_epoch is not None:
            on_epoch(epoch, hist)
    hist.seconds = time.time() - t0
    return hist


def init_from_learngene(target: ViT, gene: Any, cfg: FrontConfig, *, seed: int = 0) -> dict:
    """FRONT's reconstruction of ``target`` from a :class:`~.learngene.Learngene` with the
    config's fill, amplitude and skip settings."""
    from .learngene import front_init

    return front_init(
        target, gene, fill=cfg.fill, use_ratio=cfg.use_ratio, depth_fix=cfg.depth_fix,
        skip=tuple(cfg.dct_skip), seed=seed,
    )  # fmt: skip


def initialise(target: ViT, ancestry: ViT, cfg: FrontConfig, *, seed: int = 0) -> dict[str, Any]:
    """Set ``target``'s weights from ``ancestry`` by ``cfg.init`` (random: leave them)."""
    from .learngene import (
        extract,
        truncation_init,
        uniform_init,
        weight_selection_init,
    )

    if cfg.init == "random":
        return {"transferred": [], "skipped": [], "init": "random"}
    if cfg.init == "front":
        gene = extract(
            ancestry, keep_ratio=cfg.keep_ratio, mlp_dct_dim=cfg.mlp_dct_dim,
            source=ancestry.shape(),
        )  # fmt: skip
        report = init_from_learngene(target, gene, cfg, seed=seed)
    else:
        fn = {
            "truncation": truncation_init,
            "uniform": uniform_init,
            "weight_selection": weight_selection_init,
        }[cfg.init]
        report = fn(target, ancestry)
    return {**report, "init": cfg.init}


def train_ancestry(
    cfg: FrontConfig,
    seed: int,
    on_epoch: Callable[[int, History], None] | None = None,
    before_epoch: Callable[[int], None] | None = None,
) -> tuple[ViT, History]:
    """The source ViT trained on ``ancestry_train`` (ten digits, 8×8)."""
    torch.manual_seed(seed)
    model = ancestry_vit(cfg)
    train = load_split("ancestry_train", seed)
    test = load_split("test", seed)
    hist = train_classifier(
        model, train, test, epochs=cfg.anc_epochs, lr=cfg.lr, weight_decay=cfg.weight_decay,
        batch=cfg.batch, seed=seed, warmup_epochs=cfg.anc_warmup, on_epoch=on_epoch,
        before_epoch=before_epoch,
    )  # fmt: skip
    return model, hist


def refine_ancestry(cfg: FrontConfig, model: ViT, seed: int) -> tuple[ViT, dict[str, float]]:
    """Continue training a copy of the ancestry for ``refine_frac`` of its steps with the
    spectral regulariser λ · Σ_θ E_high(θ̃) / (trainable parameters) (the paper's section 2)."""
    import copy

    from .learngene import high_freq_energy, high_freq_fraction

    refined = copy.deepcopy(model)
    train = load_split("ancestry_train", seed)
    test = load_split("test", seed)
    n_params = sum(p.numel() for p in refined.parameters() if p.requires_grad)
    kr = cfg.refine_keep_ratio
    before = high_freq_fraction(refined, kr)
    acc_before = accuracy(refined, test)
    epochs = max(1, math.ceil(cfg.refine_frac * cfg.anc_epochs))  # whole epochs
    hist = train_classifier(
        refined, train, test, epochs=epochs, lr=cfg.lr * cfg.refine_lr_scale, weight_decay=cfg.weight_decay,
        batch=cfg.batch, seed=seed + 7,
        penalty=lambda: cfg.refine_lambda * high_freq_energy(refined, kr) / n_params,
    )  # fmt: skip
    return refined, {
        "hf_fraction_before": before,
        "hf_fraction_after": high_freq_fraction(refined, kr),
        "acc_before": acc_before,
        "acc_after": hist.acc[-1],
        "refine_steps": float(epochs * math.ceil(len(train.y) / cfg.batch)),
    }


ANCESTRY_FIELDS = (
    "seed", "patch", "anc_width", "anc_depth", "anc_heads", "anc_epochs", "anc_warmup", "lr",
    "weight_decay", "batch", "refine", "refine_lambda", "refine_frac", "refine_keep_ratio",
)  # fmt: skip


def ancestry_key(cfg: FrontConfig) -> str:
    values = {k: getattr(cfg, k) for k in ANCESTRY_FIELDS}
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


def fit_ancestry(
    cfg: FrontConfig,
    seed: int,
    log: bool = False,
    before_epoch: Callable[[int], None] | None = None,
) -> tuple[ViT, dict[str, Any]]:
    """Train the ancestry (and refine it when ``cfg.refine``); returns it and its record."""

    def show(epoch: int, h: History) -> None:
        if log:
            print(f"[nshot front] ancestry epoch {epoch} acc={h.acc[-1]:.3f}", flush=True)

    model, hist = train_ancestry(cfg, seed, on_epoch=show, before_epoch=before_epoch)
    record: dict[str, Any] = {"history": hist.to_dict()}
    if cfg.refine:
        model, record["refine"] = refine_ancestry(cfg, model, seed)
    return model, record


def cached_ancestry(cfg: FrontConfig) -> LoadedCheckpoint:
    """The ancestry checkpoint for ``cfg`` from ``NSHOT_CACHE/front/``, trained on first use."""
    from nshot.data.cache import cache_dir, file_lock

    root = cache_dir() / "front"
    target = root / f"ancestry-{ancestry_key(cfg)}"
    with file_lock(root / f".{target.name}.lock"):
        if not (target / "nshot.json").is_file():
            model, record = fit_ancestry(cfg, cfg.seed, log=True)
            tmp = root / f".tmp-{target.name}-{os.getpid()}"
            save_ancestry(tmp, cfg, model, record)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
    return load_checkpoint(target, method="front")


def ancestry_checkpoint_fields(
    cfg: FrontConfig, model: ViT, record: dict[str, Any]
) -> tuple[dict[str, float], dict[str, Any]]:
    """The metrics and ``extra`` of an ancestry checkpoint (its final accuracy is the refined
    one when it was refined)."""
    acc = record.get("refine", {}).get("acc_after", record["history"]["acc"][-1])
    metrics = {"acc": acc, "acc_init": record["history"]["acc_init"]}
    extra = {"stage": "ancestry", "shape": model.shape(), "ancestry_id": ancestry_key(cfg),
             **record}  # fmt: skip
    return metrics, extra


def save_ancestry(path: Path, cfg: FrontConfig, model: ViT, record: dict[str, Any]) -> Path:
    metrics, extra = ancestry_checkpoint_fields(cfg, model, record)
    return save_checkpoint(
        path, method="front", method_version=VERSION, config=cfg.model_dump(),
        step=cfg.anc_epochs, model_state=model.state_dict(), metrics=metrics, extra=extra,
    )  # fmt: skip


def descendant_source(cfg: FrontConfig) -> tuple[Any, dict[str, Any]]:
    """What a new descendant is initialised from: the learngene at ``learngene_path``, else
    the ancestry (``ancestry_path``, or the cached one); and what to record about it."""
    if cfg.learngene_path is None:
        return load_ancestry(cfg)
    from .learngene import Learngene

    gene = Learngene.load(cfg.learngene_path)
    return gene, {"ancestry_id": gene.source.get("ancestry_id"),
                  "learngene": str(cfg.learngene_path)}  # fmt: skip


def load_ancestry(cfg: FrontConfig) -> tuple[ViT, dict[str, Any]]:
    if cfg.ancestry_path is None:
        ckpt = cached_ancestry(cfg)
    else:
        ckpt = load_checkpoint(cfg.ancestry_path, method="front")
    if ckpt.extra.get("stage") != "ancestry":
        raise NshotError(
            f"ancestry_path: {ckpt.path} is a front {ckpt.extra.get('stage')} checkpoint, "
            "not an ancestry (train one with --set stage=ancestry)"
        )
    return load_model(ckpt), {
        "ancestry_id": ckpt.extra.get("ancestry_id", str(ckpt.path)),
        "ancestry_acc": ckpt.metrics.get("acc"),
        "ancestry_shape": ckpt.extra["shape"],
    }


def train_loop(cfg: FrontConfig) -> None:
    """``stage=ancestry``: train (and optionally refine) the source ViT. ``descendant``:
    initialise a ViT from the ancestry by ``cfg.init`` and train it, every worker on its
    slice of each global batch (DDP averages the gradients). Reports the test accuracy
    after every epoch. A step is an epoch: the descendant checkpoints every
    ``checkpoint_every`` epochs and at the end, and resumes from its last checkpoint; the
    ancestry (seconds to minutes) checkpoints once, at the end, so a resumed ancestry run starts
    over. Both honour the config's ``fail_at_step`` before each epoch."""
    ctx = session.context()
    torch.set_num_threads(cfg.torch_threads)
    if cfg.stage == "ancestry":
        if ctx.world_size > 1:
            raise NshotError("stage=ancestry trains on one worker (--workers 0 or 1)")
        model, record = fit_ancestry(
            cfg, cfg.seed, log=True, before_epoch=lambda e: session.maybe_inject_fault(e, None)
        )
        metrics, extra = ancestry_checkpoint_fields(cfg, model, record)
        session.report(metrics, step=cfg.anc_epochs, model=model, extra=extra,
                       checkpoint=True)  # fmt: skip
        return
    torch.manual_seed(cfg.seed + 1)
    model = descendant_vit(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    restored = session.restore(model, opt)
    start = restored.step if restored else 0
    if restored is None:
        source, source_info = descendant_source(cfg)
        if cfg.learngene_path is None:
            report = initialise(model, source, cfg, seed=cfg.seed)
        else:
            report = init_from_learngene(model, source, cfg, seed=cfg.seed)
        init_info = {
            **source_info,
            "transferred": len(report.get("transferred", [])),
            "skipped": [str(x) for x in report.get("skipped", [])],
        }
    else:  # resumed: the weights and the record of where they came from are in the checkpoint
        init_info = {k: v for k, v in restored.extra.items()
                     if k in ("transferred", "skipped", "ancestry_id", "ancestry_acc",
                              "ancestry_shape", "learngene")}  # fmt: skip
    train = load_split("descendant_train", cfg.seed, task=cfg.task, img_size=cfg.img_size)
    test = load_split("test", cfg.seed, task=cfg.task, img_size=cfg.img_size)
    ddp = session.prepare_model(model)
    extra = {
        "stage": "descendant", "shape": model.shape(), "init": cfg.init,
        "keep_ratio": cfg.keep_ratio, "fill": cfg.fill, "depth_fix": cfg.depth_fix,
        "use_ratio": cfg.use_ratio, "task": cfg.task, **init_info,
    }  # fmt: skip

    def on_epoch(epoch: int, h: History) -> None:
        session.report(
            {"acc": h.acc[-1], "loss": h.loss[-1], "acc_init": h.acc_init},
            step=epoch, model=model, optimizer=opt, extra=extra,
            checkpoint=epoch % cfg.checkpoint_every == 0 or epoch == cfg.epochs,
            samples=len(train.y) // ctx.world_size,
        )  # fmt: skip

    train_classifier(
        model, train, test, epochs=cfg.epochs, lr=cfg.lr, weight_decay=cfg.weight_decay,
        batch=cfg.batch, seed=cfg.seed, warmup_epochs=cfg.warmup, forward=ddp,
        rank=ctx.rank, world=ctx.world_size, on_epoch=on_epoch, optimizer=opt,
        start_epoch=start, before_epoch=lambda e: session.maybe_inject_fault(e, restored),
    )  # fmt: skip
