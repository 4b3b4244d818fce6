"""ATHA's episode model: CoOp + CLIP-LoRA on a CLIP, with the tail-head token update.

One :class:`EpisodeModel` is built per episode from the frozen :class:`Backbone` (paper §4.1:
a fresh model per episode):

* **CoOp** (Zhou et al. 2022): ``n_ctx`` learnable context vectors, initialised from the word
  embeddings of ``ctx_init`` ("a photo of a"), stand before each class name in the prompt.
  With the word tower they replace token embeddings of :class:`nshot.nn.clip.TextTransformer`;
  with the MiniLM tower the prompt runs through MiniLM's own BERT here, ``inputs_embeds`` =
  [CLS] + context + the class name's word pieces + [SEP], mean-pooled and normalised as
  sentence-transformers does, then the tiny CLIP's trained projection. With the context equal
  to the embeddings of "a photo of a" this reproduces the memoised sentence embedding of
  "a photo of a {name}" (tested to 1e-5).
* **CLIP-LoRA** (Zanella & Ben Ayed 2024): PEFT ``LoraConfig(use_rslora=True)`` (scaling
  α/√r) on the attention input projections of both towers: BERT's ``query``/``key``/``value``;
  the tiny CLIP's towers fuse q, k, v into one linear (``qkv``, timm's layout), which gets one
  LoRA (one A shared by q, k and v).
* **ATHA** (paper §3): at the input of every visual block, the patch tokens X (not the class
  token) are compared by cosine with the text anchors A (the class prompts' text features at
  text block ``txtlayer``, mapped back into the visual residual stream by the minimum-norm
  least-squares inverse of the visual projection and the inverse of ``ln_post``'s affine).
  The ``k_h = ⌊L·add_ratio⌋`` tokens most similar to their best class get ``ρ⁺_i · A[c⁺]``
  added (head); the ``k_t = ⌊L·minus_ratio⌋`` least similar get ``ρ⁻_i · A[c⁻]`` of their
  *least* similar class subtracted (tail). ρ⁺ (0.8 at the middle block, 0 elsewhere) and ρ⁻
  (0) are learnable per block. The selection uses no labels, so queries get it too.

Logits are ``s · cos(image, text)`` with ``s = 2`` at 1 shot and 4 above (paper §4.1).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nshot.data.cache import MissingExtraError
from nshot.errors import CheckpointError, ConfigError
from nshot.nn.clip import CLIPConfig, TextTransformer, TinyCLIP

from .config import AthaConfig

__all__ = [
    "Backbone",
    "EpisodeModel",
    "SYSTEM_SPEC",
    "anchor_inverse",
    "atha_update",
    "load_model",
    "select_tokens",
]


@dataclass(frozen=True)
class SystemSpec:
    ctx: bool  # learn the context (CoOp)
    lora: bool  # LoRA on both towers
    mode: str  # ATHA token update: "off", "sim" (ATHA's selection) or "random"
    head: bool  # rho+ learnable (else fixed at 0)
    tail: bool  # rho- learnable (else fixed at 0)


SYSTEM_SPEC: dict[str, SystemSpec] = {
    "atha": SystemSpec(True, True, "sim", True, True),
    "coop_lora": SystemSpec(True, True, "off", False, False),
    "coop": SystemSpec(True, False, "off", False, False),
    "clip_lora": SystemSpec(False, True, "off", False, False),
    "zero_shot": SystemSpec(False, False, "off", False, False),
    "atha_head_only": SystemSpec(True, True, "sim", True, False),
    "atha_tail_only": SystemSpec(True, True, "sim", False, True),
    "random_tokens": SystemSpec(True, True, "random", True, True),
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


# --------------------------------------------------------------------------------------------
# the frozen backbone


class Backbone:
    """The frozen pre-trained CLIP an episode starts from (never modified; episodes copy what
    they adapt). For the MiniLM text tower it also holds MiniLM's BERT and tokenizer."""

    def __init__(self, clip: TinyCLIP) -> None:
        self.clip = clip.eval()
        for p in clip.parameters():
            p.requires_grad_(False)
        self.cfg: CLIPConfig = clip.cfg
        self.bert: nn.Module | None = None
        self.tokenizer: Any = None
        if clip.cfg.text == "minilm":
            self.bert, self.tokenizer = _load_bert()
        self.inverse = anchor_inverse(clip.visual_proj)

    @property
    def text_depth(self) -> int:
        if self.bert is not None:
            return int(self.bert.config.num_hidden_layers)
        return len(self.clip.text.transformer.blocks)  # type: ignore[union-attr]

    @property
    def vision_depth(self) -> int:
        return len(self.clip.visual.blocks)

    def unknown_words(self, names: Sequence[str]) -> int:
        """Words (word tower) or word pieces (MiniLM) of ``names`` that map to unknown."""
        if self.bert is None:
            tok = self.clip.tokenizer
            return 0 if tok is None else tok.unknown_words(list(names))
        unk = self.tokenizer.unk_token_id
        return sum(
            i == unk for n in names for i in self.tokenizer(n, add_special_tokens=False).input_ids
        )


def _load_bert() -> tuple[nn.Module, Any]:
    from nshot.data.sources import hf_offline, minilm_model_path

    try:
        with hf_offline():
            from transformers import AutoTokenizer, BertModel
    except ImportError:
        raise MissingExtraError("transformers is needed for the MiniLM text tower") from None
    from transformers.utils import logging as hf_logging

    path = str(minilm_model_path())
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the checkpoint's unused pooler is expected
    hf_logging.disable_progress_bar()
    try:
        with hf_offline():
            tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
            bert = BertModel.from_pretrained(path, local_files_only=True, add_pooling_layer=False)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    bert.eval()
    for p in bert.parameters():
        p.requires_grad_(False)
    return bert, tok


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


def check_episode_model(backbone: Any, cfg: AthaConfig, system: str) -> None:
    """Refuse a system name or block indices the backbone cannot take (any backbone with
    ``text_depth`` and ``vision_depth``: the tiny CLIP's or a real CLIP's)."""
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
    """One episode's adapted CLIP for the classes ``names`` (see the module docstring)."""

    def __init__(
        self,
        backbone: Backbone,
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
        self.ccfg = backbone.cfg
        self.scale = cfg.scale_1shot if shots == 1 else cfg.scale_kshot
        torch.manual_seed(seed)
        clip = backbone.clip
        # what LoRA adapts is copied (the backbone stays pristine); the rest is shared, frozen
        self.visual = copy.deepcopy(clip.visual) if self.spec.lora else clip.visual
        self.visual_proj = clip.visual_proj
        if backbone.bert is not None:
            self.bert = copy.deepcopy(backbone.bert) if self.spec.lora else backbone.bert
            self.text_tower = clip.text  # its projection (with the tower's minilm_scale)
            if self.spec.lora:
                _inject_lora(self.bert, ["query", "key", "value"], cfg)
        else:
            self.word = copy.deepcopy(clip.text) if self.spec.lora else clip.text
            if self.spec.lora:
                _inject_lora(self.word, ["qkv"], cfg)
        if self.spec.lora:
            _inject_lora(self.visual, ["qkv"], cfg)
        for name, p in self.named_parameters():
            p.requires_grad_("lora_" in name)
        self.ctx = nn.Parameter(
            self._ctx_init(cfg.ctx_init, cfg.n_ctx), requires_grad=self.spec.ctx
        )
        self._prepare_prompts()
        depth = backbone.vision_depth
        plus = torch.zeros(depth)
        if self.spec.head:
            plus[cfg.rho_block] = cfg.rho_plus_init
        self.rho_plus = nn.Parameter(plus, requires_grad=self.spec.head)
        self.rho_minus = nn.Parameter(torch.zeros(depth), requires_grad=self.spec.tail)
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
            "head": [round(float(v), 6) for v in self.rho_plus.detach()],
            "tail": [round(float(v), 6) for v in self.rho_minus.detach()],
        }

    # ---- text

    def _ctx_init(self, words: str, n_ctx: int) -> torch.Tensor:
        if self.bb.bert is not None:
            ids = self.bb.tokenizer(words, add_special_tokens=False).input_ids
            emb = self.bb.bert.embeddings.word_embeddings.weight
        else:
            tok = self.bb.clip.tokenizer
            ids = [tok.index.get(w, tok.UNK) for w in tok.words(words)]
            emb = self.bb.clip.text.token_embedding.weight  # type: ignore[union-attr]
        if len(ids) != n_ctx:
            raise ConfigError(
                f"field 'ctx_init': {words!r} gives {len(ids)} tokens, n_ctx is {n_ctx}"
            )
        return emb[torch.tensor(ids)].detach().clone()

    def _prepare_prompts(self) -> None:
        """Token ids of the class names (fixed), the prompt layout and the padding mask."""
        n_ctx = self.cfg.n_ctx
        if self.bb.bert is not None:
            tok = self.bb.tokenizer
            names = [tok(n, add_special_tokens=False).input_ids[:200] for n in self.names]
            length = max(len(n) for n in names) + n_ctx + 2
            ids = torch.zeros(len(names), length, dtype=torch.long)  # [PAD] = 0
            mask = torch.zeros(len(names), length, dtype=torch.long)
            for i, n in enumerate(names):
                row = [tok.cls_token_id] + [0] * n_ctx + n + [tok.sep_token_id]
                ids[i, : len(row)] = torch.tensor(row)
                mask[i, : len(row)] = 1
            self.register_buffer("prompt_ids", ids, persistent=False)
            self.register_buffer("prompt_mask", mask, persistent=False)
        else:
            tok = self.bb.clip.tokenizer
            context = self.ccfg.context
            ids = torch.full((len(self.names), context), tok.PAD, dtype=torch.long)
            eot = torch.empty(len(self.names), dtype=torch.long)
            for i, n in enumerate(self.names):
                words = [tok.index.get(w, tok.UNK) for w in tok.words(n)]
                row = [tok.SOS, *([tok.PAD] * n_ctx), *words[: context - 2 - n_ctx], tok.EOS]
                ids[i, : len(row)] = torch.tensor(row)
                eot[i] = len(row) - 1
            self.register_buffer("prompt_ids", ids, persistent=False)
            self.register_buffer("prompt_eot", eot, persistent=False)

    def text_features(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(features, anchor features)`` ``[n, E]`` of the class prompts: the final text
        features and those read at text block ``txtlayer``."""
        n_ctx, layer = self.cfg.n_ctx, self.cfg.txtlayer
        if self.bb.bert is not None:
            emb = self.bert.embeddings.word_embeddings(self.prompt_ids)
            ctx = self.ctx[None].expand(len(self.names), -1, -1)
            emb = torch.cat([emb[:, :1], ctx, emb[:, 1 + n_ctx :]], dim=1)
            out = self.bert(
                inputs_embeds=emb, attention_mask=self.prompt_mask, output_hidden_states=True
            )
            m = self.prompt_mask[..., None].to(emb.dtype)

            def pool(h: torch.Tensor) -> torch.Tensor:  # sentence-transformers' mean + norm
                return F.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1)

            final = self.text_tower.project(pool(out.last_hidden_state))
            anchor = self.text_tower.project(pool(out.hidden_states[layer + 1]))
            return final, anchor
        word: TextTransformer = self.word  # type: ignore[assignment]
        emb = word.token_embedding(self.prompt_ids)
        ctx = self.ctx[None].expand(len(self.names), -1, -1)
        x = torch.cat([emb[:, :1], ctx, emb[:, 1 + n_ctx :]], dim=1)
        x = x + word.positional_embedding[: x.shape[1]]
        rows = torch.arange(len(self.names))
        anchor = None
        for i, blk in enumerate(word.transformer.blocks):
            x = blk(x, word.causal_mask)
            if i == layer:
                anchor = word.transformer.ln_out(x)[rows, self.prompt_eot] @ word.text_projection
        final = word.transformer.ln_out(x)[rows, self.prompt_eot] @ word.text_projection
        assert anchor is not None
        return final, anchor

    def anchors(self, anchor_features: torch.Tensor) -> torch.Tensor:
        norm = self.visual.norm
        return text_anchors(anchor_features, self.bb.inverse, norm.weight, norm.bias)

    # ---- image

    def image_features(
        self, images: torch.Tensor, anchors: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Image features ``[B, E]`` of pixels in [0, 1]; with ``anchors`` the ATHA update runs
        at every block input (the class token is left alone)."""
        self.bb.clip.check_images(images)
        x = (images - self.ccfg.pixel_mean) / self.ccfg.pixel_std
        v = self.visual
        t = v.patch_embed(x)
        t = torch.cat([v.cls_token.expand(t.shape[0], -1, -1), t], dim=1) + v.pos_embed
        for i, blk in enumerate(v.blocks):
            if anchors is not None:
                patches = atha_update(
                    t[:, 1:],
                    anchors,
                    self.rho_plus[i],
                    self.rho_minus[i],
                    add_ratio=self.cfg.add_ratio,
                    minus_ratio=self.cfg.minus_ratio,
                    generator=self.generator,
                    use_all_texts=self.cfg.use_all_texts,
                    tau=self.cfg.tau,
                )
                t = torch.cat([t[:, :1], patches], dim=1)
            t = blk(t)
        pooled = v.norm(t[:, 1:].mean(dim=1)) if self.ccfg.pool == "avg" else v.norm(t[:, 0])
        return pooled @ self.visual_proj

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, n]``: ``s · cos(image, class prompt)``."""
        text, anchor_text = self.text_features()
        anchors = self.anchors(anchor_text) if self.spec.mode != "off" else None
        img = F.normalize(self.image_features(images, anchors), dim=-1)
        return self.scale * img @ F.normalize(text, dim=-1).T


# --------------------------------------------------------------------------------------------
# checkpoints


def clip_from_state(config: dict[str, Any], state: dict[str, torch.Tensor]) -> TinyCLIP:
    try:
        cfg = CLIPConfig.from_dict(config)
    except (ConfigError, TypeError, KeyError) as e:
        raise CheckpointError(f"extra.clip_config: bad tiny CLIP config ({e})") from None
    model = TinyCLIP(cfg)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"model.safetensors: does not match its tiny CLIP ({e})") from None
    return model.eval()


def load_model(checkpoint: Any) -> tuple[TinyCLIP, AthaConfig]:
    """The pre-trained tiny CLIP of an nshot checkpoint of ``nshot train atha`` and its config."""
    cfg = AthaConfig.validated(checkpoint.config)
    clip_config = checkpoint.extra.get("clip_config")
    if not isinstance(clip_config, dict):
        raise CheckpointError(f"{checkpoint.path}: extra.clip_config is missing")
    return clip_from_state(clip_config, checkpoint.weights()), cfg
