"""iclft's evaluation: test errors of one linear-attention model on fresh prompts, and the
interpretable effective parameters of a learned model.

Test MSE is computed in float64 on the evaluation stream ``(seed, EVAL, task, n)``, so every
model of a seed sees the same prompts at each number of demonstrations n.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from . import data as D
from .model import LinearAttention, effective_params

if TYPE_CHECKING:
    from .config import ICLFTConfig


@torch.no_grad()
def task_errors(
    net: LinearAttention, theta: torch.Tensor, ns: list[int], batch: int, sigma2: float,
    seed: int, task: int, chunk: int = 10_000,
) -> dict[int, float]:  # fmt: skip
    """Test MSE (float64) of ``net`` on task ``theta`` at each n, on fresh prompts of the
    evaluation stream ``(seed, EVAL, task, n)``. Large errors are reported as they are."""
    net64 = LinearAttention(net.d)
    net64.load_state_dict({k: v.detach().cpu() for k, v in net.state_dict().items()})
    net64 = net64.double()
    out = {}
    for n in ns:
        Z, yq = D.eval_batch(theta, n, batch, sigma2, D.generator(seed, D.EVAL, task, n))
        sq = torch.cat([(net64.predict(Z[i : i + chunk]) - yq[i : i + chunk]) ** 2
                        for i in range(0, batch, chunk)])  # fmt: skip
        out[n] = float(sq.mean())
    return out


def evaluate_model(
    net: LinearAttention, cfg: ICLFTConfig, seed: int, theta0: torch.Tensor, *, random: bool
) -> dict[str, float]:
    """``err_target_n{n}``, ``err_unseen_n{n}`` (and ``err_random_n{n}``, the mean over the
    held-out random tasks, when ``random``)."""
    out: dict[str, float] = {}
    for name, theta, task in (("target", theta0, D.TARGET), ("unseen", -theta0, D.UNSEEN)):
        for n, e in task_errors(net, theta, cfg.eval_n, cfg.eval_batch, cfg.sigma2, seed,
                                task).items():  # fmt: skip
            out[f"err_{name}_n{n}"] = e
    if random and cfg.eval_random_tasks:
        per = [
            task_errors(net, th, cfg.eval_n, max(1, cfg.eval_batch // 10), cfg.sigma2, seed, 2 + i)
            for i, th in enumerate(D.random_tasks(cfg, seed))
        ]
        for n in cfg.eval_n:
            out[f"err_random_n{n}"] = float(np.mean([p[n] for p in per]))
    return out


def summary(net: LinearAttention, theta0: torch.Tensor) -> dict[str, float]:
    """Interpretable effective parameters: ``w`` = tr(v_y·M_xx)/d (the ICL weight; c* = 0.79
    pretrained), ``g_theta0`` = θ0ᵀ M_xx v_x (1/(d+4) at the V-only ZS optimum), the
    off-diagonal share of M_xx and |M_00| (the constant–constant score, used by the
    all-parameter ZS family)."""
    p = effective_params(net)
    M, v = p["M"], p["v"]
    d = net.d
    Mxx = M[1 : d + 1, 1 : d + 1]
    off = Mxx - torch.diag(torch.diagonal(Mxx))
    return {
        "w": float(v[-1] * torch.trace(Mxx) / d),
        "g_theta0": float(theta0.double() @ (Mxx @ v[1 : d + 1])),
        "offdiag_share": float(off.norm() / Mxx.norm().clamp_min(1e-12)),
        "M00": float(M[0, 0]),
    }


@torch.no_grad()
def validation(net: LinearAttention, cfg: ICLFTConfig, seed: int, theta0: torch.Tensor) -> dict:
    errs = task_errors(net, theta0, [0, cfg.n_pt], cfg.val_batch, cfg.sigma2, seed, task=99)
    return {f"val_err_n{n}": e for n, e in errs.items()}
