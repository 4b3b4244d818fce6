"""The Ray Train runner: one ``TorchTrainer`` for any method.

``fit(method, cfg, ...)`` starts an embedded local Ray when none is running (or connects to
``RAY_ADDRESS``), builds ``ScalingConfig``/``RunConfig``/``CheckpointConfig``/``FailureConfig``,
runs the method's ``train_loop`` on the workers (or in-process with ``workers=0``, Ray Train's
local mode) and returns where the final checkpoint is.

Runs live in ``<storage>/<name>``. Re-running with the same storage and name and
``resume=True`` continues from the run's latest checkpoint (Ray Train V2 restores its
checkpoint manager from the run directory; local mode reads the latest nshot checkpoint).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nshot.method import ConfigError, MethodConfig, NshotError, get
from nshot.train.checkpoint import find_checkpoints

SCALE_PRESETS: dict[str, dict[str, float]] = {
    # name: workers, gpus per worker, cpus per worker
    "local": {"workers": 0, "gpus_per_worker": 0, "cpus_per_worker": 1},
    "cpu2": {"workers": 2, "gpus_per_worker": 0, "cpus_per_worker": 1},
    "gpu1": {"workers": 1, "gpus_per_worker": 1, "cpus_per_worker": 4},
    "gpu8": {"workers": 8, "gpus_per_worker": 1, "cpus_per_worker": 8},
    "multinode": {"workers": 16, "gpus_per_worker": 1, "cpus_per_worker": 8},
}


@dataclass
class Scaling:
    workers: int = 0
    gpus_per_worker: float = 0
    cpus_per_worker: float = 1

    @classmethod
    def preset(cls, name: str) -> Scaling:
        if name not in SCALE_PRESETS:
            raise ConfigError(
                f"--scale: unknown preset {name!r}; choose one of {sorted(SCALE_PRESETS)}"
            )
        return cls(**SCALE_PRESETS[name])  # type: ignore[arg-type]

    def validate(self) -> None:
        if self.workers < 0:
            raise ConfigError("--workers: must be >= 0 (0 runs in-process, Ray Train local mode)")
        if self.gpus_per_worker < 0 or self.cpus_per_worker <= 0:
            raise ConfigError("--gpus-per-worker must be >= 0 and --cpus-per-worker > 0")
        if self.workers == 0 and self.gpus_per_worker > 0:
            raise ConfigError("--gpus-per-worker needs --workers >= 1")


@dataclass
class TrainResult:
    run_dir: Path
    checkpoint: Path | None
    metrics: dict[str, Any]
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)


def default_storage() -> Path:
    env = os.environ.get("NSHOT_STORAGE")
    if env:
        return Path(env).expanduser()
    from nshot.data import cache_dir

    return cache_dir() / "runs"


def ensure_ray(**init_kwargs: Any) -> None:
    """Connect to ``RAY_ADDRESS`` when set, else start an embedded single-node Ray."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    # workers print their progress lines once (Ray's print patch would log them twice)
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], **init_kwargs)
        return
    # The dashboard process hosts the State API that Ray Train's placement-group cleaner
    # polls; it binds to loopback only.
    kwargs: dict[str, Any] = {"include_dashboard": True, "dashboard_host": "127.0.0.1"}
    kwargs.update(init_kwargs)
    ray.init(**kwargs)


def _worker_entry(loop_config: dict[str, Any]) -> None:
    """Runs on every Ray Train worker (or in-process in local mode)."""
    import logging

    import torch

    from nshot.method import get as get_method
    from nshot.train.session import RunInfo, _set_run

    # local mode logs every report at INFO; nshot prints its own progress line
    logging.getLogger("ray.train.v2._internal.execution.train_fn_utils").setLevel(logging.WARNING)
    method = get_method(loop_config["method"])
    cfg = method.config_from_dict(loop_config["config"])
    torch.set_num_threads(cfg.torch_threads)
    _set_run(
        RunInfo(
            method=method.name,
            method_version=method.version,
            config=cfg.model_dump(),
            local_dir=loop_config.get("local_dir"),
        )
    )
    method.train_loop(cfg)


def fit(
    method_name: str,
    cfg: MethodConfig,
    *,
    scaling: Scaling | None = None,
    storage: str | os.PathLike | None = None,
    name: str | None = None,
    resume: bool = False,
    overwrite: bool = False,
    max_failures: int = 0,
    keep_checkpoints: int = 2,
) -> TrainResult:
    """Train ``method_name`` with ``cfg`` through Ray Train and return the final checkpoint."""
    import ray.train
    from ray.train.torch import TorchTrainer

    method = get(method_name)
    if not isinstance(cfg, method.Config):
        raise ConfigError(f"config for {method_name!r} must be a {method.Config.__name__}")
    scaling = scaling or Scaling()
    scaling.validate()
    storage_path = Path(storage).expanduser().resolve() if storage else default_storage()
    name = name or f"{method_name}-{cfg.preset}"
    run_dir = storage_path / name
    if run_dir.exists() and any(run_dir.iterdir()):
        if overwrite:
            shutil.rmtree(run_dir)
        elif not resume:
            raise NshotError(
                f"run directory {run_dir} already exists: pass --resume to continue it, "
                "--overwrite to replace it, or --name for a new run"
            )
    elif resume:
        raise NshotError(f"--resume: no run to resume at {run_dir}")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "nshot_run.json").write_text(
        _json({"method": method_name, "config": cfg.model_dump(), "scaling": scaling.__dict__})
    )

    ensure_ray()
    local = scaling.workers == 0
    loop_config: dict[str, Any] = {"method": method_name, "config": cfg.model_dump()}
    if local:
        loop_config["local_dir"] = str(run_dir)
        scaling_config = ray.train.ScalingConfig(num_workers=0)
    else:
        resources = {"CPU": scaling.cpus_per_worker}
        if scaling.gpus_per_worker:
            resources["GPU"] = scaling.gpus_per_worker
        scaling_config = ray.train.ScalingConfig(
            num_workers=scaling.workers,
            use_gpu=scaling.gpus_per_worker > 0,
            resources_per_worker=resources,
        )
    run_config = ray.train.RunConfig(
        name=name,
        storage_path=str(storage_path),
        checkpoint_config=ray.train.CheckpointConfig(num_to_keep=keep_checkpoints),
        failure_config=ray.train.FailureConfig(max_failures=max_failures),
    )
    trainer = TorchTrainer(
        _worker_entry,
        train_loop_config=loop_config,
        scaling_config=scaling_config,
        run_config=run_config,
    )
    t0 = time.time()
    result = trainer.fit()
    wall = time.time() - t0
    ckpt = _final_checkpoint(result, run_dir)
    if local:
        _prune_local(run_dir, keep_checkpoints)
        ckpt = find_checkpoints(run_dir)[-1] if find_checkpoints(run_dir) else None
    return TrainResult(
        run_dir=run_dir, checkpoint=ckpt, metrics=dict(result.metrics or {}), wall_s=wall
    )


def _final_checkpoint(result: Any, run_dir: Path) -> Path | None:
    if result.checkpoint is not None and Path(result.checkpoint.path).exists():
        return Path(result.checkpoint.path)
    found = find_checkpoints(run_dir)
    return found[-1] if found else None


def _prune_local(run_dir: Path, keep: int) -> None:
    found = find_checkpoints(run_dir)
    for old in found[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def _json(obj: Any) -> str:
    import json

    return json.dumps(obj, indent=1, sort_keys=True, default=str)
