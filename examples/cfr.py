"""Train CFR for one object class and score a normal and an anomalous test image.

    python examples/cfr.py                   # smoke preset: seconds
    python examples/cfr.py --preset small    # one class of generator version 2 (bagel), k = 4

It trains the cyclic mappings, builds the memory banks and trains the retriever (one Ray Train
run), prints the class's test metrics, then sends a normal and an anomalous test image (RGB +
organised xyz) to the predictor. The comparison with every baseline is
`nshot reproduce cfr --preset small`.
"""

from __future__ import annotations

import argparse

import numpy as np

from nshot.method import get
from nshot.methods.cfr.data import load_class
from nshot.train import Scaling, fit, load_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smoke")
    ap.add_argument("--class-name", default=None, help="default: the preset's class")
    ap.add_argument("--workers", type=int, default=0, help="Ray Train workers (0: in-process)")
    ap.add_argument("--storage", "--output", help="run storage (default: the nshot cache)")
    args = ap.parse_args()

    cfr = get("cfr")
    cfg = cfr.config(args.preset)
    if args.class_name is not None:
        classes = list(dict.fromkeys([*cfg.classes, args.class_name]))
        cfg = cfg.replace(class_name=args.class_name, classes=classes)
    res = fit("cfr", cfg, scaling=Scaling(workers=args.workers), storage=args.storage,
              name=f"example-cfr-{args.preset}", overwrite=True)  # fmt: skip
    ckpt = load_checkpoint(res.checkpoint, method="cfr")
    metrics = cfr.evaluate(ckpt, cfg)
    print("test metrics:", {k: round(v, 3) for k, v in metrics.items()})

    predictor = cfr.predictor(ckpt)
    test = load_class(cfg, cfg.class_name)["test"]
    for what, i in (("normal image", int(np.argmin(test.label))),
                    ("anomalous image", int(np.argmax(test.label)))):  # fmt: skip
        req = predictor.Request(class_name=cfg.class_name, rgb=test.rgb[i].tolist(),
                                xyz=test.xyz[i].astype(float).tolist(), return_map=False)  # fmt: skip
        answer = predictor(req)
        print(f"{what} ({test.defect[i]}): score {answer.image_score:.3f} "
              f"(threshold hint {answer.threshold_hint:.3f}), "
              f"{answer.replaced_fraction:.1%} of valid pixels replaced")  # fmt: skip


if __name__ == "__main__":
    main()
