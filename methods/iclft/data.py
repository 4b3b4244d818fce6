"""Task generation (the paper's synthetic linear-regression protocol): pretraining prompts, the target task θ0, its fine-tuning pool,
the unseen task −θ0 and held-out random tasks. Every stream has its own seed.

Randomness is derived from ``(seed, stream, ...)`` through :class:`numpy.random.SeedSequence`,
so a step's batch does not depend on what ran before it (resumes and Ray workers reproduce it).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from .model import tokens

if TYPE_CHECKING:
    import pyarrow as pa

    from .config import ICLFTConfig

# stream tags
PRETRAIN, POOL, FINETUNE, EVAL, THETA0, RANDOM_TASKS, VAL = 1, 2, 3, 4, 5, 6, 7
TARGET, UNSEEN = 0, 1


def seed_of(*keys: int) -> int:
    """A 63-bit seed from integer keys (independent streams for different keys)."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(2, np.uint64)[0] >> 1)


def generator(*keys: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed_of(*keys))


def sample_theta(
    n: int, d: int, dist: str, gen: torch.Generator, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``n`` tasks: unit vectors g/‖g‖ ('sphere') or N(0, I/d) ('gaussian')."""
    g = torch.randn(n, d, generator=gen, dtype=torch.float64)
    if dist == "sphere":
        g = g / g.norm(dim=-1, keepdim=True)
    elif dist == "gaussian":
        g = g / math.sqrt(d)
    else:
        raise ValueError(f"task_dist: unknown task distribution {dist!r}")
    return g.to(dtype)


def target_task(cfg: ICLFTConfig, seed: int) -> torch.Tensor:
    """θ0 of ``seed`` (float64, shape d)."""
    return sample_theta(1, cfg.d, cfg.task_dist, generator(seed, THETA0), torch.float64)[0]


def random_tasks(cfg: ICLFTConfig, seed: int) -> torch.Tensor:
    """The held-out random tasks of ``seed`` (float64, eval_random_tasks × d)."""
    n = cfg.eval_random_tasks
    return sample_theta(n, cfg.d, cfg.task_dist, generator(seed, RANDOM_TASKS), torch.float64)


def labels(
    x: torch.Tensor, theta: torch.Tensor, sigma2: float, gen: torch.Generator
) -> torch.Tensor:
    """``y = θᵀx + ε``, ε ~ N(0, σ²) (σ² is a variance); θ is (d,) or one per leading row."""
    if theta.dim() == 1:
        clean = x @ theta
    else:
        clean = torch.einsum("bld,bd->bl", x, theta)
    noise = torch.randn(clean.shape, generator=gen, dtype=clean.dtype) * math.sqrt(sigma2)
    return clean + noise


def pretrain_batch(
    cfg: ICLFTConfig, batch: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` prompts of ``n_pt`` demonstrations and a query, a fresh θ each: ``(Z, y_q)``."""
    theta = sample_theta(batch, cfg.d, cfg.task_dist, gen)
    x = torch.randn(batch, cfg.n_pt + 1, cfg.d, generator=gen)
    y = labels(x, theta, cfg.sigma2, gen)
    return tokens(x, y), y[:, -1].clone()


def make_pool(cfg: ICLFTConfig, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fine-tuning pool: ``pool_size`` pairs (x, y) of θ0, fixed per seed: ``(x, y, θ0)``."""
    theta0 = target_task(cfg, seed)
    gen = generator(seed, POOL)
    x = torch.randn(cfg.pool_size, cfg.d, generator=gen)
    y = labels(x, theta0.float(), cfg.sigma2, gen)
    return x, y, theta0


def finetune_batch(
    x_pool: torch.Tensor, y_pool: torch.Tensor, batch: int, n_fs: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n_fs + 1`` pool rows per prompt (with replacement): ``(Z_zs, Z_fs, y_q)``.

    ``Z_fs`` holds the demonstrations and the query; ``Z_zs`` is the query token alone (a
    one-token prompt, not padded). The query's y entry is 0 in both."""
    idx = torch.randint(0, x_pool.shape[0], (batch, n_fs + 1), generator=gen)
    P = pool_tokens(x_pool, y_pool)
    Z_fs = P.index_select(0, idx.reshape(-1)).view(batch, n_fs + 1, P.shape[-1])
    yq = Z_fs[:, -1, -1].clone()
    Z_fs[:, -1, -1] = 0.0
    return Z_fs[:, -1:].clone(), Z_fs, yq


_POOL_TOKENS: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}


def pool_tokens(x_pool: torch.Tensor, y_pool: torch.Tensor) -> torch.Tensor:
    """The pool as tokens ``[1, x, y]`` (P, d+2), built once per pool."""
    key = (id(x_pool), id(y_pool))
    hit = _POOL_TOKENS.get(key)
    if hit is None or hit[0] is not x_pool:
        _POOL_TOKENS.clear()
        Z = torch.cat([torch.ones(len(x_pool), 1, dtype=x_pool.dtype), x_pool,
                       y_pool.unsqueeze(-1)], dim=-1)  # fmt: skip
        hit = _POOL_TOKENS[key] = (x_pool, Z)
    return hit[1]


def eval_batch(
    theta: torch.Tensor, n: int, batch: int, sigma2: float, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh prompts of task ``theta`` with ``n`` demonstrations (float64): ``(Z, y_q)``."""
    theta = theta.double()
    x = torch.randn(batch, n + 1, theta.shape[-1], generator=gen, dtype=torch.float64)
    y = labels(x, theta, sigma2, gen)
    return tokens(x, y), y[:, -1].clone()


# --------------------------------------------------------------------------- Arrow tables


def _prompts_table(cfg: ICLFTConfig, theta: torch.Tensor, seed: int, task: int) -> pa.Table:
    import pyarrow as pa

    ns, xs, ys = [], [], []
    for n in cfg.eval_n:
        gen = generator(seed, EVAL, task, n)
        x = torch.randn(cfg.eval_batch, n + 1, cfg.d, generator=gen, dtype=torch.float64)
        y = labels(x, theta.double(), cfg.sigma2, gen)
        ns += [n] * cfg.eval_batch
        xs += x.reshape(cfg.eval_batch, -1).tolist()
        ys += y.tolist()
    return pa.table({"n": ns, "x": xs, "y": ys})


def tables(cfg: ICLFTConfig, seed: int | None = None) -> dict[str, pa.Table]:
    """The splits of ``seed``. ``pretrain`` is a generator: only its seed is stored.

    ``eval_*`` rows are prompts: ``x`` holds the n+1 inputs flattened (demonstrations then
    the query), ``y`` the n+1 labels (the last is the query's true label)."""
    import pyarrow as pa

    seed = cfg.seed if seed is None else seed
    x, y, theta0 = make_pool(cfg, seed)
    rand = random_tasks(cfg, seed)
    return {
        "pretrain": pa.table(
            {
                "seed": [seed],
                "stream": [PRETRAIN],
                "d": [cfg.d],
                "n_pt": [cfg.n_pt],
                "sigma2": [cfg.sigma2],
                "task_dist": [cfg.task_dist],
            }
        ),  # fmt: skip
        "finetune_pool": pa.table({"x": x.tolist(), "y": y.tolist()}),
        "tasks": pa.table(
            {
                "name": ["target", "unseen"] + [f"random{i}" for i in range(len(rand))],
                "theta": [theta0.tolist(), (-theta0).tolist()] + rand.tolist(),
            }
        ),  # fmt: skip
        "eval_target": _prompts_table(cfg, theta0, seed, TARGET),
        "eval_unseen": _prompts_table(cfg, -theta0, seed, UNSEEN),
    }
