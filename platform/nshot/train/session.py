"""Worker-side helpers for a method's ``train_loop``.

A train loop uses four calls and stays the same in Ray Train's local mode
(``num_workers=0``, in-process) and on a worker group::

    ctx = session.context()                          # rank, world size, device
    model = session.prepare_model(model)             # DDP when world_size > 1
    restored = session.restore(model, optimizer)     # None, or the state to continue from
    ...
    session.report(metrics, step=step, model=model, optimizer=optimizer, extra=...,
                   checkpoint=step % cfg.checkpoint_every == 0)

``report`` writes an nshot checkpoint (safetensors + JSON) on rank 0 and hands it to
``ray.train.report``; every rank must call it at the same steps.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nshot.train.checkpoint import (
    CheckpointWriteError,
    LoadedCheckpoint,
    find_checkpoints,
    load_checkpoint,
    save_checkpoint,
)


@dataclass
class RunInfo:
    """Set by the runner on every worker before the method's train loop starts."""

    method: str
    method_version: str
    config: dict[str, Any]
    local_dir: str | None = None  # local mode: where checkpoints are written directly
    # set when the loop runs inside a Ray Tune trial: {"metric", "mode", "curve"}; reports then
    # carry the trial's objective ``f`` and auxiliary curve ``h`` (nshot.tune.report)
    tune: dict[str, Any] | None = None
    # the loop runs in-process in a Tune trial (no Ray Train worker group): reports go to
    # ray.tune.report and checkpoints to ray.tune's checkpoint of the trial
    in_tune: bool = False
    started: float = field(default_factory=time.time)
    # throughput bookkeeping (samples since the first report, which excludes warm-up)
    _t_first: float | None = None
    _samples_since_first: int = 0
    _progress_start: tuple[int, float] | None = None  # (step, time) of the first report
    _tracker: Any = None


_RUN: RunInfo | None = None


def install_run(info: RunInfo) -> None:
    """Install ``info`` as the run this process trains (done by ``nshot.train.run_loop``)."""
    global _RUN
    _RUN = info


def run_info() -> RunInfo:
    if _RUN is None:
        raise RuntimeError(
            "nshot.train.session is only usable inside a train loop started by nshot.train.fit"
        )
    return _RUN


@dataclass(frozen=True)
class WorkerContext:
    rank: int
    world_size: int
    local_mode: bool
    device: torch.device


def context() -> WorkerContext:
    import ray.train

    info = run_info()
    if info.in_tune:  # in-process in a Tune trial: one worker
        dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        return WorkerContext(0, 1, True, dev)
    ctx = ray.train.get_context()
    local = info.local_dir is not None
    if torch.cuda.is_available():
        try:
            from ray.train.torch import get_device

            device = get_device()
        except Exception:  # noqa: BLE001 - local mode without a device assignment
            device = torch.device("cuda")
    else:
        device = torch.device("cpu")
    return WorkerContext(ctx.get_world_rank(), ctx.get_world_size(), local, device)


def prepare_model(model: torch.nn.Module) -> torch.nn.Module:
    """Move to the worker's device and wrap in DDP when there is more than one worker."""
    ctx = context()
    model = model.to(ctx.device)
    if ctx.world_size > 1:
        from ray.train.torch import prepare_model as ray_prepare

        model = ray_prepare(model, move_to_device=False)
    return model


def _is_deepspeed(model: object) -> bool:
    return hasattr(model, "zero_optimization_stage") and hasattr(model, "module")


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if hasattr(model, "module") else model


@dataclass
class Restored:
    step: int
    extra: dict[str, Any]
    metrics: dict[str, float]
    checkpoint: LoadedCheckpoint


def restore(
    model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None
) -> Restored | None:
    """Load the latest checkpoint of this run into ``model``/``optimizer`` if there is one.

    Without a ``model`` (a loop whose one step is redone on a resume: a closed-form fit, an
    edit) only the step, extra state and metrics are restored; no tensor is read."""
    import ray.train

    info = run_info()
    path: Path | None = None
    if info.in_tune:
        import ray.tune

        ray_ckpt = ray.tune.get_checkpoint()
    else:
        ray_ckpt = ray.train.get_checkpoint()
    if ray_ckpt is not None:
        with ray_ckpt.as_directory() as d:
            loaded = load_checkpoint(d, method=info.method)
            return _apply(loaded, model, optimizer)
    if info.local_dir is not None:
        found = find_checkpoints(info.local_dir) if Path(info.local_dir).exists() else []
        path = found[-1] if found else None
    if path is None:
        return None
    return _apply(load_checkpoint(path, method=info.method), model, optimizer)


def _apply(
    loaded: LoadedCheckpoint,
    model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None,
) -> Restored:
    if model is not None:
        unwrap(model).load_state_dict(loaded.weights())
    if optimizer is not None:
        state = loaded.optimizer_state()
        if state is not None:
            optimizer.load_state_dict(state)
    # materialize the extra state now: a Ray checkpoint directory may be temporary
    return Restored(loaded.step, dict(loaded.extra), dict(loaded.metrics), loaded)


def maybe_inject_fault(step: int, restored: Restored | None) -> None:
    """Fault injection for tests (config ``fail_at_step``/``fail_rank``): on the first
    attempt only (never after a resume), the worker of rank ``fail_rank`` dies at that step."""
    cfg = run_info().config
    if cfg.get("fail_at_step") != step or restored is not None:
        return
    ctx = context()
    if ctx.rank != cfg.get("fail_rank", 0):
        return
    if ctx.local_mode:
        raise RuntimeError(f"injected fault at step {step} (fail_at_step)")
    import ray.train

    # Die only after the controller has registered every report made so far, so the fault
    # is injected "after the last checkpoint committed" and the test is deterministic.
    ray.train.get_all_reported_checkpoints()
    print(
        f"[nshot] injected fault: rank {ctx.rank} exits at step {step}", file=sys.stderr, flush=True
    )
    os._exit(17)


def _progress_line(info: RunInfo, step: int, metrics: dict[str, float]) -> str:
    """``[nshot tail] step 120/500 (24%) loss=0.81 samples_per_s=950 | 36s, ETA 1m54s``: the
    ETA extrapolates the pace since this process's first report."""
    now = time.time()
    total = info.config.get("steps")
    if info._progress_start is None:
        info._progress_start = (step, now)
    first_step, t_first = info._progress_start
    shown = " ".join(f"{k}={v:.4g}" for k, v in metrics.items() if k != "step")
    where = f"step {step}"
    eta = ""
    if isinstance(total, int) and total > 0 and step <= total:
        where += f"/{total} ({100 * step / total:.0f}%)"
        if step > first_step and now > t_first:
            left = (now - t_first) / (step - first_step) * (total - step)
            eta = f", ETA {format_duration(left)}"
    return f"[nshot {info.method}] {where} {shown} | {format_duration(now - info.started)}{eta}"


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def report(
    metrics: dict[str, float],
    *,
    step: int,
    model: torch.nn.Module | dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer | None = None,
    extra: dict[str, Any] | None = None,
    checkpoint: bool = False,
    samples: int | None = None,
) -> None:
    """Report metrics for ``step`` (all ranks), with an nshot checkpoint from rank 0 if asked.

    ``model``: a module (DDP-wrapped, or a DeepSpeed engine whose full weights are gathered) or
    a plain state dict, for methods that checkpoint only what they changed (an edit, Δ rows).

    ``samples``: samples this worker processed since its previous report. The platform then
    adds ``samples_per_s``, the throughput of the whole worker group measured from the first
    report on (so start-up and the first window's warm-up are excluded).
    """
    import ray.train

    info = run_info()
    ctx = context()
    metrics = {k: float(v) for k, v in metrics.items()}
    metrics["step"] = float(step)
    if samples is not None:
        now = time.time()
        if info._t_first is None:
            info._t_first = now
        else:
            info._samples_since_first += samples
            if now > info._t_first:
                rate = info._samples_since_first * ctx.world_size / (now - info._t_first)
                metrics["samples_per_s"] = rate
    # a sweep shows one line per finished trial (nshot.tune.progress), not every trial's steps
    quiet = info.in_tune and os.environ.get("NSHOT_VERBOSE", "").lower() not in ("1", "true", "yes")
    if ctx.rank == 0 and not quiet:
        print(_progress_line(info, step, metrics), file=sys.stderr, flush=True)
    reported = metrics
    if info.tune is not None and ctx.rank == 0 and info.in_tune:
        reported = {**metrics, **_tune_payload(info, metrics)}  # f and the curve h (a list)
    if not checkpoint:
        _report(info, reported)
        return
    name = f"checkpoint_{step:08d}"
    if isinstance(model, dict):  # methods that checkpoint only what they changed
        model_state = model
    elif _is_deepspeed(model):
        # ZeRO partitions: gather the full weights (collective, every rank); DeepSpeed's own
        # optimizer checkpoints are pickles, so its optimizer state is not saved
        from nshot.train.deepspeed import full_state_dict

        model_state = full_state_dict(model)
        optimizer = None
    else:
        model_state = unwrap(model).state_dict()
    kwargs = dict(
        method=info.method,
        method_version=info.method_version,
        config=info.config,
        step=step,
        model_state=model_state,
        metrics=metrics,
        optimizer_state=optimizer.state_dict() if optimizer is not None else None,
        extra=extra,
    )
    if ctx.local_mode:
        path = save_checkpoint(Path(info.local_dir) / name, **kwargs)
        if info.in_tune:
            import ray.tune

            ckpt = ray.tune.Checkpoint.from_directory(str(path))
        else:
            ckpt = ray.train.Checkpoint.from_directory(str(path))
        _report(info, reported, checkpoint=ckpt)
        return
    if ctx.rank != 0:
        ray.train.report(metrics, checkpoint=None, checkpoint_dir_name=name)
        return
    storage = ray.train.get_context().get_storage()
    if _is_local_fs(storage.storage_filesystem):
        # local (or shared) storage: written in place, atomically (save_checkpoint), so a
        # write that fails half way never leaves a checkpoint directory in the run
        path = save_checkpoint(Path(storage.experiment_fs_path) / name, **kwargs)
        ray.train.report(
            metrics,
            checkpoint=ray.train.Checkpoint(str(path), filesystem=storage.storage_filesystem),
            checkpoint_dir_name=name,
            checkpoint_upload_mode=ray.train.CheckpointUploadMode.NO_UPLOAD,
        )
        return
    with tempfile.TemporaryDirectory(prefix="nshot-ckpt-") as tmp:
        path = save_checkpoint(Path(tmp) / name, **kwargs)
        try:
            ray.train.report(
                metrics,
                checkpoint=ray.train.Checkpoint.from_directory(str(path)),
                checkpoint_dir_name=name,
            )
        except OSError as err:  # the upload to the storage URI failed
            if err.errno is None or isinstance(err, CheckpointWriteError):
                raise
            dest = f"{storage.experiment_fs_path}/{name}"
            raise CheckpointWriteError(
                err.errno, err.strerror or str(err), dest, checkpoint=dest
            ) from err


def _is_local_fs(fs: Any) -> bool:
    from pyarrow import fs as pafs

    return isinstance(fs, pafs.LocalFileSystem)


def _tune_payload(info: RunInfo, metrics: dict[str, float]) -> dict[str, Any]:
    from nshot.tune.report import CurveTracker

    if info._tracker is None:
        info._tracker = CurveTracker(**info.tune)
    return info._tracker.update(metrics)


_RECORDERS: list[list[dict[str, float]]] = []


@contextlib.contextmanager
def recorded_reports() -> Iterator[list[dict[str, float]]]:
    """Yield a list that receives the numeric metrics of every report a train loop makes in
    this process inside the block (Ray Train's local mode, ``--workers 0``, runs the loop
    in-process): what ``examples/gpu_check.py`` and the tests compare between runs."""
    seen: list[dict[str, float]] = []
    _RECORDERS.append(seen)
    try:
        yield seen
    finally:
        _RECORDERS.remove(seen)


def _report(info: RunInfo, metrics: dict[str, Any], checkpoint: Any = None) -> None:
    for seen in _RECORDERS:
        seen.append({k: float(v) for k, v in metrics.items() if isinstance(v, int | float)})
    if info.in_tune:
        import ray.tune

        ray.tune.report(metrics, checkpoint=checkpoint)
    else:
        import ray.train

        ray.train.report(metrics, checkpoint=checkpoint)
