"""GPU check for every nshot method, through the platform's trainer (imported by gpu_check.py).

For each registered method:

1. its ``smoke`` preset trained in-process (Ray Train's local mode) on the CUDA device the
   trainer picks, against the same run on the CPU (a subprocess without CUDA): the metrics of
   every report agree (losses within 2 % relative or 1e-3 absolute; GPU kernels differ from
   CPU ones in the last bits, which a few steps of training amplify);
2. one step of its ``paper`` preset at full size on the GPU, with the peak GPU memory; a preset
   that needs data or weights nshot does not ship (a local path, a download) is reported as
   needing them, with the method's own message.

Results go to the JSON file given with ``--out`` (``gpu_check.py`` writes
``gpu-results/gpu_check.json`` beside the LLM checks).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

#: report keys that measure time or throughput, not what the run computes
VOLATILE = ("samples_per_s", "wall_s", "step_s", "epoch_s", "lr")


def _steady(reports: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in reports]


def smoke(name: str, workdir: Path) -> dict[str, Any]:
    """Train ``name``'s smoke preset in this process; its reports and the device it used."""
    import torch

    from nshot.method import get
    from nshot.train import fit
    from nshot.train.session import recorded_reports

    cfg = get(name).config("smoke")
    t0 = time.time()
    try:
        with recorded_reports() as reports:
            fit(name, cfg, storage=workdir, name=f"{name}-smoke")
    except Exception as err:  # noqa: BLE001 - reported per method
        return {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()[-2000:]}
    return {
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "reports": _steady(reports),
        "seconds": time.time() - t0,
    }


def paper_step(name: str, workdir: Path) -> dict[str, Any]:
    """One training step of ``name``'s paper preset on the GPU, with the peak memory."""
    import torch

    from nshot.method import get
    from nshot.train import fit

    method = get(name)
    try:
        cfg = method.config("paper").replace(steps=1, log_every=1, checkpoint_every=1)
    except Exception as err:  # noqa: BLE001
        return {"status": "config refuses one step", "detail": str(err)}
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    try:
        fit(name, cfg, storage=workdir, name=f"{name}-paper")
    except Exception as err:  # noqa: BLE001 - a missing dataset or weights is a status
        text = f"{type(err).__name__}: {err}"
        needs = any(w in text for w in ("not set", "download", "No such file", "huggingface"))
        return {"status": "needs data or weights" if needs else "failed", "detail": text[:800]}
    return {
        "status": "ran",
        "seconds": time.time() - t0,
        "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20,
    }


def run(side: str, names: list[str] | None = None) -> dict[str, Any]:
    """Every method's smoke run on this process's device (``side``), and on the GPU side one
    paper step each."""
    from nshot.method import available

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="nshot-gpu-methods-") as tmp:
        for name in names or available():
            row: dict[str, Any] = {"smoke": smoke(name, Path(tmp))}
            if side == "cuda":
                row["paper_step"] = paper_step(name, Path(tmp))
            out[name] = row
    return out


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= max(1e-3, 2e-2 * abs(b))


def compare(gpu: dict[str, Any], cpu: dict[str, Any]) -> list[tuple[str, bool, str]]:
    rows = []
    for name in sorted(gpu):
        g, c = gpu[name]["smoke"], cpu.get(name, {}).get("smoke", {})
        if "error" in g or "error" in c:
            rows.append((f"{name} smoke", False, g.get("error") or c.get("error")))
            continue
        on_gpu = g["device"] == "cuda"
        diffs = [
            (k, gr[k], cr[k])
            for gr, cr in zip(g["reports"], c["reports"], strict=False)
            for k in cr
            if k in gr and not _close(gr[k], cr[k])
        ]
        same = len(g["reports"]) == len(c["reports"]) and not diffs
        detail = "all reports agree" if same else f"{len(diffs)} differ, first {diffs[:2]}"
        rows.append((f"{name} smoke on the GPU vs the CPU", on_gpu and same, detail))
        p = gpu[name].get("paper_step", {})
        ok = p.get("status") in ("ran", "needs data or weights")
        detail = (
            f"peak {p['peak_gpu_mib']:.0f} MiB, {p['seconds']:.1f} s"
            if p.get("status") == "ran"
            else f"{p.get('status')}: {p.get('detail', '')[:160]}"
        )
        rows.append((f"{name} one paper step on the GPU", ok, detail))
    return rows


if __name__ == "__main__":
    import sys

    side = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    print(json.dumps(run(side), indent=1))
