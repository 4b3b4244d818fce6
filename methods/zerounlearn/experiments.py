"""``nshot reproduce zerounlearn``: ZeroUnlearn, its ablations and the baselines, per seed.

One job per seed (:func:`seed_job`): every system of the seed runs on the same facts, prompts
and key statistics (:func:`.pipeline.run_systems`), and the ZeroUnlearn edit is saved as a
checkpoint. With more than one seed (and ``parallel_seeds``) the seeds run as Ray tasks on
:func:`nshot.experiment.run_jobs` (one CPU each, and a GPU where the cluster has one and
``device`` lets a task take it), after one task that caches the key statistics they share; a
single seed runs in this process. Rows are means over seeds and ``±`` the Bessel-corrected
standard deviation over seeds. ``samples`` hold what the claims' paired tests pair: for the
forget metrics (``eff``, ``gen``, ``neutral_rate``) one value per forgotten fact, seed after
seed (every system edits the same facts of a seed, so the pairs are (seed, fact) instances);
for ``spe`` and ``ppl`` one value per seed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from nshot.experiment import Job, aggregate, is_planning, run_jobs
from nshot.method import ResultsTable
from nshot.train import ensure_ray

from .config import ZeroUnlearnConfig

METRICS = {"eff": False, "gen": False, "spe": True, "ppl": False, "neutral_rate": True}
#: metrics whose samples are per forgotten fact (the others: per seed)
PER_FACT = ("eff", "gen", "neutral_rate")


def run_experiments(
    cfg: ZeroUnlearnConfig, workdir: Path, *, method: str, version: str
) -> ResultsTable:
    """Every system on ``experiment_seeds`` seeds; checkpoints under ``workdir/runs``."""
    t0 = time.time()
    seeds = [cfg.seed + i for i in range(cfg.experiment_seeds)]
    cfg_dict, where = cfg.model_dump(), str(workdir)
    planned = is_planning()  # a dry run: the seed jobs as they would be submitted
    if planned or (cfg.parallel_seeds and len(seeds) > 1):
        res = {"num_cpus": 1.0, "num_gpus": 0.0}
        if not planned:
            ensure_ray()
            res = seed_job_resources(cfg)
            # the key statistics first (cached on disk), so that the seed jobs do not all
            # compute them
            run_jobs([Job(("stats",), warm_stats, (cfg_dict,), **res)], progress=False)
        # a seed job edits the LM and trains the gradient-ascent baseline on it
        jobs = [Job(("seed", s), seed_job, (cfg_dict, s, where, version), **res, trains=True)
                for s in seeds]  # fmt: skip
        outs = list(run_jobs(jobs, description=f"zerounlearn {cfg.preset}").values())
    else:
        outs = [seed_job(cfg_dict, s, where, version) for s in seeds]
    return results_table(cfg, outs, runtime_s=time.time() - t0, method=method)


def results_table(
    cfg: ZeroUnlearnConfig, outs: list[dict[str, Any]], *, runtime_s: float, method: str
) -> ResultsTable:
    """Means and stds over seeds of every system's metrics. The claims' samples: the forget
    metrics per (seed, forgotten fact) (``instances``, seed after seed), ``spe`` and ``ppl`` per
    seed (in seed order); the per-seed values are also kept in ``per_seed``. Gradient ascent's
    budget per seed is in ``ga_budget``."""
    from .pipeline import SYSTEMS

    per_job = {
        (system, o["seed"]): {m: o["metrics"][system][m] for m in METRICS}
        for system in SYSTEMS
        for o in outs
    }
    rows, stds, samples = aggregate(per_job, spread="sample_std")
    if all("instances" in o for o in outs):
        for system in SYSTEMS:
            for m in PER_FACT:
                samples[system][m] = [v for o in outs for v in o["instances"][system][m]]
    return ResultsTable(
        method=method,
        preset=cfg.preset,
        seeds=len(outs),
        metrics=METRICS,
        rows=rows,
        stds=stds,
        runtime_s=runtime_s,
        notes=_notes(cfg, outs),
        extra={
            "per_seed": [
                {"seed": o["seed"], "metrics": o["metrics"], "timings": o["timings"]} for o in outs
            ],
            "diagnostics": [_jsonable(o["diagnostics"]) for o in outs],
            "setup": [o["setup"] for o in outs],
            "checkpoints": {f"zerounlearn-seed{o['seed']}": o["checkpoint"] for o in outs},
            "ga_budget": ga_budget_summary(cfg, outs),
        },
        samples=samples,
    )


def ga_budget_summary(cfg: ZeroUnlearnConfig, outs: list[dict[str, Any]]) -> dict[str, Any]:
    """Gradient ascent's budget per seed (lr, steps, the held-out facts' Eff and Spe at it) and
    ``forgot_on_validation``: the share of seeds whose chosen budget forgot the held-out facts
    (absent for a fixed budget)."""
    out: dict[str, Any] = {"mode": cfg.ga_budget, "params": cfg.ga_params}
    per_seed = []
    for o in outs:
        ga = o["diagnostics"].get("gradient_ascent") or {}
        b = ga.get("budget")
        row = {"seed": o["seed"], "lr": ga.get("lr"), "steps": ga.get("steps")}
        if b:
            row["forgot_on_validation"] = b["forgot_on_validation"]
            row["runs"] = [
                {k: r[k] for k in ("lr", "steps", "val_eff", "val_spe")} for r in b["runs"]
            ]
            row["val_spe_base"] = b["val_spe_base"]
        per_seed.append(row)
    out["per_seed"] = per_seed
    flags = [r["forgot_on_validation"] for r in per_seed if "forgot_on_validation" in r]
    if flags and len(flags) == len(per_seed):
        out["forgot_on_validation"] = sum(flags) / len(flags)
    return out


def seed_job_resources(cfg: ZeroUnlearnConfig) -> dict[str, float]:
    """Ray resources of one seed job: a CPU, plus a whole GPU when the cluster has GPUs and
    ``device`` lets the task pick one (:func:`nshot.nn.lm.task_gpus`; Ray is running)."""
    import ray

    from nshot.nn.lm import task_gpus

    return {
        "num_cpus": 1.0,
        "num_gpus": task_gpus(cfg.device, ray.cluster_resources().get("GPU", 0)),
    }


def checkpoint_extra(s: Any, result: dict[str, Any]) -> dict[str, Any]:
    """JSON state of a run: model source and fingerprint, seed, context templates, requests.

    The forgotten facts are kept here (``evaluate`` needs them); the predictor's metadata only
    reports how many there are."""
    return {
        "model": s.cfg.model,
        "model_fingerprint": s.fingerprint,
        "seed": s.seed,
        "context_templates": s.templates,
        "neutral_target": s.tok.eos_token,
        "forget": [r.to_json() for r in s.forget],
        "retain": [r.to_json() for r in s.retain],
        "setup": s.info,
        "metrics": result["metrics"],
        "diagnostics": _jsonable(result["diagnostics"]),
    }


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float | int | str | bool) or obj is None:
        return obj
    return str(obj)


def warm_stats(cfg_dict: dict[str, Any]) -> None:
    """Compute (and cache on disk) the key statistics every seed of ``cfg_dict`` uses."""
    from nshot.data.lmtext import general_text

    from .edit import key_statistics
    from .pipeline import load_model

    cfg = ZeroUnlearnConfig.validated(cfg_dict)
    torch.set_num_threads(cfg.torch_threads)
    model, tok = load_model(cfg)
    key_statistics(model, tok, general_text("train"), cfg.edit_layers, cfg.stats_positions)


def seed_job(cfg_dict: dict[str, Any], seed: int, workdir: str, version: str) -> dict[str, Any]:
    """All systems of one seed (a job); saves the ZeroUnlearn edit as a checkpoint."""
    from nshot.train.checkpoint import save_checkpoint

    from .pipeline import run_systems, setup

    cfg = ZeroUnlearnConfig.validated(cfg_dict)
    torch.set_num_threads(cfg.torch_threads)
    t0 = time.time()
    scfg = cfg.replace(seed=seed)
    s = setup(scfg, seed)
    result = run_systems(s)
    path = save_checkpoint(
        Path(workdir) / "runs" / f"zerounlearn-seed{seed}",
        method="zerounlearn",
        method_version=version,
        config=scfg.model_dump(),
        step=1,
        model_state=result["kept"],
        metrics=result["metrics"]["zerounlearn"],
        extra=checkpoint_extra(s, result),
    )
    result["timings"]["total"] = time.time() - t0
    return {
        "seed": seed,
        "metrics": result["metrics"],
        "instances": result["instances"],
        "diagnostics": result["diagnostics"],
        "timings": result["timings"],
        "setup": s.info,
        "checkpoint": str(path),
    }


def _ga_note(cfg: ZeroUnlearnConfig) -> str:
    what = (
        "the down_proj of the last edited layer" if cfg.ga_params == "down_proj" else "all weights"
    )
    if cfg.ga_budget == "fixed":
        return f"gradient_ascent: {what}, {cfg.ga_steps} Adam steps at lr {cfg.ga_lr:g}."
    return (
        f"gradient_ascent: {what}; budget validated per seed on held-out forget-pool facts "
        f"(lrs {', '.join(f'{lr:g}' for lr in cfg.ga_lrs)}, each until Eff <= 10 on them or "
        f"{cfg.ga_max_steps} steps; the held-out retained facts' accuracy picks the lr; "
        "extra.ga_budget)."
    )


def _notes(cfg: ZeroUnlearnConfig, outs: list[dict[str, Any]]) -> list[str]:
    s0 = outs[0]["setup"]
    notes = [
        f"model {cfg.model}; edited layers {cfg.edit_layers}, v_loss_layer {cfg.v_loss_layer}; "
        f"{cfg.n_forget} forgotten facts per seed, {len(outs)} seeds; ± is the std over seeds.",
        f"facts: {s0['known']} of {s0['candidates']} candidates known by the model "
        f"(teacher-forced argmax on the rewrite prompt), relations "
        f"{', '.join(cfg.relations) if not cfg.model.startswith('tiny-') else 'synthetic'}; "
        f"retain pool {s0['retain_pool']}; "
        f"rewrite prompt {cfg.rewrite_prompt}, pools split by {cfg.split}, key statistics "
        f"{'consistent (VKT = W·KKT)' if cfg.consistent_stats else 'as the paper (centred VKT)'}.",
        f"eff/gen/spe/neutral_rate in %, teacher-forced argmax; ppl on {s0['ppl_tokens']} "
        f"held-out docstring tokens ({cfg.ppl_chunks} chunks of ≤ {cfg.ppl_length}).",
        f"key statistics from {s0['stats_positions']} general-text positions; "
        f"{cfg.context_templates} sampled context templates + the bare one; neutral target "
        f"{s0['neutral_target']!r}.",
        f"memit: lam_w {cfg.lam_w:g} x KKT_w; alphaedit: null space of KKT_w (eigenvalues <= "
        f"{cfg.alphaedit_threshold:g}), L2 {cfg.alphaedit_l2:g}; both write ZeroUnlearn's "
        "remapping targets with its keys and residual spreading.",
        _ga_note(cfg),
        "samples: eff/gen/neutral_rate per (seed, forgotten fact); spe/ppl per seed.",
    ]
    return notes
