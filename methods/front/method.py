"""FRONT as an nshot Method: ancestry and descendant training under Ray Train, serving, experiments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from nshot.method import Method, ResultsTable, register
from nshot.nn.vit import ViT
from nshot.train.checkpoint import LoadedCheckpoint
from nshot.train.limits import (
    ModelBudget,
    bounded_ints,
    meta_counts,
    transformer_activation_bytes,
)

from .claims import CLAIMS
from .config import VERSION, FrontConfig
from .data import load_split
from .model import VIT_BOUNDS, load_model
from .train import train_loop


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
        initialise a ViT from the ancestry by ``cfg.init`` and train it (see
        :func:`.train.train_loop`)."""
        train_loop(cfg)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: FrontConfig) -> dict[str, float]:
        """Test accuracy of the checkpoint's ViT on its task (and its training record)."""
        from .train import accuracy

        model = load_model(checkpoint)
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
