"""`nshot reproduce caos`: the trial protocol, split across Ray tasks by trial id.

The paper's claims over these rows are declared in ``claims.py``; nothing here decides pass or
fail.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from nshot.method import ResultsTable

from .config import CAOSConfig
from .core import GATED, SYSTEMS, classification_trials, run_trials


def _log(msg: str) -> None:
    print(f"[caos] {msg}", file=sys.stderr, flush=True)


def _suffix(alpha: float) -> str:
    return f"a{round(alpha * 100):02d}"


def _chunks(total: int, size: int) -> list[list[int]]:
    return [list(range(s, min(total, s + size))) for s in range(0, total, size)]


def _gather(refs: list[Any], what: str) -> list[dict[str, np.ndarray]]:
    """Results of ``refs`` in their order, logging progress as chunks finish."""
    import ray

    pending, t0 = list(refs), time.time()
    while pending:
        _, pending = ray.wait(pending, num_returns=1)
        _log(f"{what}: {len(refs) - len(pending)}/{len(refs)} chunks ({time.time() - t0:.0f}s)")
    return ray.get(refs)


def run_experiments(cfg: CAOSConfig, workdir: Path) -> ResultsTable:
    import ray

    from nshot.train.runner import ensure_ray

    t0 = time.time()
    ensure_ray()
    cfg_dict = cfg.model_dump()
    landmark = ray.remote(num_cpus=1)(run_trials)
    classify = ray.remote(num_cpus=1)(classification_trials)
    chunks = _chunks(cfg.trials, cfg.trials_per_task)
    main_refs = [landmark.remote(cfg_dict, c, cfg.n) for c in chunks]
    sweep_refs = {
        m: [landmark.remote(cfg_dict, c, m, False) for c in chunks]
        for m in cfg.n_sweep
        if m != cfg.n
    }
    cls_refs = [
        classify.remote(cfg_dict, c) for c in _chunks(cfg.cls_trials, max(1, cfg.trials_per_task))
    ]
    main = _gather(main_refs, f"{cfg.trials} trials, n={cfg.n}")
    cov = np.concatenate([r["coverage"] for r in main])  # (trials, system, alpha)
    size = np.concatenate([r["size"] for r in main])
    triv = np.concatenate([r["trivial"] for r in main])

    metrics: dict[str, bool] = {}
    for a in cfg.alphas:
        metrics[f"coverage_{_suffix(a)}"] = True
    for a in cfg.alphas:
        metrics[f"size_{_suffix(a)}"] = False
    rows: dict[str, dict[str, float | None]] = {}
    stds: dict[str, dict[str, float | None]] = {}
    for s, name in enumerate(SYSTEMS):
        rows[name], stds[name] = {}, {}
        for a, alpha in enumerate(cfg.alphas):
            for key, arr in (("coverage", cov), ("size", size)):
                col = f"{key}_{_suffix(alpha)}"
                rows[name][col] = float(arr[:, s, a].mean())
                # standard error of the mean over trials (trials are independent)
                stds[name][col] = float(arr[:, s, a].std(ddof=1) / np.sqrt(len(arr)))

    extra: dict[str, Any] = {"n": cfg.n, "k": cfg.k, "trials": cfg.trials, "n_test": cfg.n_test}
    for a, alpha in enumerate(cfg.alphas):
        sfx = _suffix(alpha)
        for s, name in enumerate(SYSTEMS):
            extra[f"trivial_rate_{sfx}/{name}"] = float(triv[:, s, a].mean())
        sb = rows["split_conformal_best"][f"size_{sfx}"]
        sa = rows["split_conformal_agg"][f"size_{sfx}"]
        sc = rows["caos"][f"size_{sfx}"]
        extra[f"gain_no_split_{sfx}"] = sa - sc
        extra[f"gain_aggregation_{sfx}"] = sb - sa
        extra[f"gain_no_split_pct_{sfx}"] = 100.0 * (sa - sc) / sb
        extra[f"gain_aggregation_pct_{sfx}"] = 100.0 * (sb - sa) / sb
        extra[f"size_ratio_caos_over_agg_{sfx}"] = sc / sa
        extra[f"size_ratio_caos_over_best_{sfx}"] = sc / sb

    sweep: dict[str, Any] = {}
    a10 = cfg.alphas.index(0.1) if 0.1 in cfg.alphas else 0
    for m in cfg.n_sweep:
        if m == cfg.n:
            res = {"coverage": cov, "size": size}
        else:
            parts = _gather(sweep_refs[m], f"n sweep n={m}")
            res = {k: np.concatenate([p[k] for p in parts]) for k in ("coverage", "size")}
        sweep[str(m)] = {
            name: {
                "coverage": float(res["coverage"][:, i, a10].mean()),
                "size": float(res["size"][:, i, a10].mean()),
            }
            for i, name in enumerate(GATED)
        }
    if sweep:
        extra["n_sweep_alpha"] = cfg.alphas[a10]
        extra["n_sweep"] = sweep

    if cls_refs:
        parts = _gather(cls_refs, "classification analogue")
        ccov = np.concatenate([p["coverage"] for p in parts])  # (trials, alpha, system)
        csize = np.concatenate([p["size"] for p in parts])
        agree = np.concatenate([p["mapie_agree"] for p in parts])
        extra["classification"] = {
            "n": cfg.cls_n,
            "k": cfg.cls_k,
            "trials": cfg.cls_trials,
            **{
                f"{sys_name}_{key}_{_suffix(alpha)}": float(arr[:, a, j].mean())
                for a, alpha in enumerate(cfg.alphas)
                for j, sys_name in enumerate(("caos", "split_conformal_agg"))
                for key, arr in (("coverage", ccov), ("size", csize))
            },
            "mapie_split_agreement": float(agree.mean()) if len(agree) else None,
        }

    notes = [
        f"{cfg.trials} trials × {cfg.n_test} test images on the {_pool_name(cfg)} substitute; "
        f"n = {cfg.n} labelled examples per trial, k = {cfg.k}; ± is the standard error of the "
        "mean over trials.",
        "split rows use the first n/2 examples as predictors and the rest to calibrate; with "
        f"{cfg.n - cfg.n // 2} calibration points a small alpha needs more ranks than there are "
        "points, so those sets are trivial (every candidate: size L, coverage 1).",
        "full_conformal (reported, not gated) is exact full conformal with the same aggregated "
        "score; CAOS's threshold is never below it.",
        "no_loo_control keeps each row's own predictor (self-score 0) in its calibration score: "
        "a negative control for the leave-one-out indexing.",
    ]
    plot(rows, sweep, cfg, workdir / f"{cfg.preset}-sizes.png")
    return ResultsTable(
        method="caos",
        preset=cfg.preset,
        seeds=cfg.trials,
        metrics=metrics,
        rows=rows,
        stds=stds,
        runtime_s=time.time() - t0,
        notes=notes,
        extra=extra,
    )


def _pool_name(cfg: CAOSConfig) -> str:
    return f"features file {cfg.features_path}" if cfg.features_path else "digits-landmark"


def plot(rows: dict, sweep: dict, cfg: CAOSConfig, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 if sweep else 1, figsize=(11 if sweep else 6, 4), squeeze=False)
    ax = axes[0, 0]
    width = 0.8 / len(SYSTEMS)
    xs = np.arange(len(cfg.alphas))
    for i, name in enumerate(SYSTEMS):
        sizes = [rows[name][f"size_{_suffix(a)}"] for a in cfg.alphas]
        ax.bar(xs + i * width, sizes, width, label=name)
    ax.set_xticks(xs + width * (len(SYSTEMS) - 1) / 2, [f"α={a}" for a in cfg.alphas])
    ax.set_yscale("log")
    ax.set_ylabel("mean set size (pixels, log)")
    ax.set_title(f"caos {cfg.preset}: set size at equal nominal coverage")
    ax.legend(fontsize=7)
    if sweep:
        ax = axes[0, 1]
        ns = sorted(int(m) for m in sweep)
        for name in ("caos", "split_conformal_agg", "split_conformal_best"):
            ax.plot(ns, [sweep[str(m)][name]["size"] for m in ns], marker="o", label=name)
        ax.set_xlabel("n labelled")
        ax.set_ylabel("mean set size at α = 0.1 (log)")
        ax.set_yscale("log")
        ax.set_title("n sweep")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
