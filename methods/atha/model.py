"""ATHA's episode model: CoOp + CLIP-LoRA on a CLIP, with the tail-head token update.

One :class:`EpisodeModel` is built per episode from a frozen CLIP backbone
(:class:`nshot.nn.backbone.CLIPBackbone`: nshot's tiny CLIP, or for ``paper`` a real CLIP read
by path; paper §4.1: a fresh model per episode). It is written once against the backbone's
interface (its towers as modules, prompt learning, block hooks):

* **CoOp** (Zhou et al. 2022): ``n_ctx`` learnable context vectors, initialised from the token
  embeddings of ``ctx_init`` ("a photo of a"), stand before each class name in the prompt
  (:meth:`~nshot.nn.backbone.CLIPBackbone.encode_prompt`). With the tiny CLIP's word tower they
  replace token embeddings of :class:`nshot.nn.clip.TextTransformer`; with its MiniLM tower the
  prompt runs through MiniLM's own BERT, [CLS] + context + the class name's word pieces +
  [SEP], mean-pooled and normalised as sentence-transformers does, then the tiny CLIP's
  trained projection; with a real CLIP through ``CLIPTextEmbeddings(inputs_embeds=...)``, the
  causal encoder, the final norm and the end-token pooling. With the context equal to the
  embeddings of "a photo of a" each reproduces the text features of "a photo of a {name}"
  (tested to 1e-5).
* **CLIP-LoRA** (Zanella & Ben Ayed 2024): PEFT ``LoraConfig(use_rslora=True)`` (scaling
  α/√r) on the attention input projections of both towers (the backbone's ``lora_targets``):
  BERT's ``query``/``key``/``value``, a real CLIP's ``q_proj``/``k_proj``/``v_proj``; the tiny
  CLIP's towers fuse q, k, v into one linear (``qkv``, timm's layout), which gets one LoRA (one
  A shared by q, k and v). LoRA goes into copies of the towers; the backbone stays pristine.
* **ATHA** (paper §3): at the input of every visual block, the patch tokens X (not the class
  token) are compared by cosine with the text anchors A (the class prompts' text features at
  text block ``txtlayer``, mapped back into the visual residual stream by the minimum-norm
  least-squares inverse of the visual projection and the inverse of ``ln_post``'s affine).
  The ``k_h = ⌊L·add_ratio⌋`` tokens most similar to their best class get ``ρ⁺_i · A[c⁺]``
  added (head); the ``k_t = ⌊L·minus_ratio⌋`` least similar get ``ρ⁻_i · A[c⁻]`` of their
  *least* similar class subtracted (tail). ρ⁺ (0.8 at the middle block, 0 elsewhere) and ρ⁻
  (0) are learnable per block. The selection uses no labels, so queries get it too. The update
  runs as a block hook of the image tower (:func:`nshot.nn.backbone.block_hooks`).
  ``rho_minus_init`` starts ρ⁻ of the same block as ρ⁺ elsewhere than 0 (default 0, the
  authors'); the system ``tail_fixed`` holds it there (ρ⁺ = 0): the tail push alone at a
  declared size, the rows of the tail sweep.

Logits are ``s · cos(image, text)`` with ``s = 2`` at 1 shot and 4 above (paper §4.1).
"""

from __future__ import annotations

import copy
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nshot.errors import CheckpointError, ConfigError
from nshot.nn.backbone import CLIPBackbone, backbone_from_record

from .config import AthaConfig

__all__ = [
    "EpisodeModel",
    "SYSTEM_SPEC",
    "anchor_inverse",
    "atha_update",
    "backbone_from_weights",
    "load_model",
    "select_tokens",
]


@dataclass(frozen=True)
class SystemSpec:
    ctx: bool  # learn the context (CoOp)
    lora: bool  # LoRA on both towers
    mode: str  # ATHA token update: "off", "sim" (ATHA's selection) or "random"
    head: bool  # rho+ learnable (else fixed at 0)
    tail: bool  # rho- learnable (else fixed at 0, unless tail_fixed)
    tail_fixed: bool = False  # rho- held at the config's rho_minus_init (not learned)


SYSTEM_SPEC: dict[str, SystemSpec] = {
    "atha": SystemSpec(True, True, "sim", True, True),
    "coop_lora": SystemSpec(True, True, "off", False, False),
    "coop": SystemSpec(True, False, "off", False, False),
    "clip_lora": SystemSpec(False, True, "off", False, False),
    "zero_shot": SystemSpec(False, False, "off", False, False),
    "atha_head_only": SystemSpec(True, True, "sim", True, False),
    "atha_tail_only": SystemSpec(True, True, "sim", False, True),
    "random_tokens": SystemSpec(True, True, "random", True, True),
    # the tail push alone at a fixed size: rho+ = 0, rho- = rho_minus_init at rho_block, held
    "tail_fixed": SystemSpec(True, True, "sim", False, False, tail_fixed=True),
}


# --------------------------------------------------------------------------------------------
# the token update


def select_tokens(
    s_max: torch.Tensor, k_h: int, k_t: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Head and tail token indices ``[B, k_h]``, ``[B, k_t]`` from one ordering per image: by
    ``s_max`` descending (ties by position), or a random one when ``generator`` is given. The
    two sets are disjoint whenever ``k_h + k_t <= L``."""
    b, length = s_max.shape
    if k_h + k_t > length:
        raise ValueError(f"k_h + k_t = {k_h + k_t} exceeds the {length} tokens")
    if generator is None:
        order = torch.sort(s_max.detach(), dim=1, descending=True, stable=True).indices
    else:
        # drawn on the generator's device (the CPU), so CPU and GPU runs pick the same tokens
        order = torch.rand(b, length, generator=generator).argsort(dim=1).to(s_max.device)
    return order[:, :k_h], order[:, length - k_t :]


def atha_update(
    x: torch.Tensor,
    anchors: torch.Tensor,
    rho_plus: torch.Tensor,
    rho_minus: torch.Tensor,
    *,
    add_ratio: float,
    minus_ratio: float,
    generator: torch.Generator | None = None,
    use_all_texts: bool = False,
    tau: float = 0.1,
) -> torch.Tensor:
    """ATHA's update of patch tokens ``x`` ``[B, L, D]`` (unnormalised residual stream) with
    anchors ``[n, D]`` (paper §3). ``generator``: random token selection (the control)."""
    length = x.shape[1]
    k_h, k_t = int(math.floor(length * add_ratio)), int(math.floor(length * minus_ratio))
    sim = torch.einsum(
        "bld,cd->bcl", F.normalize(x, dim=-1), F.normalize(anchors, dim=-1)
    )  # [B, n, L]
    s_max, c_plus = sim.max(dim=1)
    c_minus = sim.argmin(dim=1)
    head, tail = select_tokens(s_max, k_h, k_t, generator)
    head_mask = torch.zeros_like(s_max).scatter_(1, head, 1.0)[..., None]
    tail_mask = torch.zeros_like(s_max).scatter_(1, tail, 1.0)[..., None]
    if use_all_texts:  # the softmax(tau * S)-weighted mix of the anchors, for head and tail
        add = sub = torch.einsum("bcl,cd->bld", (tau * sim).softmax(dim=1), anchors)
    else:
        add, sub = anchors[c_plus], anchors[c_minus]  # [B, L, D]
    return x + rho_plus * head_mask * add - rho_minus * tail_mask * sub


def anchor_inverse(proj: torch.Tensor) -> torch.Tensor:
    """``P`` ``[E, W]`` with ``t @ P`` the minimum-norm least-squares solution ``u`` of
    ``projᵀ u = t`` (``proj`` ``[W, E]``): ``torch.linalg.lstsq`` on the identity, once (the
    solution is linear in ``t``)."""
    eye = torch.eye(proj.shape[1], dtype=torch.float64)
    sol = torch.linalg.lstsq(proj.detach().double().T, eye, driver="gelsd").solution  # [W, E]
    return sol.T.float().contiguous()


def text_anchors(
    t: torch.Tensor, inverse: torch.Tensor, ln_weight: torch.Tensor, ln_bias: torch.Tensor
) -> torch.Tensor:
    """Anchors ``[n, W]`` in the visual residual stream of text features ``t`` ``[n, E]``: the
    inverse projection, then ``ln_post``'s affine undone (``|w| >= 1e-6`` guarded)."""
    u = t @ inverse
    w = torch.where(ln_weight.abs() < 1e-6, torch.full_like(ln_weight, 1e-6), ln_weight)
    return (u - ln_bias) / w


_INVERSES: weakref.WeakKeyDictionary[CLIPBackbone, torch.Tensor] = weakref.WeakKeyDictionary()


def backbone_inverse(backbone: CLIPBackbone) -> torch.Tensor:
    """:func:`anchor_inverse` of the backbone's image projection, once per backbone, on its
    device."""
    if backbone not in _INVERSES:
        proj = backbone.image_projection().detach().cpu()
        _INVERSES[backbone] = anchor_inverse(proj).to(backbone.device)
    return _INVERSES[backbone]


# --------------------------------------------------------------------------------------------
# the episode model


def _inject_lora(module: nn.Module, targets: list[str], cfg: AthaConfig) -> nn.Module:
    from peft import LoraConfig, inject_adapter_in_model

    lora = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=targets,
        use_rslora=True,  # scaling alpha / sqrt(r), as CLIP-LoRA
        bias="none",
    )
    return inject_adapter_in_model(lora, module)


def check_episode_model(backbone: CLIPBackbone, cfg: AthaConfig, system: str) -> None:
    """Refuse a system name or block indices the backbone cannot take."""
    if system not in SYSTEM_SPEC:
        raise ConfigError(f"system: unknown {system!r}; choose from {sorted(SYSTEM_SPEC)}")
    if cfg.txtlayer >= backbone.text_depth:
        raise ConfigError(
            f"field 'txtlayer': {cfg.txtlayer} >= the text tower's {backbone.text_depth} blocks"
        )
    if cfg.rho_block >= backbone.vision_depth:
        raise ConfigError(
            f"field 'rho_block': {cfg.rho_block} >= the image tower's "
            f"{backbone.vision_depth} blocks"
        )


class EpisodeModel(nn.Module):
    """One episode's adapted CLIP for the classes ``names`` (see the module docstring):
    ``text`` and ``image`` are the backbone's towers (copies with LoRA where the system adapts
    them), ``ctx`` the context vectors, ``rho_plus`` / ``rho_minus`` the rates per image
    block. Logits come back on the device of the images."""

    def __init__(
        self,
        backbone: CLIPBackbone,
        names: Sequence[str],
        cfg: AthaConfig,
        system: str,
        *,
        shots: int,
        seed: int,
    ) -> None:
        super().__init__()
        check_episode_model(backbone, cfg, system)
        self.spec = SYSTEM_SPEC[system]
        self.system = system
        self.names = list(names)
        self.cfg = cfg
        self.bb = backbone
        self.scale = cfg.scale_1shot if shots == 1 else cfg.scale_kshot
        text, image = backbone.text_tower(), backbone.image_tower()
        torch.manual_seed(seed)
        # what LoRA adapts is copied (the backbone stays pristine); the rest is shared, frozen
        self.text = copy.deepcopy(text) if self.spec.lora else text
        self.image = copy.deepcopy(image) if self.spec.lora else image
        if self.spec.lora:
            for tower, part in ((self.text, "text"), (self.image, "image")):
                _inject_lora(tower, backbone.lora_targets[part], cfg)
                tower.to(backbone.device)
        for name, p in self.named_parameters():
            p.requires_grad_("lora_" in name)
        ctx = backbone.context_embeddings(cfg.ctx_init)
        if len(ctx) != cfg.n_ctx:
            raise ConfigError(
                f"field 'ctx_init': {cfg.ctx_init!r} gives {len(ctx)} tokens, n_ctx is {cfg.n_ctx}"
            )
        self.ctx = nn.Parameter(ctx, requires_grad=self.spec.ctx)
        self.prompt = backbone.prompt(self.names, cfg.n_ctx)
        depth = backbone.vision_depth
        plus = torch.zeros(depth)
        if self.spec.head:
            plus[cfg.rho_block] = cfg.rho_plus_init
        self.rho_plus = nn.Parameter(plus.to(backbone.device), requires_grad=self.spec.head)
        minus = torch.zeros(depth)
        if self.spec.tail or self.spec.tail_fixed:
            minus[cfg.rho_block] = cfg.rho_minus_init
        self.rho_minus = nn.Parameter(minus.to(backbone.device), requires_grad=self.spec.tail)
        self.generator = torch.Generator().manual_seed(seed) if self.spec.mode == "random" else None
        self.eval()

    # ---- parameters and modes

    def lora_parameters(self) -> list[nn.Parameter]:
        return [p for n, p in self.named_parameters() if "lora_" in n and p.requires_grad]

    def rate_parameters(self) -> list[nn.Parameter]:
        return [p for p in (self.rho_plus, self.rho_minus) if p.requires_grad]

    def train_mode(self) -> EpisodeModel:
        """Everything frozen in eval mode; only LoRA's dropout is active (paper §4.1)."""
        self.eval()
        for name, m in self.named_modules():
            if "lora_dropout" in name:
                m.train()
        return self

    def rates(self) -> dict[str, list[float]]:
        return {
            "head": [round(float(v), 6) for v in self.rho_plus.detach().cpu()],
            "tail": [round(float(v), 6) for v in self.rho_minus.detach().cpu()],
        }

    # ---- text

    def text_features(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(features, anchor features)`` ``[n, E]`` of the class prompts: the final text
        features and those read at text block ``txtlayer``."""
        return self.bb.encode_prompt(self.text, self.prompt, self.ctx, self.cfg.txtlayer)

    def anchors(self, anchor_features: torch.Tensor) -> torch.Tensor:
        norm = self.bb.image_norm(self.image)
        return text_anchors(anchor_features, backbone_inverse(self.bb), norm.weight, norm.bias)

    # ---- image

    def image_features(
        self, images: torch.Tensor, anchors: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Image features ``[B, E]`` of pixels in [0, 1] (on the backbone's device); with
        ``anchors`` the ATHA update runs at every block input (the class token is left
        alone)."""
        hook = None
        if anchors is not None:

            def hook(i: int, t: torch.Tensor) -> torch.Tensor:
                patches = atha_update(
                    t[:, 1:], anchors, self.rho_plus[i], self.rho_minus[i],
                    add_ratio=self.cfg.add_ratio, minus_ratio=self.cfg.minus_ratio,
                    generator=self.generator, use_all_texts=self.cfg.use_all_texts,
                    tau=self.cfg.tau,
                )  # fmt: skip
                return torch.cat([t[:, :1], patches], dim=1)

        return self.bb.encode_image(images, tower=self.image, block_hook=hook)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, n]``: ``s · cos(image, class prompt)``, on the device of ``images``."""
        text, anchor_text = self.text_features()
        anchors = self.anchors(anchor_text) if self.spec.mode != "off" else None
        img = F.normalize(self.image_features(images, anchors), dim=-1)
        return (self.scale * img @ F.normalize(text, dim=-1).T).to(images.device)


# --------------------------------------------------------------------------------------------
# checkpoints


def backbone_from_weights(
    clip_config: dict[str, Any], state: dict[str, torch.Tensor]
) -> CLIPBackbone:
    """The tiny CLIP of a config record and its weights, frozen."""
    backbone = backbone_from_record({"clip": clip_config}, "extra.clip_config")
    try:
        backbone.model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"model.safetensors: does not match its tiny CLIP ({e})") from None
    return backbone.freeze()  # type: ignore[return-value]


def load_model(checkpoint: Any) -> tuple[CLIPBackbone, AthaConfig]:
    """The backbone of an nshot checkpoint of ``nshot train atha`` and its config: the tiny
    CLIP it pre-trained (its weights and ``extra.clip_config``), or the real CLIP it records
    (``extra.clip``), read from the recorded ``clip_path`` and checked against its
    fingerprint (the error names ``clip_path`` when this machine lacks it)."""
    cfg = AthaConfig.validated(checkpoint.config)
    extra = checkpoint.extra
    if cfg.backbone == "clip":
        if not isinstance(extra.get("clip"), dict):
            raise CheckpointError(f"{checkpoint.path}: extra.clip is missing")
        return backbone_from_record(extra["clip"], checkpoint.path), cfg  # type: ignore[return-value]
    clip_config = extra.get("clip_config")
    if not isinstance(clip_config, dict):
        raise CheckpointError(f"{checkpoint.path}: extra.clip_config is missing")
    return backbone_from_weights(clip_config, checkpoint.weights()), cfg
