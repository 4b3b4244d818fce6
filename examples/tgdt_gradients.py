"""Which of TG-DT's three losses trains its text encoder? (the tgdt method's gradient diagnostic)

    python examples/tgdt_gradients.py                        # small: at init and after 200 steps
    python examples/tgdt_gradients.py --preset smoke --steps 5 --batches 2 --out g.json

TG-DT (paper §3) adds its two alignment losses to the decision transformer's at unit weight:
L = L_DT + L_TBC + L_TBM. This measures, on ``--batches`` training batches (the same draws as
the training loop's first steps), the norm of each loss's gradient on the text encoder and on
the decoder blocks, and the cosine between the L_DT and L_TBC gradients: once at
initialisation and once after ``--steps`` steps of ``fit`` (the method's own training, seed 0).
The model is in eval mode while measuring (no dropout), so the figures are deterministic.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from nshot.fileio import print_report


def measure(cfg, data, model, batches: int) -> dict:  # noqa: ANN001
    from nshot.methods.tgdt.train import Sampler, align_terms, dt_loss

    model.eval()
    sampler = Sampler(cfg, data)
    groups = {"text_encoder": list(model.text.parameters()),
              "decoder_blocks": list(model.blocks.parameters())}  # fmt: skip
    acc: dict[str, dict[str, list[float]]] = {
        g: {k: [] for k in ("dt", "tbc", "tbm", "cos_dt_tbc")} for g in groups
    }
    for step in range(1, batches + 1):
        rng = np.random.default_rng([cfg.seed, step, 0, 3])
        gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
        dt, align = sampler.step_batch(rng, align=True)
        text = model.encode_text(dt.texts, dt.text_index)
        losses = {"dt": dt_loss(model.act(dt.window, text), dt.target, dt.window.valid)}
        terms = align_terms(model, align, text, gen)
        losses |= {"tbc": terms["tbc"], "tbm": terms["tbm"]}
        for g, params in groups.items():
            vec = {}
            for k, loss in losses.items():
                grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
                vec[k] = torch.cat([(x if x is not None else torch.zeros_like(p)).flatten()
                                    for x, p in zip(grads, params, strict=True)])  # fmt: skip
                acc[g][k].append(float(vec[k].norm()))
            cos = torch.nn.functional.cosine_similarity(vec["dt"], vec["tbc"], dim=0)
            acc[g]["cos_dt_tbc"].append(float(cos))
    return {g: {k: round(float(np.mean(v)), 5) for k, v in d.items()} for g, d in acc.items()}


def main() -> None:
    from nshot.methods.tgdt.config import TGDTConfig
    from nshot.methods.tgdt.data import load_data
    from nshot.methods.tgdt.train import build_model, fit

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=200, help="training steps before the second")
    ap.add_argument("--batches", type=int, default=5, help="batches averaged per measurement")
    ap.add_argument("--out", default=None, help="write the report here (JSON)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = TGDTConfig.from_preset(args.preset, seed=0, system="tgdt")
    data = load_data(cfg)
    torch.manual_seed(cfg.seed)
    report = {"preset": args.preset, "batches": args.batches,
              "init": measure(cfg, data, build_model(cfg, data), args.batches)}  # fmt: skip
    trained = fit(cfg.replace(steps=args.steps), data)
    report[f"after_{args.steps}_steps"] = measure(cfg, data, trained, args.batches)
    print_report(report, args.out)


if __name__ == "__main__":
    main()
