"""ATHA on a real CLIP (the ``paper`` preset: ViT-B/16, paper §4.1) read by path with
:func:`nshot.nn.hfclip.load_pretrained_clip`, and the image-folder target domains it runs on.

Only the backbone adapter is new; the algorithm is :mod:`.model`'s (the systems of
:data:`.model.SYSTEM_SPEC`, :func:`.model.atha_update`, :func:`.model.anchor_inverse`,
:func:`.model.text_anchors`) and :func:`.train.adapt` trains it unchanged.

* **CoOp**: the prompt is ``[start] + n_ctx context vectors + the class name's BPE tokens +
  [end]``; the context starts as the token embeddings of ``ctx_init`` ("a photo of a": four
  BPE tokens). The prompt runs through ``CLIPTextEmbeddings(inputs_embeds=...)`` (positions
  added), the causally masked encoder layers, the final layer norm and the end-token pooling,
  then ``text_projection``; with the context equal to its initial value this is the CLIP's
  text feature of "a photo of a {name}" (tested to 1e-5). The anchors are read the same way
  after text block ``txtlayer``.
* **CLIP-LoRA**: PEFT ``LoraConfig(use_rslora=True)`` on ``q_proj``, ``k_proj`` and
  ``v_proj`` of both towers (copies per episode; the backbone stays pristine).
* **ATHA**: forward pre-hooks on the vision encoder layers apply the head / tail update to the
  patch tokens at every block input (the class token is left alone), registered for one
  forward pass and removed after it. The anchors come back through ``visual_projection`` and
  ``post_layernorm`` (the toy's inverse).

Images are pixels in [0, 1] at the CLIP's resolution (224: :func:`nshot.nn.hfclip.load_image`);
the model normalises them, runs on the backbone's device and returns logits on the device of
its input (so the toy's episode loop runs unchanged).

Target domains (``data_path``): one folder per domain, each an ImageFolder
(``<domain>/<class>/*.png|jpg|jpeg``; BSCD-FSL's CropDiseases, EuroSAT, ISIC2018, ChestX
arranged so); ``data_domains`` picks some (default: every subfolder). Class names as
:meth:`nshot.nn.hfclip.ImageFolder.class_names` (a ``class_names.json`` in the domain folder, or
the folder names). Episodes are functions of ``(seed, domain, episode)`` as on the toy.
"""

from __future__ import annotations

import copy
import functools
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from nshot.errors import CheckpointError, ConfigError

from .config import AthaConfig
from .data import Episode
from .model import (
    SYSTEM_SPEC,
    _inject_lora,
    anchor_inverse,
    atha_update,
    check_episode_model,
    text_anchors,
)

# --------------------------------------------------------------------------------------------
# checks


def check_clip_backbone(cfg: AthaConfig) -> None:
    """Raise a :class:`ConfigError` naming everything that keeps ``backbone='clip'`` from
    running: ``clip_path`` (not set, missing, missing files, not a CLIP), the tokenizer, and
    ``data_path`` (not set, missing, no domain folders, an unknown ``data_domains`` entry)."""
    from nshot.nn.hfclip import clip_field_problems

    missing = clip_field_problems(cfg.clip_path, cfg.clip_tokenizer, "openai/clip-vit-base-patch16")
    if not cfg.data_path:
        missing.append(
            "field 'data_path' is not set (a folder of target domains, each class folders)"
        )
    else:
        root = Path(cfg.data_path)
        if not root.is_dir():
            missing.append(f"field 'data_path': {root} is not a directory")
        else:
            found = _domain_folders(root)
            if not found:
                missing.append(f"field 'data_path': {root} has no domain folders")
            for d in cfg.data_domains:
                if d not in found:
                    missing.append(f"field 'data_domains': {d!r} is not a folder of {root}")
    if missing:
        raise ConfigError(
            f"atha backbone 'clip' (preset {cfg.preset!r}) needs: " + "; ".join(missing)
            + ". See methods/atha/README.md (Paper preset)."
        )  # fmt: skip


def _domain_folders(root: Path) -> list[str]:
    return sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))


def paper_domains(cfg: AthaConfig) -> list[str]:
    """The target domains of ``backbone='clip'``: ``data_domains`` or every subfolder."""
    return list(cfg.data_domains) or _domain_folders(Path(cfg.data_path or ""))


# --------------------------------------------------------------------------------------------
# the backbone and the episode model


class HFBackbone:
    """The frozen real CLIP an episode starts from (never modified; episodes copy what LoRA
    adapts)."""

    def __init__(self, pretrained: Any, device: torch.device | str | None = None) -> None:
        self.pre = pretrained
        self.model = pretrained.model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        if device is not None:
            self.model.to(device)
        self.device = self.model.logit_scale.device
        self.bert = None
        self.inverse = anchor_inverse(self.model.visual_projection.weight.T.cpu()).to(self.device)

    @property
    def text_depth(self) -> int:
        return int(self.model.config.text_config.num_hidden_layers)

    @property
    def vision_depth(self) -> int:
        return int(self.model.config.vision_config.num_hidden_layers)

    @property
    def image_size(self) -> int:
        return int(self.pre.image_size)

    def unknown_words(self, names: Sequence[str]) -> int:
        """Byte-level BPE knows every text."""
        return 0

    def episode_model(
        self, names: Sequence[str], cfg: AthaConfig, system: str, *, shots: int, seed: int
    ) -> HFEpisodeModel:
        return HFEpisodeModel(self, names, cfg, system, shots=shots, seed=seed)


def load_hf_backbone(cfg: AthaConfig, device: torch.device | str | None = None) -> HFBackbone:
    """The CLIP at ``clip_path`` (checked against ``clip_arch``) as an episode backbone."""
    from nshot.nn.hfclip import load_clip_fields

    check_clip_backbone(cfg)
    return HFBackbone(load_clip_fields(cfg.clip_path, cfg.clip_tokenizer, cfg.clip_arch), device)


class HFEpisodeModel(nn.Module):
    """One episode's adapted real CLIP for the classes ``names`` (see the module docstring);
    the interface of :class:`.model.EpisodeModel`."""

    def __init__(
        self,
        backbone: HFBackbone,
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
        torch.manual_seed(seed)
        m = backbone.model
        self.text = copy.deepcopy(m.text_model) if self.spec.lora else m.text_model
        self.vision = copy.deepcopy(m.vision_model) if self.spec.lora else m.vision_model
        self.text_projection = m.text_projection
        self.visual_projection = m.visual_projection
        if self.spec.lora:
            targets = ["q_proj", "k_proj", "v_proj"]
            _inject_lora(self.text, targets, cfg)
            _inject_lora(self.vision, targets, cfg)
            self.text.to(backbone.device)
            self.vision.to(backbone.device)
        for name, p in self.named_parameters():
            p.requires_grad_("lora_" in name)
        pre = backbone.pre
        init = pre.token_ids(cfg.ctx_init)
        if len(init) != cfg.n_ctx:
            raise ConfigError(
                f"field 'ctx_init': {cfg.ctx_init!r} gives {len(init)} tokens, n_ctx is {cfg.n_ctx}"
            )
        emb = m.text_model.embeddings.token_embedding.weight
        self.ctx = nn.Parameter(
            emb[torch.tensor(init, device=emb.device)].detach().clone(),
            requires_grad=self.spec.ctx,
        )
        context = pre.context_length
        bos, eos = int(pre.tokenizer.bos_token_id), pre.eos_id
        rows = [[bos, *([0] * cfg.n_ctx), *pre.token_ids(n)][: context - 1] + [eos] for n in names]
        ids = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
        self.register_buffer("prompt_ids", ids.to(backbone.device), persistent=False)
        eot = torch.tensor([len(r) - 1 for r in rows], device=backbone.device)
        self.register_buffer("prompt_eot", eot, persistent=False)
        depth = backbone.vision_depth
        plus = torch.zeros(depth)
        if self.spec.head:
            plus[cfg.rho_block] = cfg.rho_plus_init
        self.rho_plus = nn.Parameter(plus.to(backbone.device), requires_grad=self.spec.head)
        self.rho_minus = nn.Parameter(
            torch.zeros(depth, device=backbone.device), requires_grad=self.spec.tail
        )
        self.generator = torch.Generator().manual_seed(seed) if self.spec.mode == "random" else None
        self.eval()

    # ---- parameters and modes (as the toy's episode model)

    def lora_parameters(self) -> list[nn.Parameter]:
        return [p for n, p in self.named_parameters() if "lora_" in n and p.requires_grad]

    def rate_parameters(self) -> list[nn.Parameter]:
        return [p for p in (self.rho_plus, self.rho_minus) if p.requires_grad]

    def train_mode(self) -> HFEpisodeModel:
        """Everything frozen in eval mode; only LoRA's dropout is active (paper §4.1)."""
        self.eval()
        for name, mod in self.named_modules():
            if "lora_dropout" in name:
                mod.train()
        return self

    def rates(self) -> dict[str, list[float]]:
        return {
            "head": [round(float(v), 6) for v in self.rho_plus.detach().cpu()],
            "tail": [round(float(v), 6) for v in self.rho_minus.detach().cpu()],
        }

    # ---- text

    def text_features(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(features, anchor features)`` ``[n, E]`` of the class prompts."""
        t, n_ctx, layer = self.text, self.cfg.n_ctx, self.cfg.txtlayer
        emb = t.embeddings.token_embedding(self.prompt_ids)
        ctx = self.ctx[None].expand(len(self.names), -1, -1)
        x = torch.cat([emb[:, :1], ctx, emb[:, 1 + n_ctx :]], dim=1)
        h = t.embeddings(inputs_embeds=x)
        length = h.shape[1]
        mask = torch.full((length, length), float("-inf"), device=h.device, dtype=h.dtype)
        mask = mask.triu(1)[None, None]
        rows = torch.arange(len(self.names), device=h.device)
        anchor = None
        for i, block in enumerate(t.encoder.layers):
            h = block(h, mask)
            if i == layer:
                anchor = self.text_projection(t.final_layer_norm(h)[rows, self.prompt_eot])
        final = self.text_projection(t.final_layer_norm(h)[rows, self.prompt_eot])
        assert anchor is not None
        return final, anchor

    def anchors(self, anchor_features: torch.Tensor) -> torch.Tensor:
        ln = self.vision.post_layernorm
        return text_anchors(anchor_features, self.bb.inverse, ln.weight, ln.bias)

    # ---- image

    def image_features(
        self, images: torch.Tensor, anchors: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Image features ``[B, E]`` of pixels in [0, 1] on the backbone's device; with
        ``anchors`` the ATHA update runs at every block input (forward pre-hooks)."""
        x = self.bb.pre.normalise(images.to(self.bb.device))
        handles = []
        if anchors is not None:
            for i, layer in enumerate(self.vision.encoder.layers):
                handles.append(
                    layer.register_forward_pre_hook(self._hook(i, anchors), with_kwargs=True)
                )
        try:
            pooled = self.vision(pixel_values=x).pooler_output
        finally:
            for handle in handles:
                handle.remove()
        return self.visual_projection(pooled)

    def _hook(self, i: int, anchors: torch.Tensor):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            if args:
                h, rest = args[0], args[1:]
            else:
                h, rest = kwargs.pop("hidden_states"), ()
            patches = atha_update(
                h[:, 1:], anchors, self.rho_plus[i], self.rho_minus[i],
                add_ratio=self.cfg.add_ratio, minus_ratio=self.cfg.minus_ratio,
                generator=self.generator, use_all_texts=self.cfg.use_all_texts, tau=self.cfg.tau,
            )  # fmt: skip
            return (torch.cat([h[:, :1], patches], dim=1), *rest), kwargs

        return hook

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, n]`` (``s · cos``) on the device of ``images``."""
        text, anchor_text = self.text_features()
        anchors = self.anchors(anchor_text) if self.spec.mode != "off" else None
        img = F.normalize(self.image_features(images, anchors), dim=-1)
        return (self.scale * img @ F.normalize(text, dim=-1).T).to(images.device)


# --------------------------------------------------------------------------------------------
# image-folder domains and their episodes


@dataclass(frozen=True)
class FolderPool:
    domain: str
    index: int  # the domain's position in the run's domain list (seeds its episodes)
    paths: tuple[Path, ...]
    labels: np.ndarray
    names: tuple[str, ...]
    size: int


def folder_pool(cfg: AthaConfig, domain: str, size: int) -> FolderPool:
    from nshot.nn.hfclip import image_folder

    domains = paper_domains(cfg)
    try:
        f = image_folder(Path(cfg.data_path or "") / domain)
    except CheckpointError as e:
        raise ConfigError(f"field 'data_path': {e}") from None
    if len(f.classes) < cfg.n_way:
        raise ConfigError(
            f"field 'n_way': {cfg.n_way} > the {len(f.classes)} classes of domain {domain!r}"
        )
    counts = np.bincount(f.labels, minlength=len(f.classes))
    if counts.min() < 10 + cfg.queries:
        c = f.classes[int(counts.argmin())]
        raise ConfigError(
            f"field 'queries': class {c!r} of domain {domain!r} has {counts.min()} images; "
            f"episodes need 10 + queries = {10 + cfg.queries}"
        )
    index = domains.index(domain) if domain in domains else zlib.crc32(domain.encode())
    return FolderPool(domain, index, f.paths, f.labels, tuple(f.class_names()), size)


@functools.lru_cache(maxsize=4096)
def _image(path: Path, size: int) -> np.ndarray:
    from nshot.nn.hfclip import load_image

    return load_image(path, size)


def sample_folder_episode(
    pool: FolderPool, *, seed: int, episode: int, n_way: int, shots: int, queries: int
) -> Episode:
    """The toy's episode sampling (:func:`.data.sample_episode`) on an image folder: classes,
    then per class a permutation whose first ``shots`` images are the support and images
    10 … 10 + queries the queries; images are read (and kept in a per-process cache)."""
    rng = np.random.default_rng([seed, pool.index, episode])
    classes = np.sort(rng.choice(len(pool.names), n_way, replace=False))
    sx, sy, qx, qy = [], [], [], []
    for i, c in enumerate(classes):
        idx = rng.permutation(np.flatnonzero(pool.labels == c))
        sup, qry = idx[:shots], idx[10 : 10 + queries]
        sx += [_image(pool.paths[j], pool.size) for j in sup]
        sy += [i] * len(sup)
        qx += [_image(pool.paths[j], pool.size) for j in qry]
        qy += [i] * len(qry)
    return Episode(
        names=[pool.names[c] for c in classes],
        support_x=np.stack(sx),
        support_y=np.asarray(sy, dtype=np.int64),
        query_x=np.stack(qx),
        query_y=np.asarray(qy, dtype=np.int64),
    )
