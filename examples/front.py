"""Train an ancestry ViT once, then grow descendants of other depths from its DCT learngene.

    python examples/front.py                   # smoke preset: seconds
    python examples/front.py --preset small    # the small preset: about two minutes on 2 cores

It trains the ancestry (stage=ancestry), extracts its learngene (safetensors + JSON), builds
depth-2 descendants by FRONT and by random init, prints their test accuracy before any training,
trains the FRONT one and classifies a few test digits with its predictor. The comparison with
every baseline is `nshot reproduce front --preset small`.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from nshot.method import get
from nshot.methods.front.data import load_split
from nshot.methods.front.tool import extract_learngene, init_descendant
from nshot.methods.front.train import accuracy
from nshot.nn.vit import ViT
from nshot.train import Scaling, fit, load_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smoke")
    ap.add_argument("--workers", type=int, default=0, help="Ray Train workers (0: in-process)")
    ap.add_argument("--storage", "--output", help="run storage (default: the nshot cache)")
    args = ap.parse_args()

    front = get("front")
    anc_cfg = front.config(args.preset, stage="ancestry")
    ancestry = fit("front", anc_cfg, scaling=Scaling(workers=0), storage=args.storage,
                   name=f"example-front-ancestry-{args.preset}", overwrite=True)  # fmt: skip
    print("ancestry:", front.evaluate(load_checkpoint(ancestry.checkpoint, method="front"),
                                      anc_cfg))  # fmt: skip

    gene = Path(tempfile.mkdtemp(prefix="front-gene-"))
    extract_learngene(str(ancestry.checkpoint), str(gene), keep_ratio=1.0, mlp_dct_dim="2d")
    print(f"learngene: {sorted(p.name for p in gene.iterdir())} in {gene}")

    test = load_split("test", anc_cfg.seed)
    shape = {"depth": 2, "width": anc_cfg.anc_width, "heads": anc_cfg.anc_heads}
    grown, report = init_descendant(gene, **shape)
    torch.manual_seed(1)
    random_init = ViT(img_size=8, patch=anc_cfg.patch, num_classes=10, **shape)
    print(f"depth-2 descendant before training: FRONT {accuracy(grown, test):.3f}, "
          f"random init {accuracy(random_init, test):.3f} "
          f"({len(report['transferred'])} parameters transferred)")  # fmt: skip

    cfg = front.config(args.preset, learngene_path=str(gene), **shape)
    desc = fit("front", cfg, scaling=Scaling(workers=args.workers), storage=args.storage,
               name=f"example-front-descendant-{args.preset}", overwrite=True)  # fmt: skip
    ckpt = load_checkpoint(desc.checkpoint, method="front")
    print("trained descendant:", front.evaluate(ckpt, cfg))
    predictor = front.predictor(ckpt)
    answer = predictor(predictor.Request(images=test.x[:8].flatten(1).tolist()))
    print("predicted:", answer.labels, "true:", test.y[:8].tolist())


if __name__ == "__main__":
    main()
