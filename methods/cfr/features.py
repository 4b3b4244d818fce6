"""Frozen per-pixel features of an RGB image (F2) and of its organised point cloud (F3).

The paper (§4.1) uses DINO ViT-B/8 patch tokens for RGB and Point-MAE group features for the
point cloud, both frozen. Offline, both are replaced by frozen random networks with a fixed
seed, never trained:

* RGB: three 3×3 conv + ReLU layers of ``rgb_dim / 3`` channels at strides 1, 2 and 4, each map
  bilinearly upsampled to the grid and concatenated (hypercolumns);
* 3-D: per-pixel geometric descriptors (x, y, z centred per image, the surface normal, and
  mean-curvature proxies from box filters of 3, 7 and 15 pixels) through a random two-layer
  tanh MLP; zero on invalid pixels.

The valid mask comes from the point cloud (a point is valid unless it is exactly (0, 0, 0)).
With ``features="paper"``, :func:`make_extractors` returns the paper's DINO ViT-B/8 and
Point-MAE extractors instead (:mod:`.paper_features`), which read their mask off F3 as CFM does.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage

from .config import CfrConfig

RGB_MEAN, RGB_STD = 0.5, 0.25
N_DESCRIPTORS = 9


class Extractors:
    """The frozen extractors of a config: a function of ``feature_seed`` and the widths only."""

    def __init__(self, cfg: CfrConfig) -> None:
        g = torch.Generator().manual_seed(cfg.feature_seed)
        c = cfg.rgb_dim // 3
        self.convs = []
        for cin, stride in ((3, 1), (c, 2), (c, 2)):
            w = torch.randn(c, cin, 3, 3, generator=g) * (2.0 / (cin * 9)) ** 0.5
            b = torch.randn(c, generator=g) * 0.1
            self.convs.append((w, b, stride))
        hidden = max(cfg.xyz_dim, 32)
        self.w1 = torch.randn(N_DESCRIPTORS, hidden, generator=g) / N_DESCRIPTORS**0.5
        self.b1 = torch.randn(hidden, generator=g) * 0.1
        self.w2 = torch.randn(hidden, cfg.xyz_dim, generator=g) * (1.5 / hidden**0.5)
        self.b2 = torch.randn(cfg.xyz_dim, generator=g) * 0.1

    @torch.no_grad()
    def rgb(self, rgb: np.ndarray) -> torch.Tensor:
        """n × H × W × 3 uint8 → n × H × W × C2."""
        x = torch.from_numpy(np.ascontiguousarray(rgb)).float().permute(0, 3, 1, 2)
        x = (x / 255.0 - RGB_MEAN) / RGB_STD
        size = x.shape[-2:]
        maps = []
        for w, b, stride in self.convs:
            x = F.relu(F.conv2d(x, w, b, stride=stride, padding=1))
            maps.append(F.interpolate(x, size=size, mode="bilinear", align_corners=False))
        return torch.cat(maps, 1).permute(0, 2, 3, 1).contiguous()

    @torch.no_grad()
    def xyz(self, xyz: np.ndarray) -> torch.Tensor:
        """n × H × W × 3 organised point clouds → n × H × W × C3 (zero where invalid)."""
        desc = torch.from_numpy(descriptors(xyz))
        h = torch.tanh(desc @ self.w1 + self.b1)
        out = torch.tanh(h @ self.w2 + self.b2)
        return out * torch.from_numpy(valid_mask(xyz))[..., None]

    def valid(self, xyz: np.ndarray, f3: torch.Tensor) -> torch.Tensor:
        """n × H × W bool: the pixels with a point."""
        return torch.from_numpy(valid_mask(xyz))

    def __call__(self, rgb: np.ndarray, xyz: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rgb(rgb), self.xyz(xyz)


_PAPER: dict[tuple, object] = {}


def make_extractors(cfg: CfrConfig):  # -> Extractors | PaperExtractors
    """The config's frozen extractors: the seeded random ones, or the paper's (loaded once per
    process and weight-file pair)."""
    if cfg.features != "paper":
        return Extractors(cfg)
    from .paper_features import PaperExtractors

    key = (cfg.dino_path, cfg.pointmae_path, cfg.pointmae_groups, cfg.pointmae_group_size,
           cfg.rgb_dim, cfg.xyz_dim, cfg.grid)  # fmt: skip
    if key not in _PAPER:
        _PAPER.clear()  # one pair of networks at a time
        _PAPER[key] = PaperExtractors(cfg)
    return _PAPER[key]


def valid_mask(xyz: np.ndarray) -> np.ndarray:
    """A point is valid unless it is exactly (0, 0, 0) (the benchmark's background)."""
    return np.asarray(xyz).any(-1)


def _masked_mean(z: np.ndarray, valid: np.ndarray, size: int) -> np.ndarray:
    num = ndimage.uniform_filter(z * valid, size, mode="constant")
    den = ndimage.uniform_filter(valid.astype(np.float64), size, mode="constant")
    return np.where(den > 0, num / np.maximum(den, 1e-12), 0.0)


def descriptors(xyz: np.ndarray) -> np.ndarray:
    """n × H × W × 9 geometric descriptors (float32), zero where invalid."""
    xyz = np.asarray(xyz, dtype=np.float64)
    out = np.zeros((*xyz.shape[:3], N_DESCRIPTORS), dtype=np.float32)
    for i, p in enumerate(xyz):
        valid = p.any(-1)
        if not valid.any():
            continue
        c = p - p[valid].mean(0)
        z = np.where(valid, p[..., 2], 0.0)
        # the surface normal from the organised grid's neighbours (x, y spacing per pixel)
        zf = np.where(valid, z, _masked_mean(z, valid, 3))
        gy, gx = np.gradient(zf)
        sy = np.gradient(np.where(valid, p[..., 1], 0.0), axis=0)
        sx = np.gradient(np.where(valid, p[..., 0], 0.0), axis=1)
        step = np.median(np.abs(np.r_[sx[valid], sy[valid]])) or 1.0
        n = np.stack([-gx / step, -gy / step, np.ones_like(z)], -1)
        n /= np.linalg.norm(n, axis=-1, keepdims=True)
        curv = [(z - _masked_mean(z, valid, s)) * 20.0 for s in (3, 7, 15)]
        d = np.concatenate([c * np.array([2.0, 2.0, 5.0]), n, np.stack(curv, -1)], -1)
        out[i] = np.where(valid[..., None], d, 0.0)
    return out
