"""Train TAIL through the Python API, evaluate it, and classify real digits with it.

    python examples/tail_api.py --preset smoke     # seconds
    python examples/tail_api.py --preset small     # a few minutes on 2 cores

The same run from the command line: `nshot train tail --preset small`, then
`nshot eval tail --checkpoint ~/.cache/nshot/runs/tail-small`.
"""

from __future__ import annotations

import argparse

import numpy as np

from nshot.data import digits_table, table_to_numpy
from nshot.method import get
from nshot.train import Scaling, fit, load_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smoke")
    ap.add_argument("--workers", type=int, default=0, help="Ray Train workers (0: in-process)")
    ap.add_argument("--output", default=None)
    args = ap.parse_args()

    tail = get("tail")
    cfg = tail.config(args.preset)
    result = fit(
        "tail",
        cfg,
        scaling=Scaling(workers=args.workers),
        storage=args.output,
        name=f"example-tail-{args.preset}",
        overwrite=True,
    )
    ckpt = load_checkpoint(result.checkpoint, method="tail")
    print("metrics:", tail.evaluate(ckpt, cfg.replace(eval_episodes=50)))

    # one 3-way 5-shot episode of real 8x8 digit images the model never saw in training
    x, y = table_to_numpy(digits_table())
    rng = np.random.default_rng(1)
    sx, sy, qx, qy = [], [], [], []
    for c in (7, 8, 9):
        rows = rng.choice(np.flatnonzero(y == c), 8, replace=False)
        sx += x[rows[:5]].tolist()
        sy += [int(c)] * 5
        qx += x[rows[5:]].tolist()
        qy += [int(c)] * 3
    predictor = tail.predictor(ckpt)
    answer = predictor(predictor.Request(support_x=sx, support_y=sy, query_x=qx, n_draws=4))
    print("true:     ", qy)
    print("predicted:", answer.labels)


if __name__ == "__main__":
    main()
