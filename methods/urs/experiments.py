"""URS's comparison: zero-shot routing on seen and unseen variants.

Everything runs as Ray tasks (one CPU each) through :func:`nshot.experiment.run_jobs`, in two
rounds (1-3, then 4 and 6):

1. train ``urs``, its ablations (``urs_no_mbm``: geometric bias only; ``urs_no_generator``:
   fixed weights; ``urs_flags``: attribute flags instead of the UDR's global vector, no MBM, no
   generator) and the MTPOMO baseline (``mtpomo``: POMO with attribute composition,
   :mod:`.mtpomo`), all with the same recipe, steps, batch, generator and seen variants,
   through ``nshot.train.fit`` (Ray Train local mode inside each task), once per training seed
   (``experiment_seeds``);
2. reference solutions (PyVRP 0.14 iterated local search, OR-Tools for classic backhauls) with a
   fixed time limit per instance, one task per (variant, size), cached as Parquet;
3. constructive baselines (nearest neighbour, savings, random feasible policy);
4. each trained model decodes every test instance (POMO multi-start × 8 augmentations,
   greedy);
5. an independent checker verifies every solution of every system; gaps are per instance
   against the reference's checked cost;
6. the inference time/memory curve of ``urs`` over ``scaling_sizes`` (CVRP, one instance each),
   then the reference solver on the same instances at its budget (the gap beside the time).

Rows are means over the training seeds, with the per-seed values in ``samples`` (paired by
seed across systems; the deterministic heuristics and reference repeat their one value) for
the claims' paired tests (:func:`nshot.experiment.aggregate`). One metric is paired over
instances instead: ``gap_pct_unseen_inst``, the mean over every unseen test instance of its gap
(averaged over the training seeds), whose ``samples`` hold one value per instance in the same
order for every system.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from nshot.experiment import Job, aggregate, grid, is_planning, run_jobs
from nshot.method import ResultsTable

from .config import URSConfig

SYSTEM_OVERRIDES: dict[str, dict[str, Any]] = {
    "urs": {},
    "urs_no_mbm": {"mbm": False},
    "urs_no_generator": {"generator": False},
    # MTPOMO (the paper's multi-task baseline): POMO with attribute composition, POMO's
    # logit clipping C = 10; everything else (recipe, budget, generator, seen variants) as URS
    "mtpomo": {"arch": "mtpomo", "mbm": False, "generator": False, "clip": 10.0},
    # URS's backbone with problem enumeration by attribute flags, no MBM, no generator
    "urs_flags": {"mbm": False, "generator": False, "encoding": "flags"},
    # URS trained on half uniform, half clustered instances (the X benchmark's layouts)
    "urs_clustered_train": {"train_layouts": ["uniform", "clustered"]},
}
HEURISTICS = ("nearest_neighbour", "savings", "random")
METRICS = {
    "cost_seen": False,
    "cost_unseen": False,
    "gap_pct_seen": False,
    "gap_pct_unseen": False,
    "feasible_pct_seen": True,
    "feasible_pct_unseen": True,
    "cost_clustered": False,
    "gap_pct_clustered": False,
    "feasible_pct_clustered": True,
    "time_s": False,
    # per-instance mean gap on the unseen variants; samples: one value per instance
    "gap_pct_unseen_inst": False,
}


def test_splits(cfg: URSConfig) -> dict[str, list[str]]:
    """The test sets by split: ``seen`` and ``unseen`` variants (uniform layout) and, when the
    config names any, ``clustered`` (``"<variant>@clustered"``)."""
    out = {"seen": list(cfg.seen_variants), "unseen": list(cfg.unseen_variants)}
    if cfg.clustered_variants:
        out["clustered"] = [f"{v}@clustered" for v in cfg.clustered_variants]
    return out


def test_sets(cfg: URSConfig) -> list[str]:
    """Every test set, split by split."""
    return [name for names in test_splits(cfg).values() for name in names]


def split_of(cfg: URSConfig, name: str) -> str:
    return next(split for split, names in test_splits(cfg).items() if name in names)


def _log(msg: str) -> None:
    print(f"[urs] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- per-system runs


def evaluate_system(system: Any, cfg: URSConfig, variants: list[str]) -> dict:
    """``{(variant, n): [per-instance {cost, feasible, violations, time_s}]}`` for a trained
    network or a heuristic's name; every solution goes through the independent checker."""

    from .checker import check
    from .data import load_test_set
    from .heuristics import nearest_neighbour, random_policy, savings
    from .model import solve

    out: dict = {}
    for v in variants:
        for n in cfg.eval_sizes:
            inst = load_test_set(cfg, v, n)
            rows = []
            for s in range(0, len(inst), cfg.eval_batch):
                chunk = inst[s : s + cfg.eval_batch]
                t0 = time.time()
                if system == "nearest_neighbour":
                    sols = nearest_neighbour(chunk)
                elif system == "random":
                    sols = random_policy(chunk, seed=cfg.seed)
                elif system == "savings":
                    sols = [savings(chunk, i) for i in range(len(chunk))]
                else:
                    sols = solve(system, chunk, cfg.eval_starts, cfg.augment)
                dt = (time.time() - t0) / len(chunk)
                for i, sol in enumerate(sols):
                    if sol is None:  # savings on multi-depot instances
                        rows.append(None)
                        continue
                    rep = check(chunk, sol["routes"], sol["depots"], i)
                    rows.append({"cost": rep.cost, "feasible": rep.feasible,
                                 "violations": rep.violations[:3], "time_s": dt})  # fmt: skip
            out[(v, n)] = rows
    return out


def reference_results(cfg: URSConfig, variant: str, n: int) -> list[dict]:
    """Reference solutions of the (variant, n) test set, computed once and cached as Parquet."""
    import pyarrow as pa

    from nshot.data import cached_table

    from .baselines import reference
    from .checker import check
    from .data import cache_name, load_test_set

    seconds = max(cfg.ref_time_min, cfg.ref_time_per_node * n)
    key = f"urs-ref-{cache_name(variant)}-n{n}-k{cfg.eval_instances}-s{cfg.test_seed}-t{int(seconds * 1000)}ms"

    def build() -> pa.Table:
        inst = load_test_set(cfg, variant, n)
        rows: dict[str, list] = {k: [] for k in ("hash", "routes", "depots", "cost", "feasible",
                                                 "solver_feasible", "solver", "time_s")}  # fmt: skip
        for i in range(len(inst)):
            sol = reference(inst, i, seconds, seed=cfg.seed)
            rep = check(inst, sol["routes"], sol["depots"], i)
            rows["hash"].append(inst.hash(i))
            rows["routes"].append(json.dumps(sol["routes"]))
            rows["depots"].append(json.dumps(sol["depots"]))
            rows["cost"].append(rep.cost)
            rows["feasible"].append(rep.feasible)
            rows["solver_feasible"].append(sol["solver_feasible"])
            rows["solver"].append(sol["solver"])
            rows["time_s"].append(sol["time_s"])
        return pa.table(rows)

    table = cached_table(key, build)
    return table.to_pylist()


def _train_system(cfg_dict: dict, storage: str, name: str) -> str:

    from nshot.train import Scaling, fit

    cfg = URSConfig.validated(cfg_dict)
    t0 = time.time()
    res = fit("urs", cfg, scaling=Scaling(workers=0), storage=storage, name=name, overwrite=True)
    _log(f"{name}: trained in {time.time() - t0:.0f}s")
    return str(res.checkpoint)


def _eval_task(cfg_dict: dict, system: str, ckpt: str | None, variants: list[str]) -> dict:
    cfg = URSConfig.validated(cfg_dict)
    if ckpt is not None:
        from nshot.train import load_checkpoint

        from .model import load_model

        net, _ = load_model(load_checkpoint(ckpt, method="urs"))
        return evaluate_system(net, cfg, variants)
    return evaluate_system(system, cfg, variants)


def _ref_task(cfg_dict: dict, variant: str, n: int) -> list[dict]:
    return reference_results(URSConfig.validated(cfg_dict), variant, n)


def _scaling_task(ckpt: str, sizes: list[int], starts: int, aug: int, cfg_dict: dict) -> list[dict]:
    from nshot.train import load_checkpoint

    from .bench import reference_gaps, scaling_benchmark
    from .model import load_model

    cfg = URSConfig.validated(cfg_dict)
    net, _ = load_model(load_checkpoint(ckpt, method="urs"))
    out = scaling_benchmark(net, sizes, starts=starts, aug=aug)
    # the reference at its budget on the same instances, after every URS solve (so that the
    # peak RSS above is URS's alone)
    return reference_gaps(out, lambda n: max(cfg.ref_time_min, cfg.ref_time_per_node * n),
                          seed=cfg.seed)  # fmt: skip


# --------------------------------------------------------------------------- summaries


def _gaps(rows: list, refs: list[dict]) -> list[float]:
    out = []
    for r, ref in zip(rows, refs):
        if r is None or not ref["feasible"] or ref["cost"] <= 0:
            continue
        out.append(100.0 * (r["cost"] - ref["cost"]) / ref["cost"])
    return out


def summarise(res: dict, refs: dict, cfg: URSConfig) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    times = []
    for split, variants in test_splits(cfg).items():
        costs, gaps, feas = [], [], []
        for v in variants:
            for n in cfg.eval_sizes:
                rows = res.get((v, n))
                if rows is None or any(r is None for r in rows):
                    continue
                costs.append(float(np.mean([r["cost"] for r in rows])))
                g = _gaps(rows, refs[(v, n)])
                if g:
                    gaps.append(float(np.mean(g)))
                feas.append(100.0 * float(np.mean([r["feasible"] for r in rows])))
                times += [r["time_s"] for r in rows]
        out[f"cost_{split}"] = float(np.mean(costs)) if costs else None
        out[f"gap_pct_{split}"] = float(np.mean(gaps)) if gaps else None
        out[f"feasible_pct_{split}"] = float(np.mean(feas)) if feas else None
    out["time_s"] = float(np.mean(times)) if times else None
    inst = instance_gaps([res], refs, cfg.unseen_variants, cfg.eval_sizes)
    out["gap_pct_unseen_inst"] = float(np.mean(inst)) if inst else None
    return out


def instance_gaps(
    per_seed: list[dict], refs: dict, variants: list[str], sizes: list[int]
) -> list[float] | None:
    """Per test instance of ``variants`` × ``sizes`` (in that order, instances whose reference
    is feasible): the system's gap (%) averaged over its training seeds (``per_seed``: one
    results dict per seed). ``None`` when the system has no solution for some instance (savings
    on multi-depot variants), so that every system's list pairs by position."""
    out: list[float] = []
    for v in variants:
        for n in sizes:
            ref = refs[(v, n)]
            runs = [res.get((v, n)) for res in per_seed]
            if any(rows is None or len(rows) != len(ref) for rows in runs):
                return None
            for i, r in enumerate(ref):
                if not r["feasible"] or r["cost"] <= 0:
                    continue
                if any(rows[i] is None for rows in runs):
                    return None
                out.append(float(np.mean([100.0 * (rows[i]["cost"] - r["cost"]) / r["cost"]
                                          for rows in runs])))  # fmt: skip
    return out


def _ref_as_result(refs: dict) -> dict:
    return {
        k: [{"cost": r["cost"], "feasible": r["feasible"], "time_s": r["time_s"],
             "violations": []} for r in rows]
        for k, rows in refs.items()
    }  # fmt: skip


# --------------------------------------------------------------------------- the comparison


def training_seeds(cfg: URSConfig) -> list[int]:
    """The training seeds of every trained system: ``seed, seed + 1, ...``
    (``experiment_seeds`` of them)."""
    return [cfg.seed + i for i in range(cfg.experiment_seeds)]


def _run_name(cfg: URSConfig, system: str, seed: int) -> str:
    """A training run's name; one seed keeps the single-seed name of earlier runs."""
    base = f"urs-{cfg.preset}-{system}"
    return base if cfg.experiment_seeds == 1 else f"{base}-seed{seed}"


def _first_jobs(cfg: URSConfig, storage: str, gpus: float, chunks: list) -> list[Job]:
    """Training of every (system, seed) (a GPU each where the cluster has them), the reference
    solver per (variant, size), and the heuristics (two chunks of variants each): all
    independent."""
    cfg_dict = cfg.model_dump()
    jobs = [
        Job(("train", s, seed), _train_system,
            (URSConfig.validated({**cfg_dict, **SYSTEM_OVERRIDES[s], "seed": seed}).model_dump(),
             storage, _run_name(cfg, s, seed)), num_cpus=1, num_gpus=gpus, trains=True)
        for s, seed in grid(cfg.systems, training_seeds(cfg))
    ]  # fmt: skip
    variants = test_sets(cfg)
    jobs += [
        Job(("ref", v, n), _ref_task, (cfg_dict, v, n)) for v, n in grid(variants, cfg.eval_sizes)
    ]
    jobs += [Job(("heuristic", h, i), _eval_task, (cfg_dict, h, None, c))
             for h, (i, c) in grid(HEURISTICS, enumerate(chunks))]  # fmt: skip
    return jobs


def _merged(done: dict, kind: str, system: str, seed: int | None = None) -> dict:
    """One system's per-(variant, n) results (of one training seed), merged over its chunks."""
    out: dict = {}
    for key, part in done.items():
        if key[:2] == (kind, system) and (seed is None or key[2] == seed):
            out.update(part)
    return out


def _mean_cells(per_seed: list[list[dict]], order: list[str]) -> list[dict]:
    """The per-(variant, size) table averaged over training seeds: each system's cost, gap and
    feasibility are the means of its per-seed cell means (one seed: that seed's table)."""
    if len(per_seed) == 1:
        return per_seed[0]
    out = []
    for cells in zip(*per_seed, strict=True):
        row = {k: cells[0][k] for k in ("variant", "n", "split", "reference")}
        for s in order:
            vals = [c[s] for c in cells]
            if any(v is None for v in vals):
                row[s] = None
                continue
            gaps = [v["gap_pct"] for v in vals]
            row[s] = {
                "cost": float(np.mean([v["cost"] for v in vals])),
                "gap_pct": None if None in gaps else float(np.mean(gaps)),
                "feasible_pct": float(np.mean([v["feasible_pct"] for v in vals])),
            }
        out.append(row)
    return out


def run_experiments(cfg: URSConfig, workdir: Path) -> ResultsTable:
    import ray

    from nshot.train.runner import ensure_ray

    from .baselines import pyvrp_version

    t_start = time.time()
    cfg_dict = cfg.model_dump()
    variants = test_sets(cfg)
    if is_planning():  # a dry run: the scale says what a training job gets
        gpus = 0
    else:
        ensure_ray()
        gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
    chunks = [variants[i::2] for i in range(2)] if len(variants) > 1 else [variants]
    seeds = training_seeds(cfg)
    first = run_jobs(_first_jobs(cfg, str(workdir / "runs"), gpus, chunks),
                     description="urs: training, references, heuristics")  # fmt: skip
    ckpts = {(s, seed): first[("train", s, seed)] for s, seed in grid(cfg.systems, seeds)}
    refs = {(v, n): first[("ref", v, n)] for v, n in grid(variants, cfg.eval_sizes)}
    second = [Job(("eval", s, seed, i), _eval_task, (cfg_dict, s, ckpts[(s, seed)], c))
              for s, seed, (i, c) in grid(cfg.systems, seeds, enumerate(chunks))]  # fmt: skip
    if "urs" in cfg.systems and cfg.scaling_sizes:  # the first seed's model
        first_urs = ckpts[("urs", seeds[0])]
        args = (first_urs, cfg.scaling_sizes, cfg.eval_starts, cfg.augment, cfg_dict)
        second.append(Job(("scaling",), _scaling_task, args))
    done = run_jobs(second, description="urs: decoding the test sets")
    # per training seed: the trained systems' results; the heuristics and the reference are
    # deterministic (run once) and stand beside every seed, so that samples pair by seed
    fixed = {h: _merged(first, "heuristic", h) for h in HEURISTICS} | {
        "pyvrp": _ref_as_result(refs)
    }
    by_seed = {
        seed: {s: _merged(done, "eval", s, seed) for s in cfg.systems} | fixed for seed in seeds
    }
    scaling = done.get(("scaling",), [])
    order = [*cfg.systems, *HEURISTICS, "pyvrp"]
    per = {(s, seed): summarise(by_seed[seed][s], refs, cfg) for s, seed in grid(order, seeds)}
    rows, stds, samples = aggregate(per, spread="sample_std")
    # the paired-over-instances metric: one value per unseen instance (mean over the seeds)
    for s in order:
        inst = instance_gaps([by_seed[seed][s] for seed in seeds], refs, cfg.unseen_variants,
                             cfg.eval_sizes)  # fmt: skip
        if inst is None:
            samples[s].pop("gap_pct_unseen_inst", None)
        else:
            samples[s]["gap_pct_unseen_inst"] = inst
    per_variant = _mean_cells([_per_variant(by_seed[seed], refs, cfg, order) for seed in seeds],
                              order)  # fmt: skip
    solvers = sorted({r["solver"] for rs in refs.values() for r in rs})
    ref_infeasible = sum(1 for rs in refs.values() for r in rs if not r["feasible"])
    extra = {
        "per_variant": per_variant,
        "scaling": scaling,
        "checkpoints": {_run_name(cfg, s, seed): c for (s, seed), c in ckpts.items()},
        "training_seeds": seeds,
        "reference_solvers": solvers,
        "pyvrp_version": pyvrp_version(),
        "violations": {
            s: sorted({v for seed in seeds for v in _violations(by_seed[seed][s])}) for s in order
        },
        "markdown": _markdown(per_variant, cfg, order, scaling),
        # numbers the claims read (nshot.methods.urs.claims)
        "gap_pct_by_size": gap_by_size(per_variant, "urs", cfg.eval_sizes),
        "cells_lost_by_urs": cells_lost(
            per_variant, "urs", [s for s in order if s not in ("urs", "pyvrp")]
        ),
        # the seen variants alone: at the training size (the claim) and at every size (reported)
        **seen_cells_lost(per_variant, cfg, [s for s in order if s not in ("urs", "pyvrp")]),
        # the gap of the scaling curve's urs solve to the reference at its budget, per size
        "scaling_gap_pct": {
            str(s["n"]): s["gap_pct"] for s in scaling if s.get("gap_pct") is not None
        },
    }
    _plot_per_variant(per_variant, cfg, order, workdir / "per_variant.png")
    if scaling:
        _plot_scaling(scaling, workdir / "scaling.png")
        (workdir / "scaling.json").write_text(json.dumps(scaling, indent=1))
    return ResultsTable(
        method="urs", preset=cfg.preset, seeds=len(seeds), metrics=dict(METRICS), rows=rows,
        stds=stds if len(seeds) > 1 else {}, samples=samples, runtime_s=time.time() - t_start,
        extra=extra, notes=_notes(cfg, rows, per_variant, solvers, ref_infeasible, scaling),
    )  # fmt: skip


def _violations(results: dict) -> list[str]:
    return sorted({v.split(":")[0] for rs in results.values() for r in rs if r
                   for v in r["violations"]})  # fmt: skip


def _per_variant(results: dict, refs: dict, cfg: URSConfig, order: list[str]) -> list[dict]:
    out = []
    for v in test_sets(cfg):
        for n in cfg.eval_sizes:
            row: dict[str, Any] = {
                "variant": v,
                "n": n,
                "split": split_of(cfg, v),
                "reference": refs[(v, n)][0]["solver"],
            }
            for s in order:
                rs = results[s].get((v, n))
                if rs is None or any(r is None for r in rs):
                    row[s] = None
                    continue
                g = _gaps(rs, refs[(v, n)])
                row[s] = {
                    "cost": float(np.mean([r["cost"] for r in rs])),
                    "gap_pct": float(np.mean(g)) if g else None,
                    "feasible_pct": 100.0 * float(np.mean([r["feasible"] for r in rs])),
                }
            out.append(row)
    return out


def gap_by_size(per_variant: list[dict], system: str, sizes: list[int]) -> dict[str, dict]:
    """``{split: {str(N): mean gap (%)}}`` of ``system`` over the variants of each split, per
    evaluation size (sizes where it has no gap are left out)."""
    out: dict[str, dict[str, float]] = {"seen": {}, "unseen": {}}
    if any(r["split"] == "clustered" for r in per_variant):
        out["clustered"] = {}
    for split, by_n in out.items():
        for n in sizes:
            gs = [r[system]["gap_pct"] for r in per_variant
                  if r["split"] == split and r["n"] == n and r.get(system)
                  and r[system]["gap_pct"] is not None]  # fmt: skip
            if gs:
                by_n[str(n)] = float(np.mean(gs))
    return out


def cells_lost(per_variant: list[dict], system: str, baselines: list[str]) -> dict[str, int]:
    """Per baseline: the number of (variant, size) cells where ``system``'s mean cost is not
    below the baseline's (cells where either has no solution are not counted)."""
    return {
        b: sum(1 for r in per_variant
               if r.get(system) and r.get(b) and r[system]["cost"] >= r[b]["cost"])
        for b in baselines
    }  # fmt: skip


def seen_cells_lost(per_variant: list[dict], cfg: URSConfig, baselines: list[str]) -> dict:
    """``cells_lost_by_urs_seen`` (every evaluation size) and, when the first training size is
    an evaluation size, ``cells_lost_by_urs_seen_at_train_size``: :func:`cells_lost` over the
    seen variants' cells."""
    seen = [r for r in per_variant if r["split"] == "seen"]
    out = {"cells_lost_by_urs_seen": cells_lost(seen, "urs", baselines)}
    n0 = cfg.train_sizes[0]
    if n0 in cfg.eval_sizes:
        at = [r for r in seen if r["n"] == n0]
        out["cells_lost_by_urs_seen_at_train_size"] = cells_lost(at, "urs", baselines)
    return out


def _notes(cfg, rows, per_variant, solvers, ref_infeasible, scaling) -> list[str]:
    notes = [
        f"{cfg.eval_instances} test instances per variant and size (sizes {cfg.eval_sizes}); "
        f"models trained on {cfg.seen_variants} at N={cfg.train_sizes} for {cfg.steps} steps "
        f"× {cfg.batch_size} instances × {cfg.train_starts} POMO rollouts; inference: greedy, "
        f"min(N, {cfg.eval_starts}) starts × {cfg.augment} augmentations.",
        f"trained systems: {cfg.experiment_seeds} training seed(s) each "
        f"({', '.join(str(s) for s in training_seeds(cfg))}); rows and the per-variant table "
        "are means over them"
        + (
            " (± the sample std over seeds; samples hold one value per seed)"
            if cfg.experiment_seeds > 1
            else ""
        )
        + "; the heuristics and the reference are deterministic and run once; the scaling "
        "curve uses the first seed's urs.",
        f"reference ('pyvrp' row): {', '.join(solvers)} — PyVRP where it expresses the variant, "
        "OR-Tools GLS for classic backhauls; time limit "
        f"max({cfg.ref_time_min}, {cfg.ref_time_per_node}·N) s per instance; gap = 100·(cost − "
        "ref)/ref per instance, over instances whose reference is feasible "
        f"({ref_infeasible} reference solutions infeasible).",
        "every solution of every system is verified by the independent checker (checker.py); "
        "cost_* and gap_pct_* average the per-(variant, size) means; time_s is wall time per "
        "instance (the reference's is its time limit), on a shared 2-core CPU.",
    ]
    lost = [f"{r['variant']}/{r['n']}" for r in per_variant
            if r["urs"] and r["nearest_neighbour"]
            and r["urs"]["cost"] >= r["nearest_neighbour"]["cost"]]  # fmt: skip
    notes.append(
        "(variant, size) cells where urs's mean cost is not below nearest neighbour's: "
        + (", ".join(lost) if lost else "none")
    )
    lost_sav = [f"{r['variant']}/{r['n']}" for r in per_variant
                if r["split"] == "seen" and r["urs"] and r.get("savings")
                and r["urs"]["cost"] >= r["savings"]["cost"]]  # fmt: skip
    notes.append(
        "seen (variant, size) cells where urs's mean cost is not below savings': "
        + (", ".join(lost_sav) if lost_sav else "none")
    )
    g = {s: rows[s].get("gap_pct_unseen") for s in rows}
    if g.get("urs") is not None:
        for ab in ("urs_no_mbm", "urs_no_generator", "urs_flags", "mtpomo"):
            if g.get(ab) is not None:
                d = g[ab] - g["urs"]
                kind = "baseline" if ab == "mtpomo" else "ablation"
                notes.append(
                    f"{kind} {ab}: unseen gap {g[ab]:.2f}% vs urs {g['urs']:.2f}% "
                    f"({'+' if d >= 0 else ''}{d:.2f} points)"
                )
    by_n = gap_by_size(per_variant, "urs", cfg.eval_sizes)["unseen"]
    if by_n:
        notes.append("urs unseen gap by size: "
                     + ", ".join(f"N={n}: {v:.2f}%" for n, v in by_n.items()))  # fmt: skip
    notes += _clustered_notes(cfg, per_variant)
    if scaling:
        notes.append("inference scaling (CVRP, one instance, urs; gap to the reference at its "
                     "budget): " + ", ".join(
            f"N={s['n']}: {s['time_s']:.1f}s, peak RSS {s['peak_rss_mb']:.0f} MB"
            + (f", gap {s['gap_pct']:.2f}% ({s['ref_solver']}, {s['ref_budget_s']:g}s)"
               if s.get("gap_pct") is not None else "")
            for s in scaling))  # fmt: skip
    return notes


def _clustered_notes(cfg: URSConfig, per_variant: list[dict]) -> list[str]:
    """Per clustered test set and size: the gap of each URS model there and on the same
    variant's uniform test set (same size, same reference solver and time limit)."""
    cells = {(r["variant"], r["n"]): r for r in per_variant}
    out = []
    for v in cfg.clustered_variants:
        for n in cfg.eval_sizes:
            uni, clu = cells.get((v, n)), cells.get((f"{v}@clustered", n))
            if not uni or not clu:
                continue
            parts = []
            for s in ("urs", "urs_clustered_train"):
                if uni.get(s) and clu.get(s) and None not in (uni[s]["gap_pct"], clu[s]["gap_pct"]):
                    parts.append(f"{s} {uni[s]['gap_pct']:.2f}% uniform → "
                                 f"{clu[s]['gap_pct']:.2f}% clustered")  # fmt: skip
            if parts:
                out.append(f"{v} N={n}: " + "; ".join(parts))
    return out


def _markdown(per_variant: list[dict], cfg: URSConfig, order: list[str], scaling: list) -> str:
    shown = [s for s in order if s != "pyvrp"]
    lines = [
        "## Per variant",
        "",
        "Mean cost of the reference and gap (%) to it per system; `*` marks a system with an "
        "infeasible solution on that variant; n/a: not applicable (savings on multi-depot).",
        "",
        "| variant | N | split | reference | ref cost | " + " | ".join(shown) + " |",
        "|---|---|---|---|---|" + "---|" * len(shown),
    ]
    for r in per_variant:
        ref = r["pyvrp"]["cost"] if r.get("pyvrp") else float("nan")
        cells = []
        for s in shown:
            c = r.get(s)
            if c is None or c["gap_pct"] is None:
                cells.append("n/a")
            else:
                cells.append(f"{c['gap_pct']:.2f}" + ("" if c["feasible_pct"] == 100 else "*"))
        lines.append(f"| {r['variant']} | {r['n']} | {r['split']} | {r['reference']} | "
                     f"{ref:.3f} | " + " | ".join(cells) + " |")  # fmt: skip
    if scaling:
        lines += ["", "## Inference scaling (urs, CVRP, 1 instance)", "",
                  "| N | POMO starts × aug | time (s) | peak RSS (MB) | cost | feasible | "
                  "reference cost (budget s) | gap (%) |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for s in scaling:
            ref = (f"{s['ref_cost']:.3f} ({s['ref_budget_s']:g})"
                   if s.get("ref_cost") is not None else "n/a")  # fmt: skip
            gap = f"{s['gap_pct']:.2f}" if s.get("gap_pct") is not None else "n/a"
            lines.append(f"| {s['n']} | {s['starts']} × {s['aug']} | {s['time_s']:.2f} | "
                         f"{s['peak_rss_mb']:.0f} | {s['cost']:.3f} | {s['feasible']} | "
                         f"{ref} | {gap} |")  # fmt: skip
    return "\n".join(lines)


def _plot_per_variant(per_variant: list[dict], cfg: URSConfig, order: list[str], path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [s for s in order if s not in ("pyvrp", "random")]
    fig, axes = plt.subplots(len(cfg.eval_sizes), 1, figsize=(13, 3.6 * len(cfg.eval_sizes)),
                             squeeze=False)  # fmt: skip
    for ax, n in zip(axes[:, 0], cfg.eval_sizes):
        rows = [r for r in per_variant if r["n"] == n]
        x = np.arange(len(rows))
        w = 0.8 / len(shown)
        for k, s in enumerate(shown):
            vals = [r[s]["gap_pct"] if r.get(s) and r[s]["gap_pct"] is not None else 0.0
                    for r in rows]  # fmt: skip
            ax.bar(x + k * w, vals, w, label=s)
        ax.set_xticks(x + 0.4 - w / 2, [("*" if r["split"] == "seen" else "") + r["variant"]
                                        for r in rows], rotation=60, ha="right", fontsize=7)  # fmt: skip
        ax.set_ylabel("gap to reference (%)")
        ax.set_title(f"N = {n} (* = seen in training)", fontsize=9)
        ax.legend(fontsize=7, ncol=len(shown))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_scaling(scaling: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    ns = [s["n"] for s in scaling]
    ax.plot(ns, [s["time_s"] for s in scaling], "o-", label="time (s)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("customers N")
    ax.set_ylabel("seconds per instance")
    ax2 = ax.twinx()
    ax2.plot(ns, [s["peak_rss_mb"] for s in scaling], "s--", color="C1", label="peak RSS (MB)")
    ax2.set_ylabel("peak RSS (MB)")
    ax.set_title("urs inference, CVRP, 1 core", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
