"""Offline data for weightspace (the paper's 1-D dilation task): 1-D hat INRs and their dilations.

Each input INR is a ReLU 1→3→1 network that encodes a hat with breakpoints c − w, c, c + w
(c ~ U(0.3, 0.7), w ~ U(0.1, 0.25), height A ~ U(0.5, 1.5)):
f(x) = (A/w)·(relu(x − c + w) − 2·relu(x − c) + relu(x − c − w)). Its hidden neurons are randomly
permuted and positively rescaled (W1, b1 × a, W2 / a, a ~ U(0.5, 2)): part of the data, so a
model cannot use neuron order or scale. The target is the morphological dilation (running max
over ±radius) on a grid of [−1, 1], computed exactly: a trapezoid, which three ReLU neurons
cannot represent. Train and test INRs come from disjoint seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from .config import WeightspaceConfig


@dataclass
class INRSet:
    W1: torch.Tensor  # [N, 3, 1]
    b1: torch.Tensor  # [N, 3]
    W2: torch.Tensor  # [N, 1, 3]
    b2: torch.Tensor  # [N, 1]
    target: torch.Tensor  # [N, P]
    params: np.ndarray  # [N, 3]: c, w, A

    def __len__(self) -> int:
        return len(self.b1)

    def subset(self, idx: torch.Tensor | slice) -> INRSet:
        i = idx
        return INRSet(self.W1[i], self.b1[i], self.W2[i], self.b2[i], self.target[i],
                      self.params[i.numpy() if isinstance(i, torch.Tensor) else i])  # fmt: skip


def grid(cfg: WeightspaceConfig) -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, cfg.grid, dtype=torch.float64)


def hat(x: np.ndarray, c: np.ndarray, w: np.ndarray, a: np.ndarray) -> np.ndarray:
    return a * np.clip(1.0 - np.abs(x - c) / w, 0.0, None)


def dilated_hat(x: np.ndarray, c, w, a, r: float) -> np.ndarray:
    """max of the hat over [x − r, x + r]: A on |x − c| ≤ r, else the hat at the nearer end."""
    d = np.abs(x - c)
    return np.where(d <= r, a, hat(np.where(x < c, x + r, x - r), c, w, a))


def make_inrs(n: int, seed: int, cfg: WeightspaceConfig) -> INRSet:
    rng = np.random.default_rng([seed, 1031])
    c = rng.uniform(0.3, 0.7, n)
    w = rng.uniform(0.1, 0.25, n)
    a = rng.uniform(0.5, 1.5, n)
    W1 = np.ones((n, 3, 1))
    b1 = -np.stack([c - w, c, c + w], axis=1)
    W2 = (a / w)[:, None, None] * np.array([1.0, -2.0, 1.0])[None, None, :]
    b2 = np.zeros((n, 1))
    scale = rng.uniform(0.5, 2.0, (n, 3))
    W1, b1, W2 = W1 * scale[:, :, None], b1 * scale, W2 / scale[:, None, :]
    perm = np.argsort(rng.random((n, 3)), axis=1)
    rows = np.arange(n)[:, None]
    W1, b1, W2 = W1[rows, perm], b1[rows, perm], W2[:, 0, :][rows, perm][:, None, :]
    x = grid(cfg).numpy()[None, :]
    target = dilated_hat(x, c[:, None], w[:, None], a[:, None], cfg.radius)
    f32 = lambda v: torch.as_tensor(v, dtype=torch.float32)  # noqa: E731
    return INRSet(f32(W1), f32(b1), f32(W2), f32(b2), f32(target), np.stack([c, w, a], 1))


def splits(cfg: WeightspaceConfig, seed: int | None = None) -> tuple[INRSet, INRSet]:
    """(train, test) INRs; the test seed is disjoint from the train seed."""
    s = cfg.seed if seed is None else seed
    return make_inrs(cfg.n_train, 2 * s, cfg), make_inrs(cfg.n_test, 2 * s + 1, cfg)


def data_tables(cfg: WeightspaceConfig) -> dict[str, pa.Table]:
    out = {}
    for name, d in zip(("train", "test"), splits(cfg), strict=True):
        out[name] = pa.table({
            "W1": d.W1.flatten(1).numpy().tolist(), "b1": d.b1.numpy().tolist(),
            "W2": d.W2.flatten(1).numpy().tolist(), "b2": d.b2.numpy().tolist(),
            "target": d.target.numpy().tolist(),
        })  # fmt: skip
    return out
