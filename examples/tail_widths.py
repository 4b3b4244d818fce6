"""TAIL over HTTP on inputs of any width, against nearest centroid on the same episodes.

Generated 5-way 5-shot tasks of 16 to 4,096 unscaled features (``methods/tail/widths.py``
describes the generator) are sent as they are to a served TAIL checkpoint at its default
serving settings; nearest centroid on standardised features answers the same episodes::

    nshot train tail --preset tabular     # the model for any tabular input (23 min)
    python examples/tail_widths.py --checkpoint ~/.cache/nshot/runs/tail-tabular \\
        --episodes 300 --real 200 --seed 1 --out methods/tail/results/widths-tabular.json

(``--preset quickstart`` and ``--checkpoint ~/.cache/nshot/runs/tail-quickstart`` for the
quickstart's model; ``small``'s own reproduction runs this measurement on its served model.)

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

from fastapi import FastAPI, Request  # module level: the route's annotations resolve here
from fastapi.responses import JSONResponse


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
    for draws in (1, 2, 4, 8, 16, 32):
        out[f"tail_span_{draws}draw"] = _sender(default, n_draws=draws)
    out["tail_no_standardise"] = _sender(default, standardise=False)
    return out


def _sender(predictor, **fields):
    def send(body: dict) -> dict:
        req = predictor.Request.model_validate({**body, **fields})
        return predictor(req).model_dump(mode="json")

    return send


class _InProcess:
    """The Serve app's request path without the network: JSON bytes, ``parse_request`` (the
    same caps and 4xx answers), the predictor, the answer as JSON."""

    def __init__(self, checkpoint: str, options) -> None:
        from nshot.serve.app import load_predictor

        self.options = options
        _, self.ckpt, self.predictor = load_predictor("tail", checkpoint, options)

    def predict(self, body: dict) -> dict:
        from nshot.serve.app import parse_request

        req = parse_request(self.predictor, json.dumps(body).encode(), self.options)
        if not isinstance(req, self.predictor.Request):
            raise RuntimeError(f"HTTP {req.status_code}: {req.body[:300]!r}")
        return json.loads(json.dumps(self.predictor(req).model_dump(mode="json")))

    def metadata(self) -> dict:
        return {"predictor": self.predictor.metadata()}


def _uvicorn_app(checkpoint: str, max_items: int):
    """The Serve ingress's request path (``parse_request``, predictor, ``encode_answer``) in a
    bare FastAPI app, without Ray: ``--transport uvicorn`` runs it in a child process."""
    from nshot.serve.app import ServeOptions, encode_answer, load_predictor, parse_request

    opts = ServeOptions(max_items=max_items)
    _, _, predictor = load_predictor("tail", checkpoint, opts)
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.post("/tail/predict")
    async def predict(request: Request) -> JSONResponse:
        req = parse_request(
            predictor, await request.body(), opts, request.headers.get("content-type")
        )
        if isinstance(req, JSONResponse):
            return req
        return encode_answer(predictor(req), "-")

    @app.get("/tail/metadata")
    async def metadata() -> dict:
        return {"predictor": predictor.metadata()}

    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", help="the TAIL checkpoint (run folder or checkpoint)")
    ap.add_argument("--url", help="a running `nshot serve tail` endpoint instead")
    ap.add_argument(
        "--transport",
        choices=("serve", "uvicorn", "in-process"),
        default="serve",
        help="serve: Ray Serve on 127.0.0.1 (default); uvicorn: HTTP to the Serve app's request "
        "path in a bare FastAPI app in a child process, without Ray (for a machine too loaded "
        "for Ray to start); in-process: no HTTP, the same path in this process",
    )
    ap.add_argument("--uvicorn-child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--episodes", type=int, default=300)
    ap.add_argument("--widths", default="16,64,256,1024,4096")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--variants",
        default="",
        help="also these TAIL variants, in process: comma-separated names or 'all' "
        "(tail_subset_1draw, tail_subset_8draw, tail_gaussian_1draw, tail_gaussian_8draw, "
        "tail_span_2draw, tail_span_4draw, tail_span_8draw, tail_no_standardise)",
    )
    ap.add_argument(
        "--real", type=int, default=0, help="also this many episodes of digits 5-9 and MNIST"
    )
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--out", help="write the JSON here")
    args = ap.parse_args()
    if not (args.url or args.checkpoint):
        ap.error("give --checkpoint or --url")
    if args.uvicorn_child:
        import torch
        import uvicorn

        torch.set_num_threads(1)  # as a Serve replica with num_cpus=1
        app = _uvicorn_app(args.checkpoint, args.uvicorn_child)
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
        return
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
    from nshot.serve.app import ServeOptions

    # the largest request of this run: (support + queries) rows of the widest width
    items = 2 * WAYS * SHOTS * (max(widths) + 1) + WAYS * SHOTS
    if url is None:
        options = ServeOptions(max_items=max(ServeOptions().max_items, items))
    child = None
    if args.transport == "in-process":
        client = _InProcess(args.checkpoint, options)
    elif url is None and args.transport == "uvicorn":
        import subprocess
        import sys
        import urllib.request

        cmd = [sys.executable, __file__, "--checkpoint", args.checkpoint]
        cmd += ["--port", str(args.port), "--uvicorn-child", str(options.max_items)]
        child = subprocess.Popen(cmd)
        url = f"http://127.0.0.1:{args.port}/tail"
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/metadata", timeout=5)
                break
            except OSError:
                time.sleep(0.5)
    elif url is None:
        from nshot.serve import start

        url = start("tail", args.checkpoint, port=args.port, options=options)
        started = True
    try:
        client = client if args.transport == "in-process" else Client(url)
        extra = None
        if args.variants:
            extra = variants(args.checkpoint)
            if args.variants != "all":
                extra = {k: extra[k] for k in args.variants.split(",")}
        t0 = time.time()
        load_before = os.getloadavg()

        done: list[dict] = []

        def show(row: dict) -> None:
            acc = row["accuracy"]
            line = ", ".join(f"{k} {v['mean']:.3f}" for k, v in acc.items())
            print(f"width {row['width']}: {line}; p50 {row['latency_s']['p50'] * 1e3:.1f} ms")
            done.append(row)
            if args.out:  # every finished width is kept, should a long run be stopped
                partial = {"partial": True, "widths": done, "load_avg_now": os.getloadavg()}
                Path(args.out).write_text(json.dumps(partial, indent=1) + "\n")

        with threadpool_limits(1):
            result = measure(
                client.predict, widths, args.episodes, seed=args.seed, variants=extra, progress=show
            )
        result.update(
            {
                "transport": args.transport if args.url is None else "http (--url)",
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
        if child is not None:
            child.terminate()
            child.wait(timeout=30)
        if started:
            from ray import serve

            serve.shutdown()


if __name__ == "__main__":
    main()
