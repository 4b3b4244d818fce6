"""Pretrain a linear-attention in-context regressor, fine-tune it on one task, and watch what
fine-tuning does to in-context learning (see methods/iclft/README.md).

    python examples/iclft.py                       # ~1 min on one core: pretrain + zs/v + zs/all
    python examples/iclft.py --workers 2           # the same under Ray Train DDP, 2 workers

The same run from the command line: `nshot train iclft --preset smoke --set steps=600 ...`;
the full comparison: `nshot reproduce iclft --preset small`.
"""

from __future__ import annotations

import argparse

import numpy as np

from nshot.method import get
from nshot.methods.iclft import closed_form as cf
from nshot.train import Scaling, fit, load_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=0, help="Ray Train workers (0: in-process)")
    ap.add_argument("--steps", type=int, default=600, help="iterations per stage")
    ap.add_argument("--storage", "--output", help="run storage (default: the nshot cache)")
    args = ap.parse_args()

    iclft = get("iclft")
    cfg = iclft.config(
        "smoke", steps=args.steps, batch=512, variants=["zs/v", "zs/all"],
        eval_batch=5000, eval_n=[0, 1, 5, 20], log_every=200, checkpoint_every=args.steps,
    )  # fmt: skip
    result = fit("iclft", cfg, scaling=Scaling(workers=args.workers), storage=args.storage,
                 name="example-iclft", overwrite=True)  # fmt: skip
    ckpt = load_checkpoint(result.checkpoint, method="iclft")

    metrics = iclft.evaluate(ckpt, cfg)
    c = cf.pretrained_coef(cfg.d, cfg.n_pt, cfg.sigma2)
    print(f"{'model':12s}" + "".join(f"  target@{n:<3d}" for n in cfg.eval_n)
          + "".join(f"  unseen@{n:<3d}" for n in cfg.eval_n))  # fmt: skip
    for row in ckpt.extra["trained"]:
        cells = [metrics[f"{row}/err_{t}_n{n}"] for t in ("target", "unseen") for n in cfg.eval_n]
        print(f"{row:12s}" + "".join(f"  {v:10.3f}" for v in cells))
    print("closed form, pretrained optimum:", [round(cf.err_pretrained(n, cfg.d, c, cfg.sigma2), 3)
                                               for n in cfg.eval_n])  # fmt: skip
    print(f"closed form, V-only zero-shot floor: {cf.vonly_zs_floor(cfg.d, cfg.sigma2):.3f}")

    # serve: 10 demonstrations of the target task, 3 queries, each fine-tuned model
    theta0 = np.array(ckpt.extra["theta0"])
    rng = np.random.default_rng(0)
    cx, qx = rng.normal(size=(10, cfg.d)), rng.normal(size=(3, cfg.d))
    cy = cx @ theta0 + rng.normal(size=10) * np.sqrt(cfg.sigma2)
    predictor = iclft.predictor(ckpt)
    print("true  y:", np.round(qx @ theta0, 3).tolist())
    for variant in predictor.metadata()["variants"]:
        out = predictor(predictor.Request(context_x=cx.tolist(), context_y=cy.tolist(),
                                          query_x=qx.tolist(), variant=variant))  # fmt: skip
        print(f"{variant:10s}", np.round(out.y_hat, 3).tolist())


if __name__ == "__main__":
    main()
