"""TAIL over HTTP on inputs of any width, against nearest centroid on the same episodes.

Generated 5-way 5-shot tasks of 16 to 4,096 unscaled features (``methods/tail/widths.py``
describes the generator) are sent as they are to a served TAIL checkpoint at its default
serving settings; nearest centroid on standardised features answers the same episodes::

    nshot train tail --preset small
    python examples/tail_widths.py --checkpoint ~/.cache/nshot/runs/tail-small \\
        --episodes 300 --variants --out methods/tail/results/widths.json

Serve starts on 127.0.0.1 for the duration of the script (or pass ``--url`` of a running
``nshot serve tail``). ``--variants`` also answers every episode in process with TAIL's other
input maps (a random subset of ``d_data`` features per draw, a Gaussian projection), more
draws, and standardisation off; ``--real N`` adds N episodes each of raw digits 5-9 (64
pixels) and MNIST (784 pixels), same systems. The JSON holds, per width, every system's accuracy with its
95 % interval, TAIL minus nearest centroid per episode, and the request latency (p50, p90).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def variants(checkpoint: str) -> dict:
    """In-process TAIL variants on the served checkpoint: name -> send(body) -> answer."""
    from nshot.method import get
    from nshot.train.checkpoint import load_checkpoint

    ckpt = load_checkpoint(checkpoint, method="tail")
    default = get("tail").predictor(ckpt)
    out = {}
    for wide in ("subset", "gaussian"):
        pred = type(default)(default.model, default.cfg, wide_inputs=wide)
        for draws in (1, 8):
            out[f"tail_{wide}_{draws}draw"] = _sender(pred, n_draws=draws)
    out["tail_span_4draw"] = _sender(default, n_draws=4)
    out["tail_no_standardise"] = _sender(default, standardise=False)
    return out


def _sender(predictor, **fields):
    def send(body: dict) -> dict:
        req = predictor.Request.model_validate({**body, **fields})
        return predictor(req).model_dump(mode="json")

    return send


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", help="the TAIL checkpoint (run folder or checkpoint)")
    ap.add_argument("--url", help="a running `nshot serve tail` endpoint instead")
    ap.add_argument("--episodes", type=int, default=300)
    ap.add_argument("--widths", default="16,64,256,1024,4096")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", action="store_true", help="also TAIL variants, in process")
    ap.add_argument(
        "--real", type=int, default=0, help="also this many episodes of digits 5-9 and MNIST"
    )
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--out", help="write the JSON here")
    args = ap.parse_args()
    if not (args.url or args.checkpoint):
        ap.error("give --checkpoint or --url")
    if args.variants and not args.checkpoint:
        ap.error("--variants needs --checkpoint")

    import torch
    from threadpoolctl import threadpool_limits

    from nshot.methods.tail.serve import MAX_QUERIES, MAX_SUPPORT
    from nshot.methods.tail.widths import (
        SHOTS,
        WAYS,
        compare,
        markdown,
        measure,
        real_episodes,
    )
    from nshot.serve import Client

    torch.set_num_threads(1)  # the in-process variants share 2 cores with the replica
    widths = tuple(int(w) for w in args.widths.split(","))
    options = None
    started = False
    url = args.url
    if url is None:
        from nshot.serve import start
        from nshot.serve.app import ServeOptions

        # the largest request of this run: (support + queries) rows of the widest width
        items = 2 * WAYS * SHOTS * (max(widths) + 1) + WAYS * SHOTS
        options = ServeOptions(max_items=max(ServeOptions().max_items, items))
        url = start("tail", args.checkpoint, port=args.port, options=options)
        started = True
    try:
        client = Client(url)
        extra = variants(args.checkpoint) if args.variants else None
        t0 = time.time()
        load_before = os.getloadavg()

        def show(row: dict) -> None:
            acc = row["accuracy"]
            line = ", ".join(f"{k} {v['mean']:.3f}" for k, v in acc.items())
            print(f"width {row['width']}: {line}; p50 {row['latency_s']['p50'] * 1e3:.1f} ms")

        with threadpool_limits(1):
            result = measure(
                client.predict, widths, args.episodes, seed=args.seed, variants=extra, progress=show
            )
        result.update(
            {
                "url": url,
                "checkpoint": args.checkpoint,
                "metadata_predictor": client.metadata().get("predictor"),
                "serve_options": {"max_items": options.max_items} if options else None,
                "caps": {"max_support": MAX_SUPPORT, "max_queries": MAX_QUERIES},
                "seconds": round(time.time() - t0, 1),
                "load_avg_before": load_before,
                "load_avg_after": os.getloadavg(),
            }
        )
        if args.real:
            result["real"] = {}
            with threadpool_limits(1):
                for name in ("digits", "mnist"):
                    eps = real_episodes(name, args.real, seed=args.seed)
                    row = compare({"tail": client.predict, **(extra or {})}, eps, seed=args.seed)
                    result["real"][name] = row
                    show({"width": name, **row})
        print(markdown(result))
        print("target met:", result["target_met"])
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    finally:
        if started:
            from ray import serve

            serve.shutdown()


if __name__ == "__main__":
    main()
