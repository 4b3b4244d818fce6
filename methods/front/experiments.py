"""`nshot reproduce front`: FRONT against the paper's initialisation baselines.

Per seed, one Ray task trains the ancestry (12-layer ViT on ``ancestry_train``) and a refined
copy (spectral regulariser); then every (setting, system) descendant trains as its own Ray task
from the same ancestry, with the same loop and budget. Settings: depth 4 / width 64 on the
digits (the gated one), depths ``exp_depths``, width 32, the parity task (new head) and 16×16
inputs (position embedding by DCT padding).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nshot.experiment import Job, grid, run_jobs, share
from nshot.method import ResultsTable

from .config import FrontConfig

# system -> config overrides of the descendant
SYSTEMS: dict[str, dict[str, Any]] = {
    "front": {"init": "front"},
    "front_r05": {"init": "front", "keep_ratio": 0.5},
    "front_depthfix": {"init": "front", "depth_fix": True},
    "front_refined": {"init": "front"},  # from the refined ancestry
    "front_more": {"init": "front"},  # control: the refinement's steps with lambda = 0
    "random": {"init": "random"},
    "truncation": {"init": "truncation"},
    "uniform": {"init": "uniform"},
    "weight_selection": {"init": "weight_selection"},
}
METRICS = {
    "acc_init": True,
    "acc_e1": True,
    "acc_final": True,
    "epochs_to_target": False,
    "epochs_censored": False,
    "speedup": True,
    "flops_reduction": True,
}


def main_setting(cfg: FrontConfig) -> str:
    """The gated setting: descendants of the config's depth (``d4`` in small)."""
    return f"d{cfg.depth}"


def settings(cfg: FrontConfig) -> dict[str, dict[str, Any]]:
    """Descendant settings: name -> config overrides (``main_setting`` is among them)."""
    out: dict[str, dict[str, Any]] = {
        f"d{d}": {"depth": d} for d in sorted({*cfg.exp_depths, cfg.depth})
    }
    if cfg.exp_width32:
        out["w32"] = {"width": 32, "heads": min(cfg.heads, 4), "use_ratio": True}
    if cfg.exp_parity:
        out["parity"] = {"task": "parity"}
    if cfg.exp_16px:
        out["px16"] = {"img_size": 16}
    return out


def _ancestry_job(cfg_dict: dict[str, Any], seed: int) -> dict[str, Any]:
    from .train import fit_ancestry, refine_ancestry

    cfg = FrontConfig.validated({**cfg_dict, "refine": False})
    model, record = fit_ancestry(cfg, seed)
    refined, refine = refine_ancestry(cfg, model, seed)
    more, more_info = refine_ancestry(cfg.replace(refine_lambda=0.0), model, seed)
    return {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "refined": {k: v.clone() for k, v in refined.state_dict().items()},
        "more": {k: v.clone() for k, v in more.state_dict().items()},
        "shape": model.shape(),
        "history": record["history"],
        "refine": refine,
        "more_info": more_info,
    }


def _descendant_job(cfg_dict: dict[str, Any], seed: int, source: dict[str, Any]) -> dict[str, Any]:
    """One descendant from an ancestry's weights: ``source`` holds its ``shape`` and one
    state dict (the plain, refined or λ = 0 one)."""
    from nshot.nn.vit import ViT

    from .data import load_split
    from .train import descendant_vit, initialise, train_classifier

    cfg = FrontConfig.validated(cfg_dict)
    source_model = ViT(**source["shape"])
    source_model.load_state_dict(next(v for k, v in source.items() if k != "shape"))
    torch.manual_seed(seed * 1000 + 17)  # the same random init for every system of a seed
    model = descendant_vit(cfg)
    report = initialise(model, source_model, cfg, seed=seed)
    train = load_split("descendant_train", seed, task=cfg.task, img_size=cfg.img_size)
    test = load_split("test", seed, task=cfg.task, img_size=cfg.img_size)
    hist = train_classifier(
        model, train, test, epochs=cfg.epochs, lr=cfg.lr, weight_decay=cfg.weight_decay,
        batch=cfg.batch, seed=seed, warmup_epochs=cfg.warmup,
    )  # fmt: skip
    return {**hist.to_dict(), "transferred": len(report.get("transferred", []))}


def epochs_to(acc: list[float], target: float) -> float:
    """First epoch (1-based) whose accuracy reaches ``target``; NaN if none does."""
    for e, a in enumerate(acc, start=1):
        if a >= target - 1e-9:
            return float(e)
    return math.nan


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per system: means, stds and per-seed values of the table's metrics. The target of a
    seed is the random-init descendant's final accuracy of that seed."""
    targets = [r["acc"][-1] for r in runs["random"]]
    out: dict[str, dict[str, Any]] = {}
    ett_random = [epochs_to(r["acc"], t) for r, t in zip(runs["random"], targets, strict=True)]
    for name, rs in runs.items():
        ett = [epochs_to(r["acc"], t) for r, t in zip(rs, targets, strict=True)]
        vals = {
            "acc_init": [r["acc_init"] for r in rs],
            "acc_e1": [r["acc"][0] for r in rs],
            "acc_final": [r["acc"][-1] for r in rs],
            "epochs_to_target": ett,
            # a seed that never reaches the target counts as one epoch past the run: a lower
            # bound on the epochs the system needs
            "epochs_censored": [
                len(r["acc"]) + 1.0 if math.isnan(e) else e for r, e in zip(rs, ett, strict=True)
            ],
        }
        mean = {k: float(np.mean(v)) for k, v in vals.items()}
        std = {k: float(np.std(v)) for k, v in vals.items()}
        reached = [e for e in ett if not math.isnan(e)]
        mean["reached"] = float(len(reached))
        if len(reached) == len(ett):
            mean["speedup"] = float(np.mean(ett_random) / np.mean(ett))
            mean["flops_reduction"] = 1.0 - 1.0 / mean["speedup"]  # same model and epoch cost
        else:
            mean["speedup"] = mean["flops_reduction"] = math.nan
        mean["curve"] = [float(x) for x in np.mean([r["acc"] for r in rs], axis=0)]
        samples = {k: [float(x) for x in v] for k, v in vals.items()}
        out[name] = {"mean": mean, "std": std, "samples": samples}
    return out


def unit_measurements() -> dict[str, float]:
    """The transfer's unit measurements, with the method's own code: the round-trip error at
    keep ratio 1 and the source's shape, and the depth amplitude ratios of a smooth stack (the
    claims ``roundtrip`` and ``amplitude_*`` read them)."""
    from nshot.nn.vit import ViT

    from .learngene import extract, front_init

    torch.manual_seed(0)
    src = ViT(img_size=8, patch=2, width=32, depth=4, heads=2)
    dst = ViT(img_size=8, patch=2, width=32, depth=4, heads=2)
    front_init(dst, extract(src, keep_ratio=1.0))
    s, d = src.state_dict(), dst.state_dict()
    out = {"roundtrip_max_abs_err": max(float((s[k] - d[k]).abs().max()) for k in s)}
    for lt in (4, 24):
        out[f"amplitude_12to{lt}"] = stack_amplitude_ratio(12, lt, depth_fix=False)
        out[f"amplitude_12to{lt}_fixed"] = stack_amplitude_ratio(12, lt, depth_fix=True)
    return out


def stack_amplitude_ratio(source: int, target: int, *, depth_fix: bool, seed: int = 0) -> float:
    """Mean over target layers of RMS(reconstructed layer) / RMS(source layers) for a smooth
    ``source``-layer stack of standardised 2-D coefficient blocks."""
    from .dct import dct2
    from .learngene import depth_transfer

    g = torch.Generator().manual_seed(seed)
    base, delta = torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g)
    layers = torch.stack([base + (i / source) * delta for i in range(source)]).double()
    layers = (layers - layers.mean()) / layers.std()
    stack = dct2(layers)
    out = depth_transfer(stack, target, fill="zero", depth_fix=depth_fix)
    rms_src = stack.pow(2).mean(dim=(1, 2)).sqrt().mean()
    return float(out.pow(2).mean(dim=(1, 2)).sqrt().mean() / rms_src)


SOURCES = {"front_refined": "refined", "front_more": "more"}  # else the plain ancestry


def _descendant_jobs(cfg: FrontConfig, seeds: list[int], sources: dict) -> list[Job]:
    """One job per (setting, system, seed): a descendant from its seed's ancestry weights."""
    base, sets = cfg.model_dump(), settings(cfg)
    jobs = []
    for sname, system, s in grid(sets, SYSTEMS, seeds):
        d = FrontConfig.validated({**base, **sets[sname], **SYSTEMS[system]}).model_dump()
        src = sources[(s, SOURCES.get(system, "state"))]
        jobs.append(Job((sname, system, s), _descendant_job, (d, s, src), num_cpus=1, trains=True))
    return jobs


def _mean_of(records: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(np.mean([r[k] for r in records])) for k in records[0]}


def run_experiments(cfg: FrontConfig, workdir: Path) -> ResultsTable:
    t0 = time.time()
    workdir.mkdir(parents=True, exist_ok=True)
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    anc_jobs = [
        Job((s,), _ancestry_job, (cfg.model_dump(), s), num_cpus=1, trains=True) for s in seeds
    ]
    anc = {k[0]: a for k, a in run_jobs(anc_jobs, description="front: ancestries").items()}
    sources = {  # each seed's three ancestries, stored once for all its descendants
        (s, src): share({"shape": a["shape"], src: a[src]})
        for s, a in anc.items()
        for src in ("state", "refined", "more")
    }
    done = run_jobs(_descendant_jobs(cfg, seeds, sources), description="front: descendants")
    sets = settings(cfg)
    tables = {
        n: summarise({sys: [done[(n, sys, s)] for s in seeds] for sys in SYSTEMS}) for n in sets
    }
    main_name = main_setting(cfg)
    main = tables[main_name]
    refine = _mean_of([a["refine"] for a in anc.values()])
    more = _mean_of([a["more_info"] for a in anc.values()])
    rows = {s: {m: main[s]["mean"].get(m) for m in METRICS} for s in SYSTEMS}
    stds = {s: {m: main[s]["std"].get(m) for m in METRICS} for s in SYSTEMS}
    samples = {s: main[s]["samples"] for s in SYSTEMS}
    anc_acc = [a["history"]["acc"][-1] for a in anc.values()]
    extra = {
        "settings": {
            n: {s: {k: v for k, v in t[s]["mean"].items() if k != "curve"} for s in SYSTEMS}
            for n, t in tables.items()
        },
        "curves": {n: {s: t[s]["mean"]["curve"] for s in SYSTEMS} for n, t in tables.items()},
        "setting_overrides": sets,
        "ancestry": {
            "acc": anc_acc,
            "acc_mean": float(np.mean(anc_acc)),
            "acc_min": float(np.min(anc_acc)),  # the claim ancestry_trained_every_seed
            "lr": cfg.ancestry_lr(),
            "curve": [float(x) for x in np.mean([a["history"]["acc"] for a in anc.values()], 0)],
            "shape": next(iter(anc.values()))["shape"],
        },
        "refine": refine,
        "refine_lambda0": more,
        "unit": unit_measurements(),
    }
    plot_curves(extra["curves"], workdir / "acc_curves.png")
    return ResultsTable(
        method="front", preset=cfg.preset, seeds=len(seeds), metrics=METRICS, rows=rows,
        stds=stds, samples=samples, runtime_s=time.time() - t0,
        notes=_notes(cfg, seeds, anc_acc, refine, more, tables, sets), extra=extra,
    )  # fmt: skip


def _notes(cfg, seeds, anc_acc, refine, more, tables, sets) -> list[str]:
    notes = [
        f"{len(seeds)} seeds; ancestry ViT depth {cfg.anc_depth} width {cfg.anc_width} trained "
        f"{cfg.anc_epochs} epochs on ancestry_train at lr {cfg.ancestry_lr():.3g} (test acc "
        f"{np.mean(anc_acc):.3f}; per seed {', '.join(f'{a:.3f}' for a in anc_acc)}); rows: "
        f"depth-{cfg.depth} width-{cfg.width} descendants on descendant_train, "
        f"{cfg.epochs} epochs, identical loop and budget; ± over seeds.",
        "target = the random-init descendant's final accuracy (per seed); epochs_to_target is "
        "NaN when a system never reaches it; epochs_censored counts such a seed as epochs + 1 "
        f"({cfg.epochs + 1}: a lower bound on the epochs it needs); flops_reduction = "
        "1 − 1/speedup (same model).",
        "front = faithful FRONT (r = 1.0, zero fill, no depth amplitude fix); front_refined "
        "starts from the ancestry refined with the spectral regulariser "
        f"(high-frequency fraction {refine['hf_fraction_before']:.3f} → "
        f"{refine['hf_fraction_after']:.3f}, ancestry acc {refine['acc_before']:.3f} → "
        f"{refine['acc_after']:.3f}); front_more is its control: the same extra steps with "
        f"λ = 0 (high-frequency fraction → {more['hf_fraction_after']:.3f}, ancestry acc → "
        f"{more['acc_after']:.3f}).",
    ]
    for n, t in tables.items():
        if n == main_setting(cfg):
            continue
        f, r, tr = (t[s]["mean"] for s in ("front", "random", "truncation"))
        notes.append(
            f"setting {n} ({sets[n]}): acc_init front {f['acc_init']:.3f} / random "
            f"{r['acc_init']:.3f} / truncation {tr['acc_init']:.3f}; acc_final "
            f"{f['acc_final']:.3f} / {r['acc_final']:.3f} / {tr['acc_final']:.3f}; "
            f"speedup front {f['speedup']:.2f}, truncation {tr['speedup']:.2f}"
        )
    return notes


def plot_curves(curves: dict[str, dict[str, list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(curves)
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, n in zip(axes.flat, names, strict=False):
        for s, c in curves[n].items():
            ax.plot(range(1, len(c) + 1), c, label=s, lw=2 if s.startswith("front") else 1)
        ax.set_title(f"descendant {n}")
        ax.set_xlabel("epoch")
        ax.set_ylabel("test accuracy")
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
