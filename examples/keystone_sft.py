"""Keystone's SFT comparison (spec check 4) in one process, without Ray: for one GPU machine.

``nshot reproduce keystone`` runs the probe and the SFT comparison inside a Ray job; this script
runs only the SFT comparison (the probe of ``sft_model`` to find K*, then full fine-tuning,
keystone-only SFT and random-rows SFT with the same row count) through the same functions
(:func:`nshot.methods.keystone.method.sft_comparison`), so it needs torch, DeepSpeed and
transformers but not Ray. The model and the SFT runs go to the GPU when one is visible
(``device=auto``; DeepSpeed picks bf16 there).

Example, the spec's SFT budget (300 steps of batch 32, three seeds) on SmolLM2-135M::

    python examples/keystone_sft.py --preset small \\
        --set sft_steps=300 --set sft_batch=32 --set sft_seeds=3 --out sft.json

``--set key=value`` takes any :class:`KeystoneConfig` field (values parsed as JSON when they
are JSON). The script prints the per-run metrics and check 4's three parts and writes them,
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
    """Means over seeds of gain / forgetting per system, and check 4's three parts."""

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
    full, key, rnd = rows["sft_full"], rows["sft_keystone"], rows["sft_random_rows"]
    checks = {
        "keystone_gain_ge_0.9_full": key["gain"] >= 0.9 * full["gain"],
        "keystone_forgets_less_than_full": key["forgetting"] <= full["forgetting"],
        "keystone_gain_gt_random_rows": key["gain"] > rnd["gain"],
    }
    return {"rows": rows, "checks": checks, "base": result["base"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default="keystone-sft.json")
    args = p.parse_args()

    import torch

    from nshot.method import ConfigError, parse_overrides
    from nshot.methods.keystone.config import KeystoneConfig
    from nshot.methods.keystone.method import sft_comparison

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
    for name, ok in summary["checks"].items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
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
