"""Ray Train glue: the runner, worker session helpers and checkpoints."""

from nshot.train.checkpoint import (
    CheckpointError,
    LoadedCheckpoint,
    find_checkpoints,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)
from nshot.train.runner import SCALE_PRESETS, Scaling, TrainResult, ensure_ray, fit

__all__ = [
    "SCALE_PRESETS",
    "CheckpointError",
    "LoadedCheckpoint",
    "Scaling",
    "TrainResult",
    "ensure_ray",
    "find_checkpoints",
    "fit",
    "load_checkpoint",
    "resolve_checkpoint",
    "save_checkpoint",
]
