"""Pre-train TimeMoDE, fine-tune it on a few target windows, and generate windows.

    python examples/timemode.py                   # smoke preset: synthetic corpus, seconds
    python examples/timemode.py --preset small    # real corpus (aeon/sktime wheels), minutes

It pre-trains on the preset's multi-domain corpus (one Ray Train run), fine-tunes on the
target's few-shot windows from that checkpoint (a second run), prints the fine-tuned model's
metrics against the held-out target windows, then asks the predictor for windows conditioned on
three of the few-shot windows. The comparison with every baseline is
`nshot reproduce timemode --preset small`.
"""

from __future__ import annotations

import argparse

import numpy as np

from nshot.method import get
from nshot.methods.timemode.data import load_target
from nshot.train import Scaling, fit, load_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smoke")
    ap.add_argument("--workers", type=int, default=0, help="Ray Train workers (0: in-process)")
    ap.add_argument("--storage", "--output", help="run storage (default: the nshot cache)")
    args = ap.parse_args()

    tm = get("timemode")
    cfg = tm.config(args.preset)
    scaling = Scaling(workers=args.workers)
    pre = fit("timemode", cfg, scaling=scaling, storage=args.storage,
              name=f"example-timemode-{args.preset}-pretrain", overwrite=True)  # fmt: skip
    ft_cfg = cfg.replace(stage="finetune", init_from=str(pre.checkpoint))
    ft = fit("timemode", ft_cfg, scaling=scaling, storage=args.storage,
             name=f"example-timemode-{args.preset}-finetune", overwrite=True)  # fmt: skip
    ckpt = load_checkpoint(ft.checkpoint, method="timemode")
    metrics = tm.evaluate(ckpt, ft_cfg)
    print("fine-tuned on", cfg.n_shot, "target windows; metrics (disc, fid_feat, pred: lower is "
          "better):", {k: round(v, 4) for k, v in metrics.items()})  # fmt: skip

    target = load_target(ft_cfg)
    predictor = tm.predictor(ckpt)
    req = predictor.Request(n_samples=4, exemplars=target.shots[:3].astype(float).tolist(), seed=0)
    answer = predictor(req)
    x = np.asarray(answer.samples)
    print(
        f"generated {x.shape[0]} windows of {x.shape[1]} steps ({answer.steps} reverse steps); "
        f"first: {np.round(x[0, :8, 0], 3).tolist()} …"
    )


if __name__ == "__main__":
    main()
