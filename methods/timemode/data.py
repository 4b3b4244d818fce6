"""TimeMoDE's data: the multi-domain pre-training corpora and the few-shot targets (paper §4).

* ``real`` corpus (the ``small`` default): non-overlapping length-L windows of ten real
  collections, read by path out of the pinned aeon and sktime wheels (UCR/UEA ``.ts`` files and
  sktime's mitdb ECG; :mod:`nshot.data.tsfile` parses them, aeon is never imported) and
  statsmodels' co2 series (imported; 59 missing weeks interpolated). Multivariate sets are split
  into univariate series. ItalyPowerDemand is never in it.
* ``synthetic`` corpus (``smoke`` and a reported row): six generated families (sines, AR(1),
  random walks, square waves, chirps, spike trains).
* Targets: ItalyPowerDemand (aeon; 1 096 daily profiles of 24 hourly values, each series
  z-normalised by the UCR archive, so a model learns shape, not level) and generated damped
  oscillations e^{−a t} sin(ω t + φ).

Windows are stored in original units; a domain's min-max scaler (paper §3: each dataset scaled to
[0, 1]) is fitted on its own windows when it is used (:func:`fit_scaler`). Tables are cached as
verified Parquet (``nshot.data.cache``).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from nshot.data.cache import DataError, MissingExtraError, cached_table
from nshot.data.tsfile import parse_ts
from nshot.data.wheels import AEON, SKTIME, PinnedWheel, wheel_available, wheel_files

from .config import TimeModeConfig

SYNTH_DOMAINS = ("sine", "ar1", "random_walk", "square", "chirp", "spikes")
# (wheel, dataset folder): UCR/UEA sets of the real corpus
REAL_TS = (
    (SKTIME, "PLAID"),
    (AEON, "ACSF1"),
    (AEON, "OSULeaf"),
    (AEON, "ArrowHead"),
    (AEON, "BasicMotions"),
    (AEON, "GunPoint"),
    (AEON, "PickupGestureWiimoteZ"),
    (AEON, "JapaneseVowels"),
)
REAL_DOMAINS = tuple(n for _, n in REAL_TS) + ("mitdb", "co2")
ITALY = "ItalyPowerDemand"


# --------------------------------------------------------------------------- generators


def synth_domain(name: str, n: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` windows of one synthetic family, shape (n, length), original units."""
    t = np.arange(length) / length  # one window spans [0, 1)
    if name == "sine":
        f = rng.uniform(0.5, 4.0, (n, 1))
        phase = rng.uniform(0, 2 * np.pi, (n, 1))
        amp = rng.uniform(0.5, 2.0, (n, 1))
        x = amp * np.sin(2 * np.pi * f * t + phase) + 0.05 * rng.normal(size=(n, length))
    elif name == "ar1":
        phi = rng.uniform(0.5, 0.95, n)
        x = np.zeros((n, length))
        x[:, 0] = rng.normal(size=n) / np.sqrt(1 - phi**2)
        for i in range(1, length):
            x[:, i] = phi * x[:, i - 1] + rng.normal(size=n)
    elif name == "random_walk":
        x = np.cumsum(rng.normal(size=(n, length)), axis=1)
    elif name == "square":
        period = rng.uniform(0.2, 1.0, (n, 1))
        duty = rng.uniform(0.2, 0.8, (n, 1))
        phase = rng.uniform(0, 1, (n, 1))
        x = (((t + phase) / period) % 1.0 < duty).astype(float)
        x = x + 0.05 * rng.normal(size=(n, length))
    elif name == "chirp":
        f0 = rng.uniform(0.5, 2.0, (n, 1))
        f1 = rng.uniform(2.0, 6.0, (n, 1))
        phase = rng.uniform(0, 2 * np.pi, (n, 1))
        x = np.sin(2 * np.pi * (f0 * t + 0.5 * (f1 - f0) * t**2) + phase)
        x = x + 0.05 * rng.normal(size=(n, length))
    elif name == "spikes":
        period = rng.uniform(0.2, 0.5, (n, 1))
        phase = rng.uniform(0, 1, (n, 1))
        width = rng.uniform(0.015, 0.04, (n, 1))
        d = ((t - phase) / period) % 1.0
        d = np.minimum(d, 1 - d) * period
        x = np.exp(-0.5 * (d / width) ** 2) + 0.03 * rng.normal(size=(n, length))
    else:
        raise ValueError(f"unknown synthetic domain {name!r}")
    return x.astype(np.float32)


def damped(n: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """Damped oscillations e^{−a t} sin(ω t + φ), a ∈ [0.5, 3], ω ∈ [2π, 6π], noise 0.03."""
    t = np.arange(length) / length
    a = rng.uniform(0.5, 3.0, (n, 1))
    w = rng.uniform(2 * np.pi, 6 * np.pi, (n, 1))
    phase = rng.uniform(0, 2 * np.pi, (n, 1))
    x = np.exp(-a * t) * np.sin(w * t + phase) + 0.03 * rng.normal(size=(n, length))
    return x.astype(np.float32)


def windows_of(series: list[np.ndarray], length: int) -> np.ndarray:
    """Non-overlapping length-L windows of each series (a remainder shorter than L dropped)."""
    out = [s[i * length : (i + 1) * length] for s in series for i in range(len(s) // length)]
    if not out:
        return np.zeros((0, length), np.float32)
    return np.stack(out).astype(np.float32)


# --------------------------------------------------------------------------- tables


def _table(domains: list[str], windows: list[np.ndarray], length: int) -> pa.Table:
    dom = [d for d, w in zip(domains, windows, strict=True) for _ in range(len(w))]
    flat = np.concatenate([w.reshape(-1) for w in windows]).astype(np.float32)
    values = pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), length)
    return pa.table({"domain": pa.array(dom, pa.string()), "x": values})


def _build_synthetic(cfg: TimeModeConfig) -> pa.Table:
    wins = []
    for i, name in enumerate(SYNTH_DOMAINS):
        rng = np.random.default_rng([cfg.data_seed, 101, i])
        wins.append(synth_domain(name, cfg.synth_per_domain, cfg.window, rng))
    return _table(list(SYNTH_DOMAINS), wins, cfg.window)


def _ts_series(wheel: PinnedWheel, folder: str, fetch: bool) -> list[np.ndarray]:
    root = f"{wheel.import_name}/datasets/data/{folder}/{folder}_"
    series: list[np.ndarray] = []
    for split in ("TRAIN", "TEST"):
        files = wheel_files(wheel, f"{root}{split}.ts", fetch=fetch)
        for member, raw in files.items():
            series += parse_ts(raw.decode("utf-8"), name=member).univariate()
    return series


def _co2() -> np.ndarray:
    import statsmodels.api as sm

    co2 = sm.datasets.co2.load_pandas().data["co2"].interpolate().to_numpy()
    return co2[np.isfinite(co2)]


def real_series(fetch: bool = False) -> dict[str, list[np.ndarray]]:
    """The real corpus's univariate series per domain (original units)."""
    import pandas as pd

    out: dict[str, list[np.ndarray]] = {}
    for wheel, folder in REAL_TS:
        out[folder] = _ts_series(wheel, folder, fetch)
    raw = wheel_files(SKTIME, "sktime/datasets/data/mitdb/mitdb.csv", fetch=fetch)
    mitdb = pd.read_csv(io.BytesIO(next(iter(raw.values()))))["data"].to_numpy(float)
    out["mitdb"] = [mitdb]
    out["co2"] = [_co2()]
    return out


def _build_real(cfg: TimeModeConfig) -> pa.Table:
    series = real_series(cfg.fetch_data)
    wins = [windows_of(series[d], cfg.window) for d in REAL_DOMAINS]
    return _table(list(REAL_DOMAINS), wins, cfg.window)


def real_available() -> bool:
    """Whether the real corpus can be read without the network."""
    return wheel_available(AEON) and wheel_available(SKTIME)


def corpus_table(cfg: TimeModeConfig) -> pa.Table:
    """The pre-training corpus: ``domain`` (string) and ``x`` (L floats), original units."""
    if cfg.corpus == "synthetic":
        key = f"timemode-synth-L{cfg.window}-n{cfg.synth_per_domain}-s{cfg.data_seed}"
        return cached_table(key, lambda: _build_synthetic(cfg), version="1")
    if not cfg.fetch_data and not real_available():
        raise MissingExtraError(
            "the real time-series corpus reads aeon 1.6.0 and sktime 1.2.0 out of their wheels, "
            "which are not cached: set fetch_data=true (nshot reproduce does for small), or "
            f"`{AEON.pip_line}` and `{SKTIME.pip_line}`"
        )
    return cached_table(f"timemode-real-L{cfg.window}", lambda: _build_real(cfg), version="1")


def _build_target(cfg: TimeModeConfig) -> pa.Table:
    if cfg.target == "damped":
        rng = np.random.default_rng([cfg.data_seed, 202])
        pool = damped(max(cfg.n_shot, 50) * 4, cfg.window, rng)
        ref = damped(cfg.n_reference, cfg.window, np.random.default_rng([cfg.data_seed, 203]))
        return pa.table({
            "split": ["pool"] * len(pool) + ["reference"] * len(ref),
            "x": pa.FixedSizeListArray.from_arrays(
                pa.array(np.concatenate([pool, ref]).reshape(-1), pa.float32()), cfg.window),
        })  # fmt: skip
    if cfg.window != 24:
        raise DataError("field 'window': ItalyPowerDemand windows are 24 hours long")
    series: list[np.ndarray] = []
    for split in ("TRAIN", "TEST"):
        pat = f"aeon/datasets/data/{ITALY}/{ITALY}_{split}.ts"
        for member, raw in wheel_files(AEON, pat, fetch=cfg.fetch_data).items():
            series += parse_ts(raw.decode("utf-8"), name=member).univariate()
    x = windows_of(series, 24)
    return pa.table({
        "split": ["pool"] * len(x),
        "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1), pa.float32()), 24),
    })  # fmt: skip


def target_table(cfg: TimeModeConfig) -> pa.Table:
    """The target's windows: ``split`` (pool: few-shot sets are drawn from it; reference: only
    for scoring) and ``x``; for ItalyPowerDemand every window is in the pool."""
    if cfg.target == "damped":
        key = f"timemode-damped-L{cfg.window}-n{cfg.n_shot}-r{cfg.n_reference}-s{cfg.data_seed}"
    else:
        if not cfg.fetch_data and not wheel_available(AEON):
            raise MissingExtraError(
                f"ItalyPowerDemand is read out of the aeon {AEON.version} wheel, which is not "
                f"cached: set fetch_data=true, or `{AEON.pip_line}`"
            )
        key = "timemode-italy"
    return cached_table(key, lambda: _build_target(cfg), version="1")


# --------------------------------------------------------------------------- arrays


def _x(table: pa.Table, length: int) -> np.ndarray:
    flat = table.column("x").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return flat.reshape(-1, length, 1).astype(np.float32)


@dataclass
class Scaler:
    """Per-channel min-max scaling to [0, 1] (paper §3), fitted on one domain's windows."""

    lo: np.ndarray  # (C,)
    hi: np.ndarray

    def scale(self, x: np.ndarray) -> np.ndarray:
        return ((x - self.lo) / (self.hi - self.lo)).astype(np.float32)

    def invert(self, x: np.ndarray) -> np.ndarray:
        return (x * (self.hi - self.lo) + self.lo).astype(np.float32)


def fit_scaler(x: np.ndarray) -> Scaler:
    """Min-max over windows and time per channel; a constant set is an error."""
    lo = x.min(axis=(0, 1)).astype(np.float64)
    hi = x.max(axis=(0, 1)).astype(np.float64)
    if np.any(hi - lo <= 1e-8):
        raise DataError("the windows are constant: a min-max scaler is undefined")
    return Scaler(lo, hi)


@dataclass
class Corpus:
    """Pre-training windows per domain, scaled to [0, 1] by each domain's own scaler."""

    names: list[str]
    windows: list[np.ndarray]  # per domain (n_d, L, C), scaled
    scalers: list[Scaler]


def load_corpus(cfg: TimeModeConfig) -> Corpus:
    table = corpus_table(cfg)
    x = _x(table, cfg.window)
    dom = np.asarray(table.column("domain").to_pylist())
    names = list(SYNTH_DOMAINS if cfg.corpus == "synthetic" else REAL_DOMAINS)
    wins, scalers = [], []
    for d in names:
        w = x[dom == d]
        if len(w) < 2:
            raise DataError(f"corpus domain {d!r} has {len(w)} windows")
        s = fit_scaler(w)
        wins.append(s.scale(w))
        scalers.append(s)
    return Corpus(names, wins, scalers)


@dataclass
class Target:
    """A few-shot target: the few-shot windows (original units), the reference windows the
    metrics compare against (disjoint from the few-shot set) and the scaler of the few-shot set."""

    name: str
    shots: np.ndarray  # (k, L, C)
    reference: np.ndarray  # (m, L, C)
    scaler: Scaler


def target_name(cfg: TimeModeConfig) -> str:
    return ITALY if cfg.target == "italy" else "damped"


def load_target(cfg: TimeModeConfig, n_shot: int | None = None, seed: int = 0) -> Target:
    """The ``n_shot`` windows of fine-tuning seed ``seed`` and the reference. For
    ItalyPowerDemand the reference is every window outside the seed's largest few-shot set
    (``cfg.n_shot``), so the regimes of one seed are nested and share a reference."""
    k = n_shot or cfg.n_shot
    table = target_table(cfg)
    x = _x(table, cfg.window)
    split = np.asarray(table.column("split").to_pylist())
    pool, ref = x[split == "pool"], x[split == "reference"]
    if cfg.n_shot >= len(pool):
        raise DataError(f"field 'n_shot': {cfg.n_shot} ≥ the {len(pool)} target windows")
    order = np.random.default_rng([cfg.data_seed, 303, seed]).permutation(len(pool))
    shots = pool[order[:k]]
    if len(ref) == 0:
        ref = pool[order[cfg.n_shot :]]
    return Target(target_name(cfg), shots, ref, fit_scaler(shots))


def data_tables(cfg: TimeModeConfig) -> dict[str, pa.Table]:
    return {"corpus": corpus_table(cfg), "target": target_table(cfg)}
