"""The optimisation-based meta-learning baselines the paper compares modulation against.

All three meta-learn the initial weights θ of the plain HNN (the ``hnn_pooled`` row's network:
modulation ``none``, the same scalings and the same per-instance loss ``L_symp``) and adapt to
an instance by SGD on its weights, never through a latent code::

    for outer step 1..N_out (cfg.steps):
        B = random batch of training instances (cfg.batch_instances)
        for k in B:  support S_k = `shots` states evenly spread over one random trajectory of k
                     query Q_k   = `points_per_instance` random states of k (all: 0)
                     φ_k = θ; inner_steps × φ_k ← φ_k − inner_lr · clip(∇ L_symp(S_k; φ_k))
        fomaml:  g = Σ_k ∇_φ L_symp(Q_k; φ_k)      (first-order MAML: the gradient at φ_k, applied to θ)
        reptile: g = θ − mean_k φ_k                 (Reptile: θ moves towards the adapted weights)
        anil:    fomaml with the inner loop on the output layer only (first-order ANIL)
        θ ← Adam(lr) step on g (its norm clipped to grad_clip)

At test time each instance's weights start from θ and take ``test_inner_steps`` of the same SGD
steps on its 10 shots: one network per test instance, evaluated as a bank (``HNNBank``) like the
per-instance baseline.

The inner loops of a batch run together: a bank of ``B`` weight copies ``[B, ...]`` evaluated
with batched matrix products, so instance ``b``'s loss depends on copy ``b`` only and a summed
loss gives every copy its own gradient (plain SGD, per-instance gradient clipping: ``B``
independent inner loops). Tensors follow the model's device.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from nshot.train.trainer import Recipe
from nshot.train.trainer import train as train_recipe

from .config import ModHNNConfig
from .model import Dynamics, relative_loss, symplectic_gradient
from .systems import Split

ALGOS = ("fomaml", "reptile", "anil")
HEAD = ("net.out.weight", "damp.bias")  # ANIL's inner loop: the output layer (and damping)
# the damping's latent weight multiplies a zero latent in an unmodulated HNN: it never gets a
# gradient, so no loop adapts it
UNUSED = ("damp.weight",)

Params = dict[str, torch.Tensor]


def adapted_names(dyn: Dynamics, algo: str) -> list[str]:
    """The parameters the inner loop adapts: all of them, or the output layer for ANIL."""
    if algo not in ALGOS:
        raise ValueError(f"algo: unknown meta-learner {algo!r}; choose one of {ALGOS}")
    names = [n for n, _ in dyn.named_parameters() if n not in UNUSED]
    return [n for n in names if n in HEAD] if algo == "anil" else names


def expand(dyn: Dynamics, batch: int, adapted: list[str], *, track: bool) -> Params:
    """``batch`` copies of the weights: the adapted ones as fresh leaves ``[batch, ...]``, the
    others as views of θ (keeping θ's graph when ``track``, so an outer loss reaches it)."""
    out: Params = {}
    for name, p in dyn.named_parameters():
        src = p if (track and name not in adapted) else p.detach()
        rep = src[None].expand(batch, *p.shape)
        out[name] = rep.clone() if name in adapted else rep
    return out


def bank_energy(
    params: Params, x: torch.Tensor, x_scale: torch.Tensor, h_scale: torch.Tensor
) -> torch.Tensor:
    """The plain HNN's scaled energy ``H̃ [B, N]`` at ``x [B, N, 2]``, instance ``b`` through
    weight copy ``b`` (``Dynamics.forward`` of modulation ``none``, batched over copies)."""
    h = x / x_scale
    i = 0
    while f"net.weights.{i}" in params:
        w, b = params[f"net.weights.{i}"], params[f"net.biases.{i}"]
        h = torch.tanh(torch.einsum("bni,boi->bno", h, w) + b[:, None, :])
        i += 1
    out = torch.einsum("bni,boi->bno", h, params["net.out.weight"])
    return h_scale * out[..., 0]


def bank_field(
    params: Params,
    x: torch.Tensor,
    x_scale: torch.Tensor,
    h_scale: torch.Tensor,
    *,
    create_graph: bool,
) -> torch.Tensor:
    """``(q̇, ṗ) [B, N, 2]``: the symplectic gradient of :func:`bank_energy` (minus the
    damping ``softplus(bias)·∂H̃/∂p`` on ṗ for a dissipative system, the unmodulated damping)."""
    f, g = symplectic_gradient(
        lambda s: bank_energy(params, s, x_scale, h_scale), x, create_graph=create_graph
    )
    if "damp.bias" in params:
        d = nn.functional.softplus(params["damp.bias"].to(x.dtype))[:, None, :]  # [B, 1, 1]
        f = torch.cat([f[..., :1], f[..., 1:] - d * g[..., 1:]], dim=-1)
    return f


def inner_loop(
    dyn: Dynamics,
    params: Params,
    adapted: list[str],
    x: torch.Tensor,
    f: torch.Tensor,
    *,
    steps: int,
    lr: float,
    clip: float,
) -> tuple[Params, torch.Tensor, torch.Tensor]:
    """``steps`` plain SGD steps of every copy's adapted weights on its own ``L_symp`` at
    ``x, f [B, n, 2]`` (each copy's gradient clipped to norm ``clip``; 0: off). Returns the
    adapted copies (detached leaves; the others untouched) and the relative loss per copy
    before and after ``[B]``."""
    scale = float(dyn.spec.loss_scale)
    params = dict(params)
    first = None
    for _ in range(steps):
        leaves = [params[n].detach().requires_grad_(True) for n in adapted]
        p = {**params, **dict(zip(adapted, leaves))}
        per = relative_loss(bank_field(p, x, dyn.x_scale, dyn.h_scale, create_graph=True), f)
        if first is None:
            first = per.detach()
        grads = torch.autograd.grad(scale * per.sum(), leaves)
        factor = torch.ones(x.shape[0], device=x.device, dtype=x.dtype)
        if clip > 0:
            norm = torch.sqrt(sum(g.pow(2).flatten(1).sum(1) for g in grads))  # type: ignore[arg-type]
            factor = clip / norm.clamp_min(clip)
        for n, leaf, g in zip(adapted, leaves, grads):
            fac = factor.view(-1, *([1] * (g.dim() - 1)))
            params[n] = (leaf - lr * fac * g).detach()
    with torch.enable_grad():
        p = {n: (v.detach() if n in adapted else v) for n, v in params.items()}
        last = relative_loss(bank_field(p, x, dyn.x_scale, dyn.h_scale, create_graph=False), f)
    last = last.detach()
    return params, (last if first is None else first), last


class HNNBank(Dynamics):
    """``K`` plain HNNs of one architecture, one per test instance (weight copies ``[K, ...]``
    adapted from θ), with θ's fixed scalings: evaluated by ``evaluate_dynamics`` like the
    per-instance baseline's bank (instance ``k`` of a batch through network ``k``)."""

    def __init__(self, dyn: Dynamics, params: Params) -> None:
        nn.Module.__init__(self)
        self.spec = replace(dyn.spec)
        self.names = list(params)
        self.bank = nn.ParameterDict(
            {n.replace(".", "__"): nn.Parameter(v.detach().clone()) for n, v in params.items()}
        )
        self.register_buffer("x_scale", dyn.x_scale.detach().clone())
        self.register_buffer("f_scale", dyn.f_scale.detach().clone())
        self.register_buffer("h_scale", dyn.h_scale.detach().clone())
        self.damp = None

    @property
    def uses_latent(self) -> bool:
        return False

    def params(self) -> Params:
        return {n: self.bank[n.replace(".", "__")] for n in self.names}

    def forward(self, x, z=None, mods=None):  # type: ignore[override]
        return bank_energy(self.params(), x, self.x_scale, self.h_scale)

    def field(self, x, z=None, *, create_graph=False, fn=None):  # type: ignore[override]
        f = bank_field(self.params(), x, self.x_scale, self.h_scale, create_graph=create_graph)
        return f if create_graph else f.detach()


def adapt_weights(
    dyn: Dynamics, x: torch.Tensor, f: torch.Tensor, *, algo: str, steps: int, lr: float,
    clip: float,
) -> tuple[HNNBank, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Adapt θ (``dyn``, left unchanged) to every instance's shots ``x, f [K, n, 2]`` with the
    meta-learner's inner loop: ``(bank of K adapted HNNs, fit before [K], fit after [K])`` (the
    relative loss on the shots)."""
    dev = next(dyn.parameters()).device
    x, f = x.to(dev), f.to(dev)
    adapted = adapted_names(dyn, algo)
    params = expand(dyn, x.shape[0], adapted, track=False)
    params, before, after = inner_loop(dyn, params, adapted, x, f, steps=steps, lr=lr, clip=clip)
    bank = HNNBank(dyn, {n: v.detach().clone() for n, v in params.items()})
    bank.eval()
    return bank, before, after


class OptMetaRecipe(Recipe):
    """First-order MAML, Reptile or first-order ANIL meta-training of θ, one outer step per
    trainer step (``step()`` does the whole update: the inner loops, the outer gradient and the
    Adam step). Reports the mean relative query loss at the adapted weights of the steps since
    the last report and the support loss before/after the inner loop."""

    def __init__(
        self,
        cfg: ModHNNConfig,
        train: Split,
        *,
        algo: str,
        seed: int,
        progress: Callable[[int, float], None] | None = None,
    ) -> None:
        super().__init__(cfg)
        if algo not in ALGOS:
            raise ValueError(f"algo: unknown meta-learner {algo!r}; choose one of {ALGOS}")
        self.train_split = train
        self.algo = algo
        self.seed = seed
        self.progress = progress

    def build(self) -> None:
        from .adapt import shot_indices
        from .train import make_spec

        cfg, train = self.cfg, self.train_split
        torch.manual_seed(self.seed)
        self.spec = make_spec(cfg, train, kind="hnn", modulation="none")
        self.model = dyn = Dynamics(self.spec)
        dyn.to(self.device)
        self.X = torch.as_tensor(train.x, dtype=torch.float32, device=self.device)  # [K,T,S,2]
        self.F = torch.as_tensor(train.f, dtype=torch.float32, device=self.device)
        K, _, S, _ = self.X.shape
        self.shot_idx = torch.as_tensor(shot_indices(S, cfg.shots), device=self.device)
        self.batch = max(1, min(cfg.batch_instances, K))
        self.adapted = adapted_names(dyn, self.algo)
        self.optimizer = torch.optim.Adam(dyn.parameters(), lr=cfg.lr)
        self.samples_per_step = self.batch
        self.window: list[dict[str, float]] = []
        self.t_last = time.time()
        self.curve: list[float] = []

    def schedule(self) -> tuple[int, int, int]:
        steps, log_every, _ = super().schedule()
        return steps, log_every, steps  # in-process: a curve point every log_every

    def _batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        rng = np.random.default_rng([self.seed, step])
        K, T, S, _ = self.X.shape
        idx = torch.as_tensor(rng.choice(K, self.batch, replace=False), device=self.device)
        traj = torch.as_tensor(rng.integers(T, size=self.batch), device=self.device)
        sx = self.X[idx, traj][:, self.shot_idx]  # [B, shots, 2]
        sf = self.F[idx, traj][:, self.shot_idx]
        qx, qf = self.X[idx].reshape(self.batch, -1, 2), self.F[idx].reshape(self.batch, -1, 2)
        n = cfg.points_per_instance
        if n and n < qx.shape[1]:
            sel = torch.as_tensor(rng.choice(qx.shape[1], n, replace=False), device=self.device)
            qx, qf = qx[:, sel], qf[:, sel]
        return sx, sf, qx, qf

    def step(self, step: int) -> dict[str, float]:
        cfg, dyn = self.cfg, self.model
        sx, sf, qx, qf = self._batch(step)
        dyn.train()
        track = self.algo != "reptile"  # the outer loss reaches the shared weights
        params = expand(dyn, self.batch, self.adapted, track=track)
        params, before, after = inner_loop(
            dyn, params, self.adapted, sx, sf, steps=cfg.inner_steps, lr=cfg.inner_lr,
            clip=cfg.inner_clip,
        )  # fmt: skip
        self.optimizer.zero_grad(set_to_none=True)
        named = dict(dyn.named_parameters())
        if self.algo == "reptile":
            with torch.enable_grad():
                per = relative_loss(
                    bank_field(params, qx, dyn.x_scale, dyn.h_scale, create_graph=False), qf
                ).detach()
            for n in self.adapted:
                named[n].grad = named[n].detach() - params[n].mean(0)
        else:
            leaves = {n: params[n].requires_grad_(True) for n in self.adapted}
            p = {**params, **leaves}
            per = relative_loss(bank_field(p, qx, dyn.x_scale, dyn.h_scale, create_graph=True), qf)
            (float(dyn.spec.loss_scale) * per.sum()).backward()
            for n, leaf in leaves.items():  # first order: the gradient at φ_k, summed over k
                g = leaf.grad.sum(0)
                named[n].grad = g if named[n].grad is None else named[n].grad + g
            per = per.detach()
        if cfg.grad_clip:
            nn.utils.clip_grad_norm_(dyn.parameters(), cfg.grad_clip)
        self.optimizer.step()
        stats = {
            "loss": float(per.mean()),
            "support_before": float(before.mean()),
            "support_after": float(after.mean()),
        }
        self.window.append(stats)
        return stats

    def on_report(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        means = {k: float(np.mean([w[k] for w in self.window])) for k in self.window[0]}
        means["step_s"] = (time.time() - self.t_last) / max(len(self.window), 1)
        self.window = []
        self.t_last = time.time()
        self.curve.append(means["loss"])
        if self.progress is not None:
            self.progress(step, means["loss"])
        return means

    def extra(self) -> dict[str, Any]:
        return {"spec": self.spec.to_dict(), "system": self.train_split.system,
                "algo": self.algo}  # fmt: skip


def meta_train_opt(
    cfg: ModHNNConfig,
    train: Split,
    *,
    algo: str,
    seed: int,
    progress: Callable[[int, float], None] | None = None,
) -> tuple[Dynamics, list[float]]:
    """Meta-train θ in-process with ``algo`` (``fomaml``, ``reptile``, ``anil``): the trained
    network (in eval mode) and the reported query-loss curve."""
    recipe = OptMetaRecipe(cfg, train, algo=algo, seed=seed, progress=progress)
    train_recipe(recipe, session=False)
    recipe.model.eval()
    return recipe.model, recipe.curve
