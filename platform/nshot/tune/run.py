"""``nshot tune``: sweep a method's config with Ray Tune, Train V2 inside every trial.

Each trial is a Tune function trainable (Ray 2.60's pattern for Train V2 under Tune):

* ``workers=0`` (default): the method's ``train_loop`` runs in the trial's own process, and
  :mod:`nshot.train.session` reports straight to ``ray.tune.report`` (Ray Train's local mode
  cannot run inside a Tune session);
* ``workers>=1``: the trial builds a ``TorchTrainer`` whose worker group runs the loop, with
  :class:`~nshot.tune.report.NshotTuneCallback` forwarding rank 0's reports to the trial.

Every report that carries the method's objective also carries ``f`` (its value) and ``h``
(the learning curve so far). When the sweep ends, its finished trials are written to the
history (:mod:`nshot.tune.history`) so later sweeps, and the ``auxbo`` surrogate, learn from it.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nshot.errors import NshotError
from nshot.method import MethodConfig, get
from nshot.train.runner import (
    Scaling,
    check_run_name,
    default_storage,
    ensure_ray,
    fit_trainer,
    is_uri,
)
from nshot.tune.searchers import SearchContext, build_searcher
from nshot.tune.space import SearchSpace, TuneSpec


@dataclass
class TrialOutcome:
    trial_id: str
    config: dict[str, Any]
    f: float | None
    h: list[list[float]]
    reports: int
    error: str | None = None
    # the order the searcher proposed the trial in (0 first; Tune's experiment tag), which its
    # random trial id does not show
    index: int | None = None


@dataclass
class TuneResult:
    experiment_dir: Path | str
    metric: str
    mode: str
    best_config: dict[str, Any] | None
    best_f: float | None
    trials: list[TrialOutcome]
    history_path: Path | None
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "experiment_dir": str(self.experiment_dir),
            "metric": self.metric,
            "mode": self.mode,
            "best_config": self.best_config,
            "best_f": self.best_f,
            "trials": [asdict(t) for t in self.trials],
            "history_path": str(self.history_path) if self.history_path else None,
            "wall_s": self.wall_s,
            **self.extra,
        }


def tune_spec(cfg: MethodConfig, method_name: str) -> TuneSpec:
    spec = type(cfg).TUNE
    if spec is None:
        raise NshotError(
            f"method {method_name!r} declares no search space (TuneSpec); pass one with --space"
        )
    return spec


def _trial(
    config: dict[str, Any],
    *,
    method_name: str,
    base: dict[str, Any],
    scaling: dict[str, Any],
    report: dict[str, Any],
) -> None:
    """The Tune function trainable: one training run of the method with ``config`` applied."""
    import ray.tune

    from nshot.train.runner import Scaling, build_trainer, run_loop

    method = get(method_name)
    cfg = method.config_from_dict({**base, **config})
    trial_dir = Path(ray.tune.get_context().get_trial_dir())
    if scaling["workers"] == 0:
        run_loop(
            method.name,
            cfg.model_dump(),
            local_dir=str(trial_dir / "train"),
            tune=report,
            in_tune=True,
        )
        return
    from nshot.tune.report import NshotTuneCallback

    trainer = build_trainer(
        method.name,
        cfg,
        Scaling(**scaling),
        name="train",
        storage_path=str(trial_dir),
        callbacks=[NshotTuneCallback(**report)],
    )
    fit_trainer(trainer)


def tune(
    method_name: str,
    cfg: MethodConfig,
    *,
    search: str = "random",
    num_samples: int = 10,
    max_concurrent: int = 2,
    scheduler: str | None = None,
    space: SearchSpace | None = None,
    scaling: Scaling | None = None,
    storage: str | os.PathLike | None = None,
    name: str | None = None,
    resume: bool = False,
    history_dir: str | os.PathLike | None = None,
    save_history: bool = True,
    search_options: dict[str, Any] | None = None,
    dataset: str | None = None,
    seed: int | None = None,
    verbose: int = 0,
    progress: bool = True,
    reuse_actors: bool | None = None,
) -> TuneResult:
    """Sweep ``cfg``'s method over its declared search space (or ``space``).

    ``verbose`` is Tune's own verbosity (0: silent, 1: its status tables); ``progress`` prints
    nshot's line per finished trial to stderr when Tune is silent. ``reuse_actors`` (default:
    when trials run in-process, ``workers=0``) runs the next trial in the finished trial's
    process instead of starting a new one: the same results (every trial seeds itself from its
    config) without a process start and imports per trial."""
    from ray import tune as rtune

    method = get(method_name)
    if not isinstance(cfg, method.Config):
        raise NshotError(f"config for {method_name!r} must be a {method.Config.__name__}")
    spec = type(cfg).TUNE
    if space is None:
        space = tune_spec(cfg, method_name).search_space()
        metric, mode, curve = spec.metric, spec.mode, spec.curve
    elif spec is None:
        raise NshotError(
            f"method {method_name!r} declares no objective (TuneSpec), so a sweep cannot tell "
            "which metric to optimise"
        )
    else:
        metric, mode, curve = spec.metric, spec.mode, spec.curve
    base = cfg.model_dump()
    space.validate_for(type(cfg), base)
    if num_samples < 1:
        raise NshotError("--num-samples must be >= 1")
    if max_concurrent < 1:
        raise NshotError("--max-concurrent must be >= 1")
    scaling = scaling or Scaling()
    scaling.validate()
    seed = cfg.seed if seed is None else seed
    # the sweep lives in <storage>/<name>: a name is one path component
    name = check_run_name(f"{method_name}-{cfg.preset}-{search}" if name is None else name)
    root = storage if storage else default_storage()
    if is_uri(root):  # s3://, gs://, file://: Tune writes there through pyarrow
        storage_path: Path | str = str(root).rstrip("/") + ("" if storage else "/tune")
        exp_dir: Path | str = f"{storage_path}/{name}"
    else:
        storage_path = Path(root).expanduser().resolve() / ("" if storage else "tune")
        exp_dir = storage_path / name

    ctx = SearchContext(
        space=space,
        metric="f",
        mode=mode,
        seed=seed,
        max_concurrent=max_concurrent,
        num_samples=num_samples,
        method=method_name,
        preset=cfg.preset,
        history_dir=Path(history_dir).expanduser() if history_dir else None,
        options=dict(search_options or {}),
    )
    search_alg = build_searcher(search, ctx)  # bad options fail here, before Ray starts
    if scaling.workers == 0:
        resources: dict[str, float] = {"cpu": float(cfg.torch_threads)}
        if scaling.gpus_per_worker:
            raise NshotError("--gpus-per-worker needs --workers >= 1")
    else:  # the trial only drives the worker group
        resources = {"cpu": 0.0}
    ensure_ray()  # with_parameters puts the base config into the object store
    report = {"metric": metric, "mode": mode, "curve": list(curve)}
    trainable = rtune.with_parameters(
        _trial, method_name=method_name, base=base, scaling=asdict(scaling), report=report
    )
    trainable = rtune.with_resources(trainable, resources)
    sched = None
    if scheduler not in (None, "", "none", "fifo"):
        if scheduler != "asha":
            raise NshotError(f"--scheduler: unknown scheduler {scheduler!r}; use asha or none")
        from ray.tune.schedulers import ASHAScheduler

        sched = ASHAScheduler(
            time_attr="training_iteration",
            max_t=max(1, _expected_reports(cfg)),
            grace_period=1,
            reduction_factor=2,
        )
    tune_config = rtune.TuneConfig(
        metric="f",
        mode=mode,
        search_alg=search_alg,
        scheduler=sched,
        num_samples=num_samples,
        max_concurrent_trials=max_concurrent,
        reuse_actors=scaling.workers == 0 if reuse_actors is None else bool(reuse_actors),
    )
    from nshot.tune.progress import SweepProgress

    # Tune's status tables only with verbose >= 1 (`nshot tune --verbose`); otherwise nshot
    # prints one line per finished trial
    callbacks = [SweepProgress(num_samples, mode)] if progress and not verbose else []
    run_config = rtune.RunConfig(
        name=name, storage_path=str(storage_path), verbose=verbose, callbacks=callbacks
    )
    t0 = time.time()
    if resume:
        if not rtune.Tuner.can_restore(str(exp_dir)):
            raise NshotError(f"--resume: no sweep to resume at {exp_dir}")
        tuner = rtune.Tuner.restore(
            str(exp_dir),
            trainable=trainable,
            param_space=space.to_tune(),
            resume_errored=True,
        )
    else:
        if isinstance(exp_dir, Path) and exp_dir.exists() and any(exp_dir.iterdir()):
            raise NshotError(
                f"sweep directory {exp_dir} already exists: pass --resume to continue it or "
                "--name for a new sweep"
            )
        tuner = rtune.Tuner(
            trainable,
            param_space=space.to_tune(),
            tune_config=tune_config,
            run_config=run_config,
        )
    grid = tuner.fit()
    wall = time.time() - t0

    outcomes: list[TrialOutcome] = []
    for r in grid:
        m = dict(r.metrics or {})
        f = m.get("f")
        f = float(f) if isinstance(f, int | float) and math.isfinite(float(f)) else None
        searched = {k: r.config[k] for k in space.params if k in (r.config or {})}
        outcomes.append(
            TrialOutcome(
                trial_id=str(m.get("trial_id", r.path.rsplit("/", 1)[-1] if r.path else "?")),
                config=searched,
                f=f,
                h=[list(map(float, row)) for row in (m.get("h") or [])],
                reports=int(m.get("training_iteration", 0) or 0),
                error=str(r.error) if r.error else None,
                index=_trial_index(m.get("experiment_tag")),
            )
        )
    # in the order the searcher proposed them (Tune's result grid has its own order)
    outcomes.sort(key=lambda o: (o.index is None, o.index or 0))
    done = [o for o in outcomes if o.f is not None]
    best = None
    if done:
        best = max(done, key=lambda o: o.f) if mode == "max" else min(done, key=lambda o: o.f)
    history_path = None
    if save_history and done:
        from nshot.tune.history import Trial, save_task

        history_path = save_task(
            [Trial(o.trial_id, o.config, o.f, _h_array(o.h)) for o in done],
            method=method_name,
            preset=cfg.preset,
            space=space,
            metric=metric,
            mode=mode,
            dataset=dataset,
            directory=history_dir,
        )
    extra = {}
    info = getattr(search_alg, "searcher", search_alg)
    if hasattr(info, "summary"):
        extra["searcher"] = info.summary()
    return TuneResult(
        experiment_dir=exp_dir,
        metric=metric,
        mode=mode,
        best_config=best.config if best else None,
        best_f=best.f if best else None,
        trials=outcomes,
        history_path=history_path,
        wall_s=wall,
        extra=extra,
    )


def _trial_index(tag: Any) -> int | None:
    """The proposal index Tune puts at the start of a trial's experiment tag (``"15_lr=..."``)."""
    head = str(tag or "").split("_", 1)[0]
    return int(head) if head.isdigit() else None


def _h_array(h: list[list[float]]):
    import numpy as np

    return np.asarray(h, dtype=np.float64) if h else np.zeros((0, 1))


def _expected_reports(cfg: MethodConfig) -> int:
    """Reports a full trial makes (ASHA's max_t): one per ``log_every`` steps."""
    return max(1, math.ceil(cfg.steps / max(1, cfg.log_every)))
