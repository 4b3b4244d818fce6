"""Message passing on graphs in plain torch (no torch_geometric, no compiled extensions).

Graphs come as one disjoint batch, the layout of :func:`nshot.data.molecules.batch_graphs`:
node features ``x`` (N, F), directed edges ``edge_index`` (2, E) (both directions of an undirected
edge listed), optional edge features (E, B), and ``batch`` (N,) naming each node's graph.

- :class:`GINLayer`: the graph isomorphism layer of Xu et al. (2019),
  ``h_i' = MLP((1 + eps) h_i + sum_j relu(h_j + W e_ij))`` (edge features as in Hu et al., 2020).
- :class:`GIN`: input projection, ``n_layers`` GIN layers with residuals, and a graph readout.
- :func:`global_pool`: sum / mean / max over each graph's nodes.
- :func:`edge_index_from_pairs`: an undirected edge list to a directed ``edge_index``.

Scatter operations use ``index_add_`` / ``scatter_reduce_``, so every layer is deterministic on
CPU and runs unchanged on GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def edge_index_from_pairs(pairs: Sequence[Sequence[int]], num_nodes: int) -> torch.Tensor:
    """Undirected pairs ``[(i, j), ...]`` to a (2, 2E) edge index with both directions.

    Self-loops and duplicate pairs are dropped; an endpoint outside ``[0, num_nodes)`` raises
    ``ValueError`` naming the pair's index.
    """
    seen: set[tuple[int, int]] = set()
    src: list[int] = []
    dst: list[int] = []
    for k, pair in enumerate(pairs):
        i, j = int(pair[0]), int(pair[1])
        if not (0 <= i < num_nodes and 0 <= j < num_nodes):
            raise ValueError(f"edge {k} ({i}, {j}) names a node outside 0..{num_nodes - 1}")
        if i == j or (min(i, j), max(i, j)) in seen:
            continue
        seen.add((min(i, j), max(i, j)))
        src += [i, j]
        dst += [j, i]
    return torch.tensor([src, dst], dtype=torch.long).reshape(2, -1)


def global_pool(h: torch.Tensor, batch: torch.Tensor, num_graphs: int, kind: str = "mean"):
    """Pool node states (N, D) into graph states (num_graphs, D) by ``sum``, ``mean`` or ``max``."""
    out = h.new_zeros(num_graphs, h.shape[1])
    if kind == "sum":
        return out.index_add_(0, batch, h)
    if kind == "mean":
        out.index_add_(0, batch, h)
        count = torch.bincount(batch, minlength=num_graphs).clamp_min(1).to(h.dtype)
        return out / count.unsqueeze(1)
    if kind == "max":
        idx = batch.unsqueeze(1).expand_as(h)
        return out.fill_(float("-inf")).scatter_reduce_(0, idx, h, reduce="amax")
    raise ValueError(f"pool kind must be sum, mean or max, not {kind!r}")


class GINLayer(nn.Module):
    """One GIN layer with optional edge features."""

    def __init__(self, dim: int, edge_dim: int = 0, *, train_eps: bool = True):
        super().__init__()
        self.eps = nn.Parameter(torch.zeros(1), requires_grad=train_eps)
        self.edge = nn.Linear(edge_dim, dim) if edge_dim > 0 else None
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))

    def forward(
        self, h: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor | None = None
    ) -> torch.Tensor:
        src, dst = edge_index[0], edge_index[1]
        msg = h[src]
        if self.edge is not None:
            if edge_attr is None:
                raise ValueError("this GIN layer was built with edge features; pass edge_attr")
            msg = msg + self.edge(edge_attr)
        agg = torch.zeros_like(h).index_add_(0, dst, torch.relu(msg))
        return self.mlp((1.0 + self.eps) * h + agg)


class GIN(nn.Module):
    """A GIN encoder: node features → graph embeddings (num_graphs, out_dim)."""

    def __init__(
        self,
        in_dim: int,
        hidden: int = 64,
        out_dim: int | None = None,
        *,
        n_layers: int = 3,
        edge_dim: int = 0,
        pool: str = "mean",
        dropout: float = 0.0,
    ):
        super().__init__()
        if n_layers < 1:
            raise ValueError("n_layers must be at least 1")
        self.inp = nn.Linear(in_dim, hidden)
        self.layers = nn.ModuleList(GINLayer(hidden, edge_dim) for _ in range(n_layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(n_layers))
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(hidden, out_dim) if out_dim else nn.Identity()
        self.pool = pool

    def node_states(self, x, edge_index, edge_attr=None) -> torch.Tensor:
        h = self.inp(x)
        for layer, norm in zip(self.layers, self.norms):
            h = h + self.drop(torch.relu(norm(layer(h, edge_index, edge_attr))))
        return h

    def forward(self, x, edge_index, batch, num_graphs: int | None = None, edge_attr=None):
        n = int(batch.max().item()) + 1 if num_graphs is None else num_graphs
        h = self.node_states(x, edge_index, edge_attr)
        return self.out(global_pool(h, batch, n, self.pool))
