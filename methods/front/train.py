"""Training and initialisation of FRONT's ancestry and descendant ViTs.

One recipe of :mod:`nshot.train.trainer` trains both (:class:`ClassifierRecipe`, one epoch per
step): AdamW with a cosine schedule over the whole run, a seeded shuffle, and the test accuracy
after every epoch (``acc_init`` before the first). On several Ray Train workers each rank takes
its slice of every global batch and DDP averages the gradients.
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
from nshot.train.checkpoint import LoadedCheckpoint, load_checkpoint, save_checkpoint
from nshot.train.trainer import Recipe
from nshot.train.trainer import train as train_recipe

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
    dev = next(model.parameters()).device  # the split follows the model
    hits = 0
    for i in range(0, len(split.y), batch):
        pred = model(split.x[i : i + batch].to(dev)).argmax(-1)
        hits += int((pred == split.y[i : i + batch].to(dev)).sum())
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


class ClassifierRecipe(Recipe):
    """A ViT trained on a split, one epoch per step: AdamW with a linear warm-up, then a cosine
    to zero over the run's batches, a shuffle seeded by ``seed`` (each worker takes its slice of
    every global batch; a resumed run draws the skipped epochs' orders first), ``penalty`` an
    extra loss term (the refinement's spectral regulariser), and the test accuracy after every
    epoch (``acc_init`` before this run's first). Reports every epoch.

    The optimiser is :attr:`opt`; a recipe whose checkpoints carry it (the descendant) also
    sets it as :attr:`optimizer`."""

    def __init__(
        self,
        cfg: FrontConfig | None,
        model: torch.nn.Module | None = None,
        train: Split | None = None,
        test: Split | None = None,
        *,
        epochs: int,
        lr: float,
        weight_decay: float,
        batch: int,
        seed: int,
        warmup_epochs: int = 0,
        penalty: Callable[[], torch.Tensor] | None = None,
        on_epoch: Callable[[int, History], None] | None = None,
    ) -> None:
        super().__init__(cfg)
        self.model, self.train_split, self.test_split = model, train, test
        self.epochs, self.lr, self.weight_decay, self.batch = epochs, lr, weight_decay, batch
        self.seed, self.warmup_epochs = seed, warmup_epochs
        self.penalty, self.on_epoch = penalty, on_epoch
        self.hist: History | None = None

    def setup(self) -> None:
        """Build :attr:`model` and the splits when the caller did not give them."""

    def build(self) -> None:
        self.setup()
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=self.lr, weight_decay=self.weight_decay
        )
        n = len(self.train_split.y)
        self.steps_per_epoch = max(1, math.ceil(n / self.batch))
        self.total = self.epochs * self.steps_per_epoch
        self.warm = min(self.warmup_epochs * self.steps_per_epoch, self.total // 2)
        self.gen = torch.Generator().manual_seed(self.seed)
        self.samples_per_step = n // self.world_size

    def schedule(self) -> tuple[int, int, int]:
        return self.epochs, 1, self.epochs

    def lr_factor(self, s: int) -> float:
        """Linear warm-up, then cosine to zero (``s``: the batch step of the whole run)."""
        warm, total = self.warm, self.total
        if s < warm:
            return (s + 1) / warm
        return 0.5 * (1.0 + math.cos(math.pi * min(s - warm, total - warm) / (total - warm)))

    def begin(self, start: int) -> None:
        """This run's first epoch: the schedule continues from ``start`` epochs (the restored
        optimiser's groups hold a decayed lr, so the base lr is set again)."""
        for g in self.opt.param_groups:
            g["initial_lr"] = self.lr
        offset = start * self.steps_per_epoch
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: self.lr_factor(s + offset)
        )
        self.hist = History(acc_init=accuracy(self.model, self.test_split))
        if isinstance(self.model, ViT):
            self.hist.flops_per_epoch = vit_flops_per_image(self.model) * len(self.train_split.y)
        self.t0 = time.time()
        self.model.train()
        for _ in range(start):
            torch.randperm(len(self.train_split.y), generator=self.gen)

    def step(self, step: int) -> dict[str, float]:
        if self.hist is None:
            self.begin(step - 1)
        hist, train, batch = self.hist, self.train_split, self.batch
        order = torch.randperm(len(train.y), generator=self.gen)
        losses = []
        for s in range(self.steps_per_epoch):
            idx = order[s * batch : (s + 1) * batch]
            idx = idx[self.rank :: self.world_size] if self.world_size > 1 else idx
            x, y = train.x[idx].to(self.device), train.y[idx].to(self.device)
            loss = F.cross_entropy(self.forward(x), y)
            if self.penalty is not None:
                loss = loss + self.penalty()
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            self.sched.step()
            losses.append(float(loss.detach()))
        hist.loss.append(sum(losses) / len(losses))
        hist.acc.append(accuracy(self.model, self.test_split))
        hist.seconds = time.time() - self.t0
        if self.on_epoch is not None:
            self.on_epoch(step, hist)
        return {"acc": hist.acc[-1], "loss": hist.loss[-1], "acc_init": hist.acc_init}


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
    penalty: Callable[[], torch.Tensor] | None = None,
    on_epoch: Callable[[int, History], None] | None = None,
) -> History:
    """Train ``model`` for ``epochs`` on ``train`` in this process (:class:`ClassifierRecipe`,
    the recipe a worker runs)."""
    recipe = ClassifierRecipe(
        None, model, train, test, epochs=epochs, lr=lr, weight_decay=weight_decay, batch=batch,
        seed=seed, warmup_epochs=warmup_epochs, penalty=penalty, on_epoch=on_epoch,
    )  # fmt: skip
    train_recipe(recipe, session=False)
    return recipe.hist


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


def _ancestry_parts(cfg: FrontConfig, seed: int) -> tuple[ViT, Split, Split]:
    torch.manual_seed(seed)
    model = ancestry_vit(cfg)
    return model, load_split("ancestry_train", seed), load_split("test", seed)


def train_ancestry(
    cfg: FrontConfig, seed: int, on_epoch: Callable[[int, History], None] | None = None
) -> tuple[ViT, History]:
    """The source ViT trained on ``ancestry_train`` (ten digits, 8×8) at the ancestry's
    learning rate (:meth:`FrontConfig.ancestry_lr`)."""
    model, train, test = _ancestry_parts(cfg, seed)
    hist = train_classifier(
        model, train, test, epochs=cfg.anc_epochs, lr=cfg.ancestry_lr(),
        weight_decay=cfg.weight_decay,
        batch=cfg.batch, seed=seed, warmup_epochs=cfg.anc_warmup, on_epoch=on_epoch,
    )  # fmt: skip
    return model, hist


def refine_ancestry(cfg: FrontConfig, model: ViT, seed: int) -> tuple[ViT, dict[str, float]]:
    """Continue training a copy of the ancestry for ``refine_frac`` of its steps with the
    spectral regulariser λ · Σ_θ E_high(θ̃) / (trainable parameters) (the paper's section 2),
    at the ancestry's learning rate × ``refine_lr_scale``: the refinement continues the
    ancestry's training."""
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
        refined, train, test, epochs=epochs, lr=cfg.ancestry_lr() * cfg.refine_lr_scale,
        weight_decay=cfg.weight_decay,
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
    "seed", "patch", "anc_width", "anc_depth", "anc_heads", "anc_epochs", "anc_warmup",
    "weight_decay", "batch", "refine", "refine_lambda", "refine_frac", "refine_lr_scale",
    "refine_keep_ratio",
)  # fmt: skip


def ancestry_key(cfg: FrontConfig) -> str:
    values = {k: getattr(cfg, k) for k in ANCESTRY_FIELDS}
    values["anc_lr"] = cfg.ancestry_lr()  # resolved: DeiT's rule and its value are one ancestry
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


class AncestryRecipe(ClassifierRecipe):
    """``stage=ancestry``: the source ViT trained on ``ancestry_train`` (one epoch per step),
    refined after the last epoch when ``cfg.refine``. It reports and checkpoints once, at the
    end (the trained or refined ancestry, no optimiser state), so a resumed run starts over."""

    def __init__(self, cfg: FrontConfig, seed: int | None = None, *, log: bool = False) -> None:
        super().__init__(
            cfg, epochs=cfg.anc_epochs, lr=cfg.ancestry_lr(), weight_decay=cfg.weight_decay,
            batch=cfg.batch, seed=cfg.seed if seed is None else seed,
            warmup_epochs=cfg.anc_warmup, on_epoch=self._show if log else None,
        )  # fmt: skip
        self.final: ViT | None = None
        self.record: dict[str, Any] = {}

    @staticmethod
    def _show(epoch: int, h: History) -> None:
        print(f"[nshot front] ancestry epoch {epoch} acc={h.acc[-1]:.3f}", flush=True)

    def setup(self) -> None:
        if self.world_size > 1:
            raise NshotError("stage=ancestry trains on one worker (--workers 0 or 1)")
        self.model, self.train_split, self.test_split = _ancestry_parts(self.cfg, self.seed)

    def schedule(self) -> tuple[int, int, int]:
        return self.epochs, self.epochs, self.epochs  # one report and checkpoint, at the end

    def restores_weights(self) -> bool:
        return False

    def step(self, step: int) -> dict[str, float]:
        stats = super().step(step)
        if step == self.epochs:
            self.final, self.record = self.model, {"history": self.hist.to_dict()}
            if self.cfg.refine:
                self.final, self.record["refine"] = refine_ancestry(self.cfg, self.model,
                                                                    self.seed)  # fmt: skip
        return stats

    def on_report(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        return ancestry_checkpoint_fields(self.cfg, self.final, self.record)[0]

    def state(self) -> torch.nn.Module:
        return self.final

    def extra(self) -> dict[str, Any]:
        return ancestry_checkpoint_fields(self.cfg, self.final, self.record)[1]


def fit_ancestry(cfg: FrontConfig, seed: int, log: bool = False) -> tuple[ViT, dict[str, Any]]:
    """Train the ancestry (and refine it when ``cfg.refine``) in this process; returns it and
    its record."""
    recipe = train_recipe(AncestryRecipe(cfg, seed, log=log), session=False)
    return recipe.final, recipe.record


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


class DescendantRecipe(ClassifierRecipe):
    """``stage=descendant``: a ViT initialised from the ancestry (or a learngene) by
    ``cfg.init`` and trained one epoch per step, every worker on its slice of each global batch
    (DDP averages the gradients); checkpoints (with AdamW's state) every ``checkpoint_every``
    epochs and at the end.

    The initialisation runs at the start of a fresh run's first epoch, in place (every worker
    computes the same weights from the same source); a resumed run takes the weights and the
    record of where they came from from its checkpoint and never reads the source."""

    def __init__(self, cfg: FrontConfig) -> None:
        super().__init__(
            cfg, epochs=cfg.epochs, lr=cfg.lr, weight_decay=cfg.weight_decay, batch=cfg.batch,
            seed=cfg.seed, warmup_epochs=cfg.warmup,
        )  # fmt: skip
        self.init_info: dict[str, Any] = {}

    def setup(self) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.seed + 1)
        self.model = descendant_vit(cfg)
        self.train_split = load_split("descendant_train", cfg.seed, task=cfg.task,
                                      img_size=cfg.img_size)  # fmt: skip
        self.test_split = load_split("test", cfg.seed, task=cfg.task, img_size=cfg.img_size)

    def build(self) -> None:
        super().build()
        self.optimizer = self.opt

    def schedule(self) -> tuple[int, int, int]:
        return self.epochs, 1, int(self.cfg.checkpoint_every)

    def begin(self, start: int) -> None:
        cfg = self.cfg
        if self.restored is None:
            source, source_info = descendant_source(cfg)
            if cfg.learngene_path is None:
                report = initialise(self.model, source, cfg, seed=cfg.seed)
            else:
                report = init_from_learngene(self.model, source, cfg, seed=cfg.seed)
            self.init_info = {
                **source_info,
                "transferred": len(report.get("transferred", [])),
                "skipped": [str(x) for x in report.get("skipped", [])],
            }
        else:
            self.init_info = {k: v for k, v in self.restored.extra.items()
                              if k in ("transferred", "skipped", "ancestry_id", "ancestry_acc",
                                       "ancestry_shape", "learngene")}  # fmt: skip
        super().begin(start)

    def extra(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "stage": "descendant", "shape": self.model.shape(), "init": cfg.init,
            "keep_ratio": cfg.keep_ratio, "fill": cfg.fill, "depth_fix": cfg.depth_fix,
            "use_ratio": cfg.use_ratio, "task": cfg.task, **self.init_info,
        }  # fmt: skip


def train_loop(cfg: FrontConfig) -> None:
    """``stage=ancestry``: train (and optionally refine) the source ViT
    (:class:`AncestryRecipe`). ``descendant``: initialise a ViT from the ancestry by
    ``cfg.init`` and train it (:class:`DescendantRecipe`, the test accuracy reported after every
    epoch). A step is an epoch: ``fail_at_step`` and ``checkpoint_every`` count epochs."""
    train_recipe(
        AncestryRecipe(cfg, log=True) if cfg.stage == "ancestry" else DescendantRecipe(cfg)
    )
