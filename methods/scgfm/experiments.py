"""`nshot reproduce scgfm`: SCGFM against untrained bases, its ablation and classical baselines
(``experiment=pretraining``: what pre-training buys at each learning rate of the bases).

Per seed of the bases, one Ray task pre-trains Θ and f on the source families; then each set of
bases (pre-trained, and the untrained ones of the same seed) embeds the target families (both
feature variants), the held-out source graphs and the molecules as its own Ray tasks. Every row
is scored on the same few-shot episodes of a seed: ``shots`` labelled graphs per class, tested on
all the others, ``episodes`` times, with a logistic regression (C = 1) on standardised
embeddings (the WL kernel: an SVM on its kernel; GIN: trained on the shots).

Rows: ``scgfm``, ``random_bases`` (the same pipeline with untrained Θ and f), ``scgfm_no_h``
(z = [w ‖ f(w)] without the re-encoded features), ``raw_features`` (mean-pooled node features),
``gw_dictionary`` (POT's GW dictionary learning on the source graphs + linear unmixing),
``wl_kernel`` (GraKeL, degree labels), ``gin`` (plain-torch GIN trained on the shots) and the
negative control ``scgfm_rewired`` (target graphs replaced by Erdős–Rényi graphs with the same
numbers of nodes and edges, labels and noise features kept).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nshot.experiment import Job, aggregate, fetch, run_jobs, submit
from nshot.method import ResultsTable

from .config import ScgfmConfig
from .data import Graph, MoleculesUnavailable, load_molecules, load_split
from .model import (
    SCGFM,
    GWSolver,
    build_model,
    coordinates,
    gw_value,
    gw_value_np,
    min_basis_dist,
    reencode,
    solve_graphs,
)

SYSTEMS = (
    "scgfm",
    "random_bases",
    "scgfm_no_h",
    "raw_features",
    "gw_dictionary",
    "wl_kernel",
    "gin",
    "scgfm_rewired",
)
METRICS = {
    "acc_target_noise": True,
    "acc_target_deg": True,
    "acc_source": True,
    "acc_mol": True,
    "min_basis_dist": True,
    "stability_rho": True,
    "perm_err_w": False,
}
DATASETS = ("target_noise", "target_deg", "source", "mol")


# --------------------------------------------------------------------------- episodes


def episodes(labels: np.ndarray, shots: int, n: int, seed: int) -> list[tuple[np.ndarray, ...]]:
    """``n`` episodes: ``shots`` labelled graphs per class (train) and every other one (test)."""
    out = []
    classes = np.unique(labels)
    for e in range(n):
        rng = np.random.default_rng([seed, e, 5])
        tr = np.concatenate(
            [rng.choice(np.flatnonzero(labels == c), shots, replace=False) for c in classes]
        )
        te = np.setdiff1d(np.arange(len(labels)), tr)
        out.append((tr, te))
    return out


def standardise(z: np.ndarray) -> np.ndarray:
    mu, sd = z.mean(0, keepdims=True), z.std(0, keepdims=True)
    return (z - mu) / np.where(sd > 1e-9, sd, 1.0)


def lr_accuracy(z: np.ndarray, labels: np.ndarray, eps: list) -> list[float]:
    """Per-episode accuracy of a logistic regression (C = 1) on standardised ``z``."""
    from sklearn.linear_model import LogisticRegression

    z = standardise(z)
    accs = []
    for tr, te in eps:
        head = LogisticRegression(C=1.0, max_iter=1000).fit(z[tr], labels[tr])
        accs.append(float((head.predict(z[te]) == labels[te]).mean()))
    return accs


def datasets(cfg: ScgfmConfig) -> tuple[dict[str, tuple[list[Graph], np.ndarray]], str | None]:
    """The evaluation sets; the molecules may be missing offline (the reason is returned)."""
    out = {
        "target_noise": load_split(cfg, "target", "noise"),
        "target_deg": load_split(cfg, "target", "deg"),
        "source": load_split(cfg, "source_test"),
    }
    reason = None
    if cfg.mol_per_class > 0:
        try:
            out["mol"] = load_molecules(cfg)
        except MoleculesUnavailable as err:
            reason = str(err)
    else:
        reason = "mol_per_class = 0"
    return out, reason


def rewired(graphs: list[Graph], seed: int) -> list[Graph]:
    """Erdős–Rényi G(n, m) graphs with each graph's numbers of nodes and edges (and its
    features): the negative control keeps the size, drops the structure."""
    import networkx as nx

    from .data import graph_from_nx

    out = []
    for i, g in enumerate(graphs):
        h = graph_from_nx(nx.gnm_random_graph(g.n, len(g.edges), seed=seed * 100_003 + i))
        out.append(Graph(g.n, h.edges, g.x))
    return out


# --------------------------------------------------------------------------- SCGFM rows


def bases_accuracies(
    model: SCGFM, solver: GWSolver, tau: float, data: dict, eps: dict, *, no_h: bool = False
) -> tuple[dict[str, float | None], dict[str, float | None]]:
    """Mean episode accuracy per dataset with z = [w ‖ f(w) ‖ vec(H)] (and without H). The
    target's two feature variants share their graphs: their plans are solved once."""
    full: dict[str, float | None] = {}
    bare: dict[str, float | None] = {}
    solved: dict[str, Any] = {}
    for name, (graphs, labels) in data.items():
        key = "target" if name.startswith("target") else name
        if key not in solved:
            deltas, plans = solve_graphs(model, graphs, solver)
            solved[key] = (*coordinates(model, deltas, tau), plans)
        w, fw, plans = solved[key]
        h = reencode(w, plans, [g.x for g in graphs])
        full[f"acc_{name}"] = float(np.mean(lr_accuracy(np.hstack([w, fw, h]), labels, eps[name])))
        if no_h:
            bare[f"acc_{name}"] = float(np.mean(lr_accuracy(np.hstack([w, fw]), labels, eps[name])))
    return full, bare


def stability_rho(
    model: SCGFM, solver: GWSolver, tau: float, graphs: list[Graph], pairs: int, seed: int
) -> float:
    """Spearman ρ between ‖w − w′‖₂ and GW(A, A′) over random pairs of ``graphs``."""
    from scipy.stats import spearmanr

    deltas, _ = solve_graphs(model, graphs, solver)
    w, _ = coordinates(model, deltas, tau)
    rng = np.random.default_rng([seed, 3])
    n = len(graphs)
    seen: set[tuple[int, int]] = set()
    while len(seen) < min(pairs, n * (n - 1) // 2):
        i, j = sorted(rng.choice(n, 2, replace=False).tolist())
        seen.add((i, j))
    pw = [float(np.linalg.norm(w[i] - w[j])) for i, j in sorted(seen)]
    gw = [solver.solve_pair(graphs[i], graphs[j]) for i, j in sorted(seen)]
    return float(spearmanr(pw, gw).statistic)


def perm_errors(
    model: SCGFM, solver: GWSolver, tau: float, graphs: list[Graph], seed: int
) -> dict[str, float]:
    """Under a random node relabelling (A → PAPᵀ, X → PX): max |Δw|, max |Δz|, and the max and
    median |Δδ| over ``graphs``."""
    rng = np.random.default_rng([seed, 17])
    perm = [g.permuted(rng.permutation(g.n)) for g in graphs]
    d0, p0 = solve_graphs(model, graphs, solver)
    d1, p1 = solve_graphs(model, perm, solver)
    w0, f0 = coordinates(model, d0, tau)
    w1, f1 = coordinates(model, d1, tau)
    z0 = np.hstack([w0, f0, reencode(w0, p0, [g.x for g in graphs])])
    z1 = np.hstack([w1, f1, reencode(w1, p1, [g.x for g in perm])])
    dd = np.abs(d0 - d1).max(1)
    return {
        "perm_err_w": float(np.abs(w0 - w1).max()),
        "perm_err_z": float(np.abs(z0 - z1).max()),
        "max_ddelta": float(dd.max()),
        "median_ddelta": float(np.median(dd)),
    }


def _model_from(cfg: ScgfmConfig, seed: int, state: dict[str, torch.Tensor] | None) -> SCGFM:
    from .train import init_model, source_data

    if state is None:  # the untrained bases and decoder of this seed
        return init_model(cfg, seed, *source_data(cfg))
    model = build_model(cfg, seed)
    model.load_state_dict(state)
    return model


def _pretrain_job(cfg_dict: dict[str, Any], seed: int) -> dict[str, Any]:
    from .train import pretrain

    t0 = time.process_time()
    cfg = ScgfmConfig.validated(cfg_dict)
    model, hist = pretrain(cfg, seed)  # on the GPU the job holds, if it holds one
    return {"state": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
            "history": hist,
            "cpu_s": time.process_time() - t0}  # fmt: skip


def _bases_job(
    cfg_dict: dict[str, Any], seed: int, pretrained: dict[str, Any] | None
) -> dict[str, Any]:
    """Every row of one set of bases (``pretrained``: a pre-training job's result; None: the
    untrained bases of the seed): accuracies (with and without H), the minimum basis
    distance, stability ρ, permutation errors, and (trained bases) the rewired control."""
    t0 = time.process_time()
    state = None if pretrained is None else pretrained["state"]
    cfg = ScgfmConfig.validated(cfg_dict)
    model = _model_from(cfg, seed, state)
    solver = GWSolver.from_config(cfg)
    data, _ = datasets(cfg)
    eps = {k: episodes(y, cfg.shots, cfg.episodes, seed) for k, (_, y) in data.items()}
    full, bare = bases_accuracies(model, solver, cfg.tau, data, eps, no_h=state is not None)
    tg, ty = data["target_noise"]
    rng = np.random.default_rng([seed, 23])
    pick = rng.permutation(len(tg))[: cfg.stability_graphs]
    src, _ = data["source"]
    out: dict[str, Any] = {
        **full,
        "min_basis_dist": min_basis_dist(model.bases().detach()),
        "stability_rho": stability_rho(
            model, solver, cfg.tau, [tg[i] for i in sorted(pick)], cfg.stability_pairs, seed
        ),
        **perm_errors(model, solver, cfg.tau, src[: cfg.perm_graphs], seed),
        "sigma_delta": float(model.sigma_delta),
    }
    if state is not None:
        out["no_h"] = bare
        rw = rewired(tg, seed)
        rw_acc, _ = bases_accuracies(
            model,
            solver,
            cfg.tau,
            {"target_noise": (rw, ty)},
            {"target_noise": eps["target_noise"]},
        )
        out["rewired"] = rw_acc
        # what the rewired graphs keep: the numbers of nodes and edges (and so the density)
        size = np.array([[g.n, len(g.edges), 2 * len(g.edges) / (g.n * (g.n - 1))] for g in tg])
        out["size_only_acc"] = float(np.mean(lr_accuracy(size, ty, eps["target_noise"])))
    out["cpu_s"] = time.process_time() - t0
    return out


# --------------------------------------------------------------------------- baselines


def _raw_features(graphs: list[Graph]) -> np.ndarray:
    return np.stack([g.x.mean(0) for g in graphs])


def wl_kernel_matrix(graphs: list[Graph]) -> np.ndarray:
    """GraKeL's WL subtree kernel (3 iterations, vertex histogram, normalised) on degree labels."""
    import warnings

    from grakel import graph_from_networkx
    from grakel.kernels import VertexHistogram, WeisfeilerLehman

    gs = []
    for g in graphs:
        h = g.nx()
        deg = dict(h.degree())
        for v in h.nodes:
            h.nodes[v]["deg"] = int(deg[v])
        gs.append(h)
    kern = WeisfeilerLehman(n_iter=3, base_graph_kernel=VertexHistogram, normalize=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(kern.fit_transform(list(graph_from_networkx(gs, node_labels_tag="deg"))))


def svm_accuracy(kmat: np.ndarray, labels: np.ndarray, eps: list) -> list[float]:
    from sklearn.svm import SVC

    accs = []
    for tr, te in eps:
        svm = SVC(kernel="precomputed").fit(kmat[np.ix_(tr, tr)], labels[tr])
        accs.append(float((svm.predict(kmat[np.ix_(te, tr)]) == labels[te]).mean()))
    return accs


def gin_accuracy(
    graphs: list[Graph], labels: np.ndarray, eps: list, epochs: int, seed: int
) -> list[float]:
    """A 3-layer GIN (sum readout) trained on each episode's shots on the graphs' own
    features, Adam, full batch."""
    from nshot.nn.graph import GIN

    def batch(idx: np.ndarray):
        xs, es, bs, off = [], [], [], 0
        for k, i in enumerate(idx):
            g = graphs[i]
            xs.append(torch.as_tensor(g.x, dtype=torch.float32))
            e = torch.as_tensor(g.edges.T, dtype=torch.long) + off
            es.append(torch.cat([e, e.flip(0)], 1))
            bs.append(torch.full((g.n,), k, dtype=torch.long))
            off += g.n
        return torch.cat(xs), torch.cat(es, 1), torch.cat(bs), len(idx)

    n_cls = int(labels.max()) + 1
    accs = []
    for e, (tr, te) in enumerate(eps):
        torch.manual_seed(seed * 1000 + e)
        net = GIN(graphs[0].x.shape[1], hidden=32, out_dim=n_cls, n_layers=3, pool="sum")
        opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        xb, eb, bb, nb = batch(tr)
        y = torch.as_tensor(labels[tr])
        for _ in range(epochs):
            loss = torch.nn.functional.cross_entropy(net(xb, eb, bb, nb), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            pred = net(*batch(te)).argmax(-1).numpy()
        accs.append(float((pred == labels[te]).mean()))
    return accs


def gw_dictionary_embed(cfg: ScgfmConfig, seed: int, sets: dict) -> dict[str, np.ndarray]:
    """POT's GW dictionary (K atoms of M nodes) learned on source graphs; a graph's embedding
    is its linear unmixing weights."""
    import ot

    src, _ = load_split(cfg, "source")
    rng = np.random.default_rng([seed, 29])
    pick = rng.permutation(len(src))[: cfg.dict_graphs]
    Cs = [src[i].adjacency() for i in sorted(pick)]
    Cdict, _ = ot.gromov.gromov_wasserstein_dictionary_learning(
        Cs, D=cfg.n_bases, nt=cfg.basis_size, epochs=cfg.dict_epochs, batch_size=16,
        learning_rate=0.1, random_state=seed, use_adam_optimizer=True,
    )  # fmt: skip
    out = {}
    for name, graphs in sets.items():
        ws = []
        for g in graphs:
            w, *_ = ot.gromov.gromov_wasserstein_linear_unmixing(g.adjacency(), Cdict, reg=0.0)
            ws.append(np.asarray(w))
        out[name] = np.stack(ws)
    return out


def _baseline_job(cfg_dict: dict[str, Any], seed: int, system: str) -> dict[str, float | None]:
    t0 = time.process_time()
    cfg = ScgfmConfig.validated(cfg_dict)
    data, _ = datasets(cfg)
    eps = {k: episodes(y, cfg.shots, cfg.episodes, seed) for k, (_, y) in data.items()}
    out: dict[str, float | None] = {}
    if system == "gw_dictionary":
        structures = {"target": data["target_deg"][0]} | {
            k: data[k][0] for k in ("source", "mol") if k in data
        }
        emb = gw_dictionary_embed(cfg, seed, structures)
    kmats: dict[str, np.ndarray] = {}
    for name, (graphs, labels) in data.items():
        key = "target" if name.startswith("target") else name
        if system == "raw_features":
            accs = lr_accuracy(_raw_features(graphs), labels, eps[name])
        elif system == "wl_kernel":
            if key not in kmats:
                kmats[key] = wl_kernel_matrix(graphs)
            accs = svm_accuracy(kmats[key], labels, eps[name])
        elif system == "gin":
            accs = gin_accuracy(graphs, labels, eps[name], cfg.gin_epochs, seed)
        elif system == "gw_dictionary":
            accs = lr_accuracy(emb[key], labels, eps[name])
        else:
            raise ValueError(f"unknown baseline {system!r}")
        out[f"acc_{name}"] = float(np.mean(accs))
    out["cpu_s"] = time.process_time() - t0
    return out


# --------------------------------------------------------------------------- unit measurements


def unit_measurements(cfg: ScgfmConfig) -> dict[str, float]:
    """Invariance of δ, w and z under node relabelling (entropic solver; exact solver with and
    without canonical order), the envelope gradient against finite differences, and the plan
    marginals of the exact solver."""
    src, _ = load_split(cfg, "source_test")
    model = build_model(cfg, 0)
    with torch.no_grad():
        model.sigma_delta.fill_(0.03)
    rng = np.random.default_rng(0)
    picks = [src[i] for i in rng.permutation(len(src))[:16]]
    out: dict[str, float] = {}
    # the entropic solver's own equivariance, on graphs whose WL colouring is discrete (no
    # non-trivial automorphism), without canonical order: only summation order differs
    ent = GWSolver("entropic", epsilon=cfg.epsilon, max_iter=cfg.entropic_iter, canonical=False)
    mixed = [src[i] for i in rng.permutation(len(src))]
    e = perm_errors(model, ent, cfg.tau, asymmetric(mixed)[: min(4, cfg.perm_graphs)], 1)
    out |= {"entropic_max_ddelta": e["max_ddelta"], "entropic_perm_err_w": e["perm_err_w"],
            "entropic_perm_err_z": e["perm_err_z"]}  # fmt: skip
    ex = perm_errors(model, GWSolver("exact", starts=cfg.starts), cfg.tau, picks, 1)
    out |= {"exact_median_ddelta": ex["median_ddelta"], "exact_max_ddelta": ex["max_ddelta"]}
    raw = perm_errors(model, GWSolver("exact", starts=1, canonical=False), cfg.tau, picks, 1)
    out["exact_plain_median_ddelta"] = raw["median_ddelta"]
    out |= envelope_check(cfg)
    return out


def asymmetric(graphs: list[Graph]) -> list[Graph]:
    """The graphs whose 3-round Weisfeiler–Lehman colouring gives every node its own colour."""
    import warnings

    import networkx as nx

    out = []
    for g in graphs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            h = nx.weisfeiler_lehman_subgraph_hashes(g.nx(), iterations=3)
        if len({tuple(v) for v in h.values()}) == g.n:
            out.append(g)
    return out


def envelope_check(cfg: ScgfmConfig, seed: int = 0) -> dict[str, float]:
    """max |autograd ∂GW/∂B − central finite differences| at a fixed exact plan, max |autograd −
    2(B ⊙ qqᵀ − TᵀAT)|, and the plans' largest marginal error."""
    src, _ = load_split(cfg, "source_test")
    model = build_model(cfg, seed)
    B = model.bases().detach()
    solver = GWSolver("exact", starts=cfg.starts)
    grad_err = analytic_err = marg_err = 0.0
    for g in src[:3]:
        for k in range(len(B)):
            _, T = solver.solve(g, B[k].numpy())
            n, m = T.shape
            marg_err = max(marg_err, np.abs(T.sum(1) - 1 / n).max(), np.abs(T.sum(0) - 1 / m).max())
            A, Tt = torch.from_numpy(g.adjacency()), torch.from_numpy(T)
            b = B[k].clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(gw_value(A, b, Tt), b)
            q = Tt.sum(0)
            analytic = 2 * (B[k] * torch.outer(q, q) - Tt.T @ A @ Tt)
            analytic_err = max(analytic_err, float((grad - analytic).abs().max()))
            h = 1e-5
            fd = np.zeros((m, m))
            Bn = B[k].numpy()
            for i in range(m):
                for j in range(m):
                    up, dn = Bn.copy(), Bn.copy()
                    up[i, j] += h
                    dn[i, j] -= h
                    fd[i, j] = (
                        gw_value_np(g.adjacency(), up, T) - gw_value_np(g.adjacency(), dn, T)
                    ) / (2 * h)
            grad_err = max(grad_err, float(np.abs(grad.numpy() - fd).max()))
    return {"envelope_grad_err": grad_err, "envelope_analytic_err": analytic_err,
            "plan_marginal_err": float(marg_err)}  # fmt: skip


def _unit_job(cfg_dict: dict[str, Any]) -> dict[str, float]:
    return unit_measurements(ScgfmConfig.validated(cfg_dict))


# --------------------------------------------------------------------------- the comparison


def _sweep_job(cfg_dict: dict[str, Any], seed: int, lr: float | None) -> dict[str, Any]:
    """``experiment=pretraining``: the bases of ``seed`` pre-trained at ``lr_theta = lr`` (None:
    untrained) and their accuracies on the target families and held-out source graphs."""
    from .train import pretrain

    t0 = time.process_time()
    cfg = ScgfmConfig.validated({**cfg_dict, "lr_theta": lr or cfg_dict["lr_theta"]})
    hist: list[dict[str, float]] = []
    if lr is None:
        model = _model_from(cfg, seed, None)
    else:
        model, hist = pretrain(cfg, seed)
        model = model.cpu()  # the bases are evaluated by the CPU's GW solver (NumPy)
    data, _ = datasets(cfg.model_copy(update={"mol_per_class": 0}))
    eps = {k: episodes(y, cfg.shots, cfg.episodes, seed) for k, (_, y) in data.items()}
    full, _ = bases_accuracies(model, GWSolver.from_config(cfg), cfg.tau, data, eps)
    out: dict[str, Any] = {**full, "min_basis_dist": min_basis_dist(model.bases().detach())}
    if hist:
        out["loss_ratio"] = hist[-1]["loss"] / hist[0]["loss"]
        out["gw_ratio"] = hist[-1]["L_gw"] / hist[0]["L_gw"]
        out["rec_ratio"] = hist[-1]["L_rec"] / hist[0]["L_rec"]
        out["curves"] = {k: [r[k] for r in hist] for k in ("loss", "L_gw", "L_rec", "L_div")}
    out["cpu_s"] = time.process_time() - t0
    return out


SWEEP_METRICS = {
    "acc_target_noise": True,
    "acc_target_deg": True,
    "acc_source": True,
    "min_basis_dist": True,
    "loss_ratio": False,
    "gw_ratio": False,
    "rec_ratio": False,
}


def lr_row(lr: float) -> str:
    """The row of learning rate ``lr`` (``lr_0p05`` for 0.05: a name the claims can use)."""
    return "lr_" + f"{lr:g}".replace(".", "p").replace("-", "m")


def run_pretraining_sweep(cfg: ScgfmConfig, workdir: Path) -> ResultsTable:
    """Pre-training at each learning rate of the bases against the untrained bases, paired by
    seed (the same episodes): does the loss move, and do the moved bases embed better?"""
    t0 = time.time()
    workdir.mkdir(parents=True, exist_ok=True)
    base = cfg.model_dump()
    datasets(cfg.model_copy(update={"mol_per_class": 0}))  # build the cached tables once
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    lrs: list[float | None] = [*cfg.sweep_lr_theta, None]
    jobs = [
        Job((lr, s), _sweep_job, (base, s, lr), trains=lr is not None) for lr in lrs for s in seeds
    ]
    out = run_jobs(jobs, description="scgfm: pre-training sweep")
    results: dict[tuple, dict[str, float | None]] = {}
    for lr in lrs:
        row = "random_bases" if lr is None else lr_row(lr)
        for s in seeds:
            results[(row, s)] = {m: out[(lr, s)].get(m) for m in SWEEP_METRICS}
    rows, stds, samples = aggregate(results)
    curves = {
        lr_row(lr): {
            k: [float(np.mean(v)) for v in zip(*(out[(lr, s)]["curves"][k] for s in seeds))]
            for k in ("loss", "L_gw", "L_rec", "L_div")
        }
        for lr in cfg.sweep_lr_theta
    }
    extra = {
        "curves": curves,
        "lr_theta": {lr_row(lr): lr for lr in cfg.sweep_lr_theta},
        "job_cpu_s": {str(k): v["cpu_s"] for k, v in out.items()},
    }
    notes = [
        f"{len(seeds)} seeds of the bases; each row pre-trains the seed's bases for {cfg.steps} "
        f"epochs on {4 * cfg.source_per_family} source graphs at lr_theta = the row's rate "
        f"(lr_f = {cfg.lr_f}); random_bases: the same seed's untrained bases. Every row of a "
        f"seed is scored on the same {cfg.episodes} episodes of {cfg.shots} shots per class.",
        "loss_ratio, gw_ratio, rec_ratio: the last epoch's L, L_gw, L_rec over the first's.",
    ]
    _plot_sweep(curves, workdir / "scgfm_pretraining.png")
    return ResultsTable(
        method="scgfm", preset=cfg.preset, seeds=len(seeds), metrics=SWEEP_METRICS, rows=rows,
        stds=stds, samples=samples, runtime_s=time.time() - t0, notes=notes, extra=extra,
        experiment="pretraining",
    )  # fmt: skip


def _plot_sweep(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for row, c in curves.items():
        for ax, k in zip(axes, ("loss", "L_gw", "L_rec"), strict=True):
            ax.plot(range(1, len(c[k]) + 1), c[k], label=row)
            ax.set_title(k)
            ax.set_xlabel("pre-training epoch")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_experiments(cfg: ScgfmConfig, workdir: Path) -> ResultsTable:
    if cfg.experiment == "pretraining":
        return run_pretraining_sweep(cfg, workdir)
    t0 = time.time()
    workdir.mkdir(parents=True, exist_ok=True)
    base = cfg.model_dump()
    _, mol_reason = datasets(cfg)  # builds and caches the tables once, before the tasks
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    # pre-training first; each seed's embeddings start as soon as its bases are trained (Ray
    # resolves the reference), the untrained bases and the baselines fill the other CPUs
    pre = {s: submit(Job(("pretrain", s), _pretrain_job, (base, s), trains=True)) for s in seeds}
    if cfg.beta0_run:
        pre_beta0 = submit(
            Job(("pretrain_beta0",), _pretrain_job, ({**base, "beta": 0.0}, seeds[0]), trains=True)
        )
    jobs = [Job(("gin", s), _baseline_job, (base, s, "gin"), trains=True) for s in seeds]
    jobs += [Job(("trained", s), _bases_job, (base, s, pre[s])) for s in seeds]
    jobs += [Job(("random", s), _bases_job, (base, s, None)) for s in seeds]
    jobs.append(Job(("unit",), _unit_job, (base,)))
    jobs += [
        Job((b, s), _baseline_job, (base, s, b))
        for b in ("gw_dictionary", "raw_features", "wl_kernel")
        for s in seeds
    ]
    first = run_jobs(jobs, description="scgfm: pre-training, embeddings, baselines")
    trained = {("trained", s): first[("trained", s)] for s in seeds}
    pretrained = {s: fetch(pre[s]) for s in seeds}
    beta0 = fetch(pre_beta0) if cfg.beta0_run else None
    results: dict[tuple, dict[str, float | None]] = {}
    empty = dict.fromkeys(METRICS)
    for s in seeds:
        t, r = trained[("trained", s)], first[("random", s)]
        results[("scgfm", s)] = {**empty, **{m: t.get(m) for m in METRICS}}
        results[("random_bases", s)] = {**empty, **{m: r.get(m) for m in METRICS}}
        results[("scgfm_no_h", s)] = {**empty, **t["no_h"]}
        for b in ("raw_features", "gw_dictionary", "wl_kernel", "gin"):
            results[(b, s)] = {**empty, **{m: first[(b, s)].get(m) for m in METRICS}}
        results[("scgfm_rewired", s)] = {**empty, **t["rewired"]}
    ordered = {(sys, s): results[(sys, s)] for sys in SYSTEMS for s in seeds}
    rows, stds, samples = aggregate(ordered)
    hist = [pretrained[s]["history"] for s in seeds]
    extra: dict[str, Any] = {
        "config": {
            "margin": cfg.margin,
            "beta": cfg.beta,
            "tau": cfg.tau,
            "solver": cfg.solver,
            "starts": cfg.starts,
            "n_bases": cfg.n_bases,
            "basis_size": cfg.basis_size,
        },  # fmt: skip
        "unit": first[("unit",)],
        "pretrain": {
            "loss_first": float(np.mean([h[0]["loss"] for h in hist])),
            "loss_last": float(np.mean([h[-1]["loss"] for h in hist])),
            "L_gw_first": float(np.mean([h[0]["L_gw"] for h in hist])),
            "L_gw_last": float(np.mean([h[-1]["L_gw"] for h in hist])),
            "curves": {
                k: [float(np.mean([h[e][k] for h in hist])) for e in range(len(hist[0]))]
                for k in ("loss", "L_gw", "L_rec", "L_div", "min_basis_dist")
            },
        },  # fmt: skip
        "perm": {
            name: {
                k: float(np.mean([src[(key, s)][k] for s in seeds]))
                for k in ("perm_err_z", "max_ddelta", "median_ddelta", "sigma_delta")
            }
            for name, key, src in (("scgfm", "trained", trained), ("random_bases", "random", first))
        },  # fmt: skip
        "mol_reason": mol_reason,
    }
    extra["size_only_acc_target"] = float(
        np.mean([trained[("trained", s)]["size_only_acc"] for s in seeds])
    )
    extra["job_cpu_s"] = {
        "pretrain": [pretrained[s]["cpu_s"] for s in seeds],
        "trained_bases": [trained[("trained", s)]["cpu_s"] for s in seeds],
        "random_bases": [first[("random", s)]["cpu_s"] for s in seeds],
        **{b: [first[(b, s)]["cpu_s"] for s in seeds]
           for b in ("gin", "gw_dictionary", "raw_features", "wl_kernel")},
    }  # fmt: skip
    if beta0 is not None:
        h0 = beta0["history"]
        extra["beta0_min_basis_dist"] = h0[-1]["min_basis_dist"]
        extra["beta0_curve"] = [r["min_basis_dist"] for r in h0]
    diff = [
        a - b
        for a, b in zip(
            samples["scgfm"]["acc_target_noise"], samples["random_bases"]["acc_target_noise"]
        )
    ]
    extra["scgfm_minus_random_noise_per_seed"] = diff
    plot(rows, stds, extra, workdir / "scgfm_small.png")
    return ResultsTable(
        method="scgfm", preset=cfg.preset, seeds=len(seeds), metrics=METRICS, rows=rows,
        stds=stds, samples=samples, runtime_s=time.time() - t0,
        notes=_notes(cfg, seeds, extra, mol_reason), extra=extra,
    )  # fmt: skip


def _notes(cfg: ScgfmConfig, seeds: list[int], extra: dict, mol_reason: str | None) -> list[str]:
    u = extra["unit"]
    notes = [
        f"{len(seeds)} seeds of the bases (± over seeds); each seed's {cfg.episodes} episodes of "
        f"{cfg.shots} shots per class are shared by every row. K = {cfg.n_bases} bases of "
        f"M = {cfg.basis_size} nodes, τ = {cfg.tau} on standardised δ, solver {cfg.solver} "
        f"(canonical WL order, best of {cfg.starts} starts), {cfg.steps} pre-training epochs on "
        f"{4 * cfg.source_per_family} source graphs.",
        "Pre-training loss (mean over seeds): "
        f"{extra['pretrain']['loss_first']:.4f} after epoch 1 → "
        f"{extra['pretrain']['loss_last']:.4f} after the last; L_gw "
        f"{extra['pretrain']['L_gw_first']:.4f} → {extra['pretrain']['L_gw_last']:.4f}.",
        f"Invariance: entropic max |Δδ| {u['entropic_max_ddelta']:.2e}, perm_err_w "
        f"{u['entropic_perm_err_w']:.2e}; exact with canonical order median |Δδ| "
        f"{u['exact_median_ddelta']:.2e} (max {u['exact_max_ddelta']:.2e}); exact without it "
        f"median {u['exact_plain_median_ddelta']:.2e}. Envelope gradient vs finite differences "
        f"{u['envelope_grad_err']:.2e}; plan marginals {u['plan_marginal_err']:.2e}.",
        "Negative control: the rewired graphs keep each graph's numbers of nodes and edges; a "
        "logistic regression on (n, m, density) alone reaches "
        f"{extra['size_only_acc_target']:.3f} on the target families.",
        "CPU seconds per job (mean): "
        + ", ".join(f"{k} {np.mean(v):.0f}" for k, v in extra["job_cpu_s"].items()),
        "scgfm − random_bases on acc_target_noise per seed: "
        + ", ".join(f"{d:+.3f}" for d in extra["scgfm_minus_random_noise_per_seed"]),
        "wl_kernel and the baselines see structure through degree labels (WL) or the graphs' own "
        "features (raw_features, gin); gw_dictionary learns its dictionary on source graphs.",
    ]
    if "beta0_min_basis_dist" in extra:
        notes.append(
            f"β = 0 (no diversity loss, seed {seeds[0]}): min_basis_dist "
            f"{extra['beta0_min_basis_dist']:.3f}."
        )
    if mol_reason:
        notes.append(f"acc_mol is null: {mol_reason}")
    return notes


def plot(rows: dict, stds: dict, extra: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    names = [s for s in SYSTEMS]
    x = np.arange(len(names))
    for j, m in enumerate(DATASETS):
        vals = [rows[s].get(f"acc_{m}") for s in names]
        errs = [stds[s].get(f"acc_{m}") for s in names]
        axes[0].bar(x + (j - 1.5) * 0.2, [v if v is not None else 0 for v in vals], 0.2,
                    yerr=[e if e is not None else 0 for e in errs], label=m)  # fmt: skip
    axes[0].set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    axes[0].set_ylabel("5-shot accuracy")
    axes[0].axhline(0.25, color="grey", lw=0.8, ls="--")
    axes[0].legend(fontsize=7)
    curves = extra["pretrain"]["curves"]
    for k in ("loss", "L_gw", "L_rec", "min_basis_dist"):
        axes[1].plot(range(1, len(curves[k]) + 1), curves[k], label=k)
    axes[1].set_xlabel("pre-training epoch")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- evaluate


def evaluate_model(model: SCGFM, solver: GWSolver, tau: float, cfg: ScgfmConfig) -> dict:
    """``evaluate``: the checkpoint's few-shot accuracies on every dataset (with H), its minimum
    basis distance and permutation error."""
    data, _ = datasets(cfg)
    eps = {k: episodes(y, cfg.shots, cfg.episodes, cfg.seed) for k, (_, y) in data.items()}
    full, _ = bases_accuracies(model, solver, tau, data, eps)
    src, _ = data["source"]
    pe = perm_errors(model, solver, tau, src[: cfg.perm_graphs], cfg.seed)
    out = {k: v for k, v in full.items() if v is not None and math.isfinite(v)}
    return {**out, "min_basis_dist": min_basis_dist(model.bases().detach()),
            "perm_err_w": pe["perm_err_w"]}  # fmt: skip
