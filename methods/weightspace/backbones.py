"""Permutation-equivariant weight-space backbones for general MLP INRs, the OCE head, rendering.

An MLP with widths (d_0, ..., d_L) is a list of ``(W_l [B, d_l, d_{l-1}], b_l [B, d_l])`` pairs,
batched over B INRs. Only hidden neurons (layers 1..L-1) are permuted; input and output neurons
keep their identity, so per-input/per-output-neuron parameters are allowed (the paper's setting).

Per-entry features use the same structure with a trailing channel dim:
``(FW_l [B, d_l, d_{l-1}, c], Fb_l [B, d_l, c])``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor, nn

Layers = list[tuple[Tensor, Tensor]]

SIREN_OMEGA0 = 30.0


# --------------------------------------------------------------------------- INR utilities


def render(
    layers: Sequence[tuple[Tensor, Tensor]],
    x: Tensor,
    act: str = "relu",
    omega: float = SIREN_OMEGA0,
) -> Tensor:
    """Evaluate B INRs at points ``x`` [P, d_0] or [B, P, d_0]; returns [B, P, d_L].

    ``act="relu"``: ReLU between layers; ``act="sin"``: SIREN, sin(omega * (W h + b)) in hidden
    layers. The last layer is linear in both cases.
    """
    w0 = layers[0][0]
    h = x.to(w0.dtype)
    if h.dim() == 2:
        h = h.unsqueeze(0).expand(w0.shape[0], -1, -1)
    last = len(layers) - 1
    for ell, (w, b) in enumerate(layers):
        h = torch.einsum("bpi,bji->bpj", h, w) + b.unsqueeze(1)
        if ell < last:
            if act == "relu":
                h = torch.relu(h)
            elif act == "sin":
                h = torch.sin(omega * h)
            else:
                raise ValueError(f"unknown activation {act!r} (expected 'relu' or 'sin')")
    return h


def widths_of(layers: Sequence[tuple[Tensor, Tensor]]) -> list[int]:
    """The widths (d_0, ..., d_L) of a layer list."""
    return [int(layers[0][0].shape[2])] + [int(w.shape[1]) for w, _ in layers]


def _take(t: Tensor, perm: Tensor, dim: int) -> Tensor:
    """``t`` reindexed along ``dim`` (>= 1) by ``perm`` [d] (shared) or [B, d] (per INR)."""
    perm = perm.to(t.device)
    if perm.dim() == 1:
        return t.index_select(dim, perm)
    shape = [1] * t.dim()
    shape[0], shape[dim] = perm.shape
    idx = perm.reshape(shape).expand(*t.shape[:dim], perm.shape[1], *t.shape[dim + 1 :])
    return torch.gather(t, dim, idx)


def permute_hidden(layers: Sequence[tuple[Tensor, Tensor]], perms: Sequence[Tensor]) -> Layers:
    """Apply hidden permutations: W_l <- P_l W_l P_{l-1}^T, b_l <- P_l b_l.

    ``perms[l-1]`` (one per hidden layer l = 1..L-1) is a LongTensor [d_l] shared by the batch or
    [B, d_l] per INR, with ``(P x)[j] = x[perm[j]]``. Works on any trailing dims (per-entry
    features, deltas), so it also permutes feature lists.
    """
    n_hidden = len(layers) - 1
    if len(perms) != n_hidden:
        raise ValueError(f"need {n_hidden} hidden permutations, got {len(perms)}")
    out: Layers = []
    for ell, (w, b) in enumerate(layers):
        if ell < n_hidden:  # rows of W_l and b_l are hidden neurons of layer l
            w = _take(w, perms[ell], 1)
            b = _take(b, perms[ell], 1)
        if ell > 0:  # columns of W_l are hidden neurons of layer l-1
            w = _take(w, perms[ell - 1], 2)
        out.append((w, b))
    return out


def random_hidden_perms(
    widths: Sequence[int], batch: int | None = None, generator: torch.Generator | None = None
) -> list[Tensor]:
    """One random permutation per hidden layer: [d_l] each, or [batch, d_l] if ``batch`` given."""
    perms = []
    for d in widths[1:-1]:
        if batch is None:
            perms.append(torch.randperm(d, generator=generator))
        else:
            perms.append(torch.argsort(torch.rand(batch, d, generator=generator), dim=1))
    return perms


def _mlp(d_in: int, d_hidden: int, d_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.SiLU(), nn.Linear(d_hidden, d_out))


# --------------------------------------------------------------------------- NP-NFN


class _NPLayer(nn.Module):
    """One NP-NFN-style equivariant linear layer on per-entry features."""

    def __init__(self, widths: Sequence[int], c_in: int, c_out: int):
        super().__init__()
        self.L = len(widths) - 1
        n_w = ["self", "row", "col", "all", "b_out"]
        n_b = ["self", "mean", "w_row"]
        self.w_terms = nn.ModuleList()
        self.b_terms = nn.ModuleList()
        for ell in range(self.L):
            names_w = n_w + (["b_in", "prev_row"] if ell > 0 else [])
            names_w += ["next_col"] if ell < self.L - 1 else []
            names_b = n_b + (["next_col"] if ell < self.L - 1 else [])
            self.w_terms.append(
                nn.ModuleDict({n: nn.Linear(c_in, c_out, bias=(n == "self")) for n in names_w})
            )
            self.b_terms.append(
                nn.ModuleDict({n: nn.Linear(c_in, c_out, bias=(n == "self")) for n in names_b})
            )
        # input/output neurons are not permuted: per-neuron terms are allowed there
        self.in_emb = nn.Parameter(0.1 * torch.randn(widths[0], c_out))
        self.out_emb_w = nn.Parameter(0.1 * torch.randn(widths[-1], c_out))
        self.out_emb_b = nn.Parameter(0.1 * torch.randn(widths[-1], c_out))

    def forward(self, feats: Layers) -> Layers:
        L = self.L
        row = [w.mean(2) for w, _ in feats]  # [B, d_l, c]: mean over inputs i
        col = [w.mean(1) for w, _ in feats]  # [B, d_{l-1}, c]: mean over outputs j
        out: Layers = []
        for ell, (w, b) in enumerate(feats):
            t = self.w_terms[ell]
            fw = (
                t["self"](w)
                + t["row"](row[ell]).unsqueeze(2)
                + t["col"](col[ell]).unsqueeze(1)
                + t["all"](w.mean((1, 2)))[:, None, None]
                + t["b_out"](b).unsqueeze(2)
            )
            if ell > 0:
                fw = fw + t["b_in"](feats[ell - 1][1]).unsqueeze(1)
                fw = fw + t["prev_row"](row[ell - 1]).unsqueeze(1)
            if ell < L - 1:
                fw = fw + t["next_col"](col[ell + 1]).unsqueeze(2)
            if ell == 0:
                fw = fw + self.in_emb[None, None]
            if ell == L - 1:
                fw = fw + self.out_emb_w[None, :, None]
            s = self.b_terms[ell]
            fb = s["self"](b) + s["mean"](b.mean(1)).unsqueeze(1) + s["w_row"](row[ell])
            if ell < L - 1:
                fb = fb + s["next_col"](col[ell + 1])
            if ell == L - 1:
                fb = fb + self.out_emb_b[None]
            out.append((fw, fb))
        return out


class NPNFN(nn.Module):
    """NP-NFN-style stack (``np_nfn``): equivariant to hidden-neuron permutations.

    forward(layers) -> per-entry features ``[(FW_l [B, d_l, d_{l-1}, c], Fb_l [B, d_l, c])]``.
    ReLU between equivariant layers, none after the last.
    """

    def __init__(self, widths: Sequence[int], channels: int = 32, layers: int = 3):
        super().__init__()
        self.widths = list(widths)
        dims = [1] + [channels] * layers
        self.blocks = nn.ModuleList(_NPLayer(widths, a, b) for a, b in itertools.pairwise(dims))

    def forward(self, layers: Sequence[tuple[Tensor, Tensor]]) -> Layers:
        feats: Layers = [(w.unsqueeze(-1), b.unsqueeze(-1)) for w, b in layers]
        for i, block in enumerate(self.blocks):
            feats = block(feats)
            if i < len(self.blocks) - 1:
                feats = [(torch.relu(w), torch.relu(b)) for w, b in feats]
        return feats


# --------------------------------------------------------------------------- GMN


class GMN(nn.Module):
    """Graph metanetwork (``gmn``): neurons are nodes, weights are edges l-1 -> l.

    Node init: Linear(bias) (bias 0 for input neurons) + a learned embedding per input neuron, per
    output neuron and ONE shared embedding per hidden layer. Edge init: Linear(W) + a per-layer
    embedding. Each round: e'_ij = phi_e(e_ij, h_i, h_j); h'_j = phi_v(h_j, sum_i phi_m(h_i, e'_ij),
    sum_k phi_b(h_k, e'_jk)) with residual updates (the backward sum makes message passing
    bidirectional). forward(layers) -> per-entry features like NPNFN (edges for weights, nodes for
    biases). ``shared_hidden_embedding=False`` gives each hidden neuron its own embedding, which
    breaks equivariance (negative control for tests only).
    """

    def __init__(
        self,
        widths: Sequence[int],
        channels: int = 32,
        rounds: int = 3,
        shared_hidden_embedding: bool = True,
    ):
        super().__init__()
        self.widths = list(widths)
        L = len(widths) - 1
        c = channels
        self.shared_hidden_embedding = shared_hidden_embedding
        self.node_in = nn.Linear(1, c)
        self.edge_in = nn.Linear(1, c)
        self.in_emb = nn.Parameter(torch.randn(widths[0], c))
        self.out_emb = nn.Parameter(torch.randn(widths[-1], c))
        if shared_hidden_embedding:
            self.hidden_emb = nn.ParameterList(
                nn.Parameter(torch.randn(1, c)) for _ in range(L - 1)
            )
        else:
            self.hidden_emb = nn.ParameterList(
                nn.Parameter(torch.randn(d, c)) for d in widths[1:-1]
            )
        self.edge_emb = nn.Parameter(torch.randn(L, c))
        self.phi_e = nn.ModuleList(_mlp(3 * c, c, c) for _ in range(rounds))
        self.phi_m = nn.ModuleList(_mlp(2 * c, c, c) for _ in range(rounds))
        self.phi_b = nn.ModuleList(_mlp(2 * c, c, c) for _ in range(rounds))
        self.phi_v = nn.ModuleList(_mlp(3 * c, c, c) for _ in range(rounds))

    def forward(self, layers: Sequence[tuple[Tensor, Tensor]]) -> Layers:
        L = len(layers)
        w0 = layers[0][0]
        bsz = w0.shape[0]
        zero_in = w0.new_zeros(bsz, self.widths[0], 1)
        nodes = [self.node_in(zero_in) + self.in_emb]
        for ell, (_, b) in enumerate(layers, start=1):
            emb = self.out_emb if ell == L else self.hidden_emb[ell - 1]
            nodes.append(self.node_in(b.unsqueeze(-1)) + emb)
        edges = [
            self.edge_in(w.unsqueeze(-1)) + self.edge_emb[ell] for ell, (w, _) in enumerate(layers)
        ]
        for phi_e, phi_m, phi_b, phi_v in zip(
            self.phi_e, self.phi_m, self.phi_b, self.phi_v, strict=True
        ):
            new_edges = []
            for ell, e in enumerate(edges):  # edge e[:, j, i] from node i (layer ell) to j (ell+1)
                src = nodes[ell].unsqueeze(1).expand_as(e)
                dst = nodes[ell + 1].unsqueeze(2).expand_as(e)
                new_edges.append(e + phi_e(torch.cat([e, src, dst], -1)))
            edges = new_edges
            new_nodes = []
            for n, h in enumerate(nodes):
                fwd = torch.zeros_like(h)
                bwd = torch.zeros_like(h)
                if n > 0:  # incoming edges from layer n-1
                    e = edges[n - 1]
                    src = nodes[n - 1].unsqueeze(1).expand_as(e)
                    fwd = phi_m(torch.cat([src, e], -1)).sum(2)
                if n < L:  # outgoing edges to layer n+1
                    e = edges[n]
                    dst = nodes[n + 1].unsqueeze(2).expand_as(e)
                    bwd = phi_b(torch.cat([dst, e], -1)).sum(1)
                new_nodes.append(h + phi_v(torch.cat([h, fwd, bwd], -1)))
            nodes = new_nodes
        return [(edges[ell], nodes[ell + 1]) for ell in range(L)]


# --------------------------------------------------------------------------- OCE


class OCEHead(nn.Module):
    """OCE head: per-layer, per-entry Linear(c -> k) for weights and for biases (equivariant).

    v_hat_i = v + s_i * dv_i. ``init="random"``: head weights N(0, init_std^2) (default std 1e-3),
    zero head biases, per-copy s_i = 1. ``init="zero"``: zero head weights and biases and ONE
    shared s = 1 — every copy then gets the same gradient forever (the collapse control).
    """

    def __init__(
        self, n_layers: int, channels: int, k: int, init: str = "random", init_std: float = 1e-3
    ):
        super().__init__()
        if init not in ("random", "zero"):
            raise ValueError(f"init must be 'random' or 'zero', got {init!r}")
        self.k = k
        self.init = init
        self.w_heads = nn.ModuleList(nn.Linear(channels, k) for _ in range(n_layers))
        self.b_heads = nn.ModuleList(nn.Linear(channels, k) for _ in range(n_layers))
        for lin in itertools.chain(self.w_heads, self.b_heads):
            nn.init.zeros_(lin.bias)
            if init == "zero":
                nn.init.zeros_(lin.weight)
            else:
                nn.init.normal_(lin.weight, 0.0, init_std)
        self.s = nn.Parameter(torch.ones(k if init == "random" else 1))

    def forward(
        self, layers: Sequence[tuple[Tensor, Tensor]], features: Sequence[tuple[Tensor, Tensor]]
    ) -> tuple[list[Layers], list[Layers]]:
        """Returns (edited, deltas): k INRs v_hat_i and the k raw deltas dv_i, each a layer list."""
        s = self.s.expand(self.k)
        edited: list[Layers] = [[] for _ in range(self.k)]
        deltas: list[Layers] = [[] for _ in range(self.k)]
        for ell, ((w, b), (fw, fb)) in enumerate(zip(layers, features, strict=True)):
            dw = self.w_heads[ell](fw)  # [B, d_l, d_{l-1}, k]
            db = self.b_heads[ell](fb)  # [B, d_l, k]
            for i in range(self.k):
                deltas[i].append((dw[..., i], db[..., i]))
                edited[i].append((w + s[i] * dw[..., i], b + s[i] * db[..., i]))
        return edited, deltas


def oce_render(
    edited: Sequence[Sequence[tuple[Tensor, Tensor]]],
    x: Tensor,
    act: str = "relu",
    omega: float = SIREN_OMEGA0,
) -> Tensor:
    """f_OCE(x) = (1/k) sum_i render(v_hat_i, x); [B, P, d_L]."""
    return torch.stack([render(v, x, act, omega) for v in edited]).mean(0)


def copy_separation_flat(deltas: Tensor) -> float:
    """Copy separation of deltas flattened per copy, ``[B, k, N]``: mean over inputs of
    (mean pairwise ||dv_i - dv_j||) / (mean_i ||dv_i||); 0 for k = 1 and for an input whose
    deltas are all zero."""
    k = deltas.shape[1]
    if k < 2:
        return 0.0
    flat = deltas.detach().double()
    pair = torch.stack(
        [(flat[:, i] - flat[:, j]).norm(dim=1) for i, j in itertools.combinations(range(k), 2)]
    ).mean(0)
    norm = flat.norm(dim=2).mean(1)
    ratio = torch.where(norm > 0, pair / norm.clamp_min(1e-300), torch.zeros_like(norm))
    return float(ratio.mean())


def copy_separation(deltas: Sequence[Sequence[tuple[Tensor, Tensor]]]) -> float:
    """:func:`copy_separation_flat` of k layer-list deltas (the raw head outputs dv_i, all
    entries flattened per copy)."""
    return copy_separation_flat(
        torch.stack(
            [torch.cat([t.reshape(t.shape[0], -1) for wb in d for t in wb], 1) for d in deltas],
            dim=1,
        )
    )


def count_params(module: nn.Module) -> int:
    """Number of trainable parameters (heads, s_i and embeddings included)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def render_flops(widths: Sequence[int], k: int = 1) -> int:
    """Multiply-adds x 2 to render one point with k copies of an MLP of ``widths``."""
    return 2 * k * sum(a * b for a, b in itertools.pairwise(widths))


__all__ = [
    "GMN",
    "NPNFN",
    "SIREN_OMEGA0",
    "OCEHead",
    "copy_separation",
    "copy_separation_flat",
    "count_params",
    "oce_render",
    "permute_hidden",
    "random_hidden_perms",
    "render",
    "render_flops",
    "widths_of",
]
