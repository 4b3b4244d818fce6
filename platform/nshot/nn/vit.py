"""A small Vision Transformer with timm's parameter names, for CPU-sized image tasks.

The names are timm's ``VisionTransformer`` ones (``patch_embed.proj``, ``cls_token``,
``pos_embed``, ``blocks.{i}.norm1``, ``blocks.{i}.attn.qkv``, ``blocks.{i}.attn.proj``,
``blocks.{i}.norm2``, ``blocks.{i}.mlp.fc1``, ``blocks.{i}.mlp.fc2``, ``norm``, ``head``), so
code that maps weights between models by name (FRONT's learngene, weight selection) also works
on real DeiT/ViT state dicts. Initialisation follows timm: truncated normal (std 0.02) for
weights and tokens, zero biases, LayerNorm weights one.

``stem="conv"`` replaces the one strided patch convolution by a convolutional stem (Xiao et
al. 2021, "Early convolutions help transformers see better"): log2(patch) stride-2 3×3
convolutions, each followed by a per-image GroupNorm of one group and GELU, then a 1×1
convolution to the width (``patch_embed.stem.*``, then ``patch_embed.proj``; these keep
PyTorch's Kaiming-uniform convolution init). Same tokens, same grid; on small from-scratch
data it learns object shape much sooner (the tiny CLIP of :mod:`nshot.train.clip`). The
default ``stem="patch"`` is timm's.

::

    vit = ViT(img_size=8, patch=2, in_chans=1, num_classes=10, width=64, depth=12, heads=4)
    logits = vit(images)          # images [B, 1, 8, 8] -> [B, 10]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["STEMS", "ViT", "stem_error", "vit_flops_per_image"]


STEMS = ("patch", "conv")


def stem_error(stem: str, patch: int) -> str | None:
    """Why ``stem`` cannot embed patches of side ``patch`` (``None`` when it can): for the
    model and for configs that check it before building one."""
    if stem not in STEMS:
        return f"stem {stem!r} is not one of {STEMS}"
    if stem == "conv" and (patch < 2 or patch & (patch - 1)):
        return f"stem 'conv' needs a patch that is a power of two >= 2, got {patch}"
    return None


class PatchEmbed(nn.Module):
    def __init__(
        self, img_size: int, patch: int, in_chans: int, width: int, stem: str = "patch"
    ) -> None:
        super().__init__()
        if img_size % patch:
            raise ValueError(f"img_size {img_size} is not divisible by patch {patch}")
        if (why := stem_error(stem, patch)) is not None:
            raise ValueError(why)
        self.num_patches = (img_size // patch) ** 2
        self.stem: nn.Sequential | None = None
        if stem == "patch":
            self.proj = nn.Conv2d(in_chans, width, kernel_size=patch, stride=patch)
            return
        n = patch.bit_length() - 1  # stride-2 convolutions: patch = 2 ** n
        layers: list[nn.Module] = []
        c_in = in_chans
        for i in range(n):
            c_out = max(1, width >> (n - 1 - i))
            layers += [
                nn.Conv2d(c_in, c_out, kernel_size=3, stride=2, padding=1),
                nn.GroupNorm(1, c_out),
                nn.GELU(),
            ]
            c_in = c_out
        self.stem = nn.Sequential(*layers)
        self.proj = nn.Conv2d(c_in, width, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stem is not None:
            x = self.stem(x)
        return self.proj(x).flatten(2).transpose(1, 2)  # [B, N, W]


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not divisible by heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, w = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, w))


class Mlp(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width, eps=1e-6)
        self.attn = Attention(width, heads)
        self.norm2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = Mlp(width, int(width * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Pre-LN ViT classifier on the class token (timm's names and initialisation)."""

    def __init__(
        self,
        *,
        img_size: int = 8,
        patch: int = 2,
        in_chans: int = 1,
        num_classes: int = 10,
        width: int = 64,
        depth: int = 12,
        heads: int = 4,
        mlp_ratio: float = 4.0,
        stem: str = "patch",
    ) -> None:
        super().__init__()
        if depth < 1 or width < 1 or num_classes < 1:
            raise ValueError("depth, width and num_classes must be positive")
        self.img_size, self.patch, self.in_chans = img_size, patch, in_chans
        self.width, self.depth, self.heads, self.mlp_ratio = width, depth, heads, mlp_ratio
        self.num_classes = num_classes
        self.stem = stem
        self.patch_embed = PatchEmbed(img_size, patch, in_chans, width, stem)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + 1, width))
        self.blocks = nn.ModuleList(Block(width, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(width, eps=1e-6)
        self.head = nn.Linear(width, num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear | nn.Conv2d):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm | nn.GroupNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if self.patch_embed.stem is not None:  # a convolutional stem keeps PyTorch's conv init
            for m in [*self.patch_embed.stem, self.patch_embed.proj]:
                if isinstance(m, nn.Conv2d):
                    m.reset_parameters()

    def shape(self) -> dict[str, int | float | str]:
        """The constructor's arguments (``stem`` only when not the default ``"patch"``, so the
        shapes saved before the option read the same)."""
        out: dict[str, int | float | str] = {
            "img_size": self.img_size,
            "patch": self.patch,
            "in_chans": self.in_chans,
            "num_classes": self.num_classes,
            "width": self.width,
            "depth": self.depth,
            "heads": self.heads,
            "mlp_ratio": self.mlp_ratio,
        }
        if self.stem != "patch":
            out["stem"] = self.stem
        return out

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)[:, 0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def vit_flops_per_image(vit: ViT, train: bool = True) -> float:
    """Analytic FLOPs of one image: 2 × (matmul parameters) × tokens, plus attention scores and
    mixing (2 × 2 × tokens² × width per block); × 3 for training (forward + backward)."""
    tokens = vit.patch_embed.num_patches + 1
    w, hidden = vit.width, int(vit.width * vit.mlp_ratio)
    per_block = 2 * tokens * (3 * w * w + w * w + 2 * w * hidden) + 4 * tokens * tokens * w
    pe = vit.patch_embed
    if pe.stem is None:
        embed = 2 * pe.num_patches * w * vit.in_chans * vit.patch**2
    else:
        embed, side = 0, vit.img_size
        for m in pe.stem:
            if isinstance(m, nn.Conv2d):
                side //= 2
                embed += 2 * side * side * m.out_channels * m.in_channels * 9
        embed += 2 * pe.num_patches * w * pe.proj.in_channels
    fwd = vit.depth * per_block + embed + 2 * w * vit.num_classes
    return float(fwd * (3 if train else 1))
