"""`nshot reproduce recog`: ReCoG against the context graph, its ablations and the baselines.

One Ray task per (track, system, seed): the trained systems meta-train on the track's training
targets (``steps`` episodes on MoleculeACE, ``synthetic_steps`` on the synthetic track) and are
evaluated with the fingerprint and auxiliary-label baselines on the same support draws of the
held-out targets. The table's rows are the real-label track; the synthetic track (exact
informative/distractor ground truth) is reported in ``extra["synthetic"]``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from nshot.experiment import Job, aggregate, is_planning, run_jobs, share
from nshot.method import ResultsTable

from .config import RecogConfig
from .data import track_for
from .evaluation import (
    auxlabel_logreg,
    evaluate_system,
    fp_logreg,
    leakage_max_abs_diff,
    model_system,
)
from .train import fit_model

SYSTEMS = (
    "recog", "context_graph", "recog_no_cpr", "recog_no_cgib", "protonet", "fp_logreg",
    "auxlabel_logreg", "recog_shuffled_context",
)  # fmt: skip
TRAINED = ("recog", "context_graph", "recog_no_cpr", "recog_no_cgib", "protonet",
           "recog_shuffled_context")  # fmt: skip
CONTEXT = {"recog", "context_graph", "recog_no_cpr", "recog_no_cgib", "auxlabel_logreg",
           "recog_shuffled_context"}  # fmt: skip
METRICS = {
    "auc_1shot": True,
    "auc_10shot": True,
    "dauprc_1shot": True,
    "auc_1shot_cliff": True,
    "gate_auc": True,
    "distractor_drop": False,
}


def _job(cfg_dict: dict[str, Any], track_name: str, system: str, seed: int, track) -> dict:
    t0 = time.time()
    steps_key = "steps" if track_name == "moleculeace" else "synthetic_steps"
    cfg = RecogConfig.validated({**cfg_dict, "seed": seed, "system": system if system in
                                 TRAINED else "recog", "track": track_name,
                                 "steps": cfg_dict[steps_key]})  # fmt: skip
    extra: dict[str, Any] = {}
    if system == "fp_logreg":
        answer = fp_logreg
    elif system == "auxlabel_logreg":
        answer = auxlabel_logreg
    else:
        model = fit_model(cfg, track, system)
        answer = model_system(model)
        if system == "recog" and seed == cfg_dict["seed"]:
            extra["leakage_max_abs_diff"] = leakage_max_abs_diff(model, track, cfg, seed)
    res = evaluate_system(answer, track, cfg, seed, uses_context=system in CONTEXT)
    detail = res.pop("detail")
    res = {k: (None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v))
           for k, v in res.items()}  # fmt: skip
    return {"metrics": res, "detail": detail, "extra": extra, "seconds": time.time() - t0}


def _seeds(cfg: RecogConfig, track_name: str) -> list[int]:
    n = cfg.seeds if track_name == "moleculeace" else cfg.synthetic_seeds
    return [cfg.seed + i for i in range(n)]


def run_experiments(cfg: RecogConfig, workdir: Path) -> ResultsTable:
    t0 = time.time()
    workdir.mkdir(parents=True, exist_ok=True)
    tracks, refs = {}, {}
    if is_planning():  # the grid needs no track: its features are built only for a run
        refs = {(name, shuffled): None for name in cfg.exp_tracks for shuffled in (False, True)}
    for name in cfg.exp_tracks if not is_planning() else ():
        tracks[name] = track_for(cfg, name)
        shuffled = track_for(cfg.replace(system="recog_shuffled_context"), name)
        refs[(name, False)] = share(tracks[name])
        refs[(name, True)] = share(shuffled)
    jobs = []
    # trained systems first (the long tasks), the real-label track first
    order = [s for s in SYSTEMS if s in TRAINED] + [s for s in SYSTEMS if s not in TRAINED]
    for name in cfg.exp_tracks:
        for system in order:
            for seed in _seeds(cfg, name):
                ref = refs[(name, system == "recog_shuffled_context")]
                jobs.append(Job((name, system, seed), _job,
                                (cfg.model_dump(), name, system, seed, ref),
                                trains=system in TRAINED))  # fmt: skip
    done = run_jobs(jobs, description="recog")
    tables = {}
    for name in cfg.exp_tracks:
        per = {(s, seed): done[(name, s, seed)]["metrics"] for s in SYSTEMS
               for seed in _seeds(cfg, name)}  # fmt: skip
        rows, stds, samples = aggregate(per)
        tables[name] = {"rows": rows, "stds": stds, "samples": samples}
    main = cfg.exp_tracks[0]
    unit = {}
    for key, r in done.items():
        if "leakage_max_abs_diff" in r["extra"] and key[0] == main:
            unit["leakage_max_abs_diff"] = r["extra"]["leakage_max_abs_diff"]
    extra: dict[str, Any] = {
        "main_track": main,
        "unit": unit,
        "job_seconds": {"/".join(map(str, k)): round(v["seconds"], 2) for k, v in done.items()},
    }
    for name in cfg.exp_tracks:
        seeds = _seeds(cfg, name)
        extra[name] = {
            "split": tracks[name].record,
            "seeds": len(seeds),
            "steps": cfg.steps if name == "moleculeace" else cfg.synthetic_steps,
            "per_target_auc_1shot": {
                s: _mean_dicts(
                    [done[(name, s, seed)]["detail"]["per_target_1shot"] for seed in seeds]
                )
                for s in SYSTEMS
            },  # fmt: skip
            "gate_means": {
                s: {
                    k: _nanmean([done[(name, s, seed)]["detail"].get(k) for seed in seeds])
                    for k in ("gate_mean_informative", "gate_mean_distractor")
                }
                for s in ("recog", "recog_no_cpr", "recog_shuffled_context")
            },  # fmt: skip
            "auc_1shot_no_distractors": {
                s: _nanmean(
                    [
                        done[(name, s, seed)]["detail"].get("auc_1shot_no_distractors")
                        for seed in seeds
                    ]
                )
                for s in SYSTEMS
                if s in CONTEXT
            },  # fmt: skip
        }
        if name != main:
            extra[name]["rows"] = tables[name]["rows"]
            extra[name]["stds"] = tables[name]["stds"]
    plot(tables, workdir / "recog.png")
    return ResultsTable(
        method="recog", preset=cfg.preset, seeds=len(_seeds(cfg, main)), metrics=METRICS,
        rows=tables[main]["rows"], stds=tables[main]["stds"], samples=tables[main]["samples"],
        runtime_s=time.time() - t0, notes=_notes(cfg, tracks, main), extra=extra,
    )  # fmt: skip


def _nanmean(vals) -> float | None:
    v = [float(x) for x in vals if x is not None and not math.isnan(float(x))]
    return float(np.mean(v)) if v else None


def _mean_dicts(dicts: list[dict[str, float]]) -> dict[str, float | None]:
    return {k: _nanmean([d.get(k) for d in dicts]) for k in dicts[0]} if dicts else {}


def _notes(cfg: RecogConfig, tracks, main: str) -> list[str]:
    notes = [
        f"rows: the {main} track; mean over {len(_seeds(cfg, main))} seeds (± std over seeds); "
        f"{cfg.eval_draws} support draws per test target, queries stratified and capped at "
        f"{cfg.eval_queries}; auxiliaries per episode: {cfg.n_aux} informative + "
        f"{cfg.n_distractors} injected distractors (distractor_drop: AUC with 0 minus AUC "
        f"with {cfg.n_distractors}).",
        f"encoder {cfg.encoder} (d = {cfg.d}), {cfg.layers} message-passing layers, "
        f"first-order episodic training ({cfg.steps} episodes on {main}, "
        f"{cfg.synthetic_steps} on the synthetic track), k ∈ {cfg.shots}.",
    ]
    if "moleculeace" in tracks:
        rec = tracks["moleculeace"].record
        notes.append(
            f"MoleculeACE: active = pAct (y + 9) >= {cfg.active_pact}; test targets "
            f"{', '.join(rec['test_targets'])}; each shares >= {cfg.min_shared} molecules "
            "with a training target (extra.moleculeace.split.partners)."
        )
    if "synthetic" in tracks and main != "synthetic":
        notes.append("extra.synthetic: the same rows and metrics on RDKit's molecules with "
                     "generated properties (auc_1shot_cliff does not apply there).")  # fmt: skip
    return notes


def plot(tables: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(tables)
    fig, axes = plt.subplots(1, 2 * len(names), figsize=(6 * len(names) * 2, 4), squeeze=False)
    for i, name in enumerate(names):
        rows, stds = tables[name]["rows"], tables[name]["stds"]
        for j, metric in enumerate(("auc_1shot", "distractor_drop")):
            ax = axes[0, 2 * i + j]
            systems = [s for s in SYSTEMS if rows[s].get(metric) is not None]
            vals = [rows[s][metric] for s in systems]
            errs = [stds[s].get(metric) or 0.0 for s in systems]
            ax.bar(range(len(systems)), vals, yerr=errs, color=[
                "C3" if s == "recog" else "C0" for s in systems])  # fmt: skip
            ax.set_xticks(range(len(systems)), systems, rotation=45, ha="right", fontsize=7)
            ax.set_title(f"{name}: {metric}")
            if metric == "auc_1shot" and vals:
                ax.set_ylim(max(0.0, min(vals) - 0.05), min(1.0, max(vals) + 0.05))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
