"""Test-time adaptation (latent only), the per-instance HNN baseline, and the metrics (the paper's evaluation protocol).

Adaptation: the base is frozen; ``z ← z_avg`` (or 0) and Adam fits only ``z`` on the N_shot
``(q, p, q̇, ṗ)`` samples of one trajectory of the new instance (gradients are taken with
``torch.autograd.grad`` with respect to ``z`` alone, so no shared weight is touched).

Metrics per test instance (all computed in float64):

* ``field_mse``: ``Σ‖F̂ − F‖² / Σ‖F‖²`` over a ``grid × grid`` uniform grid of (q, p) covering the
  instance's evaluation trajectories (``eps_field`` = its square root, the paper's ε_field);
* ``traj_mse``: the same over the evaluation trajectories integrated with RK4 from their true
  initial states (``eps_traj`` = its square root);
* ``energy_drift``: over a long rollout (implicit midpoint) from each evaluation trajectory's
  initial state, ``|mean H (last window) − mean H (first window)| / |H(x₀)|`` with the **true** H
  (``learned_drift``: the same with the learned H̃, HNNs only).

The evaluation data are the instance's trajectories other than the shot trajectory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from .config import ModHNNConfig
from .model import (
    Dynamics,
    DynSpec,
    MetaState,
    implicit_midpoint,
    relative_loss,
    rk4,
    symplectic_gradient,
)
from .systems import Split, get_system
from .train import latent_norm

SHOT_TRAJ = 0
DIVERGED = 1e3  # a rollout leaving this many data scales is stopped and counted as diverged


def shot_indices(n_steps: int, shots: int) -> np.ndarray:
    """``shots`` states evenly spread over the shot trajectory."""
    return np.unique(np.linspace(0, n_steps - 1, shots).round().astype(int))


def shots_of(test: Split, shots: int) -> tuple[np.ndarray, np.ndarray]:
    idx = shot_indices(test.x.shape[2], shots)
    return test.x[:, SHOT_TRAJ, idx], test.f[:, SHOT_TRAJ, idx]


def adapt_latent(
    dyn: Dynamics,
    x: torch.Tensor,
    f: torch.Tensor,
    z0: torch.Tensor,
    *,
    steps: int,
    lr: float,
    lambda_z: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fit only ``z [B, d_z]`` (from ``z0``) to the shots ``x, f [B, n, 2]``: ``(z, fit loss [B])``."""
    z = z0.detach().clone().to(x.dtype).requires_grad_(True)
    opt = torch.optim.Adam([z], lr=lr)
    for _ in range(steps):
        per = relative_loss(dyn.field(x, z, create_graph=True), f)
        obj = dyn.spec.loss_scale * per.sum() + lambda_z * latent_norm(z).sum()
        (gz,) = torch.autograd.grad(obj, z)
        opt.zero_grad(set_to_none=True)
        z.grad = gz
        opt.step()
    with torch.no_grad():
        z = z.detach()
    loss = relative_loss(dyn.field(x, z), f).detach()
    return z, loss


class BankMLP(nn.Module):
    """``K`` independent tanh MLPs evaluated together: instance ``b`` of ``x [K, N, in]`` goes
    through network ``b`` only (no shared parameter, so training them jointly with a summed loss
    and Adam, an elementwise optimizer, is K independent trainings)."""

    def __init__(self, n: int, in_dim: int, out_dim: int, width: int, depth: int) -> None:
        super().__init__()
        dims = [in_dim] + [width] * depth + [out_dim]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for i in range(len(dims) - 1):
            if i < depth:
                w = torch.randn(n, dims[i + 1], dims[i]) * math.sqrt(2.0 / (dims[i] + dims[i + 1]))
            else:  # like nn.Linear's default output layer
                bound = 1 / math.sqrt(dims[i])
                w = torch.empty(n, dims[i + 1], dims[i]).uniform_(-bound, bound)
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(torch.zeros(n, dims[i + 1])))

    def forward(
        self, x: torch.Tensor, z: torch.Tensor | None = None, mods: Any = None
    ) -> torch.Tensor:
        h = x
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = torch.einsum("bni,boi->bno", h, w) + b[:, None, :]
            if i < last:
                h = torch.tanh(h)
        return h


class PerInstanceHNN(Dynamics):
    """One plain HNN per test instance (the Scratch baseline), batched as a bank: instance k's
    scales come from its own shots only, and it sees nothing else."""

    def __init__(self, spec: DynSpec, x: np.ndarray, f: np.ndarray) -> None:
        nn.Module.__init__(self)
        self.spec = spec
        K = x.shape[0]
        xs = np.sqrt((x**2).mean(1)) + 1e-6  # [K, 2]
        fs = np.sqrt((f**2).mean(1)) + 1e-6
        hs = np.sqrt(fs[:, 0] * xs[:, 1] * fs[:, 1] * xs[:, 0])
        self.net = BankMLP(K, 2, 1, spec.width, spec.depth)  # type: ignore[assignment]
        self.register_buffer("x_scale", torch.as_tensor(xs[:, None, :], dtype=torch.float32))
        self.register_buffer("f_scale", torch.as_tensor(fs[:, None, :], dtype=torch.float32))
        self.register_buffer("h_scale", torch.as_tensor(hs[:, None], dtype=torch.float32))
        self.damp = None
        self.damp_k: nn.Parameter | None = None
        if spec.dissipative:
            self.damp_k = nn.Parameter(torch.full((K, 1), -2.0))

    @property
    def uses_latent(self) -> bool:
        return False

    def damping(self, z, batch, like):  # type: ignore[override]
        assert self.damp_k is not None
        return nn.functional.softplus(self.damp_k.to(like.dtype))

    def field(self, x, z=None, *, create_graph=False, fn=None):  # type: ignore[override]
        f, g = symplectic_gradient(lambda s: self(s, None), x, create_graph=create_graph)
        if self.damp_k is not None:
            d = self.damping(None, x.shape[0], x)[:, None, :]
            f = torch.cat([f[..., :1], f[..., 1:] - d * g[..., 1:]], dim=-1)
        return f if create_graph else f.detach()


def train_scratch(
    cfg: ModHNNConfig, x: np.ndarray, f: np.ndarray, dissipative: bool, seed: int
) -> tuple[PerInstanceHNN, np.ndarray]:
    """Fresh HNNs, one per instance, each trained on that instance's shots ``x, f [K, n, 2]``
    (Adam, full batch): ``(bank, fit loss [K])``."""
    torch.manual_seed(seed)
    spec = DynSpec(kind="hnn", modulation="none", width=cfg.width, depth=cfg.depth,
                   d_z=cfg.d_z, rank=cfg.rank, dissipative=dissipative)  # fmt: skip
    bank = PerInstanceHNN(spec, x, f)
    X = torch.as_tensor(x, dtype=torch.float32)
    F = torch.as_tensor(f, dtype=torch.float32)
    opt = torch.optim.Adam(bank.parameters(), lr=cfg.scratch_lr)
    for _ in range(cfg.scratch_steps):
        loss = relative_loss(bank.field(X, None, create_graph=True), F).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    bank.eval()
    return bank, relative_loss(bank.field(X, None), F).numpy()


# --------------------------------------------------------------------------- metrics


def _f64(dyn: Dynamics) -> Dynamics:
    import copy

    out = copy.deepcopy(dyn).double()
    out.eval()
    return out


@dataclass
class Evaluation:
    """Per test instance metrics and a few curves for the figures."""

    per_instance: dict[str, list[float]]
    rollouts: dict[str, Any] = field(default_factory=dict)

    def means(self) -> dict[str, float]:
        out = {}
        for k, v in self.per_instance.items():
            arr = np.asarray(v, dtype=np.float64)
            out[k] = float(np.nanmean(arr)) if np.isfinite(arr).any() else float("nan")
        return out


def grid_of(x_eval: np.ndarray, n: int) -> np.ndarray:
    """``[n*n, 2]`` uniform grid over the (q, p) range of ``x_eval [..., 2]``."""
    lo = x_eval.reshape(-1, 2).min(0)
    hi = x_eval.reshape(-1, 2).max(0)
    qq, pp = np.meshgrid(np.linspace(lo[0], hi[0], n), np.linspace(lo[1], hi[1], n), indexing="ij")
    return np.stack([qq.reshape(-1), pp.reshape(-1)], axis=-1)


def drift_of(h: np.ndarray, h0: np.ndarray, window: int) -> np.ndarray:
    """``|mean(last window) − mean(first window)| / |H(x₀)|`` along the last axis."""
    return np.abs(h[..., -window:].mean(-1) - h[..., :window].mean(-1)) / np.abs(h0)


def evaluate_dynamics(
    cfg: ModHNNConfig,
    test: Split,
    fields: list[Dynamics],
    z: torch.Tensor | None,
    *,
    keep_rollouts: int = 1,
) -> Evaluation:
    """Metrics of one model per test instance (``fields[k]``, or one shared model for all with
    latents ``z [K, d_z]``; ``z`` None for unmodulated models)."""
    with torch.no_grad():  # the fields take their own input gradients; nothing else needs any
        return _evaluate(cfg, test, fields, z, keep_rollouts)


def _evaluate(
    cfg: ModHNNConfig,
    test: Split,
    fields: list[Dynamics],
    z: torch.Tensor | None,
    keep_rollouts: int,
) -> Evaluation:
    sys_ = get_system(test.system)
    K = test.n_instances
    shared = len(fields) == 1
    models = [_f64(fields[0])] if shared else [_f64(m) for m in fields]
    z64 = z.double() if z is not None else None
    x_eval = np.delete(test.x, SHOT_TRAJ, axis=1)  # [K, T-1, S, 2]
    n_eval = x_eval.shape[1]

    def field_fn(k_sel: list[int]):
        """``f(x [len(k_sel), M, 2])`` for the instances ``k_sel``."""
        if shared:
            m = models[0]
            zz = z64[k_sel] if z64 is not None else None
            return lambda x: m.field(x, zz)
        k = k_sel[0]
        return lambda x: models[k].field(x, None)

    groups = [list(range(K))] if shared else [[k] for k in range(K)]
    # vector field on the grid
    grids = np.stack([grid_of(x_eval[k], cfg.grid) for k in range(K)])  # [K, G, 2]
    true_f = np.stack(
        [np.stack(sys_.field(grids[k, :, 0], grids[k, :, 1], test.mu[k]), -1) for k in range(K)]
    )
    pred_f = np.concatenate([field_fn(g)(torch.as_tensor(grids[g])).numpy() for g in groups])
    field_mse = ((pred_f - true_f) ** 2).sum((-1, -2)) / (true_f**2).sum((-1, -2))
    # short trajectories (RK4) from the true initial states
    S = test.x.shape[2]
    x0 = torch.as_tensor(x_eval[:, :, 0])
    traj = torch.cat([rk4(field_fn(g), x0[g], test.dt, S - 1) for g in groups]).numpy()
    traj_mse = ((traj - x_eval) ** 2).sum((-1, -2, -3)) / (x_eval**2).sum((-1, -2, -3))
    traj_mse = np.where(np.isfinite(traj_mse), traj_mse, np.inf)
    # long rollout (implicit midpoint): energy drift
    roll = torch.cat(
        [_guarded_midpoint(field_fn(g), x0[g], test.dt, cfg, scale=x_eval[g]) for g in groups]
    ).numpy()  # [K, M, R+1, 2]
    out: dict[str, list[float]] = {
        "field_mse": field_mse.tolist(),
        "traj_mse": traj_mse.tolist(),
        "eps_field": np.sqrt(field_mse).tolist(),
        "eps_traj": np.sqrt(traj_mse).tolist(),
    }
    diverged = ~np.isfinite(roll).all(axis=(-1, -2))  # [K, M]
    out["diverged"] = diverged.mean(-1).tolist()
    if not sys_.dissipative:
        h_true = np.stack(
            [sys_.hamiltonian(roll[k, ..., 0], roll[k, ..., 1], test.mu[k]) for k in range(K)]
        )
        h0 = h_true[..., 0]
        d = drift_of(np.nan_to_num(h_true, nan=np.inf), h0, cfg.drift_window)
        d = np.where(diverged | ~np.isfinite(d), 1.0, d)  # a diverged rollout counts as drift 1
        out["energy_drift"] = d.mean(-1).tolist()
        if models[0].spec.kind == "hnn":
            h_learned = _learned_energy(models, z64, roll, groups, shared)
            dl = drift_of(h_learned, h_learned[..., 0], cfg.drift_window)
            out["learned_drift"] = np.where(diverged, 1.0, dl).mean(-1).tolist()
    else:
        out["energy_drift"] = [float("nan")] * K  # energy decays by design
    rollouts: dict[str, Any] = {}
    for k in range(min(keep_rollouts, K)):
        rollouts[str(k)] = {
            "true": x_eval[k, 0].tolist(),
            "pred": traj[k, 0].tolist(),
            "long": roll[k, 0, :: max(1, cfg.rollout_steps // 200)].tolist(),
            "energy_true_H": (
                sys_.hamiltonian(roll[k, 0, :, 0], roll[k, 0, :, 1], test.mu[k])[
                    :: max(1, cfg.rollout_steps // 200)
                ].tolist()
            ),
            "mu": test.mu[k].tolist(),
        }
    _ = n_eval
    return Evaluation(out, rollouts)


def _guarded_midpoint(f, x0: torch.Tensor, dt: float, cfg: ModHNNConfig, scale: np.ndarray):
    """The long implicit-midpoint rollout in chunks; states that leave ``DIVERGED`` data scales
    become NaN (and are no longer integrated further)."""
    bound = DIVERGED * float(np.abs(scale).max())
    chunk = 50
    parts = [x0[..., None, :]]
    x = x0
    done = 0
    while done < cfg.rollout_steps:
        n = min(chunk, cfg.rollout_steps - done)
        safe = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
        seg = implicit_midpoint(f, safe, dt, n, iters=cfg.midpoint_iters, tol=cfg.midpoint_tol)[
            ..., 1:, :
        ]
        bad = (~torch.isfinite(seg)) | (seg.abs() > bound)
        bad = bad.any(-1, keepdim=True).cumsum(-2) > 0
        bad = bad | (~torch.isfinite(x)).any(-1, keepdim=True)[..., None, :]
        seg = torch.where(bad, torch.full_like(seg, float("nan")), seg)
        parts.append(seg)
        x = seg[..., -1, :]
        done += n
    return torch.cat(parts, dim=-2)


def _learned_energy(models, z64, roll: np.ndarray, groups, shared: bool) -> np.ndarray:
    out = []
    with torch.no_grad():
        for g in groups:
            r = torch.as_tensor(np.nan_to_num(roll[g]))  # [B, M, R+1, 2]
            B, M, R, _ = r.shape
            m = models[0] if shared else models[g[0]]
            zz = z64[g] if (shared and z64 is not None) else None
            out.append(m.energy(r.reshape(B, M * R, 2), zz).reshape(B, M, R).numpy())
    return np.concatenate(out)


def evaluate_state(state: MetaState, system: str, cfg: ModHNNConfig) -> dict[str, float]:
    """Adapt z to each unseen test instance of ``system`` from its shots and report the
    paper's metrics (means over test instances; ``*_zero_init``: the same from z = 0)."""
    from .data import load_splits

    data_cfg = cfg.replace(system=system)
    _, test = load_splits(data_cfg)
    sx, sf = shots_of(test, cfg.shots)
    X = torch.as_tensor(sx, dtype=torch.float32)
    F = torch.as_tensor(sf, dtype=torch.float32)
    dyn = state.dyn
    out: dict[str, float] = {}
    inits = {"": state.z_avg(), "_zero_init": torch.zeros_like(state.z_avg())}
    for suffix, z0 in inits.items():
        z = None
        if dyn.uses_latent:
            z, fit = adapt_latent(
                dyn, X, F, z0.expand(test.n_instances, -1), steps=cfg.adapt_steps,
                lr=cfg.adapt_lr, lambda_z=cfg.lambda_z,
            )  # fmt: skip
            out[f"fit_loss{suffix}"] = float(fit.mean())
        ev = evaluate_dynamics(data_cfg, test, [dyn], z, keep_rollouts=0)
        for k, v in ev.means().items():
            out[f"{k}{suffix}"] = v
        if not dyn.uses_latent:
            break
    return out
