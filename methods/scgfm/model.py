"""SCGFM's model: learnable geometric bases, Gromov–Wasserstein coordinates, re-encoding.

- Bases (paper §3.1): ``B_k = ((σ(Θ_k) + σ(Θ_k)ᵀ)/2) ⊙ (1 − I)``, uniform measure on M nodes.
- Coordinates: ``δ_k = GW(A, B_k)`` with square loss and the uniform measure on the graph's
  nodes; ``w = softmax(−δ̃/τ)`` with ``δ̃ = (δ − mean δ)/σ_δ`` (σ_δ: the pooled spread of δ on
  the source graphs, stored with the model).
- Decoder ``f``: an MLP K → hidden → r that predicts the graph statistics :func:`graph_stats`.
- Re-encoding (paper §3.3): ``H = Σ_k w_k N T_kᵀ X`` (M × F) through the transport plans;
  the embedding is ``z = [w ‖ f(w) ‖ vec(H)]``, so the feature dimension F may differ by graph
  collection.

Gradients through GW use the envelope theorem: the plan is solved without gradient, and the GW
objective is evaluated at that fixed plan as a differentiable expression
(:func:`gw_value`), ``∂GW/∂B = 2(B ⊙ qqᵀ − TᵀAT)``.

The exact conditional-gradient solver of POT depends on the order of the nodes (its linear
sub-problems break ties by index), so a graph is first put in a canonical order (final
Weisfeiler–Lehman colour, then degree) and the best of ``starts`` deterministic starts is kept;
the entropic solver is the alternative. One solver serves pre-training and embedding.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Any

import networkx as nx
import numpy as np
import torch
from torch import nn

from nshot.errors import NshotError
from nshot.train.checkpoint import LoadedCheckpoint

from .config import ScgfmConfig
from .data import Graph

N_STATS = 17  # degree histogram (10) + clustering histogram (5) + log(1 + triangles) + density
THETA_INIT_STD = 2.0
#: what a shape recorded in a scgfm checkpoint may be
SHAPE_BOUNDS = {"n_bases": (2, 64), "basis_size": (2, 32), "hidden": (1, 1024),
                "n_stats": (N_STATS, N_STATS)}  # fmt: skip


# --------------------------------------------------------------------------- graph statistics


def graph_stats(g: Graph) -> np.ndarray:
    """FE(G): degree histogram (0..9+), clustering histogram (5 bins), log(1 + #triangles),
    density — the graph-level statistics the decoder reconstructs."""
    a = g.adjacency()
    deg = a.sum(1).astype(int)
    dh = np.bincount(np.minimum(deg, 9), minlength=10) / g.n
    gx = g.nx()
    clus = np.array(list(nx.clustering(gx).values()))
    ch = np.histogram(clus, bins=5, range=(0.0, 1.0))[0] / g.n
    tri = sum(nx.triangles(gx).values()) / 3
    density = 2 * len(g.edges) / (g.n * (g.n - 1))
    return np.concatenate([dh, ch, [np.log1p(tri), density]])


# --------------------------------------------------------------------------- GW solvers


def canonical_order(g: Graph) -> np.ndarray:
    """Node indices in canonical order: sorted by degree, then by the final Weisfeiler–Lehman
    colour (3 iterations), then by index (ties are nodes WL cannot tell apart)."""
    order = g._cache.get("order")
    if order is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hashes = nx.weisfeiler_lehman_subgraph_hashes(g.nx(), iterations=3)
        deg = g.adjacency().sum(1)
        keys = [(int(deg[i]), hashes[i][-1] if hashes.get(i) else "", i) for i in range(g.n)]
        order = np.array([k[2] for k in sorted(keys)], dtype=np.int64)
        g._cache["order"] = order
    return order


def canonical_adjacency(g: Graph) -> np.ndarray:
    a = g._cache.get("adj_c")
    if a is None:
        o = canonical_order(g)
        a = g.adjacency()[np.ix_(o, o)]
        g._cache["adj_c"] = a
    return a


def gw_value_np(A: np.ndarray, B: np.ndarray, T: np.ndarray) -> float:
    """The square-loss GW objective at plan T (marginals p = T1, q = Tᵀ1)."""
    p, q = T.sum(1), T.sum(0)
    return float(
        (A**2 * np.outer(p, p)).sum()
        + (B**2 * np.outer(q, q)).sum()
        - 2 * (B * (T.T @ A @ T)).sum()
    )


def gw_value(A: torch.Tensor, B: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """The same objective as a differentiable torch expression (the envelope theorem: the
    gradient at a fixed optimal plan is the gradient of the GW distance)."""
    p, q = T.sum(1), T.sum(0)
    return (
        (A**2 * torch.outer(p, p)).sum()
        + (B**2 * torch.outer(q, q)).sum()
        - 2 * (B * (T.T @ A @ T)).sum()
    )


def conditional_gradient_gw(
    C1: np.ndarray,
    C2: np.ndarray,
    p: np.ndarray,
    q: np.ndarray,
    G0: np.ndarray,
    max_iter: int = 10_000,
    tol_rel: float = 1e-9,
    tol_abs: float = 1e-9,
) -> tuple[np.ndarray, float]:
    """Square-loss GW between symmetric C1 and C2 by conditional gradient from ``G0``: the
    algorithm of POT's ``ot.gromov.gromov_wasserstein`` (exact LP direction by network simplex,
    exact quadratic line search, the same stopping rule and the same arithmetic, so plans and
    values agree with POT's to rounding), without POT's per-call backend overhead (about 5×
    faster on graphs of 30 nodes). Returns the plan and the GW value."""
    from ot.lp.emd_wrap import emd_c

    ones_p, ones_q = np.ones((len(p), 1)), np.ones((1, len(q)))
    constC = np.dot(np.dot(C1**2, p.reshape(-1, 1)), ones_q) + np.dot(
        ones_p, np.dot(q.reshape(1, -1), (C2**2).T)
    )
    hC2 = 2 * C2
    qs = q * p.sum() / q.sum()  # as POT's emd does: equal masses
    G = G0
    cost = float(((constC + (-np.dot(np.dot(C1, G), hC2.T))) * G).sum())
    for _ in range(max_iter):
        old = cost
        grad = np.ascontiguousarray(2 * (constC + (-np.dot(np.dot(C1, G), hC2.T))))
        dG = emd_c(p, qs, grad, 100_000, 1, None, None)[0] - G
        dot = np.dot(np.dot(C1, dG), hC2.T)
        a, b = -float((dot * dG).sum()), -2 * float((dot * G).sum())
        if a > 0:
            alpha = min(1.0, max(0.0, -b / (2.0 * a)))
        else:
            alpha = 1.0 if a + b < 0 else 0.0
        cost = cost + a * alpha**2 + b * alpha
        G = G + alpha * dG
        delta = abs(cost - old)
        if (cost != 0 and delta / abs(cost) < tol_rel) or delta < tol_abs:
            break
    return G, cost


@dataclass(frozen=True)
class GWSolver:
    """One GW solver for pre-training and embedding (recorded in the checkpoint)."""

    name: str = "exact"
    starts: int = 3
    epsilon: float = 0.05
    max_iter: int = 100
    canonical: bool = True

    @classmethod
    def from_config(cls, cfg: ScgfmConfig) -> GWSolver:
        return cls(cfg.solver, cfg.starts, cfg.epsilon, cfg.entropic_iter)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def _solve_matrix(self, A: np.ndarray, B: np.ndarray) -> tuple[float, np.ndarray]:
        import ot

        n, m = len(A), len(B)
        p, q = np.full(n, 1.0 / n), np.full(m, 1.0 / m)
        if self.name == "entropic":
            T = ot.gromov.entropic_gromov_wasserstein(
                A, B, p, q, "square_loss", epsilon=self.epsilon, max_iter=self.max_iter
            )
            return gw_value_np(A, B, T), T
        best: tuple[float, np.ndarray] | None = None
        for s in range(self.starts):
            if s == 0:
                G0 = np.outer(p, q)
            else:  # a random vertex of the transport polytope: exact marginals
                rng = np.random.default_rng([n, m, s])
                G0 = ot.emd(p, q, rng.random((n, m)))
            T, d = conditional_gradient_gw(A, B, p, q, G0)
            if best is None or d < best[0] - 1e-12:
                best = (d, T)
        assert best is not None
        return best

    def solve(self, g: Graph, B: np.ndarray) -> tuple[float, np.ndarray]:
        """(δ, T) of graph ``g`` against basis ``B``; T (n, M) in ``g``'s own node order."""
        if not self.canonical:
            return self._solve_matrix(g.adjacency(), B)
        o = canonical_order(g)
        d, Tc = self._solve_matrix(canonical_adjacency(g), B)
        T = np.empty_like(Tc)
        T[o] = Tc
        return d, T

    def solve_pair(self, g: Graph, h: Graph) -> float:
        """GW(A_g, A_h) between two graphs (the stability measurement)."""
        if self.canonical:
            return self._solve_matrix(canonical_adjacency(g), canonical_adjacency(h))[0]
        return self._solve_matrix(g.adjacency(), h.adjacency())[0]


# --------------------------------------------------------------------------- the model


class SCGFM(nn.Module):
    """K geometric bases Θ (K, M, M), the decoder f and the stored σ_δ and statistics scale."""

    def __init__(self, n_bases: int, basis_size: int, hidden: int = 32, n_stats: int = N_STATS):
        super().__init__()
        self.n_bases, self.basis_size, self.hidden, self.n_stats = (
            n_bases, basis_size, hidden, n_stats,
        )  # fmt: skip
        self.theta = nn.Parameter(THETA_INIT_STD * torch.randn(n_bases, basis_size, basis_size))
        self.decoder = nn.Sequential(
            nn.Linear(n_bases, hidden), nn.ReLU(), nn.Linear(hidden, n_stats)
        )
        self.register_buffer("sigma_delta", torch.ones((), dtype=torch.float64))
        self.register_buffer("stats_mean", torch.zeros(n_stats, dtype=torch.float64))
        self.register_buffer("stats_std", torch.ones(n_stats, dtype=torch.float64))

    def shape(self) -> dict[str, int]:
        return {"n_bases": self.n_bases, "basis_size": self.basis_size, "hidden": self.hidden,
                "n_stats": self.n_stats}  # fmt: skip

    def bases(self) -> torch.Tensor:
        """B (K, M, M), float64: symmetric, zero diagonal, entries in [0, 1]."""
        s = torch.sigmoid(self.theta.double())
        eye = torch.eye(self.basis_size, dtype=torch.float64, device=self.theta.device)
        return (s + s.transpose(1, 2)) / 2 * (1 - eye)

    def weights(self, delta: torch.Tensor, tau: float) -> torch.Tensor:
        """w = softmax(−δ̃/τ), δ̃ = (δ − mean δ)/σ_δ (δ of shape (..., K))."""
        dt = (delta - delta.mean(-1, keepdim=True)) / self.sigma_delta
        return torch.softmax(-dt / tau, dim=-1)

    def decode(self, w: torch.Tensor) -> torch.Tensor:
        return self.decoder(w.to(self.decoder[0].weight.dtype)).double()


def min_basis_dist(B: np.ndarray | torch.Tensor) -> float:
    """min_{i≠j} ‖B_i − B_j‖_F."""
    b = torch.as_tensor(B, dtype=torch.float64).flatten(1)
    d = torch.cdist(b, b)
    d.fill_diagonal_(float("inf"))
    return float(d.min())


def pooled_sigma(deltas: np.ndarray) -> float:
    """The pooled spread of δ across bases: std of δ − mean_k δ over graphs and bases."""
    c = deltas - deltas.mean(1, keepdims=True)
    return float(max(np.sqrt((c**2).mean()), 1e-12))


@dataclass
class Embedding:
    """Per graph: coordinates w (K), f(w) (r), H (M·F or empty), δ (K); z = [w ‖ f(w) ‖ H]."""

    w: np.ndarray
    fw: np.ndarray
    h: np.ndarray
    delta: np.ndarray

    def z(self, with_h: bool = True) -> np.ndarray:
        parts = [self.w, self.fw] + ([self.h] if with_h else [])
        return np.concatenate(parts, axis=-1)


def solve_graphs(
    model: SCGFM, graphs: list[Graph], solver: GWSolver
) -> tuple[np.ndarray, list[list[np.ndarray]]]:
    """δ (n, K) and the plans T_k (n_i, M) of every graph against the frozen bases."""
    with torch.no_grad():
        B = model.bases().numpy()
    deltas = np.zeros((len(graphs), len(B)))
    plans: list[list[np.ndarray]] = []
    for i, g in enumerate(graphs):
        ts = []
        for k in range(len(B)):
            deltas[i, k], T = solver.solve(g, B[k])
            ts.append(T)
        plans.append(ts)
    return deltas, plans


def reencode(
    w: np.ndarray, plans: list[list[np.ndarray]], xs: list[np.ndarray | None]
) -> np.ndarray:
    """vec(H) per graph, H = Σ_k w_k N T_kᵀ X (M × F); empty rows where X is None."""
    hs = []
    for i, x in enumerate(xs):
        if x is None:
            hs.append(np.zeros(0))
            continue
        n = x.shape[0]
        H = sum(w[i, k] * n * (plans[i][k].T @ x) for k in range(len(plans[i])))
        hs.append(np.asarray(H).reshape(-1))
    if len({len(h) for h in hs}) > 1:
        raise ValueError("graphs of one embedding call must share the feature dimension F")
    return np.stack(hs) if hs else np.zeros((0, 0))


@torch.no_grad()
def coordinates(model: SCGFM, deltas: np.ndarray, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """w and f(w) from δ."""
    w = model.weights(torch.from_numpy(deltas), tau)
    return w.numpy(), model.decode(w).numpy()


def embed_graphs(model: SCGFM, graphs: list[Graph], solver: GWSolver, tau: float) -> Embedding:
    """The frozen embedding of ``graphs`` (K GW solves per graph)."""
    deltas, plans = solve_graphs(model, graphs, solver)
    w, fw = coordinates(model, deltas, tau)
    return Embedding(w=w, fw=fw, h=reencode(w, plans, [g.x for g in graphs]), delta=deltas)


def build_model(cfg: ScgfmConfig, seed: int) -> SCGFM:
    torch.manual_seed(seed)
    return SCGFM(cfg.n_bases, cfg.basis_size, cfg.decoder_hidden).double()


def load_model(checkpoint: LoadedCheckpoint) -> tuple[SCGFM, GWSolver, float]:
    """The bases and decoder of a scgfm checkpoint, its solver and τ."""
    shape = checkpoint.extra.get("shape")
    solver = checkpoint.extra.get("solver")
    if not isinstance(shape, dict) or not isinstance(solver, dict):
        raise NshotError(f"{checkpoint.path}: not a scgfm checkpoint (no shape or solver)")
    for k, (lo, hi) in SHAPE_BOUNDS.items():
        v = shape.get(k)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise NshotError(f"{checkpoint.path}: extra.shape.{k} must be an int in [{lo}, {hi}]")
    model = SCGFM(**shape).double()
    try:
        model.load_state_dict(checkpoint.weights())
    except RuntimeError as err:
        raise NshotError(f"{checkpoint.path}: weights do not fit the stored shape: {err}") from None
    s = GWSolver(
        name=str(solver.get("name")), starts=int(solver.get("starts", 3)),
        epsilon=float(solver.get("epsilon", 0.05)), max_iter=int(solver.get("max_iter", 100)),
        canonical=bool(solver.get("canonical", True)),
    )  # fmt: skip
    if s.name not in ("exact", "entropic"):
        raise NshotError(f"{checkpoint.path}: unknown solver {s.name!r}")
    return model.eval(), s, float(checkpoint.extra.get("tau", 0.5))
