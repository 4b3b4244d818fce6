"""Keystone's SFT comparison (the ``sft_*`` claims) in one process, without Ray: for one GPU.

``nshot reproduce keystone`` runs the probe and the SFT comparison inside a Ray job; this script
runs only the SFT comparison (the probe of ``sft_model`` to find K*, then full fine-tuning,
keystone-only SFT and random-rows SFT with the same row count) through the same functions
(:func:`nshot.methods.keystone.experiments.sft_comparison`), so it needs torch, DeepSpeed and
transformers but not Ray. The model and the SFT runs go to the GPU when one is visible
(``device=auto``; DeepSpeed picks bf16 there).

Example, the full SFT budget (300 steps of batch 32, three seeds) on SmolLM2-135M::

    python examples/keystone_sft.py --preset small \\
        --set sft_steps=300 --set sft_batch=32 --set sft_seeds=3 --out sft.json

``--set key=value`` takes any :class:`KeystoneConfig` field (values parsed as JSON when they
are JSON). The script prints the per-run metrics and the three ``sft_*`` claims and writes them,
with the config, to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path


def summarise(result: dict) -> dict:
    """Means over seeds of gain / forgetting per system (what the three ``sft_*`` claims read)."""

    def mean(name: str, key: str) -> float:
        vals = [r[key] for r in result["runs"][name]]
        return sum(vals) / len(vals) if vals else math.nan

    rows = {
        name: {
            k: mean(name, k) for k in ("gain", "forgetting", "acc_target", "acc_others", "train_s")
        }
        | {"trainable_params": result["runs"][name][0]["trainable_params"]}
        for name in result["runs"]
        if result["runs"][name]
    }
    return {"rows": rows, "base": result["base"]}


def sft_claims(rows: dict, preset: str) -> list[dict]:
    """keystone's own claims about the SFT rows (``Method.claims``), evaluated on these rows:
    the same sentences and thresholds ``nshot reproduce keystone`` reports."""
    from nshot.claims import evaluate
    from nshot.methods.keystone.claims import CLAIMS  # (the registry would import Ray)

    claims = [c for c in CLAIMS if {s for s, _ in c.references()} & set(rows)]
    return evaluate(claims, {"preset": preset, "rows": rows})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default="keystone-sft.json")
    args = p.parse_args()

    import torch

    from nshot.method import ConfigError, parse_overrides
    from nshot.methods.keystone.config import KeystoneConfig
    from nshot.methods.keystone.experiments import sft_comparison

    try:
        cfg = KeystoneConfig.from_preset(args.preset, **parse_overrides(args.set))
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    print(
        f"keystone SFT comparison on {cfg.sft_model} ({dev}), {cfg.sft_steps} steps x batch "
        f"{cfg.sft_batch}, lr rows {cfg.sft_lr_keystone} / full {cfg.sft_lr_full}, "
        f"{cfg.sft_seeds} seed(s)",
        flush=True,
    )
    t0 = time.time()
    result = sft_comparison(cfg, log=lambda m: print(m, file=sys.stderr, flush=True))
    summary = summarise(result)
    for name, r in summary["rows"].items():
        print(
            f"{name:16s} gain {r['gain']:+.3f}  forgetting {r['forgetting']:+.3f}  "
            f"acc_target {r['acc_target']:.3f}  params {r['trainable_params']:.0f}  "
            f"train {r['train_s']:.0f}s"
        )
    summary["claims"] = sft_claims(summary["rows"], cfg.preset)
    for c in summary["claims"]:
        mark = {True: "holds", False: "FAILS", None: "n/a"}[c["holds"]]
        print(f"{mark:6s} {c['id']}: {c['statement']} ({c['expr']})")
    out = {
        "device": dev,
        "torch": torch.__version__,
        "config": cfg.model_dump(mode="json"),
        "wall_s": time.time() - t0,
        "summary": summary,
        "runs": result["runs"],
        "keystones": result["keystones"],
        "others_items": result["others_items"],
        "target_items": result["target_items"],
    }
    Path(args.out).write_text(json.dumps(out, indent=1, default=float))
    print(f"wrote {args.out} ({out['wall_s']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
