"""Fine-tune a tiny CLIP's image tower with UCAT, measure it under attack and classify digits
zero-shot with Dirichlet uncertainty.

    python examples/dirclip.py                       # smoke preset: seconds
    python examples/dirclip.py --preset small        # the reproduction's recipe: a few minutes
    python examples/dirclip.py --loss tecoa          # the main baseline instead

It trains one row (UCAT by default) under Ray Train, prints clean, PGD and APGD-CE accuracy,
ECE and the entropy ratio on the test digits, then sends two images with a label set of four
digit names to the predictor and prints each answer with its uncertainty (AU, EU). The
comparison with every baseline is `nshot reproduce dirclip --preset small`.
"""

from __future__ import annotations

import argparse

from nshot.method import get
from nshot.train import Scaling, fit, load_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smoke")
    ap.add_argument("--loss", default="ucat", help="ucat, tecoa, fare, forward_kl, prob_kl")
    ap.add_argument("--workers", type=int, default=0, help="Ray Train workers (0: in-process)")
    ap.add_argument("--storage", "--output", help="run storage (default: the nshot cache)")
    args = ap.parse_args()

    dirclip = get("dirclip")
    cfg = dirclip.config(args.preset, loss=args.loss)
    run = fit("dirclip", cfg, scaling=Scaling(workers=args.workers), storage=args.storage,
              name=f"example-dirclip-{args.preset}", overwrite=True)  # fmt: skip
    ckpt = load_checkpoint(run.checkpoint, method="dirclip")
    print(f"trained {cfg.loss} (λ = {cfg.lam:.3g}); selected step {ckpt.extra['selected']}")
    metrics = dirclip.evaluate(ckpt, cfg)
    keys = ("clean", "pgd", "apgd", "ece_clean", "ece_adv", "ent_ratio", "clean_rolled")
    print("test digits:", {k: round(metrics[k], 3) for k in keys if k in metrics})

    predictor = dirclip.predictor(ckpt)
    request = predictor.Request.model_validate(predictor.example_request())
    for i, p in enumerate(predictor(request).predictions):
        top = max(p.probs.values())
        u = p.uncertainty
        print(f"  image {i}: {p.label} (p = {top:.3f}); uncertainty AU {u.au:.3f}, "
              f"EU {u.eu:.3g}, entropy {u.entropy:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
