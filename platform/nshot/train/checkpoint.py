"""nshot checkpoints: safetensors weights plus JSON, never pickle.

A checkpoint is a directory::

    model.safetensors       model weights (state_dict, unwrapped from DDP)
    optimizer.safetensors   optimizer tensors (optional), keys ``state/<param>/<name>``
    state.json              format, method, versions, config, step, metrics, extra state,
                            the optimizer's non-tensor state, and the sha256 of every file

Loading checks the format, the hashes and the method name, and raises
:class:`CheckpointError` with the path and the problem for anything unexpected.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from nshot.hashing import sha256_file
from nshot.method import NshotError

FORMAT = "nshot-checkpoint/1"
STATE_FILE = "state.json"
MODEL_FILE = "model.safetensors"
OPTIM_FILE = "optimizer.safetensors"


class CheckpointError(NshotError):
    """A checkpoint is missing, corrupt or belongs to another method."""


def _plain_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in state.items():
        if k.startswith("module."):  # DDP wrapper
            k = k[len("module.") :]
        out[k] = v.detach().to("cpu").contiguous().clone()
    return out


def flatten_optimizer(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split a torch optimizer ``state_dict`` into tensors and JSON-able metadata."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pid, entries in state["state"].items():
        for name, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state/{pid}/{name}"] = value.detach().to("cpu").contiguous().clone()
            else:
                scalars.setdefault(str(pid), {})[name] = value
    meta = {"param_groups": state["param_groups"], "scalars": scalars}
    return tensors, meta


def unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        _, pid, name = key.split("/", 2)
        state.setdefault(int(pid), {})[name] = value
    for pid, entries in meta.get("scalars", {}).items():
        state.setdefault(int(pid), {}).update(entries)
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(
    path: str | os.PathLike,
    *,
    method: str,
    method_version: str,
    config: dict[str, Any],
    step: int,
    model_state: dict[str, torch.Tensor],
    metrics: dict[str, float] | None = None,
    optimizer_state: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint directory atomically (into a temp dir, then renamed)."""
    from nshot import __version__

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        save_file(_plain_state_dict(model_state), str(tmp / MODEL_FILE))
        files = [MODEL_FILE]
        optim_meta = None
        if optimizer_state is not None:
            tensors, optim_meta = flatten_optimizer(optimizer_state)
            save_file(tensors, str(tmp / OPTIM_FILE))
            files.append(OPTIM_FILE)
        state = {
            "format": FORMAT,
            "method": method,
            "method_version": method_version,
            "nshot_version": __version__,
            "config": config,
            "step": int(step),
            "metrics": {k: float(v) for k, v in (metrics or {}).items()},
            "extra": extra or {},
            "optimizer": optim_meta,
            "files": {f: sha256_file(tmp / f) for f in files},
        }
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True))
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


@dataclass
class LoadedCheckpoint:
    """A verified checkpoint: its JSON state and lazy access to its tensors."""

    path: Path
    method: str
    method_version: str
    config: dict[str, Any]
    step: int
    metrics: dict[str, float]
    extra: dict[str, Any]
    _optimizer_meta: dict[str, Any] | None = field(default=None, repr=False)

    def weights(self) -> dict[str, torch.Tensor]:
        return _load_tensors(self.path / MODEL_FILE)

    def optimizer_state(self) -> dict[str, Any] | None:
        if self._optimizer_meta is None:
            return None
        return unflatten_optimizer(_load_tensors(self.path / OPTIM_FILE), self._optimizer_meta)


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint file {path} cannot be read: {err}") from None


def is_checkpoint(path: str | os.PathLike) -> bool:
    return (Path(path) / STATE_FILE).is_file()


def find_checkpoints(root: str | os.PathLike) -> list[Path]:
    """All checkpoint directories under ``root`` (itself, or up to three levels down), by step."""
    root = Path(root)
    if is_checkpoint(root):
        return [root]
    found: list[tuple[int, float, Path]] = []
    for depth in ("*", "*/*", "*/*/*"):
        for p in root.glob(f"{depth}/{STATE_FILE}"):
            if p.parent.name.startswith("."):
                continue
            try:
                step = int(json.loads(p.read_text()).get("step", -1))
            except (OSError, ValueError):
                step = -1
            found.append((step, p.stat().st_mtime, p.parent))
    found.sort()
    return [p for _, _, p in found]


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint directory, or the latest checkpoint inside a run directory."""
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(f"checkpoint path {path} does not exist")
    found = find_checkpoints(path)
    if not found:
        raise CheckpointError(f"no nshot checkpoint (a directory with {STATE_FILE}) under {path}")
    return found[-1]


def load_checkpoint(path: str | os.PathLike, method: str | None = None) -> LoadedCheckpoint:
    """Load and verify a checkpoint (a checkpoint dir or a run dir: its latest checkpoint)."""
    ckpt = resolve_checkpoint(path)
    try:
        state = json.loads((ckpt / STATE_FILE).read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{ckpt / STATE_FILE} is not valid JSON: {err}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{ckpt} is not an {FORMAT} checkpoint")
    for fname, digest in state.get("files", {}).items():
        fpath = ckpt / fname
        if not fpath.is_file():
            raise CheckpointError(f"checkpoint {ckpt} is missing {fname}")
        if sha256_file(fpath) != digest:
            raise CheckpointError(
                f"checkpoint file {fpath} is corrupt (sha256 differs from {STATE_FILE})"
            )
    if method is not None and state.get("method") != method:
        raise CheckpointError(
            f"checkpoint {ckpt} belongs to method {state.get('method')!r}, not {method!r}"
        )
    return LoadedCheckpoint(
        path=ckpt,
        method=state["method"],
        method_version=str(state.get("method_version", "")),
        config=state["config"],
        step=int(state["step"]),
        metrics=state.get("metrics", {}),
        extra=state.get("extra", {}),
        _optimizer_meta=state.get("optimizer"),
    )
