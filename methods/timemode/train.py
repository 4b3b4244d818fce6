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
from nshot.train.checkpoint import load_checkpoint
from nshot.train.trainer import Recipe, train

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


class TimeModeRecipe(Recipe):
    """The stage of ``cfg``: one AdamW step per batch on the denoising loss with the routing
    regularisers, gradients clipped to ``grad_clip``, then the EMA update; the batches are
    drawn on the CPU and sent to the recipe's device. In process (``data`` given) ``on_step``
    sees each step's terms; a ``state`` given (with its ``optimizer``, or a fresh one) trains
    where it is."""

    def __init__(
        self,
        cfg: TimeModeConfig,
        data: StageData | None = None,
        *,
        init: dict | None = None,
        state: TimeModeState | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        on_step: Callable[[int, dict[str, float]], None] | None = None,
    ) -> None:
        super().__init__(cfg)
        self.data, self.init, self.on_step = data, init, on_step
        self.given = (state, optimizer)
        self.samples_per_step = cfg.batch if cfg.stage == "pretrain" else cfg.target_batch
        self.clip_grad_norm = cfg.grad_clip
        self.placed = False

    def build(self) -> None:
        cfg = self.cfg
        if self.data is None:
            self.data = stage_data(cfg)
        state, opt = self.given
        if state is None:
            init = self.init if self.init is not None else init_weights(cfg)
            state = new_state(cfg, self.data, init)
            state.to(self.device)  # denoiser, EMA, bank and scaler, before the optimiser
        elif not self.session:  # in process: where the given state is
            self.device = model_device(state.net)
        self.model = state
        self.optimizer = opt if opt is not None else new_optimizer(cfg, state)
        self.forward = _Forward(state.net) if self.world_size > 1 else state.net
        self.diffusion = Diffusion(cfg.diffusion_steps, prediction=cfg.prediction)
        self.record = run_record(cfg, self.data)

    def loss(self, step: int, micro: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
        b = tuple(v.to(self.device) for v in batch(self.cfg, self.data, step, self.rank))
        terms = loss_terms(self.cfg, self.model.net, self.diffusion, b, self.forward)
        return terms["loss"], {k: float(v.detach()) for k, v in terms.items()}

    def step(self, step: int) -> dict[str, float]:
        if not self.placed:  # an in-process run places the model on the CPU: back to its device
            self.model.to(self.device)
            self.placed = True
        stats = super().step(step)
        self.model.update_ema(ema_decay(self.cfg, step))
        if self.on_step is not None:
            self.on_step(step, stats)
        return stats

    def extra(self) -> dict:
        return {"run": self.record}


def fit(
    cfg: TimeModeConfig,
    data: StageData | None = None,
    *,
    init: dict | None = None,
    state: TimeModeState | None = None,
    opt: torch.optim.Optimizer | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> TimeModeState:
    """The stage of ``cfg`` in this process (a row of the experiments): a fresh state from
    ``init`` (the pre-trained weights; default: ``cfg.init_from``'s when fine-tuning), or
    ``state`` (with ``opt``) on its device; the denoiser comes back in eval mode."""
    recipe = TimeModeRecipe(cfg, data, init=init, state=state, optimizer=opt, on_step=on_step)
    state = train(recipe, session=False).model
    state.net.eval()
    return state


def train_loop(cfg: TimeModeConfig) -> None:
    """One stage under Ray Train: the three loss terms and the routing entropy every
    ``log_every`` steps, a checkpoint (denoiser, EMA, optimiser, exemplar bank, scaler) every
    ``checkpoint_every`` and at the end. With several workers DDP averages the gradients and
    each worker draws its own batches."""
    train(TimeModeRecipe(cfg))


__all__ = ["TimeModeRecipe", "fit", "stage_data", "train_loop"]
