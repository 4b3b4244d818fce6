"""Pretrain BSR's VideoMAE on rendered EEG, evaluate it few-shot on held-out subjects through
two montages, and classify a trial recorded with a montage the model was not pretrained on.

    python examples/bsr.py                    # smoke preset: seconds
    python examples/bsr.py --preset small     # 20 source subjects, 1,000 steps: a few minutes

The EEG is generated with MNE's forward model (no recording ships in any package). The
comparison with every baseline is `nshot reproduce bsr --preset small`.
"""

from __future__ import annotations

import argparse

from nshot.method import get
from nshot.train import Scaling, fit, load_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smoke")
    ap.add_argument("--workers", type=int, default=0, help="Ray Train workers (0: in-process)")
    ap.add_argument("--storage", "--output", help="run storage (default: the nshot cache)")
    args = ap.parse_args()

    bsr = get("bsr")
    cfg = bsr.config(args.preset)
    run = fit("bsr", cfg, scaling=Scaling(workers=args.workers), storage=args.storage,
              name=f"example-bsr-{args.preset}", overwrite=True)  # fmt: skip
    ckpt = load_checkpoint(run.checkpoint, method="bsr")
    print(f"pretrained {cfg.steps} steps: {ckpt.metrics}")
    metrics = bsr.evaluate(ckpt, cfg)
    print("held-out subjects:", {k: round(v, 3) for k, v in metrics.items()})

    predictor = bsr.predictor(ckpt)
    request = predictor.Request.model_validate(predictor.example_request())
    answer = predictor(request)
    print(f"a trial on montage B ({answer.channels_used} channels, {answer.frames} frames):")
    for label, p in sorted(answer.probs.items(), key=lambda kv: -kv[1]):
        print(f"  P({label}) = {p:.3f}")


if __name__ == "__main__":
    main()
