"""Train TAIL through the Python API, evaluate it, and classify real digits with it.

    python examples/tail_api.py --preset smoke     # seconds
    python examples/tail_api.py --preset quickstart   # about two minutes on 2 cores
    python examples/tail_api.py --preset small        # the reproduction's recipe: 24,000 steps

The same run from the command line: `nshot train tail --preset quickstart`, then
`nshot eval tail --checkpoint ~/.cache/nshot/runs/tail-quickstart`. docs/python-api.md describes
every function used here.
"""

from __future__ import annotations

import argparse

import nshot
from nshot.data import digits_table, episode_from_table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smoke")
    ap.add_argument("--workers", type=int, default=0, help="Ray Train workers (0: in-process)")
    ap.add_argument("--storage", "--output", help="where runs live (default: nshot's storage)")
    args = ap.parse_args()

    run = nshot.train(
        "tail",
        args.preset,
        workers=args.workers,
        storage=args.storage,
        name=f"example-tail-{args.preset}",
        overwrite=True,
    )
    print("checkpoint:", run.checkpoint)
    print("metrics:", nshot.evaluate(run.run_dir, overrides={"eval_episodes": 50}))

    # one 3-way 5-shot episode of real 8x8 digit images the model never saw in training
    episode = episode_from_table(digits_table(), (7, 8, 9), shots=5, queries=3, seed=1)
    query_y = episode.pop("query_y")
    predictor = nshot.load(run.run_dir)  # the run's newest checkpoint; the method from it
    answer = predictor(predictor.Request(**episode, n_draws=4))
    print("true:     ", query_y)
    print("predicted:", answer.labels)


if __name__ == "__main__":
    main()
