"""modhnn's comparison: modulations against HNN baselines.

Every (row, seed) is one job of :func:`nshot.experiment.run_jobs`, a Ray task declaring one CPU: it
builds the data (cached Parquet), trains its model and evaluates it on the unseen test instances:

* ``svd``, ``mr``, ``full_weight``, ``shift``, ``film``: a modulated HNN meta-trained with
  persistent latents, adapted per test instance by fitting only z from z_avg on 10 shots;
* ``mlp_modulated``: the non-structured control, the same SVD(r) modulation on an MLP that
  outputs (q̇, ṗ) directly, meta-trained and adapted the same way;
* ``hnn_pooled``: one HNN without modulation trained on all training instances (same schedule),
  evaluated as is (it cannot adapt);
* ``hnn_per_instance``: a fresh HNN per test instance trained on its 10 shots (Scratch);
* ``fomaml``, ``reptile``, ``anil``: the optimisation-based meta-learners (``optmeta.py``): the
  initial weights of the ``hnn_pooled`` network meta-learned by first-order MAML, Reptile or
  first-order ANIL (inner loop on the output layer) over the same instances and outer steps,
  then SGD on each test instance's 10 shots from them (one network per instance).

Ablations on the SVD model: zero instead of z_avg initialisation at test time (same
trained model), and latents reset every epoch (another meta-training). ``extra_systems`` repeats
``svd`` and ``hnn_pooled`` on further systems for the per-system figures. The paper's claims
over these rows are data (``claims.py``), evaluated by ``nshot reproduce``. Rows hold the mean
over seeds (n/a where a seed's value is not finite), ``stds`` the Bessel-corrected standard
deviation over seeds and ``samples`` the per-seed values.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from nshot.experiment import Job, aggregate, run_jobs
from nshot.method import ResultsTable

from .config import ModHNNConfig

METRICS = {"field_mse": False, "traj_mse": False, "energy_drift": False}
MODULATED = {"svd", "mr", "full_weight", "shift", "film", "concat"}
OPT_META = ("fomaml", "reptile", "anil")


def _log(msg: str) -> None:
    print(f"[modhnn] {msg}", file=sys.stderr, flush=True)


def run_row(
    cfg_dict: dict[str, Any], row: str, seed: int, system: str | None = None, variant: str = ""
) -> dict[str, Any]:
    """Train and evaluate one row for one seed (the body of a Ray task)."""
    import torch

    from .adapt import adapt_latent, evaluate_dynamics, shots_of, train_scratch
    from .data import load_splits
    from .systems import get_system
    from .train import meta_train

    cfg = ModHNNConfig.validated(cfg_dict)
    if variant == "reset_latents":
        cfg = cfg.replace(reset_latents=True)
    system = system or cfg.system
    seed = cfg.seed + seed
    train, test = load_splits(cfg, system)
    sx, sf = shots_of(test, cfg.shots)
    t0 = time.time()
    tag = f"{system}/{row}{'/' + variant if variant else ''}/seed{seed}"
    out: dict[str, Any] = {"row": row, "seed": seed, "system": system, "variant": variant}

    def progress(step: int, loss: float) -> None:
        if step % max(cfg.log_every, cfg.steps // 4) == 0 or step == cfg.steps:
            _log(f"{tag}: step {step}/{cfg.steps} L_symp {loss:.4g} ({time.time() - t0:.0f}s)")

    if row == "hnn_per_instance":
        bank, fits = train_scratch(cfg, sx, sf, get_system(system).dissipative, seed)
        out["train_s"] = time.time() - t0
        ev = evaluate_dynamics(cfg, test, [bank], None)
        out["fit_loss"] = float(np.mean(fits))
    elif row in OPT_META:
        from .optmeta import adapt_weights, meta_train_opt

        theta, curve = meta_train_opt(cfg, train, algo=row, seed=seed, progress=progress)
        out["train_s"] = time.time() - t0
        out["curve"] = curve
        adapted, before, after = adapt_weights(
            theta, torch.as_tensor(sx, dtype=torch.float32),
            torch.as_tensor(sf, dtype=torch.float32), algo=row, steps=cfg.test_inner_steps,
            lr=cfg.inner_lr, clip=cfg.inner_clip,
        )  # fmt: skip
        out["fit_loss"] = float(after.mean())
        out["fit_loss_before"] = float(before.mean())
        ev = evaluate_dynamics(cfg, test, [adapted], None)
    else:
        kind = "mlp" if row == "mlp_modulated" else "hnn"
        mod = "svd" if row == "mlp_modulated" else ("none" if row == "hnn_pooled" else row)

        state, curve = meta_train(
            cfg, train, kind=kind, modulation=mod, seed=seed, progress=progress
        )
        out["train_s"] = time.time() - t0
        out["curve"] = curve
        dyn = state.dyn
        X = torch.as_tensor(sx, dtype=torch.float32)
        F = torch.as_tensor(sf, dtype=torch.float32)
        z = None
        if dyn.uses_latent:
            inits = {"avg": state.z_avg()}
            if variant == "" and row == "svd" and "zero_init" in cfg.ablations:
                inits["zero"] = torch.zeros_like(inits["avg"])
            for name, z0 in inits.items():
                zz, fit = adapt_latent(
                    dyn, X, F, z0.expand(test.n_instances, -1), steps=cfg.adapt_steps,
                    lr=cfg.adapt_lr, lambda_z=cfg.lambda_z,
                )  # fmt: skip
                if name == "avg":
                    z, out["fit_loss"] = zz, float(fit.mean())
                else:
                    zev = evaluate_dynamics(cfg, test, [dyn], zz, keep_rollouts=0)
                    out["zero_init"] = zev.means()
            out["latent_norm"] = float(state.latents.norm(dim=-1).mean())
        ev = evaluate_dynamics(cfg, test, [dyn], z)
    out["eval"] = ev.per_instance
    out["means"] = ev.means()
    out["rollouts"] = ev.rollouts
    out["seconds"] = time.time() - t0
    _log(
        f"{tag}: field_mse {out['means']['field_mse']:.4g} traj_mse {out['means']['traj_mse']:.4g} "
        f"drift {out['means']['energy_drift']:.3g} ({out['seconds']:.0f}s)"
    )
    return out


# --------------------------------------------------------------------------- the comparison


def _jobs(cfg: ModHNNConfig) -> list[tuple[str, int, str, str]]:
    jobs: list[tuple[str, int, str, str]] = []
    for row in cfg.rows:
        jobs += [(row, s, cfg.system, "") for s in range(cfg.seeds)]
    if "reset_latents" in cfg.ablations and "svd" in cfg.rows:
        jobs += [("svd", s, cfg.system, "reset_latents") for s in range(cfg.ablation_seeds)]
    for system in cfg.extra_systems:
        if system == cfg.system:
            continue
        for row in ("svd", "hnn_pooled"):
            jobs += [(row, s, system, "") for s in range(cfg.seeds)]
    # meta-training first (the cheap per-instance baseline fills the gaps at the end)
    return sorted(jobs, key=lambda j: j[0] == "hnn_per_instance")


def _agg(values: list[float]) -> tuple[float | None, float | None]:
    arr = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if not len(arr) or not np.isfinite(arr).any():
        return None, None
    arr = arr[np.isfinite(arr)]
    return float(arr.mean()), (float(arr.std(ddof=1)) if len(arr) > 1 else None)


def run_experiments(cfg: ModHNNConfig, workdir: Path) -> ResultsTable:
    from .data import load_splits

    t0 = time.time()
    for system in dict.fromkeys([cfg.system, *cfg.extra_systems]):
        load_splits(cfg, system)  # generate and cache once, before the tasks read it
    cfg_dict = cfg.model_dump()
    jobs = _jobs(cfg)
    _log(
        f"{len(jobs)} Ray tasks: {', '.join(sorted({j[0] + ('/' + j[3] if j[3] else '') for j in jobs}))}"
    )
    results = run_jobs(
        [Job(job, run_row, (cfg_dict, *job), num_cpus=1, trains=True) for job in jobs],
        description=f"modhnn {cfg.preset}",
    )

    def pick(row: str, system: str = cfg.system, variant: str = "") -> list[dict[str, Any]]:
        sel = [r for r in results.values() if r["row"] == row and r["system"] == system]
        return sorted([r for r in sel if r["variant"] == variant], key=lambda r: r["seed"])

    per_seed = {
        (row, r["seed"]): {m: _finite(r["means"][m]) for m in METRICS}
        for row in cfg.rows
        for r in pick(row)
    }
    rows, stds, samples = aggregate(per_seed, spread="sample_std")
    extra = _extra(cfg, pick)
    examples = {row: pick(row)[0]["rollouts"] for row in cfg.rows if pick(row)}
    fig = workdir / "rollouts.png"
    _plot_rollouts(examples, extra["curves"], cfg, fig)
    extra["figures"]["rollouts"] = fig.name
    if extra["systems"]:
        sys_fig = workdir / "systems.png"
        _plot_systems({s: pick("svd", s)[0]["rollouts"] for s in extra["systems"]}, sys_fig)
        extra["figures"]["systems"] = sys_fig.name
    extra["markdown"] = _markdown(cfg, rows, extra)
    return ResultsTable(
        method="modhnn",
        preset=cfg.preset,
        seeds=cfg.seeds,
        metrics=dict(METRICS),
        rows=rows,
        stds=stds,
        samples=samples,
        runtime_s=time.time() - t0,
        notes=_notes(cfg),
        extra=extra,
    )


def _finite(v: float | None) -> float | None:
    """A seed's mean, or None where it is not finite (a diverged or undefined metric: the
    row's mean is then n/a)."""
    return None if v is None or not np.isfinite(v) else float(v)


def _extra(cfg: ModHNNConfig, pick: Any) -> dict[str, Any]:
    """Per-row details, training curves, per-instance metrics, the SVD ablations and the
    further systems (means over seeds)."""
    detail: dict[str, dict[str, Any]] = {}
    for row in cfg.rows:
        runs = pick(row)
        detail[row] = {
            k: _agg([r["means"].get(k) for r in runs])[0]
            for k in ("eps_field", "eps_traj", "learned_drift", "diverged")
        }
        detail[row]["train_s"] = float(np.mean([r["train_s"] for r in runs]))
        detail[row]["fit_loss"] = _agg([r.get("fit_loss") for r in runs])[0]
        if row in OPT_META:  # the shots' loss at θ, before the test-time inner loop
            detail[row]["fit_loss_before"] = _agg([r.get("fit_loss_before") for r in runs])[0]
    extra: dict[str, Any] = {
        "system": cfg.system,
        "detail": detail,
        "curves": {row: [r.get("curve", []) for r in pick(row)] for row in cfg.rows},
        "per_instance": {row: [r["eval"] for r in pick(row)] for row in cfg.rows},
        "ablations": {},
        "systems": {},
        "figures": {},
    }
    if "svd" in cfg.rows:
        svd = pick("svd")
        if "zero_init" in cfg.ablations and all("zero_init" in r for r in svd):
            extra["ablations"]["zero_init"] = {
                m: _agg([r["zero_init"][m] for r in svd])[0] for m in (*METRICS, "eps_field")
            }
        reset = pick("svd", variant="reset_latents")
        if reset:
            extra["ablations"]["reset_latents"] = {
                m: _agg([r["means"][m] for r in reset])[0] for m in (*METRICS, "eps_field")
            }
    for system in cfg.extra_systems:
        if system == cfg.system:
            continue
        extra["systems"][system] = {
            row: {
                m: _agg([r["means"][m] for r in pick(row, system)])[0]
                for m in (*METRICS, "eps_field", "eps_traj")
            }
            for row in ("svd", "hnn_pooled")
        }
    return extra


def _notes(cfg: ModHNNConfig) -> list[str]:
    return [
        f"system {cfg.system}: {cfg.n_train_instances} training / {cfg.n_test_instances} unseen "
        f"test parameter values, {cfg.n_traj} trajectories × {cfg.n_steps} states × dt {cfg.dt}; "
        f"{cfg.shots} shots (q, p, q̇, ṗ) from one trajectory of each test instance, the other "
        f"{cfg.n_traj - 1} trajectories and a {cfg.grid}×{cfg.grid} grid are the evaluation data",
        "field_mse = Σ‖F̂ − F‖²/Σ‖F‖² on the grid (ε_field = its square root); traj_mse the same "
        f"over the evaluation trajectories (RK4, {cfg.n_steps - 1} steps from the true initial "
        f"states); energy_drift = |mean H over the last {cfg.drift_window} steps − over the "
        f"first {cfg.drift_window}|/|H(x0)| with the true H over a {cfg.rollout_steps}-step "
        f"implicit-midpoint rollout ({cfg.midpoint_iters} fixed-point iterations); means over "
        f"test instances, then over {cfg.seeds} seeds (± std over seeds)",
        f"meta-training: {cfg.steps} outer steps, batch {cfg.batch_instances} instances, "
        f"N_in {cfg.n_inner}, η_in {cfg.lr_inner}, Adam {cfg.lr}; adaptation: z only, from "
        f"z_avg, Adam {cfg.adapt_lr} × {cfg.adapt_steps} steps; hnn_per_instance: "
        f"{cfg.scratch_steps} Adam steps on the shots; width {cfg.width}×{cfg.depth}, d_z "
        f"{cfg.d_z}, rank {cfg.rank}",
        f"fomaml / reptile / anil: the hnn_pooled network's initial weights meta-learned over "
        f"the same {cfg.steps} outer steps and batches of {cfg.batch_instances} instances "
        f"(first-order MAML, Reptile, first-order ANIL on the output layer; {cfg.inner_steps} "
        f"SGD steps of {cfg.inner_lr} on {cfg.shots} shots of one trajectory per instance, "
        f"gradient clipped to {cfg.inner_clip}; Adam {cfg.lr} on θ), adapted per test instance "
        f"by {cfg.test_inner_steps} of those SGD steps on its shots",
    ]


def _fmt(v: float | None, scale: float = 1.0) -> str:
    return "n/a" if v is None else f"{v * scale:.3g}"


def _markdown(cfg: ModHNNConfig, rows: dict[str, Any], extra: dict[str, Any]) -> str:
    lines = [
        "## Paper units (×10⁻², relative L2) and structure",
        "",
        "| system | ε_field ×10⁻² | ε_traj ×10⁻² | learned-H̃ drift | diverged rollouts | "
        "meta-train s |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        d = extra["detail"][row]
        lines.append(
            f"| {row} | {_fmt(d['eps_field'], 100)} | {_fmt(d['eps_traj'], 100)} | "
            f"{_fmt(d['learned_drift'])} | {_fmt(d['diverged'])} | {d['train_s']:.0f} |"
        )
    if extra["ablations"]:
        lines += [
            "",
            "## Ablations (SVD, the paper's ablation study)",
            "",
            "| variant | field_mse | traj_mse | energy_drift |",
            "|---|---|---|---|",
        ]
        if "svd" in rows:
            r = rows["svd"]
            lines.append(
                f"| svd (z_avg init, persistent latents) | {_fmt(r['field_mse'])} | "
                f"{_fmt(r['traj_mse'])} | {_fmt(r['energy_drift'])} |"
            )
        names = {
            "zero_init": "zero init at test time",
            "reset_latents": "latents reset every epoch",
        }
        for k, v in extra["ablations"].items():
            lines.append(
                f"| {names[k]} | {_fmt(v['field_mse'])} | {_fmt(v['traj_mse'])} | "
                f"{_fmt(v['energy_drift'])} |"
            )
    if extra["systems"]:
        lines += [
            "",
            "## Other systems (svd vs hnn_pooled)",
            "",
            "| system | row | field_mse | traj_mse | energy_drift |",
            "|---|---|---|---|---|",
        ]
        for system, by_row in extra["systems"].items():
            for row, v in by_row.items():
                lines.append(
                    f"| {system} | {row} | {_fmt(v['field_mse'])} | {_fmt(v['traj_mse'])} | "
                    f"{_fmt(v['energy_drift'])} |"
                )
    if extra["figures"]:
        lines += ["", "Figures: " + ", ".join(f"`{v}`" for v in extra["figures"].values())]
    return "\n".join(lines)


def _plot_rollouts(
    examples: dict[str, dict[str, Any]], curves: dict[str, list[list[float]]], cfg, path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [
        r for r in ("svd", "hnn_pooled", "hnn_per_instance", "fomaml", "mlp_modulated")
        if r in examples
    ]  # fmt: skip
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    first = next(iter(examples.values()), {}).get("0")
    if first:
        t = np.asarray(first["true"])
        ax.plot(t[:, 0], t[:, 1], "k-", lw=3, alpha=0.4, label="truth")
    for row in shown:
        ex = examples[row].get("0")
        if ex:
            p = np.asarray(ex["pred"])
            ax.plot(p[:, 0], p[:, 1], lw=1.2, label=row)
    ax.set_xlabel("q")
    ax.set_ylabel("p")
    ax.set_title(f"{cfg.system}: unseen instance, {cfg.n_steps - 1}-step RK4 rollout")
    ax.legend(fontsize=7)
    ax = axes[1]
    for row in shown:
        ex = examples[row].get("0")
        if ex:
            h = np.asarray(ex["energy_true_H"], dtype=np.float64)
            steps = np.linspace(0, cfg.rollout_steps, len(h))
            err = np.abs(h / h[0] - 1)[1:]  # t = 0 is exact by definition
            ax.plot(steps[1:] * cfg.dt, err, lw=1.2, label=row)
    ax.set_yscale("log")
    ax.set_xlabel("time")
    ax.set_ylabel("|H(x_t)/H(x_0) − 1|, true H")
    ax.set_title(f"energy error, {cfg.rollout_steps}-step implicit-midpoint rollout")
    ax.legend(fontsize=7)
    ax = axes[2]
    for row, cs in curves.items():
        if cs and cs[0]:
            x = np.arange(1, len(cs[0]) + 1) * cfg.log_every
            ax.plot(x[: len(cs[0])], cs[0], label=row)
    ax.set_yscale("log")
    ax.set_xlabel("outer step")
    ax.set_ylabel("relative L_symp (training)")
    ax.set_title("meta-training")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_systems(examples: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(examples), figsize=(4.5 * len(examples), 4), squeeze=False)
    for ax, (system, ex) in zip(axes[0], examples.items()):
        e = ex.get("0")
        if not e:
            continue
        t, p = np.asarray(e["true"]), np.asarray(e["pred"])
        ax.plot(t[:, 0], t[:, 1], "k-", lw=3, alpha=0.4, label="truth")
        ax.plot(p[:, 0], p[:, 1], lw=1.2, label="svd (adapted)")
        ax.set_title(f"{system}, μ = {np.round(e['mu'], 2).tolist()}")
        ax.set_xlabel("q")
        ax.set_ylabel("p")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
