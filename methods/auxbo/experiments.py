"""auxbo's comparison: few-shot prediction and BO regret on held-out tasks.

For each task family (synthetic, mini-LCBench):

1. meta-train the full TNP and the f-only TNP on the family's history tasks (two Ray tasks in
   parallel, one CPU each);
2. prediction: NLL at context 5 on held-out targets of the held-out tasks (full, f-only, the
   h-shuffle control, and a per-task GP on the same z-scored f);
3. BO: every system runs ``budget`` evaluations on every held-out task (Ray tasks over chunks
   of tasks); all systems start from the same random design per task (paired), and the
   normalised simple regret after 5, 10 and 20 evaluations is compared with paired one-sided
   Wilcoxon tests (aux-BO lower than each baseline).

Rows: auxbo, f_only, h_shuffle, h_cross, gp_ei, multitask_gp, optuna_tpe, random. ``h_shuffle``
is the first control (each context h replaced by another design's of the same task);
``h_cross`` is a second control added by nshot: each context h is the h of a random design of a
random *history* task, so it carries neither the design's nor the task's information (a curve
shuffled within a task still shows the task's noise level and scale). With ``h_set_control``
(on in ``small``) a third row, ``h_set``, is a TNP meta-trained *and* run with the h-shuffle:
h can tell it about the task, never about the design, so it measures how much of aux-BO's
advantage the set of a task's h values carries on its own (what the within-task shuffle cannot
remove), and aux-BO against it shows the per-design reading. The synthetic
family's metrics are ``regret_at_{5,10,20}`` and ``nll_ctx5``; mini-LCBench's are prefixed
``lc_``.

Preconditions of a family, measured on every run: ``extra["set_information"]`` (what the set of
a task's h values says about where its optimum lies, :func:`set_information`) and
``extra["h_information"]`` (what one design's h says about its own f,
:func:`design_information`); the synthetic family's checks in claims.py read them, with
``extra["synthetic_version"]``.

Seeds. On the ``seeded_families`` (mini-LCBench in ``small``) aux-BO and the f-only TNP are
meta-trained ``train_seeds`` times on the same tasks (seeds ``seed``, ``seed + 1``, ...; each
further seed's BO runs start from its own random designs, the same for both rows), and
``seed_regret_at_{5,10,20}`` (prefixed) holds, per seed, the regret averaged over the held-out
tasks: the row is the mean over seeds, ``samples`` the per-seed values (paired by seed) that the
headline claim's paired test reads. Seed 0 is the run every other figure comes from.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from nshot.experiment import Job, aggregate, grid, run_jobs, share
from nshot.method import ResultsTable

from .config import AuxBOConfig

SYSTEMS = (
    "auxbo",
    "f_only",
    "h_shuffle",
    "h_cross",
    "gp_ei",
    "multitask_gp",
    "optuna_tpe",
    "random",
)
PREFIX = {"synthetic": "", "lcbench": "lc_"}


def systems(cfg: AuxBOConfig) -> tuple[str, ...]:
    """The rows of ``cfg``'s comparison: :data:`SYSTEMS`, with ``h_set`` after the controls when
    ``cfg.h_set_control``."""
    if not cfg.h_set_control:
        return SYSTEMS
    k = SYSTEMS.index("h_cross") + 1
    return (*SYSTEMS[:k], "h_set", *SYSTEMS[k:])


def _log(msg: str) -> None:
    print(f"[auxbo] {msg}", file=sys.stderr, flush=True)


def _train_model(
    cfg_dict: dict[str, Any],
    family: str,
    use_h: bool,
    h_shuffle: bool = False,
    train_seed: int | None = None,
) -> dict[str, Any]:
    """One TNP meta-trained on ``family``'s history tasks (those of ``cfg.seed``), with
    ``train_seed`` (default ``cfg.seed``) for its initialisation, batches and held-back tasks."""

    from .data import load_family
    from .model import family_stats
    from .train import meta_train

    cfg = AuxBOConfig.validated(cfg_dict)
    train, _, _ = load_family(cfg, family)
    stats = family_stats(train)
    if train_seed is not None:
        cfg = AuxBOConfig.validated({**cfg_dict, "seed": train_seed})
    t0 = time.time()
    selection: dict[str, Any] = {}
    model, losses = meta_train(
        cfg,
        train,
        stats,
        use_h,
        progress=f"{family} {'h-set' if h_shuffle else 'full' if use_h else 'f-only'}"
        + (f" (seed {train_seed})" if train_seed is not None else ""),
        selection=selection,
        h_shuffle=h_shuffle,
    )
    return {
        "selection": selection,
        "state": {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()},
        "tnp": model.cfg.to_dict(),
        "stats": stats,
        "losses": losses,
        "seconds": time.time() - t0,
    }


def _model(trained: dict[str, Any]):
    import torch

    from .model import TNP, TNPConfig

    model = TNP(TNPConfig.from_dict(trained["tnp"]))
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in trained["state"].items()})
    model.eval()
    return model


def _proposer(system: str, ctx: dict[str, Any]):
    from . import bo

    cfg: AuxBOConfig = ctx["cfg"]
    if system in ("auxbo", "h_shuffle"):
        return bo.TNPProposer(
            _model(ctx["full"]), ctx["full"]["stats"], xi=cfg.xi, h_shuffle=system == "h_shuffle"
        )
    if system == "h_cross":
        return bo.TNPProposer(
            _model(ctx["full"]), ctx["full"]["stats"], xi=cfg.xi, h_pool=ctx["history"]
        )
    if system == "h_set":
        return bo.TNPProposer(
            _model(ctx["h_set"]), ctx["h_set"]["stats"], xi=cfg.xi, h_shuffle=True
        )
    if system == "f_only":
        return bo.TNPProposer(_model(ctx["f_only"]), ctx["f_only"]["stats"], xi=cfg.xi)
    if system == "gp_ei":
        return bo.GPEIProposer()
    if system == "multitask_gp":
        return bo.MultiTaskGPProposer(
            ctx["history"],
            n_history_tasks=cfg.mtgp_history_tasks,
            points_per_task=cfg.mtgp_points,
            maxiter=cfg.mtgp_maxiter,
            refit_every=cfg.mtgp_refit_every,
        )
    if system == "optuna_tpe":
        return bo.OptunaTPEProposer()
    if system == "random":
        return bo.RandomProposer()
    raise ValueError(system)


def _bo_chunk(system: str, ctx: dict[str, Any], tasks: list[Any], offset: int) -> list[np.ndarray]:

    from . import bo

    cfg: AuxBOConfig = ctx["cfg"]
    out = []
    for i, task in enumerate(tasks):
        prop = _proposer(system, ctx)  # fresh per task: no state leaks between tasks
        best = bo.run_bo(task, prop, cfg.budget, cfg.n_init, seed=cfg.seed * 100_003 + offset + i)
        out.append(bo.simple_regret(task, best))
    return out


def gp_nll(tasks: list[Any], n_ctx: int, m_targets: int, stats: dict[str, Any], seed: int) -> float:
    """Per-task GP (SingleTaskGP, fitted on n_ctx z-scored points) NLL on held-out targets,
    fitted on one torch thread (faster for GPs; the caller's threads are restored)."""
    import torch
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from gpytorch.mlls import ExactMarginalLogLikelihood

    from .model import gaussian_nll
    from .surrogate import single_thread

    with single_thread():
        vals = []
        for i, t in enumerate(tasks):
            rng = np.random.default_rng([seed, i])
            perm = rng.permutation(len(t.f))
            tgt, ctx = perm[:m_targets], perm[m_targets : m_targets + n_ctx]
            z = (np.asarray(t.f, np.float64) - stats["f_mean"]) / stats["f_std"]
            Xc = torch.as_tensor(t.X[ctx], dtype=torch.float64)
            yc = torch.as_tensor(z[ctx], dtype=torch.float64).unsqueeze(-1)
            gp = SingleTaskGP(Xc, yc)
            try:
                fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
            except Exception:  # noqa: BLE001 - a failed fit keeps the prior hyperparameters
                pass
            with torch.no_grad():
                post = gp.posterior(
                    torch.as_tensor(t.X[tgt], dtype=torch.float64), observation_noise=True
                )
                mu = post.mean.squeeze(-1)
                sd = post.variance.clamp_min(1e-12).sqrt().squeeze(-1)
            y = torch.as_tensor(z[tgt], dtype=torch.float64)
            vals.append(float(gaussian_nll(mu, sd, y).mean()))
        return float(np.mean(vals))


def task_optimum(task: Any) -> np.ndarray:
    """Where a task's optimum lies: the synthetic family's latent τ (in the designs' [0, 1]
    encoding), otherwise the encoded design with the best f."""
    tau = (task.info or {}).get("tau")
    if tau is not None:
        return (np.asarray(tau, np.float64) + 1.0) / 2.0
    return np.asarray(task.X[int(np.argmax(task.f))], np.float64)


def task_profile(task: Any) -> np.ndarray:
    """Which designs are good: the task's f over its designs, standardised within the task (the
    families share one design set, so profiles of two tasks line up)."""
    f = np.asarray(task.f, np.float64)
    return (f - f.mean()) / (f.std() + 1e-12)


SET_TARGETS = {"optimum": task_optimum, "profile": task_profile}


def set_information(
    train: list[Any],
    test: list[Any],
    sizes: tuple[int, ...] = (1, 2, 5, 10, 20),
    draws: int = 20,
    seed: int = 0,
) -> dict[str, dict[int, float]]:
    """How much the *set* of a task's h values says about the task, with no design attached.

    For each target of :data:`SET_TARGETS` (where the optimum lies; which designs are good) and
    each n: R² on ``test`` of a ridge regression (fitted on ``train``, alpha by
    cross-validation) from the mean h of n random designs of a task to the target. This is what
    the within-task h-shuffle leaves: a shuffled context still shows n h values of the task.
    A linear read-out of the mean: a lower bound on what the set holds."""
    from sklearn.linear_model import RidgeCV

    out: dict[str, dict[int, float]] = {name: {} for name in SET_TARGETS}
    for n in sizes:
        rng = np.random.default_rng([seed, n, 4099])
        split = {}
        for part, tasks, reps in ((0, train, draws), (1, test, max(1, draws // 4))):
            feats, ys = [], {name: [] for name in SET_TARGETS}
            for task in tasks:
                h = np.asarray(task.h, np.float64).reshape(len(task.f), -1)
                h = np.nan_to_num(h)  # padded frames of short curves count as zeros
                for _ in range(reps):
                    idx = rng.choice(len(task.f), size=min(n, len(task.f)), replace=False)
                    feats.append(h[idx].mean(0))
                    for name, target in SET_TARGETS.items():
                        ys[name].append(target(task))
            split[part] = (np.asarray(feats), {k: np.asarray(v) for k, v in ys.items()})
        (xa, ya), (xb, yb) = split[0], split[1]
        for name in SET_TARGETS:
            ridge = RidgeCV(alphas=np.logspace(-4, 3, 15)).fit(xa, ya[name])
            resid = ((ridge.predict(xb) - yb[name]) ** 2).sum()
            out[name][int(n)] = float(1.0 - resid / ((yb[name] - yb[name].mean(0)) ** 2).sum())
    return out


def design_information(
    train: list[Any], test: list[Any], per_task: int = 40, seed: int = 0
) -> float:
    """How much one design's h says about that design's f, within its task.

    R² on ``test`` of a ridge regression (alpha by cross-validation) from a design's h and its
    squares (a quadratic read-out, flattened over frames) to the design's f standardised within
    its task, fitted on ``per_task`` random designs of each ``train`` task and scored on as many
    of each held-out task. The synthetic family's precondition that h is informative about f's
    landscape (``synthetic_h_informative`` in claims.py) reads it."""
    from sklearn.linear_model import RidgeCV

    rng = np.random.default_rng([seed, 8191])

    def design_rows(tasks: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        feats, ys = [], []
        for task in tasks:
            h = np.nan_to_num(np.asarray(task.h, np.float64).reshape(len(task.f), -1))
            idx = rng.choice(len(task.f), size=min(per_task, len(task.f)), replace=False)
            feats.append(np.concatenate([h[idx], h[idx] ** 2], axis=1))
            ys.append(task_profile(task)[idx])
        return np.concatenate(feats), np.concatenate(ys)

    (xa, ya), (xb, yb) = design_rows(train), design_rows(test)
    ridge = RidgeCV(alphas=np.logspace(-4, 3, 15)).fit(xa, ya)
    return float(1.0 - ((ridge.predict(xb) - yb) ** 2).sum() / ((yb - yb.mean()) ** 2).sum())


def _wilcoxon(a: np.ndarray, b: np.ndarray, alternative: str = "less") -> float:
    """Paired Wilcoxon signed-rank p; by default one-sided, that ``a`` (aux-BO regret) is lower
    than ``b``."""
    from scipy.stats import wilcoxon

    d = np.asarray(a) - np.asarray(b)
    if np.all(d == 0):
        return 1.0
    return float(wilcoxon(a, b, alternative=alternative, zero_method="zsplit").pvalue)


def _train_seeds(cfg: AuxBOConfig, family: str) -> int:
    """Meta-training seeds of aux-BO and the f-only TNP on ``family`` (1 unless seeded)."""
    return cfg.train_seeds if family in cfg.seeded_families else 1


def _meta_train_all(
    cfg: AuxBOConfig, family: str
) -> tuple[dict[str, dict[str, Any]], dict[int, dict[str, dict[str, Any]]]]:
    """``(trained, reseeded)``: the family's TNPs, ``full`` (reads h), ``f_only`` and, with
    ``h_set_control``, ``h_set`` (meta-trained on within-task shuffled h); and, for each
    further meta-training seed s (:func:`_train_seeds`), ``full`` and ``f_only`` trained with
    seed ``cfg.seed + s``. One Ray task each, all at once."""
    kinds = {"full": (True, False), "f_only": (False, False)}
    if cfg.h_set_control:
        kinds["h_set"] = (True, True)
    cfg_dict = cfg.model_dump()
    jobs = [
        Job((k, 0), _train_model, (cfg_dict, family, *v), trains=True) for k, v in kinds.items()
    ]
    for s in range(1, _train_seeds(cfg, family)):
        jobs += [Job((k, s), _train_model, (cfg_dict, family, *kinds[k], cfg.seed + s),
                     trains=True)
                 for k in ("full", "f_only")]  # fmt: skip
    done = run_jobs(jobs, description=f"auxbo {family}: meta-training")
    trained = {k: tr for (k, s), tr in done.items() if s == 0}
    reseeded: dict[int, dict[str, dict[str, Any]]] = {}
    for (k, s), tr in done.items():
        if s:
            reseeded.setdefault(s, {})[k] = tr
    return trained, reseeded


def _prediction(cfg: AuxBOConfig, trained: dict, train: list, test: list) -> dict[str, dict]:
    """Held-out NLL/MSE at context sizes 1..20 of every TNP row and control."""
    from .model import evaluate_prediction

    full, stats, sizes = trained["full"], trained["full"]["stats"], (1, 2, 5, 10, 20)
    m = min(cfg.m_targets, min(len(t.f) for t in test) - max(sizes))
    runs = {
        "auxbo": (full, {}),
        "f_only": (trained["f_only"], {}),
        "h_shuffle": (full, {"h_shuffle": True}),
        "h_cross": (full, {"h_pool": train}),
    }
    if "h_set" in trained:
        runs["h_set"] = (trained["h_set"], {"h_shuffle": True})
    pred = {
        s: evaluate_prediction(_model(tr), test, sizes, m, stats, seed=cfg.seed, **kw)
        for s, (tr, kw) in runs.items()
    }
    pred["gp_ei"] = {5: {"nll": gp_nll(test, 5, m, stats, cfg.seed)}}
    return pred


def _bo_regrets(cfg: AuxBOConfig, family: str, names: tuple[str, ...], ctx: dict, test: list):
    """``{system: [task, evaluation] simple regret}``: every system's BO runs on the held-out
    tasks, in chunks of about an eighth of them per Ray task."""
    ctx_ref = share(ctx)  # the history tasks and the trained TNPs, stored once
    chunk = max(1, int(np.ceil(len(test) / 8)))
    starts = range(0, len(test), chunk)
    jobs = [Job((s, i), _bo_chunk, (s, ctx_ref, test[i : i + chunk], i))
            for s, i in grid(names, starts)]  # fmt: skip
    done = run_jobs(jobs, description=f"auxbo {family}: BO on {len(test)} tasks")
    return {s: np.stack([r for i in starts for r in done[(s, i)]]) for s in names}


def _family(cfg: AuxBOConfig, family: str, names: tuple[str, ...], out: dict[str, Any]) -> None:
    """One family's rows, spreads, per-task samples, extra and notes, written into ``out``."""
    from .data import load_family

    p, rows, extra = PREFIX[family], out["rows"], out["extra"]
    out["metrics"].update({f"{p}regret_at_{k}": False for k in (5, 10, 20)})
    out["metrics"][f"{p}nll_ctx5"] = False
    train, test, _ = load_family(cfg, family)
    test = test[: cfg.bo_tasks if family == "synthetic" else cfg.lcbench_bo_tasks]
    _log(f"{family}: {len(train)} history tasks, {len(test)} held-out tasks; meta-training")
    trained, reseeded = _meta_train_all(cfg, family)
    extra["meta_training"][family] = {
        f"{name}_{key}": tr[key] for name, tr in trained.items()
        for key in ("seconds", "losses", "selection")
    }  # fmt: skip
    pred = _prediction(cfg, trained, train, test)
    extra["prediction"][family] = {
        s: {str(n): v for n, v in r.items()} for s, r in pred.items() if s != "gp_ei"
    }
    for s in names:
        rows[s][f"{p}nll_ctx5"] = pred[s][5]["nll"] if s in pred else None
    regrets = _bo_regrets(cfg, family, names, {"cfg": cfg, "history": train, **trained}, test)
    n = len(test)
    extra.setdefault("task_regrets", {})[family] = {"tasks": [t.name for t in test]}
    for s, k in grid(names, (5, 10, 20)):
        col = regrets[s][:, min(k, cfg.budget) - 1]
        rows[s][f"{p}regret_at_{k}"] = float(col.mean())
        out["stds"][s][f"{p}regret_at_{k}"] = float(col.std(ddof=1) / np.sqrt(n)) if n > 1 else None
        out["samples"][s][f"{p}regret_at_{k}"] = [float(v) for v in col]  # paired by task
    for s in names:
        extra["curves"][f"{family}/{s}"] = regrets[s].mean(0).tolist()
        extra["task_regrets"][family][s] = regrets[s].tolist()  # per task and evaluation
    pv = {f"{s}@{k}": _wilcoxon(regrets["auxbo"][:, min(k, cfg.budget) - 1],
                                regrets[s][:, min(k, cfg.budget) - 1])
          for s, k in grid(names[1:], (5, 10, 20))}  # fmt: skip
    extra["pvalues"][family] = pv
    ctrl_pv = _control_pvalues(regrets, min(10, cfg.budget) - 1)
    extra.setdefault("control_pvalues", {})[family] = ctrl_pv
    info = set_information(train, test, seed=cfg.seed)
    extra.setdefault("set_information", {})[family] = {
        name: {str(k): v for k, v in r2.items()} for name, r2 in info.items()
    }
    f_r2 = design_information(train, test, seed=cfg.seed)
    extra.setdefault("h_information", {})[family] = {"f_r2": f_r2}
    if family == "synthetic":
        extra["synthetic_version"] = cfg.synthetic_version
    out["measured"] += _measured(family, rows, p, pred, pv, ctrl_pv, info, "h_set" in regrets)
    out["measured"].append(
        f"{family}: what one design's h says about its own f: a quadratic ridge read-out "
        f"(fitted on the history tasks) predicts the design's within-task standardised f on "
        f"the held-out tasks with R² {f_r2:.2f}"
        + (f" (synthetic family version {cfg.synthetic_version})" if family == "synthetic" else "")
    )
    out["notes"].append(_family_note(cfg, family, len(train), n, trained, pv))
    if family in cfg.seeded_families:
        _seeded(cfg, family, names, out, regrets, reseeded, train, test)


def _seeded(
    cfg: AuxBOConfig,
    family: str,
    names: tuple[str, ...],
    out: dict[str, Any],
    regrets: dict[str, np.ndarray],
    reseeded: dict[int, dict[str, dict[str, Any]]],
    train: list,
    test: list,
) -> None:
    """The ``seed_regret_at_k`` metrics of aux-BO and the f-only TNP: seed 0's regrets are the
    main run's; each further seed runs BO with its own TNPs on the same held-out tasks."""
    p, ks, seeded = PREFIX[family], (5, 10, 20), ("auxbo", "f_only")
    per_seed = {0: regrets}
    for s, tr in sorted(reseeded.items()):
        cfg_s = AuxBOConfig.validated({**cfg.model_dump(), "seed": cfg.seed + s})
        ctx = {"cfg": cfg_s, "history": train, **tr}
        per_seed[s] = _bo_regrets(cfg_s, f"{family} seed {cfg.seed + s}", seeded, ctx, test)
    per = {
        (name, s): {f"{p}seed_regret_at_{k}": float(r[name][:, min(k, cfg.budget) - 1].mean())
                    for k in ks}
        for name in seeded for s, r in per_seed.items()
    }  # fmt: skip
    rows, stds, samples = aggregate(per, spread="sample_std")
    for k in ks:
        metric = f"{p}seed_regret_at_{k}"
        out["metrics"][metric] = False
        for name in names:
            out["rows"][name][metric] = rows[name][metric] if name in rows else None
            out["stds"][name][metric] = stds[name][metric] if name in stds else None
            if name in samples:
                out["samples"][name][metric] = samples[name][metric]
    out["extra"].setdefault("seeds", {})[family] = {
        "train_seeds": [cfg.seed + s for s in per_seed],
        "meta_training": {
            str(cfg.seed + s): {
                f"{k}_{key}": tr[k]["seconds"] if key == "seconds" else tr[k]["selection"].get(key)
                for k in ("full", "f_only") for key in ("seconds", "best_step")
            }
            for s, tr in sorted(reseeded.items())
        },
    }  # fmt: skip
    ab, fo = samples["auxbo"][f"{p}seed_regret_at_10"], samples["f_only"][f"{p}seed_regret_at_10"]
    out["notes"].append(
        f"{family}: aux-BO and f-only meta-trained with {len(per_seed)} seed(s) "
        f"({', '.join(str(cfg.seed + s) for s in per_seed)}) on the same tasks; "
        f"{p}seed_regret_at_k is the regret averaged over the {len(test)} held-out tasks, per "
        "seed (the row: mean ± std over seeds; seed 0's is the run every other figure comes "
        f"from); at 10 evaluations aux-BO {', '.join(f'{v:.4f}' for v in ab)}, f-only "
        f"{', '.join(f'{v:.4f}' for v in fo)}"
    )


def run_experiments(cfg: AuxBOConfig, workdir: Path) -> ResultsTable:
    t0 = time.time()
    names = systems(cfg)
    out: dict[str, Any] = {
        "rows": {s: {} for s in names}, "stds": {s: {} for s in names},
        "samples": {s: {} for s in names}, "metrics": {}, "notes": [], "measured": [],
        "extra": {"curves": {}, "pvalues": {}, "prediction": {}, "meta_training": {}},
    }  # fmt: skip
    for family in cfg.families:
        _family(cfg, family, names, out)
    notes = out["notes"] + [
        "regret = (f* − best so far)/(f* − f_min) per task, mean over held-out tasks; ± is the "
        "standard error over tasks; nll_ctx5 in nats per target on z-scored f (family stats), "
        "context 5, held-out targets; metrics prefixed lc_ are mini-LCBench (scikit-learn MLP "
        "runs), unprefixed the synthetic family."
    ]
    _plot_curves(out["extra"]["curves"], names, workdir / "regret_curves.png")
    # meta-training seeds of the seeded rows (aux-BO, f-only); every other row has one
    seeds = max(_train_seeds(cfg, family) for family in cfg.families)
    return ResultsTable(
        method="auxbo", preset=cfg.preset, seeds=seeds, metrics=out["metrics"], rows=out["rows"],
        stds=out["stds"], samples=out["samples"], runtime_s=time.time() - t0,
        notes=notes + out["measured"], extra=out["extra"],
    )  # fmt: skip


def _control_pvalues(regrets: dict[str, np.ndarray], kk10: int) -> dict[str, float]:
    """Two-sided paired p at 10 evaluations: each control against f-only, h_shuffle/h_set."""
    ctrl_pv = {
        f"{c}_vs_f_only@10": _wilcoxon(
            regrets[c][:, kk10], regrets["f_only"][:, kk10], alternative="two-sided"
        )
        for c in ("h_shuffle", "h_cross", "h_set")
        if c in regrets
    }
    if "h_set" in regrets:
        ctrl_pv["h_shuffle_vs_h_set@10"] = _wilcoxon(
            regrets["h_shuffle"][:, kk10], regrets["h_set"][:, kk10], alternative="two-sided"
        )
    return ctrl_pv


def _measured(family, rows, p, pred, pv, ctrl_pv, info, has_h_set) -> list[str]:
    """The controls' figures, one note each (the claims in claims.py judge them)."""
    fo = rows["f_only"][f"{p}regret_at_10"]
    hs = rows["h_shuffle"][f"{p}regret_at_10"]
    ab = rows["auxbo"][f"{p}regret_at_10"]
    gap = fo - ab
    measured = [
        f"{family}: h-shuffle control at 10 (auxbo {ab:.3f}, h_shuffle {hs:.3f}, f_only "
        f"{fo:.3f}): removes {(hs - ab) / gap * 100 if gap > 0 else float('nan'):.0f} % of "
        f"aux-BO's advantage over f-only; h_shuffle is "
        f"{(hs - fo) / fo * 100 if fo else float('nan'):+.0f} % from f-only"
    ]
    hx = rows["h_cross"][f"{p}regret_at_10"]
    measured.append(
        f"{family}: cross-task control (h from another task) removes "
        f"{(hx - ab) / gap * 100 if gap > 0 else float('nan'):.0f} % of the advantage at 10 "
        f"(h_cross {hx:.3f}; p vs f-only, two-sided, {ctrl_pv['h_cross_vs_f_only@10']:.2g})"
    )
    measured.append(
        f"{family}: what a within-task shuffle leaves: from the mean h of n random designs "
        "of a task a ridge regression (fitted on the history tasks) predicts, on the "
        "held-out tasks, where the optimum lies with R² "
        + " / ".join(f"{v:.2f}" for v in info["optimum"].values())
        + " and which designs are good (the task's standardised f) with R² "
        + " / ".join(f"{v:.2f}" for v in info["profile"].values())
        + f" at n = {' / '.join(str(n) for n in info['optimum'])}"
    )
    if has_h_set:
        hset = rows["h_set"][f"{p}regret_at_10"]
        measured.append(
            f"{family}: set-only control (a TNP meta-trained and run on within-task "
            f"shuffled h) keeps {(fo - hset) / gap * 100 if gap > 0 else float('nan'):.0f} % "
            f"of aux-BO's advantage over f-only at 10 (h_set {hset:.3g}; p vs f-only "
            f"{ctrl_pv['h_set_vs_f_only@10']:.2g}, vs h_shuffle "
            f"{ctrl_pv['h_shuffle_vs_h_set@10']:.2g}, two-sided; aux-BO below it: p "
            f"{pv['h_set@10']:.2g} at 10, {pv['h_set@20']:.2g} at 20, one-sided)"
        )
    nll_gain = pred["f_only"][5]["nll"] - pred["auxbo"][5]["nll"]
    measured.append(
        f"{family}: NLL at context 5 full {pred['auxbo'][5]['nll']:.3f} vs f-only "
        f"{pred['f_only'][5]['nll']:.3f} (gain {nll_gain:.3f} nats)"
    )
    return measured


def _family_note(cfg, family, n_train, n, trained, pv) -> str:
    full, fonly = trained["full"], trained["f_only"]
    return (
        f"{family}: {n_train} history tasks, {n} held-out tasks; meta-training "
        f"{full['seconds']:.0f}s (full) / {fonly['seconds']:.0f}s (f-only)"
        + (f" / {trained['h_set']['seconds']:.0f}s (h-set)" if "h_set" in trained else "")
        + (
            f", steps kept by held-back NLL on {cfg.select_tasks} history tasks: full "
            f"{full['selection']['best_step']}, f-only {fonly['selection']['best_step']}"
            + (
                f", h-set {trained['h_set']['selection']['best_step']}"
                if "h_set" in trained
                else ""
            )
            + f" of {cfg.steps}"
            if full["selection"]
            else ""
        )
        + "; BO budget "
        f"{cfg.budget}, n_init {cfg.n_init}; paired one-sided Wilcoxon p (aux-BO lower): "
        + ", ".join(f"{k} {v:.2g}" for k, v in pv.items() if not k.endswith("@5"))
    )


def _plot_curves(curves: dict[str, list[float]], names: tuple[str, ...], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = sorted({k.split("/")[0] for k in curves})
    if not fams:
        return
    fig, axes = plt.subplots(1, len(fams), figsize=(5 * len(fams), 3.6), squeeze=False)
    for ax, fam in zip(axes[0], fams):
        for s in names:
            c = curves.get(f"{fam}/{s}")
            if c:
                ax.plot(np.arange(1, len(c) + 1), c, label=s, lw=2 if s == "auxbo" else 1)
        ax.set_yscale("log")
        ax.set_xlabel("evaluations")
        ax.set_ylabel("normalised simple regret")
        ax.set_title(fam)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
