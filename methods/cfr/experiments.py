"""`nshot reproduce cfr`: CFR against CFM, its ablations, PatchCore, BTF and a negative control.

One Ray task per (class, k, seed): it extracts the frozen features once, trains the cyclic
mappings with the retriever (the ``cfr`` run, shared by every CFR row, which differ only at
inference) and the one-way CFM mappings, and scores the class's test images with all eight
systems (the bank-only baselines use the banks of the ``cfr`` run: the same k shots, the same
coreset). The rows are means over the classes (± std over seeds); ``extra`` holds the per-class
values, the values per anomaly type (geometric, colour, both) and the fixed-θ sweep.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from nshot.experiment import Job, aggregate, check_gpus, is_planning, run_jobs
from nshot.method import ResultsTable
from nshot.train.trainer import local_device

from .config import CfrConfig
from .evaluation import class_test_features, metrics, score_images
from .metrics import aupro
from .train import fit, shot_features

SYSTEMS = (
    "cfr", "cfr_cyclic_only", "cfr_nn_fallback", "cfm", "patchcore_rgb", "patchcore_3d", "btf",
    "cfr_random_replace",
)  # fmt: skip
METRICS = {
    "i_auroc_k4": True,
    "aupro30_k4": True,
    "aupro10_k4": True,
    "p_auroc_k4": True,
    "i_auroc_k1": True,
    "aupro30_k1": True,
    "replaced_frac_normal": False,  # reported; only its range is checked
    # I-AUROC at k = 4 again (the same mean), with one sample per object class (the class's
    # mean over the seeds) instead of one per seed: the unit the per-class headlines pair over
    "i_auroc_k4_per_class": True,
}
TYPES = ("geometric", "colour", "both")


def _job(cfg_dict: dict[str, Any], cls: str, k: int, seed: int) -> dict[str, Any]:
    t0 = time.time()
    base = CfrConfig.validated({**cfg_dict, "class_name": cls, "shot": k, "seed": seed})
    shots = shot_features(base, device=local_device())  # the GPU the task holds, else the CPU
    feats = class_test_features(base, cls, device=local_device())
    losses: dict[str, list[float]] = {}
    models = {}
    for trained in ("cfr", "cfm"):
        cfg = base.replace(system=trained)
        curve: list[float] = []
        models[trained] = fit(cfg, shots, on_step=lambda s, st, c=curve: c.append(st["loss"]))
        losses[trained] = curve
    theta = None if base.theta_mode == "quantile" else base.theta
    split = feats.split
    out: dict[str, Any] = {"rows": {}, "types": {}, "sweep": {}, "losses": losses}
    for system in SYSTEMS:
        model = models["cfm" if system == "cfm" else "cfr"]
        scores = score_images(model, feats, system, theta, base.infer_seed)
        out["rows"][system] = metrics(scores, split, base.pro_thresholds)
        if system == "cfr":  # the 99-threshold curve on the same maps, against the exact one
            exact = (out["rows"][system]["aupro30"] if base.pro_thresholds is None
                     else aupro(scores["aupro_map"], split.mask, 0.3))  # fmt: skip
            out["aupro30_99_gap"] = abs(exact - aupro(scores["aupro_map"], split.mask, 0.3, 99))
        out["types"][system] = {}
        for kind in _kinds(split.defect):
            keep = np.array([d in ("good", kind) for d in split.defect])
            sub = {key: v[keep] for key, v in scores.items()}
            m = metrics(sub, split.take(np.nonzero(keep)[0]), base.pro_thresholds)
            out["types"][system][kind] = {"i_auroc": m["i_auroc"], "aupro30": m["aupro30"]}
    for t in base.theta_sweep:
        scores = score_images(models["cfr"], feats, "cfr", t, base.infer_seed)
        m = metrics(scores, split, base.pro_thresholds)
        out["sweep"][f"{t:g}"] = {key: m[key] for key in ("aupro30", "i_auroc",
                                                          "replaced_frac_normal")}  # fmt: skip
    out["theta_q"] = float(models["cfr"].theta_q)
    out["seconds"] = time.time() - t0
    return out


def _kinds(defects: list[str]) -> list[str]:
    """The anomaly types of a test set: the generator's three, or the defect folders of real
    data (MVTec 3D-AD: e.g. crack, contamination)."""
    present = sorted(set(defects) - {"good"})
    return [t for t in TYPES if t in present] + [t for t in present if t not in TYPES]


def _mean(vals: list[float]) -> float:
    return float(np.mean(vals))


def run_experiments(cfg: CfrConfig, workdir: Path) -> ResultsTable:
    t0 = time.time()
    planned = is_planning()  # a dry run lists the grid without the user's data
    if not planned and (cfg.features == "paper" or cfg.generator == "mvtec3d"):
        # fail here, not in a Ray task
        from .data import check_inputs
        from .mvtec3d import list_items

        check_inputs(cfg)
        if cfg.generator == "mvtec3d":
            for cls in cfg.classes:
                for split in ("train", "test"):
                    list_items(cfg.data_path or "", cls, split)
    workdir.mkdir(parents=True, exist_ok=True)
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    shots = sorted(set(cfg.shots), reverse=True)  # the larger k first (the longer jobs)
    check_gpus(cfg.job_gpus)
    jobs = [Job((cls, k, seed), _job, (cfg.model_dump(), cls, k, seed), num_gpus=cfg.job_gpus,
                trains=True)
            for k in shots for cls in cfg.classes for seed in seeds]  # fmt: skip
    done = run_jobs(jobs, description=f"cfr {cfg.preset}")
    main_k = 4 if 4 in shots else max(shots)

    per: dict[tuple[str, int], dict[str, float | None]] = {}
    for system in SYSTEMS:
        for seed in seeds:
            vals: dict[str, float | None] = {}
            for k in shots:
                by_cls = [done[(c, k, seed)]["rows"][system] for c in cfg.classes]
                for m in ("i_auroc", "aupro30", "aupro10", "p_auroc"):
                    vals[f"{m}_k{k}"] = _mean([r[m] for r in by_cls])
                if k == main_k:
                    vals["replaced_frac_normal"] = _mean([r["replaced_frac_normal"]
                                                          for r in by_cls])  # fmt: skip
            per[(system, seed)] = {m: vals.get(m) for m in METRICS} | {
                m: v for m, v in vals.items() if m not in METRICS
            }
    rows, stds, samples = aggregate(per)
    if 4 in shots:  # the per-class pairing: each class's I-AUROC at k = 4, mean over the seeds
        for s in SYSTEMS:
            rows[s]["i_auroc_k4_per_class"] = rows[s]["i_auroc_k4"]  # the same grand mean
            stds[s]["i_auroc_k4_per_class"] = stds[s]["i_auroc_k4"]  # ± over seeds, as the rest
            samples[s]["i_auroc_k4_per_class"] = [
                _mean([done[(c, 4, sd)]["rows"][s]["i_auroc"] for sd in seeds]) for c in cfg.classes
            ]
    table_rows = {s: {m: rows[s].get(m) for m in METRICS} for s in SYSTEMS}
    extra: dict[str, Any] = {
        "unit": unit_checks(),
        # the generated data's version (0: real data), the premise of the claims on its structure
        "generator_version": 0 if cfg.generator == "mvtec3d" else cfg.generator_version,
        "shots": shots,
        "main_k": main_k,
        "other_metrics": {
            s: {m: v for m, v in rows[s].items() if m not in METRICS} for s in SYSTEMS
        },  # fmt: skip
        "per_class": {
            f"k{k}": {
                c: {s: _avg_seeds([done[(c, k, sd)]["rows"][s] for sd in seeds]) for s in SYSTEMS}
                for c in cfg.classes
            }
            for k in shots
        },  # fmt: skip
        "per_type": {
            f"k{k}": {
                s: {
                    t: _avg_seeds(
                        [
                            done[(c, k, sd)]["types"][s][t]
                            for c in cfg.classes
                            for sd in seeds
                            if t in done[(c, k, sd)]["types"][s]
                        ]
                    )
                    for t in sorted({t for r in done.values() for t in r["types"][s]})
                }
                for s in SYSTEMS
            }
            for k in shots
        },  # fmt: skip
        "theta_sweep": {
            f"k{k}": {
                t: _avg_seeds([done[(c, k, sd)]["sweep"][t] for c in cfg.classes for sd in seeds])
                for t in done[jobs[0].key]["sweep"]
            }
            for k in shots
        },  # fmt: skip
        # |AUPRO@30 % on 99 thresholds − on the exact curve| of CFR's maps, per class (mean
        # over seeds): what the exact curve (pro_thresholds None) avoids on these maps
        "aupro30_99_vs_exact": {
            f"k{k}": {
                c: _mean([done[(c, k, sd)]["aupro30_99_gap"] for sd in seeds]) for c in cfg.classes
            }
            for k in shots
        },  # fmt: skip
        "theta_q": {
            f"k{k}": {c: _mean([done[(c, k, sd)]["theta_q"] for sd in seeds]) for c in cfg.classes}
            for k in shots
        },  # fmt: skip
        "stage_losses": {
            "/".join(map(str, key)): {s: [round(v, 5) for v in c] for s, c in r["losses"].items()}
            for key, r in done.items()
        },  # fmt: skip
        "job_seconds": {
            "/".join(map(str, key)): round(r["seconds"], 2) for key, r in done.items()
        },  # fmt: skip
    }
    plot(table_rows, extra["theta_sweep"].get(f"k{main_k}", {}), main_k, workdir / "cfr.png")
    return ResultsTable(
        method="cfr", preset=cfg.preset, seeds=len(seeds), metrics=METRICS, rows=table_rows,
        stds={s: {m: stds[s].get(m) for m in METRICS} for s in SYSTEMS},
        samples={s: {m: samples[s].get(m, []) for m in METRICS} for s in SYSTEMS},
        runtime_s=time.time() - t0, notes=_notes(cfg, shots, main_k), extra=extra,
    )  # fmt: skip


def unit_checks() -> dict[str, float]:
    """The AUPRO metric against its analytic value (one 4 × 4 defect in a 10 × 10 image:
    defect scores 8 × 0.8, 8 × 0.4; normal 21 × 0.9, 21 × 0.6, 42 × 0.1; AUPRO@30 % = 1/12),
    on a perfect map, and 99 thresholds against the exact curve on random blobs."""
    from scipy import ndimage

    mask = np.zeros((1, 10, 10), bool)
    mask[0, 2:6, 2:6] = True
    score = np.zeros((1, 10, 10))
    score[mask] = np.r_[np.full(8, 0.8), np.full(8, 0.4)]
    score[~mask] = np.r_[np.full(21, 0.9), np.full(21, 0.6), np.full(42, 0.1)]
    rng = np.random.default_rng(0)
    masks = np.zeros((20, 32, 32), bool)
    for i in range(10):
        r, c = rng.integers(4, 28, 2)
        masks[i, r - 3 : r + 3, c - 2 : c + 3] = True
    maps = ndimage.uniform_filter(rng.normal(size=masks.shape) + 1.5 * masks, (1, 3, 3))
    return {
        "aupro_analytic_abs_err": abs(aupro(score, mask, 0.3) - 1 / 12),
        "aupro_perfect": aupro(mask.astype(float), mask, 0.3),
        "aupro_99_vs_exact": abs(aupro(maps, masks, 0.3) - aupro(maps, masks, 0.3, 99)),
    }


def _avg_seeds(dicts: list[dict[str, float]]) -> dict[str, float]:
    return {key: _mean([d[key] for d in dicts]) for key in dicts[0]}


def _notes(cfg: CfrConfig, shots: list[int], main_k: int) -> list[str]:
    theta = (f"θ = the {cfg.theta_quantile:g} quantile of d on the k shots"
             if cfg.theta_mode == "quantile" else f"θ = {cfg.theta:g}")  # fmt: skip
    data = (f"MVTec 3D-AD from {cfg.data_path} (pre-processing {cfg.preprocess})"
            if cfg.generator == "mvtec3d" else
            f"generated {cfg.generator} objects (generator version "
            f"{cfg.generator_version})")  # fmt: skip
    per_class = ("every test image of each class" if cfg.generator == "mvtec3d" else
                 f"{cfg.n_test_good} normal + {cfg.n_test_bad} anomalous test images")  # fmt: skip
    feats = (f"frozen ViT ({cfg.dino_path}) and Point-MAE ({cfg.pointmae_path})"
             if cfg.features == "paper" else "frozen random extractors")  # fmt: skip
    return [
        f"{data}, {cfg.grid}² grid, classes {', '.join(cfg.classes)}; "
        f"per class {per_class}; "
        f"rows: mean over the classes (± std over {cfg.seeds} seed(s)).",
        f"{feats} (RGB {cfg.rgb_dim}, 3-D {cfg.xyz_dim} channels), stage 1 "
        f"{cfg.map_epochs} epochs, retriever {cfg.ret_epochs} epochs, k ∈ {sorted(shots)}; "
        f"{theta}; AUPRO on "
        f"{'the exact curve' if cfg.pro_thresholds is None else f'{cfg.pro_thresholds} thresholds'}"
        "; replaced_frac_normal at "
        f"k = {main_k}; i_auroc_k4_per_class: i_auroc_k4 with one sample per class (its mean "
        "over the seeds), the unit of the per-class paired tests.",
    ]


def plot(rows: dict[str, dict], sweep: dict[str, dict], k: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    for ax, metric in zip(axes[:2], (f"aupro30_k{k}", f"i_auroc_k{k}"), strict=True):
        systems = [s for s in SYSTEMS if rows[s].get(metric) is not None]
        vals = [rows[s][metric] for s in systems]
        ax.bar(range(len(systems)), vals, color=["C3" if s == "cfr" else "C0" for s in systems])
        ax.set_xticks(range(len(systems)), systems, rotation=45, ha="right", fontsize=7)
        ax.set_title(metric)
        if vals:
            ax.set_ylim(max(0.0, min(vals) - 0.05), min(1.0, max(vals) + 0.05))
    ts = sorted(sweep, key=float)
    ax = axes[2]
    if ts:
        ax.plot([float(t) for t in ts], [sweep[t]["aupro30"] for t in ts], "o-", label="AUPRO@30")
        ax.plot([float(t) for t in ts], [sweep[t]["i_auroc"] for t in ts], "s-", label="I-AUROC")
        ax.legend()
    ax.set_xlabel("fixed θ")
    ax.set_title(f"cfr, k = {k}: θ sweep")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
