"""aux-BO's history on nshot's own sweeps (``experiments()`` with ``experiment=history_curve``).

The promise of a meta-trained surrogate is that sweeps get faster as the history of earlier
sweeps grows. This experiment measures it on the sweeps nshot itself runs, through the same
path a user takes:

1. **History.** ``max(curve_history)`` sweeps of ``history_method`` (random search,
   ``curve_history_trials`` trials each), one per task, run by ``nshot tune`` and saved to a
   history directory of the run's own, as every sweep is. A task is the swept method's
   ``curve_preset`` with ``curve_set`` applied, its own seed, and one seeded draw of each field
   of ``curve_vary`` (what makes tasks differ besides the seed: a dataset, an episode regime).
2. **Surrogates.** For each ``k`` of ``curve_history``, a TNP meta-trained on the first ``k``
   sweeps (the history family, as ``nshot train auxbo --set family=history`` reads it; one in
   five of them held back to pick the step), saved where the searcher's ``checkpoint`` option
   reads it.
3. **Held-out sweeps.** ``curve_tasks`` new tasks, each swept by every system with
   ``curve_trials`` trials and ``curve_concurrency`` trials at once: random search, Optuna's TPE,
   the GP (aux-BO with no history: no surrogate, no warm start) — those of ``curve_baselines`` —
   and ``auxbo_h<k>`` (aux-BO with the surrogate of ``k`` sweeps and their best configs as warm
   starts).

Rows: ``random``, ``optuna_tpe``, ``gp``, ``auxbo_h<k>``. Metrics: ``best_at_<t>``, the best
objective among a sweep's first ``t`` trials (in the objective's own units, in the order the
searcher proposed them), and ``norm_at_<t>``, the same normalised per task to [0, 1] between the
worst and the best value any system found on that task (higher is better). ``samples`` hold the
per-task values (paired by task across rows); ``extra["pvalues"]`` one-sided paired Wilcoxon
tests over the tasks.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from nshot.errors import NshotError
from nshot.method import MethodConfig, ResultsTable

from .config import AuxBOConfig

BASELINES = ("random", "optuna_tpe", "gp")


def _log(msg: str) -> None:
    print(f"[auxbo history_curve] {msg}", file=sys.stderr, flush=True)


def curve_systems(cfg: AuxBOConfig) -> tuple[str, ...]:
    """The rows: the baselines ``cfg.curve_baselines`` (in :data:`BASELINES` order), then aux-BO
    per history size (ascending)."""
    baselines = tuple(b for b in BASELINES if b in cfg.curve_baselines)
    return (*baselines, *(f"auxbo_h{k}" for k in sorted(cfg.curve_history)))


def checkpoints(cfg: AuxBOConfig) -> tuple[int, ...]:
    """The trial counts the metrics are read at: 5, 10 and ``curve_trials`` (those that fit)."""
    return tuple(sorted({t for t in (5, 10, cfg.curve_trials) if t <= cfg.curve_trials}))


def task_spec(cfg: AuxBOConfig, index: int) -> dict[str, Any]:
    """Task ``index``: its seed and its draw of every ``curve_vary`` field (seeded by
    ``cfg.seed`` and the index alone, so task ``i`` is the same whatever else changes)."""
    rng = np.random.default_rng([cfg.seed, 4243, index])
    fields = {
        k: cfg.curve_vary[k][int(rng.integers(len(cfg.curve_vary[k])))]
        for k in sorted(cfg.curve_vary)
    }
    return {"seed": cfg.seed * 100_000 + index, **fields}


def _label(index: int, spec: dict[str, Any]) -> str:
    return f"task{index}:" + ",".join(f"{k}={v}" for k, v in spec.items())


def _sweep(
    cfg: AuxBOConfig,
    workdir: Path,
    name: str,
    swept: MethodConfig,
    label: str,
    search: str,
    num_samples: int,
    *,
    history_dir: Path,
    save_history: bool,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``nshot tune`` sweep of ``history_method`` from the task's config ``swept``; its
    trials (config, f) in the order they were proposed. A sweep that finished in an earlier
    attempt of the same run is read back from its record instead of run again."""
    from nshot.tune.run import tune

    config = json.loads(json.dumps(swept.model_dump(), default=str))
    record = workdir / "records" / f"{name}.json"
    if record.is_file():
        done = json.loads(record.read_text())
        same = (done.get("task"), done.get("search"), len(done.get("f", []))) == (
            label,
            search,
            num_samples,
        )
        if not same or (done.get("config"), done.get("options")) != (config, options):
            raise NshotError(
                f"{record}: a sweep of other settings is recorded under this name; reproduce "
                "into a new --out folder (or delete that folder to start over)"
            )
        return done
    storage = workdir / "sweeps"
    if (storage / name).exists():  # an attempt that did not finish: this run's own folder
        shutil.rmtree(storage / name)
    t0 = time.time()
    res = tune(
        cfg.history_method,  # type: ignore[arg-type]
        swept,
        search=search,
        num_samples=num_samples,
        max_concurrent=cfg.curve_concurrency,
        storage=storage,
        name=name,
        history_dir=history_dir,
        save_history=save_history,
        search_options=options,
        dataset=label,
        seed=swept.seed,
        progress=False,
    )

    trials = res.trials  # in the order the searcher proposed them
    if any(t.index is None for t in trials):
        raise NshotError(f"{name}: Tune did not record the order of the trials")
    out = {
        "name": name,
        "task": label,
        "search": search,
        "index": [t.index for t in trials],
        "f": [t.f for t in trials],
        "configs": [t.config for t in trials],
        "errors": [t.error for t in trials if t.error],
        "searcher": res.extra.get("searcher"),
        "wall_s": time.time() - t0,
        "config": config,
        "options": options,
    }
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(out, indent=1, default=str))
    best = res.best_f
    _log(f"{name} ({label}, {search}): best {best if best is None else round(best, 4)}, "
         f"{out['wall_s']:.0f} s")  # fmt: skip
    return out


def _surrogate(cfg: AuxBOConfig, history: Path, folder: Path) -> dict[str, Any]:
    """Meta-train the TNP on the sweeps in ``history`` and save it to ``folder`` (kept if an
    earlier attempt of the run saved it)."""
    from .data import history_family
    from .model import META_FILE, family_stats, save_tnp
    from .train import meta_train

    info_file = folder / "training.json"
    if (folder / META_FILE).is_file() and info_file.is_file():
        return json.loads(info_file.read_text())
    k = len(list(history.glob("*.parquet")))
    acfg = cfg.replace(
        family="history",
        history_dir=str(history),
        steps=cfg.curve_surrogate_steps,
        m_targets=cfg.curve_m_targets,
        select_tasks=max(1, k // 5),
        select_every=max(1, cfg.curve_surrogate_steps // 10),
    )
    train, test, info = history_family(acfg)
    tasks = [*train, *test]  # every earlier sweep is history here; the held-out tasks are new
    stats = family_stats(tasks)
    selection: dict[str, Any] = {}
    t0 = time.time()
    model, losses = meta_train(acfg, tasks, stats, use_h=True, selection=selection)
    save_tnp(
        model,
        stats,
        folder,
        extra={"space": info["space"], "space_hash": info["space_hash"],
               "history_method": info["method"]},
    )  # fmt: skip
    out = {
        "sweeps": k,
        "seconds": time.time() - t0,
        "final_loss": float(np.mean(losses[-50:])) if losses else None,
        "kept_step": selection.get("best_step"),
        "held_back_nll": selection.get("best_nll"),
    }
    info_file.write_text(json.dumps(out, indent=1))
    _log(f"surrogate of {k} sweeps: kept step {out['kept_step']}, {out['seconds']:.0f} s")
    return out


def best_so_far(f: list[float | None], mode: str) -> np.ndarray:
    """Running best of ``f`` (failed trials, ``None``, change nothing; NaN until the first)."""
    sign = 1.0 if mode == "max" else -1.0
    y = np.asarray([np.nan if v is None else float(v) for v in f], dtype=np.float64)
    y[~np.isfinite(y)] = np.nan
    return sign * np.fmax.accumulate(sign * y) if y.size else y


def summarise(
    sweeps: dict[str, list[dict[str, Any]]], ks: tuple[int, ...], mode: str
) -> dict[str, Any]:
    """Per system: the best after each ``k`` trials per task (own units), the same normalised per
    task between the worst and best value any system found on it, and the mean curves."""
    systems = list(sweeps)
    n_tasks = len(sweeps[systems[0]])
    sign = 1.0 if mode == "max" else -1.0
    best: dict[str, np.ndarray] = {}
    norm: dict[str, np.ndarray] = {}
    for s in systems:
        T = max(len(r["f"]) for r in sweeps[s])
        curves = np.full((n_tasks, T), np.nan)
        for i, r in enumerate(sweeps[s]):
            c = best_so_far(r["f"], mode)
            curves[i, : len(c)] = c
            curves[i, len(c) :] = c[-1] if len(c) else np.nan
        best[s] = curves
    # per task, the worst and best value any system found there (oriented: higher is better)
    lo, hi = np.full(n_tasks, np.nan), np.full(n_tasks, np.nan)
    for i in range(n_tasks):
        y = sign * np.asarray([v for s in systems for v in sweeps[s][i]["f"] if v is not None])
        y = y[np.isfinite(y)]
        if y.size:
            lo[i], hi[i] = y.min(), y.max()
    span = np.where(hi > lo, hi - lo, 1.0)
    for s in systems:
        norm[s] = (sign * best[s] - lo[:, None]) / span[:, None]
    out: dict[str, Any] = {"best": {}, "norm": {}, "curves": {}}
    for s in systems:
        out["best"][s] = {k: best[s][:, k - 1] for k in ks}
        out["norm"][s] = {k: norm[s][:, k - 1] for k in ks}
        out["curves"][s] = [float(v) for v in np.nanmean(norm[s], axis=0)]
    return out


def _wilcoxon_greater(a: np.ndarray, b: np.ndarray) -> float | None:
    from nshot.claims import paired_p

    ok = np.isfinite(a) & np.isfinite(b)
    return paired_p("wilcoxon", list(a[ok]), list(b[ok]), "greater")


def run_history_curve(cfg: AuxBOConfig, workdir: Path) -> ResultsTable:
    from nshot.method import get

    if not cfg.history_method:
        raise NshotError("experiment=history_curve needs history_method (the swept method)")
    t_start = time.time()
    workdir = Path(workdir)
    method = get(cfg.history_method)
    base = method.config(cfg.curve_preset, **cfg.curve_set)
    spec = type(base).TUNE
    if spec is None:
        raise NshotError(f"history_curve: {cfg.history_method!r} declares no search space")
    mode = spec.mode
    n_hist = max(cfg.curve_history)
    phases: dict[str, float] = {}

    # 1. the history: one random-search sweep per history task
    t0 = time.time()
    history_sweeps = []
    files = []
    for i in range(n_hist):
        task = task_spec(cfg, i)
        name = f"history-{i:03d}"
        own = workdir / "history" / "sweeps" / name  # this sweep's history file, alone
        if not (workdir / "records" / f"{name}.json").is_file() and own.exists():
            shutil.rmtree(own)  # an attempt that did not finish
        history_sweeps.append(
            _sweep(cfg, workdir, name, base.replace(**task), _label(i, task), "random",
                   cfg.curve_history_trials, history_dir=own, save_history=True)
        )  # fmt: skip
        saved = sorted(own.glob("*.parquet"))
        if len(saved) != 1:
            raise NshotError(f"history_curve: {own} holds {len(saved)} sweeps, 1 expected")
        files.append(saved[0])
    phases["history_sweeps_s"] = time.time() - t0

    # 2. a surrogate per history size, on the first k sweeps
    t0 = time.time()
    surrogates: dict[int, Path] = {}
    training: dict[str, Any] = {}
    for k in sorted(cfg.curve_history):
        hist_k = workdir / "history" / f"h{k}"
        hist_k.mkdir(parents=True, exist_ok=True)
        for p in files[:k]:  # the first k sweeps, in the order they ran
            if not (hist_k / p.name).exists():
                shutil.copy2(p, hist_k / p.name)  # keeps the mtime: the history's order
        surrogates[k] = workdir / "surrogates" / f"h{k}"
        training[str(k)] = _surrogate(cfg, hist_k, surrogates[k])
    phases["surrogates_s"] = time.time() - t0

    # 3. the held-out sweeps, every system on every task
    t0 = time.time()
    empty = workdir / "history" / "none"
    empty.mkdir(parents=True, exist_ok=True)
    every: dict[str, tuple[str, dict[str, Any] | None, Path]] = {
        "random": ("random", None, empty),
        "optuna_tpe": ("optuna", None, empty),
        "gp": ("auxbo", {"surrogate": False, "warm": False}, empty),
    }
    for k in sorted(cfg.curve_history):
        every[f"auxbo_h{k}"] = (
            "auxbo",
            {"checkpoint": str(surrogates[k])},
            workdir / "history" / f"h{k}",
        )
    plan = {s: every[s] for s in curve_systems(cfg)}
    sweeps: dict[str, list[dict[str, Any]]] = {s: [] for s in plan}
    for j in range(cfg.curve_tasks):
        i = n_hist + j
        task = task_spec(cfg, i)
        for s, (search, options, hdir) in plan.items():
            sweeps[s].append(
                _sweep(cfg, workdir, f"{s}-task{i:03d}", base.replace(**task), _label(i, task), search,
                       cfg.curve_trials, history_dir=hdir, save_history=False, options=options)
            )  # fmt: skip
    phases["heldout_sweeps_s"] = time.time() - t0

    # 4. the curve
    ks = checkpoints(cfg)
    summ = summarise(sweeps, ks, mode)
    metrics: dict[str, bool] = {}
    for k in ks:
        metrics[f"norm_at_{k}"] = True
    for k in ks:
        metrics[f"best_at_{k}"] = mode == "max"
    rows: dict[str, dict[str, float | None]] = {}
    stds: dict[str, dict[str, float | None]] = {}
    samples: dict[str, dict[str, list[float | None]]] = {}
    for s in plan:
        rows[s], stds[s], samples[s] = {}, {}, {}
        for k in ks:
            for key, vals in (
                (f"norm_at_{k}", summ["norm"][s][k]),
                (f"best_at_{k}", summ["best"][s][k]),
            ):
                rows[s][key] = float(np.nanmean(vals))
                stds[s][key] = float(np.nanstd(vals))
                samples[s][key] = [None if not np.isfinite(v) else float(v) for v in vals]
    last = ks[-1]
    pvalues: dict[str, float | None] = {}
    for s in plan:
        if not s.startswith("auxbo_h"):
            continue
        for b in (b for b in BASELINES if b in plan):
            for k in ks:
                pvalues[f"{s}@{k}>{b}@{k}"] = _wilcoxon_greater(
                    summ["norm"][s][k], summ["norm"][b][k]
                )
        if 10 in ks and "gp" in plan:
            pvalues[f"{s}@10>gp@{last}"] = _wilcoxon_greater(
                summ["norm"][s][10], summ["norm"]["gp"][last]
            )
    errors = sum(len(r["errors"]) for rs in sweeps.values() for r in rs)
    errors += sum(len(r["errors"]) for r in history_sweeps)
    extra = {
        "history_method": method.name,
        "swept": {
            "preset": cfg.curve_preset,
            "set": cfg.curve_set,
            "vary": cfg.curve_vary,
            "space": {k: repr(v) for k, v in spec.space.items()},
            "metric": spec.metric,
            "mode": mode,
            "steps": base.steps,
        },
        "history_tasks": [r["task"] for r in history_sweeps],
        "heldout_tasks": [r["task"] for r in next(iter(sweeps.values()))],
        "history_best": [
            None if not r["f"] else float(best_so_far(r["f"], mode)[-1]) for r in history_sweeps
        ],
        "surrogates": training,
        "curves": summ["curves"],
        "pvalues": pvalues,
        "trial_errors": errors,
        "phases": phases,
        "trials": {s: [r["f"] for r in rs] for s, rs in sweeps.items()},
        "first_configs": {s: [r["configs"][:2] for r in rs] for s, rs in sweeps.items()},
    }
    k10 = 10 if 10 in ks else ks[0]
    notes = [
        f"{cfg.curve_tasks} held-out tasks of `nshot tune {method.name}` (preset "
        f"{cfg.curve_preset}, {base.steps} steps per trial, objective {spec.metric} ({mode})), "
        f"{cfg.curve_trials} trials per sweep, {cfg.curve_concurrency} at once; history: "
        f"{n_hist} random-search sweeps of {cfg.curve_history_trials} trials on other tasks.",
        "`gp` is aux-BO with no history (no surrogate, no warm start): the GP fallback.",
        "norm_at_t: the best objective among the first t trials, normalised per task between "
        "the worst and best value any system found there (1 = the best anyone found).",
    ]
    for s in plan:
        if s.startswith("auxbo_h") and "gp" in plan:
            notes.append(
                f"{s} at {k10} trials: {rows[s][f'norm_at_{k10}']:.3f} vs the GP at {last}: "
                f"{rows['gp'][f'norm_at_{last}']:.3f} (one-sided Wilcoxon over tasks, "
                f"p = {pvalues.get(f'{s}@10>gp@{last}')})"
            )
    _plot(summ["curves"], workdir / "history_curve.png", method.name)
    return ResultsTable(
        method="auxbo",
        preset=cfg.preset,
        seeds=cfg.curve_tasks,
        metrics=metrics,
        rows=rows,
        stds=stds,
        runtime_s=time.time() - t_start,
        notes=notes,
        extra=extra,
        samples=samples,
        experiment="history_curve",
    )


def _plot(curves: dict[str, list[float]], path: Path, swept: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for s, c in curves.items():
        style = "-" if s.startswith("auxbo") else "--"
        ax.plot(range(1, len(c) + 1), c, style, label=s, marker="o", markersize=3)
    ax.set_xlabel("trials")
    ax.set_ylabel("normalised best so far (mean over held-out tasks)")
    ax.set_title(f"aux-BO on held-out sweeps of {swept}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
