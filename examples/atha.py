"""Pre-train nshot's tiny CLIP, adapt it to few-shot episodes of shifted domains with ATHA
(CoOp + LoRA with the tail-head token update), and classify one episode given as a request.

    python examples/atha.py                    # smoke preset (word text tower): seconds
    python examples/atha.py --preset small     # the MiniLM tiny CLIP: ~10 minutes the first time
    python examples/atha.py --workers 2 --set steps=20 --set 'domains=["digits"]'

It trains (or resumes) the tiny CLIP with `nshot.train.fit`, prints ATHA's and CoOp + LoRA's
1-shot accuracy on the same episodes of each target domain, then sends the predictor one
episode (two shapes, one image each) and prints the labels, probabilities and the learned
rates rho+ / rho- per block. ``--set key=value`` overrides a field of the preset (as
`nshot train --set` does). The full comparison is `nshot reproduce atha --preset small`.
"""

from __future__ import annotations

import argparse

from nshot.method import get, parse_overrides
from nshot.train import Scaling, fit, load_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smoke")
    ap.add_argument("--workers", type=int, default=0, help="Ray Train workers (0: in-process)")
    ap.add_argument("--storage", "--output", help="run storage (default: the nshot cache)")
    ap.add_argument("--set", action="append", default=[], help="key=value config override")
    args = ap.parse_args()

    atha = get("atha")
    cfg = atha.config(args.preset, **parse_overrides(args.set))
    run = fit("atha", cfg, scaling=Scaling(workers=args.workers), storage=args.storage,
              name=f"example-atha-{args.preset}", overwrite=True)  # fmt: skip
    ckpt = load_checkpoint(run.checkpoint, method="atha")
    print(f"tiny CLIP {cfg.clip_preset}/{cfg.text}: {ckpt.metrics}")
    metrics = atha.evaluate(ckpt, cfg)
    print(f"episodes (1-shot): {', '.join(f'{k}={v:.3f}' for k, v in metrics.items())}")

    predictor = atha.predictor(ckpt)
    request = predictor.Request.model_validate(predictor.example_request())
    answer = predictor(request)
    for i, (label, probs) in enumerate(zip(answer.labels, answer.probs)):
        print(f"query {i} -> {label} {dict(zip(request.class_names, probs))}")
    print(f"rates after {answer.epochs_run} epochs: {answer.rates.model_dump()}")


if __name__ == "__main__":
    main()
