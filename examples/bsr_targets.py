"""How much of BSR's masked-reconstruction target is predictable at all? (the bsr method's
target diagnostic)

    python examples/bsr_targets.py --out targets.json        # small (the cached EEG)
    python examples/bsr_targets.py --preset smoke            # seconds (tests)

BSR pre-trains VideoMAE to reconstruct masked tubelets of the spectrum videos, scored against
per-tubelet normalised targets (VideoMAE's ``norm_pix_loss``). Its held-out MSE is compared with
the position-mean predictor's (each masked token gets its position's mean target over the
training clips). This measures, on the source subjects' clips (montage A) and the in-head
tubelets:

* ``target_power``: the mean squared normalised target on the held-out clips (what predicting
  0 scores);
* ``position_mean_mse``: the position-mean predictor's MSE on the held-out clips;
* ``clip_mean_oracle_mse``: the MSE of an oracle that knows each held-out clip's own
  time-averaged target at each position, the part of the target that does not change from frame
  to frame: the MSE left over is the frame-to-frame variation, which no predictor that reads a
  clip's other frames' average can recover;
* ``adjacent_frame_corr``: the correlation of adjacent frames' band-power deviations from their
  clip's mean (over clips, electrodes and bands): how much one 0.5 s frame says about the next.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from nshot.fileio import print_report


def measure(preset: str) -> dict:
    from nshot.methods.bsr.config import BsrConfig
    from nshot.methods.bsr.data import load_dataset
    from nshot.methods.bsr.model import normalised_targets, patch_in_head
    from nshot.methods.bsr.train import source_clips, split_clips

    cfg = BsrConfig.from_preset(preset)
    clips, _, _ = source_clips(cfg, load_dataset(cfg))
    n = len(clips.powers)
    train, val = split_clips(cfg, n)
    with torch.no_grad():
        y = normalised_targets(cfg, clips.videos(np.arange(n)))  # (N, T'·S, D)
    t = cfg.frames // cfg.tubelet
    head = patch_in_head(cfg)
    y = y.view(n, t, len(head), -1)[:, :, head]  # (N, T', in-head S, D)
    pos_mean = y[train].mean(0)
    yv = y[val]
    dev = clips.powers - clips.powers.mean(1, keepdims=True)  # (N, frames, bands, electrodes)
    corr = np.corrcoef(dev[:, :-1].ravel(), dev[:, 1:].ravel())[0, 1]
    return {
        "preset": preset,
        "clips": {"train": len(train), "val": len(val)},
        "target_power": float((yv**2).mean()),
        "position_mean_mse": float(((yv - pos_mean) ** 2).mean()),
        "clip_mean_oracle_mse": float(((yv - yv.mean(1, keepdim=True)) ** 2).mean()),
        "adjacent_frame_corr": float(corr),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--out", default=None, help="write the report here (JSON)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    report = measure(args.preset)
    print_report(report, args.out)


if __name__ == "__main__":
    main()
