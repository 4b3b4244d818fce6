"""Bundle several cfr checkpoints into one, so that one deployment serves every (class, k):

    python -m nshot.methods.cfr.bundle OUT RUN_OR_CHECKPOINT [RUN_OR_CHECKPOINT ...]
    nshot serve cfr --checkpoint OUT

Each input is a run directory (its newest checkpoint) or a checkpoint, verified as ``nshot
serve`` verifies one; a bundle given as input contributes its models. The models must have
their memory banks (a checkpoint from stage 1 is refused), one per (class, k), and share the
extractors and the image size (the fields of ``BUNDLE_SHARED``). ``OUT`` must not exist. The
bundle is a checkpoint like any other (safetensors + JSON): ``nshot eval cfr --checkpoint OUT``
evaluates each model on its class (metrics ``<class>.k<k>.<metric>``).
"""

from __future__ import annotations

import argparse
import sys

from nshot.errors import NshotError
from nshot.train.checkpoint import load_checkpoint

from .model import bundle_entries, class_of, write_bundle


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nshot.methods.cfr.bundle", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("out", help="the bundle's checkpoint directory (must not exist)")
    ap.add_argument("checkpoints", nargs="+", help="cfr run directories or checkpoints")
    args = ap.parse_args(argv)
    try:
        ckpts = [load_checkpoint(p, method="cfr") for p in args.checkpoints]
        path = write_bundle(ckpts, args.out)
        # read back as a deployment will: verified files, checked entries
        entries = bundle_entries(load_checkpoint(path, method="cfr").extra, str(path))
    except NshotError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path}: {len(entries)} models")
    for c, run, step in entries:
        print(f"  {class_of(c, run)} k={c.shot} ({c.system}, step {step})")
    print(f"serve them with: nshot serve cfr --checkpoint {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
