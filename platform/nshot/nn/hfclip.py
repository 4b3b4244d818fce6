"""Real CLIP checkpoints read by path into ``transformers.CLIPModel`` (Radford et al. 2021), with
neither open_clip nor torchvision.

Two formats, both safetensors (a pickle — ``.bin``, ``.pt``, ``.pth``, ``.ckpt`` — is refused,
never unpickled: convert it to safetensors first):

* a **Hugging Face CLIP folder**: ``config.json`` (``model_type`` "clip") + ``model.safetensors``
  (or a sharded index) + the tokenizer files (``tokenizer.json``, or ``vocab.json`` +
  ``merges.txt``), e.g. ``hf download openai/clip-vit-base-patch16 --local-dir D``;
* an **open_clip / OpenAI state dict** in one safetensors file (``open_clip_model.safetensors``:
  ``visual.conv1.weight``, ``visual.transformer.resblocks.0.attn.in_proj_weight``,
  ``token_embedding.weight``, ``text_projection``, ``logit_scale``, ...). The architecture is
  inferred from the tensor shapes as OpenAI's ``build_model`` does (widths, depths, patch,
  resolution, context, vocabulary; 64-wide heads) and the weights are mapped onto
  ``CLIPModel``: ``attn.in_proj_*`` split into ``q/k/v_proj``, ``mlp.c_fc`` / ``mlp.c_proj`` →
  ``mlp.fc1`` / ``mlp.fc2``, ``ln_1`` / ``ln_2`` → ``layer_norm1`` / ``layer_norm2``,
  ``ln_pre`` → ``pre_layrnorm``, ``ln_post`` → ``post_layernorm``, ``ln_final`` →
  ``final_layer_norm``, ``proj`` / ``text_projection`` transposed into the projection layers.
  The activation is QuickGELU (OpenAI's weights) unless an ``open_clip_config.json`` beside the
  file says ``"quick_gelu": false`` (LAION's weights use GELU) or the caller says otherwise.
  Its tokenizer is never downloaded: CLIP's BPE vocabulary is the same for every OpenAI /
  open_clip ViT, and the caller points at it (a folder with ``tokenizer.json`` or ``vocab.json``
  + ``merges.txt``, or open_clip's ``bpe_simple_vocab_16e6.txt.gz``); a ``tokenizer.json`` /
  ``vocab.json`` beside the weights file is used when no tokenizer is given.

Text pooling is OpenAI's: the features at the end-of-text token, the highest id of the
vocabulary (``eos_token_id = 2`` in the converted config selects transformers' argmax pooling).
Images are pixels in [0, 1]; :meth:`PretrainedCLIP.encode_image` normalises them with the
checkpoint's mean and std itself, so attacks and augmentations work in pixel space.
:func:`load_image` is CLIP's preprocessing (bicubic resize of the shorter side, centre crop)
written with PIL and numpy; :func:`image_folder` reads class folders of PNG / JPEG files, and
:class:`FolderImages` reads their images on demand.

Checked (``tests/test_hfclip.py``): a random ``transformers.CLIPConfig`` model saved both as a
Hugging Face folder and, through :func:`hf_to_openai`, as an OpenAI-format file loads through
both routes with image and text features and logits equal to 1e-5. Measured once against
open_clip 3.3.0 itself (a throwaway environment with torchvision; random ``ViT-B-32`` and
``ViT-B-16`` with every parameter perturbed by 0.02 · N(0, 1), features of magnitude about 4):
the largest absolute difference was 4.3e-6 on image features, 4.5e-6 on text features and
1.7e-6 on logits (QuickGELU and GELU), the inverse mapping returned every tensor bit for bit,
and :func:`bpe_tokenizer` on open_clip's ``bpe_simple_vocab_16e6.txt.gz`` gave open_clip's
token ids on five texts; ``tests/test_hfclip.py`` repeats this where open_clip is importable.

::

    clip = load_pretrained_clip("/models/clip-vit-base-patch32")      # HF folder
    clip = load_pretrained_clip("/models/open_clip_model.safetensors",
                                tokenizer="/models/clip-vit-base-patch32")
    img = torch.from_numpy(load_image("cat.jpg", clip.image_size))[None]   # [1, 3, 224, 224]
    logits = clip.logits(img, ["a photo of a cat", "a photo of a dog"])
"""

from __future__ import annotations

import functools
import gzip
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from nshot.errors import CheckpointError

__all__ = [
    "ARCHS",
    "CLIP_MEAN",
    "CLIP_STD",
    "FolderImages",
    "ImageFolder",
    "PretrainedCLIP",
    "bpe_tokenizer",
    "clip_field_problems",
    "load_clip_fields",
    "clip_problems",
    "hf_to_openai",
    "image_folder",
    "load_image",
    "load_pretrained_clip",
    "openai_to_hf",
    "write_tiny_clip",
]

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
#: (patch, image-tower width, image-tower blocks) of OpenAI's ViT CLIPs
ARCHS: dict[str, tuple[int, int, int]] = {
    "ViT-B-32": (32, 768, 12),
    "ViT-B-16": (16, 768, 12),
    "ViT-L-14": (14, 1024, 24),
}
HEAD_WIDTH = 64  # OpenAI's and open_clip's attention head width
# keys OpenAI's JIT archives carry beside the weights (ints, not tensors of the model)
_OPENAI_EXTRA = ("input_resolution", "context_length", "vocab_size")


def pickle_error(path: Path, target: str = "open_clip_model.safetensors") -> CheckpointError:
    """The refusal of a pickled weight file, with the conversion the user runs themselves."""
    return CheckpointError(
        f"{path}: a pickle file ({path.suffix}) is never unpickled here; convert it to "
        "safetensors first (e.g. load it in a trusted environment and call "
        f"safetensors.torch.save_file(state_dict, '{target}'))"
    )


# --------------------------------------------------------------------------------------------
# the OpenAI / open_clip state dict <-> transformers' CLIPModel


def _layer_count(state: dict[str, torch.Tensor], prefix: str) -> int:
    pat = re.compile(re.escape(prefix) + r"(\d+)\.")
    found = {int(m.group(1)) for k in state if (m := pat.match(k))}
    if found != set(range(len(found))):
        raise CheckpointError(f"{prefix}N: the blocks are not numbered 0..{len(found) - 1}")
    return len(found)


def _need(state: dict[str, torch.Tensor], key: str, ndim: int, where: str) -> torch.Tensor:
    if key not in state:
        raise CheckpointError(f"{where}: key {key!r} is missing (not an OpenAI-format CLIP)")
    t = state[key]
    if t.dim() != ndim:
        raise CheckpointError(f"{where}: key {key!r} has shape {tuple(t.shape)}; expected {ndim}-D")
    return t


def openai_to_hf(
    state: dict[str, torch.Tensor],
    *,
    quick_gelu: bool = True,
    where: str = "state dict",
) -> tuple[Any, dict[str, torch.Tensor]]:
    """``(transformers.CLIPConfig, CLIPModel state dict)`` of an OpenAI / open_clip ViT CLIP
    state dict; the architecture comes from the tensor shapes. ``CheckpointError`` naming the
    key for a missing, extra or misshapen tensor."""
    from transformers import CLIPConfig

    state = {k: v for k, v in state.items() if k not in _OPENAI_EXTRA}
    conv = _need(state, "visual.conv1.weight", 4, where)
    v_width, _, patch, _ = conv.shape
    v_pos = _need(state, "visual.positional_embedding", 2, where)
    grid = round((v_pos.shape[0] - 1) ** 0.5)
    if grid * grid + 1 != v_pos.shape[0]:
        raise CheckpointError(
            f"{where}: key 'visual.positional_embedding' has {v_pos.shape[0]} rows, not 1 + a square"
        )
    v_layers = _layer_count(state, "visual.transformer.resblocks.")
    tok = _need(state, "token_embedding.weight", 2, where)
    vocab, t_width = tok.shape
    t_pos = _need(state, "positional_embedding", 2, where)
    t_layers = _layer_count(state, "transformer.resblocks.")
    t_proj = _need(state, "text_projection", 2, where)
    _need(state, "visual.proj", 2, where)
    embed = t_proj.shape[1]
    if v_layers == 0 or t_layers == 0:
        raise CheckpointError(f"{where}: no transformer blocks found (not an OpenAI-format CLIP)")
    v_mlp = _need(state, "visual.transformer.resblocks.0.mlp.c_fc.weight", 2, where).shape[0]
    t_mlp = _need(state, "transformer.resblocks.0.mlp.c_fc.weight", 2, where).shape[0]
    act = "quick_gelu" if quick_gelu else "gelu"
    config = CLIPConfig(
        text_config={
            "vocab_size": int(vocab), "hidden_size": int(t_width), "intermediate_size": int(t_mlp),
            "num_hidden_layers": t_layers, "num_attention_heads": max(1, t_width // HEAD_WIDTH),
            "max_position_embeddings": int(t_pos.shape[0]), "hidden_act": act,
            "layer_norm_eps": 1e-5, "bos_token_id": int(vocab) - 2, "eos_token_id": 2,
            "pad_token_id": 0, "projection_dim": int(embed),
        },
        vision_config={
            "hidden_size": int(v_width), "intermediate_size": int(v_mlp),
            "num_hidden_layers": v_layers, "num_attention_heads": max(1, v_width // HEAD_WIDTH),
            "image_size": int(patch * grid), "patch_size": int(patch), "num_channels": 3,
            "hidden_act": act, "layer_norm_eps": 1e-5, "projection_dim": int(embed),
        },
        projection_dim=int(embed),
    )  # fmt: skip
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()

    def take(src: str, dst: str, transpose: bool = False) -> None:
        if src not in state:
            raise CheckpointError(f"{where}: key {src!r} is missing")
        t = state[src]
        out[dst] = t.T.contiguous() if transpose else t
        used.add(src)

    def blocks(src: str, dst: str, n: int, width: int) -> None:
        for i in range(n):
            s, d = f"{src}{i}.", f"{dst}{i}."
            for ab in ("weight", "bias"):
                key = f"{s}attn.in_proj_{ab}"
                if key not in state:
                    raise CheckpointError(f"{where}: key {key!r} is missing")
                w = state[key]
                if w.shape[0] != 3 * width:
                    raise CheckpointError(
                        f"{where}: key {key!r} has shape {tuple(w.shape)}; expected first "
                        f"dimension {3 * width}"
                    )
                q, k, v = w.chunk(3, dim=0)
                out[f"{d}self_attn.q_proj.{ab}"] = q.contiguous()
                out[f"{d}self_attn.k_proj.{ab}"] = k.contiguous()
                out[f"{d}self_attn.v_proj.{ab}"] = v.contiguous()
                used.add(key)
                take(f"{s}attn.out_proj.{ab}", f"{d}self_attn.out_proj.{ab}")
                take(f"{s}ln_1.{ab}", f"{d}layer_norm1.{ab}")
                take(f"{s}ln_2.{ab}", f"{d}layer_norm2.{ab}")
                take(f"{s}mlp.c_fc.{ab}", f"{d}mlp.fc1.{ab}")
                take(f"{s}mlp.c_proj.{ab}", f"{d}mlp.fc2.{ab}")

    take("token_embedding.weight", "text_model.embeddings.token_embedding.weight")
    take("positional_embedding", "text_model.embeddings.position_embedding.weight")
    blocks("transformer.resblocks.", "text_model.encoder.layers.", t_layers, t_width)
    for ab in ("weight", "bias"):
        take(f"ln_final.{ab}", f"text_model.final_layer_norm.{ab}")
        take(f"visual.ln_pre.{ab}", f"vision_model.pre_layrnorm.{ab}")
        take(f"visual.ln_post.{ab}", f"vision_model.post_layernorm.{ab}")
    take("text_projection", "text_projection.weight", transpose=True)
    take("visual.class_embedding", "vision_model.embeddings.class_embedding")
    take("visual.positional_embedding", "vision_model.embeddings.position_embedding.weight")
    take("visual.conv1.weight", "vision_model.embeddings.patch_embedding.weight")
    blocks("visual.transformer.resblocks.", "vision_model.encoder.layers.", v_layers, v_width)
    take("visual.proj", "visual_projection.weight", transpose=True)
    if "logit_scale" not in state:
        raise CheckpointError(f"{where}: key 'logit_scale' is missing")
    out["logit_scale"] = state["logit_scale"].reshape(())
    used.add("logit_scale")
    extra = sorted(set(state) - used)
    if extra:
        raise CheckpointError(
            f"{where}: key {extra[0]!r} (and {len(extra) - 1} more) has no place in a ViT CLIP "
            "(an architecture this loader does not map)"
            if len(extra) > 1
            else f"{where}: key {extra[0]!r} has no place in a ViT CLIP"
        )
    return config, out


def hf_to_openai(model: Any) -> dict[str, torch.Tensor]:
    """The OpenAI-format state dict of a ``transformers.CLIPModel`` (the inverse of
    :func:`openai_to_hf`; q/k/v fused into ``in_proj``)."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out: dict[str, torch.Tensor] = {}

    def blocks(src: str, dst: str, n: int) -> None:
        for i in range(n):
            s, d = f"{src}{i}.", f"{dst}{i}."
            for ab in ("weight", "bias"):
                out[f"{d}attn.in_proj_{ab}"] = torch.cat(
                    [sd[f"{s}self_attn.{p}_proj.{ab}"] for p in ("q", "k", "v")], dim=0
                )
                out[f"{d}attn.out_proj.{ab}"] = sd[f"{s}self_attn.out_proj.{ab}"]
                out[f"{d}ln_1.{ab}"] = sd[f"{s}layer_norm1.{ab}"]
                out[f"{d}ln_2.{ab}"] = sd[f"{s}layer_norm2.{ab}"]
                out[f"{d}mlp.c_fc.{ab}"] = sd[f"{s}mlp.fc1.{ab}"]
                out[f"{d}mlp.c_proj.{ab}"] = sd[f"{s}mlp.fc2.{ab}"]

    cfg = model.config
    out["token_embedding.weight"] = sd["text_model.embeddings.token_embedding.weight"]
    out["positional_embedding"] = sd["text_model.embeddings.position_embedding.weight"]
    blocks("text_model.encoder.layers.", "transformer.resblocks.",
           cfg.text_config.num_hidden_layers)  # fmt: skip
    for ab in ("weight", "bias"):
        out[f"ln_final.{ab}"] = sd[f"text_model.final_layer_norm.{ab}"]
        out[f"visual.ln_pre.{ab}"] = sd[f"vision_model.pre_layrnorm.{ab}"]
        out[f"visual.ln_post.{ab}"] = sd[f"vision_model.post_layernorm.{ab}"]
    out["text_projection"] = sd["text_projection.weight"].T.contiguous()
    out["visual.class_embedding"] = sd["vision_model.embeddings.class_embedding"]
    out["visual.positional_embedding"] = sd["vision_model.embeddings.position_embedding.weight"]
    out["visual.conv1.weight"] = sd["vision_model.embeddings.patch_embedding.weight"]
    blocks("vision_model.encoder.layers.", "visual.transformer.resblocks.",
           cfg.vision_config.num_hidden_layers)  # fmt: skip
    out["visual.proj"] = sd["visual_projection.weight"].T.contiguous()
    out["logit_scale"] = sd["logit_scale"].reshape(())
    return {k: v.contiguous() for k, v in out.items()}


# --------------------------------------------------------------------------------------------
# the tokenizer


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's / CLIP's reversible map of the 256 bytes onto printable characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs], strict=True))


def _vocab_from_merges(merges: list[tuple[str, str]]) -> dict[str, int]:
    """open_clip's SimpleTokenizer vocabulary: the byte characters, the same with ``</w>``,
    one token per merge, then ``<|startoftext|>`` and ``<|endoftext|>`` (the highest ids)."""
    chars = list(_bytes_to_unicode().values())
    tokens = chars + [c + "</w>" for c in chars] + ["".join(m) for m in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    return {t: i for i, t in enumerate(tokens)}


def bpe_tokenizer(path: str | Path) -> Any:
    """CLIP's BPE tokenizer (``transformers.CLIPTokenizer``) from local files only: a folder
    with ``tokenizer.json`` or ``vocab.json`` + ``merges.txt``, or open_clip's
    ``bpe_simple_vocab_16e6.txt.gz`` (its merges; the vocabulary is rebuilt as open_clip
    does)."""
    from transformers import CLIPTokenizer

    p = Path(path)
    if p.is_file() and p.name.endswith(".txt.gz"):
        try:
            lines = gzip.open(p, "rt", encoding="utf-8").read().split("\n")
        except (OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{p}: not a gzip BPE merges file ({e})") from None
        # open_clip: the first line is a header; 48,894 merges (49,152 - 256 - 2)
        merges = [tuple(m.split()) for m in lines[1 : 49152 - 256 - 2 + 1] if m.strip()]
        if not merges or any(len(m) != 2 for m in merges):
            raise CheckpointError(f"{p}: not a BPE merges file (lines of two symbols)")
        vocab = _vocab_from_merges(merges)  # type: ignore[arg-type]
        return CLIPTokenizer(vocab=vocab, merges=merges)
    if p.is_dir():
        if (p / "tokenizer.json").is_file() or (
            (p / "vocab.json").is_file() and (p / "merges.txt").is_file()
        ):
            return CLIPTokenizer.from_pretrained(str(p), local_files_only=True)
        raise CheckpointError(
            f"{p}: no CLIP tokenizer files (tokenizer.json, or vocab.json + merges.txt)"
        )
    if not p.exists():
        raise CheckpointError(f"{p}: the tokenizer path does not exist")
    raise CheckpointError(
        f"{p}: not a tokenizer (a folder with tokenizer.json or vocab.json + merges.txt, or "
        "open_clip's bpe_simple_vocab_16e6.txt.gz)"
    )


# --------------------------------------------------------------------------------------------
# checks and loading


def _format_of(p: Path) -> str:
    """``"hf"`` (a folder), ``"openai"`` (a safetensors file); ``CheckpointError`` otherwise."""
    if not p.exists():
        raise CheckpointError(f"{p}: does not exist")
    if p.is_dir():
        cfg = p / "config.json"
        if not cfg.is_file():
            pickles = [f.name for f in p.iterdir() if f.suffix in PICKLE_SUFFIXES]
            hint = f" (it holds {pickles[0]}, a pickle: convert to safetensors)" if pickles else ""
            raise CheckpointError(f"{p}: no config.json, not a Hugging Face CLIP folder{hint}")
        try:
            meta = json.loads(cfg.read_text())
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{cfg}: unreadable JSON ({e})") from None
        if not isinstance(meta, dict) or meta.get("model_type") != "clip":
            kind = meta.get("model_type") if isinstance(meta, dict) else None
            raise CheckpointError(
                f"{cfg}: model_type is {kind!r}, not 'clip': not a CLIP checkpoint"
            )
        if (
            not (p / "model.safetensors").is_file()
            and not (p / "model.safetensors.index.json").is_file()
        ):
            if any((p / n).is_file() for n in ("pytorch_model.bin", "model.pt")):
                raise pickle_error(p / "pytorch_model.bin")
            raise CheckpointError(f"{p}: model.safetensors is missing")
        return "hf"
    if p.suffix in PICKLE_SUFFIXES:
        raise pickle_error(p)
    if p.suffix != ".safetensors":
        raise CheckpointError(f"{p}: not a .safetensors file or a Hugging Face CLIP folder")
    return "openai"


def _tokenizer_beside(p: Path) -> Path | None:
    for folder in (p.parent,):
        if (folder / "tokenizer.json").is_file() or (folder / "vocab.json").is_file():
            return folder
    return None


def clip_field_problems(
    clip_path: str | Path | None, clip_tokenizer: str | Path | None, example: str
) -> list[str]:
    """:func:`clip_problems` worded for a method config's ``clip_path`` field (``example``: the
    Hugging Face name of the CLIP the method's paper uses, e.g. ``openai/clip-vit-base-patch16``)."""
    if not clip_path:
        return [
            "field 'clip_path' is not set (a Hugging Face CLIP folder, e.g. "
            f"{example} downloaded with `hf download`, or an OpenAI-format "
            "open_clip_model.safetensors)"
        ]
    return [f"field 'clip_path': {p}" for p in clip_problems(clip_path, clip_tokenizer)]


def load_clip_fields(
    clip_path: str | Path | None, clip_tokenizer: str | Path | None, clip_arch: str
) -> PretrainedCLIP:
    """:func:`load_pretrained_clip` for a method config's ``clip_path`` / ``clip_tokenizer`` /
    ``clip_arch`` fields: a failure is a :class:`~nshot.errors.ConfigError` naming the field."""
    from nshot.errors import ConfigError

    try:
        pre = load_pretrained_clip(clip_path or "", clip_tokenizer)
    except CheckpointError as e:
        raise ConfigError(f"field 'clip_path': {e}") from None
    problem = pre.arch_problem(clip_arch)
    if problem:
        raise ConfigError(f"field 'clip_arch': {problem}")
    return pre


def clip_fingerprint(model: Any) -> str:
    """SHA-256 of a CLIP's parameters and buffers (names, dtypes, shapes and bytes, in name
    order): what a checkpoint tuned from that CLIP records, so that the CLIP found at the same
    path later can be told apart from another one."""
    import hashlib

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def clip_record(cfg: Any, pre: PretrainedCLIP) -> dict[str, Any]:
    """What a checkpoint tuned from ``pre`` records of it: the config's ``clip_path`` /
    ``clip_tokenizer`` / ``clip_arch`` and the CLIP's :func:`clip_fingerprint`."""
    return {
        "clip_path": str(cfg.clip_path),
        "clip_tokenizer": None if cfg.clip_tokenizer is None else str(cfg.clip_tokenizer),
        "clip_arch": cfg.clip_arch,
        "clip_sha256": clip_fingerprint(pre.model),
    }


def load_recorded_clip(
    config: dict[str, Any], record: dict[str, Any] | None, where: Any
) -> PretrainedCLIP:
    """The CLIP a checkpoint was tuned from, read from the ``clip_path`` / ``clip_tokenizer`` /
    ``clip_arch`` of its ``config`` (the machine that serves or evaluates it must have it
    there): a :class:`CheckpointError` naming ``clip_path`` when it is missing or is not a
    CLIP, names the architecture when it differs, and says so when its parameters are not
    those the checkpoint recorded (``record['clip_sha256']``, when recorded)."""
    path, tok = config.get("clip_path"), config.get("clip_tokenizer")
    problems = clip_problems(path, tok)
    if problems:
        raise CheckpointError(
            f"{where}: field 'clip_path' (recorded in the checkpoint's config: the CLIP it was "
            f"tuned from, which this machine must have at that path): " + "; ".join(problems)
        )
    pre = load_pretrained_clip(path, tok)
    problem = pre.arch_problem(str(config.get("clip_arch", "any")))
    if problem:
        raise CheckpointError(f"{where}: field 'clip_arch': {problem}")
    want = (record or {}).get("clip_sha256")
    if want is not None and clip_fingerprint(pre.model) != want:
        raise CheckpointError(
            f"{where}: field 'clip_path': the CLIP at {path} is not the one the checkpoint was "
            f"tuned from (parameter fingerprint differs from the recorded {str(want)[:12]}…)"
        )
    return pre


def clip_problems(path: str | Path | None, tokenizer: str | Path | None = None) -> list[str]:
    """What keeps ``path`` (and ``tokenizer``) from loading, without reading the weights: an
    empty list when nothing is found wrong. For a config's validation message."""
    if not path:
        return ["the CLIP path is not set"]
    p = Path(path)
    try:
        fmt = _format_of(p)
    except CheckpointError as e:
        return [str(e)]
    problems = []
    if fmt == "hf" and tokenizer is None:
        if not ((p / "tokenizer.json").is_file() or (
            (p / "vocab.json").is_file() and (p / "merges.txt").is_file())):  # fmt: skip
            problems.append(f"{p}: no tokenizer files (tokenizer.json, or vocab.json + merges.txt)")
    if fmt == "openai":
        try:
            from safetensors import safe_open

            with safe_open(str(p), framework="pt") as f:
                keys = set(f.keys())
        except Exception as e:  # noqa: BLE001 - any unreadable header
            return [f"{p}: not a readable safetensors file ({type(e).__name__}: {e})"]
        for key in ("visual.conv1.weight", "token_embedding.weight", "text_projection"):
            if key not in keys:
                return [f"{p}: key {key!r} is missing: not an OpenAI / open_clip CLIP state dict"]
        if tokenizer is None and _tokenizer_beside(p) is None:
            problems.append(
                f"{p}: an OpenAI-format file needs a tokenizer (a folder with tokenizer.json or "
                "vocab.json + merges.txt, or bpe_simple_vocab_16e6.txt.gz); none is given and "
                "none lies beside it"
            )
    if tokenizer is not None:
        t = Path(tokenizer)
        ok = (t.is_file() and t.name.endswith(".txt.gz")) or (
            t.is_dir() and ((t / "tokenizer.json").is_file() or (t / "vocab.json").is_file())
        )
        if not ok:
            problems.append(
                f"{t}: not a CLIP tokenizer (a folder with tokenizer.json or vocab.json + "
                "merges.txt, or bpe_simple_vocab_16e6.txt.gz)"
            )
    return problems


@dataclass
class PretrainedCLIP:
    """A loaded CLIP: the ``transformers.CLIPModel`` (fp32, eval mode), its tokenizer and its
    image preprocessing."""

    model: Any
    tokenizer: Any
    path: Path
    fmt: str  # "hf" or "openai"
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD

    @property
    def image_size(self) -> int:
        return int(self.model.config.vision_config.image_size)

    @property
    def context_length(self) -> int:
        return int(self.model.config.text_config.max_position_embeddings)

    @property
    def eos_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    def token_ids(self, text: str) -> list[int]:
        """The BPE ids of ``text`` without the start / end tokens."""
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def tokenize(self, texts: Sequence[str]) -> torch.Tensor:
        """``[n, L]`` ids as open_clip's: start, BPE, end (kept last when truncated to the
        context), padded with 0 to the longest row."""
        bos, eos, ctx = int(self.tokenizer.bos_token_id), self.eos_id, self.context_length
        rows = [[bos, *self.token_ids(t)][: ctx - 1] + [eos] for t in texts]
        out = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, : len(r)] = torch.tensor(r)
        return out

    def arch_problem(self, arch: str) -> str | None:
        """``None`` when the model is the named architecture (:data:`ARCHS`; ``"any"`` accepts
        every one), else what differs."""
        if arch == "any":
            return None
        if arch not in ARCHS:
            return f"unknown architecture {arch!r}; choose from {sorted(ARCHS)} or 'any'"
        v = self.model.config.vision_config
        have = (int(v.patch_size), int(v.hidden_size), int(v.num_hidden_layers))
        if have != ARCHS[arch]:
            return (
                f"{self.path}: is patch {have[0]}, width {have[1]}, {have[2]} blocks; {arch} is "
                f"patch {ARCHS[arch][0]}, width {ARCHS[arch][1]}, {ARCHS[arch][2]} blocks"
            )
        return None

    def normalise(self, pixels: torch.Tensor) -> torch.Tensor:
        mean = torch.tensor(self.mean, dtype=pixels.dtype, device=pixels.device)[:, None, None]
        std = torch.tensor(self.std, dtype=pixels.dtype, device=pixels.device)[:, None, None]
        return (pixels - mean) / std

    def encode_image(self, pixels: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        """``[B, E]`` features of pixels in [0, 1], ``[B, 3, S, S]``."""
        out = self.model.get_image_features(pixel_values=self.normalise(pixels)).pooler_output
        return F.normalize(out, dim=-1) if normalize else out

    def encode_text(self, texts: Sequence[str], normalize: bool = False) -> torch.Tensor:
        device = self.model.logit_scale.device
        ids = self.tokenize(texts).to(device)
        out = self.model.get_text_features(input_ids=ids).pooler_output
        return F.normalize(out, dim=-1) if normalize else out

    def logits(self, pixels: torch.Tensor, texts: Sequence[str]) -> torch.Tensor:
        """``exp(logit_scale) · cos`` of images against texts, ``[B, n]``."""
        img = self.encode_image(pixels, normalize=True)
        txt = self.encode_text(texts, normalize=True)
        return self.model.logit_scale.exp() * img @ txt.T


def _read_open_clip_config(p: Path) -> dict[str, Any]:
    cfg = p.parent / "open_clip_config.json"
    if not cfg.is_file():
        return {}
    try:
        data = json.loads(cfg.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{cfg}: unreadable JSON ({e})") from None
    return data if isinstance(data, dict) else {}


def _stats(values: Any, name: str, where: Path) -> tuple[float, float, float] | None:
    if values is None:
        return None
    if not (isinstance(values, list) and len(values) == 3 and all(
            isinstance(v, int | float) for v in values)):  # fmt: skip
        raise CheckpointError(f"{where}: {name} must be three numbers")
    return (float(values[0]), float(values[1]), float(values[2]))


def load_pretrained_clip(
    path: str | Path,
    tokenizer: str | Path | None = None,
    *,
    quick_gelu: bool | None = None,
) -> PretrainedCLIP:
    """A CLIP from a Hugging Face folder or an OpenAI-format safetensors file (see the module
    docstring); ``tokenizer`` overrides where the BPE files are read from. Nothing is
    downloaded. ``CheckpointError`` naming the path (and key) for anything wrong."""
    from transformers import CLIPModel

    p = Path(path)
    fmt = _format_of(p)
    mean, std = CLIP_MEAN, CLIP_STD
    if fmt == "hf":
        from transformers.utils import logging as hf_logging

        from nshot.data.sources import hf_offline

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        try:
            with hf_offline():
                model = CLIPModel.from_pretrained(
                    str(p), local_files_only=True, use_safetensors=True,
                    dtype=torch.float32,
                )  # fmt: skip
        except (OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"{p}: cannot load the CLIP ({type(e).__name__}: {e})") from None
        finally:
            hf_logging.set_verbosity(verbosity)
            hf_logging.enable_progress_bar()
        pre = p / "preprocessor_config.json"
        if pre.is_file():
            try:
                meta = json.loads(pre.read_text())
            except (OSError, ValueError) as e:
                raise CheckpointError(f"{pre}: unreadable JSON ({e})") from None
            mean = _stats(meta.get("image_mean"), "image_mean", pre) or mean
            std = _stats(meta.get("image_std"), "image_std", pre) or std
        tok_path: Path | None = Path(tokenizer) if tokenizer is not None else p
    else:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            state = load_file(str(p))
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{p}: not a readable safetensors file ({e})") from None
        oc = _read_open_clip_config(p)
        model_cfg = oc.get("model_cfg", {}) if isinstance(oc.get("model_cfg"), dict) else {}
        if quick_gelu is None:
            quick_gelu = bool(model_cfg.get("quick_gelu", True)) if oc else True
        config, hf_state = openai_to_hf(state, quick_gelu=quick_gelu, where=str(p))
        model = CLIPModel(config)
        expected = set(model.state_dict())
        missing = sorted(expected - set(hf_state))
        if missing:
            raise CheckpointError(f"{p}: the mapped state lacks {missing[0]!r}")
        for k, v in hf_state.items():
            want = model.state_dict()[k].shape
            if tuple(v.shape) != tuple(want):
                raise CheckpointError(
                    f"{p}: a tensor mapped to {k!r} has shape {tuple(v.shape)}; the inferred "
                    f"architecture expects {tuple(want)}"
                )
        model.load_state_dict(hf_state, strict=True)
        pre_cfg = oc.get("preprocess_cfg", {}) if isinstance(oc.get("preprocess_cfg"), dict) else {}
        mean = _stats(pre_cfg.get("mean"), "preprocess_cfg.mean", p) or mean
        std = _stats(pre_cfg.get("std"), "preprocess_cfg.std", p) or std
        tok_path = Path(tokenizer) if tokenizer is not None else _tokenizer_beside(p)
        if tok_path is None:
            raise CheckpointError(
                f"{p}: an OpenAI-format file needs a tokenizer: pass one (a folder with "
                "tokenizer.json or vocab.json + merges.txt, or bpe_simple_vocab_16e6.txt.gz)"
            )
    tok = bpe_tokenizer(tok_path)
    vocab = int(model.config.text_config.vocab_size)
    if tok.eos_token_id is None or not 0 <= int(tok.eos_token_id) < vocab or len(tok) > vocab:
        raise CheckpointError(
            f"{tok_path}: the tokenizer ({len(tok)} tokens) does not fit the CLIP's vocabulary "
            f"of {vocab}"
        )
    model.eval()
    for q in model.parameters():
        q.requires_grad_(False)
    return PretrainedCLIP(model=model, tokenizer=tok, path=p, fmt=fmt, mean=mean, std=std)


# --------------------------------------------------------------------------------------------
# images


def load_image(path: str | Path, size: int = 224) -> np.ndarray:
    """CLIP's preprocessing without torchvision: RGB, the shorter side resized to ``size``
    (bicubic), the centre ``size × size`` crop; ``float32 [3, size, size]`` in [0, 1] (the
    mean / std normalisation is the model's)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            return preprocess_image(im, size)
    except OSError as e:
        raise CheckpointError(f"{path}: not a readable image ({e})") from None


def preprocess_image(image: Any, size: int = 224) -> np.ndarray:
    """:func:`load_image`'s preprocessing of a PIL image or an ``uint8 [H, W, 3]`` array."""
    from PIL import Image

    im = Image.fromarray(image) if isinstance(image, np.ndarray) else image
    im = im.convert("RGB")
    w, h = im.size
    scale = size / min(w, h)
    nw, nh = max(size, round(w * scale)), max(size, round(h * scale))
    im = im.resize((nw, nh), Image.Resampling.BICUBIC)
    left, top = int(round((nw - size) / 2.0)), int(round((nh - size) / 2.0))
    im = im.crop((left, top, left + size, top + size))
    arr = np.asarray(im, dtype=np.float32) / 255.0
    return np.ascontiguousarray(arr.transpose(2, 0, 1))


class FolderImages:
    """Image files read on demand with :func:`load_image`: ``x[rows]`` (``rows`` an index array
    or slice) is ``float32 [k, 3, size, size]``, the files read in threads (PIL frees the GIL).
    ``cache``: keep every image read in this process (few images read again and again, as
    few-shot episodes do; at most 4,096)."""

    def __init__(self, paths: Sequence[Path], size: int, cache: bool = False) -> None:
        self.paths = tuple(paths)
        self.size = size
        self.cache = cache

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, rows: Any) -> np.ndarray:
        from concurrent.futures import ThreadPoolExecutor

        idx = np.atleast_1d(np.arange(len(self.paths))[rows])
        read = _cached_image if self.cache else load_image
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(idx)))) as pool:
            images = list(pool.map(lambda i: read(self.paths[i], self.size), idx))
        return np.stack(images)


@functools.lru_cache(maxsize=4096)
def _cached_image(path: Path, size: int) -> np.ndarray:
    return load_image(path, size)


@dataclass(frozen=True)
class ImageFolder:
    """Class folders of images: ``classes[i]`` is the folder of label i (sorted)."""

    root: Path
    classes: tuple[str, ...]
    paths: tuple[Path, ...]
    labels: np.ndarray  # int64

    def class_names(self, mapping_file: Path | None = None) -> list[str]:
        """Readable names: from ``mapping_file`` (default ``class_names.json`` in the root), a
        JSON object folder → name, when it exists; else the folder names with ``_`` as
        spaces."""
        mapping_file = mapping_file or self.root / "class_names.json"
        mapping: dict[str, str] = {}
        if mapping_file.is_file():
            try:
                raw = json.loads(mapping_file.read_text())
            except (OSError, ValueError) as e:
                raise CheckpointError(f"{mapping_file}: unreadable JSON ({e})") from None
            if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
                raise CheckpointError(f"{mapping_file}: must map folder names to names")
            mapping = raw
        return [mapping.get(c, c.replace("_", " ")) for c in self.classes]


def image_folder(root: str | Path, min_classes: int = 2) -> ImageFolder:
    """The images (``.png``, ``.jpg``, ``.jpeg``) under ``root/<class>/``, sorted."""
    r = Path(root)
    if not r.is_dir():
        raise CheckpointError(f"{r}: not a directory")
    classes = sorted(d.name for d in r.iterdir() if d.is_dir() and not d.name.startswith("."))
    paths: list[Path] = []
    labels: list[int] = []
    for i, c in enumerate(classes):
        files = sorted(f for f in (r / c).iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise CheckpointError(f"{r / c}: no .png / .jpg / .jpeg images")
        paths += files
        labels += [i] * len(files)
    if len(classes) < min_classes:
        raise CheckpointError(
            f"{r}: {len(classes)} class folder(s); an ImageFolder needs at least {min_classes}"
        )
    return ImageFolder(r, tuple(classes), tuple(paths), np.asarray(labels, dtype=np.int64))


# --------------------------------------------------------------------------------------------
# a tiny random CLIP (tests, examples)

TINY_WORDS = ("a", "photo", "of", "this", "is")


def write_tiny_clip(
    folder: str | Path,
    *,
    words: Sequence[str] = TINY_WORDS,
    seed: int = 0,
    image_size: int = 32,
    patch: int = 8,
    width: int = 64,
    layers: int = 2,
    embed: int = 32,
    context: int = 32,
    text_width: int | None = None,
    text_layers: int | None = None,
) -> Path:
    """Write a randomly initialised CLIP in the Hugging Face format (``config.json``,
    ``model.safetensors``, ``tokenizer.json``, ``preprocessor_config.json``) to ``folder``:
    the real architecture at toy sizes (QuickGELU, 64-wide heads), and a byte-level BPE
    tokenizer of open_clip's layout whose merges spell ``words`` whole (any other text falls
    back to characters). ``text_width`` / ``text_layers`` give the text tower its own sizes
    (default: the image tower's; ViT-B's text tower is 512 wide, 12 blocks). For tests,
    examples and timing; it knows nothing."""
    from transformers import CLIPConfig, CLIPModel, CLIPTokenizer

    merges: list[tuple[str, str]] = []
    for w in words:
        syms = [*w[:-1], w[-1] + "</w>"]
        while len(syms) > 1:
            pair = (syms[0], syms[1])
            if pair not in merges:
                merges.append(pair)
            syms = [syms[0] + syms[1], *syms[2:]]
    vocab = _vocab_from_merges(merges)
    tok = CLIPTokenizer(vocab=vocab, merges=merges)
    heads = max(1, width // HEAD_WIDTH)
    t_width = width if text_width is None else text_width
    t_layers = layers if text_layers is None else text_layers
    config = CLIPConfig(
        text_config={
            "vocab_size": len(vocab), "hidden_size": t_width, "intermediate_size": 4 * t_width,
            "num_hidden_layers": t_layers, "num_attention_heads": max(1, t_width // HEAD_WIDTH),
            "max_position_embeddings": context, "hidden_act": "quick_gelu",
            "bos_token_id": len(vocab) - 2, "eos_token_id": 2, "pad_token_id": 0,
        },
        vision_config={
            "hidden_size": width, "intermediate_size": 4 * width, "num_hidden_layers": layers,
            "num_attention_heads": heads, "image_size": image_size, "patch_size": patch,
            "hidden_act": "quick_gelu",
        },
        projection_dim=embed,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = CLIPModel(config).eval()
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(str(out), safe_serialization=True)
        tok.save_pretrained(str(out))
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    pre = {"image_mean": list(CLIP_MEAN), "image_std": list(CLIP_STD), "crop_size": image_size}
    (out / "preprocessor_config.json").write_text(json.dumps(pre))
    return out
