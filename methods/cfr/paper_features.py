"""The paper's frozen features (CFR §4.1, CFM's ``models/features.py``), from local weight
files only (nothing is downloaded, no pickle is loaded):

* F2: DINO ViT-B/8 (``dino_path``, read by :func:`nshot.nn.hfvit.load_vit`): the image in
  [0, 1] normalised with ImageNet's mean and std, the final-norm patch tokens of all 12 blocks
  (28 × 28 × 768 at 224²), bilinearly upsampled to the grid (``align_corners=False``);
* F3: Point-MAE (``pointmae_path``, read by :func:`.pointmae.load_pointmae`): group features
  of the valid points (no zero coordinate), interpolated to every point, scattered to the grid,
  3 × 3 average pool and adaptive average pool back (1152 channels);
* the valid mask: the pixels whose F3 does not sum to 0 (CFM's ``xyz_mask``).

Both networks run on the GPU when there is one (``cuda:0``), one image at a time (CFM's batch
of 1); the features come back to the CPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from nshot.errors import CheckpointError, ConfigError

from .config import CfrConfig


def check_paper(cfg: CfrConfig) -> None:
    """A :class:`ConfigError` naming every field that keeps the paper path from running."""
    missing = []
    if cfg.features == "paper":
        for field, what in (("dino_path", "a Hugging Face ViT folder or a timm / DINO "
                             ".safetensors file"),
                            ("pointmae_path", "Point-MAE's weights as .safetensors")):  # fmt: skip
            value = getattr(cfg, field)
            if not value:
                missing.append(f"field '{field}' is not set ({what})")
            elif not Path(value).exists():
                missing.append(f"field '{field}': {value} does not exist")
    if cfg.generator == "mvtec3d":
        if not cfg.data_path:
            missing.append("field 'data_path' is not set (the MVTec 3D-AD root)")
        elif not Path(cfg.data_path).is_dir():
            missing.append(f"field 'data_path': {cfg.data_path} is not a directory")
    if missing:
        raise ConfigError(
            f"cfr (preset {cfg.preset!r}, generator {cfg.generator}, features {cfg.features}) "
            "needs: " + "; ".join(missing) + ". See methods/cfr/README.md (Paper path)."
        )


def _device() -> torch.device:
    from nshot.train.trainer import local_device

    return local_device()


class PaperExtractors:
    """DINO ViT-B/8 and Point-MAE from the config's paths; the interface of
    :class:`.features.Extractors` (``rgb``, ``xyz``, ``valid``, call)."""

    def __init__(self, cfg: CfrConfig) -> None:
        from nshot.nn.hfvit import load_vit

        from .pointmae import load_pointmae

        check_paper(cfg)
        self.device = _device()
        try:
            self.vit = load_vit(cfg.dino_path or "")
        except CheckpointError as e:
            raise ConfigError(f"field 'dino_path': {e}") from None
        try:
            self.pmae = load_pointmae(cfg.pointmae_path or "", cfg.pointmae_groups,
                                      cfg.pointmae_group_size)  # fmt: skip
        except CheckpointError as e:
            raise ConfigError(f"field 'pointmae_path': {e}") from None
        if self.vit.width != cfg.rgb_dim:
            raise ConfigError(f"field 'rgb_dim': {cfg.rgb_dim}, but the ViT at "
                              f"{cfg.dino_path} gives {self.vit.width} channels")  # fmt: skip
        if self.pmae.out_dim != cfg.xyz_dim:
            raise ConfigError(f"field 'xyz_dim': {cfg.xyz_dim}, but the Point-MAE at "
                              f"{cfg.pointmae_path} gives {self.pmae.out_dim} channels")  # fmt: skip
        if self.vit.image_size != cfg.grid:
            raise ConfigError(f"field 'grid': {cfg.grid}, but the ViT at {cfg.dino_path} takes "
                              f"{self.vit.image_size}² images")  # fmt: skip
        self.vit.model.to(self.device)
        self.pmae.to(self.device)

    @torch.no_grad()
    def rgb(self, rgb: np.ndarray) -> torch.Tensor:
        """n × S × S × 3 uint8 → n × S × S × C2 (CPU)."""
        out = []
        for img in rgb:
            x = torch.from_numpy(np.ascontiguousarray(img)).float().permute(2, 0, 1)[None] / 255.0
            tok = self.vit.patch_tokens(x.to(self.device))
            up = F.interpolate(tok, size=img.shape[:2], mode="bilinear", align_corners=False)
            out.append(up[0].permute(1, 2, 0).cpu())
        return torch.stack(out).contiguous()

    @torch.no_grad()
    def xyz(self, xyz: np.ndarray) -> torch.Tensor:
        """n × S × S × 3 organised point clouds → n × S × S × C3 (CPU)."""
        out = []
        for pc in xyz:
            t = torch.from_numpy(np.ascontiguousarray(pc, dtype=np.float32)).to(self.device)
            out.append(self.pmae.grid_features(t).cpu())
        return torch.stack(out).contiguous()

    def valid(self, xyz: np.ndarray, f3: torch.Tensor) -> torch.Tensor:
        """CFM's mask: F3 does not sum to 0."""
        return f3.sum(-1) != 0

    def __call__(self, rgb: np.ndarray, xyz: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rgb(rgb), self.xyz(xyz)
