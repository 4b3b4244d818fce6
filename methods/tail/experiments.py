"""`nshot reproduce tail`: TAIL against ProtoHead, LinearProbe and two ablations, or
(``experiment=ingredients``) TAIL variants that each change one scale ingredient.

Every (variant, seed) trains as one job of the platform's experiment runner
(:mod:`nshot.experiment`; Ray Train's local mode inside a Ray task of one CPU). Each seed's
checkpoints are then evaluated with the training-free baselines on the same episodes
(``evaluation.py``: one Ray task per setting). Rows are means over seeds, ± the standard
deviation over seeds (with one seed: the standard deviation of the mean over episodes), and
``samples`` keeps the per-seed values, paired across systems. The paper's claims over these
rows are declared in ``claims.py``; ``extra["paired_vs_protohead"]`` holds each TAIL variant's
gain over ProtoHead paired over the same episodes.

With ``served_episodes`` (the comparison of ``small``), each seed's TAIL checkpoint is also
loaded and answered as ``nshot serve`` does, at its default settings, on generated tasks of 16 to
4,096 raw features (``widths.py``), next to nearest centroid on standardised features over the
same episodes: the metrics ``acc_width<W>`` of the rows ``tail`` and ``nearest_centroid``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from nshot.experiment import Job, run_jobs
from nshot.method import ResultsTable

from .baselines import episode_accuracy
from .config import TailConfig
from .evaluation import Setting, default_settings, evaluate_systems, tail_system
from .serve import TailPredictor
from .widths import WIDTHS, served_check

ABLATIONS = {
    "no_projection": {"projection": "none"},
    "fixed_label_slots": {"label_mode": "fixed_slots"},
}
ORDER = ("tail", "protohead", "linear_probe", "no_projection", "fixed_label_slots")


def ingredients(cfg: TailConfig) -> dict[str, dict[str, Any]]:
    """``experiment=ingredients``: the paper's scale ingredients, each changed alone (the
    paper's model has 16 blocks and trains 100k steps; ``small`` has 4 and 1,500): twice the
    depth, and four and sixteen times the steps (the last beyond ``small``'s budget: about 20
    minutes of training on one CPU). The other two are measured elsewhere: modality diversity
    by ``train_tasks`` (``results/small-mixed.*``) and the label dictionary by
    ``fixed_label_slots`` (the main comparison)."""
    return {
        "tail": {},
        "tail_depth2x": {"depth": 2 * cfg.depth},
        "tail_steps4x": {"steps": 4 * cfg.steps},
        "tail_steps16x": {"steps": 16 * cfg.steps},
    }


def run_experiments(cfg: TailConfig, workdir: Path) -> ResultsTable:
    """The comparison (``experiment=comparison``) or the scale ingredients (``ingredients``):
    TAIL variants trained, then evaluated with the training-free baselines on the same
    episodes."""
    from nshot.train import load_checkpoint

    t0 = time.time()
    if cfg.experiment == "ingredients":
        variants = ingredients(cfg)
        order = (*variants, "protohead", "linear_probe")
    else:
        variants, order = {"tail": {}, **ABLATIONS}, ORDER
    seeds = [cfg.seed + i for i in range(cfg.experiment_seeds)]
    trained = variant_seeds(cfg, variants, seeds)
    runs = str(workdir / "runs")
    jobs = [
        Job(
            (v, s),
            train_variant,
            (cfg.replace(seed=s, **variants[v]), runs, f"{v}-seed{s}"),
            trains=True,
        )
        for v in variants
        for s in trained[v]
    ]
    ckpts = run_jobs(jobs, description=f"tail {cfg.preset}: training {len(jobs)} variants")
    settings = default_settings()
    per_seed: dict[str, dict[str, list[float | None]]] = {}
    ci: dict[str, dict[str, list[float]]] = {}
    paired: dict[str, dict[str, list[dict[str, Any]]]] = {}
    draws = cfg.compare_draws or max(cfg.eval_draws, 4)
    for s in seeds:
        systems: dict[str, Any] = {"protohead": None, "linear_probe": None}
        for name in variants:
            if s not in trained[name]:
                continue  # an ablation row trained on fewer seeds (ablation_seeds)
            ckpt = load_checkpoint(ckpts[(name, s)])
            systems[name] = tail_system(TailPredictor.from_checkpoint(ckpt))
        res = evaluate_systems(
            systems,
            settings,
            episodes=cfg.eval_episodes,
            seed=12345 + s,
            draws=draws,
            per_episode=True,
        )
        for system, metrics in res.items():
            for metric, acc in metrics.items():
                val = None if acc is None else episode_accuracy(acc)
                per_seed.setdefault(system, {}).setdefault(metric, []).append(
                    None if val is None else val[0]
                )
                if val is not None:
                    ci.setdefault(system, {}).setdefault(metric, []).append(val[1])
                if system in variants and acc is not None:
                    paired.setdefault(system, {}).setdefault(metric, []).append(
                        paired_gain(acc, res["protohead"][metric])
                    )
    metrics = {s.metric: True for s in settings}
    if cfg.served_episodes and cfg.experiment == "comparison":
        served = _served(cfg, {s: str(ckpts[("tail", s)]) for s in seeds}, per_seed, ci)
        metrics.update(dict.fromkeys(served, True))
        order = (*order, "nearest_centroid")
    rows, stds = _mean_and_spread(per_seed, ci, order)
    return ResultsTable(
        method="tail",
        preset=cfg.preset,
        experiment=None if cfg.experiment == "comparison" else cfg.experiment,
        seeds=len(seeds),
        metrics=metrics,
        rows=rows,
        stds=stds,
        runtime_s=time.time() - t0,
        notes=_notes(rows, settings, cfg, len(seeds), draws, variants, paired, trained),
        extra={
            "settings": {s.metric: s.description for s in settings},
            "paired_vs_protohead": paired,
            "checkpoints": {f"{k[0]}-seed{k[1]}": str(v) for k, v in ckpts.items()},
        },
        samples={system: per_seed[system] for system in order},
    )


def variant_seeds(
    cfg: TailConfig, variants: dict[str, dict[str, Any]], seeds: list[int]
) -> dict[str, list[int]]:
    """The training seeds of each variant: every seed, except the ablation rows, which train
    on the first ``ablation_seeds`` (all of them when it is ``None``)."""
    ablation = seeds[: cfg.ablation_seeds or len(seeds)]
    return {v: ablation if v in ABLATIONS else seeds for v in variants}


def width_metric(width: int) -> str:
    return f"acc_width{width}"


def _served(
    cfg: TailConfig,
    ckpts: dict[int, str],
    per_seed: dict[str, dict[str, list[float | None]]],
    ci: dict[str, dict[str, list[float]]],
) -> list[str]:
    """The served-model check: every seed's TAIL checkpoint as ``nshot serve`` answers (its
    default settings) and nearest centroid on standardised features, on ``served_episodes``
    generated tasks per width (one job per seed and width; the episodes of seed ``s`` come
    from ``12345 + s``, the comparison's evaluation seed). Adds ``acc_width<W>`` of ``tail``
    and ``nearest_centroid`` to ``per_seed``/``ci``; returns the metric names."""
    jobs = [
        Job((s, w), served_check, (path, w, cfg.served_episodes, 12345 + s))
        for s, path in ckpts.items()
        for w in WIDTHS
    ]
    done = run_jobs(
        jobs, description=f"tail {cfg.preset}: the served model at {len(WIDTHS)} widths"
    )
    for s in ckpts:
        for w in WIDTHS:
            for system, (mean, half) in done[(s, w)].items():
                per_seed.setdefault(system, {}).setdefault(width_metric(w), []).append(mean)
                ci.setdefault(system, {}).setdefault(width_metric(w), []).append(half)
    return [width_metric(w) for w in WIDTHS]


def _mean_and_spread(
    per_seed: dict[str, dict[str, list[float | None]]],
    ci: dict[str, dict[str, list[float]]],
    order: tuple[str, ...] = ORDER,
) -> tuple[dict[str, dict[str, float | None]], dict[str, dict[str, float | None]]]:
    """Means over seeds and the sample standard deviation over seeds; with one seed, the
    standard deviation of the mean over episodes (the 95 % half-width / 1.96)."""
    rows: dict[str, dict[str, float | None]] = {}
    stds: dict[str, dict[str, float | None]] = {}
    for system in order:
        rows[system], stds[system] = {}, {}
        for metric, vals in per_seed[system].items():
            if any(v is None for v in vals):
                rows[system][metric] = stds[system][metric] = None
                continue
            arr = np.asarray(vals, dtype=float)
            rows[system][metric] = float(arr.mean())
            stds[system][metric] = (
                float(arr.std(ddof=1)) if len(arr) > 1 else float(ci[system][metric][0] / 1.96)
            )
    return rows, stds


def paired_gain(acc: np.ndarray, base: np.ndarray) -> dict[str, Any]:
    """A system's accuracy minus the baseline's over the same episodes: the mean gain, its 95 %
    half-width ``1.96·sd/√n``, and the one-sided paired t-test's p that the gain is positive."""
    from nshot.claims import paired_p

    d = np.asarray(acc, dtype=float) - np.asarray(base, dtype=float)
    return {  # one episode: no spread and no p (None)
        "gain": float(d.mean()),
        "ci95": float(1.96 * d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else None,
        "p_greater": paired_p("paired_t", acc, base, "greater"),
        "episodes": len(d),
    }


def train_variant(cfg: TailConfig, storage: str, name: str) -> str:
    """One training run (Ray Train local mode inside a Ray task); returns the checkpoint path."""
    from nshot.train import Scaling, fit

    res = fit("tail", cfg, scaling=Scaling(workers=0), storage=storage, name=name, overwrite=True)
    return str(res.checkpoint)


def _notes(
    rows: dict,
    settings: list[Setting],
    cfg: TailConfig,
    seeds: int,
    draws: int,
    variants: dict[str, dict[str, Any]],
    paired: dict[str, dict[str, list[dict[str, Any]]]],
    trained: dict[str, list[int]] | None = None,
) -> list[str]:
    notes = [
        f"{cfg.eval_episodes} episodes per setting and seed, 5 queries per class; TAIL variants "
        f"average {draws} (π, ρ) draws. Every system sees the same episodes.",
        "± is the standard deviation over training seeds"
        if seeds > 1
        else "± is the standard deviation of the mean over episodes (one training seed)",
    ]
    fewer = {v: len(s) for v, s in (trained or {}).items() if len(s) < seeds}
    if fewer:
        notes.append(
            "trained on fewer seeds (ablation_seeds; ± over episodes with one seed): "
            + ", ".join(f"{v} {n}" for v, n in fewer.items())
        )
    if "nearest_centroid" in rows:
        gaps = ", ".join(
            f"{w} {(rows['tail'][m] - rows['nearest_centroid'][m]) * 100:+.1f}"
            for w in WIDTHS
            if (m := width_metric(w)) in rows["tail"]
        )
        notes.append(
            f"acc_width<W>: the served TAIL checkpoint at its defaults ({cfg.eval_draws} (π, ρ) "
            f"draws, standardised requests) and nearest centroid on standardised features, "
            f"{cfg.served_episodes} generated 5-way 5-shot tasks of W raw features per seed "
            f"(MixedGaussianModality); TAIL minus nearest centroid, points: {gaps}"
        )
    if "fixed_label_slots" in variants:
        notes.append(
            "fixed_label_slots has max_ways label slots and cannot classify 20 classes: n/a."
        )
    if cfg.experiment == "ingredients":
        changed = ", ".join(f"{v}: {ch}" for v, ch in variants.items() if ch)
        notes.append(
            f"scale ingredients, each changed alone from tail (depth {cfg.depth}, "
            f"{cfg.steps} steps): {changed}"
        )
        for v in variants:
            gains = [
                f"{m.removeprefix('acc_')} {g[0]['gain'] * 100:+.2f} ± {g[0]['ci95'] * 100:.2f} "
                f"(p {g[0]['p_greater']:.2g})"
                for m, g in paired.get(v, {}).items()
                if m in ("acc_unseen_modality_5w5s", "acc_mnist_5w5s") and g[0]["ci95"] is not None
            ]
            if gains:
                notes.append(
                    f"{v} minus protohead, paired over the same episodes (points, 95 % "
                    f"half-width, one-sided paired t; first seed): {', '.join(gains)}"
                )

    def fmt(system: str, metric: str) -> str:
        v = rows[system].get(metric)
        return "n/a" if v is None else f"{v:.3f}"

    m = "acc_unseen_modality_5w5s"
    if m in rows["tail"] and "no_projection" in rows:
        notes.append(
            f"unseen modality 5w5s: tail {fmt('tail', m)} vs no_projection "
            f"{fmt('no_projection', m)}, fixed_label_slots {fmt('fixed_label_slots', m)}, "
            f"protohead {fmt('protohead', m)}"
        )
    t20 = rows["tail"].get("acc_20way")
    if t20 is not None:
        notes.append(f"20-way 5-shot: tail {t20:.3f} = {t20 * 20:.1f}x chance")
    for s in settings:
        if s.description:
            notes.append(f"{s.metric}: {s.description}")
    return notes
