"""Real ViT checkpoints (DINO ViT-B/8, Caron et al. 2021) read by path into
``transformers.ViTModel``, with neither timm nor torch.hub.

Two formats, both safetensors (a pickle — ``.bin``, ``.pt``, ``.pth``, ``.ckpt`` — is refused,
never unpickled: convert it to safetensors first):

* a **Hugging Face ViT folder**: ``config.json`` (``model_type`` "vit") + ``model.safetensors``,
  e.g. ``hf download facebook/dino-vitb8 --local-dir D`` (if the folder holds only
  ``pytorch_model.bin``, convert it once in your own environment:
  ``python -c "from transformers import ViTModel as M; M.from_pretrained('D').save_pretrained('D')"``);
* a **timm / official DINO state dict** in one safetensors file (``cls_token``, ``pos_embed``,
  ``patch_embed.proj.weight``, ``blocks.0.norm1.weight``, ``blocks.0.attn.qkv.weight``,
  ``blocks.0.attn.proj.weight``, ``blocks.0.mlp.fc1.weight``, ``norm.weight``, ...), e.g.
  ``hf download timm/vit_base_patch8_224.dino model.safetensors --local-dir D`` (the backbone
  CFM and CFR name, ``vit_base_patch8_224.dino``), or DINO's own ``dino_vitbase8_pretrain.pth``
  converted once in your own environment: ``python -c "import torch, safetensors.torch as s;
  s.save_file(torch.load('dino_vitbase8_pretrain.pth', map_location='cpu'),
  'dino_vitb8.safetensors')"``. The architecture comes from the tensor shapes (width, depth,
  patch, grid, MLP width; 64-wide heads as in every DINO / timm ViT) and the weights are mapped
  onto ``ViTModel`` (``attn.qkv`` split into query / key / value, ``norm1`` / ``norm2`` →
  ``layernorm_before`` / ``layernorm_after``, ``norm`` → the final ``layernorm``); LayerNorm
  epsilon 1e-6 and exact GELU, as timm's and DINO's ViT.

:meth:`PretrainedViT.patch_tokens` gives the final-norm patch tokens as a ``[B, C, G, G]`` map
(the class token dropped), what CFM's ``forward_rgb_features`` reads from timm's model.
Checked in ``tests/test_cfr_paper.py``: a tiny random ViT written in both formats loads through
both routes with equal tokens, and a file with a missing or misshapen tensor is refused naming
the key.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nshot.errors import CheckpointError
from nshot.nn.hfclip import PICKLE_SUFFIXES, pickle_error

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "PretrainedViT",
    "hf_vit_to_timm",
    "load_vit",
    "timm_vit_to_hf",
    "write_tiny_vit",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
HEAD_WIDTH = 64


def _hf_names(model: Any) -> dict[str, str]:
    """The installed transformers' names of one block's tensors (they changed in v5)."""
    keys = set(model.state_dict())
    if "layers.0.attention.q_proj.weight" in keys:
        return {"q": "layers.{i}.attention.q_proj", "k": "layers.{i}.attention.k_proj",
                "v": "layers.{i}.attention.v_proj", "o": "layers.{i}.attention.o_proj",
                "n1": "layers.{i}.layernorm_before", "n2": "layers.{i}.layernorm_after",
                "fc1": "layers.{i}.mlp.fc1", "fc2": "layers.{i}.mlp.fc2"}  # fmt: skip
    if "encoder.layer.0.attention.attention.query.weight" in keys:
        return {"q": "encoder.layer.{i}.attention.attention.query",
                "k": "encoder.layer.{i}.attention.attention.key",
                "v": "encoder.layer.{i}.attention.attention.value",
                "o": "encoder.layer.{i}.attention.output.dense",
                "n1": "encoder.layer.{i}.layernorm_before",
                "n2": "encoder.layer.{i}.layernorm_after",
                "fc1": "encoder.layer.{i}.intermediate.dense",
                "fc2": "encoder.layer.{i}.output.dense"}  # fmt: skip
    raise CheckpointError("transformers' ViTModel has tensor names this loader does not know")


def _need(state: dict[str, torch.Tensor], key: str, shape: tuple, where: str) -> torch.Tensor:
    """``state[key]`` of ``shape`` (``None`` entries: any size); a CheckpointError names the key."""
    if key not in state:
        raise CheckpointError(f"{where}: key {key!r} is missing (not a timm / DINO ViT)")
    t = state[key]
    ok = t.dim() == len(shape) and all(s is None or s == d for s, d in zip(shape, t.shape))
    if not ok:
        want = tuple("*" if s is None else s for s in shape)
        raise CheckpointError(f"{where}: key {key!r} has shape {tuple(t.shape)}; expected {want}")
    return t


def timm_vit_to_hf(
    state: dict[str, torch.Tensor], *, where: str = "state dict", layer_norm_eps: float = 1e-6
) -> tuple[Any, dict[str, torch.Tensor]]:
    """``(transformers.ViTConfig, ViTModel state dict)`` of a timm / DINO ViT state dict, the
    architecture read off the shapes. ``CheckpointError`` naming the key for a missing, extra
    or misshapen tensor."""
    from transformers import ViTConfig, ViTModel

    conv = _need(state, "patch_embed.proj.weight", (None, 3, None, None), where)
    width, _, patch, _ = conv.shape
    pos = _need(state, "pos_embed", (1, None, width), where)
    grid = round((pos.shape[1] - 1) ** 0.5)
    if grid * grid + 1 != pos.shape[1]:
        raise CheckpointError(f"{where}: key 'pos_embed' has {pos.shape[1]} rows, not 1 + a square")
    pat = re.compile(r"blocks\.(\d+)\.")
    depth = len({int(m.group(1)) for k in state if (m := pat.match(k))})
    if depth == 0:
        raise CheckpointError(f"{where}: key 'blocks.0.norm1.weight' is missing (no blocks)")
    mlp = _need(state, "blocks.0.mlp.fc1.weight", (None, width), where).shape[0]
    config = ViTConfig(
        hidden_size=int(width), num_hidden_layers=depth,
        num_attention_heads=max(1, int(width) // HEAD_WIDTH), intermediate_size=int(mlp),
        hidden_act="gelu", layer_norm_eps=layer_norm_eps, image_size=int(patch * grid),
        patch_size=int(patch), num_channels=3, qkv_bias=True,
    )  # fmt: skip
    names = _hf_names(ViTModel(_tiny_like(config), add_pooling_layer=False))
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()

    def take(src: str, dst: str, shape: tuple) -> None:
        out[dst] = _need(state, src, shape, where)
        used.add(src)

    take("cls_token", "embeddings.cls_token", (1, 1, width))
    take("pos_embed", "embeddings.position_embeddings", (1, grid * grid + 1, width))
    take("patch_embed.proj.weight", "embeddings.patch_embeddings.projection.weight",
         (width, 3, patch, patch))  # fmt: skip
    take("patch_embed.proj.bias", "embeddings.patch_embeddings.projection.bias", (width,))
    for i in range(depth):
        s = f"blocks.{i}."
        for ab, shp in (("weight", (3 * width, width)), ("bias", (3 * width,))):
            qkv = _need(state, f"{s}attn.qkv.{ab}", shp, where)
            for part, t in zip("qkv", qkv.chunk(3, dim=0), strict=True):
                out[f"{names[part].format(i=i)}.{ab}"] = t.contiguous()
            used.add(f"{s}attn.qkv.{ab}")
        pairs = (("attn.proj", "o", (width, width)), ("norm1", "n1", None),
                 ("norm2", "n2", None), ("mlp.fc1", "fc1", (mlp, width)),
                 ("mlp.fc2", "fc2", (width, mlp)))  # fmt: skip
        for src, dst, wshape in pairs:
            rows = wshape[0] if wshape else width
            take(f"{s}{src}.weight", f"{names[dst].format(i=i)}.weight", wshape or (width,))
            take(f"{s}{src}.bias", f"{names[dst].format(i=i)}.bias", (rows,))
    take("norm.weight", "layernorm.weight", (width,))
    take("norm.bias", "layernorm.bias", (width,))
    extra = sorted(set(state) - used)
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise CheckpointError(f"{where}: key {extra[0]!r}{more} has no place in a DINO ViT")
    return config, out


def _tiny_like(config: Any) -> Any:
    """A one-block, 8-wide copy of ``config`` (to read the installed tensor names cheaply)."""
    c = config.__class__(**{**config.to_dict(), "hidden_size": 8, "num_hidden_layers": 1,
                            "num_attention_heads": 1, "intermediate_size": 8})  # fmt: skip
    return c


def hf_vit_to_timm(model: Any) -> dict[str, torch.Tensor]:
    """The timm / DINO state dict of a ``transformers.ViTModel`` (the inverse of
    :func:`timm_vit_to_hf`; query / key / value fused into ``attn.qkv``)."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    names = _hf_names(model)
    out = {
        "cls_token": sd["embeddings.cls_token"],
        "pos_embed": sd["embeddings.position_embeddings"],
        "patch_embed.proj.weight": sd["embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": sd["embeddings.patch_embeddings.projection.bias"],
        "norm.weight": sd["layernorm.weight"],
        "norm.bias": sd["layernorm.bias"],
    }
    for i in range(model.config.num_hidden_layers):
        s = f"blocks.{i}."
        for ab in ("weight", "bias"):
            out[f"{s}attn.qkv.{ab}"] = torch.cat(
                [sd[f"{names[p].format(i=i)}.{ab}"] for p in "qkv"], dim=0
            )
            for src, dst in (("attn.proj", "o"), ("norm1", "n1"), ("norm2", "n2"),
                             ("mlp.fc1", "fc1"), ("mlp.fc2", "fc2")):  # fmt: skip
                out[f"{s}{src}.{ab}"] = sd[f"{names[dst].format(i=i)}.{ab}"]
    return {k: v.contiguous() for k, v in out.items()}


@dataclass
class PretrainedViT:
    """A loaded ViT (fp32, eval mode, frozen) and its input normalisation."""

    model: Any
    path: Path
    fmt: str  # "hf" or "timm"
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    @property
    def patch(self) -> int:
        return int(self.model.config.patch_size)

    @property
    def image_size(self) -> int:
        return int(self.model.config.image_size)

    @property
    def width(self) -> int:
        return int(self.model.config.hidden_size)

    def normalise(self, pixels: torch.Tensor) -> torch.Tensor:
        mean = torch.tensor(self.mean, dtype=pixels.dtype, device=pixels.device)[:, None, None]
        std = torch.tensor(self.std, dtype=pixels.dtype, device=pixels.device)[:, None, None]
        return (pixels - mean) / std

    @torch.no_grad()
    def patch_tokens(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[B, C, G, G]`` final-norm patch tokens of pixels in [0, 1] (``[B, 3, S, S]``,
        S the model's image size)."""
        out = self.model(pixel_values=self.normalise(pixels)).last_hidden_state[:, 1:]
        g = pixels.shape[-1] // self.patch
        return out.transpose(1, 2).reshape(len(pixels), -1, g, g)


def _read_safetensors(p: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(p))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{p}: not a readable safetensors file ({e})") from None


def load_vit(path: str | Path) -> PretrainedViT:
    """A ViT from a Hugging Face folder or a timm / DINO safetensors file (module docstring).
    Nothing is downloaded; a ``CheckpointError`` names the path (and key) for anything wrong."""
    from transformers import ViTModel

    p = Path(path)
    if p.suffix.lower() in PICKLE_SUFFIXES:
        raise pickle_error(p)
    if p.is_dir():
        cfg_file = p / "config.json"
        if not cfg_file.is_file():
            raise CheckpointError(f"{p}: no config.json (not a Hugging Face ViT folder)")
        try:
            meta = json.loads(cfg_file.read_text())
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{cfg_file}: unreadable JSON ({e})") from None
        if meta.get("model_type") != "vit":
            raise CheckpointError(f"{cfg_file}: model_type {meta.get('model_type')!r}, not 'vit'")
        if not any(p.glob("*.safetensors")) and not (p / "model.safetensors.index.json").is_file():
            pickles = [f.name for f in p.iterdir() if f.suffix in PICKLE_SUFFIXES]
            raise CheckpointError(
                f"{p}: no model.safetensors"
                + (f" (only {pickles[0]}, a pickle: convert it first, see nshot.nn.hfvit)"
                   if pickles else "")
            )  # fmt: skip
        from transformers.utils import logging as hf_logging

        from nshot.data.sources import hf_offline

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        try:
            with hf_offline():
                model = ViTModel.from_pretrained(
                    str(p), local_files_only=True, use_safetensors=True, add_pooling_layer=False,
                    dtype=torch.float32,
                )  # fmt: skip
        except (OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"{p}: cannot load the ViT ({type(e).__name__}: {e})") from None
        finally:
            hf_logging.set_verbosity(verbosity)
            hf_logging.enable_progress_bar()
        mean, std = IMAGENET_MEAN, IMAGENET_STD
        pre = p / "preprocessor_config.json"
        if pre.is_file():
            try:
                pm = json.loads(pre.read_text())
                mean = tuple(float(v) for v in pm.get("image_mean", mean))  # type: ignore[assignment]
                std = tuple(float(v) for v in pm.get("image_std", std))  # type: ignore[assignment]
            except (OSError, ValueError, TypeError) as e:
                raise CheckpointError(f"{pre}: unreadable image_mean / image_std ({e})") from None
        fmt = "hf"
    elif p.is_file():
        config, hf_state = timm_vit_to_hf(_read_safetensors(p), where=str(p))
        model = ViTModel(config, add_pooling_layer=False)
        want = model.state_dict()
        missing = sorted(set(want) - set(hf_state))
        if missing:
            raise CheckpointError(f"{p}: the mapped state lacks {missing[0]!r}")
        model.load_state_dict(hf_state, strict=True)
        mean, std, fmt = IMAGENET_MEAN, IMAGENET_STD, "timm"
    else:
        raise CheckpointError(f"{p}: no such file or folder (a ViT folder or .safetensors file)")
    model.eval()
    for q in model.parameters():
        q.requires_grad_(False)
    return PretrainedViT(model=model, path=p, fmt=fmt, mean=mean, std=std)  # type: ignore[arg-type]


def write_tiny_vit(
    path: str | Path, *, fmt: str = "timm", seed: int = 0, image_size: int = 32, patch: int = 8,
    width: int = 64, depth: int = 2,
) -> Path:  # fmt: skip
    """Write a randomly initialised ViT of DINO's layout at toy sizes: a timm / DINO
    safetensors file (``fmt="timm"``) or a Hugging Face folder (``fmt="hf"``). For tests."""
    from safetensors.torch import save_file
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(
        hidden_size=width, num_hidden_layers=depth, num_attention_heads=max(1, width // 64),
        intermediate_size=4 * width, hidden_act="gelu", layer_norm_eps=1e-6,
        image_size=image_size, patch_size=patch, qkv_bias=True,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = ViTModel(config, add_pooling_layer=False).eval()
    with torch.no_grad():  # DINO's tokens are not zero; make the test see them
        model.embeddings.cls_token.normal_(0, 0.02)
        for q in model.parameters():
            q.add_(0.02 * torch.randn_like(q))
    out = Path(path)
    if fmt == "timm":
        out.parent.mkdir(parents=True, exist_ok=True)
        save_file(hf_vit_to_timm(model), str(out))
    elif fmt == "hf":
        from transformers.utils import logging as hf_logging

        out.mkdir(parents=True, exist_ok=True)
        hf_logging.disable_progress_bar()
        try:
            model.save_pretrained(str(out), safe_serialization=True)
        finally:
            hf_logging.enable_progress_bar()
    else:
        raise ValueError(f"fmt {fmt!r}: 'timm' or 'hf'")
    return out
