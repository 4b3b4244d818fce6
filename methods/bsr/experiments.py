"""`nshot reproduce bsr`: BSR against VideoMAE from scratch, its linear probe, spectrum and
Riemannian features, a topomap CNN, the channel-first EEGNet, and the scrambled-positions
negative control.

Every row but EEGNet first chooses its recipe (:data:`RECIPE_GRIDS`: learning rate and layer
decay of a fine-tuned VideoMAE, the inverse L2 strength of a logistic regression, the topomap
CNN's learning rate) by the same validation budget: each of its grid's six candidates is run on
the last ``select_subjects`` source subjects at k = ``select_shots`` on montage A with one
support draw, and the candidate with the highest mean balanced accuracy is kept (ties: the
first in the grid, the config's own recipe). EEGNet keeps its recipe: it is trained on those
subjects' labels, so they cannot validate it. The target subjects are never read for a choice.

The jobs run as Ray tasks: masked pretraining (one task, submitted first), the recipe choice of
each row (one task per row; the pretrained rows wait for the pretraining), and one task per
(system, seed, subject) with its row's chosen recipe (one per (eegnet, seed), which trains
EEGNet on the source subjects and fine-tunes it per subject). Every run of a (seed, subject)
uses the same support draws, so systems are paired. Metrics are balanced accuracy on the query
trials (chance 0.25), averaged over the evaluated target subjects and seeds.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from nshot.experiment import Job, aggregate, fetch, is_planning, run_jobs, submit
from nshot.method import ResultsTable
from nshot.nn.backbone import prepare_backbone

from .baselines import (
    bandpower_frames_lr,
    bandpower_lr,
    eegnet,
    eegnet_source,
    riemann_ts_lr,
    topomap_cnn,
)
from .config import BsrConfig
from .data import load_dataset
from .evaluation import run_videomae
from .train import pretrain, ridge_references, source_clips, split_clips

METRICS = {
    "bacc_k1_A": True,
    "bacc_k5_A": True,
    "bacc_k10_A": True,
    "bacc_k5_B": True,
    "kappa_k5_A": True,
    "drop_A_to_B": False,
    "mae_mse": False,
    "bacc_k5_C": True,
    "drop_A_to_C": False,
}
PRETRAINED = ("bsr", "bsr_linear_probe", "bsr_scrambled_positions")
SETTINGS = ((1, "A"), (5, "A"), (10, "A"), (5, "B"), (5, "C"))


def _settings(cfg: BsrConfig) -> list[tuple[int, str]]:
    return [(k, m) for k, m in SETTINGS if k in cfg.shots] or [(cfg.shots[0], "A")]


def _metrics(per: dict[tuple[int, str], dict]) -> dict[str, float | None]:
    out: dict[str, float | None] = {m: None for m in METRICS}
    for (k, m), s in per.items():
        out[f"bacc_k{k}_{m}"] = s["bacc"]
        if (k, m) == (5, "A"):
            out["kappa_k5_A"] = s["kappa"]
    for m in ("B", "C"):
        if out["bacc_k5_A"] is not None and out[f"bacc_k5_{m}"] is not None:
            out[f"drop_A_to_{m}"] = out["bacc_k5_A"] - out[f"bacc_k5_{m}"]
    return out


#: the systems that train (or fine-tune) a network in their job
NETWORKS = frozenset({"bsr", "bsr_linear_probe", "videomae_scratch", "bsr_scrambled_positions",
                      "topomap_cnn"})  # fmt: skip
VIDEOMAE = ("bsr", "bsr_linear_probe", "videomae_scratch", "bsr_scrambled_positions")

# each row's recipe grid, six candidates each, the config's own recipe first (it wins ties):
# VideoMAE's fine-tuning peak lr (its ViT-S base 5e-4, half and double) with its layer decay
# 0.75 or none; a logistic regression's inverse L2 strength over five decades; the topomap
# CNN's Adam learning rate over 2.5 decades
_FT = tuple(
    {"ft_base_lr": lr, "layer_decay": d} for d in (0.75, 1.0) for lr in (5e-4, 2.5e-4, 1e-3)
)
_C = tuple({"lr_c": c} for c in (1.0, 1e-3, 1e-2, 1e-1, 10.0, 100.0))
_CNN = tuple({"topomap_lr": lr} for lr in (3e-3, 1e-4, 3e-4, 1e-3, 1e-2, 3e-2))
RECIPE_GRIDS: dict[str, tuple[dict[str, float], ...]] = {
    "bsr": _FT, "videomae_scratch": _FT, "bsr_scrambled_positions": _FT,
    "bsr_linear_probe": _C, "bandpower_lr": _C, "bandpower_frames_lr": _C, "riemann_ts_lr": _C,
    "topomap_cnn": _CNN,
}  # fmt: skip


def _one(cfg: BsrConfig, system: str, encoder: dict | None, eeg, labels, k: int, montage: str,
         seed: int) -> dict[str, float]:  # fmt: skip
    """One (subject, k, montage, seed) run of a row (not EEGNet); its query scores."""
    if system in VIDEOMAE:
        return run_videomae(cfg, system, encoder, eeg, labels, k, montage, seed)
    fn = {"bandpower_lr": bandpower_lr, "bandpower_frames_lr": bandpower_frames_lr,
          "riemann_ts_lr": riemann_ts_lr, "topomap_cnn": topomap_cnn}[system]  # fmt: skip
    return fn(cfg, eeg, labels, k, montage, seed)


def _recipe_cfg(cfg: BsrConfig, recipe: dict | None) -> BsrConfig:
    return cfg if not recipe else cfg.replace(**recipe["chosen"])


def _run_subject(cfg_dict: dict, system: str, seed: int, subject: str,
                 pretrained: dict | None = None, recipe: dict | None = None) -> dict:  # fmt: skip
    """Every setting of one (system, seed, target subject): ``pretrained`` is the pretraining
    job's result (the rows on the pretrained encoder), ``recipe`` the row's choice
    (:func:`_select_recipe`; ``None``: the config's recipe)."""
    cfg = _recipe_cfg(BsrConfig.validated(cfg_dict), recipe)
    ds = load_dataset(cfg)
    eeg, labels = ds.subject(subject)
    encoder = None if pretrained is None else pretrained["encoder"]
    per = {(k, m): _one(cfg, system, encoder, eeg, labels, k, m, seed) for k, m in _settings(cfg)}
    return _metrics(per)


def validation_subjects(cfg: BsrConfig, ds) -> list[str]:
    """The source subjects the recipes are chosen on: the last ``select_subjects``."""
    names = ds.names("source")
    return names[len(names) - cfg.select_subjects :]


def _select_recipe(cfg_dict: dict, system: str, pretrained: dict | None = None) -> dict:
    """The row's recipe: each candidate of its grid scored on the validation subjects
    (:func:`validation_subjects`) at k = ``select_shots`` on montage A, one support draw
    (``seed``); the best mean balanced accuracy wins, the first candidate on ties."""
    cfg = BsrConfig.validated(cfg_dict)
    ds = load_dataset(cfg)
    subjects = validation_subjects(cfg, ds)
    encoder = None if pretrained is None else pretrained["encoder"]
    candidates = []
    for recipe in RECIPE_GRIDS[system]:
        c = cfg.replace(**recipe)
        per = [_one(c, system, encoder, *ds.subject(s), cfg.select_shots, "A", cfg.seed)["bacc"]
               for s in subjects]  # fmt: skip
        candidates.append({"recipe": dict(recipe), "val_bacc": float(np.mean(per)),
                           "per_subject": per})  # fmt: skip
    best = max(range(len(candidates)), key=lambda i: (candidates[i]["val_bacc"], -i))
    return {"chosen": candidates[best]["recipe"], "candidates": candidates,
            "subjects": subjects, "k": cfg.select_shots}  # fmt: skip


def _run_eegnet(cfg_dict: dict, seed: int, subjects: list[str]) -> dict[str, dict]:
    cfg = BsrConfig.validated(cfg_dict)
    ds = load_dataset(cfg)
    source = eegnet_source(cfg, ds, seed)
    out = {}
    for subject in subjects:
        eeg, labels = ds.subject(subject)
        out[subject] = _metrics({(k, m): eegnet(cfg, source, eeg, labels, k, m, seed)
                                 for k, m in _settings(cfg)})  # fmt: skip
    return out


def _run_pretrain(cfg_dict: dict) -> dict:
    cfg = BsrConfig.validated(cfg_dict)
    t0 = time.time()
    model, record = pretrain(cfg)
    state = {k: v.detach().clone() for k, v in model.videomae.state_dict().items()}
    return {"encoder": state, "mae_mse": record["mae_mse"], "curve": record["curve"],
            "seconds": time.time() - t0,
            "mae_mse_position_mean": record["mae_mse_position_mean"]}  # fmt: skip


def _run_references(cfg_dict: dict) -> dict:
    cfg = BsrConfig.validated(cfg_dict)
    clips, _, _ = source_clips(cfg, load_dataset(cfg))
    return ridge_references(cfg, clips, *split_clips(cfg, len(clips.powers)))


def run_experiments(cfg: BsrConfig, workdir: Path) -> ResultsTable:
    t0 = time.time()
    if any(s in PRETRAINED for s in cfg.systems) and not is_planning():
        prepare_backbone(cfg.backbone_spec())  # a missing init_weights fails before any task
    ds = load_dataset(cfg)  # built once here, so the tasks read the cache
    subjects = ds.names("target")[: cfg.eval_subjects]
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    base = cfg.model_dump()
    systems = list(cfg.systems)
    need_pretrain = any(s in PRETRAINED for s in systems)
    # the long task first (pretraining); the rows on its encoder wait for it, the others run
    # beside it; each row's recipe choice goes before that row's jobs
    pre = submit(Job(("pretrain",), _run_pretrain, (base,), trains=True)) if need_pretrain else None
    recipes = {}
    if cfg.select_subjects:
        for system in systems:
            if system in RECIPE_GRIDS:
                deps = (pre,) if system in PRETRAINED else ()
                recipes[system] = submit(Job(("recipe", system), _select_recipe,
                                             (base, system, *deps), trains=system in NETWORKS))  # fmt: skip
    jobs = []
    if cfg.mae_references:
        jobs.append(Job(("mae_references",), _run_references, (base,)))
    if "eegnet" in systems:
        jobs += [Job(("eegnet", seed), _run_eegnet, (base, seed, subjects), trains=True)
                 for seed in seeds]  # fmt: skip
    jobs += [Job((system, seed, subj), _run_subject,
                 (base, system, seed, subj, pre if system in PRETRAINED else None,
                  recipes.get(system)), trains=system in NETWORKS)
             for system in systems if system != "eegnet"
             for seed in seeds for subj in subjects]  # fmt: skip
    done = run_jobs(jobs, description=f"bsr {cfg.preset}: pretraining, recipes and rows")
    results: dict[tuple, dict] = {}
    extra: dict[str, Any] = {}
    if need_pretrain:
        pre = fetch(pre)
        extra["pretrain"] = {"mae_mse": pre["mae_mse"], "curve": pre["curve"],
                             "seconds": pre["seconds"],
                             "mae_mse_position_mean": pre["mae_mse_position_mean"]}  # fmt: skip
    if recipes:
        extra["recipes"] = {system: fetch(ref) for system, ref in recipes.items()}
    if cfg.mae_references:
        extra["mae_references"] = done[("mae_references",)]
    for key, res in done.items():
        if key[0] == "eegnet":
            for subj in subjects:
                results[("eegnet", key[1], subj)] = res[subj]
        elif key[0] != "mae_references":
            if key[0] in PRETRAINED:
                res["mae_mse"] = pre["mae_mse"]
            results[key] = res
    order = {s: i for i, s in enumerate(systems)}
    results = dict(sorted(results.items(), key=lambda kv: (order[kv[0][0]], kv[0][1:])))
    rows, stds, samples = aggregate(results)
    notes = [
        "Generated EEG (MNE forward model on a sphere head, 10-20 montages): the result shows "
        "BSR on a physics-based simulator, not on recorded EEG.",
        f"{len(subjects)} target subjects x {len(seeds)} support draws; balanced accuracy on the "
        "query trials (chance 0.25); drop_A_to_B = bacc_k5_A - bacc_k5_B (B: the classic 19, "
        "a subset of A that keeps C3, Cz, C4, O1, O2); drop_A_to_C likewise for montage C (A "
        "without those five electrodes above the class sources).",
        f"Generator version {cfg.generator_version}"
        + (
            " (cue-locked desynchronisation and beta rebound)."
            if cfg.generator_version == 2
            else " (stationary trials)."
        )
        + (
            f" Recipes chosen per row on {cfg.select_subjects} source subjects at "
            f"k = {cfg.select_shots} (extra.recipes); EEGNet keeps its own."
            if cfg.select_subjects
            else " Every row keeps the config's recipe."
        ),
    ]
    return ResultsTable(method="bsr", preset=cfg.preset, seeds=cfg.seeds, metrics=METRICS,
                        rows=rows, stds=stds, samples=samples, runtime_s=time.time() - t0,
                        notes=notes, extra=extra)  # fmt: skip
