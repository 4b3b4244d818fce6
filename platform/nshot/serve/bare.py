"""The same predictor behind a bare FastAPI app under uvicorn, without Ray: the reference
point of ``nshot bench serve``.

    python -m nshot.serve.bare --method tail --checkpoint DIR --port 8001
"""

import argparse

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


def make_app(method: str, checkpoint: str) -> FastAPI:
    from nshot.method import get
    from nshot.serve.app import ServeOptions, parse_request
    from nshot.train.checkpoint import load_checkpoint

    m = get(method)
    predictor = m.predictor(load_checkpoint(checkpoint, method=m.name))
    opts = ServeOptions()
    app = FastAPI(title=f"nshot bare {method}")

    @app.post(f"/{method}/predict")
    async def predict(request: Request) -> JSONResponse:
        req = parse_request(predictor, await request.body(), opts)
        if isinstance(req, JSONResponse):
            return req
        try:
            return JSONResponse(predictor(req).model_dump(mode="json"))
        except ValueError as err:
            return JSONResponse({"detail": [{"field": None, "msg": str(err)}]}, status_code=422)

    @app.get(f"/{method}/healthz")
    async def healthz() -> dict:
        return {"status": "ok", "method": method}

    return app


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--method", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8001)
    args = ap.parse_args()
    uvicorn.run(
        make_app(args.method, args.checkpoint), host=args.host, port=args.port, log_level="warning"
    )


if __name__ == "__main__":
    main()
