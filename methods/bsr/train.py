"""Stage 1: masked VideoMAE pretraining on the spectrum videos of the source subjects (montage A).

A step is one batch. The batch's clips and its tube masks come from a generator seeded by
``(seed, step, rank)`` and the learning rate is a function of the step (linear warm-up, cosine
to ``min_lr``), so a run resumed at step s continues as an uninterrupted one does. Band powers
are z-scored per source subject with that subject's own trials; videos are rendered per batch
(one matmul with the montage's interpolation matrix). ``val_frac`` of the clips are held out:
their masked MSE under a fixed set of masks is ``val_mae_mse``, in normalised-target units
(predicting 0 scores about 1). Two references put it in scale: ``PositionMean``, which predicts
each masked tubelet by its position's mean target and ignores the visible patches, and
``ridge_references``, a linear map from a few visible patches to the masked targets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch

from nshot.nn.backbone import load_backbone
from nshot.nn.lm import model_device
from nshot.train.trainer import Recipe, train

from .config import BsrConfig
from .data import (
    MONTAGE_A,
    Dataset,
    NormStats,
    band_powers,
    interpolation_matrix,
    load_dataset,
    montage_channels,
    montage_xy,
)
from .model import (
    VideoMAEBackbone,
    masked_loss,
    normalised_targets,
    patch_in_head,
    patchify,
    pretrain_param_groups,
    tokens_per_clip,
    tube_mask,
)


@dataclass
class Clips:
    """Normalised band powers (n, F, 3, C) of a montage's trials, and its matrix M."""

    powers: np.ndarray
    m: torch.Tensor
    grid: int

    def videos(self, idx: np.ndarray | slice) -> torch.Tensor:
        p = torch.from_numpy(np.ascontiguousarray(self.powers[idx], dtype=np.float32))
        v = p @ self.m.T
        return v.view(*v.shape[:-1], self.grid, self.grid)


def montage_m(cfg: BsrConfig, montage: str, scramble_seed: int | None = None) -> torch.Tensor:
    m, _ = interpolation_matrix(montage_xy(montage, scramble_seed), cfg.grid)
    return torch.from_numpy(m)


def raw_powers(cfg: BsrConfig, eeg: np.ndarray, montage: str = "A") -> np.ndarray:
    """Log band powers (n, F, 3, C_montage) of montage-A trials seen through ``montage``."""
    x = eeg if montage == "A" else eeg[:, montage_channels(montage)]
    return band_powers(x, cfg.sfreq, cfg.window, cfg.frames).astype(np.float32)


def source_clips(cfg: BsrConfig, ds: Dataset) -> tuple[Clips, NormStats, dict[str, NormStats]]:
    """The source subjects' clips on montage A (z-scored per subject), the population
    statistics (all source trials pooled) and each source subject's own statistics (the
    predictor's ``subject_id``)."""
    out, pooled, per_subject = [], [], {}
    for name in ds.names("source"):
        eeg, _ = ds.subject(name)
        p = raw_powers(cfg, eeg)
        pooled.append(p)
        per_subject[name] = NormStats.fit(p)
        out.append(per_subject[name].apply(p))
    stats = NormStats.fit(np.concatenate(pooled))
    clips = Clips(np.concatenate(out).astype(np.float32), montage_m(cfg, "A"), cfg.grid)
    return clips, stats, per_subject


def split_clips(cfg: BsrConfig, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Training and held-out clip indices (fixed by ``data_seed``)."""
    perm = np.random.default_rng([cfg.data_seed, 7]).permutation(n)
    n_val = max(1, int(round(cfg.val_frac * n)))
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def lr_at(cfg: BsrConfig, step: int) -> float:
    """VideoMAE's schedule: peak lr = base_lr · lr_ref_batch / 256 (the absolute peak of
    VideoMAE's recipe, not rescaled to our smaller batch), linear warm-up, cosine to min_lr."""
    peak = cfg.base_lr * cfg.lr_ref_batch / 256
    if step <= cfg.warmup_steps:
        return peak * step / max(cfg.warmup_steps, 1)
    frac = (step - cfg.warmup_steps) / max(cfg.steps - cfg.warmup_steps, 1)
    return cfg.min_lr + 0.5 * (peak - cfg.min_lr) * (1 + math.cos(math.pi * min(frac, 1.0)))


@torch.no_grad()
def held_out_mse(cfg: BsrConfig, model: torch.nn.Module, clips: Clips, idx: np.ndarray) -> float:
    """Masked MSE (in-head tubelets) on held-out clips under fixed masks."""
    was = model.training
    model.eval()
    dev = model_device(model)  # videos and masks are made on the CPU and sent there
    gen = torch.Generator().manual_seed(12345)
    total, n = 0.0, 0
    for s in range(0, len(idx), 64):
        b = idx[s : s + 64]
        v, m = clips.videos(b).to(dev), tube_mask(cfg, len(b), gen).to(dev)
        total += float(masked_loss(cfg, model, v, m)) * len(b)
        n += len(b)
    model.train(was)
    return total / max(n, 1)


class PositionMean(torch.nn.Module):
    """Reference predictor of the masked tubelets that ignores the visible ones: each masked
    token gets its position's mean normalised target over the training clips. ``mae_mse`` at
    this level means the pretrainer learned the layout of the head disc, not to read the
    visible patches."""

    def __init__(self, mean: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mean", mean)  # (L, D)

    def forward(self, pixel_values: torch.Tensor, bool_masked_pos: torch.Tensor) -> SimpleNamespace:
        b = pixel_values.shape[0]
        out = self.mean.expand(b, -1, -1)[bool_masked_pos].view(b, -1, self.mean.shape[-1])
        return SimpleNamespace(logits=out)

    @classmethod
    @torch.no_grad()
    def fit(cls, cfg: BsrConfig, clips: Clips, idx: np.ndarray) -> PositionMean:
        total = 0.0
        for s in range(0, len(idx), 64):
            total = total + normalised_targets(cfg, clips.videos(idx[s : s + 64])).sum(0)
        return cls(total / len(idx))


def ridge_references(cfg: BsrConfig, clips: Clips, train_idx: np.ndarray, val_idx: np.ndarray,
                     visible: tuple[int, ...] = (1, 2, 4), reps: int = 3,
                     lambdas: tuple[float, ...] = (1e1, 1e2, 1e3, 1e4, 1e5)) -> dict:  # fmt: skip
    """What the visible patches determine of the masked targets, linearly: per draw, ``k``
    in-head spatial patches are visible (at every temporal position) and a ridge regression
    from their pixels (standardised) to the normalised targets of the other in-head tubelets
    is fitted on the training clips (kernel form; its penalty chosen from ``lambdas`` on an
    80/20 split of them) and scored on the held-out clips, beside ``PositionMean`` on the same
    tubelets: {k: {"ridge": [...], "position_mean": [...], "lambda": [...], "visible": [...]}}."""
    t, s = tokens_per_clip(cfg)
    head = np.flatnonzero(patch_in_head(cfg).numpy())
    rng = np.random.default_rng([cfg.data_seed, 13])

    def tokens(patches: np.ndarray) -> np.ndarray:
        return (patches[None, :] + s * np.arange(t)[:, None]).ravel()

    def pixels_and_targets(idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        v = clips.videos(idx)  # rendered once; every draw takes its tokens from these
        return patchify(cfg, v), normalised_targets(cfg, v)

    train, val = pixels_and_targets(train_idx), pixels_and_targets(val_idx)

    def select(data: tuple[torch.Tensor, torch.Tensor], vis: np.ndarray, hid: np.ndarray):
        x, y = data
        return x[:, tokens(vis)].flatten(1).double(), y[:, tokens(hid)].flatten(1).double()

    def kernel_ridge(xa, ya, xb, lams):
        """Predictions at ``xb`` for every penalty, from one eigendecomposition of xa·xaᵀ."""
        w, u = torch.linalg.eigh(xa @ xa.T)
        mu = ya.mean(0)
        uty, cu = u.T @ (ya - mu), (xb @ xa.T) @ u
        return [cu @ (uty / (w + lam).clamp_min(1e-12)[:, None]) + mu for lam in lams]

    pm = PositionMean.fit(cfg, clips, train_idx).mean.double()
    out: dict[str, dict] = {}
    for k in visible:
        entry: dict[str, list] = {"ridge": [], "position_mean": [], "lambda": [], "visible": []}
        for _ in range(reps):
            vis = np.sort(rng.choice(head, size=k, replace=False))
            hid = np.setdiff1d(head, vis)
            xt, yt = select(train, vis, hid)
            xv, yv = select(val, vis, hid)
            m, sd = xt.mean(0), xt.std(0) + 1e-6
            xt, xv = (xt - m) / sd, (xv - m) / sd
            n_in = int(0.8 * len(xt))
            inner = [float(((p - yt[n_in:]) ** 2).mean())
                     for p in kernel_ridge(xt[:n_in], yt[:n_in], xt[n_in:], lambdas)]  # fmt: skip
            lam = lambdas[int(np.argmin(inner))]
            pred = kernel_ridge(xt, yt, xv, (lam,))[0]
            entry["ridge"].append(float(((pred - yv) ** 2).mean()))
            entry["position_mean"].append(float(((pm[tokens(hid)].flatten() - yv) ** 2).mean()))
            entry["lambda"].append(lam)
            entry["visible"].append(vis.tolist())
        out[str(k)] = entry
    return out


def renderer_record(cfg: BsrConfig, stats: NormStats, subjects: dict[str, NormStats]) -> dict:
    """What a checkpoint keeps about the rendering (the predictor re-renders requests)."""
    return {
        "channels": list(MONTAGE_A),
        "population_stats": stats.to_json(),
        "subject_stats": {name: s.to_json() for name, s in subjects.items()},
        "sfreq": cfg.sfreq,
        "samples": cfg.samples,
        "window": cfg.window,
    }


def new_backbone(cfg: BsrConfig) -> VideoMAEBackbone:
    """The backbone the config names (``backbone``: randomly initialised with ``seed``, the
    same on every rank, or the video foundation model the paper starts from), trainable."""
    return load_backbone(cfg.backbone_spec(), trainable=True)  # type: ignore[return-value]


def pretrain_optimizer(cfg: BsrConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """VideoMAE's pre-training AdamW (β = (0.9, 0.95), its weight-decay exemptions)."""
    return torch.optim.AdamW(
        pretrain_param_groups(model, cfg.weight_decay), lr=lr_at(cfg, 1), betas=(0.9, 0.95),
        foreach=True,
    )  # fmt: skip


def new_pretrainer(cfg: BsrConfig) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The backbone's pretrainer (:func:`new_backbone`) and its optimiser."""
    model = new_backbone(cfg).model
    return model, pretrain_optimizer(cfg, model)


def batch_loss(cfg: BsrConfig, model: torch.nn.Module, clips: Clips, train_idx: np.ndarray,
               step: int, rank: int = 0,
               forward: torch.nn.Module | None = None) -> tuple[torch.Tensor, int]:  # fmt: skip
    """The masked loss of the batch of ``(seed, step, rank)`` (clips and tube masks drawn on
    the CPU, sent to the model's device), through ``forward`` (DDP) when given; (loss, batch
    size)."""
    rng = np.random.default_rng([cfg.seed, step, rank])
    batch = rng.choice(train_idx, size=min(cfg.batch, len(train_idx)), replace=False)
    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
    mask = tube_mask(cfg, len(batch), gen)
    dev = model_device(model)
    videos, mask = clips.videos(batch).to(dev), mask.to(dev)
    loss = masked_loss(cfg, forward if forward is not None else model, videos, mask)
    if forward is not None and forward is not model:  # every parameter in DDP's reduction
        loss = loss + 0.0 * sum(p.sum() for p in model.parameters())
    return loss, len(batch)


def set_lr(cfg: BsrConfig, opt: torch.optim.Optimizer, step: int) -> None:
    for g in opt.param_groups:
        g["lr"] = lr_at(cfg, step)


def pretrain_step(cfg: BsrConfig, model: torch.nn.Module, opt: torch.optim.Optimizer,
                  clips: Clips, train_idx: np.ndarray, step: int, rank: int = 0,
                  forward: torch.nn.Module | None = None) -> tuple[float, int]:  # fmt: skip
    """One optimiser step on the batch of ``(seed, step, rank)`` outside the trainer (the step
    :class:`BsrRecipe` takes; ``examples/gpu_paper_check.py`` times it); (loss, batch size)."""
    set_lr(cfg, opt, step)
    loss, n = batch_loss(cfg, model, clips, train_idx, step, rank, forward)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss.detach()), n


class BsrRecipe(Recipe):
    """Masked pretraining: one AdamW step per batch at the step's learning rate (:func:`lr_at`).
    In a Ray run the report adds the learning rate and ``val_mae_mse``; in process
    (:func:`pretrain`) it keeps the loss curve of the ``log_every`` windows."""

    def __init__(self, cfg: BsrConfig, ds: Dataset | None = None) -> None:
        super().__init__(cfg)
        self.ds = ds
        self.curve: list[tuple[int, float]] = []

    def build(self) -> None:
        cfg = self.cfg
        ds = self.ds if self.ds is not None else load_dataset(cfg)
        self.clips, self.stats, self.subjects = source_clips(cfg, ds)
        self.train_idx, self.val_idx = split_clips(cfg, len(self.clips.powers))
        self.backbone = new_backbone(cfg)
        self.model = self.backbone.model
        self.optimizer = pretrain_optimizer(cfg, self.model)
        self.samples_per_step = min(cfg.batch, len(self.train_idx))

    def schedule(self) -> tuple[int, int, int]:
        steps, log_every, checkpoint_every = super().schedule()
        # in process nothing is checkpointed: the curve's windows end every log_every steps
        return steps, log_every, checkpoint_every if self.session else steps

    def loss(self, step: int, micro: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
        set_lr(self.cfg, self.optimizer, step)
        loss, _ = batch_loss(self.cfg, self.model, self.clips, self.train_idx, step, self.rank,
                             self.forward)  # fmt: skip
        return loss, {"loss": float(loss.detach())}

    def on_report(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        if not self.session:
            self.curve.append((step, metrics["loss"]))
            return metrics
        return {**metrics, "lr": lr_at(self.cfg, step),
                "val_mae_mse": held_out_mse(self.cfg, self.model, self.clips,
                                            self.val_idx)}  # fmt: skip

    def extra(self) -> dict:
        return {"renderer": renderer_record(self.cfg, self.stats, self.subjects),
                "backbone": self.backbone.record()}  # fmt: skip


def pretrain(cfg: BsrConfig, ds: Dataset | None = None) -> tuple[torch.nn.Module, dict]:
    """Stage 1 in one process (the reproduction's task): the pretrainer and its record
    (held-out ``mae_mse``, the loss curve)."""
    r = train(BsrRecipe(cfg, ds), session=False)
    model, clips, train_idx, val_idx = r.model, r.clips, r.train_idx, r.val_idx
    record = {"mae_mse": held_out_mse(cfg, model, clips, val_idx), "curve": r.curve,
              "renderer": renderer_record(cfg, r.stats, r.subjects),
              "mae_mse_position_mean": held_out_mse(
                  cfg, PositionMean.fit(cfg, clips, train_idx), clips, val_idx)}  # fmt: skip
    return model.eval(), record


def train_loop(cfg: BsrConfig) -> None:
    """Masked pretraining under Ray Train: every worker draws its own batches (DDP averages the
    gradients); the loss every ``log_every`` steps with ``val_mae_mse``, a checkpoint every
    ``checkpoint_every`` steps and at the end."""
    train(BsrRecipe(cfg))
