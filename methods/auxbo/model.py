"""The TNP-D surrogate P_θ of auxbo and its meta-training pieces.

The model reads a few-shot context ``{(x_i, f_i, h_i)}`` and predicts ``(μ, σ)`` of f at target
designs ``x*_j``:

* h-encoder (``use_h``): per context point, the frames of ``h_i ∈ R^{T × d_h}`` are embedded by
  ``Linear(d_h → d)`` plus a learned position embedding, a learned [CLS] token is prepended, and
  ``L_h`` pre-LN transformer layers run with a key-padding mask (padded frames are never read);
  ``c_h(h_i)`` is the output at [CLS].
* context token ``u_i = MLP_c([x_i, f_i]) + c_h(h_i)`` (f-only ablation: no ``c_h`` term);
  target token ``v_j = MLP_t(x*_j)`` (separate encoder).
* decoder: ``L`` pre-LN layers over ``[u; v]`` with the TNP-D mask: context rows attend to the
  (non-padded) context; target row j attends to the context and to itself only, so a target's
  prediction never depends on which other targets are scored with it.
* head: ``(μ, σ) = MLP(out_j)``, ``σ = 0.01 + softplus(·)`` (the floor keeps the NLL finite on
  near-noiseless f).

f is z-scored with one global mean/std per task family (:func:`family_stats`, fixed at
meta-training time); h is standardised per channel with the family's statistics too
(reconstruction: LCBench losses and accuracies live on different scales). Non-finite h entries
mark padded frames (a frame is padded when any of its channels is non-finite).

Checkpoints (:func:`save_tnp` / :func:`load_tnp`) are ``tnp.safetensors`` + ``tnp.json``; nothing
is pickled, and loading checks the format, the sha256 of the weights and every tensor's shape.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from nshot.hashing import sha256_file
from nshot.method import NshotError
from nshot.nn import Encoder
from nshot.train.checkpoint import LoadedCheckpoint

__all__ = [
    "SIGMA_FLOOR",
    "TNP",
    "TNPCheckpointError",
    "TNPConfig",
    "count_params",
    "evaluate_prediction",
    "f_only_plus_params",
    "family_stats",
    "nll_loss",
    "normalise_f",
    "normalise_h",
    "load_tnp",
    "sample_batch",
    "save_tnp",
]

SIGMA_FLOOR = 0.01
WEIGHTS_FILE = "tnp.safetensors"
META_FILE = "tnp.json"
FORMAT = "nshot-auxbo-tnp/1"


class TNPCheckpointError(NshotError, ValueError):
    """A TNP checkpoint folder is missing, corrupt or does not match its own config."""


# ----------------------------------------------------------------------------------------------
# config


@dataclass
class TNPConfig:
    """Sizes of the TNP. ``use_h=False`` is the f-only ablation (no h-encoder at all)."""

    x_dim: int
    h_len: int  # T_h: the longest h sequence the position embedding covers
    h_dim: int  # d_h: channels per frame
    d: int = 64
    heads: int = 4
    layers_h: int = 1
    layers: int = 3
    use_h: bool = True
    dropout: float = 0.0
    mlp_ratio: int = 2  # transformer MLP width = mlp_ratio * d

    def __post_init__(self) -> None:
        for name in ("x_dim", "h_len", "h_dim", "d", "heads", "layers", "mlp_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TNPConfig.{name} must be a positive int, got {value!r}")
        if isinstance(self.layers_h, bool) or not isinstance(self.layers_h, int):
            raise ValueError(f"TNPConfig.layers_h must be an int, got {self.layers_h!r}")
        if self.layers_h < (1 if self.use_h else 0):
            raise ValueError(f"TNPConfig.layers_h must be >= 1 with use_h, got {self.layers_h}")
        if self.d % self.heads:
            raise ValueError(f"TNPConfig.d={self.d} is not divisible by heads={self.heads}")
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"TNPConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if not isinstance(self.use_h, bool):
            raise ValueError(f"TNPConfig.use_h must be a bool, got {self.use_h!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TNPConfig:
        if not isinstance(data, dict):
            raise ValueError(f"TNPConfig must be read from a dict, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown TNPConfig field(s): {', '.join(unknown)}")
        return cls(**data)


# ----------------------------------------------------------------------------------------------
# model


def _mlp(d_in: int, d: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, d), nn.GELU(), nn.Linear(d, d))


class TNP(nn.Module):
    """TNP-D with an h-encoder; see the module docstring."""

    def __init__(self, cfg: TNPConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, mlp_dim = cfg.d, cfg.mlp_ratio * cfg.d
        if cfg.use_h:
            self.frame_embed = nn.Linear(cfg.h_dim, d)
            self.pos_embed = nn.Parameter(0.02 * torch.randn(cfg.h_len, d))
            self.cls = nn.Parameter(0.02 * torch.randn(d))
            self.h_encoder = Encoder(cfg.layers_h, d, cfg.heads, mlp_dim, cfg.dropout)
        self.ctx_encoder = _mlp(cfg.x_dim + 1, d)  # MLP_c([x, f])
        self.tgt_encoder = _mlp(cfg.x_dim, d)  # MLP_t(x*)
        self.decoder = Encoder(cfg.layers, d, cfg.heads, mlp_dim, cfg.dropout)
        self.head = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, 2))

    # -- pieces ---------------------------------------------------------------------------------
    def encode_h(self, hc: torch.Tensor, h_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``c_h``: ``hc [B, n, T, d_h]`` (z-scored), ``h_mask [B, n, T]`` (True = real frame)
        -> ``[B, n, d]``. Frames with ``h_mask`` False are never attended to."""
        b, n, t, dh = hc.shape
        if dh != self.cfg.h_dim:
            raise ValueError(f"h has {dh} channels per frame, the model expects {self.cfg.h_dim}")
        if t > self.cfg.h_len:
            raise ValueError(f"h has {t} frames, the model supports at most {self.cfg.h_len}")
        if h_mask is None:
            h_mask = torch.ones(b, n, t, dtype=torch.bool, device=hc.device)
        hc = torch.where(h_mask.unsqueeze(-1), hc, torch.zeros((), dtype=hc.dtype))
        tokens = self.frame_embed(hc.reshape(b * n, t, dh)) + self.pos_embed[:t]
        cls = self.cls.expand(b * n, 1, -1)
        tokens = torch.cat([cls, tokens], dim=1)  # [B*n, 1+T, d]
        keys = torch.cat(
            [torch.ones(b * n, 1, dtype=torch.bool, device=hc.device), h_mask.reshape(b * n, t)],
            dim=1,
        )
        mask = keys.unsqueeze(1).expand(b * n, t + 1, t + 1)  # every row may read CLS
        out = self.h_encoder(tokens, mask)
        return out[:, 0].reshape(b, n, self.cfg.d)

    @staticmethod
    def decoder_mask(ctx_mask: torch.Tensor, m: int) -> torch.Tensor:
        """Boolean ``[B, n+m, n+m]`` (True = may attend): every row reads the valid context
        columns and itself; nothing reads a padded context slot or another target."""
        b, n = ctx_mask.shape
        length = n + m
        cols = torch.cat(
            [ctx_mask, torch.zeros(b, m, dtype=torch.bool, device=ctx_mask.device)], dim=1
        )
        eye = torch.eye(length, dtype=torch.bool, device=ctx_mask.device)
        return cols.unsqueeze(1).expand(b, length, length) | eye

    def forward(
        self,
        xc: torch.Tensor,
        fc: torch.Tensor,
        hc: torch.Tensor | None,
        xt: torch.Tensor,
        ctx_mask: torch.Tensor | None = None,
        h_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``xc [B,n,D]``, ``fc [B,n]`` (z-scored), ``hc [B,n,T,d_h]`` (z-scored; ignored by an
        f-only model), ``xt [B,m,D]``, ``ctx_mask [B,n]`` (False = padding slot), ``h_mask
        [B,n,T]`` (False = padded frame) -> ``(μ [B,m], σ [B,m])`` in z units."""
        b, n, _ = xc.shape
        m = xt.shape[1]
        if xc.shape[-1] != self.cfg.x_dim or xt.shape[-1] != self.cfg.x_dim:
            raise ValueError(
                f"x has dimension {xc.shape[-1]}/{xt.shape[-1]}, the model expects {self.cfg.x_dim}"
            )
        if ctx_mask is None:
            ctx_mask = torch.ones(b, n, dtype=torch.bool, device=xc.device)
        ctx_mask = ctx_mask.to(torch.bool)
        # zero the padding slots: masked attention weights are exact zeros, but 0 * NaN = NaN
        keep = ctx_mask.unsqueeze(-1)
        zero = torch.zeros((), dtype=xc.dtype, device=xc.device)
        xc = torch.where(keep, xc, zero)
        fc = torch.where(ctx_mask, fc, zero)
        u = self.ctx_encoder(torch.cat([xc, fc.unsqueeze(-1)], dim=-1))
        if self.cfg.use_h:
            if hc is None:
                raise ValueError("this TNP uses h (use_h=True) but hc is None")
            if h_mask is None:
                h_mask = torch.ones(hc.shape[:3], dtype=torch.bool, device=hc.device)
            h_mask = h_mask.to(torch.bool) & ctx_mask.unsqueeze(-1)
            hc = torch.where(h_mask.unsqueeze(-1), hc, zero)
            u = u + self.encode_h(hc, h_mask)
        v = self.tgt_encoder(xt)
        out = self.decoder(torch.cat([u, v], dim=1), self.decoder_mask(ctx_mask, m))[:, n:]
        raw = self.head(out)
        mu = raw[..., 0]
        sigma = SIGMA_FLOOR + F.softplus(raw[..., 1])
        return mu, sigma


def count_params(cfg: TNPConfig) -> int:
    """Parameter count of ``TNP(cfg)``."""
    return sum(p.numel() for p in TNP(cfg).parameters())


def f_only_plus_params(cfg: TNPConfig) -> TNPConfig:
    """f-only(+p): ``use_h=False`` with the width d widened (in steps of ``heads``) so that the
    parameter count is closest to the full model's (the gain is not capacity)."""
    target = count_params(replace(cfg, use_h=True))
    best, best_gap = None, math.inf
    for d in range(cfg.d, 4 * cfg.d + 1, cfg.heads):
        cand = replace(cfg, use_h=False, d=d)
        count = count_params(cand)
        if abs(count - target) < best_gap:
            best, best_gap = cand, abs(count - target)
        if count >= target:  # the count grows with d: nothing further can be closer
            break
    assert best is not None
    return best


# ----------------------------------------------------------------------------------------------
# normalisation


def _finite_frames(h: np.ndarray) -> np.ndarray:
    """``h [..., T, d_h]`` -> bool ``[..., T]``: a frame is real when all its channels are finite."""
    return np.isfinite(h).all(axis=-1)


def family_stats(tasks: Sequence[Any]) -> dict[str, Any]:
    """Global z-scoring statistics of a task family, fixed at meta-training time.

    ``f_mean``/``f_std`` over every candidate of every task; ``h_mean``/``h_std`` (lists of
    ``d_h`` floats) per channel over every real frame. Stds are floored at 1e-6."""
    if not tasks:
        raise ValueError("family_stats needs at least one task")
    f = np.concatenate([np.asarray(t.f, dtype=np.float64).ravel() for t in tasks])
    f = f[np.isfinite(f)]
    if f.size == 0:
        raise ValueError("family_stats: no finite f value in the tasks")
    stats: dict[str, Any] = {"f_mean": float(f.mean()), "f_std": float(max(f.std(), 1e-6))}
    frames = []
    for t in tasks:
        h = np.asarray(t.h, dtype=np.float64)
        frames.append(h[_finite_frames(h)])  # [k, d_h]
    hf = np.concatenate(frames, axis=0) if frames else np.zeros((0, 1))
    if hf.size:
        stats["h_mean"] = [float(v) for v in hf.mean(axis=0)]
        stats["h_std"] = [float(max(v, 1e-6)) for v in hf.std(axis=0)]
    return stats


def normalise_f(f: np.ndarray | torch.Tensor, stats: dict[str, Any]) -> Any:
    return (f - stats["f_mean"]) / stats["f_std"]


def normalise_h(h: np.ndarray, stats: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """``h [..., T, d_h]`` -> (z-scored float32 h with padded frames zeroed, frame mask)."""
    h = np.asarray(h, dtype=np.float32)
    mask = _finite_frames(h)
    if "h_mean" in stats:
        h = (h - np.asarray(stats["h_mean"], dtype=np.float32)) / np.asarray(
            stats["h_std"], dtype=np.float32
        )
    h = np.where(mask[..., None], h, 0.0).astype(np.float32)
    return h, mask


# ----------------------------------------------------------------------------------------------
# meta-training pieces


def _shuffled_h_index(n_designs: int, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """For each design in ``idx``, a random *other* design of the same task (h-shuffle control)."""
    if n_designs < 2:
        return idx.copy()
    other = rng.integers(0, n_designs - 1, size=len(idx))
    return other + (other >= idx)  # skips idx itself, uniform over the rest


def _with_cross_h(task: Any, pool: Sequence[Any], rng: np.random.Generator) -> Any:
    """``task`` with each design's h replaced by that of a random design of a random other task
    of ``pool`` (the cross-task control)."""
    from types import SimpleNamespace

    name = getattr(task, "name", None)
    donors = [t for t in pool if getattr(t, "name", object()) != name] or list(pool)
    if not donors:
        raise ValueError("h_pool needs at least one task")
    h = np.stack(
        [
            np.asarray(donors[int(a)].h)[int(rng.integers(0, len(donors[int(a)].f)))]
            for a in rng.integers(0, len(donors), size=len(task.f))
        ]
    )
    if h.shape != np.asarray(task.h).shape:
        raise ValueError(f"h_pool's h has shape {h.shape[1:]}, the task {task.h.shape[1:]}")
    return SimpleNamespace(name=name, X=task.X, f=task.f, h=h)


def _pack(
    tasks: Sequence[Any],
    ctx: list[np.ndarray],
    tgt: list[np.ndarray],
    n_pad: int,
    stats: dict[str, Any],
    h_src: list[np.ndarray] | None = None,
) -> dict[str, torch.Tensor]:
    """Pads per-task context index sets to ``n_pad`` and stacks them into tensors."""
    b = len(tasks)
    m = len(tgt[0])
    d = tasks[0].X.shape[1]
    t_len, d_h = tasks[0].h.shape[1:]
    xc = np.zeros((b, n_pad, d), np.float32)
    fc = np.zeros((b, n_pad), np.float32)
    hc = np.zeros((b, n_pad, t_len, d_h), np.float32)
    h_mask = np.zeros((b, n_pad, t_len), bool)
    ctx_mask = np.zeros((b, n_pad), bool)
    xt = np.zeros((b, m, d), np.float32)
    ft = np.zeros((b, m), np.float32)
    for i, task in enumerate(tasks):
        c, j = ctx[i], tgt[i]
        n = len(c)
        hidx = c if h_src is None else h_src[i]
        xc[i, :n] = task.X[c]
        fc[i, :n] = normalise_f(np.asarray(task.f, np.float64)[c], stats)
        hz, hm = normalise_h(task.h[hidx], stats)
        hc[i, :n], h_mask[i, :n] = hz, hm
        ctx_mask[i, :n] = True
        xt[i] = task.X[j]
        ft[i] = normalise_f(np.asarray(task.f, np.float64)[j], stats)
    return {
        "xc": torch.from_numpy(xc),
        "fc": torch.from_numpy(fc),
        "hc": torch.from_numpy(hc),
        "ctx_mask": torch.from_numpy(ctx_mask),
        "h_mask": torch.from_numpy(h_mask),
        "xt": torch.from_numpy(xt),
        "ft": torch.from_numpy(ft),
    }


def sample_batch(
    tasks: Sequence[Any],
    batch_tasks: int,
    n_max: int,
    m_targets: int,
    rng: np.random.Generator,
    stats: dict[str, Any],
    h_shuffle: bool = False,
) -> dict[str, torch.Tensor]:
    """One meta-training batch: ``batch_tasks`` tasks (without replacement when there are
    enough), per task ``n ~ U{1..n_max}`` context and ``m_targets`` disjoint target designs.

    Returns ``xc [B,n_max,D]``, ``fc [B,n_max]``, ``hc [B,n_max,T,d_h]``, ``ctx_mask
    [B,n_max]`` (False = padding), ``h_mask [B,n_max,T]`` (False = padded frame), ``xt
    [B,m,D]``, ``ft [B,m]``; f and h z-scored with ``stats``. All tasks must share D and h's
    shape (one family)."""
    if not tasks:
        raise ValueError("sample_batch needs at least one task")
    pick = rng.choice(len(tasks), size=batch_tasks, replace=batch_tasks > len(tasks))
    chosen = [tasks[int(k)] for k in pick]
    ctx, tgt, h_src = [], [], []
    for task in chosen:
        size = len(task.f)
        if size < m_targets + 1:
            raise ValueError(
                f"task {getattr(task, 'name', '?')!r} has {size} designs, fewer than "
                f"m_targets + 1 = {m_targets + 1}"
            )
        n = int(rng.integers(1, min(n_max, size - m_targets) + 1))
        perm = rng.permutation(size)[: n + m_targets]
        c, j = perm[:n], perm[n:]
        ctx.append(c)
        tgt.append(j)
        h_src.append(_shuffled_h_index(size, c, rng) if h_shuffle else c)
    return _pack(chosen, ctx, tgt, n_max, stats, h_src)


def predict_batch(
    model: nn.Module, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(μ, σ)`` of a packed batch; ``model`` may be wrapped (DDP) around a :class:`TNP`. The
    batch (packed on the CPU) follows the model's device."""
    net = getattr(model, "module", model)
    device = next(net.parameters()).device
    return model(
        batch["xc"].to(device),
        batch["fc"].to(device),
        batch["hc"].to(device) if net.cfg.use_h else None,
        batch["xt"].to(device),
        batch["ctx_mask"].to(device),
        batch["h_mask"].to(device),
    )


def nll_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Gaussian NLL (nats per target, mean over targets and tasks) of ``batch["ft"]``."""
    mu, sigma = predict_batch(model, batch)
    return gaussian_nll(mu, sigma, batch["ft"].to(mu.device)).mean()


def gaussian_nll(mu: torch.Tensor, sigma: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Elementwise ``−log N(y; μ, σ²)``."""
    return 0.5 * ((y - mu) / sigma) ** 2 + torch.log(sigma) + 0.5 * math.log(2 * math.pi)


@torch.no_grad()
def evaluate_prediction(
    model: TNP,
    tasks: Sequence[Any],
    n_ctx_list: Sequence[int] = (1, 2, 5, 10, 20),
    m_targets: int = 32,
    stats: dict[str, Any] | None = None,
    seed: int = 0,
    h_shuffle: bool = False,
    batch_tasks: int = 64,
    h_pool: Sequence[Any] | None = None,
) -> dict[int, dict[str, float]]:
    """Few-shot prediction quality in z units on held-out targets.

    Per task, one seeded permutation fixes ``m_targets`` target designs and the context of size
    n is the next n designs (contexts are nested across n and disjoint from the targets).
    Returns ``{n: {"nll": mean nats per target, "mse": mean squared error of μ}}`` averaged over
    tasks and targets. ``h_shuffle``: every context h is replaced by the h of another random
    design of the same task (the control). ``h_pool``: every context h is replaced by the h of a
    random design of a random other task of ``h_pool`` (the cross-task control). Deterministic
    given ``seed``."""
    if stats is None:
        raise ValueError("evaluate_prediction needs the family stats used at meta-training")
    if h_shuffle and h_pool is not None:
        raise ValueError("h_shuffle and h_pool are two different controls; pick one")
    was_training = model.training
    model.eval()
    perms, shuffles = [], []
    tasks = list(tasks)
    for k, task in enumerate(tasks):
        rng = np.random.default_rng([seed, k, zlib.crc32(str(getattr(task, "name", k)).encode())])
        perms.append(rng.permutation(len(task.f)))
        shuffles.append(_shuffled_h_index(len(task.f), np.arange(len(task.f)), rng))
        if h_pool is not None:
            tasks[k] = _with_cross_h(task, h_pool, rng)
    out: dict[int, dict[str, float]] = {}
    for n in n_ctx_list:
        nll_sum, se_sum, count = 0.0, 0.0, 0
        for start in range(0, len(tasks), batch_tasks):
            group = list(range(start, min(start + batch_tasks, len(tasks))))
            chunk = [tasks[k] for k in group]
            for k in group:
                if len(perms[k]) < m_targets + n:
                    raise ValueError(
                        f"task {k} has {len(perms[k])} designs, fewer than m_targets + n = "
                        f"{m_targets + n}"
                    )
            tgt = [perms[k][:m_targets] for k in group]
            ctx = [perms[k][m_targets : m_targets + n] for k in group]
            h_src = [shuffles[k][c] for k, c in zip(group, ctx)] if h_shuffle else None
            batch = _pack(chunk, ctx, tgt, n, stats, h_src)
            mu, sigma = predict_batch(model, batch)
            ft = batch["ft"].to(mu.device)
            nll_sum += float(gaussian_nll(mu, sigma, ft).sum())
            se_sum += float(((mu - ft) ** 2).sum())
            count += mu.numel()
        out[int(n)] = {"nll": nll_sum / count, "mse": se_sum / count}
    model.train(was_training)
    return out


# ----------------------------------------------------------------------------------------------
# checkpoints


def save_tnp(
    model: TNP, stats: dict[str, Any], folder: str | Path, extra: dict[str, Any] | None = None
) -> Path:
    """Writes ``tnp.safetensors`` (weights) and ``tnp.json`` (format, config, stats, extra and
    the weights' sha256) into ``folder``; ``stats`` and ``extra`` must be JSON-serialisable."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    wpath = folder / WEIGHTS_FILE
    save_file(weights, str(wpath))
    meta = {
        "format": FORMAT,
        "config": model.cfg.to_dict(),
        "stats": stats,
        "extra": extra or {},
        "sha256": sha256_file(wpath),
    }
    tmp = folder / (META_FILE + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True))
    tmp.replace(folder / META_FILE)
    return folder


def load_tnp(folder: str | Path) -> tuple[TNP, dict[str, Any], dict[str, Any]]:
    """Reads a folder written by :func:`save_tnp` -> ``(model in eval mode, stats, extra)``.

    Raises :class:`TNPCheckpointError` naming the folder and the problem when a file is
    missing, the JSON is malformed or of another format, the weights' hash differs, or a tensor
    is missing, unexpected or of the wrong shape."""
    folder = Path(folder)
    mpath, wpath = folder / META_FILE, folder / WEIGHTS_FILE

    def fail(problem: str) -> TNPCheckpointError:
        return TNPCheckpointError(f"TNP checkpoint {folder}: {problem}")

    for p in (mpath, wpath):
        if not p.is_file():
            raise fail(f"missing file {p.name}")
    try:
        meta = json.loads(mpath.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise fail(f"{META_FILE} is not valid JSON ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise fail(f"{META_FILE} has format {got!r}, expected {FORMAT!r}")
    for key in ("config", "stats", "sha256"):
        if key not in meta:
            raise fail(f"{META_FILE} lacks {key!r}")
    stats = meta["stats"]
    if not isinstance(stats, dict) or not {"f_mean", "f_std"} <= set(stats):
        raise fail("stats must be a dict with f_mean and f_std")
    try:
        cfg = TNPConfig.from_dict(meta["config"])
    except (TypeError, ValueError) as err:
        raise fail(f"invalid config ({err})") from None
    digest = sha256_file(wpath)
    if digest != meta["sha256"]:
        raise fail(f"{WEIGHTS_FILE} is corrupt (sha256 {digest[:12]}… != {meta['sha256'][:12]}…)")
    try:
        weights = load_file(str(wpath))
    except (SafetensorError, OSError, ValueError) as err:
        raise fail(f"{WEIGHTS_FILE} cannot be read ({err})") from None
    model = TNP(cfg)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise fail(
            f"weights do not match the config (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    for k, v in expected.items():
        if weights[k].shape != v.shape:
            raise fail(f"tensor {k} has shape {tuple(weights[k].shape)}, expected {tuple(v.shape)}")
    model.load_state_dict(weights)
    model.eval()
    extra = meta.get("extra") or {}
    return model, stats, extra


def load_model(checkpoint: LoadedCheckpoint) -> tuple[TNP, dict[str, Any]]:
    """The TNP of an auxbo checkpoint (in eval mode) and the family statistics it reads."""
    extra = checkpoint.extra
    if "tnp" not in extra or "stats" not in extra:
        raise NshotError(f"{checkpoint.path}: not an auxbo surrogate checkpoint (no TNP config)")
    model = TNP(TNPConfig.from_dict(extra["tnp"]))
    model.load_state_dict(checkpoint.weights())
    model.eval()
    return model, dict(extra["stats"])
