"""Benchmarks: ratios measured in one run, written as JSON a later run can compare against.

``nshot bench train --method tail`` trains the same config with 1 and with 2 Ray Train
workers (one CPU and one torch thread each; the per-worker batch is fixed, so 2 workers
process twice the samples per step) and reports the group's samples/s and their ratio.
"""

from __future__ import annotations

import json
import os
import platform as _stdlib_platform
import tempfile
import time
from pathlib import Path
from typing import Any

from nshot.method import get


def _environment() -> dict[str, Any]:
    import ray
    import torch

    return {
        "cpu_count": os.cpu_count(),
        "python": _stdlib_platform.python_version(),
        "torch": torch.__version__,
        "ray": ray.__version__,
        "machine": _stdlib_platform.machine(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _compare(out: Path, data: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """Ratios of this run's figures to the previous run's, when the file already exists."""
    if not out.exists():
        return {}
    try:
        old = json.loads(out.read_text())
    except (OSError, ValueError):
        return {}
    cmp = {}
    for k in keys:
        a, b = data.get(k), old.get(k)
        if isinstance(a, int | float) and isinstance(b, int | float) and b:
            cmp[k] = {"previous": b, "now": a, "now_over_previous": a / b}
    return cmp


def train(
    method_name: str = "tail",
    *,
    preset: str = "small",
    steps: int = 60,
    out: str | os.PathLike | None = None,
) -> dict[str, Any]:
    from nshot.train import Scaling, ensure_ray, fit

    method = get(method_name)
    cfg = method.config(
        preset,
        steps=steps,
        log_every=max(1, steps // 6),
        checkpoint_every=steps,
        torch_threads=1,
    )
    ensure_ray()
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="nshot-bench-") as storage:
        for workers in (1, 2):
            res = fit(
                method_name,
                cfg,
                scaling=Scaling(workers=workers, cpus_per_worker=1),
                storage=storage,
                name=f"bench-{workers}w",
            )
            sps = res.metrics.get("samples_per_s")
            if sps is None:
                raise RuntimeError(f"{method_name} does not report samples_per_s")
            runs[f"workers_{workers}"] = {"samples_per_s": sps, "wall_s": res.wall_s}
    data: dict[str, Any] = {
        "benchmark": "train",
        "method": method_name,
        "preset": preset,
        "steps": steps,
        "torch_threads_per_worker": 1,
        "cpus_per_worker": 1,
        **runs,
        "samples_per_s_1": runs["workers_1"]["samples_per_s"],
        "samples_per_s_2": runs["workers_2"]["samples_per_s"],
        "ratio_2_over_1": runs["workers_2"]["samples_per_s"] / runs["workers_1"]["samples_per_s"],
        "target_ratio": 1.6,
        "environment": _environment(),
    }
    path = Path(out or f"bench-results/train-{method_name}.json")
    data["compared_to_previous"] = _compare(
        path, data, ["samples_per_s_1", "samples_per_s_2", "ratio_2_over_1"]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    data["written_to"] = str(path)
    return data
