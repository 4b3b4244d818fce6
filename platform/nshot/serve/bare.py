"""The same predictor behind a bare FastAPI app under uvicorn, without Ray: the reference
point of ``nshot bench serve``.

    python -m nshot.serve.bare --method tail --checkpoint DIR --port 8001
"""

import argparse
import logging
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

logger = logging.getLogger("nshot.serve")


def make_app(method: str, checkpoint: str) -> FastAPI:
    from nshot.serve.app import (
        _FIELD_PREFIX,
        ServeOptions,
        encode_answer,
        load_predictor,
        parse_request,
    )

    opts = ServeOptions()
    _, _, predictor = load_predictor(method, checkpoint, opts)
    app = FastAPI(title=f"nshot bare {method}", docs_url=None, redoc_url=None, openapi_url=None)

    @app.post(f"/{method}/predict")
    async def predict(request: Request) -> JSONResponse:
        req = parse_request(
            predictor, await request.body(), opts, request.headers.get("content-type")
        )
        if isinstance(req, JSONResponse):
            return req
        request_id = uuid.uuid4().hex
        try:
            answer = predictor(req)
        except ValueError as err:
            msg = str(err).encode("utf-8", "backslashreplace").decode("utf-8")
            field = m.group(1) if (m := _FIELD_PREFIX.match(msg)) else None
            return JSONResponse({"detail": [{"field": field, "msg": msg}]}, status_code=422)
        except Exception:
            logger.exception("request %s failed", request_id)
            return JSONResponse(
                {"detail": "internal error", "request_id": request_id}, status_code=500
            )
        return encode_answer(answer, request_id)

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
    ap.add_argument(
        "--torch-threads", type=int, default=1, help="as a Serve replica with num_cpus=1 has"
    )
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.torch_threads)
    uvicorn.run(
        make_app(args.method, args.checkpoint), host=args.host, port=args.port, log_level="warning"
    )


if __name__ == "__main__":
    main()
