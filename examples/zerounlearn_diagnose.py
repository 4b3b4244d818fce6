"""Why ZeroUnlearn's edit erases retained facts on a given model: one seed, no Ray.

Runs the pieces of the edit one at a time on the facts of one seed of a preset
(:mod:`nshot.methods.zerounlearn.diagnostics`) and prints and writes:

* per edited layer, the share of the down_proj output energy inside span(Q), the sensitive
  subspace the soft projector shrinks by ε, for the forget facts, the retained facts and
  general text; and the share of the facts' energy along their mean direction;
* Eff / Gen / Spe / PPL after the closed form with no forget request and P = I
  (``statistics_only``: what the general-text statistics alone do), after the projector alone
  (``projector_only``), after the full edit (``zerounlearn``) and after the edit without P
  (``wo_op``), for each remapping learning rate of ``--remap-lr`` and with the paper's
  statistics (uncentred KKT, centred VKT) and the consistent ones (VKT = W·KKT).

Example (SmolLM2-135M, the ``small`` preset's facts, about 10 minutes on 2 CPU cores)::

    python examples/zerounlearn_diagnose.py --preset small --remap-lr 1.0 0.1 \\
        --out methods/zerounlearn/results/diagnose-small.json

``--scan-layers`` only reports, for every layer, how much of the facts' down_proj output energy
lies along their mean direction (forward passes only, seconds): the projector cannot spare the
retained facts where that share is high, so edit layers where it is low (on SmolLM2-135M layers
4–6: 14–25 %, against 37–67 % at the `small` preset's 15–17)::

    python examples/zerounlearn_diagnose.py --preset small --scan-layers

``--set key=value`` takes any :class:`ZeroUnlearnConfig` field (JSON values parsed). The model
runs on the GPU when one is visible (``device=auto``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path


def _print_shared(rows: dict) -> None:
    for layer, row in rows.items():
        print(
            f"layer {layer:3d}: facts' energy along their mean direction "
            f"{row['mean_direction']:.3f}; top dims {row['top_dims']} hold "
            f"{row['top_dims_share']:.3f}"
        )


def _finish(result: dict, t0: float, out: Path | None) -> dict:
    result["seconds"] = time.time() - t0
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1, default=str))
    return result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--remap-lr", type=float, nargs="+", default=None, help="default: the preset's remap_lr"
    )
    ap.add_argument("--out", type=Path, default=None, help="JSON file to write")
    ap.add_argument(
        "--allow-download", action="store_true", help="let a hub model name be downloaded"
    )
    ap.add_argument(
        "--scan-layers",
        action="store_true",
        help="only report, for every layer, the share of the facts' down_proj output energy "
        "along their mean direction (forward passes only), to choose edit layers",
    )
    args = ap.parse_args(argv)

    import torch

    from nshot.method import ConfigError, parse_overrides
    from nshot.methods.zerounlearn import pipeline as pl
    from nshot.methods.zerounlearn.config import ZeroUnlearnConfig
    from nshot.methods.zerounlearn.diagnostics import (
        edit_rows,
        output_values,
        shared_direction,
        subspace_shares,
    )
    from nshot.methods.zerounlearn.evaluation import evaluate_model
    from nshot.nn.lm import LMError

    try:
        overrides = parse_overrides(args.set)
        if args.allow_download:
            overrides["allow_download"] = True
        cfg = ZeroUnlearnConfig.from_preset(args.preset, **overrides)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    t0 = time.time()
    torch.manual_seed(args.seed)
    result: dict = {"config": cfg.model_dump(), "seed": args.seed}
    try:
        if args.scan_layers:  # the model and the facts only: no statistics, no targets
            model, tok = pl.load_model(cfg)
            forget, retain, result["setup"] = pl.split_requests(model, tok, cfg, args.seed)
        else:
            s = pl.setup(cfg, args.seed)
            model, tok, forget, retain, result["setup"] = (
                s.model, s.tok, s.forget, s.retain, s.info,
            )  # fmt: skip
    except (ConfigError, LMError) as e:
        raise SystemExit(f"error: {e}") from None
    print(f"[diagnose] setup {time.time() - t0:.0f}s: {result['setup']}", file=sys.stderr)
    result["forget"] = [r.to_json() for r in forget]
    result["n_retain"] = len(retain)
    if args.scan_layers:
        layers = range(model.config.num_hidden_layers)
        result["layer_scan"] = shared_direction(output_values(model, tok, forget + retain, layers))
        _print_shared(result["layer_scan"])
        return _finish(result, t0, args.out)

    fv = output_values(model, tok, forget, cfg.edit_layers)
    rv = output_values(model, tok, retain, cfg.edit_layers)
    result["shared_direction"] = shared_direction({la: torch.cat([fv[la], rv[la]]) for la in fv})
    _print_shared(result["shared_direction"])
    hp, dhp, rhp = pl.hparams(cfg)
    result["runs"] = []
    for lr in args.remap_lr or [cfg.remap_lr]:
        t1 = time.time()
        prep = pl.prepare(
            model, tok, forget, s.templates, s.stats, hp, dhp, cfg.v_loss_layer,
            dataclasses.replace(rhp, lr=lr),
        )  # fmt: skip
        print(
            f"[diagnose] remap_lr {lr}: targets {time.time() - t1:.0f}s, "
            f"remap NLL {prep.info['remap_final_nll']:.3f}",
            file=sys.stderr,
            flush=True,
        )
        if "subspace_shares" not in result:  # Q does not depend on the remapping lr
            result["subspace_shares"] = subspace_shares(model, s.stats, prep, fv, rv)
            for layer, row in result["subspace_shares"].items():
                print(
                    f"layer {layer}: energy in span(Q) (rank {row['rank']} of {row['dim']}): "
                    f"forget {row['forget']:.3f}, retain {row['retain']:.3f}, "
                    f"general text {row['general']:.3f}"
                )
        for consistent in (False, True):
            rows = edit_rows(s, prep, dataclasses.replace(hp, consistent_stats=consistent))
            for name, row in rows.items():
                result["runs"].append(
                    {"edit": name, "remap_lr": lr, "consistent_stats": consistent, **row}
                )
                print(
                    f"remap_lr={lr:<5g} stats={'consistent' if consistent else 'paper':10s} "
                    f"{name:16s} eff {row['eff']:5.1f} gen {row['gen']:5.1f} "
                    f"spe {row['spe']:5.1f} ppl {row['ppl']:6.1f} "
                    f"neutral {row['neutral_rate']:5.1f}",
                    flush=True,
                )
    result["base"] = evaluate_model(model, tok, s.evalset)
    _finish(result, t0, args.out)
    print(f"base: {result['base']}  ({result['seconds']:.0f}s)")
    return result


if __name__ == "__main__":
    main()
