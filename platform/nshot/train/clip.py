"""Contrastive pre-training of the tiny CLIP (:mod:`nshot.nn.clip`) on the captioned shapes of
:mod:`nshot.data.shapes`, under Ray Train, resumable, and cached under ``$NSHOT_CACHE``.

No CLIP weights ship in any installable package, so nshot trains its own: CLIP's symmetric
contrastive loss (Radford et al. 2021, §2.5) between images and their captions, one caption form
per image and step drawn from :data:`nshot.data.shapes.CAPTION_TEMPLATES`. A batch's texts are
its distinct captions, so images that share a caption are not each other's negatives
(:func:`nshot.nn.clip.clip_contrastive_loss`). AdamW with linear warm-up and cosine decay (§2.5),
no weight decay on gains, biases and the temperature.

::

    model = pretrained_clip("small")            # trained on first use (minutes), then cached
    model = pretrained_clip("smoke")            # seconds; for tests
    path = ensure_clip("small", text="minilm")  # the cached folder (model.safetensors, clip.json)
    result = pretrain("smoke", out=folder, workers=2)   # two Ray Train workers
    pretrain("small", out=folder, stop_at=200); pretrain("small", out=folder)  # resumes at 200
    report = zero_shot_report(model, "small")   # acc_src_8way and the held-out measurements

Presets (:data:`PRESETS`):

* ``smoke``: 2-block towers of width 32, 16 tokens of 32² RGB, 512 shapes, 60 steps; seconds;
* ``small``: ViT width 64 × 4 blocks on 64 tokens of 32² RGB made by a convolutional stem
  (``stem="conv"``, recipe version 6; see below), mean-pooled, word tower width 64 × 4 blocks
  with context 16, joint dimension 64; 20,000 shapes, 1,500 steps of 128 (9.6 epochs), about
  5 minutes on two Ray Train workers of one thread each;
* ``small-cls``: the atha method's tiny CLIP (recipe version 7): ``small`` with CLIP's head,
  the class token pooled and projected from the width 64 to a joint dimension of 48 (a
  projection wider than its output, as ViT-B/16's 768 → 512, whose minimum-norm inverse the
  atha method's anchors use); zero-shot ``acc_src_8way`` 0.9994 with MiniLM (two workers);
* ``small-cls-ln``: the atha method's tiny CLIP (recipe version 8): ``small-cls`` whose MiniLM
  text tower multiplies the unit-length sentence embedding by sqrt(384) before the
  projection, the norm of CLIP's ``ln_final`` output, so the text features have the scale of
  the image features as in CLIP (recipe 7's are about 20 times smaller); the zero-shot
  classifier and its training do not depend on the scale;
* ``small-cls-ln-glyphs``: recipe version 9, ``small-cls-ln`` whose source adds pairings the
  shapes never show and a real CLIP's web data holds: 10,000 printed numerals
  (:mod:`nshot.data.glyphs`, captioned "a photo of the number seven" or "a photo of a seven")
  and 10,000 line drawings of the eight shapes (:func:`nshot.data.shapes.render_drawings`,
  "a drawing of a star") beside the 20,000 shapes; the same towers, 1,500 steps of 128 (4.8
  epochs of the 40,000 images) and 32² images; :func:`zero_shot_report` adds
  ``acc_glyphs_10way`` and ``acc_drawings_8way`` on fresh renders of both; zero-shot
  ``acc_src_8way`` 0.997 with MiniLM (seed 0, two workers; numerals 0.995, drawings 0.726),
  a step costing what recipe 8's does;
* ``digits``: the same towers on scikit-learn's 8 × 8 grey digits (patch 2, 16 tokens,
  ``in_chans=1``), pre-trained on the dirclip method's 1,200-image training split
  (:func:`digits_split`) with captions such as "this is a photo of a seven"; zero-shot on the
  597 test digits (and the same rolled by one pixel). For dirclip, whose images are 64 floats
  in [0, 1]: reshape them to ``[B, 1, 8, 8]``;
* ``digits-smoke``: the digits source with 1-block towers of width 16, 250 steps of 64; about
  5 seconds, for the dirclip method's tests (zero-shot about 0.3 on the test digits).

Text towers: ``"word"`` (no extra dependency) and ``"minilm"`` (frozen MiniLM + projection,
``nshot[tail-text]``); :data:`DEFAULT_TEXT` is the one that measured better (below; the
runs' reports: ``methods/atha/results/small.json`` ``extra.tiny_clip`` for MiniLM,
``methods/atha/results/tiny-clip-word.json`` for the word tower, written by
``python examples/tiny_clip.py --preset small --text word --workers 2``).

Measured (``small``, recipe version 6, seed 0, 1,500 steps on two Ray Train workers, a quiet
2-core machine): zero-shot 8-way shape accuracy on source-style images (``acc_src_8way``, the
atha method's precondition ≥ 0.80) is **0.998 with the MiniLM tower and 0.987 with the word
tower** (pre-training 291 s and about 340 s of steps). MiniLM / word: held-out (shape, colour)
pairs 0.985 / 0.921, colours 1.000 / 0.841, class names never used in pre-training: plurals
("circles", ...) 0.998 / 0.122 (chance: every such word is unknown to the word tower), synonyms
("disc", "box", ...) 0.274 / 0.108.

Versions ≤ 5 embedded 4 × 4 patches with one strided convolution (timm's and CLIP's patch
embedding) and missed the precondition with both towers: 0.771 (MiniLM) and 0.233 (word) after
1,500 steps; shape was learnt late, colour, size and background early (MiniLM 0.36 after 500
steps, 0.756 after 1,200), and the same ViT trained with a *supervised* shape loss stayed near
chance for 300 steps. Caption forms (half the captions naming the shape only), mean pooling
and larger shapes (recipes 1 → 4) did not change that; the convolutional stem of
:class:`nshot.nn.vit.ViT` (Xiao et al. 2021) did: ``examples/vit_stems.py`` trains the two
image towers as supervised shape classifiers side by side. The ``digits`` preset, where the
classes are coarse pixel patterns, keeps version 5's patch embedding and reaches 0.941
zero-shot (0.374 on the test digits rolled by one pixel; 300 steps, the word tower).

Training runs in this process (``workers=0``) or on Ray Train workers (``TorchTrainer``; the
workers all-gather image features, so the loss is the one of the global batch), the steps run by
nshot's trainer (:func:`nshot.train.trainer.train` with ``session=False``: this module keeps its
own resume folders, and a worker reports its loss to Ray Train itself). Every
``checkpoint_every`` steps rank 0 writes ``<out>/checkpoints/step-<n>`` (``model.safetensors``,
``optimizer.safetensors``, ``state.json`` with every file's sha256); a run that finds one
continues from it, and the data order and caption draws are functions of (seed, step), so a
resumed run ends with the same weights as an uninterrupted one. The finished model is
``<out>/model.safetensors`` and ``<out>/clip.json`` (:func:`nshot.nn.clip.save_clip`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nshot.data.cache import cache_dir, file_lock
from nshot.data.glyphs import DIGIT_WORDS, GLYPH_TEMPLATES, glyph_caption, glyphs_table
from nshot.data.shapes import (
    BACKGROUNDS,
    CAPTION_TEMPLATES,
    COLOURS,
    DRAWING_TEMPLATES,
    SHAPES,
    SIZES,
    caption_text,
    caption_vocabulary,
    drawing_caption,
    drawings_table,
    shapes_arrays,
    shapes_table,
)
from nshot.errors import CheckpointError, ConfigError
from nshot.fileio import atomic_write
from nshot.hashing import sha256_file
from nshot.nn.clip import (
    CLIPConfig,
    TinyCLIP,
    ZeroShotClassifier,
    clip_contrastive_loss,
    load_clip,
    read_clip_meta,
    save_clip,
)
from nshot.train.trainer import Recipe, train

__all__ = [
    "DEFAULT_TEXT",
    "EXTRA_WORDS",
    "PRESETS",
    "ClipPreset",
    "PretrainResult",
    "clip_config",
    "ensure_clip",
    "pretrain",
    "pretrained_clip",
    "zero_shot_report",
]

VERSION = "5"

#: The class names of the digits preset (also words of the word tower's vocabulary).
DIGIT_NAMES: tuple[str, ...] = DIGIT_WORDS

#: The source of recipe 9: the captioned shapes, printed numerals
#: (:mod:`nshot.data.glyphs`) and line drawings of the shapes
#: (:func:`nshot.data.shapes.render_drawings`).
MIXED_SOURCE = "shapes-glyphs-drawings"

#: Words in the word tower's vocabulary that the shapes' captions never use (their embeddings
#: stay as initialised unless recipe 9's glyph and drawing captions use them): class names of later target domains (digits "zero" … "nine", the atha method's
#: class names unseen in pre-training) and common prompt words.
EXTRA_WORDS: tuple[str, ...] = (
    "this",
    "is",
    "the",
    "an",
    "and",
    "with",
    "picture",
    "image",
    "drawing",
    "sketch",
    "outline",
    "texture",
    "textured",
    "shape",
    "object",
    "digit",
    "number",
    "handwritten",
    *DIGIT_NAMES,
)

#: Held-out class names for the zero-shot measurement: plurals and synonyms of the shapes.
PLURAL_NAMES: tuple[str, ...] = tuple(f"{s}s" for s in SHAPES)
SYNONYM_NAMES: tuple[str, ...] = (
    "disc",
    "box",
    "pyramid",
    "pentagram",
    "plus sign",
    "donut",
    "rhombus",
    "pointer",
)


#: The digits preset's split of scikit-learn's 1,797 digits (the dirclip method's: 1,200 / 597).
DIGITS_TRAIN = 1200
#: Caption forms of the digits preset (a reconstruction; the dirclip method's template first).
DIGIT_TEMPLATES: tuple[str, ...] = (
    "this is a photo of a {}",
    "a photo of the digit {}",
    "the number {}",
    "a handwritten {}",
    "a photo of a {}",
)


#: How often each of :data:`nshot.data.shapes.CAPTION_TEMPLATES` is drawn: half the captions
#: name the shape only ("a photo of a star"), the rest share the other forms. With uniform
#: forms the ``small`` image tower learned colour, size and background and not shape in 600
#: steps (linear probe of shape 0.17, zero-shot 0.20): colour alone picks most captions of a
#: batch. (A reconstruction, in the spirit of CLIP's class-name captions, §3.1.4.)
SHAPE_TEMPLATE_WEIGHTS: tuple[float, ...] = tuple(
    0.5 if t == "a photo of a {shape}" else 0.5 / (len(CAPTION_TEMPLATES) - 1)
    for t in CAPTION_TEMPLATES
)


@dataclass(frozen=True)
class ClipPreset:
    images: int
    patch: int
    width: int
    depth: int
    heads: int
    embed_dim: int
    steps: int
    batch: int
    lr: float
    warmup: int
    side: int = 32
    in_chans: int = 3
    pool: str = "avg"
    stem: str = "patch"
    source: str = "shapes"
    context: int = 16
    weight_decay: float = 0.05
    test_images: int = 2000
    checkpoint_every: int = 100
    log_every: int = 25
    #: :attr:`nshot.nn.clip.CLIPConfig.minilm_scale` (the MiniLM tower's embedding scale)
    minilm_scale: float = 1.0
    #: printed numerals and line drawings beside the ``images`` shapes (``source`` =
    #: :data:`MIXED_SOURCE` only)
    glyphs: int = 0
    drawings: int = 0
    #: the recipe's version: part of the cache name, so a changed recipe trains anew
    version: str = VERSION


_SMALL = ClipPreset(
    images=20_000,
    patch=4,
    width=64,
    depth=4,
    heads=4,
    embed_dim=64,
    steps=1500,
    batch=128,
    lr=1.5e-3,
    warmup=40,
    stem="conv",
    version="6",
)

# Real CLIP's structure at the tiny scale: the class token pooled (CLIP's x[:, 0]) and a
# visual projection from the width 64 down to a narrower joint space of 48, as ViT-B/16's proj
# maps 768 down to 512 (the anchors of the atha method invert it).
_SMALL_CLS = replace(_SMALL, embed_dim=48, pool="token", version="7")

PRESETS: dict[str, ClipPreset] = {
    "smoke": ClipPreset(
        images=512,
        patch=8,
        width=32,
        depth=2,
        heads=2,
        embed_dim=32,
        steps=60,
        batch=64,
        lr=2e-3,
        warmup=6,
        test_images=400,
        checkpoint_every=20,
        log_every=20,
    ),
    "small": _SMALL,
    "small-cls": _SMALL_CLS,
    # ... and CLIP's text-feature scale: the MiniLM sentence embedding (unit length) enters the
    # projection with the norm of CLIP's ln_final output, sqrt(384), as CLIP's text head
    # projects a LayerNorm output. The zero-shot classifier and the training are the same as
    # recipe 7's (cosines do not see the scale); the atha method's anchors are not.
    "small-cls-ln": replace(_SMALL_CLS, minilm_scale=math.sqrt(384), version="8"),
    # ... and pairings the shapes never show (recipe 9): 10,000 printed numerals captioned
    # "a photo of the number seven" / "a photo of a seven" and 10,000 line drawings of the
    # eight shapes captioned "a drawing of a star", beside the same 20,000 shapes; the same
    # towers, steps (1,500 of 128: 4.8 epochs of the 40,000 images) and resolution
    "small-cls-ln-glyphs": replace(
        _SMALL_CLS,
        minilm_scale=math.sqrt(384),
        source=MIXED_SOURCE,
        glyphs=10_000,
        drawings=10_000,
        version="9",
    ),
    "digits": ClipPreset(
        images=DIGITS_TRAIN,
        side=8,
        in_chans=1,
        source="digits",
        pool="token",
        patch=2,
        width=64,
        depth=4,
        heads=4,
        embed_dim=64,
        steps=300,
        batch=128,
        lr=1e-3,
        warmup=20,
        checkpoint_every=100,
    ),
    "digits-smoke": ClipPreset(
        images=DIGITS_TRAIN,
        side=8,
        in_chans=1,
        source="digits",
        pool="token",
        patch=2,
        width=16,
        depth=1,
        heads=2,
        embed_dim=16,
        steps=250,
        batch=64,
        lr=2e-3,
        warmup=10,
        checkpoint_every=125,
        log_every=50,
    ),
}

#: The text tower of :func:`pretrained_clip` when none is named: the one that measured better
#: (module docstring). It needs ``nshot[tail-text]``; pass ``text="word"`` for
#: the tower without extra dependencies.
DEFAULT_TEXT = "minilm"


def clip_config(preset: str, text: str = DEFAULT_TEXT) -> CLIPConfig:
    """The :class:`~nshot.nn.clip.CLIPConfig` of a preset with text tower ``text``."""
    p = _preset(preset)
    return CLIPConfig(
        img_size=p.side,
        patch=p.patch,
        in_chans=p.in_chans,
        vision_width=p.width,
        vision_depth=p.depth,
        vision_heads=p.heads,
        pool=p.pool,
        stem=p.stem,
        text=text,
        vocab=tuple(caption_vocabulary()) + EXTRA_WORDS,
        context=p.context,
        text_width=p.width,
        text_depth=p.depth,
        text_heads=p.heads,
        embed_dim=p.embed_dim,
        minilm_scale=p.minilm_scale if text == "minilm" else 1.0,
    )


def _preset(name: str) -> ClipPreset:
    if name not in PRESETS:
        raise ConfigError(f"unknown tiny CLIP preset {name!r}; choose from {sorted(PRESETS)}")
    return PRESETS[name]


# --------------------------------------------------------------------------------------------
# data order and captions: functions of (seed, step) only, so resuming is exact


def _batch_rows(n: int, batch: int, step: int, seed: int) -> np.ndarray:
    """Rows of the global batch ``step``: consecutive slices of one permutation per epoch."""
    start = step * batch
    rows = []
    while len(rows) < batch:
        epoch, pos = divmod(start + len(rows), n)
        perm = np.random.default_rng([seed, 1, epoch]).permutation(n)
        rows.extend(perm[pos : pos + batch - len(rows)].tolist())
    return np.asarray(rows)


def _batch_captions(attrs: np.ndarray, step: int, seed: int, source: str = "shapes") -> list[str]:
    """One caption per row of ``attrs`` (shapes: ``[B, 4]`` shape, colour, size, background;
    digits: ``[B, 1]`` the digit; :data:`MIXED_SOURCE`: ``[B, 5]``, the shapes' columns (a
    numeral's digit in the first) and the kind, 0 a shape, 1 a numeral, 2 a drawing), its
    template drawn from the generator of (seed, step)."""
    rng = np.random.default_rng([seed, 2, step])
    if source == "digits":
        tpl = rng.integers(0, len(DIGIT_TEMPLATES), len(attrs))
    else:
        tpl = rng.choice(len(CAPTION_TEMPLATES), len(attrs), p=SHAPE_TEMPLATE_WEIGHTS)
    if source == "digits":
        return [
            DIGIT_TEMPLATES[t].format(DIGIT_NAMES[d])
            for d, t in zip(attrs[:, 0].tolist(), tpl, strict=True)
        ]
    if source == MIXED_SOURCE:  # the shapes' draw as above, then a numeral's form
        form = rng.integers(0, len(GLYPH_TEMPLATES), len(attrs))
        out = []
        for (s, c, z, b, kind), t, f in zip(attrs.tolist(), tpl, form, strict=True):
            if kind == 1:
                out.append(glyph_caption(s, int(f)))
            elif kind == 2:
                out.append(drawing_caption(shape=s))
            else:
                out.append(caption_text(shape=s, colour=c, size=z, background=b, template=int(t)))
        return out
    return [
        caption_text(shape=s, colour=c, size=z, background=b, template=int(t))
        for (s, c, z, b), t in zip(attrs.tolist(), tpl, strict=True)
    ]


def all_captions(source: str = "shapes") -> list[str]:
    """Every caption the pre-training can draw (for precomputing MiniLM embeddings)."""
    if source == "digits":
        return sorted({t.format(n) for t in DIGIT_TEMPLATES for n in DIGIT_NAMES})
    if source == MIXED_SOURCE:
        extra = [glyph_caption(d, t) for d in range(10) for t in range(len(GLYPH_TEMPLATES))]
        extra += [
            drawing_caption(shape=s, template=t)
            for s in range(len(SHAPES))
            for t in range(len(DRAWING_TEMPLATES))
        ]
        return sorted(set(all_captions("shapes") + extra))
    out = []
    for t in range(len(CAPTION_TEMPLATES)):
        for s in range(len(SHAPES)):
            for c in range(len(COLOURS)):
                for z in range(len(SIZES)):
                    for b in range(len(BACKGROUNDS)):
                        out.append(
                            caption_text(shape=s, colour=c, size=z, background=b, template=t)
                        )
    return sorted(set(out))


def _lr_at(p: ClipPreset, step: int, steps: int) -> float:
    """Linear warm-up over ``p.warmup`` steps, then cosine decay to 0 at ``steps``."""
    warmup = min(p.warmup, max(1, steps // 10))
    if step < warmup:
        return p.lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return p.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))


def _optimizer(model: TinyCLIP, p: ClipPreset) -> torch.optim.Optimizer:
    decay = [q for n, q in model.named_parameters() if q.dim() >= 2 and "embed" not in n]
    rest = [q for n, q in model.named_parameters() if not (q.dim() >= 2 and "embed" not in n)]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": p.weight_decay}, {"params": rest, "weight_decay": 0}],
        lr=p.lr,
        betas=(0.9, 0.98),
        eps=1e-6,
    )


# --------------------------------------------------------------------------------------------
# resume checkpoints (safetensors + JSON with sha256)

_CKPT_FORMAT = "nshot-tinyclip-train/1"
SHAPE_ATTRS = ("shape", "colour", "size", "background")


def _save_resume(folder: Path, model: TinyCLIP, opt: torch.optim.Optimizer, state: dict) -> None:
    from safetensors.torch import save_file

    from nshot.train.checkpoint import flatten_optimizer

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file(
        {k: v.detach().contiguous() for k, v in model.state_dict().items()},
        str(tmp / "model.safetensors"),
    )
    tensors, optim_meta = flatten_optimizer(opt.state_dict())
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    files = {f: sha256_file(tmp / f) for f in ("model.safetensors", "optimizer.safetensors")}
    record = {"format": _CKPT_FORMAT, **state, "optimizer": optim_meta, "sha256": files}
    (tmp / "state.json").write_text(json.dumps(record))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)


def _latest_resume(root: Path) -> Path | None:
    found = sorted(root.glob("step-*")) if root.is_dir() else []
    return found[-1] if found else None


def _resume_record(folder: Path) -> dict[str, Any]:
    """The ``state.json`` of the resume checkpoint ``folder``, its format and every file's
    sha256 checked."""
    try:
        record = json.loads((folder / "state.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{folder}/state.json: missing or unreadable ({e})") from None
    if record.get("format") != _CKPT_FORMAT:
        raise CheckpointError(f"{folder}: not a tiny CLIP training checkpoint")
    for name, digest in record["sha256"].items():
        if sha256_file(folder / name) != digest:
            raise CheckpointError(f"{folder / name}: sha256 differs from state.json")
    return record


def _load_resume(
    folder: Path, model: TinyCLIP, opt: torch.optim.Optimizer, record: dict[str, Any]
) -> None:
    """Load the weights and optimiser state of the checked checkpoint ``folder``."""
    from safetensors.torch import load_file

    from nshot.train.checkpoint import unflatten_optimizer

    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    tensors = load_file(str(folder / "optimizer.safetensors"))
    opt.load_state_dict(unflatten_optimizer(tensors, record["optimizer"]))


# --------------------------------------------------------------------------------------------
# sources


def digits_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's digits as images, split 1,200 / 597 by ``numpy.random.default_rng(seed)``
    (the dirclip method's split): ``(x_train, y_train, x_test, y_test)`` with ``x`` float32
    ``[n, 1, 8, 8]`` in [0, 1] (pixels / 16) and int64 labels."""
    from nshot.data.cache import table_to_numpy
    from nshot.data.sources import digits_table

    x, y = table_to_numpy(digits_table())
    x = (x / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    order = np.random.default_rng(seed).permutation(len(y))
    tr, te = order[:DIGITS_TRAIN], order[DIGITS_TRAIN:]
    return x[tr], y[tr], x[te], y[te]


def _source(p: ClipPreset, seed: int, split: str) -> tuple[np.ndarray, np.ndarray]:
    """``(images, attrs)`` of a preset's pre-training data: shapes as uint8 ``[n, 3, s, s]``
    with ``attrs`` ``[n, 4]``; digits as float32 ``[n, 1, 8, 8]`` with ``attrs`` ``[n, 1]``;
    :data:`MIXED_SOURCE`: the shapes, then the numerals, then the drawings, uint8, with
    ``attrs`` ``[n, 5]`` (:func:`_batch_captions`)."""
    if p.source == "digits":
        x_tr, y_tr, x_te, y_te = digits_split(seed)
        return (x_tr, y_tr[:, None]) if split == "train" else (x_te, y_te[:, None])
    table = shapes_table(p.images, seed=seed, side=p.side, split="train")
    attrs = np.stack([table.column(c).to_numpy().astype(np.int64) for c in SHAPE_ATTRS], axis=1)
    images = shapes_arrays(table, uint8=True)[0]
    if p.source != MIXED_SOURCE:
        return images, attrs
    glyphs = glyphs_table(p.glyphs, seed=seed, side=p.side)
    drawings = drawings_table(p.drawings, seed=seed, side=p.side, split="train")
    g_attrs = np.zeros((p.glyphs, 5), dtype=np.int64)
    g_attrs[:, 0] = glyphs.column("digit").to_numpy().astype(np.int64)
    g_attrs[:, 1] = glyphs.column("colour").to_numpy().astype(np.int64)
    g_attrs[:, 3] = glyphs.column("background").to_numpy().astype(np.int64)
    g_attrs[:, 4] = 1
    d_cols = [drawings.column(c).to_numpy().astype(np.int64) for c in SHAPE_ATTRS]
    d_attrs = np.stack([*d_cols, np.full(p.drawings, 2, dtype=np.int64)], axis=1)
    s_attrs = np.concatenate([attrs, np.zeros((len(attrs), 1), dtype=np.int64)], axis=1)
    images = np.concatenate(
        [images, shapes_arrays(glyphs, uint8=True)[0], shapes_arrays(drawings, uint8=True)[0]]
    )
    return images, np.concatenate([s_attrs, g_attrs, d_attrs])


# --------------------------------------------------------------------------------------------
# the training: one recipe of nshot's trainer for Ray Train workers and in-process runs


def _in_ray_train() -> bool:
    try:
        import ray.train

        ray.train.get_context().get_world_size()
        return True
    except Exception:
        return False


class _PretrainRecipe(Recipe):
    """The tiny CLIP's pre-training as :func:`nshot.train.trainer.train` runs it (outside a
    Ray run, ``session=False``): the resume checkpoints are this module's folders
    (``<out>/checkpoints/step-<n>``), read before the run and written from :meth:`on_report`.

    A step is the whole update (:meth:`step`): on a worker group each rank's loss is the global
    batch's (its image features all-gathered), so the gradients are averaged by hand (one flat
    all-reduce) rather than by DDP, then clipped to norm 1 before the AdamW step at the step's
    learning rate (:func:`_lr_at`)."""

    clip_grad_norm = 1.0

    def __init__(
        self,
        config: dict[str, Any],
        steps: int,
        stop_at: int,
        resume: tuple[Path, dict[str, Any]] | None,
    ) -> None:
        super().__init__(_preset(config["preset"]))
        self.config, self.steps, self.stop_at, self.resume = config, steps, stop_at, resume
        self.seed = int(config["seed"])
        self.out = Path(config["out"])
        self.losses: list[float] = []

    def schedule(self) -> tuple[int, int, int]:
        return self.stop_at, self.cfg.log_every, self.cfg.checkpoint_every

    def build(self) -> None:
        import torch.distributed as dist

        p, config = self.cfg, self.config
        self.in_ray = _in_ray_train()
        if dist.is_initialized():  # Ray Train's worker group (the trainer runs outside a session)
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        if p.batch % self.world_size:
            raise ConfigError(f"batch {p.batch} is not divisible by {self.world_size} workers")
        self.per = p.batch // self.world_size
        self.images, self.attrs = _source(p, self.seed, "train")
        torch.manual_seed(self.seed)
        model = TinyCLIP(clip_config(config["preset"], config["text"]))
        if config["text"] == "minilm":
            _seed_minilm(model, config)
        self.model = model.to(self.device)
        self.optimizer = _optimizer(self.model, p)
        if self.resume is not None:
            folder, record = self.resume
            _load_resume(folder, self.model, self.optimizer, record)
            self.losses = list(record["losses"])
            if self.rank == 0:
                print(f"[nshot tinyclip] resuming at step {record['step']} from {folder}",
                      file=sys.stderr)  # fmt: skip
        self.params = [q for q in self.model.parameters() if q.requires_grad]
        self.t0 = time.time()

    def step(self, step: int) -> dict[str, float]:
        p, s, model, opt = self.cfg, step - 1, self.model, self.optimizer
        rows = _batch_rows(len(self.images), p.batch, s, self.seed)
        captions = _batch_captions(self.attrs[rows], s, self.seed, p.source)
        mine = rows[self.rank * self.per : (self.rank + 1) * self.per]
        x = torch.from_numpy(self.images[mine]).float()
        if self.images.dtype == np.uint8:
            x = x / 255.0
        texts = sorted(set(captions))
        col = {t: i for i, t in enumerate(texts)}
        text_of_image = torch.tensor([col[c] for c in captions], device=self.device)
        img = model.encode_image(x.to(self.device))
        if self.world_size > 1:
            import warnings

            from torch.distributed.nn.functional import all_gather

            with warnings.catch_warnings():  # torch 2.13 marks it deprecated; it still works
                warnings.simplefilter("ignore", FutureWarning)
                img = torch.cat(all_gather(img))  # differentiable: the global batch's features
        loss = clip_contrastive_loss(model.logits(img, model.encode_text(texts)), text_of_image)
        for group in opt.param_groups:
            group["lr"] = _lr_at(p, s, self.steps)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        if self.world_size > 1:  # each rank's loss is the global one: average the gradients
            import torch.distributed as dist

            flat = torch.cat([q.grad.reshape(-1) for q in self.params])
            dist.all_reduce(flat)
            flat /= self.world_size
            offset = 0
            for q in self.params:
                q.grad.copy_(flat[offset : offset + q.numel()].view_as(q))
                offset += q.numel()
        torch.nn.utils.clip_grad_norm_(self.params, self.clip_grad_norm)
        opt.step()
        self.losses.append(float(loss.detach()))
        return {"loss": self.losses[-1]}

    def on_report(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """Every ``log_every`` steps and at the last: ``ray.train.report`` inside Ray Train and
        the progress line (the mean loss of the last ``log_every`` steps); every
        ``checkpoint_every`` steps and at the last: rank 0's resume checkpoint (the two newest
        kept)."""
        p, last = self.cfg, self.stop_at
        if step % p.log_every == 0 or step == last:
            if self.in_ray:
                import ray.train

                ray.train.report({"loss": self.losses[-1], "step": step})
            if self.rank == 0:
                print(
                    f"[nshot tinyclip-{self.config['preset']}/{self.config['text']}] step "
                    f"{step}/{self.steps} loss {np.mean(self.losses[-p.log_every :]):.4f} "
                    f"({time.time() - self.t0:.0f}s)",
                    file=sys.stderr,
                    flush=True,
                )
        if self.rank == 0 and (step % p.checkpoint_every == 0 or step == last):
            preset = self.config["preset"]
            _save_resume(
                self.out / "checkpoints" / f"step-{step:06d}",
                self.model,
                self.optimizer,
                {"step": step, "losses": self.losses, "preset": preset, "seed": self.seed},
            )
            for old in sorted((self.out / "checkpoints").glob("step-*"))[:-2]:
                shutil.rmtree(old, ignore_errors=True)
        if self.world_size > 1 and step % p.checkpoint_every == 0:
            import torch.distributed as dist

            dist.barrier()
        return metrics


def _train(config: dict[str, Any]) -> None:
    torch.set_num_threads(int(config["threads"]))
    if config.get("cache"):
        os.environ["NSHOT_CACHE"] = config["cache"]
    p = _preset(config["preset"])
    steps = p.steps if config.get("steps") is None else int(config["steps"])
    stop_at = min(steps, int(config.get("stop_at") or steps))
    out = Path(config["out"])
    latest = _latest_resume(out / "checkpoints")
    resume = (latest, _resume_record(latest)) if latest is not None else None
    start = int(resume[1]["step"]) if resume is not None else 0
    recipe = _PretrainRecipe(config, steps, stop_at, resume)
    train(recipe, session=False, start=start)
    if recipe.rank == 0 and stop_at == steps:
        save_clip(
            recipe.model.eval(),
            out,
            preset=config["preset"],
            seed=recipe.seed,
            steps=steps,
            world_size=recipe.world_size,
            losses=recipe.losses,
            version=p.version,
        )


def _seed_minilm(model: TinyCLIP, config: dict[str, Any]) -> None:
    """Give the MiniLM tower every caption's embedding at once (one batched encoding)."""
    texts = all_captions(_preset(config["preset"]).source)
    emb_path = config.get("minilm_embeddings")
    if emb_path and Path(emb_path).is_file():
        from safetensors.torch import load_file

        emb = load_file(emb_path)["embeddings"]
    else:
        from nshot.data.sources import embed_texts

        emb = torch.from_numpy(embed_texts(texts))
    model.text.remember(texts, emb)  # type: ignore[union-attr]


@dataclass
class PretrainResult:
    path: Path
    losses: list[float]
    wall_s: float
    finished: bool


def pretrain(
    preset: str = "smoke",
    *,
    out: str | os.PathLike[str],
    text: str = DEFAULT_TEXT,
    workers: int = 0,
    seed: int = 0,
    steps: int | None = None,
    stop_at: int | None = None,
    threads: int | None = None,
    max_failures: int = 0,
) -> PretrainResult:
    """Pre-train a tiny CLIP into the folder ``out`` (resuming from ``out/checkpoints``).

    ``workers=0`` trains in this process; ``workers >= 1`` runs the same loop on that many Ray
    Train workers (the embedded local Ray, or the cluster at ``RAY_ADDRESS``). Each process
    uses ``threads`` torch threads (default 1: these models are too small to gain from more,
    and on a shared machine extra threads only wait for each other). Ray Train restarts the
    workers up to ``max_failures`` times; each restart resumes from the newest checkpoint.
    ``steps`` overrides the preset's; ``stop_at`` stops early (a checkpoint is written; call
    again to continue). ``finished`` says whether the model (``model.safetensors`` +
    ``clip.json``) was written.
    """
    _preset(preset)
    if text not in ("word", "minilm"):
        raise ConfigError(f"text: {text!r} is not 'word' or 'minilm'")
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "preset": preset,
        "text": text,
        "out": str(out),
        "seed": seed,
        "steps": steps,
        "stop_at": stop_at,
        "cache": str(cache_dir()),
        "threads": threads or 1,
    }
    t0 = time.time()
    if workers == 0:
        _train(config)
    else:
        import ray.train
        from ray.train.torch import TorchTrainer

        from nshot.train.runner import ensure_ray, fit_trainer

        if text == "minilm":  # encode the captions once here, not once per worker
            from safetensors.torch import save_file

            from nshot.data.sources import embed_texts

            emb_path = out / "minilm-captions.safetensors"
            emb = torch.from_numpy(embed_texts(all_captions(PRESETS[preset].source)))
            save_file({"embeddings": emb}, emb_path)
            config["minilm_embeddings"] = str(emb_path)
        ensure_ray()
        storage = out.parent / f".{out.name}-ray"
        trainer = TorchTrainer(
            _train,
            train_loop_config=config,
            scaling_config=ray.train.ScalingConfig(
                num_workers=workers, resources_per_worker={"CPU": 1}
            ),
            run_config=ray.train.RunConfig(
                name=f"tinyclip-{preset}",
                storage_path=str(storage),
                failure_config=ray.train.FailureConfig(max_failures=max_failures),
            ),
        )
        fit_trainer(trainer)
        shutil.rmtree(storage, ignore_errors=True)
    finished = (out / "clip.json").is_file()
    if finished:
        losses = list(read_clip_meta(out)["losses"])
    else:
        latest = _latest_resume(out / "checkpoints")
        losses = json.loads((latest / "state.json").read_text())["losses"] if latest else []
    return PretrainResult(out, losses, time.time() - t0, finished)


# --------------------------------------------------------------------------------------------
# zero-shot measurement


#: Fresh numerals and drawings of :func:`zero_shot_report` (recipe 9).
GLYPH_TEST_IMAGES = 1000


def _accuracy(model: TinyCLIP, images: torch.Tensor, labels: np.ndarray, names, tpl) -> float:
    if len(labels) == 0:
        return float("nan")
    pred = ZeroShotClassifier(model, names, tpl).predict(images).numpy()
    return float((pred == labels).mean())


@torch.no_grad()
def zero_shot_report(model: TinyCLIP, preset: str = "small", seed: int = 0) -> dict[str, Any]:
    """Zero-shot accuracies of ``model`` on fresh source-style images (the ``test`` split,
    rendered with another seed than pre-training): prompts ``"a photo of a {name}"``. (For the
    ``digits`` preset: ``acc_digits_10way`` and ``acc_digits_rolled_10way`` on the 597 test
    digits, prompt "this is a photo of a {name}".)

    * ``acc_src_8way``: the 8 shapes, on images of the (shape, colour) pairs seen in training
      (the atha method's precondition, ≥ 0.80);
    * ``acc_heldout_combo_8way``: the 8 shapes, on the held-out pairs only;
    * ``acc_colour_8way``: the 8 colour names, all images;
    * ``acc_plural_names_8way`` / ``acc_synonym_names_8way``: the shapes under class names never
      used in pre-training ("circles"…; "disc", "box", …);
    * ``unknown_words``: how many words of those held-out names the tokenizer did not know;
    * recipe 9 (:data:`MIXED_SOURCE`) only: ``acc_glyphs_10way``, the ten digit words on 1,000
      fresh printed numerals, and ``acc_drawings_8way``, the 8 shapes on 1,000 fresh line
      drawings (every (shape, colour) pair), both with the same prompt.
    """
    p = _preset(preset)
    if p.source == "digits":
        return _digits_report(model, seed)
    table = shapes_table(p.test_images, seed=10_000 + seed, side=p.side, split="test")
    x, y = shapes_arrays(table)
    images = torch.from_numpy(x)
    held = table.column("heldout").to_numpy(zero_copy_only=False).astype(bool)
    colour = table.column("colour").to_numpy().astype(np.int64)
    tpl = ("a photo of a {}",)
    model = model.eval()
    seen = ~held
    report: dict[str, Any] = {
        "acc_src_8way": _accuracy(model, images[seen], y[seen], SHAPES, tpl),
        "acc_heldout_combo_8way": _accuracy(model, images[held], y[held], SHAPES, tpl),
        "acc_colour_8way": _accuracy(model, images, colour, list(COLOURS), tpl),
        "acc_plural_names_8way": _accuracy(model, images[seen], y[seen], PLURAL_NAMES, tpl),
        "acc_synonym_names_8way": _accuracy(model, images[seen], y[seen], SYNONYM_NAMES, tpl),
        "test_images": int(len(y)),
        "heldout_images": int(held.sum()),
    }
    tok = model.tokenizer
    report["unknown_words"] = (
        0 if tok is None else tok.unknown_words(list(PLURAL_NAMES) + list(SYNONYM_NAMES))
    )
    if p.source == MIXED_SOURCE:  # the added pairings, on fresh renders of their own
        gx, gy = shapes_arrays(glyphs_table(GLYPH_TEST_IMAGES, seed=10_000 + seed, side=p.side))
        report["acc_glyphs_10way"] = _accuracy(model, torch.from_numpy(gx), gy, DIGIT_NAMES, tpl)
        drawings = drawings_table(GLYPH_TEST_IMAGES, seed=10_000 + seed, side=p.side, split="test")
        dx, dy = shapes_arrays(drawings)
        report["acc_drawings_8way"] = _accuracy(model, torch.from_numpy(dx), dy, SHAPES, tpl)
    return report


@torch.no_grad()
def _digits_report(model: TinyCLIP, seed: int) -> dict[str, Any]:
    _, _, x_te, y_te = digits_split(seed)
    images = torch.from_numpy(x_te)
    tpl = (DIGIT_TEMPLATES[0],)
    model = model.eval()
    return {
        "acc_digits_10way": _accuracy(model, images, y_te, DIGIT_NAMES, tpl),
        "acc_digits_rolled_10way": _accuracy(
            model, torch.roll(images, 1, dims=-1), y_te, DIGIT_NAMES, tpl
        ),
        "test_images": int(len(y_te)),
    }


# --------------------------------------------------------------------------------------------
# the cache


def ensure_clip(
    preset: str = "small", *, text: str | None = None, seed: int = 0, workers: int = 0
) -> Path:
    """The cached folder of the pre-trained tiny CLIP (``$NSHOT_CACHE/models/``), trained on
    first use (``smoke``: seconds; ``small``: minutes, with progress lines); its ``clip.json``
    records the losses and :func:`zero_shot_report`.

    ``workers=0`` trains in this process; ``workers >= 1`` on that many Ray Train workers
    (:func:`pretrain`: the loss is the global batch's, but the gradients are summed in another
    order, so the weights are not bit-identical to one process's). The two are cached apart:
    ``tinyclip-<preset>-<text>-s<seed>-v<version>`` and the same with ``-w<workers>``."""
    text = text or DEFAULT_TEXT
    if workers < 0:
        raise ConfigError(f"workers: {workers} is negative")
    root = cache_dir() / "models"
    version = _preset(preset).version
    name = f"tinyclip-{preset}-{text}-s{seed}-v{version}" + (f"-w{workers}" if workers else "")
    target = root / name
    if _intact(target):
        return target
    with file_lock(root / f".{name}.lock"):
        if _intact(target):
            return target
        work = root / f".work-{name}"
        how = f"on {workers} Ray Train workers" if workers else "in this process"
        print(
            f"[nshot] training the tiny CLIP {preset}/{text} {how} (cached in {target})",
            file=sys.stderr,
        )
        result = pretrain(preset, out=work, text=text, seed=seed, workers=workers)
        model = load_clip(work)
        report = zero_shot_report(model, preset, seed)
        print(f"[nshot] tiny CLIP zero-shot: {report}", file=sys.stderr)
        meta = read_clip_meta(work)
        for key in ("format", "config", "sha256"):
            meta.pop(key)
        tmp = root / f".tmp-tinyclip-{preset}-{text}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        save_clip(model, tmp, **meta, wall_s=round(result.wall_s, 1), zero_shot=report)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
        shutil.rmtree(work, ignore_errors=True)
    return target


def _intact(folder: Path) -> bool:
    if not folder.is_dir():
        return False
    try:
        read_clip_meta(folder)
    except CheckpointError:
        return False
    return True


def pretrained_clip(preset: str = "small", *, text: str | None = None, seed: int = 0) -> TinyCLIP:
    """The pre-trained tiny CLIP of ``preset`` (see :func:`ensure_clip`), verified and loaded,
    in eval mode."""
    return load_clip(ensure_clip(preset, text=text, seed=seed))


def write_report(path: str | os.PathLike[str], report: dict[str, Any]) -> Path:
    """Write a JSON report atomically."""
    return atomic_write(path, json.dumps(report, indent=1) + "\n")
