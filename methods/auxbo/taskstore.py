"""auxbo's tasks and their store: the :class:`Task` every family is made of, and the Parquet
history format that families are cached in and sweeps are saved as (``task_id``, ``family``,
``config``, ``x``, ``f``, ``h``, ``h_shape``, ``split``), read back with pyarrow only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# --------------------------------------------------------------------------------------------
# Task
# --------------------------------------------------------------------------------------------


@dataclass
class Task:
    """One offline BO task: every candidate design with its objective and auxiliary information."""

    name: str  # unique, e.g. "synthetic/test/0007", "lcbench/digits_3v8/n40"
    family: str  # "synthetic" | "lcbench"
    X: np.ndarray  # [n, D] float32, designs encoded in [0, 1]^D
    f: np.ndarray  # [n] float32, higher is better
    h: np.ndarray  # [n, T, d_h] float32
    h_names: tuple[str, ...]  # names of the d_h channels
    configs: list[dict] | None = None  # decoded designs (lcbench hyperparameters); None: synthetic
    info: dict = field(default_factory=dict)  # JSON-able extras (synthetic: tau; lcbench: sizes)

    @property
    def f_star(self) -> float:
        return float(np.max(self.f))

    @property
    def f_min(self) -> float:
        return float(np.min(self.f))

    @property
    def n(self) -> int:
        return int(self.X.shape[0])


def stream_rng(seed: int, key: tuple[int, ...]) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=key))


# --------------------------------------------------------------------------------------------
# Parquet history format
# --------------------------------------------------------------------------------------------

_META_KEY = b"auxbo"


def tasks_to_table(tasks_by_split: Mapping[str, Sequence[Task]], metadata: dict | None = None):
    """A ``pyarrow.Table`` in the history format, one row per design.

    Columns: ``task_id`` (str), ``family`` (str), ``config`` (JSON str; "{}" without configs),
    ``x`` (list<float>), ``f`` (double), ``h`` (list<float>, flattened), ``h_shape`` (list<int32>),
    ``split`` (str). Per-task ``h_names`` and ``info`` and ``metadata`` go into the schema
    metadata (JSON under ``auxbo``).
    """
    import pyarrow as pa

    cols: dict[str, list] = {k: [] for k in ("task_id", "family", "config", "split")}
    xs, fs, hs, shapes = [], [], [], []
    per_task: dict[str, dict] = {}
    for split, tasks in tasks_by_split.items():
        for t in tasks:
            if t.name in per_task:
                raise ValueError(f"duplicate task name {t.name!r}")
            n = t.n
            if t.f.shape != (n,) or t.h.shape[0] != n or t.h.ndim != 3:
                raise ValueError(f"task {t.name!r}: inconsistent X {t.X.shape}, f, h shapes")
            per_task[t.name] = {"h_names": list(t.h_names), "info": t.info}
            cols["task_id"] += [t.name] * n
            cols["family"] += [t.family] * n
            cols["split"] += [split] * n
            cols["config"] += (
                [json.dumps(c, sort_keys=True) for c in t.configs] if t.configs else ["{}"] * n
            )
            xs.append(np.asarray(t.X, np.float32).reshape(n, -1))
            fs.append(np.asarray(t.f, np.float64))
            hs.append(np.asarray(t.h, np.float32).reshape(n, -1))
            shapes += [list(t.h.shape[1:])] * n

    def list_col(parts: list[np.ndarray]) -> pa.Array:
        if not parts:
            return pa.array([], type=pa.list_(pa.float32()))
        widths = [p.shape[1] for p in parts]
        lengths = np.concatenate([np.full(p.shape[0], w, np.int32) for p, w in zip(parts, widths)])
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        values = np.concatenate([p.reshape(-1) for p in parts]).astype(np.float32)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))

    schema_meta = {_META_KEY: json.dumps({"tasks": per_task, "params": metadata or {}}).encode()}
    return pa.table(
        {
            "task_id": pa.array(cols["task_id"], pa.string()),
            "family": pa.array(cols["family"], pa.string()),
            "config": pa.array(cols["config"], pa.string()),
            "x": list_col(xs),
            "f": pa.array(np.concatenate(fs) if fs else [], pa.float64()),
            "h": list_col(hs),
            "h_shape": pa.array(shapes, pa.list_(pa.int32())),
            "split": pa.array(cols["split"], pa.string()),
        }
    ).replace_schema_metadata(schema_meta)


def tasks_from_table(table) -> dict[str, list[Task]]:
    """``{split: [Task, ...]}`` from a history-format table (tasks in first-row order).

    Without a ``split`` column every task is "train"; without schema metadata the h channels are
    named ``h0``, ``h1``, ...
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    required = {"task_id", "family", "config", "x", "f", "h", "h_shape"}
    missing = required - set(table.column_names)
    if missing:
        raise ValueError(f"not a history-format table: missing column(s) {sorted(missing)}")
    meta = {}
    if table.schema.metadata and _META_KEY in table.schema.metadata:
        meta = json.loads(table.schema.metadata[_META_KEY].decode()).get("tasks", {})
    ids = table.column("task_id").to_pylist()
    rows: dict[str, list[int]] = {}
    for i, tid in enumerate(ids):
        rows.setdefault(tid, []).append(i)
    splits = table.column("split").to_pylist() if "split" in table.column_names else None
    out: dict[str, list[Task]] = {}
    for tid, idx_list in rows.items():
        idx = pa.array(idx_list, pa.int64())
        sub = table.take(idx)
        n = len(idx_list)
        shape = sub.column("h_shape")[0].as_py()
        if any(s != shape for s in sub.column("h_shape").to_pylist()):
            raise ValueError(f"task {tid!r}: rows have different h_shape")
        X = pc.list_flatten(sub.column("x").combine_chunks()).to_numpy(zero_copy_only=False)
        h = pc.list_flatten(sub.column("h").combine_chunks()).to_numpy(zero_copy_only=False)
        f = sub.column("f").to_numpy()
        if X.size % n or h.size != n * int(np.prod(shape)):
            raise ValueError(f"task {tid!r}: x or h lengths differ between rows")
        configs = [json.loads(c) for c in sub.column("config").to_pylist()]
        fam = sub.column("family")[0].as_py()
        tm = meta.get(tid, {})
        h_names = tuple(tm.get("h_names") or [f"h{k}" for k in range(shape[-1])])
        task = Task(
            name=tid,
            family=fam,
            X=X.astype(np.float32).reshape(n, -1),
            f=f.astype(np.float32),
            h=h.astype(np.float32).reshape(n, *shape),
            h_names=h_names,
            configs=configs if any(configs) else None,
            info=dict(tm.get("info") or {}),
        )
        out.setdefault(splits[idx_list[0]] if splits else "train", []).append(task)
    return out


def write_tasks(
    path: str | Path,
    train: Sequence[Task],
    test: Sequence[Task],
    metadata: dict | None = None,
) -> Path:
    """Write tasks as one history-format Parquet file, atomically (nshot.fileio.atomic_path)."""
    import pyarrow.parquet as pq

    from nshot.fileio import atomic_path

    path = Path(path)
    table = tasks_to_table({"train": train, "test": test}, metadata)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return path


def read_tasks(path: str | Path) -> tuple[list[Task], list[Task]]:
    """``(train, test)`` from a history-format Parquet file (pyarrow only, nothing unpickled)."""
    import pyarrow.parquet as pq

    by_split = tasks_from_table(pq.read_table(Path(path)))
    return by_split.get("train", []), by_split.get("test", [])
