"""iclft's comparison: the pretrained model against every fine-tuning variant.

Two grids of jobs on :func:`nshot.experiment.run_jobs`: first one Ray task per seed pretrains the
model (and evaluates it); then the fine-tuning variants fan out as one Ray task per (variant,
seed), each starting from its seed's pretrained weights. Every task declares one CPU and uses one
torch thread. Evaluation: test MSE (float64) at each n of ``eval_n`` on the target task θ0 and
the unseen task −θ0, ``eval_batch`` fresh prompts per (n, task), the same prompts for every row
of a seed. Rows report the mean and the standard deviation over seeds (Bessel-corrected), and
``samples`` the per-seed values. The paper's claims over these rows are data (``claims.py``),
evaluated by ``nshot reproduce``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from nshot.experiment import Job, aggregate, grid, run_jobs
from nshot.method import ResultsTable

from . import closed_form as cf
from . import data as D
from .config import ICLFTConfig, row_name
from .evaluation import evaluate_model, summary
from .model import LinearAttention, new_model
from .train import train_in_process


def _log(msg: str) -> None:
    print(f"[iclft] {msg}", file=sys.stderr, flush=True)


def _state(net) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in net.state_dict().items()}


def pretrain_task(cfg_dict: dict[str, Any], seed: int) -> dict[str, Any]:
    """Pretrain one seed's model; evaluate it. Returns its weights (NumPy) and metrics."""
    cfg = ICLFTConfig.validated(cfg_dict)
    t0 = time.time()
    net = new_model(cfg, seed)
    losses = train_in_process(net, cfg, seed, "pretrain", progress=f"seed {seed} pretrain")
    theta0 = D.target_task(cfg, seed)
    return {
        "state": _state(net),
        "metrics": evaluate_model(net, cfg, seed, theta0, random=True),
        "summary": summary(net, theta0),
        "losses": losses,
        "seconds": time.time() - t0,
    }


def finetune_task(
    cfg_dict: dict[str, Any], seed: int, variant: str, pre: dict[str, Any]
) -> dict[str, Any]:
    """Fine-tune a copy of ``pre`` with ``variant``; evaluate it."""
    import torch

    cfg = ICLFTConfig.validated(cfg_dict)
    t0 = time.time()
    net = LinearAttention(cfg.d, cfg.init_std)
    net.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in pre["state"].items()})
    losses = train_in_process(net, cfg, seed, variant, progress=f"seed {seed} {variant}")
    theta0 = D.target_task(cfg, seed)
    return {
        "metrics": evaluate_model(net, cfg, seed, theta0, random=True),
        "summary": summary(net, theta0),
        "losses": losses,
        "seconds": time.time() - t0,
    }


# --------------------------------------------------------------------------- the comparison


def run_experiments(cfg: ICLFTConfig, workdir: Path) -> ResultsTable:
    t0 = time.time()
    cfg_dict = cfg.model_dump()
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    _log(f"{len(seeds)} seeds × (pretraining + {len(cfg.variants)} fine-tunings) as Ray tasks")
    pre = run_jobs(
        [
            Job(("pretrained", s), pretrain_task, (cfg_dict, s), num_cpus=1, trains=True)
            for s in seeds
        ],
        description=f"iclft {cfg.preset}: pretraining",
    )
    ft = run_jobs(
        [
            Job(
                (row_name(v), s),
                finetune_task,
                (cfg_dict, s, v, pre[("pretrained", s)]),
                num_cpus=1,
                trains=True,
            )
            for v, s in grid(cfg.variants, seeds)
        ],
        description=f"iclft {cfg.preset}: fine-tuning",
    )
    results = {**pre, **ft}  # keys (row, seed): every row's seeds in order
    _log(f"all runs done in {time.time() - t0:.0f}s")
    metrics = {f"err_{task}_n{n}": False for task in ("target", "unseen") for n in cfg.eval_n}
    rows, stds, samples = aggregate(
        {k: {m: r["metrics"][m] for m in metrics} for k, r in results.items()},
        spread="sample_std",
    )
    by_row = {row: [results[(row, s)] for s in seeds] for row in rows}
    random_tasks = {
        row: {f"n{n}": float(np.mean([r["metrics"][f"err_random_n{n}"] for r in runs]))
              for n in cfg.eval_n if f"err_random_n{n}" in runs[0]["metrics"]}
        for row, runs in by_row.items()
    }  # fmt: skip
    summaries = {
        row: {k: float(np.mean([r["summary"][k] for r in runs])) for k in runs[0]["summary"]}
        for row, runs in by_row.items()
    }
    seconds = {row: float(np.mean([r["seconds"] for r in runs])) for row, runs in by_row.items()}
    closed, refs = _closed_forms(cfg)
    png = workdir / "error_vs_n.png"
    _plot(rows, stds, refs, cfg, png)
    return ResultsTable(
        method="iclft", preset=cfg.preset, seeds=len(seeds), metrics=metrics, rows=rows,
        stds=stds, samples=samples, runtime_s=time.time() - t0,
        notes=_notes(cfg, seeds, closed, refs, summaries, seconds),
        extra={
            "closed_form": closed, "derived": _derived(rows, cfg.eval_n), "per_seed": samples,
            "random_tasks": random_tasks, "effective_params": summaries, "seconds": seconds,
            "plot": png.name,
        },
    )  # fmt: skip


def _closed_forms(cfg: ICLFTConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """The closed-form references of the paper's analysis at this configuration, and the
    reference error curves."""
    refs = cf.reference_curves(cfg.d, cfg.n_pt, cfg.sigma2, cfg.eval_n)
    closed: dict[str, Any] = {
        "a_spec": cf.spec_a(cfg.d, cfg.n_pt),
        "c_star": cf.pretrained_coef(cfg.d, cfg.n_pt, cfg.sigma2),
        "vonly_zs_floor": cf.vonly_zs_floor(cfg.d, cfg.sigma2),
        "vonly_zs_g_theta0": 1 / (cfg.d + 4),
        "vonly_fs_optimum_w": cf.vonly_fs_optimum(cfg.d, cfg.n_fs, cfg.sigma2, 1.0)[1],
        "curves": {
            k: {t: {str(n): e for n, e in c.items()} for t, c in v.items()} for k, v in refs.items()
        },  # fmt: skip
    }
    if cfg.task_dist != "sphere":
        closed["note"] = "closed forms assume ‖θ0‖ = 1 (task_dist=sphere)"
    return closed, refs


def _notes(cfg, seeds, closed, refs, summaries, seconds) -> list[str]:
    return [
        f"test MSE (float64) on {cfg.eval_batch} fresh prompts per (n, task); target θ0 and "
        f"unseen −θ0 per seed; ± is the std over {len(seeds)} seeds ({seeds}).",
        f"d = {cfg.d}, N_pt = {cfg.n_pt}, σ² = {cfg.sigma2} (variance), {cfg.steps} pretraining "
        f"and {cfg.ft_steps} fine-tuning iterations × {cfg.batch} prompts, SGD lr {cfg.lr} "
        f"momentum {cfg.momentum}, joint clip {cfg.clip}, pool {cfg.pool_size}.",
        f"closed forms: V-only ZS floor 2/(d+4)+σ² = {closed['vonly_zs_floor']:.3f}; pretrained "
        f"optimum c* = {closed['c_star']:.3f} (spec's a = {closed['a_spec']:.3f}) with error "
        + ", ".join(f"n={n}: {e:.3f}" for n, e in refs["pretrained_optimum"]["target"].items())
        + f"; FS-aux pull on the ICL weight w → {closed['vonly_fs_optimum_w']:.3f}.",
        "learned effective parameters (seed mean): "
        + "; ".join(f"{r}: w {s['w']:.3f}, θ0ᵀg {s['g_theta0']:.3f}" for r, s in summaries.items()),
        "mean seconds per Ray task: " + ", ".join(f"{r} {v:.0f}" for r, v in seconds.items()),
    ]


def _derived(rows: dict[str, dict[str, float]], ns: list[int]) -> dict[str, dict[str, float]]:
    """``icl_ratio_{target,unseen}@N`` (the row's error at the largest n over the
    pretrained model's; near 1: ICL preserved) and ``zs_gain`` (pretrained n=0 error minus
    the row's)."""
    n = max(ns)
    pre = rows.get("pretrained", {})
    out: dict[str, dict[str, float]] = {}
    for row, vals in rows.items():
        d: dict[str, float] = {}
        for task in ("target", "unseen"):
            key = f"err_{task}_n{n}"
            if pre.get(key):
                d[f"icl_ratio_{task}@{n}"] = vals[key] / pre[key]
        if 0 in ns:
            d["zs_gain"] = pre["err_target_n0"] - vals["err_target_n0"]
        out[row] = d
    return out


def _plot(rows, stds, refs, cfg: ICLFTConfig, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = cfg.eval_n
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, task in zip(axes, ("target", "unseen")):
        for row in rows:
            m = np.array([rows[row][f"err_{task}_n{n}"] for n in ns])
            s = np.array([stds[row][f"err_{task}_n{n}"] or 0.0 for n in ns])
            ax.errorbar(ns, m, yerr=s, marker="o", ms=3, capsize=2, label=row,
                        lw=2 if row == "pretrained" else 1.2)  # fmt: skip
        for name, style in (("pretrained_optimum", "k--"), ("vonly_zs_optimum", "k:")):
            ax.plot(ns, [refs[name][task][n] for n in ns], style, lw=1.2, zorder=5,
                    label=f"closed form: {name.replace('_', ' ')}")  # fmt: skip
        ax.axhline(cfg.sigma2, color="grey", lw=0.6)
        ax.set_yscale("log")
        ax.set_xlabel("demonstrations n")
        ax.set_title(f"{'target task θ0' if task == 'target' else 'unseen task −θ0'}")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("test MSE")
    axes[1].legend(fontsize=7, loc="upper right")
    fig.suptitle(f"iclft ({cfg.preset}, {cfg.seeds} seeds): error vs number of demonstrations")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
