"""Point-MAE's encoder (Pang et al. 2022), read from a local safetensors file in the key
layout of the authors' pre-training checkpoint, and the read-out of its group features onto an
organised point cloud's pixels that CFM uses for 3-D features (CFM's ``models/full_models.py``
and ``get_features_maps``; CFR §4.1 keeps it). Nothing here belongs to one method: a method
that needs Point-MAE features wraps :func:`load_pointmae` in its own backbone kind (cfr's
``dino-pointmae``, :mod:`nshot.methods.cfr.features`).

* Grouping: farthest-point sampling of ``num_group`` centres (from the first point, as the
  CUDA kernel of ``pointnet2_ops`` CFM calls), the ``group_size`` nearest points of each centre,
  coordinates relative to the centre.
* Tokeniser (Point-MAE's ``Encoder``, a mini-PointNet): ``first_conv`` (1×1 conv 3 → 128,
  BatchNorm, ReLU, 1×1 conv 128 → 256), max-pool over the group, the pooled feature
  concatenated to each point's, ``second_conv`` (512 → 512, BatchNorm, ReLU, 512 → 384),
  max-pool: one 384-d token per group.
* Transformer: position embedding of the centres (Linear 3 → 128, GELU, Linear 128 → 384)
  added before every block; 12 pre-norm blocks (6 heads, bias-free qkv, MLP ratio 4, exact
  GELU); the outputs of blocks 3, 7 and 11 through the final LayerNorm, concatenated: 1152
  channels per group centre.
* Per point: inverse-distance weights over the 3 nearest centres, ``1 / (d² + 1e-8)``
  (CFM's ``interpolating_points``); per pixel: the point features scattered onto the image
  grid (zero where there is no point), a 3 × 3 average pool (stride 1, no padding) and an
  adaptive average pool back to the grid (CFM's ``get_features_maps``).

**Weights.** Point-MAE's released ``pretrain.pth`` is a pickle, which nshot never loads:
convert it once in your own environment (where you trust the file) with

    python -c "import torch, safetensors.torch as s; sd = torch.load('pretrain.pth',
    map_location='cpu', weights_only=False)['base_model']; s.save_file({k: v.contiguous()
    for k, v in sd.items()}, 'pointmae_pretrain.safetensors')"

The loader strips the ``module.`` and ``MAE_encoder.`` prefixes (as CFM's
``load_model_from_ckpt``), ignores the decoder's tensors (``MAE_decoder.*``,
``decoder_pos_embed.*``, ``increase_dim.*``, ``mask_token``), and refuses, naming the key, a
missing, unknown or misshapen tensor (CFM loads with ``strict=False``, which would silently
keep random weights). Widths, depth and the tokeniser's widths are read off the shapes; heads
are 64 wide (Point-MAE: 6 of 64).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from nshot.errors import CheckpointError
from nshot.nn.hfclip import PICKLE_SUFFIXES

__all__ = ["PointMAE", "encoder_state", "farthest_points", "interpolate", "load_pointmae",
           "write_tiny_pointmae"]  # fmt: skip

STRIP = ("module.", "base_model.", "MAE_encoder.")
DECODER = ("MAE_decoder.", "decoder_pos_embed.", "increase_dim.", "mask_token")
FETCH = {12: (3, 7, 11), 8: (1, 4, 7), 4: (1, 2, 3)}  # CFM's blocks per depth


class MiniPointNet(nn.Module):
    """Point-MAE's ``Encoder``: one token per group of points."""

    def __init__(self, out: int = 384, c1: int = 128, c2: int = 256, c3: int = 512) -> None:
        super().__init__()
        self.first_conv = nn.Sequential(
            nn.Conv1d(3, c1, 1), nn.BatchNorm1d(c1), nn.ReLU(inplace=True), nn.Conv1d(c1, c2, 1)
        )
        self.second_conv = nn.Sequential(
            nn.Conv1d(2 * c2, c3, 1), nn.BatchNorm1d(c3), nn.ReLU(inplace=True),
            nn.Conv1d(c3, out, 1),
        )  # fmt: skip
        self.out = out

    def forward(self, groups: torch.Tensor) -> torch.Tensor:
        """groups [G, M, 3] → [G, out]."""
        g, m, _ = groups.shape
        f = self.first_conv(groups.transpose(2, 1))
        pooled = f.max(dim=2, keepdim=True).values
        f = self.second_conv(torch.cat([pooled.expand(-1, -1, m), f], dim=1))
        return f.max(dim=2).values


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, n, c))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Blocks(nn.Module):
    """Point-MAE's ``TransformerEncoder`` (its tensors are named ``blocks.blocks.N``)."""

    def __init__(self, dim: int, depth: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(dim, heads, hidden) for _ in range(depth)])


class PointMAE(nn.Module):
    """Point-MAE's encoder with CFM's grouping and read-out (module docstring)."""

    def __init__(
        self, trans_dim: int = 384, depth: int = 12, heads: int = 6, mlp: int = 1536,
        widths: tuple[int, int, int] = (128, 256, 512), pos_hidden: int = 128,
        num_group: int = 1024, group_size: int = 128,
    ) -> None:  # fmt: skip
        super().__init__()
        if depth not in FETCH:
            raise CheckpointError(f"Point-MAE depth {depth}: CFM reads blocks of depth 12, 8 or 4")
        self.encoder = MiniPointNet(trans_dim, *widths)
        self.pos_embed = nn.Sequential(
            nn.Linear(3, pos_hidden), nn.GELU(), nn.Linear(pos_hidden, trans_dim)
        )
        self.blocks = Blocks(trans_dim, depth, heads, mlp)
        self.norm = nn.LayerNorm(trans_dim)
        self.num_group, self.group_size = num_group, group_size
        self.fetch = FETCH[depth]

    @property
    def out_dim(self) -> int:
        return 3 * self.norm.normalized_shape[0]

    @torch.no_grad()
    def group(self, pts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """pts [N, 3] → (neighbourhoods [G, M, 3] relative to their centres, centres [G, 3])."""
        n = len(pts)
        g, m = min(self.num_group, n), min(self.group_size, n)
        centres = pts[farthest_points(pts, g)]
        idx = torch.cat([torch.cdist(c, pts).topk(m, dim=1, largest=False).indices
                         for c in centres.split(256)])  # fmt: skip
        return pts[idx] - centres[:, None, :], centres

    @torch.no_grad()
    def group_features(self, pts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """pts [N, 3] → (features [G, 3 · trans_dim], centres [G, 3])."""
        hood, centres = self.group(pts)
        x = self.encoder(hood)[None]
        pos = self.pos_embed(centres)[None]
        outs = []
        for i, blk in enumerate(self.blocks.blocks):
            x = blk(x + pos)
            if i in self.fetch:
                outs.append(self.norm(x)[0])
        return torch.cat(outs, dim=-1), centres

    @torch.no_grad()
    def point_features(self, pts: torch.Tensor) -> torch.Tensor:
        """pts [N, 3] → [N, 3 · trans_dim]: group features interpolated to every point."""
        feats, centres = self.group_features(pts)
        return interpolate(pts, centres, feats)

    @torch.no_grad()
    def grid_features(self, xyz: torch.Tensor) -> torch.Tensor:
        """xyz [S, S, 3] organised point cloud → [S, S, C] (CFM's ``get_features_maps``): a
        point is valid when none of its coordinates is 0; zero features where there is none."""
        s1, s2, _ = xyz.shape
        flat = xyz.reshape(-1, 3)
        keep = torch.nonzero((flat != 0).all(dim=1)).squeeze(1)
        full = flat.new_zeros(self.out_dim, s1 * s2)
        if len(keep):
            full[:, keep] = self.point_features(flat[keep]).T
        grid = full.reshape(1, self.out_dim, s1, s2)
        grid = F.adaptive_avg_pool2d(F.avg_pool2d(grid, 3, stride=1), (s1, s2))
        return grid[0].permute(1, 2, 0).contiguous()


def farthest_points(pts: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of ``k`` farthest-point samples of pts [N, 3], starting at point 0."""
    n = len(pts)
    idx = torch.zeros(k, dtype=torch.long, device=pts.device)
    dist = torch.full((n,), float("inf"), device=pts.device, dtype=pts.dtype)
    far = torch.zeros((), dtype=torch.long, device=pts.device)
    for i in range(k):
        idx[i] = far
        dist = torch.minimum(dist, ((pts - pts[far]) ** 2).sum(-1))
        far = dist.argmax()
    return idx


def interpolate(pts: torch.Tensor, centres: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    """Inverse squared-distance weights over the 3 nearest centres (CFM's
    ``interpolating_points``, ``1 / (d² + 1e-8)``); one centre: its features everywhere."""
    if len(centres) == 1:
        return feats.expand(len(pts), -1).clone()
    out = []
    for p in pts.split(8192):
        d2 = torch.cdist(p, centres) ** 2
        d, i = d2.topk(min(3, len(centres)), dim=1, largest=False)
        w = 1.0 / (d + 1e-8)
        w = w / w.sum(1, keepdim=True)
        out.append((feats[i] * w[..., None]).sum(1))
    return torch.cat(out)


# --------------------------------------------------------------------------------------------
# loading


def encoder_state(raw: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """The encoder's tensors of a Point-MAE state dict: prefixes stripped, the decoder's
    tensors dropped."""
    out: dict[str, torch.Tensor] = {}
    for key, t in raw.items():
        k = key
        changed = True
        while changed:
            changed = False
            for pre in STRIP:
                if k.startswith(pre):
                    k, changed = k[len(pre) :], True
        if k.startswith(DECODER):
            continue
        if k in out:
            raise CheckpointError(f"{where}: key {key!r} appears twice once prefixes are stripped")
        out[k] = t
    return out


def _shape(state: dict[str, torch.Tensor], key: str, ndim: int, where: str) -> tuple[int, ...]:
    if key not in state:
        raise CheckpointError(f"{where}: key {key!r} is missing (not a Point-MAE encoder)")
    if state[key].dim() != ndim:
        raise CheckpointError(
            f"{where}: key {key!r} has shape {tuple(state[key].shape)}; expected {ndim}-D"
        )
    return tuple(state[key].shape)


def load_pointmae(path: str | Path, num_group: int = 1024, group_size: int = 128) -> PointMAE:
    """Point-MAE's encoder from a safetensors file (module docstring), frozen, eval mode."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    p = Path(path)
    if p.suffix.lower() in PICKLE_SUFFIXES:
        raise CheckpointError(
            f"{p}: a pickle file ({p.suffix}) is never unpickled here; convert it to safetensors "
            "first (see nshot.nn.pointmae or methods/cfr/README.md)"
        )
    if not p.is_file():
        raise CheckpointError(f"{p}: no such file (a Point-MAE .safetensors file)")
    try:
        raw = load_file(str(p))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{p}: not a readable safetensors file ({e})") from None
    where = str(p)
    state = encoder_state(raw, where)
    c1 = _shape(state, "encoder.first_conv.0.weight", 3, where)[0]
    c2 = _shape(state, "encoder.first_conv.3.weight", 3, where)[0]
    c3 = _shape(state, "encoder.second_conv.0.weight", 3, where)[0]
    dim = _shape(state, "norm.weight", 1, where)[0]
    pos_hidden = _shape(state, "pos_embed.0.weight", 2, where)[0]
    mlp = _shape(state, "blocks.blocks.0.mlp.fc1.weight", 2, where)[0]
    pat = re.compile(r"blocks\.blocks\.(\d+)\.")
    depth = len({int(m.group(1)) for k in state if (m := pat.match(k))})
    model = PointMAE(dim, depth, max(1, dim // 64), mlp, (c1, c2, c3), pos_hidden, num_group,
                     group_size)  # fmt: skip
    want = model.state_dict()
    for k in sorted(want):
        if k not in state:
            raise CheckpointError(f"{where}: key {k!r} is missing (not a Point-MAE encoder)")
        if tuple(state[k].shape) != tuple(want[k].shape):
            raise CheckpointError(
                f"{where}: key {k!r} has shape {tuple(state[k].shape)}; the encoder read off "
                f"the other tensors expects {tuple(want[k].shape)}"
            )
    extra = sorted(set(state) - set(want))
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise CheckpointError(
            f"{where}: key {extra[0]!r}{more} has no place in Point-MAE's encoder"
        )
    model.load_state_dict(state, strict=True)
    model.eval()
    for q in model.parameters():
        q.requires_grad_(False)
    return model


def write_tiny_pointmae(
    path: str | Path, *, seed: int = 0, dim: int = 32, depth: int = 4,
    widths: tuple[int, int, int] = (8, 16, 32), prefix: str = "MAE_encoder.",
) -> Path:  # fmt: skip
    """A randomly initialised Point-MAE encoder at toy sizes, saved in the official key layout
    (``MAE_encoder.`` prefix, plus a decoder tensor the loader must ignore). For tests."""
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    model = PointMAE(dim, depth, max(1, dim // 64), 4 * dim, widths, 16)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("running_var"):
                buf.uniform_(0.5, 1.5)
            elif name.endswith("running_mean"):
                buf.normal_(0, 0.1)
    state = {prefix + k: v.contiguous() for k, v in model.state_dict().items()}
    state["mask_token"] = torch.zeros(1, 1, dim)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out))
    return out
