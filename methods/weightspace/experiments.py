"""`nshot reproduce weightspace`: the OCE k sweep against the k = 1 meta-network, the oracle
floors and the identity, on 1-D hat dilation.

Every (seed, k) meta-network trains as its own Ray task (one torch thread each); the oracle
floors (k output INRs fitted directly to each of ``oracle_targets`` test targets) are Ray tasks
too. Rows: identity, oracle_k1, oracle_k4, meta_k1, oce_k4, oce_k8, oce_k4_zero_init. The
equivariance errors go into ``extra["equivariance"]``; the paper's claims over rows and extra are
data (``claims.py``), evaluated by ``nshot reproduce``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from nshot.experiment import Job, aggregate, run_jobs
from nshot.method import ResultsTable

from .config import WeightspaceConfig

METRICS = {"rel_mse": False, "params": False, "render_flops": False, "copy_separation": True}
INR_FLOPS_PER_POINT = 2 * 3 + 3 + 3 + 2 * 3 + 1  # 1→3→1 ReLU: matmul, bias, relu, matmul, bias


def _system(k: int, head_init: str) -> str:
    if head_init == "zero":
        return f"oce_k{k}_zero_init"
    return "meta_k1" if k == 1 else f"oce_k{k}"


def _train_job(cfg_dict: dict[str, Any], seed: int, k: int, head_init: str) -> dict[str, Any]:
    from .backbones import count_params
    from .data import grid, splits
    from .train import build, evaluate_model, train_model

    cfg = WeightspaceConfig.validated({**cfg_dict, "seed": seed, "k": k, "head_init": head_init})
    torch.manual_seed(seed)
    model = build(cfg)
    train, test = splits(cfg)
    res = train_model(model, train, test, cfg, seed=seed)
    final = evaluate_model(model, test, grid(cfg).float())
    return {**res, **final, "params": count_params(model), "width": model.width}


def _oracle_job(cfg_dict: dict[str, Any], seed: int, k: int) -> dict[str, Any]:
    from .data import splits
    from .train import fit_oracle

    cfg = WeightspaceConfig.validated({**cfg_dict, "seed": seed})
    _, test = splits(cfg)
    sub = test.subset(slice(0, cfg.oracle_targets))
    t0 = time.time()
    rel = fit_oracle(sub.target, k, cfg, start=sub, seed=seed)
    return {"rel_mse": float(rel.mean()), "per_target": rel.tolist(), "seconds": time.time() - t0}


def equivariance(cfg: WeightspaceConfig, k: int = 4) -> dict[str, float]:
    """Equivariance of the DeepSets OCE model: permuting hidden neurons permutes Δv and leaves f_OCE."""
    from .data import grid, splits
    from .model import render
    from .train import build

    torch.manual_seed(0)
    model = build(cfg, k=k).double()
    _, test = splits(cfg.replace(n_test=8))
    W1, b1, W2, b2 = (t.double() for t in (test.W1, test.b1, test.W2, test.b2))
    perm = torch.tensor([2, 0, 1])
    x = grid(cfg)
    a = model(W1, b1, W2, b2)
    p = model(W1[:, perm], b1[:, perm], W2[:, :, perm], b2)
    delta_diff = max(float((a[1][:, :, perm] - p[1]).abs().max()),
                     float((a[0][:, :, perm] - p[0]).abs().max()))  # fmt: skip
    fa = render(*a[:4], x).mean(1)
    fp = render(*p[:4], x).mean(1)
    return {"delta_perm_max_abs": delta_diff, "f_oce_perm_max_abs": float((fa - fp).abs().max())}


def backbone_equivariance(widths: tuple[int, ...] = (2, 8, 8, 1), k: int = 4) -> dict[str, float]:
    """Equivariance of the general backbones (NP-NFN, GMN) with an OCE head on a 2-hidden-layer INR
    (float64): max |Δv(permuted input) − permuted Δv| and max |f_OCE change|."""
    from .backbones import GMN, NPNFN, OCEHead, oce_render, permute_hidden, random_hidden_perms

    g = torch.Generator().manual_seed(0)
    layers = [(torch.randn(3, widths[i + 1], widths[i], generator=g, dtype=torch.float64),
               torch.randn(3, widths[i + 1], generator=g, dtype=torch.float64))
              for i in range(len(widths) - 1)]  # fmt: skip
    perms = random_hidden_perms(widths, generator=g)
    x = torch.linspace(-1, 1, 33, dtype=torch.float64)[:, None].expand(-1, widths[0])
    out: dict[str, float] = {}
    for name, net in (("np_nfn", NPNFN(widths, channels=8)), ("gmn", GMN(widths, channels=8))):
        torch.manual_seed(1)
        head = OCEHead(len(widths) - 1, 8, k, init="random", init_std=0.3).double()
        net = net.double()
        with torch.no_grad():
            edited, deltas = head(layers, net(layers))
            p_layers = permute_hidden(layers, perms)
            p_edited, p_deltas = head(p_layers, net(p_layers))
        diff = max(
            float((a - b).abs().max())
            for d, pd in zip(deltas, p_deltas, strict=True)
            for (w, bb), (pw, pb) in zip(permute_hidden(d, perms), pd, strict=True)
            for a, b in ((w, pw), (bb, pb))
        )
        f = float((oce_render(edited, x) - oce_render(p_edited, x)).abs().max())
        out[f"{name}_delta_perm_max_abs"] = diff
        out[f"{name}_f_oce_perm_max_abs"] = f
    return out


def run_experiments(cfg: WeightspaceConfig, workdir: Path) -> ResultsTable:
    t0 = time.time()
    workdir.mkdir(parents=True, exist_ok=True)
    base = cfg.model_dump()
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    nets = [(k, "random") for k in cfg.k_sweep]
    if cfg.zero_init_control and 4 in cfg.k_sweep:
        nets.append((4, "zero"))
    jobs = [Job((_system(k, h), s), _train_job, (base, s, k, h), num_cpus=1, trains=True)
            for k, h in nets for s in seeds]  # fmt: skip
    jobs += [Job((f"oracle_k{k}", s), _oracle_job, (base, s, k), num_cpus=1, trains=True)
             for k in cfg.oracle_ks for s in seeds]  # fmt: skip
    print(f"[nshot weightspace] {len(nets) * len(seeds)} meta-networks ({cfg.steps} steps "
          f"each) and {len(cfg.oracle_ks) * len(seeds)} oracle fits as Ray tasks", flush=True)  # fmt: skip
    done = run_jobs(jobs, description=f"weightspace {cfg.preset}")
    order = [
        "identity",
        *[f"oracle_k{k}" for k in cfg.oracle_ks],
        *[_system(k, h) for k, h in nets],
    ]
    k_of = {"identity": 1, **{f"oracle_k{k}": k for k in cfg.oracle_ks},
            **{_system(k, h): k for k, h in nets}}  # fmt: skip
    per_seed = {  # rows in order, seeds paired by position
        (name, s): _metrics(cfg, name, k_of[name], s, done.get((name, s)))
        for name in order
        for s in seeds
    }
    rows, stds, samples = aggregate(per_seed)
    eq = equivariance(cfg)
    eq.update(backbone_equivariance())
    first = {name: done[(name, seeds[0])] for name in order if (name, seeds[0]) in done}
    curves = {_system(k, h): [h_["test_rel_mse"] for h_ in first[_system(k, h)]["history"]]
              for k, h in nets}  # fmt: skip
    extra = {
        "equivariance": eq,
        "curves": curves,
        "curve_steps": [h["step"] for h in first[_system(*nets[0])]["history"]],
        "widths": {_system(k, h): first[_system(k, h)]["width"] for k, h in nets},
        "train_seconds": {_system(k, h): first[_system(k, h)]["seconds"] for k, h in nets},
        "oracle_per_target": {
            f"oracle_k{k}": first[f"oracle_k{k}"]["per_target"] for k in cfg.oracle_ks
        },  # fmt: skip
    }
    plot(curves, extra["curve_steps"], rows, workdir / "rel_mse_curves.png")
    return ResultsTable(
        method="weightspace", preset=cfg.preset, seeds=len(seeds), metrics=METRICS, rows=rows,
        stds=stds, samples=samples, runtime_s=time.time() - t0, notes=_notes(cfg, seeds, extra),
        extra=extra,
    )  # fmt: skip


def _metrics(
    cfg: WeightspaceConfig, name: str, k: int, seed: int, result: dict[str, Any] | None
) -> dict[str, float | None]:
    """One row's metrics for one seed: the identity is computed here; oracles have no
    parameters and no copies to separate (None: n/a)."""
    if name == "identity":
        vals = _identity(cfg.replace(seed=seed))
    elif name.startswith("oracle"):
        vals = {"rel_mse": result["rel_mse"], "params": None, "copy_separation": None}
    else:
        vals = {"rel_mse": result["rel_mse"], "params": float(result["params"]),
                "copy_separation": result["copy_separation"]}  # fmt: skip
    return {**vals, "render_flops": float(k) * INR_FLOPS_PER_POINT * cfg.grid}


def _identity(cfg: WeightspaceConfig) -> dict[str, float | None]:
    """The identity baseline of ``cfg.seed``'s test INRs: the input INR as its own output."""
    from .data import grid, splits
    from .model import rel_mse, render

    _, test = splits(cfg)
    ident = rel_mse(render(test.W1, test.b1, test.W2, test.b2, grid(cfg).float()), test.target)
    return {"rel_mse": float(ident.mean()), "params": None, "copy_separation": 0.0}


def _notes(cfg: WeightspaceConfig, seeds: list[int], extra: dict[str, Any]) -> list[str]:
    eq = extra["equivariance"]
    return [
        f"1-D hat dilation: {cfg.n_train} train / {cfg.n_test} test ReLU 1-3-1 INRs (neurons "
        f"permuted and rescaled), running max over ±{cfg.radius} on {cfg.grid} points; "
        f"{len(seeds)} seed(s); rel_mse = MSE / Var(target), mean over test INRs.",
        f"meta-networks: DeepSets over neurons, {cfg.res_layers} residual layers, widths "
        f"{extra['widths']} (parameter-matched), Adam {cfg.lr} → {cfg.lr_min} cosine, "
        f"{cfg.steps} steps × {cfg.batch}, clip {cfg.clip}; oracles: k output INRs fitted to "
        f"{cfg.oracle_targets} test targets directly, best of {cfg.oracle_restarts}.",
        "render_flops: FLOPs to render one INR on the grid (k copies; not matched across k).",
        f"equivariance (k = 4, float64; max abs change under a hidden permutation): DeepSets "
        f"Δv {eq['delta_perm_max_abs']:.1e} / f_OCE {eq['f_oce_perm_max_abs']:.1e}; NP-NFN and "
        f"GMN on a 2-8-8-1 INR: Δv {eq['np_nfn_delta_perm_max_abs']:.1e} / "
        f"{eq['gmn_delta_perm_max_abs']:.1e}, f_OCE {eq['np_nfn_f_oce_perm_max_abs']:.1e} / "
        f"{eq['gmn_f_oce_perm_max_abs']:.1e}.",
    ]


def plot(curves: dict[str, list[float]], steps: list[float], rows: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, c in curves.items():
        ax.plot(steps, c, label=name)
    for name in ("oracle_k1", "oracle_k4", "identity"):
        if name in rows:
            ax.axhline(rows[name]["rel_mse"], ls="--", lw=1, color="grey")
            ax.text(steps[0], rows[name]["rel_mse"], name, fontsize=7, va="bottom")
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("test rel_mse (log)")
    ax.set_title("weightspace: OCE k sweep at matched parameters")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
