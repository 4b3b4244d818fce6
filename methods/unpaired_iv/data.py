"""Data for unpaired IV: the offline generator, the Card sanity check, CSV/Parquet files.

Generator (one replication)::

    μ_e ~ N(0, I_d) (or μ_e = A z_e, A ∈ R^{d×k} fixed, z_e ~ N(0, I_k): the low-rank variant)
    γ = 1_d/√d;  per unit: H ~ N(0,1), X = μ_e + γH + N(0, I_d), Y = Xᵀβ* + c·H + N(0, 1)
    X-sample: r units per environment, keep (e, X)
    Y-sample: r fresh units per environment, keep (e, Y); their X is latent (oracle only)

β* has its first ``s*`` coordinates equal to ``beta_value`` and the rest 0; c is the
confounding coefficient (2 by default).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nshot.method import NshotError


@dataclass
class Replication:
    """Two unpaired samples with integer environment codes; ``x_latent`` is the Y-sample's X
    (known only for generated or Card data, used by the paired oracles); ``beta`` the truth."""

    x_env: np.ndarray
    x: np.ndarray
    y_env: np.ndarray
    y: np.ndarray
    x_latent: np.ndarray | None = None
    beta: np.ndarray | None = None
    labels: list[Any] | None = None  # code -> original environment label
    info: dict[str, Any] = field(default_factory=dict)


def true_beta(d: int, s_star: int, value: float = 1.0) -> np.ndarray:
    b = np.zeros(d)
    b[:s_star] = value
    return b


def loading_matrix(d: int, k: int, seed: int = 0) -> np.ndarray:
    """The fixed A ∈ R^{d×k} of the low-rank variant (entries N(0, 1/k): Var μ_ej = 1)."""
    return np.random.default_rng([seed, 4242, d, k]).normal(0.0, 1.0 / np.sqrt(k), (d, k))


def generate(
    m: int,
    r: int,
    d: int,
    s_star: int,
    rng: np.random.Generator,
    *,
    beta_value: float = 1.0,
    confounding: float = 2.0,
    rank: int | None = None,
    loading_seed: int = 0,
) -> Replication:
    """One replication of the generator (balanced: r units per environment per sample)."""
    beta = true_beta(d, s_star, beta_value)
    if rank is None:
        mu = rng.standard_normal((m, d))
    else:
        mu = rng.standard_normal((m, rank)) @ loading_matrix(d, rank, loading_seed).T
    gamma = np.full(d, 1.0 / np.sqrt(d))
    env = np.repeat(np.arange(m), r)
    n = m * r
    hx = rng.standard_normal(n)
    x = mu[env] + hx[:, None] * gamma + rng.standard_normal((n, d))
    hy = rng.standard_normal(n)
    xl = mu[env] + hy[:, None] * gamma + rng.standard_normal((n, d))
    y = xl @ beta + confounding * hy + rng.standard_normal(n)
    return Replication(
        env,
        x,
        env.copy(),
        y,
        xl,
        beta,
        info={"m": m, "r": r, "d": d, "s_star": s_star, "rank": rank},
    )


# --------------------------------------------------------------------------- Card (1995)


def card_frame():
    """``linearmodels.datasets.card``: lwage, educ, nearc4 (3 010 rows, shipped offline)."""
    from linearmodels.datasets import card

    return card.load()[["lwage", "educ", "nearc4"]].dropna()


def card_split(rng: np.random.Generator, frame=None) -> Replication:
    """Card made unpaired: a random half split, educ (X) from one half, lwage (Y) from the other;
    the environment is ``nearc4`` (two environments). The Y half's educ is kept as the latent X
    for the paired oracles."""
    df = card_frame() if frame is None else frame
    perm = rng.permutation(len(df))
    half = len(df) // 2
    a, b = df.iloc[perm[:half]], df.iloc[perm[half:]]
    return Replication(
        a["nearc4"].to_numpy(np.int64),
        a["educ"].to_numpy(float)[:, None],
        b["nearc4"].to_numpy(np.int64),
        b["lwage"].to_numpy(float),
        b["educ"].to_numpy(float)[:, None],
        None,
        labels=[0, 1],
        info={"source": "card", "rows": len(df)},
    )


def card_paired_iv2sls() -> dict[str, float]:
    """Paired IV2SLS on all Card rows (lwage on const + educ, instrument nearc4), robust se."""
    from linearmodels.iv import IV2SLS

    df = card_frame()
    df = df.assign(const=1.0)
    res = IV2SLS(df["lwage"], df[["const"]], df[["educ"]], df[["nearc4"]]).fit(cov_type="robust")
    return {"beta": float(res.params["educ"]), "se": float(res.std_errors["educ"])}


# --------------------------------------------------------------------------- files


def load_path(path: str | Path) -> Replication:
    """A CSV or Parquet file with columns ``env``, ``sample`` ∈ {X, Y}, ``x_0..x_{d−1}`` (X rows)
    and ``y`` (Y rows) (e.g. the Causal Chamber light tunnel exported to this layout)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    p = Path(path).expanduser()
    if not p.is_file():
        raise NshotError(f"data_path: {p} does not exist")
    try:
        table: pa.Table = (
            pq.read_table(p) if p.suffix.lower() in (".parquet", ".pq") else pacsv.read_csv(p)
        )
    except (pa.ArrowInvalid, OSError) as err:
        raise NshotError(f"data_path: {p} cannot be read: {err}") from None
    cols = table.column_names
    missing = [c for c in ("env", "sample") if c not in cols]
    xcols = sorted((c for c in cols if c.startswith("x_")), key=lambda c: int(c[2:]))
    if missing or not xcols or "y" not in cols:
        raise NshotError(
            f"data_path: {p} needs columns env, sample, x_0..x_(d-1) and y; has {cols}"
        )
    if [int(c[2:]) for c in xcols] != list(range(len(xcols))):
        raise NshotError(f"data_path: x columns must be x_0..x_{len(xcols) - 1}; got {xcols}")
    sample = [str(s).upper() for s in table.column("sample").to_pylist()]
    bad = sorted({s for s in sample if s not in ("X", "Y")})
    if bad:
        raise NshotError(f"data_path: column 'sample' must hold X or Y; found {bad}")
    env = table.column("env").to_pylist()
    codes: dict[Any, int] = {}
    env_codes = np.array([codes.setdefault(e, len(codes)) for e in env], dtype=np.int64)
    is_x = np.array([s == "X" for s in sample])
    x = np.column_stack([np.asarray(table.column(c).to_pylist(), dtype=float) for c in xcols])
    y = np.asarray(table.column("y").to_pylist(), dtype=float)
    xs, ys = x[is_x], y[~is_x]
    if not np.all(np.isfinite(xs)) or not np.all(np.isfinite(ys)):
        raise NshotError(f"data_path: {p} has missing or non-finite x (X rows) or y (Y rows)")
    return Replication(
        env_codes[is_x],
        xs,
        env_codes[~is_x],
        ys,
        None,
        None,
        labels=list(codes),
        info={"source": str(p)},
    )
