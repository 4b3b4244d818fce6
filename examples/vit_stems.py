"""Why the tiny CLIP's image tower has a convolutional stem: a supervised shape probe.

    python examples/vit_stems.py                    # 300 steps per stem, about 3.5 minutes
    python examples/vit_stems.py --steps 40 --images 1000 --test-images 200   # seconds

Trains the ``small`` tiny CLIP's ViT (width 64 × 4 blocks, 64 tokens of 32² RGB) as a plain
8-way shape classifier on :mod:`nshot.data.shapes`, once with timm's patch embedding
(``stem="patch"``, one 4×4 stride-4 convolution) and once with the convolutional stem of
:class:`nshot.nn.vit.ViT` (``stem="conv"``), same data order, optimiser and schedule (AdamW,
linear warm-up, cosine decay), and prints the held-out shape accuracy every ``--every`` steps.
Writes ``--output`` (default ``vit_stems.json``).

Measured (this script's defaults, seed 0, one thread): held-out shape accuracy after 300 steps
**0.19 with the patch embedding** (chance 0.125; 0.16 / 0.20 / 0.19 at 100 / 200 / 300 steps)
**and 0.64 with the convolutional stem** (0.30 / 0.56 / 0.64). The patch-embedding ViT learns
colour, size and background first and shape late; that is why ``small`` pre-training with the
patch embedding reached only 0.771 zero-shot shape accuracy in 1,500 steps, and 0.998 with the
stem (recipe version 6, :mod:`nshot.train.clip`).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from nshot.data.shapes import shapes_arrays, shapes_table
from nshot.nn.vit import STEMS, ViT


def probe(stem: str, args: argparse.Namespace) -> list[dict]:
    x, y = shapes_arrays(shapes_table(args.images, seed=args.seed, split="train"))
    xt, yt = shapes_arrays(shapes_table(args.test_images, seed=args.seed + 1, split="test"))
    x, xt = (torch.from_numpy(x) - 0.5) / 0.25, (torch.from_numpy(xt) - 0.5) / 0.25
    y, yt = torch.from_numpy(y), torch.from_numpy(yt)
    torch.manual_seed(args.seed)
    model = ViT(
        img_size=32, patch=4, in_chans=3, num_classes=8, width=64, depth=4, heads=4, stem=stem
    )
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05, betas=(0.9, 0.98))
    order = torch.Generator().manual_seed(args.seed)
    warm, rows, t0 = max(1, args.steps // 8), [], time.perf_counter()
    for step in range(args.steps):
        frac = (step - warm) / max(1, args.steps - warm)
        lr = args.lr * ((step + 1) / warm if step < warm else 0.5 * (1 + math.cos(math.pi * frac)))
        for group in opt.param_groups:
            group["lr"] = lr
        idx = torch.randint(0, len(x), (args.batch,), generator=order)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % args.every == 0 or step + 1 == args.steps:
            model.eval()
            with torch.no_grad():
                acc = (model(xt).argmax(1) == yt).float().mean().item()
            model.train()
            rows.append(
                {
                    "step": step + 1,
                    "loss": round(loss.item(), 4),
                    "acc": round(acc, 4),
                    "seconds": round(time.perf_counter() - t0, 1),
                }
            )
            print(
                f"{stem:5s} step {step + 1:4d}  loss {loss.item():.3f}  held-out shape acc "
                f"{acc:.3f}",
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--images", type=int, default=20_000)
    ap.add_argument("--test-images", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", default="vit_stems.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = {"args": vars(args), "results": {stem: probe(stem, args) for stem in STEMS}}
    final = {stem: rows[-1]["acc"] for stem, rows in out["results"].items()}
    print("held-out shape accuracy at the last step:", final)
    Path(args.output).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
