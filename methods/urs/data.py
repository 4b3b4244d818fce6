"""URS's fixed test sets: (variant, size) instances, materialised once as Parquet."""

from __future__ import annotations

import json

import pyarrow as pa

from .config import URSConfig
from .representation import Instances, test_set


def instances_table(inst: Instances, n: int) -> pa.Table:
    rows = inst.to_rows()
    return pa.table(
        {
            "variant": [r["variant"] for r in rows],
            "n": [n] * len(rows),
            "index": list(range(len(rows))),
            "hash": [inst.hash(i) for i in range(len(rows))],
            "instance": [json.dumps(r) for r in rows],
        }
    )


def table_instances(table: pa.Table) -> Instances:
    return Instances.from_rows([json.loads(s) for s in table.column("instance").to_pylist()])


def cache_name(name: str) -> str:
    """A test set's name as a cache key part: ``"VRPTW@clustered"`` → ``"VRPTW.clustered"``."""
    return name.replace("@", ".")


def load_test_set(cfg: URSConfig, variant: str, n: int) -> Instances:
    """The fixed test instances of (variant, n), materialised once as Parquet in the cache;
    ``variant`` may name a layout (``"VRPTW@clustered"``)."""
    from nshot.data import cached_table

    key = f"urs-test-{cache_name(variant)}-n{n}-k{cfg.eval_instances}-s{cfg.test_seed}"
    table = cached_table(
        key, lambda: instances_table(test_set(variant, n, cfg.eval_instances, cfg.test_seed), n)
    )
    return table_instances(table)
