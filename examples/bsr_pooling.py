"""What does the mean-pooled read-out of BSR's VideoMAE keep? (the bsr method's pooling diagnostic)

    python examples/bsr_pooling.py --out pooling.json        # small: about 5 minutes
    python examples/bsr_pooling.py --preset smoke            # seconds (tests)

The reproduction's classifier (VideoMAE's fine-tuning head) averages the encoder's tokens over time
**and space** before its linear layer. In the motor-imagery task the classes differ in *where*
on the scalp α / β power drops (left hand: over C4, right hand: over C3, feet: at Cz), so an
average over the scalp can cancel the difference a classifier needs, unless the encoder has
written each position's identity into its features. This pre-trains the encoder exactly as the
reproduction's task does (same seed: its held-out ``mae_mse`` equals `small`'s), and on the
reproduction's target subjects, support draws and settings (k per class, montage) fits the
same standardised logistic regression on three read-outs of the frozen encoder's last block,
all tokens visible:

* ``mean``: the mean over every token (what the mean-pooled head sees);
* ``per_position``: the mean over time of each in-head spatial patch's token, concatenated
  (where on the scalp each feature sits is kept);

for the pre-trained encoder and a randomly initialised one (the from-scratch row's start), next
to band power + logistic regression on the same draws (the reproduction's `bandpower_lr`).
It writes the balanced accuracy of each (encoder, read-out) per setting, averaged over subjects
and draws.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch

from nshot.fileio import print_report


def measure(preset: str) -> dict[str, Any]:
    from nshot.methods.bsr.baselines import _lr_scores, bandpower_lr
    from nshot.methods.bsr.config import BsrConfig
    from nshot.methods.bsr.data import load_dataset
    from nshot.methods.bsr.evaluation import subject_clips, support_split
    from nshot.methods.bsr.experiments import _settings
    from nshot.methods.bsr.model import build_classifier, patch_in_head, position_tokens
    from nshot.methods.bsr.train import pretrain

    torch.set_num_threads(1)
    t0 = time.time()
    cfg = BsrConfig.from_preset(preset)
    ds = load_dataset(cfg)
    model, record = pretrain(cfg, ds)  # the reproduction's pretraining task, same seed
    pre_state = {k: v.detach().clone() for k, v in model.videomae.state_dict().items()}
    torch.manual_seed(cfg.seed)
    encoders = {"pretrained": build_classifier(cfg, pre_state).eval(),
                "random": build_classifier(cfg, None).eval()}  # fmt: skip
    head = patch_in_head(cfg)
    subjects = ds.names("target")[: cfg.eval_subjects]
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    scores: dict[str, dict[str, list[float]]] = {}
    for k, montage in _settings(cfg):
        key = f"k{k}_{montage}"
        cell = scores.setdefault(key, {})
        for subject in subjects:
            eeg, labels = ds.subject(subject)
            for seed in seeds:
                sup, qry = support_split(labels, k, seed)
                cell.setdefault("bandpower_lr", []).append(
                    bandpower_lr(cfg, eeg, labels, k, montage, seed)["bacc"]
                )
                videos = subject_clips(cfg, eeg, sup, montage).videos(slice(None))
                for name, clf in encoders.items():
                    with torch.no_grad():
                        h = clf.videomae(pixel_values=videos, output_hidden_states=True)
                    tok = h.hidden_states[-1]  # (n, T'·S, width), time-major
                    feats = {
                        "mean": tok.mean(1),
                        "per_position": position_tokens(cfg, tok, head).flatten(1),
                    }
                    for readout, f in feats.items():
                        res = _lr_scores(f.numpy().astype(np.float64), labels, sup, qry)
                        cell.setdefault(f"{name}_{readout}", []).append(res["bacc"])
    return {
        "preset": preset,
        "mae_mse": record["mae_mse"],
        "subjects": len(subjects),
        "draws": len(seeds),
        "in_head_patches": int(head.sum()),
        "bacc": {s: {r: float(np.mean(v)) for r, v in cell.items()} for s, cell in scores.items()},
        "seconds": time.time() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small", help="the bsr preset (smoke, small)")
    ap.add_argument("--out", default=None, help="write the report here (JSON)")
    args = ap.parse_args()
    report = measure(args.preset)
    print_report(report, args.out)


if __name__ == "__main__":
    main()
