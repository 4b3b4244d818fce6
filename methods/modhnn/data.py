"""modhnn's data: generated offline, cached once as Parquet (``nshot.data.cached_table``)."""

from __future__ import annotations

import pyarrow as pa

from nshot.data import cached_table

from .config import ModHNNConfig
from .systems import Split, generate_split, split_to_table, table_to_split

DATA_VERSION = "1"


def _key(cfg: ModHNNConfig, system: str, split: str) -> str:
    n = cfg.n_train_instances if split == "train" else cfg.n_test_instances
    return f"modhnn-{system}-{split}-n{n}-t{cfg.n_traj}-s{cfg.n_steps}-dt{cfg.dt:g}-seed{cfg.seed}"


def split_table(cfg: ModHNNConfig, system: str, split: str) -> pa.Table:
    n = cfg.n_train_instances if split == "train" else cfg.n_test_instances

    def build() -> pa.Table:
        s = generate_split(system, n, cfg.n_traj, cfg.n_steps, cfg.dt, cfg.seed, split)
        return split_to_table(s, split)

    return cached_table(_key(cfg, system, split), build, version=DATA_VERSION)


def load_splits(cfg: ModHNNConfig, system: str | None = None) -> tuple[Split, Split]:
    """``(train, test)`` of ``system`` (default ``cfg.system``)."""
    system = system or cfg.system
    return tuple(  # type: ignore[return-value]
        table_to_split(split_table(cfg, system, s), system, cfg.dt) for s in ("train", "test")
    )
