"""One Ray Serve application that serves any method's checkpoint through its predictor.

Routes of the application mounted at ``/<method>``:

* ``POST /<method>/predict``: the method's pydantic ``Request`` in, its ``Response`` out;
  422 naming the field for a malformed body, 413 past the size caps, 401 without the bearer
  token (when one is set), 500 with a request id for an internal failure (the replica keeps
  serving).
* ``GET /<method>/metadata``: method, paper, checkpoint config and step, request JSON Schema.
* ``GET /<method>/healthz``: ``{"status": "ok"}`` once the checkpoint is loaded.

Requests are batched with ``@serve.batch`` into the predictor's ``batch`` form.

No ``from __future__ import annotations`` here: FastAPI must see the real ``Request`` type
of the route parameters on Serve's ingress class.
"""

import hmac
import json
import logging
import os
import re
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from ray import serve

logger = logging.getLogger("nshot.serve")


@dataclass
class ServeOptions:
    """Per-application serving options (all have safe defaults)."""

    max_batch_size: int = 16
    batch_wait_timeout_s: float = 0.005
    max_body_bytes: int = 16 * 1024 * 1024
    max_items: int = 100_000  # cap on the number of list items in a request body
    token: str | None = None
    num_replicas: int = 1
    # tests only: a request with header `x-nshot-inject-fault: 1` fails inside the handler
    allow_fault_injection: bool = False
    # prediction sets around a few-shot classifier (nshot.serve.conformal): "caos" or None
    conformal: str | None = None
    alpha: float = 0.1
    conformal_k: int = 1


def _count_items(obj: Any, limit: int) -> int:
    """Number of list items in a decoded JSON body (stops counting past ``limit``)."""
    count, stack = 0, [obj]
    while stack and count <= limit:
        cur = stack.pop()
        if isinstance(cur, list):
            count += len(cur)
            stack.extend(c for c in cur if isinstance(c, list | dict))
        elif isinstance(cur, dict):
            stack.extend(v for v in cur.values() if isinstance(v, list | dict))
    return count


_FIELD_PREFIX = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?):")


def _errors(err: ValidationError) -> list[dict[str, Any]]:
    """Pydantic errors as ``{"field", "msg", "type"}``; model-level checks name their field at
    the start of the message (``"support_y: ..."``), which becomes the field here."""
    out = []
    for e in err.errors(include_url=False, include_context=False, include_input=False):
        msg = e["msg"].removeprefix("Value error, ")
        field = ".".join(str(p) for p in e["loc"]) or None
        if field is None and (m := _FIELD_PREFIX.match(msg)):
            field = m.group(1)
        out.append({"field": field, "msg": msg, "type": e["type"]})
    return out


def parse_request(predictor: Any, body: bytes, opts: ServeOptions) -> Any:
    """The predictor's validated Request, or the 413/422 JSONResponse that explains the problem."""
    if len(body) > opts.max_body_bytes:
        return JSONResponse(
            {"detail": f"body of {len(body)} bytes exceeds {opts.max_body_bytes}"},
            status_code=413,
        )
    try:
        decoded = json.loads(body)
    except ValueError as err:
        return JSONResponse(
            {"detail": [{"field": None, "msg": f"invalid JSON: {err}"}]}, status_code=422
        )
    if _count_items(decoded, opts.max_items) > opts.max_items:
        return JSONResponse(
            {"detail": f"request holds more than {opts.max_items} items"}, status_code=413
        )
    try:
        return predictor.Request.model_validate(decoded)
    except ValidationError as err:
        return JSONResponse({"detail": _errors(err)}, status_code=422)


fastapi_app = FastAPI(title="nshot")


@serve.deployment(ray_actor_options={"num_cpus": 1})
@serve.ingress(fastapi_app)
class MethodServer:
    """Loads ``method``'s checkpoint and serves its predictor."""

    def __init__(self, method: str, checkpoint: str, options: dict[str, Any]) -> None:
        from nshot.method import get
        from nshot.serve.conformal import wrap
        from nshot.train.checkpoint import load_checkpoint

        self.opts = ServeOptions(**options)
        self.method = get(method)
        self.checkpoint = load_checkpoint(checkpoint, method=self.method.name)
        self.predictor = wrap(
            self.method.predictor(self.checkpoint),
            self.opts.conformal,
            self.opts.alpha,
            self.opts.conformal_k,
        )
        self.predict_batch.set_max_batch_size(self.opts.max_batch_size)
        self.predict_batch.set_batch_wait_timeout_s(self.opts.batch_wait_timeout_s)

    # ------------------------------------------------------------------ helpers

    def _unauthorized(self, request: Request) -> JSONResponse | None:
        if not self.opts.token:
            return None
        header = request.headers.get("authorization", "")
        given = header[7:] if header.lower().startswith("bearer ") else ""
        if hmac.compare_digest(given.encode(), self.opts.token.encode()):
            return None
        return JSONResponse(
            {"detail": "missing or wrong bearer token"},
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def predict_batch(self, requests: list[Any]) -> list[Any]:
        try:
            return self.predictor.batch(requests)
        except Exception:  # noqa: BLE001 - isolate the failing request below
            out = []
            for r in requests:
                try:
                    out.append(self.predictor(r))
                except Exception as err:  # noqa: BLE001
                    out.append(err)
            return out

    # ------------------------------------------------------------------ routes

    @fastapi_app.post("/predict")
    async def predict(self, request: Request) -> JSONResponse:
        if (resp := self._unauthorized(request)) is not None:
            return resp
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        req = parse_request(self.predictor, await request.body(), self.opts)
        if isinstance(req, JSONResponse):
            return req
        try:
            if self.opts.allow_fault_injection and request.headers.get("x-nshot-inject-fault"):
                raise RuntimeError("injected fault (allow_fault_injection)")
            answer = await self.predict_batch(req)
            if isinstance(answer, ValueError):
                msg = str(answer)
                field = m.group(1) if (m := _FIELD_PREFIX.match(msg)) else None
                return JSONResponse({"detail": [{"field": field, "msg": msg}]}, status_code=422)
            if isinstance(answer, Exception):
                raise answer
        except Exception:
            logger.exception("request %s failed", request_id)
            return JSONResponse(
                {"detail": "internal error", "request_id": request_id}, status_code=500
            )
        return JSONResponse(answer.model_dump(mode="json"), headers={"x-request-id": request_id})

    @fastapi_app.get("/metadata")
    async def metadata(self, request: Request) -> JSONResponse:
        if (resp := self._unauthorized(request)) is not None:
            return resp
        return JSONResponse(
            {
                "method": self.method.name,
                "paper": self.method.paper,
                "area": self.method.area,
                "method_version": self.method.version,
                "checkpoint": {
                    "path": str(self.checkpoint.path),
                    "step": self.checkpoint.step,
                    "config": self.checkpoint.config,
                },
                "request_schema": self.predictor.Request.model_json_schema(),
                "response_schema": self.predictor.Response.model_json_schema(),
                "predictor": self.predictor.metadata(),
                "max_batch_size": self.opts.max_batch_size,
            }
        )

    @fastapi_app.get("/healthz")
    async def healthz(self) -> dict[str, Any]:
        return {"status": "ok", "method": self.method.name, "pid": os.getpid()}


def build_app(method: str, checkpoint: str | os.PathLike, options: ServeOptions | None = None):
    """The Serve application for one method (bind it with ``serve.run(app, route_prefix=...)``)."""
    from nshot.train.checkpoint import load_checkpoint

    opts = options or ServeOptions()
    if opts.token is None:
        opts.token = os.environ.get("NSHOT_SERVE_TOKEN") or None
    ckpt = load_checkpoint(checkpoint, method=method)  # fail fast, in the caller, on a bad path
    if opts.conformal is not None:  # and on a method that cannot give prediction sets
        from nshot.method import get
        from nshot.serve.conformal import wrap

        wrap(get(method).predictor(ckpt), opts.conformal, opts.alpha, opts.conformal_k)
    return MethodServer.options(
        num_replicas=opts.num_replicas,
        # room for a full batch while the previous one runs
        max_ongoing_requests=max(2 * opts.max_batch_size, 8),
    ).bind(method, str(ckpt.path), asdict(opts))


def app_builder(args: dict[str, Any]):
    """Entry point for ``serve run`` config files: ``import_path: nshot.serve.app:app_builder``
    with ``args: {method: tail, checkpoint: PATH, max_batch_size: 16, ...}``."""
    args = dict(args)
    method = args.pop("method")
    checkpoint = args.pop("checkpoint")
    return build_app(method, checkpoint, ServeOptions(**args))
