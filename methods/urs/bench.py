"""Inference scaling benchmark: time and peak memory of one URS solve per size (CVRP).

    python -m nshot.methods.urs.bench --checkpoint RUN_OR_CKPT --out scaling.json \
        --sizes 50 100 200 500 1000
    python -m nshot.methods.urs.bench --untrained --starts 50 --sizes 500 1000   # no checkpoint

Each size is decoded once (greedy, ``min(N, starts)`` POMO starts × ``aug`` augmentations, one
torch thread) and verified by the independent checker. ``peak_rss_mb`` is the process's peak
resident memory after that size (sizes run in increasing order, so it is the peak up to it).
``--untrained`` decodes with the ``small`` config's initial weights instead of a checkpoint:
the time of the decoding machinery (the masks, the decoder) without a trained policy, for
comparing code versions on a machine that has no checkpoint (costs are not a policy's).
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import torch

from .checker import check
from .model import URSNet, load_model, solve
from .representation import generate


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def scaling_benchmark(
    net: URSNet,
    sizes: list[int],
    *,
    variant: str = "CVRP",
    starts: int = 100,
    aug: int = 8,
    seed: int = 123,
) -> list[dict]:
    torch.set_num_threads(1)
    out = []
    for n in sorted(sizes):
        inst = generate(variant, n, 1, seed + n)
        t0 = time.time()
        sol = solve(net, inst, starts, aug)[0]
        dt = time.time() - t0
        rep = check(inst, sol["routes"], sol["depots"], 0)
        out.append({"n": n, "variant": variant, "starts": min(starts, n), "aug": aug,
                    "time_s": dt, "peak_rss_mb": _rss_mb(), "cost": rep.cost,
                    "feasible": rep.feasible})  # fmt: skip
    return out


def main() -> None:
    from nshot.train import load_checkpoint

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint")
    src.add_argument("--untrained", action="store_true", help="the small config's initial weights")
    ap.add_argument("--out", default="urs-scaling.json")
    ap.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200, 500, 1000])
    ap.add_argument("--starts", type=int, default=100)
    ap.add_argument("--aug", type=int, default=8, choices=[1, 8])
    ap.add_argument("--variant", default="CVRP")
    args = ap.parse_args()
    if args.untrained:
        from nshot.method import get

        from .model import build_model

        net = build_model(get("urs").config("small")).eval()
    else:
        net, _ = load_model(load_checkpoint(args.checkpoint, method="urs"))
    res = scaling_benchmark(net, args.sizes, variant=args.variant, starts=args.starts,
                            aug=args.aug)  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    for r in res:
        print(f"N={r['n']:5d}  {r['time_s']:7.2f}s  peak RSS {r['peak_rss_mb']:7.0f} MB  "
              f"cost {r['cost']:.3f}  feasible {r['feasible']}")  # fmt: skip


if __name__ == "__main__":
    main()
