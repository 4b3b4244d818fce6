"""The sweep history: every finished sweep is one Parquet "task" under ``NSHOT_CACHE/history``.

One row per trial::

    task_id     str          one id per sweep
    method      str          the swept method
    preset      str          the preset the sweep started from
    dataset     str          what the trials trained on (default "<method>/<preset>")
    space       str (JSON)   the search space (SearchSpace.to_json)
    space_hash  str          SearchSpace.schema_hash(): tasks with the same hash share a design space
    metric      str          the objective's name; ``f`` holds its value
    mode        str          "max" or "min"
    trial_id    str
    config      str (JSON)   the trial's searched values
    x           list<float>  the config encoded in [0, 1]^D
    f           float        the objective (the last reported value of ``metric``)
    h           list<float>  the auxiliary vector, flattened row-major
    h_shape     list<int>    its shape, e.g. [reports, len(curve)]
    created     str          ISO time of the sweep's end

Later sweeps (and ``nshot train auxbo --set history_dir=...``) read these files with
:func:`load_tasks`. Only pyarrow reads them: nothing is unpickled.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nshot.errors import NshotError
from nshot.fileio import atomic_path

COLUMNS = (
    "task_id",
    "method",
    "preset",
    "dataset",
    "space",
    "space_hash",
    "metric",
    "mode",
    "trial_id",
    "config",
    "x",
    "f",
    "h",
    "h_shape",
    "created",
)


class HistoryError(NshotError):
    """A history file is unreadable or does not have the history columns."""


def history_dir(directory: str | os.PathLike | None = None) -> Path:
    if directory is not None:
        return Path(directory).expanduser()
    from nshot.data import cache_dir

    return cache_dir() / "history"


@dataclass
class Trial:
    """One evaluated design: its config, objective and auxiliary vector."""

    trial_id: str
    config: dict[str, Any]
    f: float
    h: np.ndarray  # any shape; stored flattened with its shape


@dataclass
class HistoryTask:
    """One finished sweep, read back."""

    task_id: str
    method: str
    preset: str
    dataset: str
    space: dict[str, Any]
    space_hash: str
    metric: str
    mode: str
    trial_ids: list[str]
    configs: list[dict[str, Any]]
    X: np.ndarray  # [n, D]
    f: np.ndarray  # [n] as reported
    h_list: list[np.ndarray]  # per trial, its own shape
    path: Path | None = None

    @property
    def y(self) -> np.ndarray:
        """``f`` oriented so that higher is better."""
        return self.f if self.mode == "max" else -self.f

    def h_padded(self, length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(h [n, T, d], mask [n, T])``: curves of different lengths (early-stopped trials)
        padded to ``length`` (default: the longest) with a mask; 1-D h becomes ``[T, 1]``."""
        hs = [h.reshape(h.shape[0], -1) if h.ndim >= 2 else h.reshape(-1, 1) for h in self.h_list]
        widths = {h.shape[1] for h in hs if h.size}
        if len(widths) > 1:
            raise HistoryError(f"task {self.task_id}: h rows have different widths {widths}")
        d = widths.pop() if widths else 1
        T = length or max((h.shape[0] for h in hs), default=1) or 1
        out = np.zeros((len(hs), T, d), dtype=np.float32)
        mask = np.zeros((len(hs), T), dtype=bool)
        for i, h in enumerate(hs):
            h = h[-T:] if h.shape[0] > T else h  # keep the latest frames
            out[i, : h.shape[0]] = h
            mask[i, : h.shape[0]] = True
        return out, mask


def save_task(
    trials: Sequence[Trial],
    *,
    method: str,
    preset: str,
    space: Any,
    metric: str,
    mode: str,
    dataset: str | None = None,
    directory: str | os.PathLike | None = None,
    task_id: str | None = None,
) -> Path:
    """Write one sweep as a Parquet task; returns its path. Trials without a finite ``f``
    (failed or never reported) are skipped; an empty sweep is not written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from nshot.tune.space import SearchSpace

    if not isinstance(space, SearchSpace):
        space = SearchSpace.from_json(space)
    rows = [t for t in trials if t.f is not None and np.isfinite(float(t.f))]
    if not rows:
        raise HistoryError("no trial reported a finite objective: nothing to save")
    task_id = (
        task_id or f"{method}-{preset}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    )
    created = time.strftime("%Y-%m-%dT%H:%M:%S")
    space_json = json.dumps(space.to_json(), sort_keys=True)
    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    for t in rows:
        h = np.asarray(t.h, dtype=np.float64)
        cols["task_id"].append(task_id)
        cols["method"].append(method)
        cols["preset"].append(preset)
        cols["dataset"].append(dataset or f"{method}/{preset}")
        cols["space"].append(space_json)
        cols["space_hash"].append(space.schema_hash())
        cols["metric"].append(metric)
        cols["mode"].append(mode)
        cols["trial_id"].append(str(t.trial_id))
        searched = {k: t.config[k] for k in space.params}
        cols["config"].append(json.dumps(searched, sort_keys=True))
        cols["x"].append(space.encode(searched).tolist())
        cols["f"].append(float(t.f))
        cols["h"].append(h.reshape(-1).tolist())
        cols["h_shape"].append(list(h.shape))
        cols["created"].append(created)
    schema = pa.schema(
        [
            *(pa.field(c, pa.string()) for c in COLUMNS[:10]),
            pa.field("x", pa.list_(pa.float64())),
            pa.field("f", pa.float64()),
            pa.field("h", pa.list_(pa.float64())),
            pa.field("h_shape", pa.list_(pa.int64())),
            pa.field("created", pa.string()),
        ]
    )
    table = pa.table(cols, schema=schema)
    out_dir = history_dir(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{task_id}.parquet"
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return path


def _read(path: Path) -> HistoryTask:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for bad files
        raise HistoryError(f"{path}: not a readable Parquet history task ({err})") from None
    missing = [
        c for c in ("task_id", "config", "x", "f", "h", "h_shape") if c not in table.column_names
    ]
    if missing:
        raise HistoryError(f"{path}: missing history columns {missing}")
    d = table.to_pydict()
    n = table.num_rows
    if n == 0:
        raise HistoryError(f"{path}: empty history task")

    def col(name: str, default: str = "") -> list[Any]:
        return d[name] if name in d else [default] * n

    h_list = []
    for flat, shape in zip(d["h"], d["h_shape"]):
        arr = np.asarray(flat, dtype=np.float32)
        if int(np.prod(shape)) != arr.size:
            raise HistoryError(f"{path}: an h of {arr.size} values does not have shape {shape}")
        h_list.append(arr.reshape(shape))
    X = np.asarray(d["x"], dtype=np.float64)
    if X.ndim != 2:
        raise HistoryError(f"{path}: rows of x have different lengths")
    space_raw = col("space", "{}")[0]
    return HistoryTask(
        task_id=str(d["task_id"][0]),
        method=str(col("method")[0]),
        preset=str(col("preset")[0]),
        dataset=str(col("dataset")[0]),
        space=json.loads(space_raw) if space_raw else {},
        space_hash=str(col("space_hash")[0]),
        metric=str(col("metric", "f")[0]),
        mode=str(col("mode", "max")[0]),
        trial_ids=[str(t) for t in col("trial_id")],
        configs=[json.loads(c) for c in d["config"]],
        X=X,
        f=np.asarray(d["f"], dtype=np.float64),
        h_list=h_list,
        path=path,
    )


def load_tasks(
    directory: str | os.PathLike | None = None,
    *,
    method: str | None = None,
    space_hash: str | None = None,
    paths: Iterable[str | os.PathLike] | None = None,
) -> list[HistoryTask]:
    """Read the history (oldest first), optionally filtered by method and design space."""
    if paths is None:
        root = history_dir(directory)
        found = (
            sorted(root.glob("*.parquet"), key=lambda p: p.stat().st_mtime) if root.exists() else []
        )
    else:
        found = [Path(p) for p in paths]
    out = []
    for p in found:
        task = _read(p)
        if method is not None and task.method != method:
            continue
        if space_hash is not None and task.space_hash != space_hash:
            continue
        out.append(task)
    return out


def summarize(tasks: Sequence[HistoryTask]) -> list[Mapping[str, Any]]:
    return [
        {
            "task_id": t.task_id,
            "method": t.method,
            "preset": t.preset,
            "trials": len(t.configs),
            "best_f": float(t.f.max() if t.mode == "max" else t.f.min()),
            "space_hash": t.space_hash,
            "path": str(t.path),
        }
        for t in tasks
    ]
