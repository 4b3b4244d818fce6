"""Inference scaling benchmark: time and peak memory of one URS solve per size (CVRP).

    python -m nshot.methods.urs.bench --checkpoint RUN_OR_CKPT --out scaling.json \
        --sizes 50 100 200 500 1000
    python -m nshot.methods.urs.bench --untrained --starts 50 --sizes 500 1000   # no checkpoint
    python -m nshot.methods.urs.bench --checkpoint RUN --reference-per-node 0.02  # + gap to PyVRP

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
from .model import RoutingNet, load_model, solve
from .representation import generate


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def scaling_benchmark(
    net: RoutingNet,
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
        out.append({"n": n, "variant": variant, "seed": seed, "starts": min(starts, n), "aug": aug,
                    "time_s": dt, "peak_rss_mb": _rss_mb(), "cost": rep.cost,
                    "feasible": rep.feasible})  # fmt: skip
    return out


def reference_gaps(scaling: list[dict], seconds, seed: int = 0) -> list[dict]:  # noqa: ANN001
    """Each entry of :func:`scaling_benchmark` with the reference solver's checked cost on the
    same instance at its budget ``seconds(n)`` (PyVRP for CVRP), and URS's gap to it (%):
    ``ref_cost``, ``ref_feasible``, ``ref_solver``, ``ref_budget_s``, ``gap_pct``."""
    from .baselines import reference

    out = []
    for s in scaling:
        n, budget = s["n"], float(seconds(s["n"]))
        inst = generate(s["variant"], n, 1, s.get("seed", 123) + n)
        ref = reference(inst, 0, budget, seed=seed)
        rep = check(inst, ref["routes"], ref["depots"], 0)
        ok = rep.feasible and rep.cost > 0
        out.append({**s, "ref_cost": rep.cost, "ref_feasible": rep.feasible,
                    "ref_solver": ref["solver"], "ref_budget_s": budget,
                    "gap_pct": 100.0 * (s["cost"] - rep.cost) / rep.cost if ok else None})  # fmt: skip
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
    ap.add_argument("--reference-per-node", type=float, default=None,
                    help="also solve each instance with the reference solver for "
                    "max(0.2, this × N) seconds and report URS's gap to it")  # fmt: skip
    args = ap.parse_args()
    if args.untrained:
        from nshot.method import get

        from .model import build_model

        net = build_model(get("urs").config("small")).eval()
    else:
        net, _ = load_model(load_checkpoint(args.checkpoint, method="urs"))
    res = scaling_benchmark(net, args.sizes, variant=args.variant, starts=args.starts,
                            aug=args.aug)  # fmt: skip
    if args.reference_per_node is not None:
        res = reference_gaps(res, lambda n: max(0.2, args.reference_per_node * n))
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    for r in res:
        print(f"N={r['n']:5d}  {r['time_s']:7.2f}s  peak RSS {r['peak_rss_mb']:7.0f} MB  "
              f"cost {r['cost']:.3f}  feasible {r['feasible']}"
              + (f"  gap {r['gap_pct']:.2f}%" if r.get("gap_pct") is not None else ""))  # fmt: skip


if __name__ == "__main__":
    main()
