"""TimeMoDE's three stages under Ray Train (paper §3): pre-training on the multi-domain corpus,
few-shot fine-tuning from a pre-trained checkpoint, and training from scratch on the target.

A step draws its batch from a generator seeded by (seed, step, rank), so a resumed run sees what
an uninterrupted one sees. Pre-training batches mix domains (each sample's domain uniform over
the corpus's domains, its window uniform within it); every sample's Domain Prompt comes from a
different clean window of its own domain (paper §3.2). Fine-tuning and from-scratch batches draw
windows and exemplars from the target's few-shot set. Fine-tuning updates every parameter
(unless ``freeze`` names parts) at ``finetune_lr`` and restarts the EMA from the pre-trained
weights. The checkpoint holds the denoiser, its EMA, and per domain the exemplar bank and the
scaler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from nshot.nn.lm import model_device
from nshot.train import session
from nshot.train.checkpoint import load_checkpoint

from .config import TimeModeConfig
from .data import Corpus, Target, load_corpus, load_target
from .model import Diffusion, TimeModeState, build_state


@dataclass
class StageData:
    """The windows one stage trains on: per domain, scaled (n_d, L, C)."""

    names: list[str]
    windows: list[np.ndarray]
    lo: list[np.ndarray]
    hi: list[np.ndarray]


def stage_data(cfg: TimeModeConfig, seed: int = 0, n_shot: int | None = None) -> StageData:
    if cfg.stage == "pretrain":
        c: Corpus = load_corpus(cfg)
        return StageData(c.names, c.windows, [s.lo for s in c.scalers], [s.hi for s in c.scalers])
    t: Target = load_target(cfg, n_shot, seed)
    return StageData([t.name], [t.scaler.scale(t.shots)], [t.scaler.lo], [t.scaler.hi])


def batch(
    cfg: TimeModeConfig, data: StageData, step: int, rank: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x0, exemplar, t, ε, domain index) of one step, from a (seed, step, rank) generator."""
    rng = np.random.default_rng([cfg.seed, step, rank, 7])
    size = cfg.batch if cfg.stage == "pretrain" else cfg.target_batch
    dom = rng.integers(len(data.names), size=size)
    x0 = np.empty((size, *data.windows[0].shape[1:]), np.float32)
    ex = np.empty_like(x0)
    for i, d in enumerate(dom):
        w = data.windows[d]
        a = int(rng.integers(len(w)))
        b = (a + 1 + int(rng.integers(len(w) - 1))) % len(w) if len(w) > 1 else a
        x0[i], ex[i] = w[a], w[b]
    t = rng.integers(cfg.diffusion_steps, size=size)
    eps = rng.standard_normal(x0.shape).astype(np.float32)
    return (torch.from_numpy(x0), torch.from_numpy(ex), torch.from_numpy(t),
            torch.from_numpy(eps), torch.from_numpy(dom))  # fmt: skip


def loss_terms(
    cfg: TimeModeConfig, net: torch.nn.Module, diffusion: Diffusion, b: tuple, forward=None
) -> dict[str, torch.Tensor]:
    x0, ex, t, eps, _ = b
    xt = diffusion.q_sample(x0, t, eps)
    out = (forward or net)(xt, t, ex)
    inner = getattr(net, "module", net)
    ortho, bal = inner.regularisers(out.routings)
    mse = (out.eps - diffusion.target(x0, eps)).pow(2).mean()
    total = mse + cfg.w_p * ortho + cfg.w_a * bal
    ent = torch.zeros(())
    if out.routings:
        s = torch.stack([r.scores for r in out.routings])
        ent = -(s.clamp_min(1e-12).log() * s).sum(-1).mean()
    return {"loss": total, "mse": mse, "ortho": ortho, "balance": bal, "route_entropy": ent}


def new_state(cfg: TimeModeConfig, data: StageData, init: dict | None = None) -> TimeModeState:
    """A fresh state (seeded by ``cfg.seed``); with ``init``, the pre-trained denoiser's
    weights in both the net and the EMA; the bank and scaler of ``data``."""
    torch.manual_seed(cfg.seed + 17)
    state = build_state(cfg, len(data.names))
    if init is not None:
        net = {k[4:]: v for k, v in init.items() if k.startswith("ema.")}
        if not net:
            raise ValueError("init_from: the checkpoint holds no EMA denoiser weights")
        state.net.load_state_dict(net)
        state.ema.load_state_dict(net)
    rng = np.random.default_rng([cfg.data_seed, 404])
    for i, w in enumerate(data.windows):
        pick = rng.permutation(len(w))[: cfg.bank_size]
        state.set_bank(i, w[pick], data.lo[i], data.hi[i])
    return state


def trainable(cfg: TimeModeConfig, state: TimeModeState) -> list[torch.nn.Parameter]:
    frozen: set[int] = set()
    if cfg.stage == "finetune":
        for block in state.net.blocks:
            if "attention" in cfg.freeze:
                frozen |= {id(p) for p in block.attn.parameters()}
            if "shared_expert" in cfg.freeze:
                frozen |= {id(p) for p in block.mlp.shared.parameters()}
            if "prototypes" in cfg.freeze and block.mlp.routed:
                frozen.add(id(block.mlp.prototypes))
    params = [p for p in state.net.parameters() if id(p) not in frozen]
    for p in state.net.parameters():
        p.requires_grad_(id(p) not in frozen)
    return params


def new_optimizer(cfg: TimeModeConfig, state: TimeModeState) -> torch.optim.Optimizer:
    lr = cfg.finetune_lr if cfg.stage == "finetune" else cfg.lr
    return torch.optim.AdamW(trainable(cfg, state), lr=lr, weight_decay=cfg.weight_decay)


def init_weights(cfg: TimeModeConfig) -> dict | None:
    if cfg.stage != "finetune":
        return None
    ckpt = load_checkpoint(cfg.init_from, method="timemode")
    return ckpt.weights()


def fit(
    cfg: TimeModeConfig,
    data: StageData | None = None,
    *,
    init: dict | None = None,
    state: TimeModeState | None = None,
    opt: torch.optim.Optimizer | None = None,
    start: int = 0,
    rank: int = 0,
    forward: torch.nn.Module | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    before_step: Callable[[int], None] | None = None,
) -> TimeModeState:
    """The stage of ``cfg`` from step ``start`` to ``cfg.steps``, in process."""
    data = data or stage_data(cfg)
    state = state or new_state(cfg, data, init if init is not None else init_weights(cfg))
    opt = opt or new_optimizer(cfg, state)
    diffusion = Diffusion(cfg.diffusion_steps, prediction=cfg.prediction)
    params = [p for g in opt.param_groups for p in g["params"]]
    device = model_device(state.net)  # batches are drawn on the CPU and sent there
    state.net.train()
    for step in range(start + 1, cfg.steps + 1):
        if before_step is not None:
            before_step(step)
        b = tuple(v.to(device) for v in batch(cfg, data, step, rank))
        terms = loss_terms(cfg, state.net, diffusion, b, forward)
        opt.zero_grad(set_to_none=True)
        terms["loss"].backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        state.update_ema(ema_decay(cfg, step))
        if on_step is not None:
            on_step(step, {k: float(v.detach()) for k, v in terms.items()})
    state.net.eval()
    return state


def ema_decay(cfg: TimeModeConfig, step: int) -> float:
    """The EMA decay after optimiser step ``step`` (1-based): 0 (a copy of the weights) up to
    ``ema_start``, then ``min(ema, 1 − (1 + n)^−ema_warmup)`` with n = step − ema_start − 1,
    ema_pytorch's warm-up (inverse gamma 1). Without the warm-up, a decay of 0.999 over runs of
    a few hundred steps keeps most of the step-``ema_start`` weights: 0.999^200 = 0.82 of them
    after a 300-step fine-tune."""
    if cfg.ema == 0.0 or step <= cfg.ema_start:
        return 0.0
    if cfg.ema_warmup is None:
        return cfg.ema
    n = step - cfg.ema_start - 1
    return min(cfg.ema, 1.0 - (1.0 + n) ** -cfg.ema_warmup)


class _Forward(torch.nn.Module):
    """DDP wraps this: every parameter takes part in each reduction (an expert that no token
    chose, or the prompt encoder of a dense model, would otherwise stall it)."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x, t, ex):
        out = self.net(x, t, ex)
        out.eps = out.eps + 0.0 * sum(p.sum() for p in self.net.parameters() if p.requires_grad)
        return out

    def regularisers(self, routings):
        return self.net.regularisers(routings)


def run_record(cfg: TimeModeConfig, data: StageData) -> dict:
    return {"domains": list(data.names), "stage": cfg.stage, "system": cfg.system,
            "routing": cfg.routing, "corpus": cfg.corpus, "target": cfg.target}  # fmt: skip


def train_loop(cfg: TimeModeConfig) -> None:
    """One stage under Ray Train: the three loss terms and the routing entropy every
    ``log_every`` steps, a checkpoint (denoiser, EMA, optimiser, exemplar bank, scaler) every
    ``checkpoint_every`` and at the end. With several workers DDP averages the gradients and
    each worker draws its own batches."""
    ctx = session.context()
    torch.set_num_threads(cfg.torch_threads)
    data = stage_data(cfg)
    state = new_state(cfg, data, init_weights(cfg))
    state.to(ctx.device)  # the worker's GPU when it has one: denoiser, EMA, bank, scaler
    opt = new_optimizer(cfg, state)
    restored = session.restore(state, opt)
    start = restored.step if restored else 0
    forward = None
    if ctx.world_size > 1:
        forward = session.prepare_model(_Forward(state.net))
    window: list[dict[str, float]] = []
    record = run_record(cfg, data)

    def on_step(step: int, stats: dict[str, float]) -> None:
        window.append(stats)
        is_ckpt = step % cfg.checkpoint_every == 0 or step == cfg.steps
        if step % cfg.log_every == 0 or is_ckpt:
            metrics = {k: float(np.mean([w[k] for w in window])) for k in window[0]}
            session.report(metrics, step=step, model=state, optimizer=opt,
                           extra={"run": record}, checkpoint=is_ckpt,
                           samples=len(window) * (cfg.batch if cfg.stage == "pretrain"
                                                  else cfg.target_batch))  # fmt: skip
            window.clear()

    fit(cfg, data, state=state, opt=opt, start=start, rank=ctx.rank, forward=forward,
        on_step=on_step, before_step=lambda s: session.maybe_inject_fault(s, restored))  # fmt: skip


__all__ = ["fit", "stage_data", "train_loop"]
