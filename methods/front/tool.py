"""``python -m nshot.methods.front.tool``: extract a learngene, initialise a descendant from it.

::

    # the learngene {C, μ, σ} of a trained ancestry (safetensors + JSON, no pickle)
    python -m nshot.methods.front.tool extract --checkpoint ANCESTRY --out gene/ --keep-ratio 0.5
    # a descendant ViT of any depth/width, initialised training-free, as an nshot checkpoint
    python -m nshot.methods.front.tool init --learngene gene/ --depth 4 --width 48 --out desc/
    # then train it like any descendant
    nshot train front --set learngene_path=gene/ --set depth=4 --set width=48 --set heads=4

A target the learngene cannot be mapped onto (a block group or a non-block parameter the
ancestry lacks, a different rank) is refused with the parameter's name; nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from nshot.errors import NshotError
from nshot.nn.vit import ViT
from nshot.train.checkpoint import load_checkpoint, save_checkpoint

from .config import VERSION
from .learngene import Learngene, TransferError, extract, front_init
from .model import load_model


def extract_learngene(checkpoint: str, out: str, keep_ratio: float, mlp_dct_dim: str) -> Path:
    ckpt = load_checkpoint(checkpoint, method="front")
    model = load_model(ckpt)
    source = {**model.shape(), "ancestry_id": ckpt.extra.get("ancestry_id", str(ckpt.path))}
    gene = extract(model, keep_ratio=keep_ratio, mlp_dct_dim=mlp_dct_dim, source=source)
    return gene.save(out)


def init_descendant(
    learngene: str | Path,
    *,
    depth: int,
    width: int,
    heads: int,
    img_size: int = 8,
    classes: int = 10,
    fill: str = "zero",
    use_ratio: bool = False,
    depth_fix: bool = False,
    seed: int = 0,
) -> tuple[ViT, dict]:
    """A ViT of the given shape, initialised from the learngene folder."""
    gene = Learngene.load(learngene)
    src = gene.source
    torch.manual_seed(seed)
    model = ViT(
        img_size=img_size, patch=int(src.get("patch", 2)), in_chans=int(src.get("in_chans", 1)),
        num_classes=classes, width=width, depth=depth, heads=heads,
        mlp_ratio=float(src.get("mlp_ratio", 4.0)),
    )  # fmt: skip
    report = front_init(model, gene, fill=fill, use_ratio=use_ratio, depth_fix=depth_fix, seed=seed)
    return model, {**report, "ancestry_id": src.get("ancestry_id")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nshot.methods.front.tool", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("extract", help="the learngene of a front ancestry checkpoint")
    e.add_argument("--checkpoint", required=True, help="an nshot front ancestry checkpoint")
    e.add_argument("--out", required=True, help="folder for learngene.{safetensors,json}")
    e.add_argument("--keep-ratio", type=float, default=1.0)
    e.add_argument("--mlp-dct-dim", choices=("2d", "1d"), default="2d")
    i = sub.add_parser("init", help="a descendant initialised from a learngene")
    i.add_argument("--learngene", required=True)
    i.add_argument("--out", required=True, help="where the nshot checkpoint is written")
    i.add_argument("--depth", type=int, required=True)
    i.add_argument("--width", type=int, required=True)
    i.add_argument("--heads", type=int, default=4)
    i.add_argument("--img-size", type=int, default=8)
    i.add_argument("--classes", type=int, default=10)
    i.add_argument("--fill", choices=("zero", "random", "consistence", "repeat"), default="zero")
    i.add_argument("--use-ratio", action="store_true")
    i.add_argument("--depth-fix", action="store_true")
    i.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        if args.command == "extract":
            if not 0.0 < args.keep_ratio <= 1.0:
                raise NshotError(f"--keep-ratio: must lie in (0, 1], got {args.keep_ratio}")
            out = extract_learngene(args.checkpoint, args.out, args.keep_ratio, args.mlp_dct_dim)
            print(f"wrote the learngene to {out}")
            return 0
        model, report = init_descendant(
            args.learngene, depth=args.depth, width=args.width, heads=args.heads,
            img_size=args.img_size, classes=args.classes, fill=args.fill,
            use_ratio=args.use_ratio, depth_fix=args.depth_fix, seed=args.seed,
        )  # fmt: skip
        save_checkpoint(
            args.out, method="front", method_version=VERSION, config={}, step=0,
            model_state=model.state_dict(),
            extra={"stage": "descendant", "shape": model.shape(), "init": "front",
                   "fill": args.fill, "depth_fix": args.depth_fix, "use_ratio": args.use_ratio,
                   "ancestry_id": report["ancestry_id"],
                   "transferred": len(report["transferred"]),
                   "skipped": [str(s) for s in report["skipped"]]},
        )  # fmt: skip
        print(f"wrote a depth-{args.depth} width-{args.width} descendant to {args.out} "
              f"({len(report['transferred'])} parameters transferred)")  # fmt: skip
        return 0
    except (NshotError, TransferError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
