"""`nshot reproduce atha`: ATHA against CoOp + LoRA, its ablations and the random-token control.

The backbone is the config's (:meth:`.config.AthaConfig.backbone_spec`): the tiny CLIP from the
cache (:func:`nshot.train.clip.ensure_clip`), pre-trained on first use on ``clip_workers`` Ray
Train workers (two in ``small``: a cold cache's pre-training then uses both cores), or for
``paper`` the real CLIP at ``clip_path`` on image-folder domains (:mod:`.paper_data`). One Ray
task per (seed, domain, shots, block of ``episodes_per_job`` episodes) runs every system on
each episode of its block (an episode's images read once), on the task's device (``job_gpus``
GPUs reserved each; a fraction shares a GPU); every system sees the same episodes
(:func:`.data.sample_episode` depends on the seed, the domain and the episode only) and, within
an episode, the same LoRA initialisation, so the differences are paired.

With one seed, means are over episodes, the spread is the 95 % interval 1.96 · sd / √episodes
and the claims' samples are per episode. With ``seeds`` > 1 (``small``: 3) each training seed
adapts the tiny CLIP of ``clip_seed`` (:func:`.config.clip_seed_for`: by default the one CLIP
pre-trained with seed 0, the paper's one pre-trained CLIP; ``per_seed``: its own) and draws its
own pools, episodes and LoRA initialisations; each seed is summarised as
one seed would be (:func:`summarise`), the rows are the means over seeds, the spread the
standard deviation over seeds (Bessel-corrected) and the samples the per-seed values, paired by
seed (:func:`nshot.experiment.aggregate`); each seed's own table is kept in
``extra["per_seed"]``. ``extra["targets"]`` holds what the target precondition reads
(:func:`target_figures`: chance and zero-shot per domain, CoOp's move off zero-shot).

``experiment=tail_sweep`` (:func:`run_tail_sweep`) runs zero-shot, CoOp + LoRA and the tail push
alone at each fixed rho- of ``sweep_rho_minus`` on ``sweep_episodes`` one-shot episodes per
domain and seed; its samples are the (seed, episode) units, paired across rows.
"""

from __future__ import annotations

import functools
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nshot.experiment import Job, aggregate, check_gpus, is_planning, run_jobs
from nshot.method import ResultsTable
from nshot.nn.backbone import BackboneSpec, CLIPBackbone, load_backbone, prepare_backbone

from .config import AthaConfig, clip_seed_for, sweep_row
from .data import Pool, domain_pool, sample_episode
from .model import EpisodeModel, select_tokens
from .train import domains_of, episode_seed, pool_of, prepare_data, run_block, run_episode

ATHA_VARIANTS = ("atha", "atha_head_only", "atha_tail_only", "random_tokens")


def metrics_of(cfg: AthaConfig) -> dict[str, bool]:
    m = {"acc_1shot_avg": True}
    m.update({f"acc_1shot_{d}": True for d in cfg.domains})
    m.update({"acc_5shot_avg": True, "acc_src_8way": True, "paired_gain_vs_coop_lora": True})
    return m


@functools.cache
def _backbone(spec: str) -> CLIPBackbone:
    """The backbone of a spec (JSON), once per process, on this process's device."""
    from nshot.train.trainer import local_device

    return load_backbone(BackboneSpec.from_dict(json.loads(spec)), local_device())  # type: ignore[return-value]


def episodes_job(
    cfg_dict: dict[str, Any],
    spec: str,
    domain: str,
    shots: int,
    episodes: list[int],
    systems: list[str],
) -> list[dict[str, Any]]:
    """One task: every system on each of ``episodes`` of ``domain`` at ``shots``
    (:func:`.train.run_block`) on this task's device (its GPU when it reserved one)."""
    cfg = AthaConfig.validated(cfg_dict)
    bb = _backbone(spec)
    return run_block(bb, cfg, pool_of(cfg, domain, bb.image_size), shots, episodes, systems)


def _ci(vals: list[float]) -> float:
    n = len(vals)
    return 1.96 * float(np.std(vals, ddof=1)) / math.sqrt(n) if n > 1 else 0.0


def domain_references(bb: CLIPBackbone, cfg: AthaConfig) -> dict[str, dict[str, float]]:
    """Many-shot references per domain, not few-shot results: 5-fold cross-validated logistic
    regression on the whole pool (48 of its 60 images per class train each fold) from (a) the
    frozen tiny CLIP's image embeddings and (b) six grey-level statistics of each 32 × 32 image
    (mean, std, min, max, mean absolute horizontal and vertical difference). They say whether
    a domain's classes are separable in the backbone's features, and in the images at this
    size at all, when labels are plentiful."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    out: dict[str, dict[str, float]] = {}
    for d in cfg.domains:
        pool = domain_pool(d, cfg.pool_per_class, cfg.seed)
        x = torch.from_numpy(pool.images)
        with torch.no_grad():
            emb = torch.cat([bb.encode_image(x[i : i + 256], normalize=True)
                             for i in range(0, len(x), 256)]).cpu().numpy()  # fmt: skip
        g = pool.images.mean(1)
        stats = np.stack([g.mean((1, 2)), g.std((1, 2)), g.min((1, 2)), g.max((1, 2)),
                          np.abs(np.diff(g, axis=2)).mean((1, 2)),
                          np.abs(np.diff(g, axis=1)).mean((1, 2))], 1)  # fmt: skip
        cv = StratifiedKFold(5, shuffle=True, random_state=cfg.seed)
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000))
        out[d] = {
            "classes": len(pool.names),
            "clip_features": float(cross_val_score(clf, emb, pool.labels, cv=cv).mean()),
            "image_statistics": float(cross_val_score(clf, stats, pool.labels, cv=cv).mean()),
        }
    return out


def unit_names(bb: CLIPBackbone, pools: dict[str, Pool]) -> list[str]:
    """The two classes of the unit checks: the tiny CLIP's first two words (word tower) or
    "circle" and "square" (MiniLM tower), a real CLIP's first domain's first two classes."""
    if bb.kind == "tinyclip":
        ccfg = bb.model.cfg
        return list(ccfg.vocab[:2]) if ccfg.text == "word" else ["circle", "square"]
    return list(next(iter(pools.values())).names[:2])


def unit_checks(bb: CLIPBackbone, cfg: AthaConfig, names: list[str]) -> dict[str, float]:
    """The unit checks (claim `unit_checks`) on the backbone of the run: rho = 0 forward against
    CoOp + LoRA (max abs difference of logits), head/tail overlap, anchor reconstruction error
    (relative), and the prompt route with the initial context against the backbone's own text
    features of "a photo of a {name}" (max abs difference)."""
    s = bb.image_size
    x = torch.rand(3, bb.in_chans, s, s, generator=torch.Generator().manual_seed(0))
    a = EpisodeModel(bb, names, cfg, "atha", shots=1, seed=0)
    b = EpisodeModel(bb, names, cfg, "coop_lora", shots=1, seed=0)
    with torch.no_grad():
        a.rho_plus.zero_()
        a.rho_minus.zero_()
        diff = float((a(x) - b(x)).abs().max())
        t, anchor_text = a.text_features()
        anchors = a.anchors(anchor_text)
        norm = bb.image_norm(a.image)
        back = bb.project_image(anchors * norm.weight + norm.bias)
        rel = float(((back - anchor_text).norm(dim=-1) / anchor_text.norm(dim=-1)).max())
        zero = EpisodeModel(bb, names, cfg, "zero_shot", shots=1, seed=0).text_features()[0]
        ref = bb.encode_text([f"{cfg.ctx_init} {n}" for n in names])
        prompt = float((zero - ref).abs().max())
    s_ = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    head, tail = select_tokens(s_, 19, 12)
    overlap = sum(len(set(h.tolist()) & set(t_.tolist())) for h, t_ in zip(head, tail))
    return {
        "rho0_max_abs_logit_diff": diff,
        "head_tail_overlap": float(overlap),
        "anchor_rel_error": rel,
        "prompt_max_abs_diff": prompt,
    }


def _setup(cfg: AthaConfig) -> tuple[list[int], dict, dict, dict, dict, list[str]]:
    """``(seeds, cfgs, specs, backbones, pools, domains)`` of a run: one config, backbone spec
    and (outside a dry run) backbone and pools per training seed."""
    check_gpus(cfg.job_gpus)
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    cfgs = {s: cfg.replace(seed=s) for s in seeds}
    specs = {s: json.dumps(cfgs[s].backbone_spec().to_dict(), sort_keys=True) for s in seeds}
    bbs: dict[int, CLIPBackbone] = {}
    pools: dict[int, dict[str, Pool]] = {}
    if is_planning():  # a dry run lists the grid from the config: no weights, no images read
        domains = domains_of(cfg) if cfg.backbone == "tiny" else (
            list(cfg.data_domains) or ["<each domain folder of data_path>"])  # fmt: skip
    else:
        prepare_data(cfg)  # a missing CLIP or image folder fails here, before any task
        for spec in dict.fromkeys(specs.values()):  # each clip seed's tiny CLIP (one with an
            prepare_backbone(BackboneSpec.from_dict(json.loads(spec)))  # int clip_seed), in turn
        bbs = {s: _backbone(specs[s]) for s in seeds}
        domains = domains_of(cfg)
        pools = {
            s: {d: pool_of(cfgs[s], d, bbs[s].image_size) for d in domains} for s in seeds
        }  # the cached pools built (every image folder checked) once, here
    return seeds, cfgs, specs, bbs, pools, domains


def run_experiments(cfg: AthaConfig, workdir: Path) -> ResultsTable:
    """The experiment ``cfg.experiment`` names: the comparison of the eight systems, or the
    tail sweep (:func:`run_tail_sweep`)."""
    if cfg.experiment == "tail_sweep":
        return run_tail_sweep(cfg, workdir)
    t0 = time.time()
    workdir.mkdir(parents=True, exist_ok=True)
    seeds, cfgs, specs, bbs, pools, domains = _setup(cfg)
    t_data = time.time() - t0
    runs = [(5, cfg.episodes_5shot, list(cfg.systems_5shot))] if cfg.episodes_5shot else []
    runs.append((1, cfg.episodes_1shot, list(cfg.systems)))  # the 5-shot tasks, longer, first
    block = cfg.episodes_per_job
    jobs = [
        Job((seed, d, shots, start), episodes_job,
            (cfgs[seed].model_dump(), specs[seed], d, shots,
             list(range(start, min(n_ep, start + block))), systems),
            num_gpus=cfg.job_gpus, trains=any(s != "zero_shot" for s in systems))
        for shots, n_ep, systems in runs if systems
        for seed in seeds for d in domains for start in range(0, n_ep, block)
    ]  # fmt: skip
    done = run_jobs(jobs, description=f"atha {cfg.preset}")
    tables: dict[int, ResultsTable] = {}
    for seed in seeds:
        acc: dict[tuple[str, str, int], list[float]] = {}
        rates: dict[str, list[dict[str, list[float]]]] = {}
        for (s, d, shots, _), res in done.items():  # the jobs' order: episodes in order
            if s == seed:
                for r in res:
                    acc.setdefault((r["system"], d, shots), []).append(r["acc"])
                    rates.setdefault(r["system"], []).append(r["rates"])
        bb = bbs[seed]
        meta = _tiny_meta(bb)
        zero_shot = meta.get("zero_shot", {})
        run_cfg = cfgs[seed].model_copy(update={"domains": domains})
        classes = {d: len(pools[seed][d].names) for d in domains}
        table = summarise(run_cfg, acc, zero_shot.get("acc_src_8way"), classes)
        extra = table.extra
        extra["unit"] = unit_checks(bb, cfgs[seed], unit_names(bb, pools[seed]))
        if cfg.backbone == "tiny":  # the generated pools, whole: many-shot references
            extra["domain_references"] = domain_references(bb, cfgs[seed])
        extra["rates_per_block"] = {
            s: {k: np.mean([r[k] for r in rates[s]], 0).round(4).tolist() for k in ("head", "tail")}
            for s in ATHA_VARIANTS
            if s in rates
        }
        if cfg.backbone == "tiny":
            extra["tiny_clip"] = {
                "folder": bb.folder.name,
                "clip_seed": clip_seed_for(cfgs[seed]),
                "text": cfg.text,
                "world_size": meta.get("world_size"),
                "zero_shot": zero_shot,
                "pretrain_wall_s": meta.get("wall_s"),
            }
        else:
            extra["clip"] = {"path": str(cfg.clip_path), "arch": cfg.clip_arch, "domains": domains}
            table.notes.append(f"backbone: CLIP {cfg.clip_arch} from {cfg.clip_path}; "
                               f"domains {domains}")  # fmt: skip
        tables[seed] = table
    table = tables[seeds[0]] if len(seeds) == 1 else combine_seeds(cfg, tables)
    extra = table.extra
    extra["sizes"] = {
        "episodes_1shot": cfg.episodes_1shot,
        "episodes_5shot": cfg.episodes_5shot,
        "epochs": cfg.epochs,
        "n_way": cfg.n_way,
        "queries_per_class": cfg.queries,
        "domains": domains,
        "systems_5shot": list(cfg.systems_5shot),
        "seeds": seeds,
    }
    extra["seconds"] = {"data": round(t_data, 1), "total": round(time.time() - t0, 1)}
    table.runtime_s = time.time() - t0
    return table


def _tiny_meta(bb: CLIPBackbone) -> dict[str, Any]:
    """The tiny CLIP's cache record (``clip.json``: pre-training and zero-shot report)."""
    folder = getattr(bb, "folder", None)
    if folder is None:
        return {}
    from nshot.nn.clip import read_clip_meta

    return read_clip_meta(folder)


def combine_seeds(cfg: AthaConfig, tables: dict[int, ResultsTable]) -> ResultsTable:
    """One table over training seeds from each seed's own (:func:`summarise`): rows are means
    over seeds, ``stds`` the Bessel-corrected standard deviation over seeds and ``samples`` the
    per-seed value of every metric, paired by seed; the derived figures the claims read
    (``extra["headline"]``, ``extra["sanity"]``) are recomputed from the means, the unit checks
    are the worst over seeds, and each seed's table is kept in ``extra["per_seed"]``."""
    seeds = list(tables)
    per = {(s, seed): tables[seed].rows[s] for s in cfg.systems for seed in seeds}
    rows, stds, samples = aggregate(per, spread="sample_std")
    first = tables[seeds[0]].extra

    def mean_of(values: list[Any]) -> Any:
        """The element-wise mean of numbers or of dicts of numbers (or lists of numbers)."""
        if isinstance(values[0], dict):
            return {k: mean_of([v[k] for v in values]) for k in values[0]}
        if isinstance(values[0], list):
            return np.mean(values, 0).round(4).tolist()
        return float(np.mean(values))

    acc5 = mean_of([tables[s].extra["acc_5shot"] for s in seeds]) if first["acc_5shot"] else {}
    extra: dict[str, Any] = {"acc_5shot": acc5}
    if "headline" in first:
        extra["headline"] = {
            "domains_atha_ge_coop_lora": sum(
                rows["atha"][f"acc_1shot_{d}"] >= rows["coop_lora"][f"acc_1shot_{d}"]
                for d in cfg.domains
            ),
            "domains": len(cfg.domains),
        }
    if "sanity" in first:
        paired = mean_of([tables[s].extra["sanity"]["paired_5shot_minus_1shot"] for s in seeds])
        extra["sanity"] = {
            "min_5shot_minus_1shot": float(
                min(acc5[s][d] - rows[s][f"acc_1shot_{d}"] for s in acc5 for d in cfg.domains)
            ),
            "paired_5shot_minus_1shot": paired,
            "paired_min_5shot_minus_1shot": min(v for r in paired.values() for v in r.values()),
        }
    if "targets" in first:  # zero-shot from the means over seeds; CoOp's move, mean over seeds
        moves = [tables[s].extra["targets"].get("coop_abs_change") for s in seeds]
        extra["targets"] = target_figures(
            cfg,
            {d: rows["zero_shot"][f"acc_1shot_{d}"] for d in cfg.domains},  # type: ignore[misc]
            first["targets"]["ways"],
            mean_of(moves) if all(m is not None for m in moves) else None,
        )
    extra["unit"] = {
        k: max(tables[s].extra["unit"][k] for s in seeds) for k in first["unit"]
    }  # the worst seed
    extra["domain_references"] = mean_of([tables[s].extra["domain_references"] for s in seeds])
    extra["rates_per_block"] = mean_of([tables[s].extra["rates_per_block"] for s in seeds])
    extra["tiny_clip"] = first["tiny_clip"]
    extra["per_seed"] = {
        str(s): {"rows": tables[s].rows, "stds": tables[s].stds, "extra": tables[s].extra}
        for s in seeds
    }
    clip = (
        "each pre-trains its own tiny CLIP (clip_seed=per_seed)"
        if cfg.clip_seed == "per_seed"
        else f"each adapts the one tiny CLIP pre-trained with seed {cfg.clip_seed} (clip_seed)"
    )
    notes = [
        *tables[seeds[0]].notes[:1],
        f"{len(seeds)} training seeds ({', '.join(map(str, seeds))}): {clip}"
        " and draws its own pools, episodes and LoRA initialisations; rows are means "
        "over seeds, ± the standard deviation over seeds (Bessel), and the claims' samples the "
        "per-seed values (a seed's mean over its episodes), paired by seed; each seed's own "
        "table (± 95 % intervals over its episodes) is in extra.per_seed",
        "paired_gain_vs_coop_lora in points; acc_src_8way: each seed's tiny CLIP's zero-shot "
        "8-way shape accuracy (the same on every row of a seed), mean over seeds",
    ]
    return ResultsTable(
        method="atha",
        preset=cfg.preset,
        seeds=len(seeds),
        metrics=metrics_of(cfg),
        rows=rows,
        stds=stds,
        samples=samples,
        notes=notes,
        extra=extra,
    )


def ways_of(cfg: AthaConfig, classes: dict[str, int] | None = None) -> dict[str, int]:
    """The ways of each domain's episodes: ``n_way``, or fewer where a domain has fewer
    classes (``classes``: each domain's; default: the generated domains')."""
    if classes is None:
        from .data import class_names

        classes = {d: len(class_names(d)) for d in cfg.domains}
    return {d: min(cfg.n_way, classes[d]) for d in cfg.domains}


def target_figures(
    cfg: AthaConfig,
    zero_shot: dict[str, float],
    ways: dict[str, int],
    coop_abs_change: dict[str, float] | None = None,
) -> dict[str, Any]:
    """What the claim ``targets_between_chance_and_ceiling`` reads: each domain's ways, chance
    (one over the ways) and zero-shot 1-shot accuracy, the smallest margin of zero-shot over
    chance and the largest zero-shot accuracy over the domains, and (with a ``coop`` row) how
    far CoOp's learned context moves the zero-shot answers: the mean over episodes of
    |acc(CoOp) - acc(zero-shot)| per domain, and its mean over the domains."""
    chance = {d: 1.0 / ways[d] for d in cfg.domains}
    out: dict[str, Any] = {
        "ways": dict(ways),
        "chance": chance,
        "zero_shot": dict(zero_shot),
        "min_zero_shot_above_chance": float(min(zero_shot[d] - chance[d] for d in cfg.domains)),
        "max_zero_shot": float(max(zero_shot[d] for d in cfg.domains)),
    }
    if coop_abs_change is not None:
        out["coop_abs_change"] = dict(coop_abs_change)
        out["coop_mean_abs_change"] = float(np.mean([coop_abs_change[d] for d in cfg.domains]))
    return out


def summarise(
    cfg: AthaConfig,
    acc: dict[tuple[str, str, int], list[float]],
    acc_src: float | None,
    classes: dict[str, int] | None = None,
) -> ResultsTable:
    """Rows, 95 % intervals, paired samples and the derived counts of the claims (``classes``:
    each domain's number of classes, for chance; default: the generated domains')."""
    metrics = metrics_of(cfg)
    rows: dict[str, dict[str, float | None]] = {}
    stds: dict[str, dict[str, float | None]] = {}
    samples: dict[str, dict[str, list[float | None]]] = {}
    base = "coop_lora" if "coop_lora" in cfg.systems else None
    ci_domain: dict[str, dict[str, float]] = {}
    acc5: dict[str, dict[str, float]] = {}
    for s in cfg.systems:
        r: dict[str, float | None] = {}
        sd: dict[str, float | None] = {}
        per_ep = np.mean([acc[(s, d, 1)] for d in cfg.domains], axis=0)  # [episodes]
        for d in cfg.domains:
            v = acc[(s, d, 1)]
            r[f"acc_1shot_{d}"] = float(np.mean(v))
            sd[f"acc_1shot_{d}"] = _ci(v)
        r["acc_1shot_avg"] = float(np.mean(per_ep))
        sd["acc_1shot_avg"] = _ci(per_ep.tolist())
        if s in cfg.systems_5shot and cfg.episodes_5shot:
            per5 = np.mean([acc[(s, d, 5)] for d in cfg.domains], axis=0)
            r["acc_5shot_avg"] = float(np.mean(per5))
            sd["acc_5shot_avg"] = _ci(per5.tolist())
            acc5[s] = {d: float(np.mean(acc[(s, d, 5)])) for d in cfg.domains}
        else:
            r["acc_5shot_avg"] = sd["acc_5shot_avg"] = None
        r["acc_src_8way"] = acc_src
        sd["acc_src_8way"] = None
        if base is not None:
            diff = per_ep - np.mean([acc[(base, d, 1)] for d in cfg.domains], axis=0)
            r["paired_gain_vs_coop_lora"] = float(100 * diff.mean())
            sd["paired_gain_vs_coop_lora"] = 100 * _ci(diff.tolist())
        else:
            r["paired_gain_vs_coop_lora"] = sd["paired_gain_vs_coop_lora"] = None
        rows[s], stds[s] = r, sd
        samples[s] = {"acc_1shot_avg": [float(v) for v in per_ep]}
        ci_domain[s] = {d: round(_ci(acc[(s, d, 1)]), 4) for d in cfg.domains}
    extra: dict[str, Any] = {"ci95_1shot": ci_domain, "acc_5shot": acc5}
    if "zero_shot" in rows:
        zs = {d: float(np.mean(acc[("zero_shot", d, 1)])) for d in cfg.domains}
        moved = (
            {d: float(np.mean(np.abs(np.subtract(acc[("coop", d, 1)], acc[("zero_shot", d, 1)]))))
             for d in cfg.domains}
            if "coop" in rows else None
        )  # fmt: skip
        extra["targets"] = target_figures(cfg, zs, ways_of(cfg, classes), moved)
    if "atha" in rows and base is not None:
        extra["headline"] = {
            "domains_atha_ge_coop_lora": sum(
                rows["atha"][f"acc_1shot_{d}"] >= rows[base][f"acc_1shot_{d}"] for d in cfg.domains
            ),
            "domains": len(cfg.domains),
        }
    gaps = [
        acc5[s][d] - rows[s][f"acc_1shot_{d}"]  # type: ignore[operator]
        for s in acc5
        for d in cfg.domains
    ]
    if gaps:
        # the claim's figure compares every 5-shot episode with every 1-shot one; the paired
        # figure (a diagnostic) compares episode i at 5 shots with episode i at 1 shot only
        paired = {
            s: {
                d: float(
                    np.mean(np.subtract(acc[(s, d, 5)], acc[(s, d, 1)][: len(acc[(s, d, 5)])]))
                )
                for d in cfg.domains
            }
            for s in acc5
        }
        extra["sanity"] = {
            "min_5shot_minus_1shot": float(min(gaps)),
            "paired_5shot_minus_1shot": paired,
            "paired_min_5shot_minus_1shot": min(v for row in paired.values() for v in row.values()),
        }
    notes = [
        f"{cfg.n_way}-way episodes (at most as many as a domain has classes: textile 3), "
        f"{cfg.queries} queries per class, {cfg.epochs} epochs; "
        f"1-shot: {cfg.episodes_1shot} episodes per domain for every system; 5-shot: "
        f"{cfg.episodes_5shot} for {', '.join(cfg.systems_5shot)} (null for the others)",
        "spread: 95 % interval over episodes (1.96 sd / sqrt(n)); paired_gain_vs_coop_lora in "
        "points, over the same episodes",
        "acc_src_8way: the shared tiny CLIP's zero-shot 8-way shape accuracy (same on every row)",
    ]
    return ResultsTable(
        method="atha",
        preset=cfg.preset,
        seeds=1,
        metrics=metrics,
        rows=rows,
        stds=stds,
        samples=samples,
        notes=notes,
        extra=extra,
    )


# --------------------------------------------------------------------------------------------
# experiment=tail_sweep: the tail push alone at fixed sizes against CoOp + LoRA


def sweep_rows(cfg: AthaConfig) -> list[str]:
    """The rows of the tail sweep: zero-shot, CoOp + LoRA and one per fixed rho-."""
    return ["zero_shot", "coop_lora", *(sweep_row(v) for v in cfg.sweep_rho_minus)]


def run_sweep_block(
    bb: CLIPBackbone, cfg: AthaConfig, pool: Pool, episodes: list[int]
) -> list[dict[str, Any]]:
    """Each of ``episodes`` of ``pool`` at one shot (an episode's images read once): zero-shot,
    CoOp + LoRA and ``tail_fixed`` at every rho- of ``sweep_rho_minus``, all from the same
    LoRA initialisation (:func:`.train.episode_seed`): ``[{"row", "episode", "acc", "rates"}]``."""
    out: list[dict[str, Any]] = []
    tails = [(sweep_row(v), cfg.replace(rho_minus_init=v)) for v in cfg.sweep_rho_minus]
    for e in episodes:
        ep = sample_episode(pool, seed=cfg.seed, episode=e, n_way=cfg.n_way, shots=1,
                            queries=cfg.queries)  # fmt: skip
        seed = episode_seed(cfg, pool, e)
        runs = [("zero_shot", "zero_shot", cfg), ("coop_lora", "coop_lora", cfg)]
        runs += [(row, "tail_fixed", c) for row, c in tails]
        for row, system, c in runs:
            r = run_episode(bb, ep, c, system, shots=1, seed=seed)
            out.append({"row": row, "episode": e, "acc": r["acc"], "rates": r["rates"]})
    return out


def sweep_job(
    cfg_dict: dict[str, Any], spec: str, domain: str, episodes: list[int]
) -> list[dict[str, Any]]:
    """One task of the tail sweep: :func:`run_sweep_block` on this task's device."""
    cfg = AthaConfig.validated(cfg_dict)
    bb = _backbone(spec)
    return run_sweep_block(bb, cfg, pool_of(cfg, domain, bb.image_size), episodes)


def summarise_sweep(
    cfg: AthaConfig,
    acc: dict[tuple[str, int, str], list[float]],
    acc_src: dict[int, float | None],
    ways: dict[str, int],
) -> ResultsTable:
    """The tail sweep's table from ``acc[(row, seed, domain)]`` (accuracy per episode, in
    order): the paired unit is one (seed, episode) pair, its value the episode's accuracy
    averaged over the domains; rows are means over the units, spreads their 95 % interval
    (1.96 sd / sqrt(n)), samples the units in (seed, episode) order, paired across rows."""
    rows_names = sweep_rows(cfg)
    seeds = sorted({s for _, s, _ in acc})
    domains = list(cfg.domains)
    units = {
        r: np.concatenate([np.mean([acc[(r, s, d)] for d in domains], axis=0) for s in seeds])
        for r in rows_names
    }
    src = [v for v in acc_src.values() if v is not None]
    rows: dict[str, dict[str, float | None]] = {}
    stds: dict[str, dict[str, float | None]] = {}
    samples: dict[str, dict[str, list[float | None]]] = {}
    gains: dict[str, dict[str, float]] = {}
    for r in rows_names:
        row: dict[str, float | None] = {}
        sd: dict[str, float | None] = {}
        for d in domains:
            v = np.concatenate([acc[(r, s, d)] for s in seeds])
            row[f"acc_1shot_{d}"] = float(v.mean())
            sd[f"acc_1shot_{d}"] = _ci(v.tolist())
        row["acc_1shot_avg"] = float(units[r].mean())
        sd["acc_1shot_avg"] = _ci(units[r].tolist())
        diff = units[r] - units["coop_lora"]
        row["paired_gain_vs_coop_lora"] = float(100 * diff.mean())
        sd["paired_gain_vs_coop_lora"] = 100 * _ci(diff.tolist())
        row["acc_src_8way"] = float(np.mean(src)) if src else None
        sd["acc_src_8way"] = None
        rows[r], stds[r] = row, sd
        samples[r] = {"acc_1shot_avg": [float(x) for x in units[r]]}
        gains[r] = {
            d: float(100 * np.mean(np.subtract(
                np.concatenate([acc[(r, s, d)] for s in seeds]),
                np.concatenate([acc[("coop_lora", s, d)] for s in seeds]))))
            for d in domains
        }  # fmt: skip
    zs = {d: rows["zero_shot"][f"acc_1shot_{d}"] for d in domains}
    extra: dict[str, Any] = {
        "targets": target_figures(cfg, zs, ways),  # type: ignore[arg-type]
        "paired_gain_per_domain": gains,
        "rho_minus": {sweep_row(v): v for v in cfg.sweep_rho_minus},
        "per_seed": {
            str(s): {r: {d: float(np.mean(acc[(r, s, d)])) for d in domains} for r in rows_names}
            for s in seeds
        },
    }
    metrics = {"acc_1shot_avg": True, **{f"acc_1shot_{d}": True for d in domains},
               "acc_src_8way": True, "paired_gain_vs_coop_lora": True}  # fmt: skip
    notes = [
        f"tail sweep: the tail push alone (rho+ = 0) at a fixed rho- of block {cfg.rho_block} "
        f"({', '.join(f'{v:g}' for v in cfg.sweep_rho_minus)}; not learned) against CoOp + "
        f"LoRA and zero-shot; {cfg.sweep_episodes} one-shot {cfg.n_way}-way episodes per "
        f"domain and training seed, {cfg.queries} queries per class, {cfg.epochs} epochs, "
        "every row from the same LoRA initialisation per episode",
        f"paired unit: one (training seed, episode) pair ({len(seeds)} x {cfg.sweep_episodes} "
        "= the samples), its accuracy averaged over the domains; spread: 95 % interval over the "
        "units (1.96 sd / sqrt(n)); paired_gain_vs_coop_lora in points",
    ]
    return ResultsTable(
        method="atha",
        preset=cfg.preset,
        seeds=len(seeds),
        metrics=metrics,
        rows=rows,
        stds=stds,
        samples=samples,
        notes=notes,
        extra=extra,
        experiment="tail_sweep",
    )


def run_tail_sweep(cfg: AthaConfig, workdir: Path) -> ResultsTable:
    """``experiment=tail_sweep``: for each training seed (the tiny CLIP of ``clip_seed``, as the
    comparison) and domain, ``sweep_episodes`` one-shot episodes, each run by zero-shot, CoOp +
    LoRA and the tail push alone at every fixed rho- of ``sweep_rho_minus``
    (:func:`run_sweep_block`), in Ray tasks of ``episodes_per_job`` episodes; summarised by
    :func:`summarise_sweep`."""
    t0 = time.time()
    workdir.mkdir(parents=True, exist_ok=True)
    seeds, cfgs, specs, bbs, pools, domains = _setup(cfg)
    t_data = time.time() - t0
    block = cfg.episodes_per_job
    n_ep = cfg.sweep_episodes
    jobs = [
        Job((seed, d, start), sweep_job,
            (cfgs[seed].model_dump(), specs[seed], d, list(range(start, min(n_ep, start + block)))),
            num_gpus=cfg.job_gpus, trains=True)
        for seed in seeds for d in domains for start in range(0, n_ep, block)
    ]  # fmt: skip
    done = run_jobs(jobs, description=f"atha {cfg.preset} tail sweep")
    acc: dict[tuple[str, int, str], list[float]] = {}
    rates: dict[str, list[dict[str, list[float]]]] = {}
    for (seed, d, _), res in done.items():  # the jobs' order: episodes in order
        for r in res:
            acc.setdefault((r["row"], seed, d), []).append(r["acc"])
            rates.setdefault(r["row"], []).append(r["rates"])
    acc_src = {s: _tiny_meta(bbs[s]).get("zero_shot", {}).get("acc_src_8way") for s in seeds}
    run_cfg = cfg.model_copy(update={"domains": domains})
    ways = ways_of(run_cfg, {d: len(pools[seeds[0]][d].names) for d in domains})
    table = summarise_sweep(run_cfg, acc, acc_src, ways)
    table.extra["rates_per_block"] = {
        r: {k: np.mean([x[k] for x in rates[r]], 0).round(4).tolist() for k in ("head", "tail")}
        for r in sweep_rows(cfg)
        if r != "zero_shot"
    }
    if cfg.backbone == "tiny":
        table.extra["tiny_clip"] = {
            str(s): {
                "folder": bbs[s].folder.name,  # type: ignore[attr-defined]
                "clip_seed": clip_seed_for(cfgs[s]),
                "acc_src_8way": acc_src[s],
            }
            for s in seeds
        }
    table.extra["sizes"] = {"sweep_episodes": n_ep, "epochs": cfg.epochs, "n_way": cfg.n_way,
                            "queries_per_class": cfg.queries, "domains": domains,
                            "seeds": seeds}  # fmt: skip
    table.extra["seconds"] = {"data": round(t_data, 1), "total": round(time.time() - t0, 1)}
    table.runtime_s = time.time() - t0
    return table
