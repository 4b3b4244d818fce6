"""FRONT's learngene and the copy-based baseline initialisations.

Everything works on ``torch.nn.Module`` parameters by name (only ``requires_grad`` parameters;
buffers are never transferred) and assumes timm's block naming ``blocks.{i}.<rest>``: the
per-block parameters are grouped by ``<rest>`` (``block_prefix`` selects another stack name,
e.g. ``model.layers`` for Llama-style models). Everything else maps 1:1 by name.

* :func:`extract` — standardise each parameter (scalar μ, σ), reshape it to 1-D/2-D and keep the
  low-frequency block of its unnormalised DCT: the :class:`Learngene` {C, μ, σ}.
* :func:`depth_transfer` — DCT over a group's stacked layers, keep ``min(L_t, L_s)`` depth
  frequencies, fill, inverse DCT at the target depth. Faithful: no amplitude compensation, so a
  12 → 4 reconstruction is ≈3× too large; ``depth_fix`` multiplies by L_t/L_s.
* :func:`front_init` — depth transfer + zero-padded / truncated inverse 2-D DCT into any width.
* :func:`truncation_init`, :func:`uniform_init`, :func:`weight_selection_init` — baselines.
* :func:`high_freq_energy`, :func:`high_freq_fraction` — the refinement's spectral regulariser.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .dct import dct, dct2, idct, idct2

__all__ = [
    "EPS",
    "FILLS",
    "SKIPS",
    "Gene",
    "Learngene",
    "TransferError",
    "block_key",
    "depth_transfer",
    "extract",
    "front_init",
    "high_freq_energy",
    "high_freq_fraction",
    "keep_count",
    "matrix_shape",
    "reconstruct",
    "truncation_init",
    "uniform_init",
    "weight_selection_init",
]

EPS = 1e-8  # the paper's σ + 1e-8 (LayerNorm weights have σ ≈ 0)
FILLS = ("zero", "random", "consistence", "repeat")
SKIPS = ("qkv", "o", "mlp", "norm")
MODES = ("1d", "2d", "mlp1d-rows", "mlp1d-cols")
FORMAT = "nshot.front.learngene/1"
_SAFETENSORS, _JSON = "learngene.safetensors", "learngene.json"

Params = nn.Module | Mapping[str, torch.Tensor]


class TransferError(ValueError):
    """A target parameter that cannot be mapped from the source (the message names it)."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"{name}: {reason}")
        self.name = name
        self.reason = reason


# ----------------------------------------------------------------------------- shapes and names


def matrix_shape(shape: Iterable[int]) -> tuple[int, ...]:
    """The 1-D or 2-D shape a parameter is transformed in (step 2 of the extraction).

    4-D (OC, IC, kH, kW) → (OC·IC, kH·kW); 3-D (a, b, c) → (a·b, c) (higher ranks:
    (s0·s1, rest)); then a 2-D shape with a singleton dimension becomes 1-D, as does a scalar.
    So cls_token (1, 1, W) → (W,), pos_embed (1, T, W) → (T, W), a bias (W,) stays (W,).
    """
    s = tuple(int(d) for d in shape)
    if len(s) == 0:
        return (1,)
    if len(s) >= 3:
        s = (s[0] * s[1], math.prod(s[2:]))
    if len(s) == 2 and 1 in s:
        return (s[0] * s[1],)
    return s


def keep_count(n: int, keep_ratio: float) -> int:
    """⌊n·r⌋ frequencies, at least 1 (and at most n)."""
    return max(1, min(n, math.floor(n * keep_ratio + 1e-9)))


def block_key(name: str, block_prefix: str = "blocks") -> tuple[str, int] | None:
    """``("attn.qkv.weight", 3)`` for ``blocks.3.attn.qkv.weight``; None for non-block names."""
    m = re.fullmatch(re.escape(block_prefix) + r"\.(\d+)\.(.+)", name)
    return (m.group(2), int(m.group(1))) if m else None


def _trainable(model: Params) -> dict[str, torch.Tensor]:
    if isinstance(model, nn.Module):
        return {n: p for n, p in model.named_parameters() if p.requires_grad}
    return dict(model)


def _groups(names: Iterable[str], block_prefix: str) -> tuple[dict[str, list[str]], list[str]]:
    """Per-block names grouped by their suffix (ordered by layer index), and the other names."""
    groups: dict[str, list[tuple[int, str]]] = {}
    other: list[str] = []
    for n in names:
        key = block_key(n, block_prefix)
        if key is None:
            other.append(n)
        else:
            groups.setdefault(key[0], []).append((key[1], n))
    return {g: [n for _, n in sorted(v)] for g, v in groups.items()}, other


def _depth(names: Iterable[str], block_prefix: str) -> int:
    return len({k[1] for n in names if (k := block_key(n, block_prefix)) is not None})


def _skipped_by(group: str, skip: Iterable[str]) -> str | None:
    """The ``skip`` entry that covers a group name (or non-block name), if any."""
    parts = group.split(".")
    for s in skip:
        if s == "qkv" and group.startswith("attn.qkv."):
            return s
        if s == "o" and group.startswith("attn.proj."):
            return s
        if s == "mlp" and group.startswith("mlp."):
            return s
        if s == "norm" and any(p.startswith("norm") for p in parts):
            return s
    return None


def _is_head(name: str) -> bool:
    return name.startswith("head.")


# ----------------------------------------------------------------------------- the learngene


@dataclass
class Gene:
    """One parameter's learngene: the kept DCT block ``coef`` of its standardised 1-D/2-D
    reshape, the scalar statistics ``mu``, ``sigma``, the parameter's full ``shape`` and the
    transform ``mode`` ("1d", "2d", "mlp1d-rows": DCT along dim 0 only, "mlp1d-cols": dim 1)."""

    coef: torch.Tensor
    mu: float
    sigma: float
    shape: tuple[int, ...]
    mode: str


@dataclass
class Learngene:
    """The learngene of a source ("ancestry") model: a :class:`Gene` per trainable parameter."""

    genes: dict[str, Gene]
    keep_ratio: float = 1.0
    mlp_dct_dim: str = "2d"
    source: dict[str, Any] = field(default_factory=dict)
    block_prefix: str = "blocks"

    @property
    def depth(self) -> int:
        """Number of ``{block_prefix}.{i}`` layers in the source."""
        return _depth(self.genes, self.block_prefix)

    def save(self, path: str | Path) -> Path:
        """Write ``learngene.safetensors`` (coefficients) + ``learngene.json`` into folder
        ``path``; returns the folder."""
        from safetensors.torch import save_file

        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        save_file(
            {n: g.coef.detach().cpu().contiguous() for n, g in self.genes.items()},
            str(folder / _SAFETENSORS),
        )
        meta = {
            "format": FORMAT,
            "keep_ratio": self.keep_ratio,
            "mlp_dct_dim": self.mlp_dct_dim,
            "block_prefix": self.block_prefix,
            "source": self.source,
            "genes": {
                n: {"mu": g.mu, "sigma": g.sigma, "shape": list(g.shape), "mode": g.mode}
                for n, g in self.genes.items()
            },
        }
        (folder / _JSON).write_text(json.dumps(meta, indent=1))
        return folder

    @classmethod
    def load(cls, path: str | Path) -> Learngene:
        """Read a folder written by :meth:`save` (safetensors + JSON; no pickle)."""
        from safetensors.torch import load_file

        from nshot.method import NshotError

        folder = Path(path)
        if not (folder / _JSON).is_file():
            raise NshotError(
                f"no {_JSON} in {folder} (write one with `python -m nshot.methods.front.tool "
                "extract`)"
            )
        meta = json.loads((folder / _JSON).read_text())
        if meta.get("format") != FORMAT:
            raise ValueError(f"{folder / _JSON}: not a {FORMAT} file")
        coefs = load_file(str(folder / _SAFETENSORS))
        if bad := sorted({g["mode"] for g in meta["genes"].values()} - set(MODES)):
            raise ValueError(f"{folder / _JSON}: unknown gene modes {bad}")
        genes = {
            n: Gene(coefs[n], float(g["mu"]), float(g["sigma"]), tuple(g["shape"]), g["mode"])
            for n, g in meta["genes"].items()
        }
        return cls(
            genes=genes,
            keep_ratio=float(meta["keep_ratio"]),
            mlp_dct_dim=meta["mlp_dct_dim"],
            source=meta["source"],
            block_prefix=meta.get("block_prefix", "blocks"),
        )


def _stats(t64: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scalar mean and unbiased std (0 for a one-element tensor)."""
    mu = t64.mean()
    sigma = t64.std() if t64.numel() > 1 else torch.zeros((), dtype=t64.dtype, device=t64.device)
    return mu, sigma


def _mode(name: str, shape2: tuple[int, ...], mlp_dct_dim: str) -> str:
    if len(shape2) == 1:
        return "1d"
    if mlp_dct_dim == "1d" and "mlp.fc1" in name:
        return "mlp1d-rows"
    if mlp_dct_dim == "1d" and "mlp.fc2" in name:
        return "mlp1d-cols"
    return "2d"


def extract(
    model: Params,
    keep_ratio: float = 1.0,
    mlp_dct_dim: str = "2d",
    source: dict[str, Any] | None = None,
    *,
    block_prefix: str = "blocks",
) -> Learngene:
    """The learngene of ``model`` (a module's trainable parameters, or a name → tensor map).

    θ̃ = (θ − μ)/(σ + 1e-8), reshaped by :func:`matrix_shape`; 1-D: C = dct(θ̃)[:⌊n·r⌋];
    2-D: C = dct2(θ̃)[:⌊h·r⌋, :⌊w·r⌋]; ``mlp_dct_dim="1d"``: ``mlp.fc1`` only along dim 0,
    ``mlp.fc2`` only along dim 1. Coefficients are kept in float32 (float64 for float64 params).
    """
    if not 0.0 < keep_ratio <= 1.0:
        raise ValueError(f"keep_ratio must be in (0, 1], got {keep_ratio}")
    if mlp_dct_dim not in ("1d", "2d"):
        raise ValueError(f"mlp_dct_dim must be '1d' or '2d', got {mlp_dct_dim!r}")
    genes: dict[str, Gene] = {}
    with torch.no_grad():
        for name, p in _trainable(model).items():
            t = p.detach().to(torch.float64)
            mu, sigma = _stats(t)
            shape2 = matrix_shape(t.shape)
            z = ((t - mu) / (sigma + EPS)).reshape(shape2)
            mode = _mode(name, shape2, mlp_dct_dim)
            if mode == "1d":
                c = dct(z)[: keep_count(shape2[0], keep_ratio)]
            else:
                kh, kw = keep_count(shape2[0], keep_ratio), keep_count(shape2[1], keep_ratio)
                if mode == "mlp1d-rows":
                    c = dct(z, dim=0)[:kh, :]
                elif mode == "mlp1d-cols":
                    c = dct(z, dim=1)[:, :kw]
                else:
                    c = dct2(z)[:kh, :kw]
            dtype = torch.float64 if p.dtype == torch.float64 else torch.float32
            genes[name] = Gene(
                coef=c.to(dtype).cpu().contiguous(),
                mu=float(mu),
                sigma=float(sigma),
                shape=tuple(int(d) for d in p.shape),
                mode=mode,
            )
    return Learngene(
        genes=genes,
        keep_ratio=float(keep_ratio),
        mlp_dct_dim=mlp_dct_dim,
        source=dict(source or {}),
        block_prefix=block_prefix,
    )


# ----------------------------------------------------------------------------- FRONT transfer


def depth_transfer(
    stack: torch.Tensor,
    target_depth: int,
    *,
    fill: str = "zero",
    depth_fix: bool = False,
    select_n: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Map a group's stacked per-layer coefficients ``[L_s, ...]`` to ``[L_t, ...]`` (float64).

    DCT along dim 0; keep the first ``n = min(L_t, L_s[, select_n])`` depth frequencies; fill:

    * ``zero``: zero rows up to L_t; ``random``: N(mean, std) of the kept coefficients (seeded by
      ``generator``); ``consistence``: the kept slices repeated in blocks (frequency i fills
      ``L_t // n`` (+1 for the first ``L_t % n``) consecutive rows, the reference's indices);
      then the inverse DCT *with length L_t*.
    * ``repeat`` (reference: pad to L_s): zero rows up to L_s, inverse DCT with length L_s, and
      target layer i takes reconstructed layer min(i, L_s − 1) (the reference indexes past the
      end when L_t > L_s; we reuse the last layer, as for μ, σ).

    Faithful default: no amplitude compensation (≈ L_s/L_t for zero fill). ``depth_fix``
    multiplies by L_out/L_s, L_out being the inverse DCT's length (L_t; L_s for ``repeat``, so
    there it is a no-op).
    """
    if fill not in FILLS:
        raise ValueError(f"fill must be one of {FILLS}, got {fill!r}")
    l_s, l_t = int(stack.shape[0]), int(target_depth)
    if l_s < 1 or l_t < 1:
        raise ValueError(f"depths must be positive, got L_s={l_s}, L_t={l_t}")
    n = min(l_t, l_s) if select_n is None else max(1, min(l_t, l_s, int(select_n)))
    spec = dct(stack.to(torch.float64), dim=0)
    kept = spec[:n]
    rest = tuple(spec.shape[1:])
    if fill == "repeat":
        full = spec.new_zeros((l_s, *rest))
        full[:n] = kept
    elif fill == "zero":
        full = spec.new_zeros((l_t, *rest))
        full[:n] = kept
    elif fill == "random":
        mean = float(kept.mean())
        std = float(kept.std()) if kept.numel() > 1 else 0.0
        full = torch.normal(mean, std, (l_t, *rest), generator=generator, dtype=torch.float64).to(
            spec.device
        )
        full[:n] = kept
    else:  # consistence
        base, rem = divmod(l_t, n)
        idx = [i for i in range(n) for _ in range(base + (1 if i < rem else 0))]
        full = kept[torch.tensor(idx, dtype=torch.long, device=spec.device)]
    l_out = full.shape[0]
    layers = idct(full, dim=0)
    if fill == "repeat":
        pick = torch.arange(l_t, device=spec.device).clamp(max=l_s - 1)
        layers = layers[pick]
    if depth_fix:
        layers = layers * (l_out / l_s)
    return layers


def reconstruct(
    coef: torch.Tensor,
    mode: str,
    target_shape: Iterable[int],
    *,
    use_ratio: bool = False,
    name: str = "?",
) -> torch.Tensor:
    """The standardised target tensor X (float64, in the 1-D/2-D shape of ``target_shape``)
    from coefficients: zero-pad/truncate to the target size, inverse DCT (2-D, 1-D, or along
    the hidden axis only in the ``mlp1d`` modes), × (h_t/h_c)(w_t/w_c) if ``use_ratio``."""
    shape2 = matrix_shape(target_shape)
    c = coef.to(torch.float64)
    if (mode == "1d") != (len(shape2) == 1) or c.dim() != len(shape2):
        raise TransferError(
            name,
            f"rank mismatch: source coefficients {tuple(c.shape)} ({mode}) for target shape "
            f"{tuple(target_shape)} (transformed as {shape2})",
        )
    if mode == "mlp1d-rows" and shape2[1] != c.shape[1]:
        raise TransferError(name, f"mlp 1d mode needs equal columns: {shape2} vs {tuple(c.shape)}")
    if mode == "mlp1d-cols" and shape2[0] != c.shape[0]:
        raise TransferError(name, f"mlp 1d mode needs equal rows: {shape2} vs {tuple(c.shape)}")
    pad = c.new_zeros(shape2)
    sl = tuple(slice(0, min(a, b)) for a, b in zip(shape2, c.shape))
    pad[sl] = c[sl]
    if mode in ("1d", "mlp1d-rows"):
        x = idct(pad, dim=0)
        ratio = shape2[0] / c.shape[0]
    elif mode == "mlp1d-cols":
        x = idct(pad, dim=1)
        ratio = shape2[1] / c.shape[1]
    elif mode == "2d":
        x = idct2(pad)
        ratio = (shape2[0] / c.shape[0]) * (shape2[1] / c.shape[1])
    else:
        raise ValueError(f"unknown gene mode {mode!r}")
    return x * ratio if use_ratio else x


def front_init(
    target: nn.Module,
    gene: Learngene,
    *,
    fill: str = "zero",
    use_ratio: bool = False,
    depth_fix: bool = False,
    skip: Iterable[str] = (),
    seed: int = 0,
    select_n: int | None = None,
) -> dict[str, Any]:
    """Initialise ``target``'s trainable parameters from a learngene, in place.

    Per-block groups go through :func:`depth_transfer` (n computed per group), then every
    parameter through :func:`reconstruct` and θ = X·σ + μ (target layer i uses source layer i's
    μ, σ, or the last source layer's when i ≥ L_s). The head is skipped when its class count
    differs; ``skip ⊆ {"qkv", "o", "mlp", "norm"}`` leaves those at their current init. Raises
    :class:`TransferError` (nothing copied) for a target parameter it cannot map. Returns
    ``{"transferred", "skipped", "depth": {"source", "target"}, "settings"}``.
    """
    skip = tuple(skip)
    if bad := [s for s in skip if s not in SKIPS]:
        raise ValueError(f"skip entries must be in {SKIPS}, got {bad}")
    if fill not in FILLS:
        raise ValueError(f"fill must be one of {FILLS}, got {fill!r}")
    prefix = gene.block_prefix
    params = _trainable(target)
    t_groups, t_other = _groups(params, prefix)
    s_groups, _ = _groups(gene.genes, prefix)
    gen = torch.Generator().manual_seed(int(seed))
    new: dict[str, torch.Tensor] = {}
    skipped: list[str] = []

    for group in sorted(t_groups):
        names = t_groups[group]
        if why := _skipped_by(group, skip):
            skipped += [f"{n} (skip {why})" for n in names]
            continue
        if group not in s_groups:
            raise TransferError(names[0], f"no '{prefix}.{{i}}.{group}' in the source")
        src = [gene.genes[n] for n in s_groups[group]]
        first = src[0]
        for s_name, g in zip(s_groups[group], src):
            if g.coef.shape != first.coef.shape or g.mode != first.mode:
                raise TransferError(names[0], f"source layers differ in shape/mode at {s_name}")
            if len(g.shape) != len(params[names[0]].shape):
                raise TransferError(
                    names[0],
                    f"rank mismatch: source {s_name} {g.shape}, target "
                    f"{tuple(params[names[0]].shape)}",
                )
        stack = torch.stack([g.coef for g in src])
        layers = depth_transfer(stack, len(names), fill=fill, depth_fix=depth_fix,
                                select_n=select_n, generator=gen)  # fmt: skip
        for i, n in enumerate(names):
            st = src[min(i, len(src) - 1)]
            x = reconstruct(layers[i], first.mode, params[n].shape, use_ratio=use_ratio, name=n)
            new[n] = x * st.sigma + st.mu

    for n in t_other:
        if why := _skipped_by(n, skip):
            skipped.append(f"{n} (skip {why})")
            continue
        if n not in gene.genes:
            raise TransferError(n, "no parameter of this name in the source")
        g, p = gene.genes[n], params[n]
        if len(g.shape) != p.dim():
            raise TransferError(n, f"rank mismatch: source {g.shape}, target {tuple(p.shape)}")
        if _is_head(n) and g.shape[0] != p.shape[0]:
            skipped.append(f"{n} (class count {g.shape[0]} -> {p.shape[0]})")
            continue
        x = reconstruct(g.coef, g.mode, p.shape, use_ratio=use_ratio, name=n)
        new[n] = x * g.sigma + g.mu

    with torch.no_grad():
        for n, v in new.items():
            p = params[n]
            p.copy_(v.reshape(p.shape).to(device=p.device, dtype=p.dtype))
    return {
        "transferred": [n for n in params if n in new],
        "skipped": skipped,
        "depth": {"source": gene.depth, "target": _depth(params, prefix)},
        "settings": {
            "keep_ratio": gene.keep_ratio,
            "mlp_dct_dim": gene.mlp_dct_dim,
            "fill": fill,
            "use_ratio": use_ratio,
            "depth_fix": depth_fix,
            "skip": list(skip),
            "select_n": select_n,
        },
    }


# ----------------------------------------------------------------------------- baselines


def _even_index(n_s: int, n_t: int) -> torch.Tensor:
    return torch.linspace(0, n_s - 1, n_t).round().long()


def _copy_into(dst: torch.Tensor, src: torch.Tensor, evenly: bool) -> None:
    """Copy ``src`` into ``dst`` per axis: the overlap ``[:min]`` (larger target axes keep their
    current values beyond it), or evenly spaced source indices where the target is smaller."""
    s = src.detach().to(device=dst.device, dtype=dst.dtype)
    dst_sl = []
    for ax, (n_t, n_s) in enumerate(zip(dst.shape, s.shape)):
        if evenly and n_t < n_s:
            s = s.index_select(ax, _even_index(n_s, n_t).to(s.device))
            dst_sl.append(slice(None))
        else:
            m = min(n_t, n_s)
            s = s.narrow(ax, 0, m)
            dst_sl.append(slice(0, m))
    dst[tuple(dst_sl)] = s


def _copy_init(
    target: nn.Module,
    source: Params,
    layer_of: Any,
    *,
    evenly: bool,
    block_prefix: str,
) -> dict[str, Any]:
    params = _trainable(target)
    src = _trainable(source)
    t_groups, t_other = _groups(params, block_prefix)
    s_groups, _ = _groups(src, block_prefix)
    plan: list[tuple[str, str]] = []
    skipped: list[str] = []
    layers: dict[int, int] = {}
    for group in sorted(t_groups):
        names = t_groups[group]
        if group not in s_groups:
            raise TransferError(names[0], f"no '{block_prefix}.{{i}}.{group}' in the source")
        s_names = s_groups[group]
        for i, n in enumerate(names):
            j = layer_of(i, len(names), len(s_names))
            if j is None:
                skipped.append(f"{n} (no source layer)")
                continue
            plan.append((n, s_names[j]))
            layers[i] = j
    for n in t_other:
        if n not in src:
            raise TransferError(n, "no parameter of this name in the source")
        if (
            _is_head(n)
            and src[n].dim() == params[n].dim()
            and src[n].shape[0] != params[n].shape[0]
        ):
            skipped.append(f"{n} (class count {src[n].shape[0]} -> {params[n].shape[0]})")
            continue
        plan.append((n, n))
    for n, s in plan:
        if src[s].dim() != params[n].dim():
            raise TransferError(
                n,
                f"rank mismatch: source {s} {tuple(src[s].shape)}, target {tuple(params[n].shape)}",
            )
    with torch.no_grad():
        for n, s in plan:
            _copy_into(params[n], src[s], evenly)
    return {
        "transferred": [n for n, _ in plan],
        "skipped": skipped,
        "depth": {"source": _depth(src, block_prefix), "target": _depth(params, block_prefix)},
        "layers": layers,
    }


def truncation_init(
    target: nn.Module, source: Params, *, block_prefix: str = "blocks"
) -> dict[str, Any]:
    """Copy the first L_t source layers and the top-left slice of every tensor (a target axis
    larger than the source's keeps its init beyond the overlap; target layers beyond L_s too).
    The head is skipped when the class count differs. ``report["layers"]``: target → source."""
    return _copy_init(
        target, source, lambda i, lt, ls: i if i < ls else None,
        evenly=False, block_prefix=block_prefix,
    )  # fmt: skip


def uniform_init(
    target: nn.Module, source: Params, *, block_prefix: str = "blocks"
) -> dict[str, Any]:
    """Uniform layer selection: target layer i ← source layer min(i·⌈L_s/L_t⌉, L_s − 1); width
    and head as in :func:`truncation_init`."""
    return _copy_init(
        target, source, lambda i, lt, ls: min(i * math.ceil(ls / lt), ls - 1),
        evenly=False, block_prefix=block_prefix,
    )  # fmt: skip


def weight_selection_init(
    target: nn.Module,
    source: Params,
    *,
    layers: str = "uniform",
    block_prefix: str = "blocks",
) -> dict[str, Any]:
    """Weight selection (Xu et al. 2024 style): layers as :func:`uniform_init` (``layers=
    "first"``: as :func:`truncation_init`, the paper's first-N choice), and per tensor axis the
    evenly spaced elements ``linspace(0, n_s − 1, n_t).round()`` where the target is smaller
    (larger: the overlap, the rest keeps its init)."""
    if layers == "uniform":
        pick = lambda i, lt, ls: min(i * math.ceil(ls / lt), ls - 1)  # noqa: E731
    elif layers == "first":
        pick = lambda i, lt, ls: i if i < ls else None  # noqa: E731
    else:
        raise ValueError(f"layers must be 'uniform' or 'first', got {layers!r}")
    return _copy_init(target, source, pick, evenly=True, block_prefix=block_prefix)


# ----------------------------------------------------------------------------- regulariser


def _spectra(model: Params) -> Iterable[tuple[torch.Tensor, tuple[int, ...]]]:
    """Per trainable parameter: the DCT (float64, differentiable) of its standardised 1-D/2-D
    reshape, σ detached."""
    for p in _trainable(model).values():
        t = p.to(torch.float64)
        mu = t.mean()
        sigma = t.detach().std() if t.numel() > 1 else t.new_zeros(())
        shape2 = matrix_shape(t.shape)
        z = ((t - mu) / (sigma + EPS)).reshape(shape2)
        yield (dct(z) if len(shape2) == 1 else dct2(z)), shape2


def _high(spec: torch.Tensor, shape2: tuple[int, ...], keep_ratio: float) -> torch.Tensor:
    sq = spec.square()
    if len(shape2) == 1:
        return sq[keep_count(shape2[0], keep_ratio) :].sum()
    kh, kw = keep_count(shape2[0], keep_ratio), keep_count(shape2[1], keep_ratio)
    return sq[kh:, :].sum() + sq[:kh, kw:].sum()


def high_freq_energy(model: Params, keep_ratio: float) -> torch.Tensor:
    """Σ over trainable parameters of the energy of dct2(θ̃) outside the kept top-left
    ``[⌊h·r⌋, ⌊w·r⌋]`` block (1-D: beyond ``⌊n·r⌋``); differentiable, in the parameters' dtype.
    Zero at ``keep_ratio`` 1.0 by construction."""
    if not 0.0 < keep_ratio <= 1.0:
        raise ValueError(f"keep_ratio must be in (0, 1], got {keep_ratio}")
    params = list(_trainable(model).values())
    if not params:
        return torch.zeros(())
    total = sum(_high(spec, shape2, keep_ratio) for spec, shape2 in _spectra(model))
    return total.to(params[0].dtype)


def high_freq_fraction(model: Params, keep_ratio: float) -> float:
    """High-frequency energy (as :func:`high_freq_energy`) / total energy of all standardised
    coefficients, in [0, 1]; no gradient."""
    if not 0.0 < keep_ratio <= 1.0:
        raise ValueError(f"keep_ratio must be in (0, 1], got {keep_ratio}")
    high = tot = 0.0
    with torch.no_grad():
        for spec, shape2 in _spectra(model):
            high += float(_high(spec, shape2, keep_ratio))
            tot += float(spec.square().sum())
    return high / tot if tot > 0 else 0.0
