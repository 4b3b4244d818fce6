"""``nshot reproduce keystone``: the probe with its controls, calibration and stability on
``cfg.model``, and the keystone-only SFT comparison on ``cfg.sft_model``.

The rows are the masking systems (``full``, ``keystone_off`` and the controls) and the SFT
systems (``sft_base``, ``sft_full``, ``sft_keystone``, ``sft_random_rows``); the probe's collapse
curve, calibration and stability go to ``extra["probe"]`` and a Markdown section. Whether the
paper's claims hold is not decided here: the method's claims (:mod:`.claims`) are evaluated on
the results by ``nshot reproduce`` / ``nshot claims``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nshot.data.lmtext import tiny_sft_task
from nshot.experiment import Job, aggregate, grid, is_planning, run_jobs
from nshot.method import ResultsTable

from .config import KeystoneConfig
from .evaluation import CAPABILITIES, Evaluator, build_evaluator, mean_over
from .model import checkpoint_state, load_model, log
from .neurons import NeuronSpace
from .probe import probe_model

METRICS: dict[str, bool] = {
    "acc": True,
    "ppl": False,
    "collapse_ratio": True,
    **{f"acc_{c}": True for c in CAPABILITIES},
    "n_neurons": False,
    "acc_target": True,
    "acc_others": True,
    "gain": True,
    "forgetting": False,
    "trainable_params": False,
}
SFT_SYSTEMS = ("sft_full", "sft_keystone", "sft_random_rows")
SFT_METRICS = ("acc_target", "acc_others", "gain", "forgetting", "trainable_params", "n_neurons")


# --------------------------------------------------------------------------- SFT comparison


def sft_other_items(model, tok, source: str, cfg: KeystoneConfig) -> dict[str, list]:
    """The capabilities whose loss is "forgetting": for a tiny LM its four synthetic
    capabilities (``sft_eval_items`` each); for a pretrained model the natural suite the probe
    uses, filtered to the items the unablated model answers (first ``sft_eval_items`` of them),
    so its base ``acc_others`` is 1."""
    from .evaluation import tiny_items

    if cfg.suite(source) == "tiny":
        return tiny_items(cfg.sft_eval_items)
    ev, _ = build_evaluator(
        model, tok, source, cfg.replace(eval_items=cfg.sft_eval_items, ppl_texts=0)
    )
    return ev.items


def _sft_evaluators(tok, others: dict[str, list], cfg: KeystoneConfig):
    """``evaluate_after(model)``: the new task's accuracy and the other capabilities'."""
    target_ev = Evaluator(tok, {"target": tiny_sft_task("eval")}, batch_size=cfg.eval_batch)
    others_ev = Evaluator(tok, others, batch_size=cfg.eval_batch)

    def evaluate_after(lm) -> dict[str, float]:
        o = others_ev(lm, ppl=False)
        return {"acc_target": target_ev(lm, ppl=False)["acc"], "acc_others": o["acc"], **o}

    return evaluate_after, others_ev.n_items


def sft_job(
    cfg_dict: dict[str, Any],
    variant: str,
    rows: list[int] | None,
    lr: float,
    seed: int,
    others: dict[str, list],
) -> dict[str, Any]:
    """One SFT run (a job): ``cfg.sft_model`` loaded afresh, fine-tuned (``variant`` ``full``
    or ``rows``: Δ on the neuron ids ``rows``) and evaluated on the new task and ``others``."""
    from .sft import run_variant

    cfg = KeystoneConfig.validated(cfg_dict)
    model, tok = load_model(cfg.sft_model, cfg)
    evaluate_after, _ = _sft_evaluators(tok, others, cfg)
    out = run_variant(
        variant,
        lambda: model,
        tok,
        rows,
        cfg.modules,
        tiny_sft_task("train"),
        steps=cfg.sft_steps,
        batch=cfg.sft_batch,
        lr=lr,
        seed=seed,
        deepspeed_opts=cfg.deepspeed,
        evaluate_after=evaluate_after,
        log_every=cfg.sft_eval_every,
        log=log,
    )
    m = dict(out["metrics"])
    m["trainable_params"] = out["trainable_params"]
    m["n_neurons"] = float(len(rows)) if rows is not None else float("nan")
    m["train_s"] = out["train_s"]
    return {"metrics": m, "delta_state": out.get("delta_state", {})}


def sft_comparison(
    cfg: KeystoneConfig, log=log, probe: tuple | None = None, *, on_ray: bool = False
) -> dict[str, Any]:
    """The SFT comparison on ``cfg.sft_model``: K* of that model, then full FT, keystone-only
    SFT and random-rows SFT (same row count and module histogram) for ``sft_seeds`` seeds each,
    one job per (system, seed): Ray tasks on :func:`nshot.experiment.run_jobs` with
    ``on_ray``, else one after another in this process (no Ray needed).

    ``probe`` = ``(model, tok, space, res)`` of an earlier probe of ``cfg.sft_model`` (its first
    prompt group) is reused instead of probing again."""
    from .probe import module_matched_set

    t0 = time.time()
    source = cfg.sft_model
    if probe is None:
        scfg = cfg.replace(stability_groups=1)
        model, tok, space, _, res = probe_model(
            source, scfg, controls=False, calibration=False, stability=False
        )
    else:
        model, tok, space, res = probe
    gids = [space.gid(k["layer"], k["module"], k["index"]) for k in res.keystones]
    if cfg.sft_keystones:
        gids = gids[: cfg.sft_keystones]
    caps = sft_other_items(model, tok, source, cfg)
    evaluate_after, others_items = _sft_evaluators(tok, caps, cfg)
    log(f"SFT on {source}: {len(gids)} keystone rows; others {others_items}")
    base = evaluate_after(model)
    del model
    log(f"SFT base ({source}): {base}")
    cfg_dict, seeds = cfg.model_dump(), [cfg.seed + i for i in range(cfg.sft_seeds)]
    plan = {
        "sft_full": lambda seed: ("full", None, cfg.sft_lr_full),
        "sft_keystone": lambda seed: ("rows", gids, cfg.sft_lr_keystone),
        "sft_random_rows": lambda seed: (
            "rows",
            module_matched_set(space, gids, np.random.default_rng([seed, 4])),
            cfg.sft_lr_keystone,
        ),
    }
    resources = _job_resources(cfg) if on_ray else {}
    jobs = [
        Job((name, seed), sft_job, (cfg_dict, *plan[name](seed), seed, caps), **resources,
            trains=True)
        for seed, name in grid(seeds, SFT_SYSTEMS)
    ]  # seed-major, the order the runs had in one process  # fmt: skip
    if on_ray:
        done = run_jobs(jobs, description=f"keystone {cfg.preset}: SFT")
    else:
        done = {job.key: job.fn(*job.args) for job in jobs}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SFT_SYSTEMS}
    for (name, seed), out in done.items():
        m = out["metrics"]
        m["gain"] = m["acc_target"] - base["acc_target"]
        m["forgetting"] = base["acc_others"] - m["acc_others"]
        log(f"  {name} seed {seed}: {m}")
        runs[name].append(m)
    first = done.get(("sft_keystone", seeds[0])) if seeds else None
    return {
        "source": source,
        "space": space.describe(),
        "keystones": res.keystones,
        "collapsed": res.collapsed,
        "curve": res.curve,
        "base_probe": res.base,
        "base": base,
        "others_items": others_items,
        "target_items": len(tiny_sft_task("eval")),
        "runs": runs,
        "delta_state": first["delta_state"] if first else {},
        "wall_s": time.time() - t0,
    }


def _job_resources(cfg: KeystoneConfig) -> dict[str, float]:
    """One SFT job: ``torch_threads`` CPUs, and a GPU where the cluster has one and ``device``
    lets a task take it (:func:`nshot.nn.lm.task_gpus`)."""
    import ray

    from nshot.nn.lm import task_gpus
    from nshot.train import ensure_ray

    ensure_ray()
    gpus = task_gpus(cfg.device, ray.cluster_resources().get("GPU", 0))
    return {"num_cpus": float(cfg.torch_threads), "num_gpus": gpus}


# --------------------------------------------------------------------------- the comparison


def run_experiments(
    cfg: KeystoneConfig, workdir: Path, *, method: str, version: str
) -> ResultsTable:
    """The probe on ``cfg.model`` (masking, controls, calibration, stability), then the SFT
    comparison on ``cfg.sft_model`` (its (system, seed) runs as Ray jobs); checkpoints of K*
    (and of the first keystone-SFT seed) are written under ``workdir``."""
    t0 = time.time()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if is_planning():  # a dry run: the SFT grid, without loading a model or probing it
        seeds = [cfg.seed + i for i in range(cfg.sft_seeds)] if cfg.sft else []
        run_jobs([Job((name, seed), sft_job, (), num_cpus=float(cfg.torch_threads), trains=True)
                  for seed, name in grid(seeds, SFT_SYSTEMS)])  # fmt: skip
    model, tok, space, _, res = probe_model(cfg.model, cfg)
    rows, stds, samples = probe_rows(res)
    sft = None
    if cfg.sft:
        same = cfg.sft_model == cfg.model
        sft = sft_comparison(cfg, probe=(model, tok, space, res) if same else None, on_ray=True)
        sft_rows, sft_stds, sft_samples = sft_table(sft)
        rows.update(sft_rows)
        stds.update(sft_stds)
        samples.update(sft_samples)
    write_plots(res, workdir)
    extra: dict[str, Any] = {"probe": probe_extra(cfg, res), "markdown": markdown(res)}
    if sft is not None:
        extra["sft"] = {k: v for k, v in sft.items() if k != "delta_state"}
        if sft["delta_state"]:
            _save_sft_checkpoint(cfg, sft, workdir, method, version)
    _save_probe_checkpoint(cfg, res, space, workdir, method, version)
    return ResultsTable(
        method=method,
        preset=cfg.preset,
        seeds=cfg.sft_seeds if sft else 1,
        metrics=METRICS,
        rows=rows,
        stds=stds,
        runtime_s=time.time() - t0,
        notes=notes(cfg, res, sft, space.total),
        extra=extra,
        samples=samples,
    )


PAIRED_BY_GROUP = ("keystone_off", "norm_off")


def probe_rows(res) -> tuple[dict[str, dict], dict[str, dict], dict[str, dict]]:
    """Rows of the masking systems: mean (± std over the control draws, or over the prompt
    groups for ``keystone_off`` and ``norm_off``) of each metric, the collapse ratio against
    the unablated model and the number of neurons zeroed; and the claims' samples: the
    per-group ``acc`` and ``collapse_ratio`` of ``keystone_off`` and ``norm_off``, paired by
    prompt group (each group's own K*, and as many of the largest-norm neurons)."""
    rows: dict[str, dict[str, float | None]] = {}
    stds: dict[str, dict[str, float | None]] = {}
    samples: dict[str, dict[str, list[float | None]]] = {}
    base_acc = res.base["acc"]
    for name, runs in res.rows.items():
        mean, std = mean_over(runs)
        mean["collapse_ratio"] = mean["acc"] / base_acc if base_acc else float("nan")
        mean.setdefault("n_neurons", float(0 if name == "full" else len(res.keystones)))
        rows[name], stds[name] = mean, std
        if name in PAIRED_BY_GROUP:
            accs = [float(r["acc"]) for r in runs]
            samples[name] = {
                "acc": accs,
                "collapse_ratio": [a / base_acc if base_acc else None for a in accs],
            }
    if len({len(v["acc"]) for v in samples.values()}) > 1:  # not paired: no samples
        samples = {}
    return rows, stds, samples


def sft_table(sft: dict[str, Any]) -> tuple[dict, dict, dict]:
    """``(rows, stds, samples)`` of the SFT systems: ``sft_base`` and the mean over seeds (±
    the Bessel-corrected std, 0 for one seed) of each system, per-seed gain and forgetting as
    the claims' samples (paired by seed)."""
    b = sft["base"]
    per_job = {
        (name, i): {k: r[k] for k in SFT_METRICS}
        for name, runs in sft["runs"].items()
        for i, r in enumerate(runs)
    }
    rows, _, per_seed = aggregate(per_job)
    nan = float("nan")  # a metric a system does not have (n_neurons of full FT): NaN, as before
    rows = {
        name: {k: nan if v is None else v for k, v in per.items()} for name, per in rows.items()
    }
    stds = {
        name: {
            k: float(np.std(np.array(v, dtype=float), ddof=1)) if len(v) > 1 else 0.0
            for k, v in per.items()
        }
        for name, per in per_seed.items()
    }
    rows = {
        "sft_base": {
            "acc_target": b["acc_target"],
            "acc_others": b["acc_others"],
            "gain": 0.0,
            "forgetting": 0.0,
            "trainable_params": 0.0,
        },
        **rows,
    }
    samples = {name: {k: per_seed[name][k] for k in ("gain", "forgetting")} for name in per_seed}
    return rows, stds, samples


def probe_extra(cfg: KeystoneConfig, res) -> dict[str, Any]:
    """``extra["probe"]``: K*, the collapse curve, calibration, stability, items, timings."""
    return {
        "model": cfg.model,
        "space": res.space,
        "keystones": res.keystones,
        "collapsed": res.collapsed,
        "pool_size": res.pool_size,
        "curve": res.curve,
        "calibration": res.calibration,
        "stability": {k: v for k, v in res.stability.items()},
        "items": res.items,
        "timings": res.timings,
        "generated": res.generated,
        "per_draw": res.rows,
    }


def _save_probe_checkpoint(
    cfg: KeystoneConfig, res, space: NeuronSpace, workdir: Path, method: str, version: str
) -> Path:
    from nshot.train.checkpoint import save_checkpoint

    gids = [space.gid(k["layer"], k["module"], k["index"]) for k in res.keystones]
    return save_checkpoint(
        workdir / "checkpoint-probe",
        method=method,
        method_version=version,
        config=cfg.model_dump(),
        step=1,
        model_state=checkpoint_state(space, gids),
        metrics={"n_keystones": len(gids), "collapsed": float(res.collapsed)},
        extra={
            "model_source": cfg.model,
            "space": res.space,
            "keystones": res.keystones,
            "collapsed": res.collapsed,
            "curve": res.curve,
            "base": res.base,
        },
    )


def _save_sft_checkpoint(
    cfg: KeystoneConfig, sft: dict, workdir: Path, method: str, version: str
) -> Path:
    from nshot.train.checkpoint import save_checkpoint

    state = {"keystones": torch.tensor([0], dtype=torch.long)}
    state.update({f"delta.{k}": v for k, v in sft["delta_state"].items()})
    return save_checkpoint(
        workdir / "checkpoint-sft",
        method=method,
        method_version=version,
        config=cfg.replace(model=sft["source"]).model_dump(),
        step=cfg.sft_steps,
        model_state=state,
        metrics=sft["runs"]["sft_keystone"][0] if sft["runs"]["sft_keystone"] else {},
        extra={
            "model_source": sft["source"],
            "space": sft["space"],
            "keystones": sft["keystones"],
            "collapsed": sft["collapsed"],
        },
    )


# --------------------------------------------------------------------------- notes and report


def notes(cfg: KeystoneConfig, res, sft: dict | None, total: int) -> list[str]:
    """What was measured and how (the claims are judged on the rows and ``extra``, not here)."""
    n = len(res.keystones)
    out = [
        f"Probe model {cfg.model}: {total} neurons ({res.space['per_layer']} per layer x "
        f"{res.space['layers']} layers); candidate pool {res.pool_size}; K* = {n} neurons "
        f"({100 * n / total:.3f} %), collapsed={res.collapsed} (collapse: acc <= "
        f"{cfg.collapse_acc} x base or ppl >= {cfg.collapse_ppl} x base).",
        "acc = mean exact match over the 4 capabilities (facts, math, code, multilingual); "
        "items are those the unablated model answers (see extra.probe.items), so full acc is 1 "
        "by construction for the natural suite. ppl = held-out stdlib docstrings.",
        "random_off: uniform random neurons; random_module_off: same module histogram as K*; "
        "random_samelayer_off: same (layer, module) per keystone; norm_off: largest row norms. "
        f"{cfg.control_draws} draws of random_module_off, {cfg.extra_control_draws} of "
        "random_off and random_samelayer_off; ± = std over draws.",
        f"keystone_off and norm_off: mean over {len(res.rows.get('keystone_off', []))} prompt "
        "group(s), each group's own K* and as many of the largest-norm neurons (± std over "
        "groups; the claims' samples are per group, paired); the random controls, the "
        "calibration and the SFT rows use the first group's K*.",
    ]
    base = res.base["acc"]
    if base and "random_module_off" in res.rows:
        rel = {
            name: float(np.mean([abs(m["acc"] - base) / base for m in res.rows[name]]))
            for name in ("random_module_off", "random_off")
        }
        out.append(
            "mean relative change of acc over the control draws: "
            f"random_module_off {rel['random_module_off']:.4g}, "
            f"random_off {rel['random_off']:.4g}."
        )
    if sft is not None:
        out.append(
            f"SFT rows run on {sft['source']} (K* there: {len(sft['keystones'])} neurons, "
            f"collapsed={sft['collapsed']}); {cfg.sft_steps} steps of batch {cfg.sft_batch}, lr "
            f"{cfg.sft_lr_full:g} (full FT) / {cfg.sft_lr_keystone:g} (rows); ± = std over "
            f"{cfg.sft_seeds} seeds; acc_target on {sft['target_items']} held-out add items; "
            f"acc_others = mean exact match on its 4 capabilities ({sft['others_items']} items, "
            "for a pretrained model those it answers before SFT), forgetting = base - after."
        )
    return out


def markdown(res) -> str:
    """The collapse curve, calibration and stability tables of ``results.md``."""
    md = [
        "## Collapse curve (zero the top-N ranked candidates)",
        "",
        "| N | acc | ppl |",
        "|---|---|---|",
    ]
    md += [f"| {int(c['n'])} | {c['acc']:.3f} | {c['ppl']:.4g} |" for c in res.curve]
    if res.calibration:
        md += [
            "",
            "## Calibration (scale outputs by r)",
            "",
            "| r | acc keystone | acc random | ppl keystone | ppl random |",
            "|---|---|---|---|---|",
        ]
        for r, c in res.calibration.items():
            md.append(
                f"| {r} | {c['acc_keystone']:.3f} | {c['acc_random']:.3f} | "
                f"{c['ppl_keystone']:.4g} | {c['ppl_random']:.4g} |"
            )
    if res.stability:
        s = res.stability
        md += [
            "",
            "## Stability (disjoint prompt groups)",
            "",
            f"K* sizes {s['sizes']}; pairwise IoU {s['iou']}; mean {s['iou_mean']:.3f}; "
            f"chance ≈ {s['iou_chance']:.2g}",
        ]
    return "\n".join(md)


def write_plots(res, workdir: Path) -> None:
    """probe.png: the collapse curve and the calibration curves (r = 1 is the unablated model)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = res.base["acc"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    if res.curve:
        ns = [c["n"] for c in res.curve]
        axes[0].plot(ns, [c["acc"] for c in res.curve], "o-", label="top-N zeroed")
        axes[0].axhline(base, color="grey", lw=0.7, ls=":", label="unablated")
        axes[0].set_xscale("log")
        axes[0].minorticks_off()
        axes[0].set_xticks(ns, [str(int(n)) for n in ns], fontsize=7)
        axes[0].set_ylim(0, 1.05 * max(base, 1e-3))
        axes[0].set_xlabel("top-N candidates zeroed")
        axes[0].set_ylabel("mean exact match")
        axes[0].set_title("collapse curve", fontsize=9)
        axes[0].legend(fontsize=7)
    if res.calibration:
        pts = sorted([(float(r), c) for r, c in res.calibration.items()] + [(1.0, None)])
        rs = [r for r, _ in pts]
        for key, style, label in (
            ("acc_keystone", "o-", "keystone"),
            ("acc_random", "s--", "random"),
        ):
            axes[1].plot(rs, [base if c is None else c[key] for _, c in pts], style, label=label)
        axes[1].set_ylim(0, 1.05 * max(base, 1e-3))
        axes[1].set_xlabel("scale r")
        axes[1].set_title("calibration", fontsize=9)
        axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(workdir / "probe.png", dpi=110)
    plt.close(fig)
