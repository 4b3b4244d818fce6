"""`nshot reproduce timemode`: TimeMoDE against training from scratch, its ablations, TimeVAE,
an autoregressive model and a negative control, on a scarce target (paper §4).

Phase 1 (parallel Ray tasks): one pre-training per pre-trained row (TimeMoDE and the three
architecture variants on ``cfg.corpus``; TimeMoDE again for ``long_pretrain_factor`` times the
steps, the ``timemode_longpre`` row; with the real corpus also TimeMoDE on the synthetic corpus,
the ``timemode_synthpre`` row), shared by the fine-tuning seeds; the from-scratch runs; the
classical baselines. Phase 2: per (fine-tuned row, seed) a fine-tune on the target's few-shot
windows, sampling and scoring; ``timemode_frozen`` fine-tunes TimeMoDE's pre-training with the
attention, the prototypes and the shared expert frozen (:data:`FROZEN`), beside the ``timemode``
row's fine-tuning of every parameter. ``disc_10`` / ``disc_25`` (the smaller regimes,
``cfg.shot_regimes``, for the first ``regime_seeds`` seeds) and ``disc_damped`` (the generated
damped-oscillation target, the one the real corpus resembles least, :func:`resemblance`; the
first ``damped_seeds`` seeds) are disc alone (``regime_disc_seeds`` discriminators), run for
TimeMoDE and from scratch only (the pair the scarcity claims compare); other rows leave them
null.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nshot.experiment import Job, aggregate, run_jobs
from nshot.method import ResultsTable

from .baselines import ar_samples, marginal_noise_samples, timevae_samples
from .config import TimeModeConfig
from .data import load_corpus, load_target
from .evaluation import (
    disc_score,
    fid_feat,
    roughness,
    routing_distributions,
    routing_js,
    score_windows,
)
from .model import Diffusion, TimeModeState, generate
from .train import fit, stage_data

PRETRAINED = ("timemode", "dit_dense", "no_domain_prompt", "no_stage_adaln")
SYSTEMS = (*PRETRAINED, "from_scratch", "timevae", "ar_sim", "marginal_noise",
           "timemode_synthpre", "timemode_frozen", "timemode_longpre")  # fmt: skip
# the parts the fine-tune of the timemode_frozen row keeps at their pre-trained values (the
# paper does not say what its fine-tuning freezes; the config's ``freeze`` names these parts)
FROZEN = ["attention", "prototypes", "shared_expert"]
BASELINES = ("timevae", "ar_sim", "marginal_noise")
METRICS = {
    "disc": False,
    "fid_feat": False,
    "pred": False,
    "routing_js": True,
    "disc_10": False,
    "disc_25": False,
    "disc_damped": False,
}
REGIME_ROWS = ("timemode", "from_scratch")
# rows no claim reads: fine-tuned for the first ``ablation_seeds`` seeds only
REPORTED_ROWS = ("dit_dense", "no_stage_adaln", "timemode_synthpre")
DAMPED_ROWS = ("timemode", "from_scratch")


def _score(cfg: TimeModeConfig, fake: np.ndarray, real: np.ndarray, seed: int) -> dict:
    return score_windows(real, fake, iters=cfg.disc_iters, batch=cfg.disc_batch,
                         seeds=cfg.disc_seeds, pred_iters=cfg.pred_iters, seed=seed,
                         folds=cfg.disc_folds, lr=cfg.disc_lr)  # fmt: skip


def _disc(cfg: TimeModeConfig, fake: np.ndarray, real: np.ndarray, seed: int) -> float:
    return disc_score(real, fake, iters=cfg.disc_iters, batch=cfg.disc_batch,
                      seeds=cfg.regime_disc_seeds, seed=seed, folds=cfg.disc_folds,
                      lr=cfg.disc_lr)  # fmt: skip


def _sample(
    cfg: TimeModeConfig, state: TimeModeState, shots: np.ndarray, seed: int, sampler: str = "ddpm"
) -> np.ndarray:
    diffusion = Diffusion(cfg.diffusion_steps, sampler=sampler, prediction=cfg.prediction)
    ex = torch.from_numpy(shots)
    return generate(state.ema, diffusion, ex, cfg.n_generate, seed + 1111).numpy()


def evaluate_state(state: TimeModeState, cfg: TimeModeConfig, seed: int) -> dict[str, Any]:
    """Sample conditioned on the target's few-shot windows and score against its reference;
    routing_js over the checkpoint's own domains (their banks) when it has several."""
    target = load_target(cfg, seed=seed)
    shots = target.scaler.scale(target.shots)
    out: dict[str, Any] = _score(cfg, _sample(cfg, state, shots, seed),
                                 target.scaler.scale(target.reference), seed)  # fmt: skip
    counts = state.bank_count.tolist()
    if len(counts) > 1:
        banks = [state.bank[i, :n].numpy() for i, n in enumerate(counts)]
        dist = routing_distributions(state.ema, Diffusion(cfg.diffusion_steps), banks,
                                     cfg.routing_windows, seed)  # fmt: skip
        out["routing_js"] = routing_js(dist)
    return out


def _weights(state: TimeModeState) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in state.state_dict().items()}


def _tensors(w: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.array(v)) for k, v in w.items()}


def _pretrain_job(
    cfg_dict: dict, system: str, corpus: str, steps: int | None = None
) -> dict[str, Any]:
    """One pre-training of ``system`` on ``corpus`` (``steps``: default ``pretrain_steps``)."""
    t0, c0 = time.time(), time.process_time()
    more = {} if steps is None else {"pretrain_steps": steps}
    cfg = TimeModeConfig.validated({**cfg_dict, "system": system, "corpus": corpus,
                                    "stage": "pretrain", **more})  # fmt: skip
    curve: list[float] = []
    data = stage_data(cfg)
    state = fit(cfg, data, on_step=lambda s, m: curve.append(m["mse"]) if s % 50 == 0 else None)
    dist = routing_distributions(state.ema, Diffusion(cfg.diffusion_steps), data.windows,
                                 cfg.routing_windows, cfg.seed)  # fmt: skip
    return {"weights": _weights(state), "routing_js": routing_js(dist), "steps": cfg.pretrain_steps,
            "routing": None if dist is None else dist.round(4).tolist(), "curve": curve,
            "domains": data.names, "seconds": time.time() - t0,
            "cpu_seconds": time.process_time() - c0}  # fmt: skip


def _target_cfg(cfg_dict: dict, **kw: Any) -> TimeModeConfig:
    return TimeModeConfig.validated({**cfg_dict, **kw})


def _regimes(cfg: TimeModeConfig, damped: bool = True) -> list[tuple[str, str, int]]:
    """(metric, target, n_shot) of the extra settings: the smaller regimes and damped."""
    out = [(f"disc_{k}", cfg.target, k) for k in cfg.shot_regimes]
    if damped and cfg.target != "damped":
        out.append(("disc_damped", "damped", cfg.n_shot))
    return out


def _regime_seeds(cfg: TimeModeConfig, metric: str, seeds: list[int]) -> list[int]:
    """The fine-tuning seeds an extra setting runs for: the first ``damped_seeds`` for the
    damped target, the first ``regime_seeds`` for the smaller regimes."""
    return seeds[: cfg.damped_seeds if metric == "disc_damped" else cfg.regime_seeds]


def _regime_key(metric: str, cfg: TimeModeConfig) -> str:
    """disc_10 / disc_25 name the paper's regimes; a preset with other regimes maps them in
    order onto those two columns."""
    if metric == "disc_damped":
        return metric
    i = [f"disc_{k}" for k in cfg.shot_regimes].index(metric)
    return ("disc_10", "disc_25")[i] if i < 2 else metric


def _tuned(cfg: TimeModeConfig, stage: str, target: str, n_shot: int, seed: int,
           init: dict | None, system: str, full: bool = True) -> tuple[np.ndarray, dict]:  # fmt: skip
    """Fine-tune (or train from scratch) on the target's n_shot windows; score the samples
    (``full``: disc, fid_feat and pred; else disc alone, over ``regime_disc_seeds``)."""
    init_from = "(pre-trained weights in memory)" if stage == "finetune" else None
    run = cfg.replace(stage=stage, init_from=init_from, target=target, seed=seed, system=system)
    data = stage_data(run, seed=seed, n_shot=n_shot)
    state = fit(run, data, init=init)
    target_data = load_target(run, n_shot, seed)
    shots = target_data.scaler.scale(target_data.shots)
    fake = _sample(run, state, shots, seed)
    real = target_data.scaler.scale(target_data.reference)
    if not full:
        return fake, {"disc": _disc(run, fake, real, seed), "_state": state}
    return fake, {**_score(run, fake, real, seed), "_state": state}


def _timed(fn):
    """Run ``fn`` (on the job's torch threads, one per CPU it holds); its result with wall and
    CPU seconds."""
    t0, c0 = time.time(), time.process_time()
    out = fn()
    out["seconds"] = time.time() - t0
    out["cpu_seconds"] = time.process_time() - c0
    return out


def _finetune_job(cfg_dict: dict, system: str, seed: int, weights: dict,
                  regime: tuple[str, str, int] | None = None) -> dict:  # fmt: skip
    """One fine-tune from the pre-trained ``weights``: the main setting (disc, fid_feat, pred)
    or one ``regime`` (metric, target, n_shot: disc alone)."""

    def run() -> dict:
        cfg = _target_cfg(cfg_dict, system=system, stage="pretrain")
        init = _tensors(weights)
        if regime is None:
            _, main = _tuned(cfg, "finetune", cfg.target, cfg.n_shot, seed, init, system)
            main.pop("_state")
            return main
        metric, target, k = regime
        _, r = _tuned(cfg, "finetune", target, k, seed, init, system, full=False)
        return {_regime_key(metric, cfg): r["disc"]}

    return _timed(run)


def _scratch_job(cfg_dict: dict, seed: int, regime: tuple[str, str, int] | None = None) -> dict:
    """One from-scratch run: the main setting (disc, fid_feat, pred and the routing of the
    pre-training domains) or one ``regime`` (disc alone)."""

    def run() -> dict:
        cfg = _target_cfg(cfg_dict, system="timemode", stage="pretrain")
        if regime is not None:
            metric, target, k = regime
            _, r = _tuned(cfg, "scratch", target, k, seed, None, "timemode", full=False)
            return {_regime_key(metric, cfg): r["disc"]}
        _, main = _tuned(cfg, "scratch", cfg.target, cfg.n_shot, seed, None, "timemode")
        state = main.pop("_state")
        corpus = load_corpus(cfg)
        dist = routing_distributions(state.ema, Diffusion(cfg.diffusion_steps), corpus.windows,
                                     cfg.routing_windows, seed)  # fmt: skip
        return {**main, "routing_js": routing_js(dist)}

    return _timed(run)


def _baseline_sets(
    cfg: TimeModeConfig, target: str, k: int, seed: int, full: bool = True
) -> dict[str, dict]:
    run = cfg.replace(target=target)
    t = load_target(run, k, seed)
    shots, real = t.scaler.scale(t.shots), t.scaler.scale(t.reference)
    fakes = _baseline_samples(cfg, shots, seed)
    if full:
        return {row: _score(run, fake, real, seed) for row, fake in fakes.items()}
    return {row: {"disc": _disc(run, fake, real, seed)} for row, fake in fakes.items()}


def _baseline_samples(cfg: TimeModeConfig, shots: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """The classical rows' generated windows from the few-shot ``shots`` (scaled units)."""
    n = cfg.n_generate
    return {
        "timevae": timevae_samples(shots, n, steps=cfg.scratch_steps, seed=seed),
        "ar_sim": ar_samples(shots, n, seed=seed),
        "marginal_noise": marginal_noise_samples(shots, n, seed=seed),
    }


def _baselines_job(cfg_dict: dict, seed: int) -> dict:
    def run() -> dict:
        cfg = _target_cfg(cfg_dict, stage="pretrain")
        return _baseline_sets(cfg, cfg.target, cfg.n_shot, seed)

    return _timed(run)


def roughness_report(
    cfg: TimeModeConfig, seed: int = 0, samplers: tuple[str, ...] = ()
) -> dict[str, dict[str, float]]:
    """The diagnosis of the disc claims: :func:`~.evaluation.roughness` of the target's real
    reference windows, its few-shot windows, a from-scratch TimeMoDE trained on them (the
    ``from_scratch`` row's recipe, seed ``seed``; no pre-training, so it runs in about a
    minute) and the classical baselines' samples, each with its disc and fid_feat. Each of
    ``samplers`` (:data:`~.model.SAMPLERS` other than the default ``ddpm``) adds a row
    ``from_scratch[<sampler>]``: the same trained model sampled by that reverse chain."""
    base = _target_cfg(cfg.model_dump(), system="timemode", stage="pretrain")
    fake, scores = _tuned(base, "scratch", base.target, base.n_shot, seed, None, "timemode")
    state = scores.pop("_state")
    t = load_target(base, base.n_shot, seed)
    shots, real = t.scaler.scale(t.shots), t.scaler.scale(t.reference)
    sets = {"real_reference": real, "real_shots": shots, "from_scratch": fake}
    for sampler in samplers:
        if sampler != "ddpm":
            sets[f"from_scratch[{sampler}]"] = _sample(base, state, shots, seed, sampler)
    sets.update(_baseline_samples(base, shots, seed))
    out = {}
    for name, x in sets.items():
        row = roughness(x)
        if name.startswith("real"):
            out[name] = row
            continue
        s = scores if name == "from_scratch" else _score(base, x, real, seed)
        out[name] = {**row, "disc": s["disc"], "fid_feat": s["fid_feat"]}
    return out


def evaluator_checks(cfg: TimeModeConfig, seed: int = 0) -> dict[str, float]:
    """The evaluator on known cases, at the preset's scoring sizes: the target's reference split
    in two disjoint halves (real against real: disc and fid_feat ≈ 0 up to sampling error), and
    the marginal-noise control drawn from the few-shot windows against the reference (no
    temporal structure: clearly above the real-against-real values)."""
    target = load_target(cfg, cfg.n_shot, seed)
    real = target.scaler.scale(target.reference)
    rng = np.random.default_rng([seed, 1212])
    order = rng.permutation(len(real))
    n = min(cfg.n_generate, len(real) // 2)
    a, b = real[order[:n]], real[order[len(real) - n :]]
    noise = marginal_noise_samples(target.scaler.scale(target.shots), n, seed=seed)
    rest = real[order[n:]]

    def disc(x: np.ndarray, y: np.ndarray) -> float:
        return disc_score(x, y, iters=cfg.disc_iters, batch=cfg.disc_batch,
                          seeds=cfg.disc_seeds, seed=seed, folds=cfg.disc_folds,
                          lr=cfg.disc_lr)  # fmt: skip

    return {"n": n, "disc_real_vs_real": disc(a, b), "disc_noise_vs_real": disc(rest, noise),
            "fid_real_vs_real": fid_feat(a, b), "fid_noise_vs_real": fid_feat(rest, noise)}  # fmt: skip


def _evaluator_job(cfg_dict: dict) -> dict:
    return _timed(lambda: evaluator_checks(_target_cfg(cfg_dict, stage="pretrain")))


def resemblance(cfg: TimeModeConfig, n: int = 1000, seed: int = 0) -> dict[str, dict[str, Any]]:
    """How closely the pre-training corpus ``cfg.corpus`` resembles each target the run scores
    (``cfg.target`` and the damped oscillations): per target, the feature Fréchet distance
    (:func:`~.evaluation.fid_feat`) between up to ``n`` of its reference windows (in the
    few-shot scaler's units of seed ``seed``) and up to ``n`` windows of each corpus domain (in
    the domain's own scaling, as pre-training sees them); ``nearest`` is the distance to the
    closest domain (named by ``nearest_domain``), ``mean`` the mean over the domains. A measure
    of the data alone, made before any training."""
    corpus = load_corpus(cfg)
    out: dict[str, dict[str, Any]] = {}
    for target in dict.fromkeys((cfg.target, "damped")):
        t = load_target(cfg.replace(target=target), cfg.n_shot, seed)
        ref = t.scaler.scale(t.reference)
        rng = np.random.default_rng([seed, 4242])
        ref = ref[rng.choice(len(ref), min(n, len(ref)), replace=False)]
        dist = {}
        for name, w in zip(corpus.names, corpus.windows, strict=True):
            dist[name] = fid_feat(ref, w[rng.choice(len(w), min(n, len(w)), replace=False)])
        near = min(dist, key=dist.__getitem__)
        out[target] = {"nearest": dist[near], "nearest_domain": near,
                       "mean": float(np.mean(list(dist.values()))), "per_domain": dist}  # fmt: skip
    return out


def _estimate(cfg: TimeModeConfig, kind: str, system: str = "timemode") -> float:
    """A job's relative cost (training samples; the dense variant about a third of a MoDE),
    for longest-first submission."""
    unit = 0.35 if system == "dit_dense" else 1.0
    steps = {"pretrain": cfg.pretrain_steps * cfg.batch,
             "scratch": cfg.scratch_steps * cfg.target_batch,
             "finetune": cfg.finetune_steps * cfg.target_batch}.get(kind, 0)  # fmt: skip
    return unit * steps


def run_experiments(cfg: TimeModeConfig, workdir: Path) -> ResultsTable:
    t0 = time.time()
    workdir.mkdir(parents=True, exist_ok=True)
    base = cfg.model_dump()
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    regimes = _regimes(cfg)
    # per extra setting (metric, target, n_shot), the seeds it runs for
    settings = [(seed, regime) for regime in regimes
                for seed in _regime_seeds(cfg, regime[0], seeds)]  # fmt: skip
    # build the cached tables once, before the tasks read them
    load_corpus(cfg)
    load_target(cfg)
    # pre-trained rows: (row, system, corpus, pre-training steps)
    pre: list[tuple[str, str, str, int]] = [
        (s, s, cfg.corpus, cfg.pretrain_steps) for s in PRETRAINED
    ]
    if cfg.corpus == "real":
        pre.append(("timemode_synthpre", "timemode", "synthetic", cfg.pretrain_steps))
        load_corpus(cfg.replace(corpus="synthetic"))
    if cfg.long_pretrain_factor:
        long_steps = cfg.long_pretrain_factor * cfg.pretrain_steps
        pre.append(("timemode_longpre", "timemode", cfg.corpus, long_steps))
    if cfg.target != "damped":
        load_target(cfg.replace(target="damped"))
    # fine-tuned rows: (row, pre-trained row, system, config overrides of the fine-tune)
    tuned = [(row, row, system, {}) for row, system, _, _ in pre]
    tuned.insert(1, ("timemode_frozen", "timemode", "timemode", {"freeze": FROZEN}))
    # phase 1: everything that needs no pre-trained weights, longest first
    jobs = [(_estimate(cfg.replace(pretrain_steps=steps), "pretrain", system),
             Job(("pretrain", row), _pretrain_job, (base, system, corpus, steps), trains=True))
            for row, system, corpus, steps in pre]  # fmt: skip
    jobs += [(_estimate(cfg, "scratch") + 1,
              Job(("from_scratch", seed), _scratch_job, (base, seed), trains=True))
             for seed in seeds]  # fmt: skip
    jobs += [(_estimate(cfg, "scratch"),
              Job(("from_scratch", seed, metric), _scratch_job, (base, seed, (metric, tgt, k)),
                  trains=True))
             for seed, (metric, tgt, k) in settings]  # fmt: skip
    jobs += [(0.0, Job(("baselines", seed), _baselines_job, (base, seed), trains=True))
             for seed in seeds]  # fmt: skip
    jobs.append((0.0, Job(("evaluator",), _evaluator_job, (base,), trains=True)))
    jobs.sort(key=lambda j: -j[0])
    done = run_jobs([j for _, j in jobs],
                    description=f"timemode {cfg.preset}: pre-training, from scratch, baselines")  # fmt: skip
    t1 = time.time()
    row_seeds = {row: seeds[: cfg.ablation_seeds] if row in REPORTED_ROWS else seeds
                 for row, _, _, _ in tuned}  # fmt: skip
    jobs2 = [Job(("finetune", row, seed), _finetune_job,
                 ({**base, **more}, system, seed, done[("pretrain", src)]["weights"]),
                 trains=True)
             for row, src, system, more in tuned for seed in row_seeds[row]]  # fmt: skip
    jobs2 += [Job(("finetune", row, seed, metric), _finetune_job,
                  ({**base, **more}, system, seed, done[("pretrain", src)]["weights"],
                   (metric, tgt, k)),
                  trains=True)
              for row, src, system, more in tuned if row in REGIME_ROWS
              for seed, (metric, tgt, k) in settings]  # fmt: skip
    done2 = run_jobs(jobs2, description=f"timemode {cfg.preset}: fine-tuning")

    def regime_values(prefix: tuple, seed: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for metric, _, _ in regimes:
            r = done.get((*prefix, seed, metric)) or done2.get((*prefix, seed, metric))
            if r is not None:
                out.update({k: v for k, v in r.items() if k in METRICS})
        return out

    # the regime metrics are means over the seeds that ran them (_regime_seeds)
    ran = {_regime_key(metric, cfg): _regime_seeds(cfg, metric, seeds) for metric, _, _ in regimes}

    def kept(seed: int, r: dict) -> dict[str, float | None]:
        return {m: r.get(m) for m in METRICS if m not in ran or seed in ran[m]}

    per: dict[tuple[str, int], dict[str, float | None]] = {}
    for row, src, _, _ in tuned:
        for seed in row_seeds[row]:
            r = {**done2[("finetune", row, seed)], **regime_values(("finetune", row), seed)}
            per[(row, seed)] = {**kept(seed, r),
                                "routing_js": done[("pretrain", src)]["routing_js"]}  # fmt: skip
    for seed in seeds:
        r = {**done[("from_scratch", seed)], **regime_values(("from_scratch",), seed)}
        per[("from_scratch", seed)] = kept(seed, r)
        for row in BASELINES:
            per[(row, seed)] = kept(seed, done[("baselines", seed)][row])
    order = [s for s in SYSTEMS if any(k[0] == s for k in per)]
    per = {(s, seed): per[(s, seed)] for s in order for seed in seeds if (s, seed) in per}
    rows, stds, samples = aggregate(per)
    every = {**done, **done2}
    evaluator = {k: v for k, v in done[("evaluator",)].items()
                 if k not in ("seconds", "cpu_seconds")}  # fmt: skip
    extra: dict[str, Any] = {
        "unit": unit_checks(cfg.seed),
        "evaluator": evaluator,
        "resemblance": resemblance(cfg),
        "pretraining": {
            row: {"routing_js": done[("pretrain", row)]["routing_js"],
                  "routing": done[("pretrain", row)]["routing"],
                  "domains": done[("pretrain", row)]["domains"],
                  "mse_every_50": [round(v, 5) for v in done[("pretrain", row)]["curve"]],
                  "steps": done[("pretrain", row)]["steps"],
                  "seconds": round(done[("pretrain", row)]["seconds"], 1)}
            for row, _, _, _ in pre
        },
        "job_seconds": {"/".join(map(str, k)): round(v["seconds"], 1) for k, v in every.items()},
        "job_cpu_seconds": {"/".join(map(str, k)): round(v["cpu_seconds"], 1)
                            for k, v in every.items()},
        "cpu_seconds_total": round(sum(v["cpu_seconds"] for v in every.values()), 1),
        "phase_seconds": {"independent": round(t1 - t0, 1),
                          "finetune": round(time.time() - t1, 1)},
    }  # fmt: skip
    plot(rows, order, workdir / "timemode.png")
    return ResultsTable(
        method="timemode", preset=cfg.preset, seeds=len(seeds), metrics=METRICS,
        rows={s: {m: rows[s].get(m) for m in METRICS} for s in order},
        stds={s: {m: stds[s].get(m) for m in METRICS} for s in order},
        samples={s: {m: samples[s].get(m, []) for m in METRICS} for s in order},
        runtime_s=time.time() - t0, notes=_notes(cfg), extra=extra,
    )  # fmt: skip


def _notes(cfg: TimeModeConfig) -> list[str]:
    tgt = ("ItalyPowerDemand (z-normalised per series by the UCR archive)"
           if cfg.target == "italy" else "generated damped oscillations")  # fmt: skip
    split = (f"{cfg.disc_folds}-fold cross-validation (every window tested once)"
             if cfg.disc_folds > 1 else "one 80/20 split")  # fmt: skip
    return [
        f"pre-training corpus: {cfg.corpus}; target: {tgt}, {cfg.n_shot} few-shot windows per "
        f"seed; {cfg.seeds} fine-tuning seed(s); rows are means (± std over seeds).",
        f"d {cfg.d_model}, depth {cfg.depth}, K {cfg.experts} (top-{cfg.top_k}) + shared, "
        f"T {cfg.diffusion_steps}; pre-training {cfg.pretrain_steps} × {cfg.batch}, fine-tune "
        f"{cfg.finetune_steps} × {cfg.target_batch}, scratch {cfg.scratch_steps}; "
        f"{cfg.n_generate} generated windows scored against as many real ones; GRU "
        f"discriminator {cfg.disc_iters} Adam steps at {cfg.disc_lr:g}, batch {cfg.disc_batch}, "
        f"{split}, {cfg.disc_seeds} seed(s); fid_feat on 24 features.",
        f"disc_10 / disc_25 (regimes {cfg.shot_regimes}) only for {', '.join(REGIME_ROWS)}, "
        f"for the first {min(cfg.regime_seeds, cfg.seeds)} fine-tuning seed(s); disc_damped "
        f"(the target the pre-training corpus resembles least) only for "
        f"{', '.join(DAMPED_ROWS)}, for the first {min(cfg.damped_seeds, cfg.seeds)}; both "
        f"with {cfg.regime_disc_seeds} discriminator seed(s).",
        f"{', '.join(REPORTED_ROWS)} (rows no claim reads) fine-tuned for the first "
        f"{min(cfg.ablation_seeds, cfg.seeds)} seed(s).",
        f"timemode_frozen: TimeMoDE's pre-training fine-tuned with {', '.join(FROZEN)} frozen"
        + (f"; timemode_longpre: TimeMoDE pre-trained for {cfg.long_pretrain_factor} × "
           f"{cfg.pretrain_steps} steps, fine-tuned as timemode." if cfg.long_pretrain_factor
           else "."),
    ]  # fmt: skip


def plot(rows: dict[str, dict], order: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    for ax, metric in zip(axes, ("disc", "fid_feat", "routing_js"), strict=True):
        systems = [s for s in order if rows[s].get(metric) is not None]
        vals = [rows[s][metric] for s in systems]
        ax.bar(range(len(systems)), vals,
               color=["C3" if s == "timemode" else "C0" for s in systems])  # fmt: skip
        ax.set_xticks(range(len(systems)), systems, rotation=45, ha="right", fontsize=7)
        ax.set_title(metric + (" (higher is better)" if METRICS[metric] else " (lower is better)"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def randomise(net: torch.nn.Module, seed: int) -> None:
    """Every parameter drawn at random (the zero-initialised adaLN layers included), so that a
    comparison of two code paths is not trivially met by zero outputs."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))


def unit_checks(seed: int = 0) -> dict[str, float]:
    """The checks of the model and sampler on random inputs (paper §3): adaLN-Zero gives
    ε̂ ≡ 0 at initialisation; top-2 gates are ≥ 0 and sum to 1; dense and sparse expert
    dispatch agree; one reverse step with the true ε is the posterior mean; sampling N(0, I)
    data with the analytic ε*(x_t) = √(1 − ᾱ_t) x_t gives mean 0 and variance 1."""
    from .model import Denoiser

    cfg = TimeModeConfig.from_preset("smoke", experts=4, top_k=2, basis=2, d_model=16)
    torch.manual_seed(seed)
    net = Denoiser(cfg).eval()
    x, ex = torch.randn(8, cfg.window, 1), torch.rand(8, cfg.window, 1)
    t = torch.randint(cfg.diffusion_steps, (8,))
    with torch.no_grad():
        init = float(net(x, t, ex).eps.abs().max())
        randomise(net, seed)
        dense = net(x, t, ex)
        net.dispatch = "sparse"
        sparse = net(x, t, ex)
    gates = torch.cat([r.gates for r in dense.routings])
    chosen = (gates > 0).sum(-1)
    diffusion = Diffusion(100)
    x0 = torch.rand(64, cfg.window, 1) * 2 - 1
    eps = torch.randn_like(x0)
    tt = torch.randint(1, 100, (64,))
    xt = diffusion.q_sample(x0, tt, eps)
    ab, b = diffusion.abar[tt][:, None, None], diffusion.betas[tt][:, None, None]
    abp = diffusion.abar_prev[tt][:, None, None]
    ref = (abp.sqrt() * b / (1 - ab)) * x0.double() + ((1 - b).sqrt() * (1 - abp) / (1 - ab)) * (
        xt.double()
    )
    step_err = float((diffusion.reverse_mean(xt, tt, eps).double() - ref).abs().max())
    gen = torch.Generator().manual_seed(seed)
    samples = diffusion.sample(
        lambda xs, ts: (1 - diffusion.abar[ts]).sqrt().float()[:, None, None] * xs,
        (4000, 4, 1),
        gen,
    )
    return {
        "adaln_zero_max_abs_eps": init,
        "gate_min": float(gates.min()),
        "gate_sum_max_err": float((gates.sum(-1) - 1).abs().max()),
        "gate_topk_count_err": float((chosen - cfg.top_k).abs().max()),
        "dense_sparse_max_err": float((dense.eps - sparse.eps).abs().max()),
        "posterior_step_max_err": step_err,
        "analytic_sample_mean": float(samples.mean()),
        "analytic_sample_var": float(samples.var()),
    }
