"""Frozen per-pixel features of an RGB image (F2) and of its organised point cloud (F3): cfr's
backbone family (:mod:`nshot.nn.backbone`), chosen by the config
(:meth:`.config.CfrConfig.backbone_spec`). The method's code is the same for both kinds; the
``paper`` preset swaps the backbone.

* ``random-features`` (``features="random"``: ``smoke``, ``small``; options ``rgb_dim``,
  ``xyz_dim``, ``seed``): the paper's extractors are not available offline, so frozen random
  networks with a fixed seed stand in, never trained. RGB: three 3×3 conv + ReLU layers of
  ``rgb_dim / 3`` channels at strides 1, 2 and 4, each map bilinearly upsampled to the grid and
  concatenated (hypercolumns); 3-D: per-pixel geometric descriptors (x, y, z centred per image,
  the surface normal, and mean-curvature proxies from box filters of 3, 7 and 15 pixels)
  through a random two-layer tanh MLP, zero on invalid pixels. A point is valid unless it is
  exactly (0, 0, 0).
* ``dino-pointmae`` (``features="paper"``, §4.1, CFM's ``models/features.py``; options
  ``dino_path``, ``pointmae_path``, ``pointmae_groups``, ``pointmae_group_size``, the config's
  field names): F2 from DINO ViT-B/8 (:func:`nshot.nn.hfvit.load_vit`: the image in [0, 1]
  normalised with ImageNet's mean and std, the final-norm patch tokens, bilinearly upsampled to
  the grid, ``align_corners=False``); F3 from Point-MAE (:func:`nshot.nn.pointmae.load_pointmae`:
  group features of the valid points interpolated to every point, scattered to the grid, 3 × 3
  average pool and adaptive average pool back); the valid mask is where F3 does not sum to 0
  (CFM's ``xyz_mask``). One image at a time (CFM's batch of 1).

Both run on the device :func:`make_extractors` (or :func:`~nshot.nn.backbone.load_backbone`)
is given (the trainer's or the job's) and hand their features back on the CPU. Nothing is
downloaded, nothing is unpickled. A record (:meth:`PixelFeatures.record`) is the spec and the
SHA-256 of the weights; :func:`~nshot.nn.backbone.backbone_from_record` rebuilds or re-reads
the backbone and refuses other weights.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage
from torch import nn

from nshot.errors import CheckpointError, ConfigError
from nshot.nn.backbone import Backbone, BackboneKind, BackboneSpec, load_backbone, register_backbone

if TYPE_CHECKING:
    from .config import CfrConfig

RGB_MEAN, RGB_STD = 0.5, 0.25
N_DESCRIPTORS = 9


class PixelFeatures(Backbone):
    """A frozen pair of extractors: ``rgb`` (F2), ``xyz`` (F3), ``valid`` and a call giving
    both; ``rgb_dim`` and ``xyz_dim`` channels, images of side ``image_size`` (None: any)."""

    weights_in_checkpoint = False  # rebuilt (random) or re-read (paper) from the record
    rgb_dim: int
    xyz_dim: int
    image_size: int | None = None

    def rgb(self, rgb: np.ndarray) -> torch.Tensor:
        """n × H × W × 3 uint8 → n × H × W × C2 (CPU)."""
        raise NotImplementedError

    def xyz(self, xyz: np.ndarray) -> torch.Tensor:
        """n × H × W × 3 organised point clouds → n × H × W × C3 (CPU)."""
        raise NotImplementedError

    def valid(self, xyz: np.ndarray, f3: torch.Tensor) -> torch.Tensor:
        """n × H × W bool: the pixels with a point."""
        raise NotImplementedError

    def __call__(self, rgb: np.ndarray, xyz: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rgb(rgb), self.xyz(xyz)

    def record(self) -> dict[str, Any]:
        assert self.spec is not None, "a backbone built by load_backbone has its spec"
        return {**self.spec.to_dict(), "sha256": self.fingerprint()}


def _from_record(record: Mapping[str, Any], where: Any) -> PixelFeatures:
    """The recorded spec loaded again; its weights must have the recorded fingerprint."""
    spec = BackboneSpec.from_dict({k: v for k, v in record.items() if k != "sha256"})
    try:
        bb = load_backbone(spec)
    except ConfigError as err:
        raise CheckpointError(f"{where}: the recorded backbone does not load ({err})") from None
    if record.get("sha256") != bb.fingerprint():
        raise CheckpointError(
            f"{where}: the backbone {spec.kind!r} loaded from its record has other weights than "
            "the checkpoint was made with (its sha256 differs)"
        )
    return bb  # type: ignore[return-value]


def _options(kind: str, options: Mapping[str, Any], known: set[str]) -> None:
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"backbone {kind!r}: unknown option(s) {unknown}")


# --------------------------------------------------------------------------------------------
# random-features


class RandomNets(nn.Module):
    """The random extractors' weights (buffers): a function of the seed and the widths only."""

    def __init__(self, rgb_dim: int, xyz_dim: int, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        c = rgb_dim // 3
        self.strides = (1, 2, 2)
        for i, cin in enumerate((3, c, c)):
            w = torch.randn(c, cin, 3, 3, generator=g) * (2.0 / (cin * 9)) ** 0.5
            self.register_buffer(f"conv{i}_w", w)
            self.register_buffer(f"conv{i}_b", torch.randn(c, generator=g) * 0.1)
        hidden = max(xyz_dim, 32)
        self.register_buffer("w1", torch.randn(N_DESCRIPTORS, hidden, generator=g)
                             / N_DESCRIPTORS**0.5)  # fmt: skip
        self.register_buffer("b1", torch.randn(hidden, generator=g) * 0.1)
        self.register_buffer("w2", torch.randn(hidden, xyz_dim, generator=g) * (1.5 / hidden**0.5))
        self.register_buffer("b2", torch.randn(xyz_dim, generator=g) * 0.1)

    def convs(self) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
        return [(getattr(self, f"conv{i}_w"), getattr(self, f"conv{i}_b"), s)
                for i, s in enumerate(self.strides)]  # fmt: skip


class RandomFeatures(PixelFeatures):
    """Kind ``random-features``: the seeded random CNN and descriptor MLP (module docstring)."""

    kind = "random-features"

    def __init__(self, nets: RandomNets, spec: BackboneSpec | None = None) -> None:
        self.model, self.spec = nets, spec
        self.rgb_dim = 3 * int(nets.conv0_w.shape[0])
        self.xyz_dim = int(nets.w2.shape[1])

    @property
    def device(self) -> torch.device:
        return self.model.w1.device  # buffers only: the base class looks at parameters

    def copy(self) -> RandomFeatures:
        return RandomFeatures(copy.deepcopy(self.model), self.spec)

    @torch.no_grad()
    def rgb(self, rgb: np.ndarray) -> torch.Tensor:
        dev = self.device
        x = torch.from_numpy(np.ascontiguousarray(rgb)).float().permute(0, 3, 1, 2).to(dev)
        x = (x / 255.0 - RGB_MEAN) / RGB_STD
        size = x.shape[-2:]
        maps = []
        for w, b, stride in self.model.convs():
            x = F.relu(F.conv2d(x, w, b, stride=stride, padding=1))
            maps.append(F.interpolate(x, size=size, mode="bilinear", align_corners=False))
        return torch.cat(maps, 1).permute(0, 2, 3, 1).contiguous().cpu()

    @torch.no_grad()
    def xyz(self, xyz: np.ndarray) -> torch.Tensor:
        """Zero where invalid."""
        m, dev = self.model, self.device
        desc = torch.from_numpy(descriptors(xyz)).to(dev)
        h = torch.tanh(desc @ m.w1 + m.b1)
        out = torch.tanh(h @ m.w2 + m.b2)
        return (out * torch.from_numpy(valid_mask(xyz)).to(dev)[..., None]).cpu()

    def valid(self, xyz: np.ndarray, f3: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(valid_mask(xyz))


def _random_options(options: Mapping[str, Any]) -> tuple[int, int, int]:
    _options("random-features", options, {"rgb_dim", "xyz_dim", "seed"})
    rgb_dim, xyz_dim = int(options.get("rgb_dim", 96)), int(options.get("xyz_dim", 64))
    if rgb_dim < 3 or rgb_dim % 3:
        raise ConfigError("field 'rgb_dim': must be a positive multiple of 3 (three CNN layers)")
    if xyz_dim < 1:
        raise ConfigError("field 'xyz_dim': must be positive")
    return rgb_dim, xyz_dim, int(options.get("seed", 0))


def _random_problems(options: Mapping[str, Any]) -> list[str]:
    try:
        _random_options(options)
    except ConfigError as err:
        return [str(err)]
    return []


def _load_random(options: Mapping[str, Any]) -> RandomFeatures:
    return RandomFeatures(RandomNets(*_random_options(options)))


register_backbone(
    "random-features",
    BackboneKind(load=_load_random, problems=_random_problems, from_record=_from_record),
)


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


# --------------------------------------------------------------------------------------------
# dino-pointmae

#: the options that name a weight file, and what each must be
PAPER_FILES = {
    "dino_path": "a Hugging Face ViT folder or a timm / DINO .safetensors file",
    "pointmae_path": "Point-MAE's weights as .safetensors",
}


class DinoPointMAE(PixelFeatures):
    """Kind ``dino-pointmae``: DINO ViT-B/8 for RGB, Point-MAE for the point cloud (module
    docstring)."""

    kind = "dino-pointmae"

    def __init__(self, vit: Any, pmae: nn.Module, spec: BackboneSpec | None = None) -> None:
        self.vit, self.pmae, self.spec = vit, pmae, spec
        self.model = nn.ModuleDict({"vit": vit.model, "pointmae": pmae})
        self.rgb_dim, self.xyz_dim = int(vit.width), int(pmae.out_dim)
        self.image_size = int(vit.image_size)

    def copy(self) -> DinoPointMAE:
        return DinoPointMAE(dataclasses.replace(self.vit, model=copy.deepcopy(self.vit.model)),
                            copy.deepcopy(self.pmae), self.spec)  # fmt: skip

    @torch.no_grad()
    def rgb(self, rgb: np.ndarray) -> torch.Tensor:
        dev, out = self.device, []
        for img in rgb:
            x = torch.from_numpy(np.ascontiguousarray(img)).float().permute(2, 0, 1)[None] / 255.0
            tok = self.vit.patch_tokens(x.to(dev))
            up = F.interpolate(tok, size=img.shape[:2], mode="bilinear", align_corners=False)
            out.append(up[0].permute(1, 2, 0).cpu())
        return torch.stack(out).contiguous()

    @torch.no_grad()
    def xyz(self, xyz: np.ndarray) -> torch.Tensor:
        dev, out = self.device, []
        for pc in xyz:
            t = torch.from_numpy(np.ascontiguousarray(pc, dtype=np.float32)).to(dev)
            out.append(self.pmae.grid_features(t).cpu())
        return torch.stack(out).contiguous()

    def valid(self, xyz: np.ndarray, f3: torch.Tensor) -> torch.Tensor:
        """CFM's mask: F3 does not sum to 0."""
        return f3.sum(-1) != 0


def _paper_options(options: Mapping[str, Any]) -> tuple[Any, Any, int, int]:
    _options("dino-pointmae", options, {*PAPER_FILES, "pointmae_groups", "pointmae_group_size"})
    return (options.get("dino_path"), options.get("pointmae_path"),
            int(options.get("pointmae_groups", 1024)),
            int(options.get("pointmae_group_size", 128)))  # fmt: skip


def _paper_problems(options: Mapping[str, Any]) -> list[str]:
    _paper_options(options)
    missing = []
    for field, what in PAPER_FILES.items():
        value = options.get(field)
        if not value:
            missing.append(f"field '{field}' is not set ({what})")
        elif not Path(value).exists():
            missing.append(f"field '{field}': {value} does not exist")
    return missing


def _load_paper(options: Mapping[str, Any]) -> DinoPointMAE:
    from nshot.nn.backbone import raise_problems
    from nshot.nn.hfvit import load_vit
    from nshot.nn.pointmae import load_pointmae

    dino, pointmae, groups, group_size = _paper_options(options)
    raise_problems("backbone 'dino-pointmae'", _paper_problems(options))
    try:
        vit = load_vit(dino)
    except CheckpointError as e:
        raise ConfigError(f"field 'dino_path': {e}") from None
    try:
        pmae = load_pointmae(pointmae, groups, group_size)
    except CheckpointError as e:
        raise ConfigError(f"field 'pointmae_path': {e}") from None
    return DinoPointMAE(vit, pmae)


register_backbone(
    "dino-pointmae",
    BackboneKind(load=_load_paper, problems=_paper_problems, from_record=_from_record),
)


# --------------------------------------------------------------------------------------------
# the config's extractors

_LOADED: dict[tuple[str, str], PixelFeatures] = {}


def make_extractors(cfg: CfrConfig, device: torch.device | str | None = None) -> PixelFeatures:
    """The config's backbone (:meth:`.config.CfrConfig.backbone_spec`) on ``device`` (default:
    the CPU), loaded once per process and spec (one at a time), its widths and image side
    checked against the config's (a :class:`ConfigError` naming the field)."""
    spec = cfg.backbone_spec()
    key = (json.dumps(spec.to_dict(), sort_keys=True), str(torch.device(device or "cpu")))
    if key not in _LOADED:
        _LOADED.clear()  # one backbone at a time
        _LOADED[key] = load_backbone(spec, device)  # type: ignore[assignment]
    bb = _LOADED[key]
    assert isinstance(bb, PixelFeatures), spec.kind
    for field, have, what in (("rgb_dim", bb.rgb_dim, "channels"),
                              ("xyz_dim", bb.xyz_dim, "channels"),
                              ("grid", bb.image_size, "pixels of image side")):  # fmt: skip
        want = getattr(cfg, field)
        if have is not None and have != want:
            raise ConfigError(f"field '{field}': {want}, but backbone {spec.kind!r} "
                              f"({_where(spec)}) gives {have} {what}")  # fmt: skip
    return bb


def _where(spec: BackboneSpec) -> str:
    return ", ".join(f"{k} {v}" for k, v in spec.options.items() if k in PAPER_FILES) or "seeded"
