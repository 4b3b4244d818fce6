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
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

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
    cfg_dict: dict[str, Any], family: str, use_h: bool, h_shuffle: bool = False
) -> dict[str, Any]:
    import torch

    from .method import AuxBOConfig, load_family, meta_train
    from .model import family_stats

    torch.set_num_threads(1)
    cfg = AuxBOConfig.validated(cfg_dict)
    train, _, _ = load_family(cfg, family)
    stats = family_stats(train)
    t0 = time.time()
    selection: dict[str, Any] = {}
    model, losses = meta_train(
        cfg,
        train,
        stats,
        use_h,
        progress=f"{family} {'h-set' if h_shuffle else 'full' if use_h else 'f-only'}",
        selection=selection,
        h_shuffle=h_shuffle,
    )
    return {
        "selection": selection,
        "state": {k: v.numpy() for k, v in model.state_dict().items()},
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
    import torch

    from . import bo

    torch.set_num_threads(1)
    cfg: AuxBOConfig = ctx["cfg"]
    out = []
    for i, task in enumerate(tasks):
        prop = _proposer(system, ctx)  # fresh per task: no state leaks between tasks
        best = bo.run_bo(task, prop, cfg.budget, cfg.n_init, seed=cfg.seed * 100_003 + offset + i)
        out.append(bo.simple_regret(task, best))
    return out


def gp_nll(tasks: list[Any], n_ctx: int, m_targets: int, stats: dict[str, Any], seed: int) -> float:
    """Per-task GP (SingleTaskGP, fitted on n_ctx z-scored points) NLL on held-out targets."""
    import torch
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from gpytorch.mlls import ExactMarginalLogLikelihood

    from .model import gaussian_nll

    torch.set_num_threads(1)
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


def _wilcoxon(a: np.ndarray, b: np.ndarray, alternative: str = "less") -> float:
    """Paired Wilcoxon signed-rank p; by default one-sided, that ``a`` (aux-BO regret) is lower
    than ``b``."""
    from scipy.stats import wilcoxon

    d = np.asarray(a) - np.asarray(b)
    if np.all(d == 0):
        return 1.0
    return float(wilcoxon(a, b, alternative=alternative, zero_method="zsplit").pvalue)


def run_experiments(cfg: AuxBOConfig, workdir: Path) -> ResultsTable:
    import ray

    from nshot.train.runner import ensure_ray

    from .method import load_family
    from .model import evaluate_prediction

    t0 = time.time()
    ensure_ray()
    cfg_dict = cfg.model_dump()
    train_remote = ray.remote(num_cpus=1)(_train_model)
    chunk_remote = ray.remote(num_cpus=1)(_bo_chunk)
    row_names = systems(cfg)
    rows: dict[str, dict[str, float | None]] = {s: {} for s in row_names}
    stds: dict[str, dict[str, float | None]] = {s: {} for s in row_names}
    metrics: dict[str, bool] = {}
    notes: list[str] = []
    extra: dict[str, Any] = {"curves": {}, "pvalues": {}, "prediction": {}, "meta_training": {}}
    measured: list[str] = []  # the controls' figures, one note each
    for family in cfg.families:
        p = PREFIX[family]
        for k in (5, 10, 20):
            metrics[f"{p}regret_at_{k}"] = False
        metrics[f"{p}nll_ctx5"] = False
        train, test, _ = load_family(cfg, family)
        test = test[: cfg.bo_tasks if family == "synthetic" else cfg.lcbench_bo_tasks]
        _log(f"{family}: {len(train)} history tasks, {len(test)} held-out tasks; meta-training")
        jobs = {
            "full": train_remote.remote(cfg_dict, family, True),
            "f_only": train_remote.remote(cfg_dict, family, False),
        }
        if cfg.h_set_control:
            jobs["h_set"] = train_remote.remote(cfg_dict, family, True, True)
        trained = dict(zip(jobs, ray.get(list(jobs.values()))))
        full, fonly = trained["full"], trained["f_only"]
        extra["meta_training"][family] = {
            f"{name}_{key}": tr[key]
            for name, tr in trained.items()
            for key in ("seconds", "losses", "selection")
        }
        # ---- prediction
        stats = full["stats"]
        sizes = (1, 2, 5, 10, 20)
        m = min(cfg.m_targets, min(len(t.f) for t in test) - max(sizes))
        pred = {
            "auxbo": evaluate_prediction(_model(full), test, sizes, m, stats, seed=cfg.seed),
            "f_only": evaluate_prediction(_model(fonly), test, sizes, m, stats, seed=cfg.seed),
            "h_shuffle": evaluate_prediction(
                _model(full), test, sizes, m, stats, seed=cfg.seed, h_shuffle=True
            ),
            "h_cross": evaluate_prediction(
                _model(full), test, sizes, m, stats, seed=cfg.seed, h_pool=train
            ),
        }
        if cfg.h_set_control:
            pred["h_set"] = evaluate_prediction(
                _model(trained["h_set"]), test, sizes, m, stats, seed=cfg.seed, h_shuffle=True
            )
        extra["prediction"][family] = {
            s: {str(n): v for n, v in r.items()} for s, r in pred.items()
        }
        _log(
            f"{family}: NLL at context 5: full {pred['auxbo'][5]['nll']:.3f}, f-only "
            f"{pred['f_only'][5]['nll']:.3f}, h-shuffle {pred['h_shuffle'][5]['nll']:.3f}, "
            f"h-cross {pred['h_cross'][5]['nll']:.3f}"
            + (f", h-set {pred['h_set'][5]['nll']:.3f}" if "h_set" in pred else "")
        )
        for s in pred:
            rows[s][f"{p}nll_ctx5"] = pred[s][5]["nll"]
        rows["gp_ei"][f"{p}nll_ctx5"] = gp_nll(test, 5, m, stats, cfg.seed)
        for s in ("multitask_gp", "optuna_tpe", "random"):
            rows[s][f"{p}nll_ctx5"] = None
        # ---- BO
        ctx = {"cfg": cfg, "history": train, **trained}
        ctx_ref = ray.put(ctx)
        chunk = max(1, int(np.ceil(len(test) / 8)))
        refs: dict[str, list[Any]] = {}
        for s in row_names:
            refs[s] = [
                chunk_remote.remote(s, ctx_ref, test[i : i + chunk], i)
                for i in range(0, len(test), chunk)
            ]
        regrets: dict[str, np.ndarray] = {}
        for s in row_names:
            t1 = time.time()
            regrets[s] = np.stack([r for part in ray.get(refs[s]) for r in part])
            _log(f"{family}: {s} done (waited {time.time() - t1:.0f}s)")
        n = len(test)
        for s in row_names:
            for k in (5, 10, 20):
                kk = min(k, cfg.budget)
                col = regrets[s][:, kk - 1]
                rows[s][f"{p}regret_at_{k}"] = float(col.mean())
                stds[s][f"{p}regret_at_{k}"] = (
                    float(col.std(ddof=1) / np.sqrt(n)) if n > 1 else None
                )
            extra["curves"][f"{family}/{s}"] = regrets[s].mean(0).tolist()
            extra.setdefault("task_regrets", {}).setdefault(
                family, {"tasks": [t.name for t in test]}
            )
            extra["task_regrets"][family][s] = regrets[s].tolist()  # per task and evaluation
        pv = {}
        for s in row_names[1:]:
            for k in (5, 10, 20):
                kk = min(k, cfg.budget)
                pv[f"{s}@{k}"] = _wilcoxon(regrets["auxbo"][:, kk - 1], regrets[s][:, kk - 1])
        extra["pvalues"][family] = pv
        kk10 = min(10, cfg.budget) - 1
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
        extra.setdefault("control_pvalues", {})[family] = ctrl_pv
        pv_cross = ctrl_pv["h_cross_vs_f_only@10"]
        # ---- the controls' figures (the claims in claims.py judge them; nothing here does)
        fo = rows["f_only"][f"{p}regret_at_10"]
        hs = rows["h_shuffle"][f"{p}regret_at_10"]
        ab = rows["auxbo"][f"{p}regret_at_10"]
        gap = fo - ab
        measured.append(
            f"{family}: h-shuffle control at 10 (auxbo {ab:.3f}, h_shuffle {hs:.3f}, f_only "
            f"{fo:.3f}): removes {(hs - ab) / gap * 100 if gap > 0 else float('nan'):.0f} % of "
            f"aux-BO's advantage over f-only; h_shuffle is "
            f"{(hs - fo) / fo * 100 if fo else float('nan'):+.0f} % from f-only"
        )
        hx = rows["h_cross"][f"{p}regret_at_10"]
        measured.append(
            f"{family}: cross-task control (h from another task) removes "
            f"{(hx - ab) / gap * 100 if gap > 0 else float('nan'):.0f} % of the advantage at 10 "
            f"(h_cross {hx:.3f}; p vs f-only, two-sided, {pv_cross:.2g})"
        )
        info = set_information(train, test, seed=cfg.seed)
        extra.setdefault("set_information", {})[family] = {
            name: {str(n): v for n, v in r2.items()} for name, r2 in info.items()
        }
        measured.append(
            f"{family}: what a within-task shuffle leaves: from the mean h of n random designs "
            "of a task a ridge regression (fitted on the history tasks) predicts, on the "
            "held-out tasks, where the optimum lies with R² "
            + " / ".join(f"{v:.2f}" for v in info["optimum"].values())
            + " and which designs are good (the task's standardised f) with R² "
            + " / ".join(f"{v:.2f}" for v in info["profile"].values())
            + f" at n = {' / '.join(str(n) for n in info['optimum'])}"
        )
        if "h_set" in regrets:
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
        notes.append(
            f"{family}: {len(train)} history tasks, {n} held-out tasks; meta-training "
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
    notes.append(
        "regret = (f* − best so far)/(f* − f_min) per task, mean over held-out tasks; ± is the "
        "standard error over tasks; nll_ctx5 in nats per target on z-scored f (family stats), "
        "context 5, held-out targets; metrics prefixed lc_ are mini-LCBench (scikit-learn MLP "
        "runs), unprefixed the synthetic family."
    )
    notes += measured
    _plot_curves(extra["curves"], row_names, workdir / "regret_curves.png")
    return ResultsTable(
        method="auxbo",
        preset=cfg.preset,
        seeds=1,
        metrics=metrics,
        rows=rows,
        stds=stds,
        runtime_s=time.time() - t0,
        notes=notes,
        extra=extra,
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
