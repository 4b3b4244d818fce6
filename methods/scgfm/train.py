"""Pre-training of SCGFM's bases and decoder on the source graphs (paper §3.2).

Each step solves the plans of a batch of graphs against the K bases and against the graph's
proxy ``B̃(G) = Σ_k w_k B_k`` (no gradient), evaluates the GW objectives at those fixed plans as
differentiable expressions (envelope theorem) and takes an Adam step on Θ and f for

    L = L_gw + α L_rec + β L_div,
    L_gw  = mean_G GW(A, B̃(G)),   L_rec = mean_G MSE(FE(G), f(w)),
    L_div = mean_{i<j} max(0, m − ‖B_i − B_j‖_F).

On several Ray Train workers every rank solves its share of each global batch and the gradients
are summed across ranks. A step of the loop is an epoch; σ_δ (the pooled spread of δ that
standardises the coordinates) is re-estimated after every epoch and, at the end, on a fixed set of
source graphs, the procedure the untrained bases get too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from nshot.train import session

from .config import ScgfmConfig
from .data import Graph, load_split
from .model import (
    SCGFM,
    GWSolver,
    build_model,
    graph_stats,
    gw_value,
    min_basis_dist,
)

SIGMA_GRAPHS = 64  # source graphs that fix σ_δ (before and after pre-training)


def _dist() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _allreduce(t: torch.Tensor) -> torch.Tensor:
    if _dist()[1] > 1:
        torch.distributed.all_reduce(t)
    return t


def diversity_loss(B: torch.Tensor, margin: float) -> torch.Tensor:
    """mean_{i<j} max(0, m − ‖B_i − B_j‖_F)."""
    K = B.shape[0]
    i, j = torch.triu_indices(K, K, offset=1)
    d = (B[i] - B[j]).flatten(1).norm(dim=1)
    return torch.relu(margin - d).mean()


def sigma_on(model: SCGFM, graphs: list[Graph], solver: GWSolver) -> float:
    """σ_δ measured on ``graphs`` (split across ranks, pooled)."""
    rank, world = _dist()
    B = model.bases().detach().numpy()
    acc = torch.zeros(2, dtype=torch.float64)
    for g in graphs[rank::world]:
        d = np.array([solver.solve(g, b)[0] for b in B])
        c = d - d.mean()
        acc += torch.tensor([(c**2).sum(), len(c)], dtype=torch.float64)
    _allreduce(acc)
    return float(max(np.sqrt(acc[0] / max(acc[1], 1)), 1e-12))


def sigma_graphs(graphs: list[Graph], seed: int) -> list[Graph]:
    idx = np.random.default_rng([seed, 11]).permutation(len(graphs))[:SIGMA_GRAPHS]
    return [graphs[i] for i in sorted(idx)]


def batch_loss(
    model: SCGFM,
    graphs: list[Graph],
    stats: np.ndarray,
    solver: GWSolver,
    cfg: ScgfmConfig,
) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Sums over ``graphs`` of GW(A, B̃(G)) and of the statistics MSE, and their δ (n, K)."""
    B = model.bases()
    Bn = B.detach().numpy()
    K = len(Bn)
    l_gw = torch.zeros((), dtype=torch.float64)
    l_rec = torch.zeros((), dtype=torch.float64)
    deltas = np.zeros((len(graphs), K))
    target = (torch.from_numpy(stats) - model.stats_mean) / model.stats_std
    for i, g in enumerate(graphs):
        A = torch.from_numpy(g.adjacency())
        parts = []
        for k in range(K):
            _, T = solver.solve(g, Bn[k])
            parts.append(gw_value(A, B[k], torch.from_numpy(T)))
        delta = torch.stack(parts)
        deltas[i] = delta.detach().numpy()
        w = model.weights(delta, cfg.tau)
        proxy = (w[:, None, None] * B).sum(0)
        _, Tp = solver.solve(g, proxy.detach().numpy())
        l_gw = l_gw + gw_value(A, proxy, torch.from_numpy(Tp))
        l_rec = l_rec + ((model.decode(w) - target[i]) ** 2).mean()
    return l_gw, l_rec, deltas


def init_model(cfg: ScgfmConfig, seed: int, source: list[Graph], stats: np.ndarray) -> SCGFM:
    """Untrained Θ and f (seeded), with the statistics scale and σ_δ of the source graphs: what
    the ``random_bases`` row uses and what pre-training starts from."""
    model = build_model(cfg, seed)
    model.stats_mean.copy_(torch.from_numpy(stats.mean(0)))
    model.stats_std.copy_(torch.from_numpy(np.maximum(stats.std(0), 1e-6)))
    model.sigma_delta.fill_(sigma_on(model, sigma_graphs(source, seed), GWSolver.from_config(cfg)))
    return model


def source_data(cfg: ScgfmConfig) -> tuple[list[Graph], np.ndarray]:
    graphs, _ = load_split(cfg, "source")
    return graphs, np.stack([graph_stats(g) for g in graphs])


def make_optimizer(model: SCGFM, cfg: ScgfmConfig) -> torch.optim.Optimizer:
    return torch.optim.Adam(
        [{"params": [model.theta], "lr": cfg.lr_theta},
         {"params": model.decoder.parameters(), "lr": cfg.lr_f}]
    )  # fmt: skip


def pretrain(
    cfg: ScgfmConfig,
    seed: int,
    *,
    model: SCGFM | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    start_epoch: int = 0,
    on_epoch: Callable[[int, dict[str, float], SCGFM, torch.optim.Optimizer], None] | None = None,
    before_epoch: Callable[[int], None] | None = None,
    data: tuple[list[Graph], np.ndarray] | None = None,
) -> tuple[SCGFM, list[dict[str, float]]]:
    """Pre-train for ``cfg.steps`` epochs (from ``start_epoch`` when resumed) and fix σ_δ."""
    rank, world = _dist()
    solver = GWSolver.from_config(cfg)
    source, stats = data if data is not None else source_data(cfg)
    if model is None:
        model = init_model(cfg, seed, source, stats)
    opt = optimizer or make_optimizer(model, cfg)
    history: list[dict[str, float]] = []
    n = len(source)
    for epoch in range(start_epoch + 1, cfg.steps + 1):
        if before_epoch is not None:
            before_epoch(epoch)
        t0 = time.time()
        order = np.random.default_rng([seed, epoch]).permutation(n)
        sums = torch.zeros(5, dtype=torch.float64)  # l_gw, l_rec, graphs, Σc², count
        for s in range(0, n, cfg.batch):
            idx = order[s : s + cfg.batch]
            mine = idx[rank::world]
            l_gw, l_rec, deltas = batch_loss(
                model, [source[i] for i in mine], stats[mine], solver, cfg
            )
            l_div = diversity_loss(model.bases(), cfg.margin)
            loss = (l_gw + cfg.alpha * l_rec) / len(idx) + cfg.beta * l_div / world
            opt.zero_grad(set_to_none=True)
            loss.backward()
            for p in model.parameters():
                if p.grad is not None:
                    _allreduce(p.grad)
            opt.step()
            c = deltas - deltas.mean(1, keepdims=True)
            sums += torch.tensor(
                [float(l_gw.detach()), float(l_rec.detach()), len(mine), (c**2).sum(), c.size],
                dtype=torch.float64,
            )
        _allreduce(sums)
        model.sigma_delta.fill_(float(max(np.sqrt(sums[3] / max(sums[4], 1)), 1e-12)))
        with torch.no_grad():
            B = model.bases()
            l_div = float(diversity_loss(B, cfg.margin))
            mbd = min_basis_dist(B)
        m_gw, m_rec = float(sums[0] / sums[2]), float(sums[1] / sums[2])
        total = m_gw + cfg.alpha * m_rec + cfg.beta * l_div
        rec = {"loss": total, "neg_loss": -total, "L_gw": m_gw, "L_rec": m_rec, "L_div": l_div,
               "min_basis_dist": mbd, "sigma_delta": float(model.sigma_delta),
               "epoch_s": time.time() - t0}  # fmt: skip
        if epoch == cfg.steps:  # the final σ_δ: fixed source graphs, as for untrained bases
            model.sigma_delta.fill_(sigma_on(model, sigma_graphs(source, seed), solver))
            rec["sigma_delta"] = float(model.sigma_delta)
        history.append(rec)
        if on_epoch is not None:
            on_epoch(epoch, rec, model, opt)
    return model, history


def checkpoint_extra(model: SCGFM, cfg: ScgfmConfig, history: list[dict[str, float]]) -> dict:
    return {
        "shape": model.shape(),
        "solver": GWSolver.from_config(cfg).to_dict(),
        "tau": cfg.tau,
        "history": history,
    }


def train_loop(cfg: ScgfmConfig) -> None:
    """Pre-training under Ray Train: every worker solves its slice of each batch of source
    graphs; reports L_gw, L_rec, L_div and the minimum basis distance per epoch; checkpoints Θ,
    f, σ_δ and the solver every ``checkpoint_every`` epochs and at the end; resumes from the
    last checkpoint."""
    torch.set_num_threads(cfg.torch_threads)
    ctx = session.context()
    data = source_data(cfg)
    model = build_model(cfg, cfg.seed)
    opt = make_optimizer(model, cfg)
    restored = session.restore(model, opt)
    start = restored.step if restored else 0
    history: list[dict[str, Any]] = list(restored.extra.get("history", [])) if restored else []
    if restored is None:
        model = init_model(cfg, cfg.seed, *data)
        opt = make_optimizer(model, cfg)

    def on_epoch(epoch: int, rec: dict[str, float], m: SCGFM, o: torch.optim.Optimizer) -> None:
        history.append(rec)
        ckpt = epoch % cfg.checkpoint_every == 0 or epoch == cfg.steps
        if epoch % cfg.log_every and not ckpt:
            return
        session.report(
            {k: v for k, v in rec.items()}, step=epoch, model=m, optimizer=o,
            extra=checkpoint_extra(m, cfg, history), checkpoint=ckpt,
            samples=len(data[0]) // ctx.world_size,
        )  # fmt: skip

    pretrain(
        cfg, cfg.seed, model=model, optimizer=opt, start_epoch=start, on_epoch=on_epoch,
        before_epoch=lambda e: session.maybe_inject_fault(e, restored), data=data,
    )  # fmt: skip
