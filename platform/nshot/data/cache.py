"""Verified Parquet cache for the tables nshot builds from offline sources.

Layout, under :func:`cache_dir` (``$NSHOT_CACHE``, default ``~/.cache/nshot``)::

    tables/<key>-v<version>.parquet        the table
    tables/<key>-v<version>.parquet.json   its manifest: sha256, bytes, rows, schema, created

Every write goes to a temporary file in the same folder and is moved into place with
``os.replace``, the table first and its manifest second, so a reader never sees half a file. An
advisory lock per table (``fcntl.flock`` where the platform has it) serializes builders, so the
many Ray workers of one node build a table once and the rest read it. A table is used only if its
bytes match the manifest; anything else (truncated, altered, manifest missing or unreadable) emits
a :class:`CacheCorruptedWarning` naming the file and the table is built again.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from nshot.errors import NshotError
from nshot.fileio import atomic_write

if TYPE_CHECKING:
    import ray.data

__all__ = [
    "CacheCorruptedWarning",
    "DataError",
    "MissingExtraError",
    "cache_dir",
    "cached_table",
    "features_table",
    "file_lock",
    "read_table",
    "table_to_numpy",
    "to_ray_dataset",
]

_MANIFEST_FORMAT = 1
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")


class CacheCorruptedWarning(UserWarning):
    """A cached table failed verification; it is rebuilt, never used."""


class MissingExtraError(NshotError, ImportError):
    """An optional part of nshot is not installed; the message gives the ``pip install`` line."""


class DataError(NshotError, ValueError):
    """Input data are malformed; the message names the problem and, for files, the path."""


def cache_dir() -> Path:
    """The nshot cache folder: ``$NSHOT_CACHE`` or ``~/.cache/nshot``, created if missing."""
    env = os.environ.get("NSHOT_CACHE")
    path = Path(env).expanduser() if env else Path.home() / ".cache" / "nshot"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _check_name(what: str, value: str) -> None:
    if not isinstance(value, str) or not _SAFE_NAME.fullmatch(value):
        raise ValueError(
            f"invalid cache {what} {value!r}: use 1-200 letters, digits, '-', '_' or '.', "
            "not starting with '.' or '-'"
        )


def _paths(key: str, version: str) -> tuple[Path, Path, Path]:
    _check_name("key", key)
    _check_name("version", version)
    folder = cache_dir() / "tables"
    folder.mkdir(parents=True, exist_ok=True)
    table = folder / f"{key}-v{version}.parquet"
    return table, table.with_name(table.name + ".json"), table.with_name(table.name + ".lock")


@contextlib.contextmanager
def _locked(lock_path: Path, *, exclusive: bool) -> Iterator[None]:
    """Advisory lock on ``lock_path``; a no-op where the platform or filesystem has none."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # read-only cache: readers still verify every byte
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        except OSError:  # e.g. a network filesystem without flock
            pass
        yield
    finally:
        os.close(fd)  # closing releases the lock


def file_lock(path: str | os.PathLike[str]) -> contextlib.AbstractContextManager[None]:
    """An exclusive advisory lock on ``path`` (its folder is created): one process builds a
    cached artefact while the others wait, e.g. a model trained on first use."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return _locked(Path(path), exclusive=True)


def _schema_string(schema: pa.Schema) -> str:
    return schema.to_string(show_field_metadata=False, show_schema_metadata=False)


def _verified_read(key: str, version: str) -> tuple[pa.Table | None, str | None]:
    """``(table, None)`` if the cached file is intact, ``(None, None)`` if absent,
    ``(None, problem)`` if present but unusable."""
    table_path, manifest_path, _ = _paths(key, version)
    if not table_path.exists():
        return None, None
    try:
        manifest: Any = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"{table_path}: its manifest {manifest_path.name} is missing"
    except (OSError, ValueError) as e:
        return None, f"{table_path}: its manifest {manifest_path.name} is unreadable ({e})"
    try:
        data = table_path.read_bytes()
    except OSError as e:
        return None, f"{table_path}: cannot be read ({e})"
    if not isinstance(manifest, dict):
        return None, f"{table_path}: its manifest {manifest_path.name} is not a JSON object"
    if manifest.get("file") != table_path.name:
        return None, f"{table_path}: its manifest names another file ({manifest.get('file')!r})"
    if manifest.get("bytes") != len(data):
        return None, (
            f"{table_path}: size {len(data)} bytes, manifest says {manifest.get('bytes')} "
            "(truncated or overwritten)"
        )
    digest = hashlib.sha256(data).hexdigest()
    if manifest.get("sha256") != digest:
        return None, f"{table_path}: sha256 {digest} does not match the manifest"
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as e:  # pragma: no cover - needs a bad writer
        return None, f"{table_path}: not a readable Parquet file ({e})"
    if table.num_rows != manifest.get("rows") or _schema_string(table.schema) != manifest.get(
        "schema"
    ):
        return None, f"{table_path}: rows or schema differ from the manifest"
    return table, None


def read_table(key: str, *, version: str = "1") -> pa.Table | None:
    """The cached table ``key`` (at ``version``) after verifying it against its manifest.

    Returns None if it is absent or fails verification (the latter also emits a
    :class:`CacheCorruptedWarning` naming the file).
    """
    _, _, lock_path = _paths(key, version)
    with _locked(lock_path, exclusive=False):
        table, problem = _verified_read(key, version)
    if problem is not None:
        warnings.warn(f"nshot cache: {problem}", CacheCorruptedWarning, stacklevel=2)
    return table


def _write(key: str, version: str, table: pa.Table) -> pa.Table:
    table_path, manifest_path, _ = _paths(key, version)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    buf = sink.getvalue()
    data = buf.to_pybytes()
    written = pq.read_table(pa.BufferReader(buf))  # what later reads will return
    manifest = {
        "format": _MANIFEST_FORMAT,
        "key": key,
        "version": version,
        "file": table_path.name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
        "rows": written.num_rows,
        "schema": _schema_string(written.schema),
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    try:
        atomic_write(table_path, data)
        atomic_write(manifest_path, (json.dumps(manifest, indent=1) + "\n").encode("utf-8"))
    except OSError as e:  # read-only or full cache: the data are still good, just not kept
        warnings.warn(
            f"nshot cache: could not write {table_path} ({e}); using the table uncached",
            UserWarning,
            stacklevel=3,
        )
    return written


def cached_table(key: str, build: Callable[[], pa.Table], *, version: str = "1") -> pa.Table:
    """Return the cached table ``key``, calling ``build()`` once to make it if needed.

    The table lives in ``<cache_dir()>/tables/<key>-v<version>.parquet`` with a JSON manifest
    beside it. A cached file that does not match its manifest (or has none) is reported with a
    :class:`CacheCorruptedWarning` and rebuilt. Bump ``version`` when the builder changes.
    ``key`` and ``version`` may hold letters, digits, ``-``, ``_`` and ``.`` only.
    """
    _, _, lock_path = _paths(key, version)
    with _locked(lock_path, exclusive=False):
        table, problem = _verified_read(key, version)
    if table is not None:
        return table
    with _locked(lock_path, exclusive=True):
        # another process may have built it while we waited for the lock
        table, problem_now = _verified_read(key, version)
        if table is not None:
            return table
        problem = problem_now if problem_now is not None else problem
        if problem is not None:
            warnings.warn(
                f"nshot cache: {problem}; rebuilding it", CacheCorruptedWarning, stacklevel=2
            )
        built = build()
        if not isinstance(built, pa.Table):
            raise TypeError(
                f"the builder of cached table {key!r} returned {type(built).__name__}, "
                "not a pyarrow.Table"
            )
        return _write(key, version, built)


def to_ray_dataset(table: pa.Table) -> ray.data.Dataset:
    """A Ray Dataset over ``table`` (``ray.data.from_arrow``; starts Ray if it is not running)."""
    import ray.data

    return ray.data.from_arrow(table)


def table_to_numpy(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """``(features, label)`` of a features table: float32 ``[n, d]`` and int64 ``[n]``."""
    for name in ("features", "label"):
        if name not in table.column_names:
            raise DataError(f"table has no {name!r} column (columns: {table.column_names})")
    n = table.num_rows
    col = table.column("features").combine_chunks()
    if col.null_count:
        raise DataError(f"column 'features' has {col.null_count} null rows")
    if pa.types.is_fixed_size_list(col.type):
        d = col.type.list_size
    elif pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        lengths = np.diff(col.offsets.to_numpy(zero_copy_only=False))
        d = int(lengths[0]) if n else 0
        if n and not (lengths == d).all():
            raise DataError(
                f"column 'features' has rows of unequal width ({int(lengths.min())} to "
                f"{int(lengths.max())})"
            )
    else:
        raise DataError(f"column 'features' must be a list of floats, not {col.type}")
    values = col.flatten()
    if values.null_count:
        raise DataError(f"column 'features' has {values.null_count} null values")
    x = values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False).reshape(n, d)
    label = table.column("label")
    if label.null_count:
        raise DataError(f"column 'label' has {label.null_count} nulls")
    y = label.to_numpy().astype(np.int64, copy=False)
    return x, y


def features_table(
    x: np.ndarray,
    y: np.ndarray,
    dataset: str,
    label_names: list[str] | None = None,
) -> pa.Table:
    """A features table from ``x`` (``[n, d]``) and integer labels ``y`` (``[n]``).

    Columns: ``features`` (list<float32>, the same width in every row), ``label`` (int64),
    ``dataset`` (string), and ``label_name`` (string, ``label_names[label]``) if names are given.
    """
    x = np.asarray(x)
    y = np.asarray(y)
    if x.ndim != 2:
        raise DataError(f"features must be a 2-d array [n, d], got shape {x.shape}")
    if y.ndim != 1 or len(y) != len(x):
        raise DataError(f"labels must be a 1-d array of length {len(x)}, got shape {y.shape}")
    if y.size and not np.issubdtype(y.dtype, np.integer):
        if not np.all(np.equal(np.mod(y, 1), 0)):
            raise DataError(f"labels must be integers, got dtype {y.dtype}")
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    y64 = y.astype(np.int64)
    n, d = x32.shape
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * d, type=pa.int32())
    features = pa.ListArray.from_arrays(offsets, pa.array(x32.reshape(-1), type=pa.float32()))
    columns: dict[str, pa.Array] = {
        "features": features,
        "label": pa.array(y64, type=pa.int64()),
        "dataset": pa.array([dataset] * n, type=pa.string()),
    }
    if label_names is not None:
        if n and (y64.min() < 0 or y64.max() >= len(label_names)):
            raise DataError(
                f"labels range {int(y64.min())}..{int(y64.max())} but only "
                f"{len(label_names)} label names were given"
            )
        names = np.asarray(list(label_names), dtype=object)
        columns["label_name"] = pa.array(names[y64].tolist() if n else [], type=pa.string())
    return pa.table(columns)
