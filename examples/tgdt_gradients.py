"""Which of TG-DT's three losses trains its text encoder? (the tgdt method's gradient diagnostic)

    python examples/tgdt_gradients.py                        # small: at init and after 200 steps
    python examples/tgdt_gradients.py --preset smoke --steps 5 --batches 2 --out g.json
    python examples/tgdt_gradients.py --first-small   # the first small: 45 goals, unit weights

TG-DT (paper §3) adds its two alignment losses to the decision transformer's at unit weight:
L = L_DT + L_TBC + L_TBM. This measures, on ``--batches`` training batches (the same draws as
the training loop's first steps), the norm of each loss's gradient on the text encoder and on
the decoder blocks, and the cosine between the L_DT and L_TBC gradients: once at
initialisation and once after ``--steps`` steps of ``fit`` (the method's own training, seed 0).
The model is in eval mode while measuring (no dropout), so the figures are deterministic
(``nshot.methods.tgdt.train.gradient_norms``, the measurement ``loss_balance=text_grad`` sets
the weights from). The training between the two measurements uses the preset's loss weights.
"""

from __future__ import annotations

import argparse

import torch

from nshot.fileio import print_report


def measure(cfg, data, model, batches: int) -> dict:  # noqa: ANN001
    from nshot.methods.tgdt.train import gradient_norms

    norms = gradient_norms(model, cfg, data, batches)
    return {g: {k: round(v, 5) for k, v in d.items()} for g, d in norms.items()}


def main() -> None:
    from nshot.methods.tgdt.config import TGDTConfig
    from nshot.methods.tgdt.data import load_data
    from nshot.methods.tgdt.train import build_model, fit

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=200, help="training steps before the second")
    ap.add_argument("--batches", type=int, default=5, help="batches averaged per measurement")
    ap.add_argument("--out", default=None, help="write the report here (JSON)")
    ap.add_argument("--first-small", action="store_true",
                    help="the first small's data and weights (45 / 5 goals, unit weights)")  # fmt: skip
    args = ap.parse_args()
    torch.set_num_threads(1)
    first = {"n_train_tasks": 45, "n_test_tasks": 5, "loss_balance": "unit"}
    cfg = TGDTConfig.from_preset(args.preset, seed=0, system="tgdt",
                                 **(first if args.first_small else {}))  # fmt: skip
    data = load_data(cfg)
    torch.manual_seed(cfg.seed)
    report = {"preset": args.preset, "batches": args.batches,
              "init": measure(cfg, data, build_model(cfg, data), args.batches)}  # fmt: skip
    trained = fit(cfg.replace(steps=args.steps), data)
    report[f"after_{args.steps}_steps"] = measure(cfg, data, trained, args.batches)
    print_report(report, args.out)


if __name__ == "__main__":
    main()
