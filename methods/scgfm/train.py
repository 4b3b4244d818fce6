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

import numpy as np
import torch

from nshot.train.trainer import Recipe, train

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


def _allreduce(t: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    """Sum ``t`` over the workers in place (through ``device``, the model's, when ``t`` lives
    elsewhere: a GPU worker group reduces GPU tensors)."""
    if _dist()[1] > 1:
        if device is None or t.device == device:
            torch.distributed.all_reduce(t)
        else:
            on = t.to(device)
            torch.distributed.all_reduce(on)
            t.copy_(on)
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
    B = model.bases().detach().cpu().numpy()
    acc = torch.zeros(2, dtype=torch.float64)
    for g in graphs[rank::world]:
        d = np.array([solver.solve(g, b)[0] for b in B])
        c = d - d.mean()
        acc += torch.tensor([(c**2).sum(), len(c)], dtype=torch.float64)
    _allreduce(acc, model.theta.device)
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
    """Sums over ``graphs`` of GW(A, B̃(G)) and of the statistics MSE, and their δ (n, K). The
    plans are solved on the CPU; the differentiable terms follow the model's device."""
    B = model.bases()
    dev = B.device
    Bn = B.detach().cpu().numpy()
    K = len(Bn)
    l_gw = torch.zeros((), dtype=torch.float64, device=dev)
    l_rec = torch.zeros((), dtype=torch.float64, device=dev)
    deltas = np.zeros((len(graphs), K))
    target = (torch.from_numpy(stats).to(dev) - model.stats_mean) / model.stats_std
    for i, g in enumerate(graphs):
        A = torch.from_numpy(g.adjacency()).to(dev)
        parts = []
        for k in range(K):
            _, T = solver.solve(g, Bn[k])
            parts.append(gw_value(A, B[k], torch.from_numpy(T).to(dev)))
        delta = torch.stack(parts)
        deltas[i] = delta.detach().cpu().numpy()
        w = model.weights(delta, cfg.tau)
        proxy = (w[:, None, None] * B).sum(0)
        _, Tp = solver.solve(g, proxy.detach().cpu().numpy())
        l_gw = l_gw + gw_value(A, proxy, torch.from_numpy(Tp).to(dev))
        l_rec = l_rec + ((model.decode(w) - target[i]) ** 2).mean()
    return l_gw, l_rec, deltas


def init_model(cfg: ScgfmConfig, seed: int, source: list[Graph], stats: np.ndarray) -> SCGFM:
    """Untrained Θ and f (seeded), with the statistics scale and σ_δ of the source graphs: what
    the ``random_bases`` row uses and what pre-training starts from."""
    return init_scales(build_model(cfg, seed), cfg, seed, source, stats)


def init_scales(
    model: SCGFM, cfg: ScgfmConfig, seed: int, source: list[Graph], stats: np.ndarray
) -> SCGFM:
    """Set ``model``'s statistics scale and σ_δ from the source graphs (in place)."""
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


class PretrainRecipe(Recipe):
    """Pre-training of Θ and f, one epoch per step: Adam on each batch of the epoch's seeded
    order (every worker solves its slice of the batch; the workers sum their gradients), then
    σ_δ re-estimated from the epoch's δ, and at the last epoch fixed on the σ graphs. Each
    report is the epoch's record (L_gw, L_rec, L_div, the minimum basis distance, σ_δ); the
    checkpoint keeps the records of every epoch."""

    def __init__(
        self,
        cfg: ScgfmConfig,
        seed: int | None = None,
        data: tuple[list[Graph], np.ndarray] | None = None,
    ) -> None:
        super().__init__(cfg)
        self.seed = cfg.seed if seed is None else seed
        self.data = data

    def build(self) -> None:
        cfg = self.cfg
        self.solver = GWSolver.from_config(cfg)
        self.source, self.stats = self.data if self.data is not None else source_data(cfg)
        self.model = build_model(cfg, self.seed)
        self.optimizer = make_optimizer(self.model, cfg)
        # the model is used through its bases and decoder, never called: no DDP wrapper; the
        # workers sum their gradients in step()
        self.forward = self.batch_loss
        self.samples_per_step = len(self.source) // self.world_size
        self.history: list[dict[str, float]] = []
        self.scaled = False

    def batch_loss(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        return batch_loss(self.model, [self.source[i] for i in idx], self.stats[idx],
                          self.solver, self.cfg)  # fmt: skip

    def on_restore(self, restored) -> None:  # noqa: ANN001
        self.history = list(restored.extra.get("history", []))
        self.scaled = True  # the checkpoint holds the scales

    def step(self, epoch: int) -> dict[str, float]:
        cfg, model, opt = self.cfg, self.model, self.optimizer
        rank, world, device = self.rank, self.world_size, model.theta.device
        if not self.scaled:  # a fresh start: the scales of the untrained bases
            init_scales(model, cfg, self.seed, self.source, self.stats)
            self.scaled = True
        t0 = time.time()
        n = len(self.source)
        order = np.random.default_rng([self.seed, epoch]).permutation(n)
        sums = torch.zeros(5, dtype=torch.float64)  # l_gw, l_rec, graphs, Σc², count
        for s in range(0, n, cfg.batch):
            idx = order[s : s + cfg.batch]
            mine = idx[rank::world]
            l_gw, l_rec, deltas = self.forward(mine)
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
        _allreduce(sums, device)
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
            model.sigma_delta.fill_(sigma_on(model, sigma_graphs(self.source, self.seed),
                                             self.solver))  # fmt: skip
            rec["sigma_delta"] = float(model.sigma_delta)
        self.history.append(rec)
        return {}

    def on_report(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        return dict(self.history[-1])  # the reported epoch's record, not a mean over epochs

    def extra(self) -> dict:
        return checkpoint_extra(self.model, self.cfg, self.history)


def pretrain(
    cfg: ScgfmConfig, seed: int, *, data: tuple[list[Graph], np.ndarray] | None = None
) -> tuple[SCGFM, list[dict[str, float]]]:
    """Pre-train for ``cfg.steps`` epochs in this process and fix σ_δ: the model and every
    epoch's record."""
    recipe = train(PretrainRecipe(cfg, seed, data), session=False)
    return recipe.model, recipe.history


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
    train(PretrainRecipe(cfg))
