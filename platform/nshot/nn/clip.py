"""A small CLIP for CPU-sized vision–language work (Radford et al. 2021, "Learning Transferable
Visual Models From Natural Language Supervision", §2.4–2.5).

Two towers map images and texts into one joint space where matching pairs have a high cosine:

* the image tower is :class:`nshot.nn.vit.ViT` (timm's parameter names; ``stem="conv"`` for its
  convolutional stem) without its head: the
  class token (``pool="token"``, CLIP's choice) or the mean of the patch tokens (``pool="avg"``)
  after the final LayerNorm (``visual.norm``, CLIP's ``ln_post``) times the projection
  ``visual_proj`` (CLIP's ``proj``, no bias); :meth:`TinyCLIP.image_tokens` gives every
  token. Images are pixels in [0, 1], ``[B, C, H, W]``; the model normalises them itself
  (``(x - pixel_mean) / pixel_std``), so attacks and augmentations work in pixel space;
* the text tower is one of

  - ``"word"``: a word-level tokenizer over a fixed vocabulary (``<sos>``/``<eos>``/``<unk>``/
    ``<pad>``; unknown words map to ``<unk>`` and :meth:`WordTokenizer.unknown_words` counts
    them), token + position embeddings, a causally masked pre-LN transformer
    (:class:`nshot.nn.transformer.Encoder`, whose final LayerNorm is CLIP's ``ln_final``), the
    features at the end-of-text token times ``text_projection`` (CLIP §2.4);
  - ``"minilm"``: frozen all-MiniLM-L6-v2 sentence embeddings (``nshot[tail-text]``,
    :class:`nshot.nn.text.SentenceEncoder`, memoised per text) and a trained linear
    projection (or a one-hidden-layer MLP with ``text_hidden > 0``);

* a learnable temperature ``logit_scale`` (initialised to ln(1/0.07), the logits' scale clipped
  at 100, CLIP §2.5).

``forward(images, texts)`` returns the image-by-text logits; :class:`ZeroShotClassifier` turns
class names into prompt texts (averaged over templates, CLIP §3.1.4) and classifies images.

::

    cfg = CLIPConfig(vocab=("a", "photo", "of", "circle", "square"))
    model = TinyCLIP(cfg)
    logits = model(images, ["a photo of a circle", "a photo of a square"])   # [B, 2]
    clf = ZeroShotClassifier(model, ["circle", "square"])
    probs = clf.predict_proba(images)                                         # [B, 2]
    save_clip(model, folder); same = load_clip(folder)   # safetensors + JSON, sha256 checked

Trained, cached models (the captioned shapes source domain, contrastive pre-training under Ray
Train) come from :func:`nshot.train.clip.pretrained_clip`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nshot.errors import CheckpointError, ConfigError
from nshot.fileio import atomic_path, atomic_write
from nshot.hashing import sha256_file
from nshot.nn.text import SentenceEncoder
from nshot.nn.transformer import Encoder
from nshot.nn.vit import ViT, stem_error

__all__ = [
    "CLIPConfig",
    "MiniLMText",
    "TextTransformer",
    "TinyCLIP",
    "WordTokenizer",
    "ZeroShotClassifier",
    "clip_contrastive_loss",
    "load_clip",
    "save_clip",
]

FORMAT = "nshot-tinyclip/1"
MODEL_FILE = "model.safetensors"
META_FILE = "clip.json"
TEXT_TOWERS = ("word", "minilm")
MINILM_DIM = 384
DEFAULT_TEMPLATES: tuple[str, ...] = ("a photo of a {}",)


@dataclass(frozen=True)
class CLIPConfig:
    """The sizes of a :class:`TinyCLIP` (JSON-able; saved beside the weights)."""

    img_size: int = 32
    patch: int = 4
    in_chans: int = 3
    vision_width: int = 64
    vision_depth: int = 4
    vision_heads: int = 4
    pool: str = "token"
    stem: str = "patch"
    text: str = "word"
    vocab: tuple[str, ...] = ()
    context: int = 16
    text_width: int = 64
    text_depth: int = 4
    text_heads: int = 4
    text_hidden: int = 0
    #: the MiniLM tower's sentence embedding (unit length) is multiplied by this before the
    #: projection; ``sqrt(384)`` gives it the norm of CLIP's ``ln_final`` output at unit gain
    #: (about sqrt(width)), so the text features have CLIP's scale. Cosines, hence CLIP's
    #: logits and (with the linear projection) its training, do not depend on it; methods
    #: that read unnormalised text features (atha's anchors) do.
    minilm_scale: float = 1.0
    embed_dim: int = 64
    init_logit_scale: float = math.log(1 / 0.07)
    max_logit_scale: float = 100.0
    pixel_mean: float = 0.5
    pixel_std: float = 0.25

    def __post_init__(self) -> None:
        if self.pool not in ("token", "avg"):
            raise ConfigError(f"pool: {self.pool!r} is not 'token' or 'avg'")
        if (why := stem_error(self.stem, self.patch)) is not None:
            raise ConfigError(f"stem: {why}")
        if self.text not in TEXT_TOWERS:
            raise ConfigError(f"text: {self.text!r} is not one of {TEXT_TOWERS}")
        if self.text == "word" and not self.vocab:
            raise ConfigError("vocab: the word text tower needs a non-empty vocabulary")
        if len(set(self.vocab)) != len(self.vocab):
            raise ConfigError("vocab: words must be unique")
        bad = [w for w in self.vocab if not re.fullmatch(r"[a-z0-9]+", w)]
        if bad:
            raise ConfigError(f"vocab: words must be lower-case letters and digits, got {bad[:3]}")
        if self.context < 3:
            raise ConfigError("context: must be >= 3 (start, one word, end)")
        if self.img_size % self.patch:
            raise ConfigError(f"patch: {self.patch} does not divide img_size {self.img_size}")
        if self.pixel_std <= 0 or self.max_logit_scale <= 0:
            raise ConfigError("pixel_std and max_logit_scale must be positive")
        if not (math.isfinite(self.minilm_scale) and self.minilm_scale > 0):
            raise ConfigError(f"minilm_scale: must be a positive number, got {self.minilm_scale}")
        object.__setattr__(self, "vocab", tuple(self.vocab))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["vocab"] = list(self.vocab)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CLIPConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown CLIP config field(s): {unknown}")
        data = dict(data)
        if "vocab" in data:
            data["vocab"] = tuple(data["vocab"])
        return cls(**data)


# --------------------------------------------------------------------------------------------
# text towers


class WordTokenizer:
    """Lower-cased words (runs of ``[a-z0-9]``); ``<sos> w1 ... wk <eos> <pad> ...``, truncated
    to ``context`` tokens with ``<eos>`` kept last (CLIP's end-of-text token)."""

    SPECIALS = ("<pad>", "<sos>", "<eos>", "<unk>")
    PAD, SOS, EOS, UNK = range(4)

    def __init__(self, vocab: Sequence[str], context: int) -> None:
        self.vocab = tuple(vocab)
        self.context = context
        self.index = {w: i + len(self.SPECIALS) for i, w in enumerate(self.vocab)}

    def __len__(self) -> int:
        return len(self.SPECIALS) + len(self.vocab)

    @staticmethod
    def words(text: str) -> list[str]:
        return re.findall(r"[a-z0-9]+", text.lower())

    def encode(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids [B, context] int64, eot [B] int64)``: token ids and the end-of-text position."""
        if isinstance(texts, str):
            raise TypeError("encode expects a list of strings, not one string")
        ids = torch.full((len(texts), self.context), self.PAD, dtype=torch.long)
        eot = torch.empty(len(texts), dtype=torch.long)
        for i, text in enumerate(texts):
            toks = [self.index.get(w, self.UNK) for w in self.words(text)][: self.context - 2]
            row = [self.SOS, *toks, self.EOS]
            ids[i, : len(row)] = torch.tensor(row)
            eot[i] = len(row) - 1
        return ids, eot

    def unknown_words(self, texts: Sequence[str]) -> int:
        """How many words of ``texts`` are not in the vocabulary (they become ``<unk>``)."""
        return sum(w not in self.index for t in texts for w in self.words(t))


class TextTransformer(nn.Module):
    """The word tower: embeddings, causal pre-LN transformer, end-of-text features × projection.

    :meth:`encode_embeddings` takes token embeddings instead of ids, so prompt learning (CoOp)
    can put learned context vectors in place of words.
    """

    def __init__(self, cfg: CLIPConfig) -> None:
        super().__init__()
        self.tokenizer = WordTokenizer(cfg.vocab, cfg.context)
        w = cfg.text_width
        self.token_embedding = nn.Embedding(len(self.tokenizer), w)
        self.positional_embedding = nn.Parameter(torch.empty(cfg.context, w))
        self.transformer = Encoder(cfg.text_depth, w, cfg.text_heads, 4 * w)
        self.text_projection = nn.Parameter(torch.empty(w, cfg.embed_dim))
        causal = torch.ones(cfg.context, cfg.context, dtype=torch.bool).tril()
        self.register_buffer("causal_mask", causal[None], persistent=False)
        # CLIP's initialisation (§2.5 follows the GPT-2 recipe; the released code uses these
        # standard deviations)
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        nn.init.normal_(self.positional_embedding, std=0.01)
        nn.init.normal_(self.text_projection, std=w**-0.5)

    def encode_embeddings(self, x: torch.Tensor, eot: torch.Tensor) -> torch.Tensor:
        """Features ``[B, embed_dim]`` of token embeddings ``x`` ``[B, L <= context, width]``
        (positions are added here) read at the end-of-text positions ``eot``."""
        length = x.shape[1]
        x = x + self.positional_embedding[:length]
        x = self.transformer(x, self.causal_mask[:, :length, :length])
        return x[torch.arange(x.shape[0]), eot] @ self.text_projection

    def forward(self, ids: torch.Tensor, eot: torch.Tensor) -> torch.Tensor:
        return self.encode_embeddings(self.token_embedding(ids), eot)

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        ids, eot = self.tokenizer.encode(texts)
        return self(ids.to(self.positional_embedding.device), eot)


class MiniLMText(nn.Module):
    """Frozen all-MiniLM-L6-v2 sentence embeddings (384-d, unit length;
    :class:`nshot.nn.text.SentenceEncoder`), times ``cfg.minilm_scale``, and a trained
    projection to the joint space. The encoder is not a submodule: only the projection is in
    the state dict; embeddings are memoised per text in this process."""

    def __init__(self, cfg: CLIPConfig) -> None:
        super().__init__()
        if cfg.text_hidden > 0:
            self.proj: nn.Module = nn.Sequential(
                nn.Linear(MINILM_DIM, cfg.text_hidden),
                nn.GELU(),
                nn.Linear(cfg.text_hidden, cfg.embed_dim),
            )
        else:
            self.proj = nn.Linear(MINILM_DIM, cfg.embed_dim, bias=False)
        self.scale = float(cfg.minilm_scale)
        self.encoder = SentenceEncoder()

    def sentence_embeddings(self, texts: Sequence[str]) -> torch.Tensor:
        """MiniLM embeddings ``[B, 384]`` of ``texts`` (needs ``nshot[tail-text]``)."""
        return self.encoder.embed(texts)

    def remember(self, texts: Sequence[str], embeddings: torch.Tensor) -> None:
        """Seed the memo with embeddings computed elsewhere (e.g. once by the driver)."""
        self.encoder.remember(texts, embeddings)

    def project(self, emb: torch.Tensor) -> torch.Tensor:
        """Text features ``[B, E]`` of sentence embeddings ``[B, 384]`` (unit length)."""
        return self.proj(emb * self.scale)

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        emb = self.sentence_embeddings(texts)
        return self.project(emb.to(next(self.proj.parameters()).device))


# --------------------------------------------------------------------------------------------
# the model


class TinyCLIP(nn.Module):
    """Image tower (ViT), text tower (word or MiniLM), projections and a learnable temperature."""

    def __init__(self, cfg: CLIPConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.visual = ViT(
            img_size=cfg.img_size,
            patch=cfg.patch,
            in_chans=cfg.in_chans,
            num_classes=cfg.embed_dim,
            width=cfg.vision_width,
            depth=cfg.vision_depth,
            heads=cfg.vision_heads,
            stem=cfg.stem,
        )
        self.visual.head = nn.Identity()  # the CLIP projection below replaces the classifier
        self.visual_proj = nn.Parameter(
            torch.randn(cfg.vision_width, cfg.embed_dim) * cfg.vision_width**-0.5
        )
        self.text: TextTransformer | MiniLMText = (
            TextTransformer(cfg) if cfg.text == "word" else MiniLMText(cfg)
        )
        self.logit_scale = nn.Parameter(torch.tensor(float(cfg.init_logit_scale)))

    @property
    def tokenizer(self) -> WordTokenizer | None:
        """The word tokenizer (``None`` for the MiniLM tower)."""
        return self.text.tokenizer if isinstance(self.text, TextTransformer) else None

    def check_images(self, images: torch.Tensor) -> None:
        c, s = self.cfg.in_chans, self.cfg.img_size
        if images.dim() != 4 or tuple(images.shape[1:]) != (c, s, s):
            raise ValueError(
                f"images must be [B, {c}, {s}, {s}] pixels in [0, 1], got {tuple(images.shape)}"
            )

    def image_tokens(self, x: torch.Tensor, visual: ViT | None = None) -> torch.Tensor:
        """The image tower's tokens after ``visual.norm`` (CLIP's ``ln_post``), ``[B, 1 + N, W]``
        for normalised pixels ``x``; token 0 is the pooled one: the class token
        (``pool="token"``) or the mean of the patch tokens (``pool="avg"``, timm's
        ``global_pool="avg"``). ``visual``: another image tower of this shape (an adapted
        copy) in place of :attr:`visual`."""
        v = self.visual if visual is None else visual
        t = v.patch_embed(x)
        t = torch.cat([v.cls_token.expand(t.shape[0], -1, -1), t], dim=1) + v.pos_embed
        for blk in v.blocks:
            t = blk(t)
        if self.cfg.pool == "avg":
            pooled = v.norm(t[:, 1:].mean(dim=1, keepdim=True))
            return torch.cat([pooled, v.norm(t[:, 1:])], dim=1)
        return v.norm(t)

    def encode_image(
        self, images: torch.Tensor, normalize: bool = False, visual: ViT | None = None
    ) -> torch.Tensor:
        """Image features ``[B, embed_dim]`` of pixels in [0, 1] ``[B, C, H, W]`` (``visual``:
        as :meth:`image_tokens`)."""
        self.check_images(images)
        x = (images - self.cfg.pixel_mean) / self.cfg.pixel_std
        f = self.image_tokens(x, visual)[:, 0] @ self.visual_proj
        return F.normalize(f, dim=-1) if normalize else f

    def encode_text(self, texts: Sequence[str], normalize: bool = False) -> torch.Tensor:
        """Text features ``[B, embed_dim]`` of a list of strings."""
        if isinstance(texts, str):
            raise TypeError("encode_text expects a list of strings, not one string")
        f = self.text.encode(list(texts))
        return F.normalize(f, dim=-1) if normalize else f

    def scale(self) -> torch.Tensor:
        """exp(logit_scale), clipped at ``max_logit_scale`` (CLIP §2.5)."""
        return self.logit_scale.exp().clamp(max=self.cfg.max_logit_scale)

    def logits(self, image_features: torch.Tensor, text_features: torch.Tensor) -> torch.Tensor:
        """Scaled cosines ``[B_img, B_txt]`` of unnormalised features."""
        img = F.normalize(image_features, dim=-1)
        txt = F.normalize(text_features, dim=-1)
        return self.scale() * img @ txt.T

    def forward(self, images: torch.Tensor, texts: Sequence[str]) -> torch.Tensor:
        """Logits per image ``[B_img, len(texts)]`` (transpose for logits per text)."""
        return self.logits(self.encode_image(images), self.encode_text(texts))

    def class_text_features(
        self, class_names: Sequence[str], templates: Sequence[str] = DEFAULT_TEMPLATES
    ) -> torch.Tensor:
        """Unit class embeddings ``[C, embed_dim]``: each name in every template, the normalised
        features averaged and renormalised (CLIP §3.1.4's prompt ensembling)."""
        names = _check_class_names(class_names)
        if not templates or any("{}" not in t for t in templates):
            raise ValueError("templates must be a non-empty list of strings with '{}'")
        texts = [t.format(n) for n in names for t in templates]
        f = self.encode_text(texts, normalize=True).view(len(names), len(templates), -1)
        return F.normalize(f.mean(dim=1), dim=-1)


def _check_class_names(class_names: Sequence[str]) -> list[str]:
    if isinstance(class_names, str):
        raise TypeError("class_names must be a list of strings, not one string")
    names = list(class_names)
    if not names:
        raise ValueError("class_names must not be empty")
    if not all(isinstance(n, str) and n.strip() for n in names):
        raise ValueError("class_names must be non-empty strings")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"class_names must be unique; repeated: {dup}")
    return names


class ZeroShotClassifier(nn.Module):
    """Zero-shot classification by a :class:`TinyCLIP` (CLIP §3.1.2): class names become prompt
    texts, whose unit features are the weights of a cosine classifier at the model's scale.

    The class features are computed once, here, without gradients.
    """

    def __init__(
        self,
        model: TinyCLIP,
        class_names: Sequence[str],
        templates: Sequence[str] = DEFAULT_TEMPLATES,
    ) -> None:
        super().__init__()
        self.model = model
        self.class_names = _check_class_names(class_names)
        self.templates = tuple(templates)
        with torch.no_grad():
            self.register_buffer(
                "class_features", model.class_text_features(self.class_names, self.templates)
            )

    def unknown_words(self) -> int:
        """Words of the class names missing from the model's vocabulary (0 for MiniLM)."""
        tok = self.model.tokenizer
        return 0 if tok is None else tok.unknown_words(self.class_names)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        img = self.model.encode_image(images, normalize=True)
        return self.model.scale() * img @ self.class_features.T

    @torch.no_grad()
    def predict_proba(self, images: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
        step = batch_size
        out = [self(images[i : i + step]).softmax(-1) for i in range(0, len(images), step)]
        return torch.cat(out) if out else torch.zeros(0, len(self.class_names))

    @torch.no_grad()
    def predict(self, images: torch.Tensor) -> torch.Tensor:
        return self.predict_proba(images).argmax(-1)


def clip_contrastive_loss(
    logits: torch.Tensor, text_of_image: torch.Tensor | None = None
) -> torch.Tensor:
    """CLIP's symmetric cross-entropy (§2.5, Figure 3) of image-by-text ``logits``.

    With ``text_of_image`` (``[B_img]``: the column of each image's caption) several images may
    share one caption (the texts are the batch's distinct captions): the image→text term is the
    cross-entropy to that column, and the text→image term spreads the target uniformly over
    the images of the caption. Without it the pairs are the diagonal.
    """
    n_img, n_txt = logits.shape
    if text_of_image is None:
        if n_img != n_txt:
            raise ValueError("logits must be square without text_of_image")
        target = torch.arange(n_img, device=logits.device)
        return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
    i2t = F.cross_entropy(logits, text_of_image)
    onehot = F.one_hot(text_of_image, n_txt).to(logits.dtype)  # [B_img, B_txt]
    t2i_target = onehot.T / onehot.sum(0).clamp(min=1)[:, None]
    used = onehot.sum(0) > 0
    t2i = -(t2i_target * logits.T.log_softmax(-1)).sum(-1)[used].mean()
    return (i2t + t2i) / 2


# --------------------------------------------------------------------------------------------
# saving and loading (safetensors + JSON, never pickle)


def save_clip(model: TinyCLIP, folder: str | Path, **meta: Any) -> Path:
    """Write ``folder/model.safetensors`` and ``folder/clip.json`` (format, config, the weights'
    sha256, and ``meta``: JSON-able facts such as training losses and measured accuracy)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    with atomic_path(folder / MODEL_FILE) as tmp:
        save_file(state, str(tmp))
    record = {
        "format": FORMAT,
        "config": model.cfg.to_dict(),
        "sha256": {MODEL_FILE: sha256_file(folder / MODEL_FILE)},
        **meta,
    }
    atomic_write(folder / META_FILE, json.dumps(record, indent=1) + "\n")
    return folder


def read_clip_meta(folder: str | Path) -> dict[str, Any]:
    """The verified ``clip.json`` of a saved model: its format is known and every file it lists
    has its recorded sha256; :class:`CheckpointError` (naming the file) otherwise."""
    folder = Path(folder)
    meta_path = folder / META_FILE
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{meta_path}: missing or unreadable ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{meta_path}: not a tiny CLIP manifest (format {FORMAT})")
    files = meta.get("sha256")
    if not isinstance(files, dict) or MODEL_FILE not in files:
        raise CheckpointError(f"{meta_path}: lists no sha256 for {MODEL_FILE}")
    for name, digest in files.items():
        path = folder / name
        if name not in (MODEL_FILE,) or path.is_symlink() or not path.is_file():
            raise CheckpointError(f"{path}: missing, a link, or not a tiny CLIP file")
        if sha256_file(path) != digest:
            raise CheckpointError(f"{path}: sha256 differs from {META_FILE}; refusing to load it")
    return meta


def load_clip(folder: str | Path) -> TinyCLIP:
    """The :class:`TinyCLIP` saved in ``folder`` by :func:`save_clip`, verified (sha256, the
    config, every tensor's name and shape), in eval mode."""
    from safetensors.torch import load_file

    meta = read_clip_meta(folder)
    try:
        cfg = CLIPConfig.from_dict(meta["config"])
    except (ConfigError, TypeError, KeyError) as e:
        raise CheckpointError(f"{Path(folder) / META_FILE}: bad config ({e})") from None
    model = TinyCLIP(cfg)
    state = load_file(str(Path(folder) / MODEL_FILE))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise CheckpointError(
            f"{Path(folder) / MODEL_FILE}: does not match its config ({e})"
        ) from None
    return model.eval()
