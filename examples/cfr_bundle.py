"""Serve several object classes from one cfr deployment: train one run per class, bundle the
checkpoints into one, and ask the bundle about each class.

    python examples/cfr_bundle.py                          # smoke: bump and ring, seconds
    python examples/cfr_bundle.py --classes bump saddle ring

The same from the command line:

    python -m nshot.methods.cfr.bundle BUNDLE RUNS/bump RUNS/ring
    nshot serve cfr --checkpoint BUNDLE    # the request's class_name (and shot) pick the model
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np

from nshot.method import get
from nshot.methods.cfr.bundle import main as bundle
from nshot.methods.cfr.data import load_class
from nshot.train import Scaling, fit, load_checkpoint
from nshot.train.checkpoint import is_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--classes", nargs="+", default=["bump", "ring"])
    ap.add_argument("--storage", "--output", help="run storage (default: the nshot cache)")
    args = ap.parse_args()

    cfr = get("cfr")
    base = cfr.config("smoke").replace(classes=list(args.classes))
    runs = []
    for name in args.classes:
        cfg = base.replace(class_name=name)
        res = fit("cfr", cfg, scaling=Scaling(workers=0), storage=args.storage,
                  name=f"example-cfr-{name}", overwrite=True)  # fmt: skip
        runs.append(str(res.checkpoint))
    out = Path(runs[0]).parent.parent / f"example-cfr-bundle-{'-'.join(args.classes)}"
    if is_checkpoint(out):  # this example's own bundle from an earlier run
        shutil.rmtree(out)
    if bundle([str(out), *runs]) != 0:
        raise SystemExit(2)

    predictor = cfr.predictor(load_checkpoint(out, method="cfr"))
    for name in args.classes:
        test = load_class(base.replace(class_name=name), name)["test"]
        for what, i in (("normal", int(np.argmin(test.label))),
                        ("anomalous", int(np.argmax(test.label)))):  # fmt: skip
            req = predictor.Request(class_name=name, rgb=test.rgb[i].tolist(),
                                    xyz=test.xyz[i].astype(float).tolist(), return_map=False)  # fmt: skip
            answer = predictor(req)
            print(f"{name} (k={answer.shot}), {what} image: score {answer.image_score:.3f} "
                  f"(threshold hint {answer.threshold_hint:.3f})")  # fmt: skip


if __name__ == "__main__":
    main()
