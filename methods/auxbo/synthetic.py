"""auxbo's synthetic task family: "h reveals what f hides" (the paper's synthetic benchmark).

τ ~ U[-1, 1]^4 per task; one shared set of candidates x in [-1, 1]^4 for the family;
f(x) = exp(-|x - τ|^2 / 0.5) + N(0, 0.01^2); h_t(x) = tanh(A_t (x - τ)) + N(0, 0.05^2),
t = 0..9, A_t in R^{3x4} fixed for the family.
"""

from __future__ import annotations

import math

import numpy as np

from .taskstore import Task
from .taskstore import stream_rng as _rng

# --------------------------------------------------------------------------------------------
# Synthetic family
# --------------------------------------------------------------------------------------------

_SYN_D = 4
_SYN_T = 10
_SYN_DH = 3
_SYN_F_NOISE = 0.01
_SYN_H_NOISE = 0.05
_SYN_LENGTH = 0.5  # f = exp(-|x - tau|^2 / 0.5)

# independent random streams (numpy SeedSequence spawn keys) under one seed
_STREAM_CANDIDATES = (0, 0)
_STREAM_A = (0, 1)
_STREAM_TRAIN = 1
_STREAM_TEST = 2


def synthetic_maps(seed: int = 0) -> np.ndarray:
    """The family's fixed maps ``A [T, d_h, D]`` (h_t(x) = tanh(A_t (x − τ)))."""
    return _rng(seed, _STREAM_A).normal(
        0.0, 1.0 / math.sqrt(_SYN_D), size=(_SYN_T, _SYN_DH, _SYN_D)
    )


def synthetic_family(
    n_train: int = 500,
    n_test: int = 100,
    n_candidates: int = 300,
    seed: int = 0,
    noise: bool = True,
) -> tuple[list[Task], list[Task]]:
    """``(train_tasks, test_tasks)`` of the synthetic family (the offline synthetic benchmark).

    The candidates (uniform in [-1, 1]^4, one set for the family) and the matrices A_t (entries
    N(0, 1/4), so A_t (x - τ) stays mostly in tanh's informative range) depend only on ``seed``.
    Task i of a split draws τ and its noise from its own stream (spawn key (split, i)), so train
    and test tasks are disjoint and a task does not change with ``n_train``/``n_test``. X is the
    candidate set mapped to [0, 1]^4 by (x + 1) / 2. ``noise=False`` gives the noiseless f and h of
    the same τ.
    """
    if n_candidates < 1 or n_train < 0 or n_test < 0:
        raise ValueError("n_candidates must be >= 1 and n_train, n_test >= 0")
    cand = _rng(seed, _STREAM_CANDIDATES).uniform(-1.0, 1.0, size=(n_candidates, _SYN_D))
    A = synthetic_maps(seed)
    X = ((cand + 1.0) / 2.0).astype(np.float32)
    h_names = tuple(f"h{k}" for k in range(_SYN_DH))

    def make(split: str, stream: int, count: int) -> list[Task]:
        tasks = []
        for i in range(count):
            rng = _rng(seed, (stream, i))
            tau = rng.uniform(-1.0, 1.0, size=_SYN_D)
            diff = cand - tau  # [n, D]
            f = np.exp(-np.sum(diff**2, axis=1) / _SYN_LENGTH)
            h = np.tanh(np.einsum("tkd,nd->ntk", A, diff))  # [n, T, d_h]
            f_eps = rng.normal(0.0, _SYN_F_NOISE, size=f.shape)
            h_eps = rng.normal(0.0, _SYN_H_NOISE, size=h.shape)
            if noise:
                f = f + f_eps
                h = h + h_eps
            tasks.append(
                Task(
                    name=f"synthetic/{split}/{i:04d}",
                    family="synthetic",
                    X=X.copy(),
                    f=f.astype(np.float32),
                    h=h.astype(np.float32),
                    h_names=h_names,
                    configs=None,
                    info={"tau": [float(v) for v in tau], "seed": int(seed)},
                )
            )
        return tasks

    return make("train", _STREAM_TRAIN, n_train), make("test", _STREAM_TEST, n_test)
