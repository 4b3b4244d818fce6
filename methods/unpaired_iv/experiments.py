"""unpaired_iv's comparison: replications as Ray tasks, the table, the curve.

Every replication draws one data set (seeded by ``[seed, setting, replication]``) and runs every
estimator on it, so all rows are compared on identical replications. Replications are chunked
(``chunk_reps`` per task) and run as Ray tasks of one CPU on the platform's experiment runner
(:mod:`nshot.experiment`):

* env_large and env_small (the table), the low-rank variant (reported only);
* the consistency curve: d = 1, r = ``curve_r``, m ∈ ``curve_ms``, ``curve_reps`` each;
* the Card (1995) sanity check: ``card_splits`` random half splits (reported only).

Rows: ``crossfold_gmm`` (SplitUP, K folds, H splits), ``crossfold_gmm_l1``, ``two_sample_2sls``,
``oracle_paired_2sls``. Further estimators in ``extra``: the analytic H → ∞ form, the estimated
optimal weights, the ℓ1 fit with λ chosen on held-out environments, the same lasso on the two-
sample moments, the unpaired split-sample IV, and the paired jackknife IV and LIML (oracles).
The paper's claims over these results are declared in ``claims.py``; nothing here decides pass
or fail.
"""

from __future__ import annotations

import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from nshot.experiment import Job, run_jobs
from nshot.method import ResultsTable

from . import estimators as E
from .config import UnpairedIVConfig
from .data import Replication, card_split, generate

ROWS = ("crossfold_gmm", "crossfold_gmm_l1", "two_sample_2sls", "oracle_paired_2sls")
METRICS: dict[str, bool] = {
    "rmse_env_large": False,
    "bias_env_large": False,
    "rmse_env_small": False,
    "support_f1": True,
}
CURVE_ROWS = (
    "crossfold_gmm",
    "two_sample_2sls",
    "oracle_paired_2sls",
    "split_sample_iv",
    "jive_paired",
)
SETTING_IDS = {"env_large": 1, "env_small": 2, "low_rank": 3}


# --------------------------------------------------------------------------- one replication


def _fit_dict(fit: E.Fit | None) -> dict[str, Any]:
    if fit is None:
        return {"beta": None}
    return {
        "beta": np.asarray(fit.beta, float),
        "se": None if fit.se is None else np.asarray(fit.se, float),
        "support": None if fit.support is None else np.asarray(fit.support, np.int64),
        "cond": float(fit.cond),
        "lam": fit.lam,
    }


def _dense(mom: E.Moments) -> E.Fit | None:
    try:
        return E.solve_dense(mom)
    except E.EstimationError:
        return None


def estimate_all(
    prep: E.Prepared, cfg: UnpairedIVConfig, rng: np.random.Generator, sparse: bool = True
) -> dict[str, dict[str, Any]]:
    """Every estimator on one prepared replication: ``{name: {beta, se, support, cond, lam}}``."""
    out: dict[str, E.Fit | None] = {}
    mom = E.crossfold_moments(prep, cfg.folds, cfg.repeats, cfg.analytic, cfg.weight, rng)
    out["crossfold_gmm"] = _dense(mom)
    alt = "split" if cfg.analytic else "analytic"
    out[f"crossfold_gmm_{alt}"] = _dense(
        E.crossfold_moments(prep, cfg.folds, cfg.repeats, not cfg.analytic, cfg.weight, rng)
    )
    other = "identity" if cfg.weight == "optimal" else "optimal"
    out[f"crossfold_gmm_{other}"] = _dense(
        E.crossfold_moments(prep, cfg.folds, cfg.repeats, cfg.analytic, other, rng)
    )
    if sparse:
        lam = cfg.lam(prep.n_x)
        kw = dict(threshold=cfg.refit_threshold, psd_eps=cfg.psd_eps, tol=cfg.cd_tol)
        out["crossfold_gmm_l1"] = E.solve_l1(mom, lam, **kw)
        lam_sel = E.select_lambda(
            prep, cfg.folds, cfg.repeats, cfg.analytic, rng, cfg.refit_threshold, cfg.psd_eps
        )
        out["crossfold_gmm_l1_select"] = E.solve_l1(mom, lam_sel, **kw)
        out["two_sample_l1"] = E.solve_l1(E.two_sample_moments(prep), lam, se=False, **kw)
    out["two_sample_2sls"] = E.Fit(E.two_sample_2sls(prep))
    out["split_sample_iv"] = E.Fit(E.split_sample_iv(prep, rng))
    if prep.x_latent is not None:
        out["oracle_paired_2sls"] = E.Fit(E.oracle_paired_2sls(prep))
        out["jive_paired"] = E.Fit(E.jive_paired(prep))
        out["liml_paired"] = E.Fit(E.liml_paired(prep))
    return {k: _fit_dict(v) for k, v in out.items()}


def replication(cfg: UnpairedIVConfig, setting: str, rep: int) -> Replication:
    """Replication ``rep`` of a named setting (env_large, env_small, low_rank, curve_<m>)."""
    if setting.startswith("curve_"):
        m = int(setting.split("_", 1)[1])
        rng = np.random.default_rng([cfg.seed, 7, m, rep])
        return generate(
            m, cfg.curve_r, 1, 1, rng, beta_value=cfg.beta_value, confounding=cfg.confounding
        )
    rng = np.random.default_rng([cfg.seed, SETTING_IDS[setting], rep])
    m, r = cfg.env_small if setting == "env_small" else cfg.env_large
    rank = cfg.low_rank_k if setting == "low_rank" else cfg.rank
    return generate(
        m,
        r,
        cfg.d,
        cfg.s_star,
        rng,
        beta_value=cfg.beta_value,
        confounding=cfg.confounding,
        rank=rank,
        loading_seed=cfg.seed,
    )


def run_chunk(cfg_dict: dict[str, Any], setting: str, reps: list[int]) -> list[dict[str, Any]]:
    """Ray task body: the replications ``reps`` of ``setting``, every estimator on each."""
    cfg = UnpairedIVConfig.validated(cfg_dict)
    out = []
    for rep in reps:
        data = replication(cfg, setting, rep)
        prep = E.prepare(data.x_env, data.x, data.y_env, data.y, data.x_latent)
        rng = np.random.default_rng([cfg.seed, 11, zlib.crc32(setting.encode()), rep])
        res = estimate_all(prep, cfg, rng, sparse=not setting.startswith("curve_"))
        out.append({"rep": rep, "beta_star": data.beta, "fits": res})
    return out


def run_card_chunk(cfg_dict: dict[str, Any], splits: list[int]) -> list[dict[str, float]]:
    """Ray task body: Card (1995) made unpaired by random half splits."""
    from .data import card_frame

    cfg = UnpairedIVConfig.validated(cfg_dict)
    frame = card_frame()
    out = []
    for s in splits:
        rng = np.random.default_rng([cfg.seed, 31, s])
        data = card_split(rng, frame)
        prep = E.prepare(data.x_env, data.x, data.y_env, data.y, data.x_latent)
        mom = E.crossfold_moments(prep, cfg.folds, cfg.repeats, False, "identity", rng)
        fit = E.solve_dense(mom)
        out.append(
            {
                "crossfold_gmm": float(fit.beta[0]),
                "crossfold_gmm_se": float(fit.se[0]),
                "crossfold_gmm_analytic": float(
                    E.solve_dense(E.crossfold_moments(prep, analytic=True), se=False).beta[0]
                ),
                "two_sample_2sls": float(E.two_sample_2sls(prep)[0]),
                "oracle_paired_2sls_half": float(E.oracle_paired_2sls(prep)[0]),
            }
        )
    return out


# --------------------------------------------------------------------------- aggregation


def _stack(results: list[dict[str, Any]], name: str) -> np.ndarray:
    """(R, d) estimates of ``name`` (rows of NaN where it was not identified)."""
    d = len(results[0]["beta_star"])
    rows = []
    for r in results:
        b = r["fits"].get(name, {}).get("beta")
        rows.append(np.full(d, np.nan) if b is None else b)
    return np.array(rows)


def summarize_setting(results: list[dict[str, Any]], cfg: UnpairedIVConfig) -> dict[str, Any]:
    """Per estimator: rmse, bias, ℓ1 error, support F1, exact-support rate, se coverage."""
    beta = np.asarray(results[0]["beta_star"], float)
    true = beta != 0
    thr = 0.5 * np.min(np.abs(beta[true]))
    names = sorted({k for r in results for k in r["fits"]})
    out: dict[str, Any] = {}
    for name in names:
        b = _stack(results, name)
        ok = ~np.isnan(b).any(1)
        if not ok.any():
            out[name] = {"identified": 0.0}
            continue
        bb = b[ok]
        err = np.linalg.norm(bb - beta, axis=1)
        l1 = np.abs(bb - beta).sum(1)
        sparse = results[0]["fits"][name].get("support") is not None
        f1, exact = [], []
        for i, r in enumerate(results):
            if not ok[i]:
                continue
            fit = r["fits"][name]
            if sparse:
                pred = np.zeros(len(beta), bool)
                pred[fit["support"]] = True
            else:
                pred = np.abs(fit["beta"]) > thr
            f1.append(E.support_f1(pred, true))
            exact.append(float(np.array_equal(pred, true)))
        s: dict[str, Any] = {
            "rmse": float(np.sqrt(np.mean(err**2))),
            "rmse_std": float(np.std(err, ddof=1)) if len(err) > 1 else None,
            "bias": float(np.linalg.norm(bb.mean(0) - beta)),
            "l1_error": float(l1.mean()),
            "support_f1": float(np.mean(f1)),
            "support_f1_std": float(np.std(f1, ddof=1)) if len(f1) > 1 else None,
            "exact_support": float(np.mean(exact)),
            "identified": float(ok.mean()),
            "mean_beta_support": float(bb[:, true].mean()),
        }
        ses = [r["fits"][name].get("se") for i, r in enumerate(results) if ok[i]]
        if all(x is not None for x in ses):
            se = np.array(ses)
            if sparse:  # coverage on the true support (zero se off the selected support)
                cov = (np.abs(bb - beta) <= 1.96 * se)[:, true]
            else:
                cov = np.abs(bb - beta) <= 1.96 * se
            s["se_coverage_95"] = float(cov.mean())
            s["se_mean"] = float(se[:, true].mean())
            s["sd_estimate"] = (
                float(bb[:, true].std(ddof=1, axis=0).mean()) if len(bb) > 1 else None
            )
        conds = [r["fits"][name].get("cond") for r in results]
        if all(c is not None and np.isfinite(c) for c in conds):
            s["cond_cxx_median"] = float(np.median(conds))
        out[name] = s
    return out


def summarize_curve(results: list[dict[str, Any]], cfg: UnpairedIVConfig) -> dict[str, Any]:
    beta = float(results[0]["beta_star"][0])
    out: dict[str, Any] = {}
    for name in sorted({k for r in results for k in r["fits"]}):
        b = _stack(results, name)[:, 0]
        b = b[~np.isnan(b)]
        if not b.size:
            continue
        s = {
            "mae": float(np.mean(np.abs(b - beta))),
            "mean_beta": float(b.mean()),
            "sd_beta": float(b.std(ddof=1)) if b.size > 1 else None,
        }
        ses = [r["fits"][name].get("se") for r in results]
        if all(x is not None for x in ses):
            se = np.array([x[0] for x in ses])
            allb = _stack(results, name)[:, 0]
            s["se_coverage_95"] = float(np.mean(np.abs(allb - beta) <= 1.96 * se))
        out[name] = s
    return out


def predicted_limits(cfg: UnpairedIVConfig) -> dict[str, float]:
    """Probability limits for d = 1 (γ = 1, Q = 1, σ²_{X|e} = γ² + 1) at r = curve_r: two-sample
    2SLS attenuated, paired 2SLS biased by the confounding, SplitUP at β*."""
    r, c, b = cfg.curve_r, cfg.confounding, cfg.beta_value
    sigma2 = 2.0
    return {
        "two_sample_2sls": b * 1.0 / (1.0 + sigma2 / r),
        "oracle_paired_2sls": b + (c / r) / (1.0 + sigma2 / r),
        "crossfold_gmm": b,
    }


# --------------------------------------------------------------------------- the comparison


def _chunks(n: int, size: int) -> list[list[int]]:
    return [list(range(i, min(n, i + size))) for i in range(0, n, size)]


def run_experiments(cfg: UnpairedIVConfig, workdir: Path) -> ResultsTable:
    t0 = time.time()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    c = cfg.model_dump()
    settings_run = ["env_large", "env_small"] + (["low_rank"] if cfg.low_rank_k else [])
    # the curve's large-m points first: they are the longest tasks
    runs = [(f"curve_{m}", cfg.curve_reps) for m in sorted(cfg.curve_ms, reverse=True)]
    runs += [(s, cfg.replications) for s in settings_run]
    jobs = [
        Job((name, i), run_chunk, (c, name, reps))
        for name, total in runs
        for i, reps in enumerate(_chunks(total, cfg.chunk_reps))
    ]
    card_chunks = _chunks(cfg.card_splits, max(cfg.card_splits // 4, 1))
    jobs += [Job(("card", i), run_card_chunk, (c, sp)) for i, sp in enumerate(card_chunks)]
    done = run_jobs(jobs, description=f"unpaired_iv {cfg.preset}: {len(jobs)} chunks")
    results: dict[str, list[dict[str, Any]]] = {}
    for (name, _), part in done.items():  # chunks in replication order
        results.setdefault(name, []).extend(part)
    settings = {s: summarize_setting(results[s], cfg) for s in settings_run}
    curve = {m: summarize_curve(results[f"curve_{m}"], cfg) for m in sorted(cfg.curve_ms)}
    rows, stds, samples = _table(settings, results)
    extra = _extra(cfg, settings, curve, results.get("card", []))
    _plot_curve(curve, cfg, workdir / "curve.png")
    return ResultsTable(
        method="unpaired_iv",
        preset=cfg.preset,
        seeds=cfg.replications,
        metrics=METRICS,
        rows=rows,
        stds=stds,
        runtime_s=time.time() - t0,
        notes=_notes(cfg, len(jobs)),
        extra=extra,
        samples=samples,
    )


def _table(settings: dict[str, Any], results: dict[str, list[dict[str, Any]]]) -> tuple:
    """``(rows, stds, samples)`` of the four rows on env_large and env_small. ``samples`` holds
    per replication the error ‖β̂_r − β*‖ (rmse columns) and the support F1 (None where the
    estimator was not identified), paired across rows by replication."""
    rows: dict[str, dict[str, float | None]] = {}
    stds: dict[str, dict[str, float | None]] = {}
    samples: dict[str, dict[str, list[float | None]]] = {}
    L, S = settings["env_large"], settings["env_small"]
    for name in ROWS:
        rows[name] = {
            "rmse_env_large": L[name].get("rmse"),
            "bias_env_large": L[name].get("bias"),
            "rmse_env_small": S[name].get("rmse"),
            "support_f1": L[name].get("support_f1"),
        }
        stds[name] = {
            "rmse_env_large": L[name].get("rmse_std"),
            "bias_env_large": None,
            "rmse_env_small": S[name].get("rmse_std"),
            "support_f1": L[name].get("support_f1_std"),
        }
        large = per_replication(results["env_large"], name)
        samples[name] = {
            "rmse_env_large": large["error"],
            "rmse_env_small": per_replication(results["env_small"], name)["error"],
            "support_f1": large["support_f1"],
        }
    return rows, stds, samples


def per_replication(results: list[dict[str, Any]], name: str) -> dict[str, list[float | None]]:
    """The error ‖β̂_r − β*‖ and support F1 of ``name`` in every replication (None where it was
    not identified); the support of a dense fit is |β̂_j| > 0.5·min|β*_S|, as in the table."""
    beta = np.asarray(results[0]["beta_star"], float)
    true = beta != 0
    thr = 0.5 * np.min(np.abs(beta[true]))
    out: dict[str, list[float | None]] = {"error": [], "support_f1": []}
    for r in results:
        fit = r["fits"].get(name, {})
        b = fit.get("beta")
        if b is None or np.isnan(b).any():
            out["error"].append(None)
            out["support_f1"].append(None)
            continue
        if fit.get("support") is not None:
            pred = np.zeros(len(beta), bool)
            pred[fit["support"]] = True
        else:
            pred = np.abs(b) > thr
        out["error"].append(float(np.linalg.norm(b - beta)))
        out["support_f1"].append(float(E.support_f1(pred, true)))
    return out


def _extra(
    cfg: UnpairedIVConfig,
    settings: dict[str, Any],
    curve: dict[int, Any],
    card_res: list[dict[str, float]],
) -> dict[str, Any]:
    L = settings["env_large"]
    extra: dict[str, Any] = {
        "settings": settings,
        "curve": {
            "d": 1,
            "r": cfg.curve_r,
            "reps": cfg.curve_reps,
            "m": sorted(cfg.curve_ms),
            "predicted_limits": predicted_limits(cfg),
            "points": {str(m): v for m, v in curve.items()},
        },
        "l1_error": {name: L[name].get("l1_error") for name in L},
        "exact_support_rate_l1": L["crossfold_gmm_l1"]["exact_support"],
    }
    if card_res:
        from .data import card_paired_iv2sls

        arr = {k: np.array([c[k] for c in card_res]) for k in card_res[0]}
        extra["card"] = {
            "splits": len(card_res),
            **{k: {"mean": float(v.mean()), "sd": float(v.std(ddof=1))} for k, v in arr.items()},
            "paired_iv2sls_all_rows": card_paired_iv2sls(),
        }
    extra["markdown"] = _markdown(cfg, settings, curve, extra.get("card"))
    return extra


def _notes(cfg: UnpairedIVConfig, n_tasks: int) -> list[str]:
    return [
        f"Generator (many environments, hidden confounder): d = {cfg.d}, s* = {cfg.s_star}, β*_j = {cfg.beta_value:g} on the "
        f"support, confounding {cfg.confounding:g}; env_large (m, r) = {tuple(cfg.env_large)}, "
        f"env_small = {tuple(cfg.env_small)} (r units per environment in each sample); "
        f"{cfg.replications} replications per setting, every estimator on identical data.",
        f"crossfold_gmm = SplitUP with K = {cfg.folds} folds, H = {cfg.repeats} splits, W = "
        f"{cfg.weight}{', analytic C_XX' if cfg.analytic else ''}; crossfold_gmm_l1: λ = "
        f"{cfg.lam_c:g}·2/√ñ, coordinate descent on the PSD-projected C_XX, refit on the support; "
        "oracle_paired_2sls sees the Y-sample's latent X (paired data no unpaired method sees).",
        "rmse = sqrt(mean_r ‖β̂_r − β*‖²); bias = ‖mean_r β̂_r − β*‖ (includes Monte Carlo noise ≈ "
        "rmse/√R); ± on rmse columns is the std over replications of ‖β̂_r − β*‖, on support_f1 "
        "the std over replications; support of dense rows: |β̂_j| > 0.5·min|β*_S|.",
        f"Replications ran as {n_tasks} Ray tasks (num_cpus=1, {cfg.chunk_reps} replications "
        f"each); consistency curve in curve.png and extra.curve.",
    ]


# --------------------------------------------------------------------------- report


def _f(v: Any, fmt: str = ".4f") -> str:
    return "n/a" if v is None or (isinstance(v, float) and not np.isfinite(v)) else format(v, fmt)


def _markdown(
    cfg: UnpairedIVConfig,
    settings: dict[str, Any],
    curve: dict[int, Any],
    card: dict[str, Any] | None,
) -> str:
    lim = predicted_limits(cfg)
    md = [
        f"## Consistency curve (d = 1, r = {cfg.curve_r}, {cfg.curve_reps} replications per m)",
        "",
        "MAE = mean |β̂ − β*| (β* = 1); mean = mean β̂. Predicted limits: two-sample "
        f"{lim['two_sample_2sls']:.3f}, paired 2SLS {lim['oracle_paired_2sls']:.3f}. "
        "se cov. = coverage of β* by the crossfold 95 % interval β̂ ± 1.96 se.",
        "",
        "| m | " + " | ".join(f"{n} MAE | {n} mean" for n in CURVE_ROWS) + " | se cov. |",
        "|---|" + "---|---|" * len(CURVE_ROWS) + "---|",
    ]
    for m in sorted(curve):
        c = curve[m]
        cells = []
        for n in CURVE_ROWS:
            cells += [_f(c.get(n, {}).get("mae")), _f(c.get(n, {}).get("mean_beta"))]
        cov = c.get("crossfold_gmm", {}).get("se_coverage_95")
        md.append(f"| {m} | " + " | ".join(cells) + f" | {_f(cov, '.2f')} |")
    for s, res in settings.items():
        md += [
            "",
            f"## All estimators, {s}",
            "",
            "| estimator | rmse | bias | ℓ1 error | support F1 | exact support | se coverage |",
            "|---|---|---|---|---|---|---|",
        ]
        for n, v in res.items():
            md.append(
                f"| {n} | {_f(v.get('rmse'))} | {_f(v.get('bias'))} | {_f(v.get('l1_error'))} | "
                f"{_f(v.get('support_f1'), '.3f')} | {_f(v.get('exact_support'), '.2f')} | "
                f"{_f(v.get('se_coverage_95'), '.3f')} |"
            )
    if card:
        p = card["paired_iv2sls_all_rows"]
        md += [
            "",
            f"## Card (1995), made unpaired ({card['splits']} random half splits; instrument "
            "nearc4, two environments)",
            "",
            "| estimator | mean | sd over splits |",
            "|---|---|---|",
        ]
        for k in ("crossfold_gmm", "crossfold_gmm_analytic", "two_sample_2sls"):
            md.append(f"| {k} | {card[k]['mean']:.3f} | {card[k]['sd']:.3f} |")
        md.append(
            f"| paired IV2SLS, all rows (linearmodels) | {p['beta']:.3f} | robust se "
            f"{p['se']:.3f} |"
        )
    return "\n".join(md)


def _plot_curve(curve: dict[int, Any], cfg: UnpairedIVConfig, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = sorted(curve)
    lim = predicted_limits(cfg)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for n in CURVE_ROWS:
        mae = [curve[m].get(n, {}).get("mae", np.nan) for m in ms]
        mean = [curve[m].get(n, {}).get("mean_beta", np.nan) for m in ms]
        lw = 2.2 if n == "crossfold_gmm" else 1.0
        axes[0].plot(ms, mae, "o-", lw=lw, label=n)
        axes[1].plot(ms, mean, "o-", lw=lw, label=n)
    if len(ms) > 1:
        ref = curve[ms[0]].get("crossfold_gmm", {}).get("mae")
        if ref:
            xs = np.array(ms, float)
            axes[0].plot(xs, ref * np.sqrt(xs[0] / xs), "k:", lw=0.8, label="∝ 1/√m")
    axes[0].set_xscale("log")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("environments m")
    axes[0].set_ylabel("mean |β̂ − β*|")
    axes[0].set_title(f"error (d = 1, r = {cfg.curve_r})", fontsize=9)
    axes[0].legend(fontsize=7)
    for k, style in (
        ("crossfold_gmm", "-"),
        ("two_sample_2sls", "--"),
        ("oracle_paired_2sls", "-."),
    ):
        axes[1].axhline(lim[k], color="grey", lw=0.7, ls=style)
    axes[1].set_xscale("log")
    axes[1].set_xlabel("environments m")
    axes[1].set_ylabel("mean β̂ (β* = 1; grey: predicted limits)")
    axes[1].set_title("mean estimate", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
