"""Train URS, then solve an unseen VRP variant zero-shot through its predictor.

    python examples/urs.py --preset smoke     # seconds: a barely trained model, still feasible
    python examples/urs.py --preset small     # ~10 min on 2 cores (1000 POMO steps at N=20)

The same from the command line: `nshot train urs --preset small`, then
`nshot eval urs --checkpoint ~/.cache/nshot/runs/urs-small` and
`nshot serve urs --checkpoint ...` (POST /urs/predict with the JSON request printed below).
"""

from __future__ import annotations

import argparse
import json
import time

from pydantic import ValidationError

from nshot.method import get
from nshot.methods.urs.checker import check
from nshot.methods.urs.heuristics import nearest_neighbour
from nshot.methods.urs.representation import generate
from nshot.methods.urs.serve import request_body
from nshot.train import Scaling, fit, load_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smoke")
    ap.add_argument("--storage", "--output", help="run storage (default: the nshot cache)")
    ap.add_argument("--variant", default="OVRPBLTW", help="an unseen variant to solve")
    ap.add_argument("--n", type=int, default=50, help="customers")
    args = ap.parse_args()

    method = get("urs")
    cfg = method.config(args.preset)
    print(f"training on {cfg.seen_variants} at N={cfg.train_sizes} for {cfg.steps} steps")
    result = fit("urs", cfg, scaling=Scaling(workers=0), storage=args.storage,
                 name=f"example-urs-{args.preset}", overwrite=True)  # fmt: skip
    ckpt = load_checkpoint(result.checkpoint, method="urs")
    predictor = method.predictor(ckpt)

    inst = generate(args.variant, args.n, 1, seed=2026)
    row = inst.to_rows()[0]
    request = request_body(row)
    print("request (first 3 nodes):", json.dumps({k: v[:3] if isinstance(v, list) else v
                                                  for k, v in request.items()}))  # fmt: skip
    t0 = time.perf_counter()
    out = predictor(predictor.Request(**request))
    ms = 1000.0 * (time.perf_counter() - t0)
    nn = nearest_neighbour(inst)[0]
    nn_cost = check(inst, nn["routes"], nn["depots"]).cost
    print(f"{out.variant} (unseen in training), N={args.n}: URS cost {out.objective:.3f} in "
          f"{ms:.0f} ms, feasible={out.feasible}, {len(out.routes)} routes; "
          f"nearest neighbour {nn_cost:.3f}")  # fmt: skip
    if out.violations:
        print("violations:", out.violations)
    bad = dict(request, linehaul=[0] + [1000] * (len(request["locations"]) - 1))
    try:
        predictor.Request(**bad)
    except ValidationError as err:
        msg = err.errors()[0]["msg"].removeprefix("Value error, ")
        print("a malformed request is rejected (HTTP 422 when served):", msg)


if __name__ == "__main__":
    main()
