"""auxbo's synthetic task family: "h reveals what f hides" (the paper's synthetic benchmark).

Two declared versions (``AuxBOConfig.synthetic_version``); both draw τ ~ U[-1, 1]^4 per task, share
one set of candidates x in [-1, 1]^4 for the family and the maps A_t in R^{3x4} (t = 0..9), and add
N(0, 0.01^2) to f and N(0, 0.05^2) to h:

* **version 1** (the first family): f(x) = exp(-|x - τ|^2 / 0.5), h_t(x) = tanh(A_t (x - τ)). h
  shows the direction to the optimum that f hides, but on the bounded cube the *mean* of h over
  random designs is a function of τ too, so the set of a task's h values, with no design attached,
  tells where its optimum lies (a ridge regression reads it with R² 0.82 from 5 random designs).
* **version 2** (the default of ``small`` and ``paper``): the designs live on the torus
  [-1, 1)^4 (period 2 per coordinate) and δ(x) = wrap(x - τ) is the offset to the optimum there;
  f(x) = exp(-|δ|^2 / 0.5) and h_t(x) = tanh(A_t (c ⊙ cos(π δ))), with a task-level latent
  c ~ logU[1/2, 2]^4 (how strongly each coordinate shows in h). h shows how far *each* coordinate
  of a design is from the optimum's (f, a function of the total distance, hides that), not on
  which side, and how strongly it does so varies by task: the model has to infer c from the
  context's (f, h) pairs. On the torus the distribution of δ over uniform designs is the same for
  every τ, and cos(π δ) is symmetric about 0, so the set of h values carries nothing about where
  the optimum lies (the mean of h is 0 for every task); what it carries is c, the task's relation
  between h and f.
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
_SYN_GAIN = (0.5, 2.0)  # version 2: the task's gains c, log-uniform in this range
VERSIONS = (1, 2)

# independent random streams (numpy SeedSequence spawn keys) under one seed
_STREAM_CANDIDATES = (0, 0)
_STREAM_A = (0, 1)
_STREAM_TRAIN = 1
_STREAM_TEST = 2


def synthetic_maps(seed: int = 0) -> np.ndarray:
    """The family's fixed maps ``A [T, d_h, D]`` (both versions)."""
    return _rng(seed, _STREAM_A).normal(
        0.0, 1.0 / math.sqrt(_SYN_D), size=(_SYN_T, _SYN_DH, _SYN_D)
    )


def wrap(u: np.ndarray) -> np.ndarray:
    """``u`` on the torus of period 2: the representative in [-1, 1)."""
    return np.mod(np.asarray(u, np.float64) + 1.0, 2.0) - 1.0


def synthetic_values(
    cand: np.ndarray,
    tau: np.ndarray,
    A: np.ndarray,
    version: int = 2,
    gains: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Noise-free ``(f [n], h [n, T, d_h])`` of designs ``cand [n, D]`` in [-1, 1]^D for a task
    with optimum ``tau`` (and, in version 2, gains ``gains [D]``) under the maps ``A``."""
    cand = np.atleast_2d(np.asarray(cand, np.float64))
    tau = np.asarray(tau, np.float64)
    if version == 1:
        diff = cand - tau
        return (
            np.exp(-np.sum(diff**2, axis=1) / _SYN_LENGTH),
            np.tanh(np.einsum("tkd,nd->ntk", A, diff)),
        )
    if version == 2:
        if gains is None:
            raise ValueError("version 2 needs the task's gains")
        delta = wrap(cand - tau)
        near = np.asarray(gains, np.float64) * np.cos(np.pi * delta)
        return (
            np.exp(-np.sum(delta**2, axis=1) / _SYN_LENGTH),
            np.tanh(np.einsum("tkd,nd->ntk", A, near)),
        )
    raise ValueError(f"synthetic family version must be one of {VERSIONS}, not {version!r}")


def synthetic_family(
    n_train: int = 500,
    n_test: int = 100,
    n_candidates: int = 300,
    seed: int = 0,
    noise: bool = True,
    version: int = 2,
) -> tuple[list[Task], list[Task]]:
    """``(train_tasks, test_tasks)`` of the synthetic family (the offline synthetic benchmark).

    The candidates (uniform in [-1, 1]^4, one set for the family) and the matrices A_t (entries
    N(0, 1/4), so A_t (x - τ) stays mostly in tanh's informative range) depend only on ``seed``.
    Task i of a split draws τ, in ``version`` 2 then its gains c, and then its noise from its own
    stream (spawn key (split, i)), so train and test tasks are disjoint and a task does not change
    with ``n_train``/``n_test``. X is the candidate set mapped to [0, 1]^4 by (x + 1) / 2.
    ``noise=False`` gives the noiseless f and h of the same task.
    """
    if n_candidates < 1 or n_train < 0 or n_test < 0:
        raise ValueError("n_candidates must be >= 1 and n_train, n_test >= 0")
    if version not in VERSIONS:
        raise ValueError(f"synthetic family version must be one of {VERSIONS}, not {version!r}")
    cand = _rng(seed, _STREAM_CANDIDATES).uniform(-1.0, 1.0, size=(n_candidates, _SYN_D))
    A = synthetic_maps(seed)
    X = ((cand + 1.0) / 2.0).astype(np.float32)
    h_names = tuple(f"h{k}" for k in range(_SYN_DH))

    def make(split: str, stream: int, count: int) -> list[Task]:
        tasks = []
        for i in range(count):
            rng = _rng(seed, (stream, i))
            tau = rng.uniform(-1.0, 1.0, size=_SYN_D)
            info: dict = {"tau": [float(v) for v in tau], "seed": int(seed), "version": version}
            gains = None
            if version == 2:
                lo, hi = np.log(_SYN_GAIN[0]), np.log(_SYN_GAIN[1])
                gains = np.exp(rng.uniform(lo, hi, size=_SYN_D))
                info["gains"] = [float(v) for v in gains]
            f, h = synthetic_values(cand, tau, A, version, gains)
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
                    info=info,
                )
            )
        return tasks

    return make("train", _STREAM_TRAIN, n_train), make("test", _STREAM_TEST, n_test)
