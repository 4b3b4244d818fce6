"""`nshot reproduce caos`: the trial protocol, split across Ray tasks by trial id.

The trials are chunked (``trials_per_task`` per job) and run on the platform's experiment runner
(:mod:`nshot.experiment`): the main protocol at ``n``, the same trials at every other ``n`` of
``n_sweep``, and the classification analogue. Rows are means over trials; ``samples`` keeps the
per-trial values, paired across systems.

The paper's claims over these rows are declared in ``claims.py``; nothing here decides pass or
fail.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from nshot.experiment import Job, run_jobs
from nshot.method import ResultsTable

from .config import CAOSConfig
from .core import GATED, SYSTEMS, classification_trials, run_trials


def _suffix(alpha: float) -> str:
    return f"a{round(alpha * 100):02d}"


def _chunks(total: int, size: int) -> list[list[int]]:
    return [list(range(s, min(total, s + size))) for s in range(0, total, size)]


def _joined(results: dict, kind: tuple, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The chunks of one kind of job (``("main",)``, ``("sweep", m)``, ``("cls",)``), joined
    in trial order."""
    parts = [r for key, r in results.items() if key[:-1] == kind]
    return {k: np.concatenate([p[k] for p in parts]) for k in keys}


def run_experiments(cfg: CAOSConfig, workdir: Path) -> ResultsTable:
    t0 = time.time()
    c, main = cfg.model_dump(), _chunks(cfg.trials, cfg.trials_per_task)
    jobs = [Job(("main", i), run_trials, (c, ids, cfg.n)) for i, ids in enumerate(main)]
    jobs += [
        Job(("sweep", m, i), run_trials, (c, ids, m, False))
        for m in cfg.n_sweep
        if m != cfg.n
        for i, ids in enumerate(main)
    ]
    cls = _chunks(cfg.cls_trials, max(1, cfg.trials_per_task))
    jobs += [Job(("cls", i), classification_trials, (c, ids)) for i, ids in enumerate(cls)]
    results = run_jobs(jobs, description=f"caos {cfg.preset}: {len(jobs)} chunks of trials")
    res = _joined(results, ("main",), ("coverage", "size", "trivial"))  # (trial, system, alpha)
    metrics = {f"coverage_{_suffix(a)}": True for a in cfg.alphas}
    metrics.update({f"size_{_suffix(a)}": False for a in cfg.alphas})
    rows: dict[str, dict[str, float | None]] = {}
    stds: dict[str, dict[str, float | None]] = {}
    samples: dict[str, dict[str, list[float | None]]] = {}
    for s, name in enumerate(SYSTEMS):
        rows[name], stds[name], samples[name] = {}, {}, {}
        for a, alpha in enumerate(cfg.alphas):
            for key in ("coverage", "size"):
                col, per_trial = f"{key}_{_suffix(alpha)}", res[key][:, s, a]
                rows[name][col] = float(per_trial.mean())
                # standard error of the mean over trials (trials are independent)
                stds[name][col] = float(per_trial.std(ddof=1) / np.sqrt(len(per_trial)))
                samples[name][col] = per_trial.tolist()
    sweep = _sweep(results, res, cfg)
    extra = _extra(rows, res["trivial"], sweep, cfg)
    if cls:
        extra["classification"] = _classification(_joined(results, ("cls",), CLS_KEYS), cfg)
    plot(rows, sweep, cfg, workdir / f"{cfg.preset}-sizes.png")
    return ResultsTable(
        method="caos",
        preset=cfg.preset,
        seeds=cfg.trials,
        metrics=metrics,
        rows=rows,
        stds=stds,
        runtime_s=time.time() - t0,
        notes=_notes(cfg),
        extra=extra,
        samples=samples,
    )


CLS_KEYS = ("coverage", "size", "mapie_agree")


def _extra(rows: dict, triv: np.ndarray, sweep: dict, cfg: CAOSConfig) -> dict[str, Any]:
    """Trivial-set rates and the size gains of no-split and of aggregation per alpha."""
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
    if sweep:
        extra["n_sweep_alpha"] = cfg.alphas[_a10(cfg)]
        extra["n_sweep"] = sweep
    return extra


def _a10(cfg: CAOSConfig) -> int:
    return cfg.alphas.index(0.1) if 0.1 in cfg.alphas else 0


def _sweep(results: dict, main: dict[str, np.ndarray], cfg: CAOSConfig) -> dict[str, Any]:
    """Coverage and size of the gated systems at alpha = 0.1 for every n of ``n_sweep``."""
    sweep: dict[str, Any] = {}
    a10 = _a10(cfg)
    for m in cfg.n_sweep:
        res = main if m == cfg.n else _joined(results, ("sweep", m), ("coverage", "size"))
        sweep[str(m)] = {
            name: {
                "coverage": float(res["coverage"][:, i, a10].mean()),
                "size": float(res["size"][:, i, a10].mean()),
            }
            for i, name in enumerate(GATED)
        }
    return sweep


def _classification(res: dict[str, np.ndarray], cfg: CAOSConfig) -> dict[str, Any]:
    ccov, csize, agree = res["coverage"], res["size"], res["mapie_agree"]  # (trial, alpha, sys)
    return {
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


def _notes(cfg: CAOSConfig) -> list[str]:
    return [
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
