"""nshot's Python API: the command line's subcommands as functions.

======================================  ==========================================
Python                                  command line
======================================  ==========================================
:func:`list_methods`                    ``nshot list``
:func:`train`                           ``nshot train METHOD``
:func:`load`                            (the predictor ``nshot serve`` wraps)
:func:`evaluate`                        ``nshot eval METHOD --checkpoint PATH``
:func:`tune`                            ``nshot tune METHOD``
:func:`reproduce`                       ``nshot reproduce METHOD``
======================================  ==========================================

Each is reachable from the package itself (``nshot.train(...)``, ``nshot.load(...)``, ...)
without importing torch or Ray until it is called. The functions call what the command line
calls (:func:`nshot.train.fit`, :func:`nshot.train.load_checkpoint`, :func:`nshot.tune.run.tune`,
:func:`nshot.reproduce.run`) and check their arguments the same way, before Ray starts: an
unknown method, preset or config field is an :class:`~nshot.errors.NshotError` that names it
and suggests the closest names.

Checkpoints are read only through :func:`nshot.train.checkpoint.load_checkpoint`:
safetensors and JSON, never a pickle, nothing outside the checkpoint directory.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nshot.errors import CheckpointError, ConfigError, UnknownMethodError

if TYPE_CHECKING:
    from nshot.method import Method, MethodConfig, Predictor
    from nshot.train.checkpoint import LoadedCheckpoint
    from nshot.train.runner import Scaling
    from nshot.tune.run import TrialOutcome, TuneResult
    from nshot.tune.space import SearchSpace

__all__ = [
    "SweepResult",
    "TrainedRun",
    "config",
    "eval_config",
    "evaluate",
    "list_methods",
    "load",
    "get_method",
    "load_checkpoint",
    "reproduce",
    "train",
    "tune",
]

#: what a config's overrides may be: a mapping, or ``KEY=VALUE`` strings as ``--set`` takes them
Overrides = Mapping[str, Any] | Sequence[str] | None


# --------------------------------------------------------------------------- results


@dataclass
class TrainedRun:
    """What :func:`train` returns: where the run and its final checkpoint are, and its metrics.

    Attributes
    ----------
    method, preset:
        The method's registered name and the preset the config started from.
    run_dir:
        The run's folder, ``<storage>/<name>`` (a ``str`` URI for remote storage).
    checkpoint:
        The final checkpoint (``None`` when the run wrote none).
    metrics:
        The last metrics the run reported (``step`` among them).
    wall_s:
        Seconds the training took.
    config:
        The resolved config, as the checkpoint records it.
    ray_logs:
        Ray's own log lines of the run, copied into the run folder (local storage only).
    """

    method: str
    preset: str
    run_dir: Path | str
    checkpoint: Path | str | None
    metrics: dict[str, Any]
    wall_s: float
    config: dict[str, Any] = field(default_factory=dict)
    ray_logs: Path | None = None

    def load(self, **kwargs: Any) -> Predictor:
        """The predictor of the final checkpoint (:func:`load`)."""
        return load(self, **kwargs)

    def evaluate(self, overrides: Overrides = None, **kwargs: Any) -> dict[str, float]:
        """The paper's metrics of the final checkpoint (:func:`evaluate`)."""
        return evaluate(self, overrides=overrides, **kwargs)

    def to_json(self) -> dict[str, Any]:
        """What ``nshot train --json`` prints for this run."""
        return {
            "run_dir": str(self.run_dir),
            "checkpoint": str(self.checkpoint) if self.checkpoint else None,
            "metrics": self.metrics,
            "wall_s": self.wall_s,
        }


@dataclass
class SweepResult:
    """What :func:`tune` returns: the best trial, every trial, and where the sweep lives.

    Attributes
    ----------
    best:
        The best finished trial (its ``config``: the searched fields; ``f``: the objective),
        ``None`` when no trial finished.
    trials:
        Every trial, in the order the searcher proposed them (``error`` set on a failed one).
    metric, mode:
        The method's objective and whether it is maximised (``"max"``) or minimised.
    experiment_dir:
        The sweep's folder (``<storage>/<name>``; a ``str`` URI for remote storage).
    history_path:
        The Parquet task the sweep was saved as in the history (``None``: not saved).
    wall_s:
        Seconds the sweep took.
    extra:
        The searcher's own summary, when it gives one.
    """

    best: TrialOutcome | None
    trials: list[TrialOutcome]
    metric: str
    mode: str
    experiment_dir: Path | str
    history_path: Path | None
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def best_config(self) -> dict[str, Any] | None:
        """The searched fields of the best trial."""
        return self.best.config if self.best else None

    @property
    def best_f(self) -> float | None:
        """The objective of the best trial."""
        return self.best.f if self.best else None

    def to_json(self) -> dict[str, Any]:
        """What ``nshot tune --json`` prints for this sweep (the Tune result's own JSON)."""
        from nshot.tune.run import TuneResult

        return TuneResult(
            experiment_dir=self.experiment_dir, metric=self.metric, mode=self.mode,
            best_config=self.best_config, best_f=self.best_f, trials=list(self.trials),
            history_path=self.history_path, wall_s=self.wall_s, extra=dict(self.extra),
        ).to_json()  # fmt: skip

    @classmethod
    def from_result(cls, res: TuneResult) -> SweepResult:
        # the trial TuneResult picked, found by its objective and config
        best = next(
            (
                t
                for t in res.trials
                if t.f is not None and t.f == res.best_f and t.config == res.best_config
            ),
            None,
        )
        return cls(
            best=best,
            trials=list(res.trials),
            metric=res.metric,
            mode=res.mode,
            experiment_dir=res.experiment_dir,
            history_path=res.history_path,
            wall_s=res.wall_s,
            extra=dict(res.extra),
        )


#: a checkpoint directory, a run directory (its newest complete checkpoint), or a trained run
CheckpointLike = str | os.PathLike | TrainedRun


# --------------------------------------------------------------------------- argument checks


def _did_you_mean(name: Any, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(name), list(choices), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def get_method(name: str) -> Method:
    """The registered method ``name`` (an instance of its :class:`~nshot.method.Method`).

    Raises
    ------
    UnknownMethodError
        No method has that name; the message suggests the closest names and lists them all.
    """
    from nshot.method import available, get

    if not isinstance(name, str) or not name:
        raise UnknownMethodError(f"a method is named by a non-empty string, got {name!r}")
    try:
        return get(name)
    except UnknownMethodError:
        names = available()  # get() has discovered every method by now
        raise UnknownMethodError(
            f"unknown method {name!r}{_did_you_mean(name, names)}; available: "
            f"{', '.join(names) or 'none'}"
        ) from None


def _overrides(overrides: Overrides) -> dict[str, Any]:
    from nshot.method import parse_overrides

    if overrides is None:
        return {}
    if isinstance(overrides, str):
        return parse_overrides([overrides])
    if isinstance(overrides, Mapping):
        return dict(overrides)
    if isinstance(overrides, Sequence) and all(isinstance(o, str) for o in overrides):
        return parse_overrides(overrides)
    raise ConfigError(
        f"overrides: expected a dict of config fields or KEY=VALUE strings, got {overrides!r}"
    )


def _check_fields(cls: type[MethodConfig], keys: Sequence[str]) -> None:
    fields = [f for f in cls.model_fields if f != "preset"]
    for key in keys:
        if key == "preset":
            raise ConfigError(
                f"{cls.__name__}: field 'preset' is chosen with preset=, not as an override"
            )
        if key not in cls.model_fields:
            raise ConfigError(
                f"{cls.__name__}: field {key!r}: unknown field{_did_you_mean(key, fields)}"
            )


def config(
    method_name: str,
    preset: str = "small",
    overrides: Overrides = None,
    *,
    allow_download: bool = False,
) -> MethodConfig:
    """A method's validated config: a preset with field overrides (``nshot ... --set``).

    Parameters
    ----------
    method_name:
        A registered method (:func:`list_methods`).
    preset:
        ``smoke`` (seconds), ``small`` (minutes on a laptop), ``paper``, or one the method adds.
    overrides:
        Config fields to change: ``{"steps": 20}``, or ``["steps=20"]`` as ``--set`` takes them
        (values read as JSON when they can be).
    allow_download:
        LLM methods: let Hugging Face fetch a hub model (``--allow-download``).

    Raises
    ------
    UnknownMethodError, ConfigError
        An unknown method, preset or field (with the closest names), or a value out of range.
    """
    m = get_method(method_name)
    cls = m.Config
    if not isinstance(preset, str) or preset not in cls.PRESETS:
        raise ConfigError(
            f"{cls.__name__}: field 'preset': unknown preset {preset!r}"
            f"{_did_you_mean(preset, sorted(cls.PRESETS))}; choose one of {sorted(cls.PRESETS)}"
        )
    values = _overrides(overrides)
    if allow_download:
        values["allow_download"] = True  # a method without model downloads rejects it
    _check_fields(cls, list(values))
    return m.config(preset, **values)


def _scaling(
    workers: int | None,
    scale: str | None,
    gpus_per_worker: float | None,
    cpus_per_worker: float | None,
) -> Scaling:
    """The Ray Train scaling the command line's ``--workers/--scale/--*-per-worker`` give."""
    from nshot.train.runner import Scaling

    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)):
        raise ConfigError(f"workers={workers!r}: an integer >= 0 (0: in-process)")
    if scale:
        s = Scaling.preset(scale)
        if workers is not None:
            s.workers = workers
    else:
        s = Scaling(workers=workers or 0)
    if gpus_per_worker is not None:
        s.gpus_per_worker = gpus_per_worker
    if cpus_per_worker is not None:
        s.cpus_per_worker = cpus_per_worker
    s.validate()
    return s


@contextmanager
def _env(name: str, value: str | None) -> Iterator[None]:
    """``$name`` set to ``value`` (left as it is when ``None``) inside the block."""
    if value is None:
        yield
        return
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


# --------------------------------------------------------------------------- list, load


def list_methods() -> dict[str, str]:
    """The registered methods: name -> the paper's title (``nshot list``).

    Every built-in method and every method a package registers under the ``nshot.methods``
    entry point, sorted by name, whether or not their extra is installed here.
    ``nshot.method.describe(name)`` has the rest (area, version, presets, the extra it needs and
    which of its modules are missing).

    Examples
    --------
    >>> import nshot
    >>> nshot.list_methods()["tail"]
    'TAIL: universal algorithm-implicit meta-learner'
    """
    from nshot.method import available, describe

    return {name: describe(name)["paper"] for name in available()}


def _checkpoint_path(path: CheckpointLike) -> str | os.PathLike:
    if isinstance(path, TrainedRun):
        if path.checkpoint is None:
            raise CheckpointError(f"the run {path.run_dir} wrote no checkpoint")
        return path.checkpoint
    if not isinstance(path, str | os.PathLike) or not str(path).strip():
        raise CheckpointError(
            f"expected the path of a checkpoint or run folder (or a TrainedRun), got {path!r}"
        )
    return path


def load_checkpoint(
    path: CheckpointLike, *, method: str | None = None, allow_earlier: bool = False
) -> LoadedCheckpoint:
    """Verify and open a checkpoint folder, or a run folder's newest complete checkpoint.

    The same rule ``nshot eval`` and ``nshot serve`` follow
    (:func:`nshot.train.checkpoint.load_checkpoint`): the newest checkpoint of a run folder
    must have its ``state.json`` (``allow_earlier=True`` takes the newest complete one before
    it, with a warning); every file is a plain file inside the checkpoint, checked against the
    sha256 in ``state.json``; only safetensors and JSON are read, never a pickle.

    Raises
    ------
    CheckpointError
        The path is neither a checkpoint nor a run folder holding one, or the checkpoint is
        corrupt, too large, or belongs to another method than ``method``; the message names
        the path.
    """
    from nshot.train.checkpoint import load_checkpoint as verified

    # an unknown method is told before anything is read
    method_name = get_method(method).name if method is not None else None
    return verified(_checkpoint_path(path), method=method_name, allow_earlier=allow_earlier)


def load(
    path: CheckpointLike, *, method: str | None = None, allow_earlier: bool = False
) -> Predictor:
    """The predictor of a checkpoint folder or of a run folder's newest complete checkpoint.

    The method is the one the checkpoint's ``state.json`` names; the predictor is the object
    ``nshot serve`` wraps, with typed ``Request``/``Response`` schemas.

    Parameters
    ----------
    path:
        A checkpoint folder (holding ``state.json``), a run folder (``<storage>/<run name>``,
        its newest checkpoint is taken), or a :class:`TrainedRun`.
    method:
        When given, the checkpoint must belong to this method.
    allow_earlier:
        When a run folder's newest checkpoint is incomplete (no ``state.json``), take the
        newest complete one before it instead of failing.

    Returns
    -------
    Predictor
        Call it with a request: ``pred(pred.Request(**body))``; ``pred.example_request()``
        is a body it answers.

    Raises
    ------
    CheckpointError
        The path is neither a checkpoint nor a run folder holding one (the message names it),
        or the checkpoint fails a check of :func:`load_checkpoint`.
    UnknownMethodError
        The checkpoint's method is not registered in this installation.

    Examples
    --------
    >>> pred = nshot.load("~/.cache/nshot/runs/tail-small")  # doctest: +SKIP
    >>> pred(pred.Request(**pred.example_request())).labels  # doctest: +SKIP
    """
    ckpt = load_checkpoint(path, method=method, allow_earlier=allow_earlier)
    return _method_of(ckpt).predictor(ckpt)


def _method_of(ckpt: LoadedCheckpoint) -> Method:
    from nshot.method import available, get

    try:
        return get(ckpt.method)
    except UnknownMethodError:
        raise UnknownMethodError(
            f"checkpoint {ckpt.path} belongs to method {ckpt.method!r}, which is not registered "
            f"here (available: {', '.join(available()) or 'none'})"
        ) from None


# --------------------------------------------------------------------------- train, evaluate


def train(
    method: str,
    preset: str = "small",
    *,
    overrides: Overrides = None,
    name: str | None = None,
    storage: str | os.PathLike | None = None,
    workers: int | None = None,
    scale: str | None = None,
    gpus_per_worker: float | None = None,
    cpus_per_worker: float | None = None,
    resume: bool = False,
    overwrite: bool = False,
    max_failures: int = 0,
    allow_earlier: bool = False,
    allow_download: bool = False,
    verbose: bool = False,
) -> TrainedRun:
    """Train a method with Ray Train (``nshot train METHOD``).

    Every argument is checked before Ray starts; Ray starts embedded on this machine unless it
    is running already or ``$RAY_ADDRESS`` names a cluster.

    Parameters
    ----------
    method:
        A registered method (:func:`list_methods`).
    preset:
        ``smoke`` (seconds), ``small`` (minutes on a laptop), ``paper``, or one the method adds.
    overrides:
        Config fields to change (``--set``): ``{"steps": 200}`` or ``["steps=200"]``.
    name:
        The run's name, one path component (default ``<method>-<preset>``).
    storage:
        Where runs live: a folder or a URI (``s3://bucket/runs``); default ``$NSHOT_STORAGE``,
        else ``~/.cache/nshot/runs``. The run is ``<storage>/<name>``.
    workers:
        Ray Train workers; 0 (the default without ``scale``) runs the loop in this process.
    scale:
        A scaling preset: ``local``, ``cpu2``, ``gpu1``, ``gpu8``, ``multinode``.
    gpus_per_worker, cpus_per_worker:
        Resources of each worker (override ``scale``'s).
    resume:
        Continue the run ``<storage>/<name>`` from its newest checkpoint.
    overwrite:
        Replace an existing nshot run of that name.
    max_failures:
        Worker-group restarts allowed.
    allow_earlier:
        With ``resume``: continue from the newest complete checkpoint when the newest one is
        incomplete.
    allow_download:
        LLM methods: let Hugging Face fetch a hub model.
    verbose:
        Also show Ray Train's own INFO lines.

    Returns
    -------
    TrainedRun
        ``checkpoint`` (its final checkpoint), ``metrics``, ``run_dir``; ``.load()`` gives the
        predictor, ``.evaluate()`` the paper's metrics.

    Raises
    ------
    UnknownMethodError, ConfigError, NshotError
        A bad argument (before Ray starts), or an existing run without ``resume``/``overwrite``.
    StorageError
        Writing a checkpoint failed; the message names the newest complete checkpoint.
    """
    from nshot.train.runner import fit

    cfg = config(method, preset, overrides, allow_download=allow_download)
    scaling = _scaling(workers, scale, gpus_per_worker, cpus_per_worker)
    res = fit(
        method,
        cfg,
        scaling=scaling,
        storage=storage,
        name=name,
        resume=resume,
        overwrite=overwrite,
        max_failures=max_failures,
        allow_earlier=allow_earlier,
        verbose=verbose,
    )
    return TrainedRun(
        method=method,
        preset=cfg.preset,
        run_dir=res.run_dir,
        checkpoint=res.checkpoint,
        metrics=dict(res.metrics),
        wall_s=res.wall_s,
        config=cfg.model_dump(),
        ray_logs=res.ray_logs,
    )


def eval_config(m: Method, ckpt: LoadedCheckpoint, overrides: Overrides = None) -> MethodConfig:
    """The checkpoint's config with ``overrides`` (``nshot eval --set``).

    Only the method's ``EVAL_FIELDS`` (e.g. TAIL's ``eval_episodes``) may take another value:
    every other field shapes the model the weights belong to and is fixed by the checkpoint.
    """
    import json

    base = m.config_from_dict(ckpt.config)
    values = _overrides(overrides)
    if not values:
        return base
    _check_fields(type(base), list(values))
    cfg = base.replace(**values)  # a bad value is named here
    allowed = type(base).EVAL_FIELDS
    for key in values:
        if key not in allowed and getattr(cfg, key) != getattr(base, key):
            fixed = json.dumps(getattr(base, key), default=str)
            raise ConfigError(
                f"{type(base).__name__}: field {key!r} shapes the model and is fixed by the "
                f"checkpoint ({fixed}); an evaluation may override only "
                f"{', '.join(sorted(allowed))}"
            )
    return cfg


def evaluate(
    path: CheckpointLike,
    *,
    overrides: Overrides = None,
    method: str | None = None,
    allow_earlier: bool = False,
) -> dict[str, float]:
    """The paper's metrics of a checkpoint (``nshot eval METHOD --checkpoint PATH``).

    Parameters
    ----------
    path:
        A checkpoint folder, a run folder (its newest complete checkpoint), or a
        :class:`TrainedRun`.
    overrides:
        Evaluation fields to change (``--set``), e.g. ``{"eval_episodes": 50}``; only the
        method's ``EVAL_FIELDS`` may differ from the checkpoint's config.
    method:
        When given, the checkpoint must belong to this method (read from it otherwise).
    allow_earlier:
        As for :func:`load`.

    Returns
    -------
    dict[str, float]
        The method's metrics, a flat dict.
    """
    ckpt = load_checkpoint(path, method=method, allow_earlier=allow_earlier)
    m = _method_of(ckpt)
    return m.evaluate(ckpt, eval_config(m, ckpt, overrides))


# --------------------------------------------------------------------------- tune, reproduce


def tune(
    method: str,
    preset: str = "small",
    *,
    overrides: Overrides = None,
    search: str = "random",
    num_samples: int = 10,
    max_concurrent: int = 2,
    scheduler: str | None = None,
    space: SearchSpace | Mapping[str, Any] | str | None = None,
    search_options: Mapping[str, Any] | None = None,
    seed: int | None = None,
    workers: int | None = None,
    scale: str | None = None,
    gpus_per_worker: float | None = None,
    cpus_per_worker: float | None = None,
    storage: str | os.PathLike | None = None,
    name: str | None = None,
    resume: bool = False,
    history: str | os.PathLike | None = None,
    save_history: bool = True,
    reuse_actors: bool | None = None,
    allow_download: bool = False,
    verbose: bool = False,
    progress: bool = True,
) -> SweepResult:
    """Sweep a method's config with Ray Tune (``nshot tune METHOD``).

    Parameters
    ----------
    method, preset, overrides, allow_download:
        The base config, as for :func:`train`; trials change the searched fields only.
    search:
        ``random``, ``optuna``, ``ax``, ``auxbo`` or a searcher a method registers.
    num_samples, max_concurrent:
        Trials in the sweep, and how many run at once.
    scheduler:
        ``"asha"`` (early stopping on the objective) or ``None``.
    space:
        The search space, overriding the method's declared one: a
        :class:`~nshot.tune.space.SearchSpace`, or its JSON form (a dict or a string)
        ``{"lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": true}}``.
    search_options:
        The searcher's options, e.g. auxbo's ``{"n_init": 2}``.
    seed:
        The searcher's seed (default: the config's).
    workers, scale, gpus_per_worker, cpus_per_worker:
        Each trial's Ray Train scaling, as for :func:`train` (0 workers: in the trial).
    storage, name:
        The sweep lives in ``<storage>/<name>`` (default ``$NSHOT_STORAGE/tune`` and
        ``<method>-<preset>-<search>``).
    resume:
        Continue an interrupted sweep.
    history, save_history:
        The history folder (default ``$NSHOT_CACHE/history``), and whether the finished sweep
        is saved there for later sweeps to learn from.
    reuse_actors:
        Run the next in-process trial in a finished trial's process (default: yes when
        ``workers`` is 0).
    verbose, progress:
        Tune's own status tables; nshot's line per finished trial (on stderr).

    Returns
    -------
    SweepResult
        ``best`` (the best trial: ``config``, ``f``), ``trials``, ``metric``, ``mode``.
    """
    from nshot.tune.run import tune as run_sweep
    from nshot.tune.searchers import UnknownSearcherError, available_searchers
    from nshot.tune.space import SearchSpace

    cfg = config(method, preset, overrides, allow_download=allow_download)
    scaling = _scaling(workers, scale, gpus_per_worker, cpus_per_worker)
    searchers = available_searchers()
    if search not in searchers:
        raise UnknownSearcherError(
            f"unknown searcher {search!r}{_did_you_mean(search, searchers)}; available: "
            f"{', '.join(searchers)}"
        )
    if space is not None and not isinstance(space, SearchSpace):
        space = SearchSpace.from_json(space)
    res = run_sweep(
        method,
        cfg,
        search=search,
        num_samples=num_samples,
        max_concurrent=max_concurrent,
        scheduler=scheduler,
        space=space,
        scaling=scaling,
        storage=storage,
        name=name,
        resume=resume,
        history_dir=history,
        save_history=save_history,
        search_options=dict(search_options or {}),
        seed=seed,
        verbose=1 if verbose else 0,
        progress=progress,
        reuse_actors=reuse_actors,
    )
    return SweepResult.from_result(res)


def reproduce(
    method: str,
    preset: str = "small",
    *,
    out: str | os.PathLike | None = None,
    overrides: Overrides = None,
    in_process: bool = False,
    allow_download: bool = False,
) -> dict[str, Any]:
    """Run the paper's comparison (``nshot reproduce METHOD``).

    Writes ``results.json``, ``results.md`` and ``results.png`` into ``out`` (into the
    method's own ``methods/<name>/results/`` folder they get the committed names).

    Parameters
    ----------
    method, preset, overrides, allow_download:
        The config, as for :func:`train`.
    out:
        The output folder (default ``results/<method>-<preset>`` in the current folder).
    in_process:
        Run the comparison's jobs one after another in this process, without Ray (for a
        debugger or a profiler; the same results, slower).

    Returns
    -------
    dict
        The results (what ``results.json`` holds): ``rows[system][metric]``, ``metrics``,
        ``claims`` (each with ``holds``), ``run`` (the provenance).
    """
    from nshot.reproduce import run as run_comparison

    cfg = config(method, preset, overrides, allow_download=allow_download)
    target = Path(out) if out is not None else Path(f"results/{method}-{cfg.preset}")
    recorded = _overrides(overrides)
    if allow_download:
        recorded["allow_download"] = True
    with _env("NSHOT_IN_PROCESS", "1" if in_process else None):
        return run_comparison(method, cfg, target, recorded)
