"""The model UCAT fine-tunes: a CLIP's image tower g (trainable), a frozen copy g₀ of the
original CLIP, and the frozen text tower whose features of the class prompts are the zero-shot
classifier (paper §3). Logits are ``s · cos(g(x), t_c)`` with the scale s fixed at 100 (the
logit scale is not trained).

The CLIP is a backbone of :mod:`nshot.nn.backbone`, named by the config
(:meth:`.config.DirclipConfig.backbone_spec`): offline, nshot's tiny CLIP pre-trained on
scikit-learn's digits (preset ``digits``: a ViT of width 64 × 4 blocks on 16 tokens of 8 × 8
grey digits, the word text tower); in the ``paper`` preset a real CLIP read by path. The model
is the same on both. A checkpoint's ``extra.model`` records the backbone
(:meth:`~nshot.nn.backbone.Backbone.record`: the tiny CLIP's architecture, whose weights the
checkpoint holds with g₀ and the text tower; or the real CLIP's path and fingerprint, whose
frozen parts are re-read from that path), the class names and the template;
:func:`load_model` rebuilds the model from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nshot.errors import CheckpointError
from nshot.nn.backbone import CLIPBackbone, backbone_from_record, load_backbone
from nshot.train.checkpoint import LoadedCheckpoint

from .config import DirclipConfig
from .data import DIGIT_NAMES

SCALE = 100.0


class DirClip(nn.Module):
    """``clip``: the CLIP being fine-tuned (the backbone's model: its image tower and
    projection are g, trainable; its text tower and logit scale are frozen); ``orig``: g₀, a
    frozen copy of the original CLIP; ``text_features``: the unit text features ``[C, D]`` of
    the training label set (a buffer).

    ``forward(images)`` gives g's logits on the training classes (what DDP wraps);
    ``forward(images, features=True)`` g's unnormalised image features (FARE's space).
    """

    def __init__(
        self,
        backbone: CLIPBackbone,
        class_names: Sequence[str],
        template: str,
        logit_scale: float | str = SCALE,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.clip = backbone.model
        self.original = backbone.copy()
        self.orig = self.original.model
        self.scale_setting = logit_scale  # a number, or "backbone": the CLIP's own
        for p in self.parameters():
            p.requires_grad_(False)
        for p in self.trainable():
            p.requires_grad_(True)
        self.class_names = list(class_names)
        self.template = template
        with torch.no_grad():
            feats = self.text_features_of(self.class_names, template)
        self.register_buffer("text_features", feats)

    @property
    def scale(self) -> float:
        """s of the logits: the configured number, or the CLIP's own frozen exp(logit_scale)."""
        if self.scale_setting == "backbone":
            return self.backbone.own_scale()
        return float(self.scale_setting)

    def trainable(self) -> list[nn.Parameter]:
        """g's parameters: the whole image tower and its projection."""
        return self.backbone.image_parameters()

    def trainable_prefixes(self) -> tuple[str, ...]:
        """The state-dict keys of g (of this module)."""
        return tuple(f"clip.{p}" for p in self.backbone.image_prefixes)

    def images(self, flat: torch.Tensor) -> torch.Tensor:
        """``[B, C·S·S]`` (or already ``[B, C, S, S]``) pixels to the tower's image shape."""
        c, s = self.backbone.in_chans, self.backbone.image_size
        return flat.reshape(-1, c, s, s) if flat.dim() == 2 else flat

    @torch.no_grad()
    def text_features_of(self, class_names: Sequence[str], template: str) -> torch.Tensor:
        """Unit features of ``template.format(name)`` from the frozen text tower, ``[C, D]``."""
        return self.backbone.encode_text([template.format(n) for n in class_names], normalize=True)

    def features(self, images: torch.Tensor, original: bool = False) -> torch.Tensor:
        backbone = self.original if original else self.backbone
        return backbone.encode_image(self.images(images))

    def logits(
        self,
        images: torch.Tensor,
        original: bool = False,
        text_features: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``s · cos`` of g (or of g₀ with ``original``) against the class text features."""
        t = self.text_features if text_features is None else text_features
        img = F.normalize(self.features(images, original), dim=-1)
        return self.scale * img @ t.T

    def forward(self, images: torch.Tensor, features: bool = False) -> torch.Tensor:
        return self.features(images) if features else self.logits(images)


def base_clip(cfg: DirclipConfig, device: torch.device | str | None = None) -> CLIPBackbone:
    """The pre-trained CLIP the method starts from (:meth:`.config.DirclipConfig.backbone_spec`:
    the tiny CLIP cached under ``$NSHOT_CACHE``, or the real one at ``clip_path``), frozen."""
    return load_backbone(cfg.backbone_spec(), device)  # type: ignore[return-value]


def build_model(
    cfg: DirclipConfig,
    backbone: CLIPBackbone | None = None,
    class_names: Sequence[str] = DIGIT_NAMES,
) -> DirClip:
    """The model on a copy of ``backbone`` (default: :func:`base_clip`), which stays as it is."""
    backbone = backbone if backbone is not None else base_clip(cfg)
    return DirClip(backbone.copy(), class_names, cfg.template, cfg.logit_scale)


def model_record(model: DirClip, cfg: DirclipConfig) -> dict[str, Any]:
    """What a checkpoint keeps to rebuild the model: the backbone's record (taken before any
    weight is tuned: the real CLIP's fingerprint is of the CLIP as read), the training label
    set and the template."""
    backbone = {"backbone": "clip"} if cfg.backbone == "clip" else {}
    return {**backbone, **model.original.record(), "class_names": model.class_names,
            "template": model.template}  # fmt: skip


def checkpoint_state(model: DirClip) -> dict[str, torch.Tensor]:
    """The current weights a checkpoint holds: all of them where the backbone is not re-read
    from a path (the tiny CLIP), else g's (a real CLIP's frozen parts are re-read)."""
    if model.backbone.weights_in_checkpoint:
        return model.state_dict()
    return trainable_state(model)


def trainable_state(model: DirClip) -> dict[str, torch.Tensor]:
    """g's weights, cloned."""
    prefixes = model.trainable_prefixes()
    return {k: v.detach().clone() for k, v in model.state_dict().items()
            if k.startswith(prefixes)}  # fmt: skip


def _check_record(rec: dict[str, Any], path: Any) -> None:
    names = rec.get("class_names")
    if not isinstance(names, list) or not 2 <= len(names) <= 100_000:
        raise CheckpointError(f"{path}: the model record's class names are invalid")
    if not isinstance(rec.get("template"), str) or "{}" not in rec["template"]:
        raise CheckpointError(f"{path}: the model record's template has no '{{}}'")


def load_model(checkpoint: LoadedCheckpoint) -> tuple[DirClip, DirclipConfig, dict[str, Any]]:
    """The fine-tuned model of a dirclip checkpoint (the validation-selected weights), its
    config and its ``extra`` record, in eval mode. The backbone comes from the record
    (:func:`nshot.nn.backbone.backbone_from_record`: a real CLIP re-read from its recorded
    ``clip_path`` and checked against its fingerprint; the error names ``clip_path`` when this
    machine lacks it), then the checkpoint's weights: all of them (the tiny CLIP), or g's
    selected ``best.*`` ones (a real CLIP)."""
    extra = checkpoint.extra
    rec = extra.get("model")
    if not isinstance(rec, dict):
        raise CheckpointError(f"{checkpoint.path}: not a dirclip checkpoint (no model record)")
    cfg = DirclipConfig.validated(checkpoint.config)
    _check_record(rec, checkpoint.path)
    backbone = backbone_from_record(rec, checkpoint.path)
    model = DirClip(backbone, rec["class_names"], rec["template"], cfg.logit_scale)  # type: ignore[arg-type]
    state = dict(checkpoint.weights())
    best = {k.removeprefix("best."): v for k, v in state.items() if k.startswith("best.")}
    current = {k: v for k, v in state.items() if not k.startswith("best.")}
    if backbone.weights_in_checkpoint:
        want, have = set(model.state_dict()), set(current)
    else:
        want, have = set(trainable_state(model)), set(best)
    if have != want:
        odd = sorted(have ^ want)
        raise CheckpointError(f"{checkpoint.path}: weights do not fit the model (e.g. {odd[0]!r})")
    try:
        model.load_state_dict({**model.state_dict(), **current, **best})
    except RuntimeError as err:
        raise CheckpointError(f"{checkpoint.path}: weights do not fit the model: {err}") from None
    return model.eval(), cfg, extra
