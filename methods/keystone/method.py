"""Keystone neurons as an nshot Method."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from nshot.method import Method, ResultsTable, register
from nshot.train.checkpoint import LoadedCheckpoint

from .config import KeystoneConfig
from .evaluation import CAPABILITIES, Evaluator, mean_over
from .neurons import NeuronSpace
from .serve import KeystonePredictor

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


def _log(msg: str) -> None:
    import sys

    print(f"[keystone] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- shared pieces


def load_model(source: str, cfg: KeystoneConfig):
    """``(model, tokenizer)`` of ``source`` on ``cfg.device``."""
    from nshot.nn.lm import load_causal_lm, resolve_device

    torch.set_num_threads(cfg.torch_threads)
    return load_causal_lm(
        source, allow_download=cfg.allow_download, device=resolve_device(cfg.device)
    )


def _items_cache_path(source: str, cfg: KeystoneConfig, cands: dict) -> Path:
    from nshot.data.cache import cache_dir

    h = hashlib.sha256(json.dumps([source, cands], sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "keystone" / f"items-{h}.json"


def build_evaluator(model, tok, source: str, cfg: KeystoneConfig) -> tuple[Evaluator, dict]:
    """The capability evaluator of ``source`` (natural suite: filtered by the base model, the
    filtered items cached under ``NSHOT_CACHE/keystone``)."""
    from . import evaluation as E

    ppl = E.ppl_texts(cfg.ppl_texts)

    def factory(items: dict) -> Evaluator:
        return Evaluator(tok, items, ppl, ppl_tokens=cfg.ppl_tokens, batch_size=cfg.eval_batch)

    if cfg.suite(source) == "tiny":
        items = E.tiny_items(cfg.eval_items)
        info = {k: {"items": float(len(v))} for k, v in items.items()}
        return factory(items), info
    cands = E.natural_candidates(cfg.eval_candidates, seed=0)
    path = _items_cache_path(source, cfg, cands)
    if path.is_file():
        stored = json.loads(path.read_text())
        kept = {k: [tuple(x) for x in v] for k, v in stored["kept"].items()}
        info = stored["info"]
    else:
        kept, info = E.filter_items(
            lambda it: Evaluator(tok, it, batch_size=cfg.eval_batch), model, cands, 10_000
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"kept": kept, "info": info}))
    kept = {k: v[: cfg.eval_items] for k, v in kept.items()}
    for k in info:
        info[k]["kept"] = float(len(kept[k]))
    empty = [k for k, v in kept.items() if not v]
    if empty:
        from nshot.method import NshotError

        raise NshotError(
            f"model {source!r} answers none of the {', '.join(empty)} candidates: nothing to "
            "measure a collapse on"
        )
    return factory(kept), info


def probe_model(source: str, cfg: KeystoneConfig, **kwargs: Any):
    """Load ``source``, build its evaluator and run :func:`probe.run_probe`."""
    from .probe import run_probe

    model, tok = load_model(source, cfg)
    space = NeuronSpace(model, cfg.modules)
    _log(f"{source}: {space.describe()}")
    ev, info = build_evaluator(model, tok, source, cfg)
    res = run_probe(model, tok, space, ev, cfg, log=_log, **kwargs)
    res.items = info
    return model, tok, space, ev, res


def checkpoint_state(space: NeuronSpace, gids: list[int], delta=None) -> dict[str, torch.Tensor]:
    state = {"keystones": torch.tensor(gids, dtype=torch.long)}
    if delta is not None:
        state.update({f"delta.{k}": v.detach().cpu() for k, v in delta.state_dict().items()})
    return state


def train_loop(cfg: KeystoneConfig) -> None:
    """Probe ``cfg.model`` (Stages 1–2) and checkpoint K*; with ``train_sft`` also fine-tune the
    keystone rows on the new task and checkpoint the Δ rows (safetensors) with K* (JSON)."""
    from nshot.train import session

    t0 = time.time()
    model, tok, space, ev, res = probe_model(
        cfg.model, cfg, controls=False, calibration=False, stability=False
    )
    gids = [space.gid(k["layer"], k["module"], k["index"]) for k in res.keystones]
    metrics = {
        "n_keystones": float(len(gids)),
        "collapsed": float(res.collapsed),
        "acc_base": res.base["acc"],
        "ppl_base": res.base["ppl"],
        "acc_keystone_off": res.curve[-1]["acc"] if res.curve else res.base["acc"],
        "ppl_keystone_off": res.curve[-1]["ppl"] if res.curve else res.base["ppl"],
    }
    delta = None
    extra: dict[str, Any] = {
        "model_source": cfg.model,
        "space": space.describe(),
        "keystones": res.keystones,
        "collapsed": res.collapsed,
        "curve": res.curve,
        "base": res.base,
    }
    if cfg.train_sft and gids:
        from nshot.data.lmtext import tiny_sft_task

        from .sft import DeltaModel, train

        dm = DeltaModel(model, space, gids)
        hist = train(
            dm,
            list(dm.delta.parameters()),
            tok,
            tiny_sft_task("train"),
            steps=cfg.sft_steps,
            batch=cfg.sft_batch,
            lr=cfg.sft_lr_keystone,
            seed=cfg.seed,
            deepspeed_opts=cfg.deepspeed,
            log=_log,
        )
        target = Evaluator(tok, {"target": tiny_sft_task("eval")}, batch_size=cfg.eval_batch)
        metrics["acc_target"] = target(model, ppl=False)["acc"]
        metrics["trainable_params"] = float(dm.delta.n_params)
        extra["sft"] = hist["history"]
        delta = dm.delta
        dm.remove_hooks()
    metrics["wall_s"] = time.time() - t0
    session.report(
        metrics,
        step=1,
        model=checkpoint_state(space, gids, delta),
        extra=extra,
        checkpoint=True,
    )


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


def sft_comparison(cfg: KeystoneConfig, log=_log, probe: tuple | None = None) -> dict[str, Any]:
    """Check 4 on ``cfg.sft_model``: K* of that model, then full FT, keystone-only SFT and
    random-rows SFT (same row count and module histogram) for ``sft_seeds`` seeds each.

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
    runs: dict[str, list[dict[str, Any]]] = {
        "sft_full": [],
        "sft_keystone": [],
        "sft_random_rows": [],
    }
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


# --------------------------------------------------------------------------- the Method


@register
class KeystoneMethod(Method):
    name = "keystone"
    paper = "Keystone neurons: probing and keystone-only fine-tuning"
    area = "LLM interpretability / sparse fine-tuning"
    version = "1"
    Config = KeystoneConfig

    def data(self, cfg: KeystoneConfig) -> dict[str, pa.Table]:
        """Probe prompts, capability candidates, perplexity texts and the SFT task as tables."""
        from nshot.data.lmtext import tiny_sft_task

        from . import evaluation as E
        from .probe import prompt_groups

        kind = cfg.prompt_kind()
        groups = prompt_groups(kind, cfg.stability_groups)
        cands = (
            E.natural_candidates(cfg.eval_candidates)
            if cfg.suite() == "natural"
            else E.tiny_items()
        )
        rows = [(c, p, a) for c, items in cands.items() for p, a in items]
        return {
            "probe_prompts": pa.table(
                {
                    "group": [g for g, grp in enumerate(groups) for _ in grp],
                    "capability": [
                        c
                        for grp in groups
                        for c in ("general", "math", "code", "multilingual")[: len(grp)]
                    ],
                    "prompt": [p for grp in groups for p in grp],
                }
            ),
            "capabilities": pa.table(
                {
                    "capability": [r[0] for r in rows],
                    "prompt": [r[1] for r in rows],
                    "answer": [r[2] for r in rows],
                }
            ),
            "perplexity": pa.table({"text": E.ppl_texts(cfg.ppl_texts)}),
            "sft_train": pa.table(
                {k: list(v) for k, v in zip(("prompt", "answer"), zip(*tiny_sft_task("train")))}
            ),
            "sft_eval": pa.table(
                {k: list(v) for k, v in zip(("prompt", "answer"), zip(*tiny_sft_task("eval")))}
            ),
        }

    def train_loop(self, cfg: KeystoneConfig) -> None:
        train_loop(cfg)

    def predictor(self, checkpoint: LoadedCheckpoint) -> KeystonePredictor:
        return KeystonePredictor.from_checkpoint(checkpoint)

    def evaluate(self, checkpoint: LoadedCheckpoint, cfg: KeystoneConfig) -> dict[str, float]:
        """Unablated vs keystones zeroed vs a module-matched random set zeroed (and, for an SFT
        checkpoint, the new task's accuracy with the Δ rows)."""
        from .probe import make_evaluate, module_matched_set, zero

        pred = KeystonePredictor.from_checkpoint(checkpoint, device=cfg.device)
        source = pred.source
        ev, _ = build_evaluator(pred.model, pred.tok, source, cfg)
        evaluate = make_evaluate(pred.model, pred.space, ev)
        full = evaluate(None)
        off = evaluate(zero(pred.gids))
        rnd = evaluate(
            zero(module_matched_set(pred.space, pred.gids, np.random.default_rng([cfg.seed, 1])))
        )
        out = {f"{k}": v for k, v in full.items()}
        out.update({f"{k}_keystone_off": v for k, v in off.items()})
        out.update({f"{k}_random_off": v for k, v in rnd.items()})
        out["collapse_ratio"] = off["acc"] / full["acc"] if full["acc"] else float("nan")
        out["n_keystones"] = float(len(pred.gids))
        if pred.delta is not None:
            from nshot.data.lmtext import tiny_sft_task

            from .neurons import NeuronHooks

            target = Evaluator(
                pred.tok, {"target": tiny_sft_task("eval")}, batch_size=cfg.eval_batch
            )
            out["acc_target_base"] = target(pred.model, ppl=False)["acc"]
            with NeuronHooks(pred.space, delta=pred.delta):
                out["acc_target"] = target(pred.model, ppl=False)["acc"]
        return out

    def experiments(self, cfg: KeystoneConfig, workdir: Path) -> ResultsTable:
        """Checks 1–3 on ``cfg.model`` (masking, controls, calibration, stability), check 4 on
        ``cfg.sft_model`` (keystone-only SFT vs full FT vs random rows)."""
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
                keep = [
                    "acc_target",
                    "acc_others",
                    "gain",
                    "forgetting",
                    "trainable_params",
                    "n_neurons",
                ]
                mean, std = mean_over([{k: r[k] for k in keep} for r in runs])
                rows[name], stds[name] = mean, std
        summary = summarize(cfg, res, rows, sft, space.total)
        write_plots(res, workdir)
        extra = {
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
            "checks": summary["checks"],
            "markdown": summary["markdown"],
        }
        if sft is not None:
            extra["sft"] = {k: v for k, v in sft.items() if k != "delta_state"}
            if sft["delta_state"]:
                _save_sft_checkpoint(cfg, sft, workdir)
        _save_probe_checkpoint(cfg, res, space, workdir)
        return ResultsTable(
            method=self.name,
            preset=cfg.preset,
            seeds=cfg.sft_seeds if sft else 1,
            metrics=METRICS,
            rows=rows,
            stds=stds,
            runtime_s=time.time() - t0,
            notes=summary["notes"],
            extra=extra,
        )


def _save_probe_checkpoint(cfg: KeystoneConfig, res, space: NeuronSpace, workdir: Path) -> Path:
    from nshot.train.checkpoint import save_checkpoint

    gids = [space.gid(k["layer"], k["module"], k["index"]) for k in res.keystones]
    return save_checkpoint(
        workdir / "checkpoint-probe",
        method="keystone",
        method_version=KeystoneMethod.version,
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


def _save_sft_checkpoint(cfg: KeystoneConfig, sft: dict, workdir: Path) -> Path:
    from nshot.train.checkpoint import save_checkpoint

    state = {"keystones": torch.tensor([0], dtype=torch.long)}
    state.update({f"delta.{k}": v for k, v in sft["delta_state"].items()})
    return save_checkpoint(
        workdir / "checkpoint-sft",
        method="keystone",
        method_version=KeystoneMethod.version,
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


# --------------------------------------------------------------------------- checks and report


def summarize(cfg: KeystoneConfig, res, rows: dict, sft: dict | None, total: int) -> dict:
    """The spec's checks evaluated on the measurements, notes and a Markdown section."""
    checks: dict[str, Any] = {}
    n = len(res.keystones)
    base = res.base["acc"]
    ko = rows["keystone_off"]
    checks["size_ok"] = n <= 0.005 * total
    checks["collapsed"] = bool(res.collapsed)
    checks["collapse_ratio"] = ko["collapse_ratio"]
    checks["collapse_ok"] = ko["collapse_ratio"] <= 0.20 and checks["size_ok"]
    if "random_off" in rows:
        rel = [abs(m["acc"] - base) / base for m in res.rows["random_module_off"]]
        rel_u = [abs(m["acc"] - base) / base for m in res.rows["random_off"]]
        checks["random_rel_change"] = float(np.mean(rel))
        checks["random_uniform_rel_change"] = float(np.mean(rel_u))
        checks["random_ok"] = checks["random_rel_change"] <= 0.05
    if res.stability:
        checks["iou"] = res.stability["iou_mean"]
        checks["iou_chance"] = res.stability["iou_chance"]
        checks["stability_ok"] = res.stability["iou_mean"] >= 0.5
    if res.calibration:
        ok = True
        for r in ("0.5", "2"):
            c = res.calibration.get(r)
            if c is None:
                continue
            dk, dr = c["calib_drop_keystone"], c["calib_drop_random"]
            checks[f"calib_drop_keystone_r{r}"] = dk
            checks[f"calib_drop_random_r{r}"] = dr
            ok &= dk >= 3 * max(dr, 0.0) and dk > 0
        checks["calibration_ok"] = bool(ok)
    if sft is not None:
        full, ks, rr = rows["sft_full"], rows["sft_keystone"], rows["sft_random_rows"]
        checks["sft_gain_ratio"] = ks["gain"] / full["gain"] if full["gain"] else float("nan")
        checks["sft_gain_ok"] = bool(full["gain"] > 0 and ks["gain"] >= 0.9 * full["gain"])
        checks["sft_forgetting_ok"] = bool(ks["forgetting"] <= full["forgetting"])
        checks["sft_vs_random_ok"] = bool(ks["gain"] > rr["gain"])
    notes = [
        f"Probe model {cfg.model}: {total} neurons ({res.space['per_layer']} per layer x "
        f"{res.space['layers']} layers); candidate pool {res.pool_size}; K* = {n} neurons "
        f"({100 * n / total:.3f} %), collapsed={res.collapsed} (collapse: acc <= "
        f"{cfg.collapse_acc} x base or ppl >= {cfg.collapse_ppl} x base).",
        "acc = mean exact match over the 4 capabilities (facts, math, code, multilingual); "
        "items are those the unablated model answers (see extra.probe.items), so full acc is 1 "
        "by construction for the natural suite. ppl = held-out stdlib docstrings.",
        "random_off: uniform random neurons; random_module_off: same module histogram as K*; "
        "random_samelayer_off: same (layer, module) per keystone; norm_off: largest row norms. "
        f"{cfg.control_draws} draws of random_module_off (the check-1 control), "
        f"{cfg.extra_control_draws} of random_off and random_samelayer_off; ± = std over draws.",
    ]
    for k, v in checks.items():
        notes.append(f"check {k}: {v:.4g}" if isinstance(v, float) else f"check {k}: {v}")
    if sft is not None:
        notes.append(
            f"SFT rows run on {sft['source']} (K* there: {len(sft['keystones'])} neurons, "
            f"collapsed={sft['collapsed']}); {cfg.sft_steps} steps of batch {cfg.sft_batch}, lr "
            f"{cfg.sft_lr_full:g} (full FT) / {cfg.sft_lr_keystone:g} (rows); ± = std over "
            f"{cfg.sft_seeds} seeds; acc_target on {sft['target_items']} held-out add items; "
            f"acc_others = mean exact match on its 4 capabilities ({sft['others_items']} items, "
            "for a pretrained model those it answers before SFT), forgetting = base - after."
        )
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
    return {"checks": checks, "notes": notes, "markdown": "\n".join(md)}


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
