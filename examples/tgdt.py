"""Train TG-DT on PointRobot, evaluate it zero-shot on the held-out goals, and ask its
predictor for actions from a description.

    python examples/tgdt.py                   # smoke preset: seconds
    python examples/tgdt.py --preset small    # the small track: minutes
    python examples/tgdt.py --workers 2       # two Ray Train workers (DDP)

It trains the full TG-DT (one Ray Train run), prints its zero-shot metrics on the held-out
goals (described in text only), then asks the predictor for the first action towards a goal
and for a rollout in the built-in environment. The comparison with every baseline is
`nshot reproduce tgdt --preset small`.
"""

from __future__ import annotations

import argparse

import numpy as np

from nshot.method import get, parse_overrides
from nshot.methods.tgdt.data import describe, load_data
from nshot.train import Scaling, fit, load_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smoke")
    ap.add_argument("--workers", type=int, default=0, help="Ray Train workers (0: in-process)")
    ap.add_argument("--storage", "--output", help="run storage (default: the nshot cache)")
    ap.add_argument("--set", action="append", default=[], help="override a field: KEY=VALUE")
    args = ap.parse_args()

    tg = get("tgdt")
    cfg = tg.config(args.preset, **parse_overrides(args.set))
    res = fit("tgdt", cfg, scaling=Scaling(workers=args.workers), storage=args.storage,
              name=f"example-tgdt-{args.preset}", overwrite=True)  # fmt: skip
    ckpt = load_checkpoint(res.checkpoint, method="tgdt")
    metrics = tg.evaluate(ckpt, cfg)
    print("zero-shot on the held-out goals:", {k: round(v, 4) for k, v in metrics.items()})

    data = load_data(cfg)
    goal = data.goals[data.test_tasks[0]]
    desc = describe(goal, "expert", data.test_return(), cfg.horizon)
    predictor = tg.predictor(ckpt)
    first = predictor(predictor.Request(description=desc, states=[[0.0, 0.0]], actions=[],
                                        rewards=[]))  # fmt: skip
    print(f"description: {desc!r}\nfirst action: {first.action} (goal {np.round(goal, 2)})")
    run = predictor(predictor.Request(mode="rollout", description=desc,
                                      goal=[float(g) for g in goal], episodes=2))  # fmt: skip
    end = np.asarray(run.trajectory[-1])
    print(f"rollout returns: {run.returns}; final distance to the goal "
          f"{np.linalg.norm(end - goal):.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
