"""One experiment runner for every method's ``experiments()``.

A reproduction is a grid of jobs — (system, seed), or (system, seed, setting) — each a plain
function run as a Ray task with the resources it declares. :func:`run_jobs` submits them to the
local Ray (or the cluster at ``RAY_ADDRESS``), shows one progress bar, and gathers the results
by key; :func:`aggregate` turns per-job metric dicts into the mean ± spread per system that a
:class:`~nshot.method.ResultsTable` holds, keeping the per-seed values for the claims' paired
tests::

    jobs = [Job((system, seed), run_one, (cfg.model_dump(), system, seed))
            for system, seed in grid(SYSTEMS, range(cfg.seeds))]
    results = run_jobs(jobs, description="caos small")
    rows, stds, samples = aggregate(results)
    return ResultsTable(method="caos", preset=cfg.preset, seeds=cfg.seeds, metrics=METRICS,
                        rows=rows, stds=stds, samples=samples)

A job that fails stops the run with an :class:`~nshot.errors.NshotError` naming its key and the
error (the other jobs are cancelled, and gone, before it is raised). An exception a job raises is
never retried; a job whose worker process dies under it (the OS's out-of-memory killer, a lost
node) runs again, once by default (``max_retries``), as Ray retries a task — jobs are seeded, so
a rerun gives the same figures.

``NSHOT_IN_PROCESS=1`` (``nshot reproduce --in-process``) runs the jobs one after another in the
calling process instead, without Ray: a debugger's breakpoints and a profiler then see every
job, and a machine where Ray cannot start still reproduces (slower: no two jobs at once). Each
job runs with as many torch threads as CPUs it declares, as in a Ray task, so the same jobs with
the same seeds give the same figures. :func:`share` (data stored once for many jobs) and
:func:`submit` (one job started ahead of the grid that uses its result) work on both paths.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import math
import os
import sys
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nshot.errors import ConfigError, NshotError

Key = tuple[Hashable, ...]


@dataclass(frozen=True)
class Job:
    """One task of the grid: ``fn(*args, **kwargs)`` under ``key`` with its resources."""

    key: Key
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    memory: int | None = None  # bytes of RAM Ray reserves for the task
    #: the job trains (or fine-tunes) a network: under a job scale (:func:`scaled`,
    #: ``nshot reproduce --scale``) it takes the scale's CPUs and GPUs instead of its own
    trains: bool = False


@dataclass(frozen=True)
class JobScale:
    """The resources every job that trains a network gets (``nshot reproduce --scale``): a
    scale preset's ``cpus_per_worker`` and ``gpus_per_worker``."""

    name: str
    cpus: float
    gpus: float

    @classmethod
    def preset(cls, name: str) -> JobScale:
        from nshot.train.runner import Scaling

        s = Scaling.preset(name)
        return cls(name, float(s.cpus_per_worker), float(s.gpus_per_worker))


_SCALE: contextvars.ContextVar[JobScale | None] = contextvars.ContextVar("scale", default=None)
_PLAN: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar(
    "plan", default=None
)


@contextlib.contextmanager
def scaled(scale: JobScale | None) -> Iterator[None]:
    """Run the jobs submitted inside the block at ``scale`` (``None``: as they declare)."""
    token = _SCALE.set(scale)
    try:
        yield
    finally:
        _SCALE.reset(token)


class PlanComplete(Exception):  # noqa: N818 - a signal, not an error
    """Raised by :func:`run_jobs` while planning (:func:`planning`): the comparison's grid is
    known, and nothing has run."""


@contextlib.contextmanager
def planning() -> Iterator[list[dict[str, Any]]]:
    """Collect the jobs a comparison would run, without running any: inside the block
    :func:`submit` records its job and :func:`run_jobs` records its grid, then raises
    :class:`PlanComplete` (the comparison's later phases depend on results that do not
    exist). Yields the list of job plans (:func:`job_plan`)."""
    plan: list[dict[str, Any]] = []
    token = _PLAN.set(plan)
    try:
        yield plan
    finally:
        _PLAN.reset(token)


def is_planning() -> bool:
    """Whether the comparison is being planned (``nshot reproduce --dry-run``): a comparison
    skips what needs its data then (a check that a user's dataset folder exists, a download),
    since only its grid of jobs is asked for."""
    return _PLAN.get() is not None


def resources(job: Job) -> tuple[float, float]:
    """``(cpus, gpus)`` the job runs with: the scale's for a training job under a scale."""
    scale = _SCALE.get()
    if scale is not None and job.trains:
        return scale.cpus, scale.gpus
    return job.num_cpus, job.num_gpus


def job_plan(job: Job) -> dict[str, Any]:
    """What a job asks for: its key, function, CPUs, GPUs, torch threads (one per CPU, as
    Ray sets ``OMP_NUM_THREADS`` for a task), memory, and whether it trains a network."""
    cpus, gpus = resources(job)
    return {
        "key": [str(k) for k in job.key],
        "fn": f"{job.fn.__module__}.{job.fn.__qualname__}",
        "cpus": cpus,
        "gpus": gpus,
        "threads": threads_for(cpus),
        "memory": job.memory,
        "trains": job.trains,
    }


def threads_for(cpus: float) -> int:
    """torch threads of a job with ``cpus`` CPUs."""
    return max(1, int(cpus))


def _threaded(fn: Callable[..., Any], threads: int, *args: Any, **kwargs: Any) -> Any:
    """A job as a Ray task: torch runs ``threads`` threads (one per CPU the task holds), so a
    job's own code never sets them."""
    import torch

    torch.set_num_threads(threads)
    return fn(*args, **kwargs)


def grid(*axes: Iterable[Hashable]) -> list[Key]:
    """Every combination of the axes, in order: ``grid(systems, seeds[, settings])``."""
    return [tuple(k) for k in itertools.product(*axes)]


def run_jobs(
    jobs: Sequence[Job],
    *,
    description: str = "experiments",
    progress: bool = True,
    max_retries: int = 1,
) -> dict[Key, Any]:
    """Run ``jobs`` as Ray tasks and return ``{key: result}`` in the jobs' order.

    One progress bar (on stderr) counts finished jobs; ``progress=False`` turns it off. A job
    whose worker dies runs again up to ``max_retries`` times (an exception it raises, never).
    With ``NSHOT_IN_PROCESS=1`` (:func:`in_process`) the jobs run here, in order, without Ray."""
    keys = [j.key for j in jobs]
    if len(set(keys)) != len(keys):
        raise NshotError(f"{description}: two jobs share a key")
    plan = _PLAN.get()
    if plan is not None:
        plan.extend(job_plan(j) for j in jobs)
        raise PlanComplete(description)
    if not jobs:
        return {}
    if in_process():
        return _run_here(jobs, description, progress)
    import ray

    from nshot.train.runner import ensure_ray

    ensure_ray()
    remote = ray.remote(_threaded)
    refs: dict[Any, Key] = {}
    for job in jobs:
        cpus, gpus = resources(job)
        options: dict[str, Any] = {"num_cpus": cpus, "num_gpus": gpus, "max_retries": max_retries}
        if job.memory is not None:
            options["memory"] = job.memory
        options["name"] = job.fn.__qualname__
        ref = remote.options(**options).remote(job.fn, threads_for(cpus), *job.args, **job.kwargs)
        refs[ref] = job.key
    done: dict[Key, Any] = {}
    pending = list(refs)
    bar = _Progress(description, len(jobs)) if progress else None
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            ref = ready[0]
            try:
                done[refs[ref]] = ray.get(ref)
            except Exception as err:  # noqa: BLE001 - name the job, then stop the rest
                _cancel(pending)
                cause = getattr(err, "cause", None) or err
                raise _job_failed(description, refs[ref], cause) from None
            if bar is not None:
                bar.advance(refs[ref])
    finally:
        if bar is not None:
            bar.close()
    return {k: done[k] for k in keys}


def _cancel(refs: list[Any], timeout_s: float = 30.0) -> None:
    """Cancel ``refs`` (killing the workers that run them) and wait until each has settled, so
    that no job of a failed run is still running, or still to be killed, once the error is
    raised: the next run's tasks cannot land on a worker that a late cancel then kills."""
    import ray

    for ref in refs:
        ray.cancel(ref, force=True)
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)


def share(value: Any) -> Any:
    """Store ``value`` once for many jobs of a comparison (a dataset, a trained model): on Ray,
    a reference in the object store (``ray.put``; a job given it as an argument receives the
    value); in-process, the value itself. Pass the result as an argument of a :class:`Job`."""
    if in_process() or _PLAN.get() is not None:  # planning: nothing is stored
        return value
    import ray

    from nshot.train.runner import ensure_ray

    ensure_ray()
    return ray.put(value)


def submit(job: Job, *, max_retries: int = 1) -> Any:
    """Start one job now, ahead of the :func:`run_jobs` call whose jobs take its result as an
    argument (a pre-training that later jobs fine-tune, while the jobs that do not need it run
    beside it): on Ray, a reference to the task's result (Ray hands the value to each job given
    it, once it is ready); in-process, the result itself, computed here and now. :func:`fetch`
    turns either into the value. A worker that dies under the job reruns it up to
    ``max_retries`` times, as in :func:`run_jobs`."""
    plan = _PLAN.get()
    if plan is not None:  # planning: recorded, not run; its result is never needed
        plan.append(job_plan(job))
        return None
    if in_process():
        return _run_here([job], f"job {job.key}", progress=False)[job.key]
    import ray

    from nshot.train.runner import ensure_ray

    ensure_ray()
    cpus, gpus = resources(job)
    options: dict[str, Any] = {"num_cpus": cpus, "num_gpus": gpus, "name": job.fn.__qualname__}
    if job.memory is not None:
        options["memory"] = job.memory
    return (
        ray.remote(_threaded)
        .options(max_retries=max_retries, **options)
        .remote(job.fn, threads_for(cpus), *job.args, **job.kwargs)
    )


def check_gpus(job_gpus: float, field: str = "job_gpus") -> None:
    """Refuse, naming ``field``, jobs that reserve more GPUs than the Ray cluster has (Ray would
    hold them pending forever). In process (:func:`in_process`) jobs reserve nothing and run on
    this process's device: no check."""
    if job_gpus <= 0 or in_process() or _PLAN.get() is not None:
        return
    import ray

    from nshot.train.runner import ensure_ray

    ensure_ray()
    have = float(ray.cluster_resources().get("GPU", 0.0))
    if have < job_gpus:
        raise ConfigError(
            f"field '{field}': each job reserves {job_gpus:g} GPU(s) but the Ray cluster has "
            f"{have:g}; set {field}=0 to run the jobs on CPUs (or add GPU nodes first)"
        )


def fetch(handle: Any) -> Any:
    """The value behind what :func:`share` or :func:`submit` returned (waits for a job).
    Without Ray imported there can be no reference, so in-process runs never import it (a
    machine without Ray, ``NSHOT_IN_PROCESS=1``)."""
    ray = sys.modules.get("ray")
    if ray is None:
        return handle
    return ray.get(handle) if isinstance(handle, ray.ObjectRef) else handle


def _job_failed(description: str, key: Key, err: BaseException) -> NshotError:
    return NshotError(f"{description}: job {key} failed: {type(err).__name__}: {err}")


def in_process() -> bool:
    """True when ``NSHOT_IN_PROCESS`` asks for the jobs to run in this process, without Ray."""
    value = os.environ.get("NSHOT_IN_PROCESS", "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise NshotError(f"NSHOT_IN_PROCESS={value!r}: expected 1 or 0")


def _run_here(jobs: Sequence[Job], description: str, progress: bool) -> dict[Any, Any]:
    import torch

    done: dict[Key, Any] = {}
    bar = _Progress(description, len(jobs)) if progress else None
    try:
        for job in jobs:
            args, kwargs = _resolved(job.args), _resolved(job.kwargs)
            threads = torch.get_num_threads()
            torch.set_num_threads(threads_for(resources(job)[0]))  # a Ray task's OMP_NUM_THREADS
            try:
                done[job.key] = job.fn(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - name the job, as the Ray path does
                raise _job_failed(description, job.key, err) from err
            finally:
                torch.set_num_threads(threads)
            if bar is not None:
                bar.advance(job.key)
    finally:
        if bar is not None:
            bar.close()
    return done


def _resolved(values):
    """The arguments a Ray task would see: an object-store reference at the top level of the
    arguments is fetched (a comparison that called ``ray.put`` itself has started Ray)."""
    if isinstance(values, dict):
        return {k: fetch(v) for k, v in values.items()}
    return tuple(fetch(v) for v in values)


class _Progress:
    """One rich progress bar on stderr. Where stderr is not a terminal (a log file, the log of
    ``ray job submit``, a captured stream) a bar draws nothing until it stops, so plain lines
    stand in for it: one when the jobs start, then one at the first finished job, at every
    ``ceil(total / 20)``-th and at the last, each with the count, the elapsed time and the ETA
    (as ``nshot train`` and ``nshot tune`` write them) and the key of the job that finished (at
    most 23 lines whatever the grid's size)."""

    def __init__(self, description: str, total: int) -> None:
        from rich.console import Console

        self.console = Console(file=sys.stderr)
        self.description, self.total, self.finished = description, total, 0
        self.plain = not self.console.is_terminal
        if self.plain:
            self.every = max(1, math.ceil(total / 20))
            self.t0 = time.monotonic()
            self._line(f"{total} jobs")
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[last]}"),
            console=self.console,
            transient=False,
        )
        self.task = self.progress.add_task(description, total=total, last="")
        self.progress.start()

    def _line(self, text: str) -> None:
        print(f"[nshot] {self.description}: {text}", file=sys.stderr, flush=True)

    def advance(self, key: Key) -> None:
        self.finished += 1
        last = "/".join(map(str, key))
        if not self.plain:
            self.progress.update(self.task, advance=1, last=f"done: {last}")
            return
        n = self.finished
        if n == 1 or n == self.total or n % self.every == 0:
            from nshot.train.session import format_duration

            elapsed = time.monotonic() - self.t0
            eta = (
                f", ETA {format_duration(elapsed / n * (self.total - n))}" if n < self.total else ""
            )
            self._line(f"{n}/{self.total} done | {format_duration(elapsed)}{eta} (last: {last})")

    def close(self) -> None:
        if not self.plain:
            self.progress.stop()


def aggregate(
    results: dict[Key, dict[str, float | None]],
    *,
    spread: str = "std",
) -> tuple[
    dict[str, dict[str, float | None]],
    dict[str, dict[str, float | None]],
    dict[str, dict[str, list[float | None]]],
]:
    """``(rows, stds, samples)`` from per-job metric dicts keyed ``(system, seed, ...)``.

    ``rows[system][metric]`` is the mean over the system's jobs (``None`` when any job gave no
    value), ``stds`` the spread: ``"std"`` (population standard deviation, as numpy's
    default), ``"sample_std"`` (with Bessel's correction; ``None`` for a single job) or
    ``"ci95"`` (1.96 standard errors, for per-episode results), and
    ``samples[system][metric]`` the values in key order (seeds paired by position across
    systems)."""
    if spread not in ("std", "sample_std", "ci95"):
        raise ValueError("spread must be 'std', 'sample_std' or 'ci95'")
    per: dict[str, dict[str, list[float | None]]] = {}
    for key in results:  # job order: for a grid, every system's seeds in the same order
        system = str(key[0])
        for metric, value in results[key].items():
            per.setdefault(system, {}).setdefault(metric, []).append(
                None if value is None else float(value)
            )
    rows: dict[str, dict[str, float | None]] = {}
    stds: dict[str, dict[str, float | None]] = {}
    order = list(dict.fromkeys(str(k[0]) for k in results))
    for system in order:
        rows[system], stds[system] = {}, {}
        for metric, vals in per[system].items():
            if any(v is None or math.isnan(v) for v in vals):
                rows[system][metric] = stds[system][metric] = None
                continue
            n = len(vals)
            mean = sum(vals) / n  # type: ignore[arg-type]
            var = sum((v - mean) ** 2 for v in vals) / n  # type: ignore[operator]
            sd = math.sqrt(var)
            rows[system][metric] = mean
            sample_sd = math.sqrt(var * n / (n - 1)) if n > 1 else 0.0
            if spread == "std":
                stds[system][metric] = sd
            elif spread == "sample_std":  # numpy's ddof=1, bit for bit
                arr = np.asarray(vals, dtype=np.float64)
                stds[system][metric] = float(np.std(arr, ddof=1)) if n > 1 else None
            else:
                stds[system][metric] = 1.96 * sample_sd / math.sqrt(n)
    samples = {s: per[s] for s in order}
    return rows, stds, samples
