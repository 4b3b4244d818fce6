"""`nshot reproduce dirclip`: UCAT against TeCoA, FARE, its ablations and the original CLIP.

One Ray task per (system, seed): every trained row starts from the same pre-trained CLIP (the
config's backbone: the tiny CLIP, or for ``paper`` the real one at ``clip_path``, on the task's
device), with the same data order and attack seeds, trains ``steps`` steps and keeps the tower
the validation split selects; then all metrics of :mod:`.evaluation` on the test images (and,
on the digits, the rolled digits and MNIST pooled to 8 × 8; on a real CLIP, each zero-shot
image folder of ``eval_paths``: columns ``zs/<dataset>/<metric>`` and ``zs/mean/<metric>``).
APGD-CE runs on ``apgd_images`` test images per seed, a different slice for each seed. The λ
sweep (UCAT at tau ∈ ``sweep_taus``, ``sweep_seeds`` seeds) reports clean and PGD accuracy on
the test images; the sweep point at the config's tau is the ``ucat`` row itself.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nshot.experiment import Job, aggregate, in_process, is_planning, run_jobs
from nshot.method import ResultsTable
from nshot.train.trainer import local_device

from .config import PAPER_TAU, DirclipConfig
from .data import prepare_data, splits_of
from .dirichlet import alpha_train, dirichlet_kl, lambda_of
from .evaluation import evaluate_model
from .model import base_clip, build_model
from .paper_zeroshot import MEAN, PREFIX, eval_sets
from .paper_zeroshot import names as zero_shot_names
from .train import fit_model

# system -> config overrides (None: the original CLIP, not trained)
SYSTEMS: dict[str, dict[str, Any] | None] = {
    "clip": None,
    "tecoa": {"loss": "tecoa"},
    "fare": {"loss": "fare"},
    "ucat": {"loss": "ucat"},
    "ucat_forward_kl": {"loss": "forward_kl"},
    "prob_kl": {"loss": "prob_kl"},
    "ucat_lambda0": {"loss": "ucat", "tau": 0.0, "kl_weight": 0.0},
    # the released code's weighting (λ from tau) on the same backbone, beside the config's own
    "ucat_max_alpha": {"loss": "ucat", "kl_normalisation": "max_alpha"},
}
METRICS = {
    "clean": True,
    "pgd": True,
    "apgd": True,
    "h": True,
    "ece_clean": False,
    "ece_adv": False,
    "ent_ratio": True,
    "clean_rolled": True,
    "pgd_rolled": True,
    "clean_mnist8": True,
}
SHIFTED = ("clean_rolled", "pgd_rolled", "clean_mnist8")  # the digits' shifted domains
UNCERTAINTY = ("au", "eu", "eu_code", "pu", "au_adv", "eu_adv", "eu_code_adv", "pu_adv",
               "ent_wrong_clean", "ent_wrong_adv", "pgd_on_apgd_images")  # fmt: skip


def unit_guards(cfg: DirclipConfig, model, fresh, splits) -> dict[str, float]:
    """After training: the largest absolute change of every frozen weight (g₀, the text tower,
    the text features: all but g) against a freshly built model, and
    KL(Dir(α(g₀)) ‖ Dir(α(g₀))) on the test images (``splits.chunk`` at a time)."""
    diffs = [0.0]
    new, ref = model.state_dict(), fresh.state_dict()
    for k, v in ref.items():
        if not k.startswith(model.trainable_prefixes()):
            diffs.append(float((new[k] - v.to(new[k].device)).abs().max()))
    n = len(splits.y_test)
    kl_max = 0.0
    for i in range(0, n, splits.chunk or max(n, 1)):
        rows = np.arange(i, min(n, i + (splits.chunk or n)))
        x = torch.from_numpy(splits.x_test[rows]).to(next(model.parameters()).device)
        with torch.no_grad():
            a = alpha_train(model.logits(x, original=True), model.scale, cfg.tau_prime)
            kl_max = max(kl_max, float(dirichlet_kl(a, a).abs().max()))
    return {"frozen_max_abs_diff": max(diffs), "kl_self": kl_max}


def _job(cfg_dict: dict[str, Any], system: str, seed: int, index: int, sweep: bool) -> dict:
    t0 = time.time()
    over = SYSTEMS.get(system) or {}
    if sweep:
        field, value = system.split("=", 1)
        over = {"loss": "ucat", ("tau" if field == "tau" else "kl_weight"): float(value)}
    cfg = DirclipConfig.validated({**cfg_dict, **over, "seed": seed})
    base = base_clip(cfg, local_device())  # this task's device (its GPU when it holds one)
    splits = splits_of(cfg, base.image_size)
    torch.manual_seed(seed)
    model = build_model(cfg, base, splits.class_names)
    selected: dict[str, Any] = {}
    curve: list[dict[str, float]] = []  # validation and loss terms along training
    window: list[dict[str, float]] = []

    def on_step(step: int, stats: dict[str, float], best: dict) -> None:
        window.append(stats)
        if "val_h" in stats:
            mean = {k: float(np.mean([w[k] for w in window])) for k in ("ce", "lam_kl", "adv_acc")}
            curve.append({"step": step, **mean,
                          **{k: stats[k] for k in ("val_clean", "val_pgd", "val_h")}})  # fmt: skip
            window.clear()

    if system != "clip":
        model, best = fit_model(cfg, splits, model, on_step=on_step)
        selected = {k: v for k, v in best.items() if k != "state"}
        selected["curve"] = curve
    metrics = evaluate_model(model, splits, cfg, seed, shifts=not sweep, apgd=not sweep,
                             apgd_offset=index * cfg.apgd_images)  # fmt: skip
    extra: dict[str, Any] = {"selected": selected}
    if system == "ucat" and index == 0:
        fresh = build_model(cfg, base, splits.class_names)
        extra["unit"] = unit_guards(cfg, model, fresh, splits)
    sizes = {"train": len(splits.y_train), "test": len(splits.y_test),
             "classes": len(splits.class_names), "shifts": splits.shifts}  # fmt: skip
    return {"metrics": metrics, "extra": extra, "seconds": time.time() - t0, "sizes": sizes}


def run_experiments(cfg: DirclipConfig, workdir: Path) -> ResultsTable:
    from nshot.nn.backbone import prepare_backbone
    from nshot.train.runner import ensure_ray

    t0 = time.time()
    workdir.mkdir(parents=True, exist_ok=True)
    if not is_planning():  # a dry run lists the grid without the weights and images
        prepare_data(cfg)  # a missing CLIP or image folder fails here, before any task
        prepare_backbone(cfg.backbone_spec())  # the tiny CLIP trained and cached once
        if not in_process():
            ensure_ray()
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    sweep_seeds = [cfg.seed + i for i in range(min(cfg.sweep_seeds, cfg.seeds))]
    by_weight = cfg.kl_normalisation == "mean_alpha0"
    field, own = ("w", cfg.kl_weight) if by_weight else ("tau", cfg.tau)
    values = cfg.sweep_kl_weights if by_weight else cfg.sweep_taus
    sweep = [t for t in dict.fromkeys(values) if t != own]
    jobs = []
    for system in [s for s in SYSTEMS if s != "clip"] + ["clip"]:  # trained first
        for i, seed in enumerate(seeds):
            jobs.append(Job((system, seed), _job, (cfg.model_dump(), system, seed, i, False),
                            trains=SYSTEMS[system] is not None))  # fmt: skip
    for tau in sweep:
        for i, seed in enumerate(sweep_seeds):
            key = f"{field}={tau:g}"
            jobs.append(Job((key, seed), _job, (cfg.model_dump(), key, seed, i, True), trains=True))
    done = run_jobs(jobs, description="dirclip")
    per = {(s, seed): done[(s, seed)]["metrics"] for s in SYSTEMS for seed in seeds}
    rows, stds, samples = aggregate(per)
    sizes = done[("clip", seeds[0])]["sizes"]
    metrics = {m: up for m, up in METRICS.items() if sizes["shifts"] or m not in SHIFTED}
    zs = zero_shot_names(cfg)  # every column of the evaluation images, per dataset and mean
    zs_keys = [f"{PREFIX}/{d}/" for d in ([MEAN, *zs] if zs else [])]
    metrics.update({z + m: up for z in zs_keys for m, up in METRICS.items() if m not in SHIFTED})
    lam0 = lambda_of(PAPER_TAU, cfg.tau_prime)
    sweep_rows = {}
    for tau in sorted(set(values)):
        vals = [
            done[("ucat", s)]["metrics"] if tau == own else done[(f"{field}={tau:g}", s)]["metrics"]
            for s in sweep_seeds
        ]
        point: dict[str, Any] = {field: tau}
        if not by_weight:
            point["lambda"] = lambda_of(tau, cfg.tau_prime)
            point["lambda_over_lambda0"] = lambda_of(tau, cfg.tau_prime) / lam0
        sweep_rows[f"{tau:g}"] = {
            **point,
            "clean": float(np.mean([v["clean"] for v in vals])) if vals else None,
            "pgd": float(np.mean([v["pgd"] for v in vals])) if vals else None,
            "ece_adv": _mean([v.get("ece_adv") for v in vals]),
            "seeds": len(vals),
        }
    unc_keys = [*UNCERTAINTY, *(z + k for z in zs_keys for k in UNCERTAINTY)]
    unc = {
        s: {k: _mean([done[(s, seed)]["metrics"].get(k) for seed in seeds]) for k in unc_keys}
        for s in SYSTEMS
    }
    zero_shot = {
        s.name: {"path": str(s.root), "images": len(s.folder.paths), "classes": len(s.class_names)}
        for s in (eval_sets(cfg) if zs else [])
    }
    unit = next((r["extra"]["unit"] for r in done.values() if "unit" in r["extra"]), {})
    extra: dict[str, Any] = {
        "unit": unit,
        "lambda": cfg.lam,
        "lambda0": lam0,
        "lambda_sweep": sweep_rows,
        "uncertainty": unc,
        "selected_step": {
            s: [done[(s, seed)]["extra"]["selected"].get("step") for seed in seeds]
            for s in SYSTEMS
            if s != "clip"
        },  # fmt: skip
        # per validation point (every val_every steps): the window's mean CE, λ·KL and
        # adversarial batch accuracy, and the validation clean / PGD accuracy (first seed)
        "training_curve": {
            s: done[(s, seeds[0])]["extra"]["selected"].get("curve") for s in SYSTEMS if s != "clip"
        },
        # λ·KL over the cross-entropy at the first validation point (mean over the window)
        "kl_to_ce": {
            s: _ratio(done[(s, seeds[0])]["extra"]["selected"].get("curve"))
            for s in SYSTEMS
            if s != "clip"
        },
        "kl_normalisation": cfg.kl_normalisation,
        **({"zero_shot": zero_shot} if zero_shot else {}),
        "job_seconds": {"/".join(map(str, k)): round(v["seconds"], 1) for k, v in done.items()},
    }
    plot(rows, stds, sweep_rows, workdir / "dirclip.png")
    return ResultsTable(
        method="dirclip", preset=cfg.preset, seeds=len(seeds), metrics=metrics, rows=rows,
        stds=stds, samples=samples, runtime_s=time.time() - t0,
        notes=_notes(cfg, lam0, sizes, zero_shot), extra=extra,
    )  # fmt: skip


def _ratio(curve: list[dict[str, float]] | None) -> float | None:
    if not curve or not curve[0].get("ce"):
        return None
    return float(curve[0]["lam_kl"] / curve[0]["ce"])


def _mean(vals) -> float | None:
    v = [float(x) for x in vals if x is not None]
    return float(np.mean(v)) if v else None


def _notes(
    cfg: DirclipConfig, lam0: float, sizes: dict[str, int], zero_shot: dict | None = None
) -> list[str]:
    own = cfg.logit_scale == "backbone"
    scale = "the tiny CLIP's own exp(logit_scale)" if own else f"{cfg.logit_scale:g}"
    step = "ε/4" if cfg.pgd_step is None else f"{cfg.pgd_step:g}"
    if cfg.backbone == "clip":
        backbone, images = f"CLIP {cfg.clip_arch} from {cfg.clip_path}", "evaluation images"
        train = f"{sizes['train']} images of {sizes['classes']} classes"
    else:
        backbone, images = (
            f"tiny CLIP '{cfg.clip_preset}' ({cfg.clip_text} text tower)",
            "test digits",
        )
        train = f"{sizes['train']} digits"
    return [
        f"{backbone} fine-tuned on {train} ({cfg.val_images} held out for selection), "
        f"{cfg.steps} steps of {cfg.batch_size}, {cfg.optimizer} lr {cfg.lr:g}; train attack "
        f"PGD-{cfg.train_attack_steps} (step {cfg.train_attack_step:g}), ε = {cfg.eps:g}; "
        f"logits s · cos with s = {scale}.",
        (
            f"KL weighted by the batch's mean α₀ of g₀: w · Σ KL / Σ α₀ with w = "
            f"{cfg.kl_weight:g}; ucat_max_alpha: the released code's λ = tau / "
            f"exp(softplus(2/τ')) = {cfg.lam:.3g} (tau {cfg.tau:g}); ucat_lambda0: w = 0."
            if cfg.kl_normalisation == "mean_alpha0"
            else f"λ = tau / exp(softplus(2/τ')) = {cfg.lam:.3g} (tau {cfg.tau:g}, τ' "
            f"{cfg.tau_prime:g}; λ₀ = {lam0:.3g} at the paper's tau 1e5); ucat_lambda0: tau 0."
        ),
        f"pgd: PGD-{cfg.pgd_steps} (step {step}) on the {sizes['test']} {images}; apgd: APGD-CE "
        f"{cfg.apgd_steps} on {cfg.apgd_images} {images} per seed (a different slice per "
        "seed); mean over seeds (± std over seeds).",
        *([] if cfg.backbone == "clip" else
          [f"clean_mnist8: {cfg.mnist_images} MNIST images pooled to 8×8 (far shift, reported)."]),
        *([f"zero-shot ({PREFIX}/<dataset>/<metric>): each row's tower on each dataset's own "
           "class prompts (nothing trained on them), the same metrics as on the evaluation "
           "images, on " + ", ".join(f"{n} ({d['images']} images of {d['classes']} classes, "
                                     f"{d['path']})" for n, d in zero_shot.items())
           + f"; {PREFIX}/{MEAN}/<metric>: the mean over the {len(zero_shot)} datasets."]
          if zero_shot else []),
    ]  # fmt: skip


def plot(rows, stds, sweep_rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    systems = list(rows)
    for ax, metrics in zip(axes[:2], (("clean", "pgd", "apgd"), ("ece_clean", "ece_adv")),
                           strict=True):  # fmt: skip
        w = 0.8 / len(metrics)
        for j, m in enumerate(metrics):
            vals = [rows[s].get(m) or 0.0 for s in systems]
            errs = [stds.get(s, {}).get(m) or 0.0 for s in systems]
            ax.bar(np.arange(len(systems)) + j * w, vals, w, yerr=errs, label=m)
        ax.set_xticks(np.arange(len(systems)) + 0.4 - w / 2, systems, rotation=40, ha="right")
        ax.legend(fontsize=8)
    axes[0].set_title("accuracy (clean, PGD, APGD-CE)")
    axes[1].set_title("ECE (15 bins)")
    ax = axes[2]
    key = "w" if any("w" in v for v in sweep_rows.values()) else "lambda_over_lambda0"
    pts = [(v[key], v["pgd"]) for v in sweep_rows.values() if v["pgd"] is not None]
    if pts:
        xs, ys = zip(*sorted(pts), strict=True)
        ax.semilogx([max(x, 1e-3) for x in xs], ys, "o-")
    ax.set_xlabel("kl_weight w (KL ÷ mean α₀ of g₀)" if key == "w" else "λ / λ₀")
    ax.set_ylabel("PGD accuracy")
    ax.set_title("λ sweep (UCAT)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
