"""Do the generated windows vary in level and spread where the real ones do not? (the timemode
method's disc diagnostic)

    python examples/timemode_spread.py --out spread.json      # small: about 8 minutes
    python examples/timemode_spread.py --preset smoke         # seconds (tests)

ItalyPowerDemand is z-normalised per series by the UCR archive, so after the few-shot scaler
every real window has the same level (mean) and the same spread (standard deviation). A
generator whose windows vary in level or spread can be told apart by the discriminator for that
alone, while fid_feat (a Fréchet distance of summary features) barely sees it. This trains the
`timemode` row (pre-training, then fine-tuning) and the `from_scratch` row exactly as the
reproduction does (same jobs and seeds, so their ``disc`` and ``fid_feat`` are `small`'s) and
measures, for the real reference windows, the few-shot windows and each row's samples:

* ``level_sd``: the standard deviation over windows of each window's mean;
* ``scale_rel_sd``: the standard deviation over windows of each window's standard deviation,
  relative to its mean;

then scores each row's samples again after **re-standardising every window** to the real
windows' common level and spread (the same discriminators and seeds), so that what is left is
shape alone. The change of the gap ``timemode − from_scratch`` in disc says how much of it level
and spread make.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from nshot.fileio import print_report


def spread(x: np.ndarray) -> dict[str, float]:
    """Level and spread statistics of windows ``x`` (n, L, C), over windows and channels."""
    level = x.mean(axis=1)
    scale = x.std(axis=1)
    return {
        "level_sd": float(level.std(axis=0).mean()),
        "scale_rel_sd": float((scale.std(axis=0) / scale.mean(axis=0)).mean()),
    }


def restandardise(x: np.ndarray, level: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Every window of ``x`` moved to mean ``level`` and standard deviation ``scale`` per
    channel (a constant window keeps its level)."""
    mu, sd = x.mean(axis=1, keepdims=True), x.std(axis=1, keepdims=True)
    return (x - mu) / np.where(sd > 0, sd, 1.0) * scale + level


def measure(preset: str, seeds: int) -> dict[str, Any]:
    import torch

    from nshot.method import get
    from nshot.methods.timemode.data import load_target
    from nshot.methods.timemode.experiments import _pretrain_job, _score, _tensors, _tuned

    torch.set_num_threads(1)
    cfg = get("timemode").config(preset)
    base = cfg.model_dump()
    weights = _pretrain_job(base, "timemode", cfg.corpus)["weights"]
    tcfg = cfg.replace(system="timemode", stage="pretrain")
    out: dict[str, Any] = {"preset": preset, "seeds": {}}
    for seed in range(cfg.seed, cfg.seed + seeds):
        target = load_target(tcfg, tcfg.n_shot, seed)
        real = target.scaler.scale(target.reference)
        shots = target.scaler.scale(target.shots)
        level = real.mean(axis=1).mean(axis=0)
        scale = real.std(axis=1).mean(axis=0)
        fakes = {
            "timemode": _tuned(tcfg, "finetune", tcfg.target, tcfg.n_shot, seed,
                               _tensors(weights), "timemode"),
            "from_scratch": _tuned(tcfg, "scratch", tcfg.target, tcfg.n_shot, seed, None,
                                   "timemode"),
        }  # fmt: skip
        row: dict[str, Any] = {"real_reference": spread(real), "real_shots": spread(shots)}
        for name, (fake, scores) in fakes.items():
            again = _score(tcfg, restandardise(fake, level, scale), real, seed)
            row[name] = {
                **spread(fake),
                "disc": scores["disc"],
                "fid_feat": scores["fid_feat"],
                "disc_restandardised": again["disc"],
                "fid_feat_restandardised": again["fid_feat"],
            }
        out["seeds"][str(seed)] = row
    rows = list(out["seeds"].values())

    def mean(name: str, key: str) -> float:
        return float(np.mean([r[name][key] for r in rows]))

    out["mean"] = {
        name: {k: mean(name, k) for k in rows[0][name]}
        for name in ("real_reference", "real_shots", "timemode", "from_scratch")
    }
    out["disc_gap_timemode_minus_scratch"] = {
        "as_generated": mean("timemode", "disc") - mean("from_scratch", "disc"),
        "restandardised": mean("timemode", "disc_restandardised")
        - mean("from_scratch", "disc_restandardised"),
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small", help="the timemode preset (smoke, small)")
    ap.add_argument("--seeds", type=int, default=3, help="fine-tuning seeds (small's 3)")
    ap.add_argument("--out", default=None, help="write the report here (JSON)")
    args = ap.parse_args()
    report = measure(args.preset, args.seeds)
    print_report(report, args.out)


if __name__ == "__main__":
    main()
