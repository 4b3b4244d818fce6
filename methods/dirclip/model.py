"""The model UCAT fine-tunes: a CLIP's image tower g (trainable), a frozen copy g₀ of the
original image tower, and the frozen text tower whose features of the class prompts are the
zero-shot classifier (paper §3). Logits are ``s · cos(g(x), t_c)`` with the scale s fixed at
100 (the logit scale is not trained).

The offline default is nshot's tiny CLIP pre-trained on scikit-learn's digits
(:func:`nshot.train.clip.pretrained_clip`, preset ``digits``: a ViT of width 64 × 4 blocks on
16 tokens of 8 × 8 grey digits, the word text tower). :func:`load_model` rebuilds the model
from a dirclip checkpoint, whose weights hold both towers and g₀ (safetensors).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nshot.errors import NshotError
from nshot.nn.clip import CLIPConfig, TinyCLIP
from nshot.train.checkpoint import LoadedCheckpoint

from .config import DirclipConfig
from .data import DIGIT_NAMES

SCALE = 100.0


class DirClip(nn.Module):
    """``clip``: the CLIP being fine-tuned (its image tower is g; its text tower and logit
    scale are frozen); ``orig``: g₀, the original CLIP, frozen entirely; ``text_features``:
    the unit text features ``[C, D]`` of the training label set (a buffer).

    ``forward(images)`` gives g's logits on the training classes (what DDP wraps);
    ``forward(images, features=True)`` g's unnormalised image features (FARE's space).
    """

    def __init__(
        self,
        clip: TinyCLIP,
        class_names: Sequence[str],
        template: str,
        logit_scale: float | str = SCALE,
    ) -> None:
        super().__init__()
        self.clip = clip
        self.scale_setting = logit_scale  # a number, or "backbone": the CLIP's own
        self.orig = copy.deepcopy(clip)
        for p in self.orig.parameters():
            p.requires_grad_(False)
        for p in self.clip.text.parameters():
            p.requires_grad_(False)
        self.clip.logit_scale.requires_grad_(False)
        self.class_names = list(class_names)
        self.template = template
        with torch.no_grad():
            feats = self.text_features_of(self.class_names, template)
        self.register_buffer("text_features", feats)

    @property
    def cfg(self) -> CLIPConfig:
        return self.clip.cfg

    @property
    def scale(self) -> float:
        """s of the logits: the configured number, or the CLIP's own frozen exp(logit_scale)."""
        if self.scale_setting == "backbone":
            return float(self.clip.logit_scale.detach().exp())
        return float(self.scale_setting)

    def trainable(self) -> list[nn.Parameter]:
        """g's parameters: the whole image tower (``visual`` and its projection)."""
        return [*self.clip.visual.parameters(), self.clip.visual_proj]

    def images(self, flat: torch.Tensor) -> torch.Tensor:
        """``[B, 64]`` (or already ``[B, C, H, W]``) pixels to the tower's image shape."""
        c, s = self.cfg.in_chans, self.cfg.img_size
        return flat.reshape(-1, c, s, s) if flat.dim() == 2 else flat

    @torch.no_grad()
    def text_features_of(self, class_names: Sequence[str], template: str) -> torch.Tensor:
        """Unit features of ``template.format(name)`` from the frozen text tower, ``[C, D]``."""
        return self.clip.encode_text([template.format(n) for n in class_names], normalize=True)

    def features(self, images: torch.Tensor, original: bool = False) -> torch.Tensor:
        model = self.orig if original else self.clip
        return model.encode_image(self.images(images))

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


def base_clip(cfg: DirclipConfig) -> TinyCLIP:
    """The pre-trained tiny CLIP the method starts from (cached under ``$NSHOT_CACHE``)."""
    from nshot.train.clip import pretrained_clip

    return pretrained_clip(cfg.clip_preset, text=cfg.clip_text, seed=cfg.clip_seed)


def build_model(cfg: DirclipConfig, clip: TinyCLIP | None = None) -> DirClip:
    clip = clip if clip is not None else base_clip(cfg)
    return DirClip(copy.deepcopy(clip), DIGIT_NAMES, cfg.template, cfg.logit_scale)


def model_record(model: DirClip) -> dict[str, Any]:
    """What a checkpoint keeps to rebuild the model without the cache: the CLIP config, the
    training label set and template."""
    return {"clip": model.cfg.to_dict(), "class_names": model.class_names,
            "template": model.template}  # fmt: skip


#: what a CLIP recorded in a dirclip checkpoint may be (every preset is far inside): a model is
#: built from these sizes before its weights are read, so a crafted record cannot ask for more
CLIP_BOUNDS = {
    "img_size": (1, 64), "patch": (1, 16), "in_chans": (1, 4), "vision_width": (1, 1024),
    "vision_depth": (1, 48), "vision_heads": (1, 64), "context": (3, 256),
    "text_width": (1, 1024), "text_depth": (1, 48), "text_heads": (1, 64),
    "text_hidden": (0, 4096), "embed_dim": (1, 2048),
}  # fmt: skip


def _check_size(clip_cfg: CLIPConfig, rec: dict[str, Any], path: Any) -> None:
    for name, (lo, hi) in CLIP_BOUNDS.items():
        v = getattr(clip_cfg, name)
        if not lo <= v <= hi:
            raise NshotError(f"{path}: CLIP field {name} = {v} is outside [{lo}, {hi}]")
    names = rec.get("class_names")
    if len(clip_cfg.vocab) > 100_000 or not isinstance(names, list) or not 2 <= len(names) <= 1000:
        raise NshotError(f"{path}: the CLIP vocabulary or the class names are out of range")
    if not isinstance(rec.get("template"), str) or "{}" not in rec["template"]:
        raise NshotError(f"{path}: the model record's template has no '{{}}'")


def load_model(checkpoint: LoadedCheckpoint) -> tuple[DirClip, DirclipConfig, dict[str, Any]]:
    """The fine-tuned model of a dirclip checkpoint (the validation-selected weights), its
    config and its ``extra`` record, in eval mode."""
    extra = checkpoint.extra
    rec = extra.get("model")
    if not isinstance(rec, dict) or "clip" not in rec:
        raise NshotError(f"{checkpoint.path}: not a dirclip checkpoint (no model record)")
    cfg = DirclipConfig.validated(checkpoint.config)
    try:
        clip_cfg = CLIPConfig.from_dict(rec["clip"])
    except Exception as err:  # noqa: BLE001 - a bad record is a bad checkpoint
        raise NshotError(f"{checkpoint.path}: bad CLIP config ({err})") from None
    _check_size(clip_cfg, rec, checkpoint.path)
    model = DirClip(TinyCLIP(clip_cfg), rec["class_names"], rec["template"], cfg.logit_scale)
    state = dict(checkpoint.weights())
    best = {k.removeprefix("best."): v for k, v in state.items() if k.startswith("best.")}
    state = {k: v for k, v in state.items() if not k.startswith("best.")}
    state.update(best)
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise NshotError(f"{checkpoint.path}: weights do not fit the model: {err}") from None
    return model.eval(), cfg, extra
