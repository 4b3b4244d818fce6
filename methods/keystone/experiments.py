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


def sft_comparison(cfg: KeystoneConfig, log=log, probe: tuple | None = None) -> dict[str, Any]:
    """The SFT comparison on ``cfg.sft_model``: K* of that model, then full FT, keystone-only
    SFT and random-rows SFT (same row count and module histogram) for ``sft_seeds`` seeds each.

    ``probe`` = ``(model, tok, space, res)`` of an earlier probe of ``cfg.sft_model`` (its first
    prompt group) is reused instead of probing again."""
    from nshot.data.lmtext import tiny_sft_task

    from .probe import module_matched_set
    from .sft import run_variant

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
    target_ev = Evaluator(tok, {"target": tiny_sft_task("eval")}, batch_size=cfg.eval_batch)
    others_ev = Evaluator(tok, caps, batch_size=cfg.eval_batch)
    log(f"SFT on {source}: {len(gids)} keystone rows; others {others_ev.n_items}")

    def evaluate_after(lm) -> dict[str, float]:
        o = others_ev(lm, ppl=False)
        return {"acc_target": target_ev(lm, ppl=False)["acc"], "acc_others": o["acc"], **o}

    def factory():
        m, _ = load_model(source, cfg)
        return m

    base = evaluate_after(model)
    del model
    log(f"SFT base ({source}): {base}")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SFT_SYSTEMS}
    deltas = {}
    for i in range(cfg.sft_seeds):
        seed = cfg.seed + i
        rand = module_matched_set(space, gids, np.random.default_rng([seed, 4]))
        plan = {
            "sft_full": ("full", None, cfg.sft_lr_full),
            "sft_keystone": ("rows", gids, cfg.sft_lr_keystone),
            "sft_random_rows": ("rows", rand, cfg.sft_lr_keystone),
        }
        for name, (variant, rows, lr) in plan.items():
            log(f"SFT {name} seed {seed}")
            out = run_variant(
                variant,
                factory,
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
            m["gain"] = m["acc_target"] - base["acc_target"]
            m["forgetting"] = base["acc_others"] - m["acc_others"]
            m["trainable_params"] = out["trainable_params"]
            m["n_neurons"] = float(len(rows)) if rows is not None else float("nan")
            m["train_s"] = out["train_s"]
            log(f"  {name}: {m}")
            runs[name].append(m)
            if name == "sft_keystone" and i == 0:
                deltas = out.get("delta_state", {})
    return {
        "source": source,
        "space": space.describe(),
        "keystones": res.keystones,
        "collapsed": res.collapsed,
        "curve": res.curve,
        "base_probe": res.base,
        "base": base,
        "others_items": others_ev.n_items,
        "target_items": len(tiny_sft_task("eval")),
        "runs": runs,
        "delta_state": deltas,
        "wall_s": time.time() - t0,
    }


# --------------------------------------------------------------------------- the comparison


def run_experiments(
    cfg: KeystoneConfig, workdir: Path, *, method: str, version: str
) -> ResultsTable:
    """The probe on ``cfg.model`` (masking, controls, calibration, stability), then the SFT
    comparison on ``cfg.sft_model``; checkpoints of K* (and of the first keystone-SFT seed)
    are written under ``workdir``."""
    t0 = time.time()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model, tok, space, _, res = probe_model(cfg.model, cfg)
    rows: dict[str, dict[str, float | None]] = {}
    stds: dict[str, dict[str, float | None]] = {}
    base_acc = res.base["acc"]
    sizes = {
        "full": 0,
        "keystone_off": len(res.keystones),
        "random_off": len(res.keystones),
        "random_module_off": len(res.keystones),
        "random_samelayer_off": len(res.keystones),
        "norm_off": len(res.keystones),
    }
    for name, runs in res.rows.items():
        mean, std = mean_over(runs)
        mean["collapse_ratio"] = mean["acc"] / base_acc if base_acc else float("nan")
        mean["n_neurons"] = float(sizes.get(name, 0))
        rows[name], stds[name] = mean, std
    sft = None
    samples: dict[str, dict[str, list[float | None]]] = {}
    if cfg.sft:
        same = cfg.sft_model == cfg.model
        sft = sft_comparison(cfg, probe=(model, tok, space, res) if same else None)
        b = sft["base"]
        rows["sft_base"] = {
            "acc_target": b["acc_target"],
            "acc_others": b["acc_others"],
            "gain": 0.0,
            "forgetting": 0.0,
            "trainable_params": 0.0,
        }
        for name, runs in sft["runs"].items():
            mean, std = mean_over([{k: r[k] for k in SFT_METRICS} for r in runs])
            rows[name], stds[name] = mean, std
            # per seed, paired by position across the SFT systems
            samples[name] = {k: [r[k] for r in runs] for k in ("gain", "forgetting")}
    write_plots(res, workdir)
    extra: dict[str, Any] = {
        "probe": {
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
        },
        "markdown": markdown(res),
    }
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
