"""The verified Parquet cache and the features-table helpers of nshot.data."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import nshot.data as nd
from nshot.method import NshotError


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("NSHOT_CACHE", str(root))
    return root


def _table(n: int = 50, d: int = 7, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = rng.integers(0, 3, size=n)
    return nd.features_table(x, y, "toy", ["a", "b", "c"])


class Builder:
    def __init__(self, table: pa.Table | None = None, delay: float = 0.0) -> None:
        self.calls = 0
        self.table = table if table is not None else _table()
        self.delay = delay

    def __call__(self) -> pa.Table:
        self.calls += 1
        time.sleep(self.delay)
        return self.table


def _paths(root: Path, key: str, version: str = "1") -> tuple[Path, Path]:
    f = root / "tables" / f"{key}-v{version}.parquet"
    return f, f.with_name(f.name + ".json")


def test_cache_dir_follows_env_and_is_created(_cache: Path) -> None:
    assert not _cache.exists()
    assert nd.cache_dir() == _cache
    assert _cache.is_dir()


def test_builds_once(_cache: Path) -> None:
    build = Builder()
    first = nd.cached_table("toy", build)
    second = nd.cached_table("toy", build)
    assert build.calls == 1
    assert first.equals(second)
    assert second.equals(build.table)
    f, m = _paths(_cache, "toy")
    manifest = json.loads(m.read_text())
    assert manifest["bytes"] == f.stat().st_size
    assert manifest["rows"] == 50
    assert len(manifest["sha256"]) == 64
    assert "features: list<element: float>" in manifest["schema"]
    assert manifest["created"]
    # no temporary files left behind
    assert sorted(p.name for p in f.parent.iterdir()) == sorted([f.name, m.name, f.name + ".lock"])


def test_versions_are_separate(_cache: Path) -> None:
    b1, b2 = Builder(_table(seed=1)), Builder(_table(seed=2))
    assert nd.cached_table("toy", b1).equals(b1.table)
    assert nd.cached_table("toy", b2, version="2").equals(b2.table)
    assert b1.calls == b2.calls == 1
    assert _paths(_cache, "toy", "2")[0].exists()


def test_round_trip_and_read_table(_cache: Path) -> None:
    assert nd.read_table("toy") is None
    rng = np.random.default_rng(3)
    x = rng.normal(size=(20, 5))
    y = np.arange(20) % 4
    table = nd.features_table(x, y, "toy", ["w", "x", "y", "z"])
    assert table.schema.field("features").type == pa.list_(pa.float32())
    assert table.schema.field("label").type == pa.int64()
    assert table.column("label_name").to_pylist()[:5] == ["w", "x", "y", "z", "w"]
    nd.cached_table("toy", lambda: table)
    back = nd.read_table("toy")
    assert back is not None and back.equals(table)
    bx, by = nd.table_to_numpy(back)
    assert bx.dtype == np.float32 and bx.shape == (20, 5)
    assert by.dtype == np.int64
    np.testing.assert_array_equal(bx, x.astype(np.float32))
    np.testing.assert_array_equal(by, y)


def test_truncated_file_is_rebuilt(_cache: Path) -> None:
    build = Builder()
    nd.cached_table("toy", build)
    f, _ = _paths(_cache, "toy")
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.warns(nd.CacheCorruptedWarning, match="toy-v1.parquet"):
        again = nd.cached_table("toy", build)
    assert build.calls == 2
    assert again.equals(build.table)
    assert f.read_bytes() == data  # rewritten
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert nd.cached_table("toy", build).equals(build.table)
    assert build.calls == 2


def test_flipped_byte_is_rebuilt(_cache: Path) -> None:
    build = Builder()
    nd.cached_table("toy", build)
    f, _ = _paths(_cache, "toy")
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.warns(nd.CacheCorruptedWarning, match="sha256"):
        again = nd.cached_table("toy", build)
    assert build.calls == 2
    assert again.equals(build.table)


def test_missing_manifest_is_rebuilt(_cache: Path) -> None:
    build = Builder()
    nd.cached_table("toy", build)
    _, m = _paths(_cache, "toy")
    m.unlink()
    with pytest.warns(nd.CacheCorruptedWarning, match="manifest"):
        again = nd.cached_table("toy", build)
    assert build.calls == 2
    assert again.equals(build.table)
    assert m.exists()


def test_garbled_manifest_is_rebuilt(_cache: Path) -> None:
    build = Builder()
    nd.cached_table("toy", build)
    _, m = _paths(_cache, "toy")
    m.write_text("{not json")
    with pytest.warns(nd.CacheCorruptedWarning, match="unreadable"):
        nd.cached_table("toy", build)
    assert build.calls == 2


def test_read_table_reports_corruption(_cache: Path) -> None:
    nd.cached_table("toy", Builder())
    f, _ = _paths(_cache, "toy")
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.warns(nd.CacheCorruptedWarning, match="truncated"):
        assert nd.read_table("toy") is None


@pytest.mark.parametrize(
    "key", ["", "../etc", "a/b", "a b", ".hidden", "-x", "k\u00e9y", "x" * 201]
)
def test_bad_key_is_rejected(key: str) -> None:
    with pytest.raises(ValueError, match="invalid cache key"):
        nd.cached_table(key, Builder())
    with pytest.raises(ValueError, match="invalid cache key"):
        nd.read_table(key)


def test_bad_version_is_rejected() -> None:
    with pytest.raises(ValueError, match="invalid cache version"):
        nd.cached_table("toy", Builder(), version="1/2")


def test_failed_build_leaves_nothing(_cache: Path) -> None:
    def boom() -> pa.Table:
        raise RuntimeError("builder failed")

    with pytest.raises(RuntimeError, match="builder failed"):
        nd.cached_table("toy", boom)
    with pytest.raises(TypeError, match="not a pyarrow.Table"):
        nd.cached_table("toy", lambda: [1, 2, 3])  # type: ignore[arg-type,return-value]
    f, m = _paths(_cache, "toy")
    assert not f.exists() and not m.exists()
    build = Builder()
    nd.cached_table("toy", build)
    assert build.calls == 1


@pytest.mark.skipif(sys.platform == "win32", reason="no fcntl locks")
def test_concurrent_callers_build_once() -> None:
    build = Builder(delay=0.3)
    results: list[pa.Table] = []

    def worker() -> None:
        results.append(nd.cached_table("toy", build))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert build.calls == 1
    assert len(results) == 4 and all(r.equals(build.table) for r in results)


def test_table_to_numpy_rejects_bad_tables() -> None:
    ragged = pa.table(
        {"features": pa.array([[1.0, 2.0], [3.0]], type=pa.list_(pa.float32())), "label": [0, 1]}
    )
    with pytest.raises(ValueError, match="unequal width"):
        nd.table_to_numpy(ragged)
    with pytest.raises(ValueError, match="no 'label' column"):
        nd.table_to_numpy(ragged.drop_columns(["label"]))
    sliced = _table(10, 3).slice(4, 3)
    x, y = nd.table_to_numpy(sliced)
    full_x, full_y = nd.table_to_numpy(_table(10, 3))
    np.testing.assert_array_equal(x, full_x[4:7])
    np.testing.assert_array_equal(y, full_y[4:7])


def test_features_table_validates() -> None:
    with pytest.raises(ValueError, match="2-d"):
        nd.features_table(np.zeros(5), np.zeros(5, dtype=int), "toy")
    with pytest.raises(ValueError, match="length 5"):
        nd.features_table(np.zeros((5, 2)), np.zeros(4, dtype=int), "toy")
    with pytest.raises(ValueError, match="label names"):
        nd.features_table(np.zeros((2, 2)), np.array([0, 3]), "toy", ["a", "b"])
    empty = nd.features_table(np.zeros((0, 4)), np.zeros(0, dtype=int), "toy")
    assert empty.num_rows == 0 and "label_name" not in empty.column_names


def test_missing_extra_error_is_both_kinds() -> None:
    err = nd.MissingExtraError("x")
    assert isinstance(err, NshotError) and isinstance(err, ImportError)
    assert issubclass(nd.CacheCorruptedWarning, UserWarning)
    assert issubclass(nd.DataError, ValueError)


def test_import_is_light() -> None:
    heavy = ["torch", "sklearn", "mlxtend", "ray", "sentence_transformers", "transformers"]
    code = f"import sys, nshot.data; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=None
    )
    assert out.stdout.strip() == "[]"


def test_unwritable_cache_still_returns_the_table(
    _cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nshot.data import cache

    def fail(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache, "atomic_write", fail)
    build = Builder()
    with pytest.warns(UserWarning, match="could not write"):
        table = nd.cached_table("toy", build)
    assert table.equals(build.table)
    assert nd.read_table("toy") is None
