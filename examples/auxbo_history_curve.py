"""Does aux-BO's history pay off on your own sweeps? The history curve, on any nshot method.

Runs ``nshot reproduce auxbo --set experiment=history_curve`` from Python: earlier sweeps of the
method (random search, saved to a history of the run's own), an aux-BO surrogate meta-trained on
the first k of them, then new tasks swept by random search, TPE, the GP (aux-BO with no history)
and aux-BO with each history; it prints the best objective after 5 / 10 / 20 trials.

    python examples/auxbo_history_curve.py                      # TAIL, the committed settings (~25 min)
    python examples/auxbo_history_curve.py --quick              # 3 history sweeps, 2 tasks (~3 min)
    python examples/auxbo_history_curve.py --method timemode --vary '{"data_seed": [0, 1, 2, 3]}'

The committed run (``methods/auxbo/results/small-history_curve.md``) is the default command.
"""

from __future__ import annotations

import argparse
import json
import tempfile

TAIL_SET = {"steps": 150, "log_every": 10, "checkpoint_every": 150, "torch_threads": 1}
TAIL_VARY = {"max_ways": [2, 3, 4, 5], "max_shots": [1, 2, 3], "train_tasks": ["A", "A+mixed"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", default="tail", help="the swept method (its TuneSpec)")
    ap.add_argument("--preset", default="smoke", help="the swept method's preset")
    ap.add_argument("--set", default=None, help="JSON fields set on every swept config")
    ap.add_argument("--vary", default=None, help="JSON {field: [values]} that tasks draw from")
    ap.add_argument("--out", default=None, help="results folder (default: a temporary one)")
    ap.add_argument("--quick", action="store_true", help="3 history sweeps, 2 tasks, 10 trials")
    args = ap.parse_args()

    from nshot.method import get
    from nshot.reproduce import run

    is_tail = args.method == "tail"
    fields = dict(
        experiment="history_curve",
        history_method=args.method,
        curve_preset=args.preset,
        curve_set=json.loads(args.set) if args.set else (TAIL_SET if is_tail else {}),
        curve_vary=json.loads(args.vary) if args.vary else (TAIL_VARY if is_tail else {}),
    )
    if args.quick:
        fields.update(curve_history=[3], curve_tasks=2, curve_trials=10, curve_history_trials=10)
        fields.update(curve_surrogate_steps=200)
    cfg = get("auxbo").config("small", **fields)
    out = args.out or tempfile.mkdtemp(prefix="nshot-history-curve-")
    data = run("auxbo", cfg, out)
    ks = [m.split("_")[-1] for m in data["metrics"] if m.startswith("norm_at_")]
    print(f"\nnormalised best after {' / '.join(ks)} trials (mean over held-out tasks):")
    for system, row in data["rows"].items():
        vals = "  ".join(f"{row[f'norm_at_{k}']:.3f}" for k in ks)
        print(f"  {system:12s} {vals}")
    for line in data["notes"]:
        print(f"- {line}")
    print(f"results: {out}/results.md, curve: {out}/history_curve.png")


if __name__ == "__main__":
    main()
