"""FRONT as an nshot Method: ancestry and descendant training under Ray Train, serving, experiments."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from nshot.method import Method, NshotError, ResultsTable, register
from nshot.nn.vit import ViT
from nshot.train.checkpoint import LoadedCheckpoint, load_checkpoint, save_checkpoint
from nshot.train.limits import (
    ModelBudget,
    bounded_ints,
    meta_counts,
    transformer_activation_bytes,
)

from .claims import CLAIMS
from .config import FrontConfig
from .data import load_split
from .train import (
    History,
    descendant_vit,
    init_from_learngene,
    initialise,
    refine_ancestry,
    train_ancestry,
    train_classifier,
)

VERSION = "1"
#: what a ViT shape recorded in a front checkpoint may be (every preset is far inside)
VIT_BOUNDS = {
    "img_size": (1, 64), "patch": (1, 16), "in_chans": (1, 4), "num_classes": (1, 1000),
    "width": (1, 1024), "depth": (1, 48), "heads": (1, 64),
}  # fmt: skip
ANCESTRY_FIELDS = (
    "seed", "patch", "anc_width", "anc_depth", "anc_heads", "anc_epochs", "anc_warmup", "lr",
    "weight_decay", "batch", "refine", "refine_lambda", "refine_frac", "refine_keep_ratio",
)  # fmt: skip


def vit_from_checkpoint(checkpoint: LoadedCheckpoint) -> ViT:
    """The ViT (ancestry or descendant) stored in a front checkpoint."""
    shape = checkpoint.extra.get("shape")
    if not isinstance(shape, dict):
        raise NshotError(f"{checkpoint.path}: not a front checkpoint (no ViT shape)")
    model = ViT(**shape)
    try:
        model.load_state_dict(checkpoint.weights())
    except RuntimeError as err:
        raise NshotError(f"{checkpoint.path}: weights do not fit the stored shape: {err}") from None
    return model.eval()


def ancestry_key(cfg: FrontConfig) -> str:
    values = {k: getattr(cfg, k) for k in ANCESTRY_FIELDS}
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


def fit_ancestry(cfg: FrontConfig, seed: int, log: bool = False) -> tuple[ViT, dict[str, Any]]:
    """Train the ancestry (and refine it when ``cfg.refine``); returns it and its record."""

    def show(epoch: int, h: History) -> None:
        if log:
            print(f"[nshot front] ancestry epoch {epoch} acc={h.acc[-1]:.3f}", flush=True)

    model, hist = train_ancestry(cfg, seed, on_epoch=show)
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
    return vit_from_checkpoint(ckpt), {
        "ancestry_id": ckpt.extra.get("ancestry_id", str(ckpt.path)),
        "ancestry_acc": ckpt.metrics.get("acc"),
        "ancestry_shape": ckpt.extra["shape"],
    }


@register
class FrontMethod(Method):
    name = "front"
    paper = "FRONT: frequency-domain knowledge transfer with a DCT learngene (ICML 2026)"
    area = "weight transfer / model initialisation"
    version = VERSION
    Config = FrontConfig
    claims = CLAIMS

    def data(self, cfg: FrontConfig) -> dict[str, pa.Table]:
        from .data import data_tables

        return data_tables(cfg)

    def train_loop(self, cfg: FrontConfig) -> None:
        """``stage=ancestry``: train (and optionally refine) the source ViT. ``descendant``:
        initialise a ViT from the ancestry by ``cfg.init`` and train it, every worker on its
        slice of each global batch (DDP averages the gradients). Reports the test accuracy
        after every epoch; checkpoints at the end (a run is seconds to minutes long)."""
        from nshot.train import session

        ctx = session.context()
        torch.set_num_threads(cfg.torch_threads)
        if cfg.stage == "ancestry":
            if ctx.world_size > 1:
                raise NshotError("stage=ancestry trains on one worker (--workers 0 or 1)")
            model, record = fit_ancestry(cfg, cfg.seed, log=True)
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
            start_epoch=start,
        )  # fmt: skip

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: FrontConfig) -> dict[str, float]:
        """Test accuracy of the checkpoint's ViT on its task (and its training record)."""
        from .train import accuracy

        model = vit_from_checkpoint(checkpoint)
        extra = checkpoint.extra
        stage = extra.get("stage")
        task = extra.get("task", "digits") if stage == "descendant" else "digits"
        seed = int(checkpoint.config.get("seed", cfg.seed))
        test = load_split("test", seed, task=task, img_size=model.img_size)
        out = {"acc": accuracy(model, test), "depth": float(model.depth),
               "width": float(model.width)}  # fmt: skip
        if stage == "ancestry" and "refine" in extra:
            for k, v in extra["refine"].items():
                out[f"refine_{k}"] = float(v)
        return out

    def predictor(self, checkpoint: LoadedCheckpoint):
        from .serve import FrontPredictor

        return FrontPredictor(checkpoint)

    def model_budget(self, cfg: FrontConfig, extra: dict[str, Any] | None = None) -> ModelBudget:
        """The ViT of the checkpoint's recorded shape (else the config's), counted on the meta
        device, and its activations on ``MAX_IMAGES`` images of one request."""
        from . import serve

        shape = (extra or {}).get("shape")
        if shape is None:
            anc = cfg.stage == "ancestry"
            shape = {
                "img_size": 8 if anc else cfg.img_size, "patch": cfg.patch, "in_chans": 1,
                "num_classes": 2 if cfg.task == "parity" and not anc else 10,
                "width": cfg.anc_width if anc else cfg.width,
                "depth": cfg.anc_depth if anc else cfg.depth,
                "heads": cfg.anc_heads if anc else cfg.heads,
            }  # fmt: skip
        sizes = bounded_ints(shape, VIT_BOUNDS, "extra.shape")
        ratio = shape.get("mlp_ratio", 4.0)
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio <= 16:
            raise ValueError(f"extra.shape.mlp_ratio must be a number in (0, 16], got {ratio!r}")
        if set(shape) - {*VIT_BOUNDS, "mlp_ratio"}:
            raise ValueError(f"extra.shape has unknown fields {sorted(set(shape) - {*VIT_BOUNDS})}")
        params, state = meta_counts(lambda: ViT(**sizes, mlp_ratio=float(ratio)))
        seq = (sizes["img_size"] // sizes["patch"]) ** 2 + 1
        act = transformer_activation_bytes(
            seq, sizes["width"], sizes["heads"], int(sizes["width"] * ratio),
            batch=serve.MAX_IMAGES,
        )  # fmt: skip
        return ModelBudget(params=params, activation_bytes=act, weights_numel=state)

    def experiments(self, cfg: FrontConfig, workdir: Path) -> ResultsTable:
        from .experiments import run_experiments

        return run_experiments(cfg, workdir)
