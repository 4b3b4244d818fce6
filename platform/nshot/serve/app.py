"""One Ray Serve application that serves any method's checkpoint through its predictor.

Routes of the application mounted at ``/<method>``:

* ``POST /<method>/predict``: the method's pydantic ``Request`` in (``application/json``
  only, else 415), its ``Response`` out; 422 naming the field for a malformed body (invalid
  JSON, a duplicate key, nesting deeper than ``MAX_DEPTH``, a number outside float32 range, a
  string with an unpaired surrogate, or anything the strict request model refuses: a wrong
  type, an unknown field), 413 past the size caps, 401 without the bearer token (when one is
  set), 500 with a request id for an internal failure (the replica keeps serving).
* ``GET /<method>/metadata``: method, paper, checkpoint config and step, request JSON Schema.
* ``GET /<method>/healthz``: ``{"status": "ok"}`` once the checkpoint is loaded; 503 with
  the error when it failed to load. The only route open without the token.
* ``GET /<method>/openapi.json``, ``/docs``, ``/redoc``: the API schema and its pages, behind
  the bearer token when one is set.

Requests are batched with ``@serve.batch`` into the predictor's ``batch`` form.

No ``from __future__ import annotations`` here: FastAPI must see the real ``Request`` type
of the route parameters on Serve's ingress class.
"""

import asyncio
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

from nshot.serve.resources import DEFAULT_CPUS, check_request, parse_autoscale

logger = logging.getLogger("nshot.serve")


@dataclass
class ServeOptions:
    """Per-application serving options (all have safe defaults)."""

    max_batch_size: int = 16
    # 0: a batch is what has queued while the previous one ran, taken at once (a lone request
    # waits for nothing; under load batches fill while the model computes). A positive wait
    # holds each batch's first request that long for more (see the README's "Serve under load")
    batch_wait_timeout_s: float = 0.0
    max_body_bytes: int = 16 * 1024 * 1024
    # cap on the number of list items in a request body: room for TAIL's widest request (5-way
    # 5-shot, 25 queries, 4,096 features: 204,800 numbers); the 16 MiB body cap bounds it too
    max_items: int = 1_000_000
    token: str | None = None
    num_replicas: int = 1
    # Admission (see the README's "Serve under load"): a replica takes up to
    # `max_ongoing_requests` at once (they wait for the batcher inside the replica, in order);
    # each proxy holds up to `max_queued_requests` more; past that a request is answered at once
    # with 503 and `Retry-After: retry_after_s` (rounded up to whole seconds by Serve).
    max_ongoing_requests: int = 128
    max_queued_requests: int = 128
    retry_after_s: float = 1.0
    # Serve autoscaling on ongoing requests, "MIN:MAX" replicas (instead of num_replicas): a
    # replica is added while each holds more than `target_ongoing_requests` (default: a full
    # batch, at least 2) and removed below it
    autoscale: str | None = None
    target_ongoing_requests: float | None = None
    # What each replica asks Ray for (nshot.serve.resources): CPUs (None: 1, scaled down by the
    # caller that knows the whole deployment -- start, start_all, serve_config -- so that every
    # replica fits the cluster) and GPUs (a fraction shares one GPU; above 1, whole GPUs)
    replica_cpus: float | None = None
    replica_gpus: float = 0.0
    # tests only: a request with header `x-nshot-inject-fault: 1` fails inside the handler, one
    # with `x-nshot-inject-delay-ms: N` holds its slot for N ms (at most 10 s) before it is run
    allow_fault_injection: bool = False
    # prediction sets around a few-shot classifier (nshot.serve.conformal): "caos" or None
    conformal: str | None = None
    alpha: float = 0.1
    conformal_k: int = 1


MAX_DEPTH = 64  # containers (objects and arrays) nested in a request body
FLOAT32_MAX = 3.4028234663852886e38  # every method computes in float32 or float64
INT_LIMIT = 2**63  # integers lie in [-2**63, 2**63)
_FIELD_PREFIX = re.compile(r"^([A-Za-z_]\w*(?:\[\d+\]|\.[A-Za-z_]\w*)*):", re.ASCII)
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{},:]')


def _key(k: Any) -> str:
    """A path component that can always be encoded (an unpaired surrogate is escaped)."""
    return str(k).encode("utf-8", "backslashreplace").decode("utf-8")


def _path(parts: Any) -> str | None:
    return ".".join(_key(p) for p in parts) or None


def _unprocessable(field: str | None, msg: str) -> JSONResponse:
    return JSONResponse({"detail": [{"field": field, "msg": msg}]}, status_code=422)


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _deep_path(body: bytes, limit: int) -> str | None:
    """The path to the first container nested deeper than ``limit`` in a body too deep for the
    JSON decoder (a scan of strings and punctuation, no recursion); None if none is found."""
    stack: list[list[Any]] = []  # [kind, current index or key] per open container
    last: bytes | None = None
    for m in _TOKENS.finditer(body):
        t = m.group()
        if t[:1] == b'"':
            last = t
            continue
        if t in (b"[", b"{"):
            if len(stack) >= limit:
                return _path(e[1] for e in stack if e[1] is not None) or "(body)"
            stack.append([t, 0 if t == b"[" else None])
        elif t in (b"]", b"}"):
            if stack:
                stack.pop()
        elif t == b"," and stack and stack[-1][0] == b"[":
            stack[-1][1] += 1
        elif t == b":" and stack and last is not None:
            try:
                stack[-1][1] = json.loads(last)
            except ValueError:
                stack[-1][1] = "?"
        last = None
    return None


def _check_values(obj: Any, opts: ServeOptions) -> JSONResponse | None:
    """One iterative pass over a decoded body: nesting depth, list items, numbers a float32 (or
    an int64) can hold, strings that are valid Unicode (no unpaired surrogates)."""
    items = 0
    stack: list[tuple[Any, tuple, int]] = [(obj, (), 1)]
    while stack:
        cur, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            return _unprocessable(
                _path(path) or "(body)", f"nested deeper than {MAX_DEPTH} levels of arrays/objects"
            )
        if isinstance(cur, dict):
            pairs: Any = cur.items()
        else:
            items += len(cur)
            if items > opts.max_items:
                return JSONResponse(
                    {"detail": f"request holds more than {opts.max_items} items"}, status_code=413
                )
            pairs = enumerate(cur)
        for k, v in pairs:
            if type(k) is str and not _is_unicode(k):
                return _unprocessable(_path((*path, k)), "field name is not valid Unicode")
            t = type(v)
            if t is float:
                if not -FLOAT32_MAX <= v <= FLOAT32_MAX:  # also NaN, inf, 1e39
                    what = "NaN" if v != v else f"{v!r} lies outside the float32 range"
                    return _unprocessable(
                        _path((*path, k)), f"{what}; numbers must be finite and within +-3.4e38"
                    )
            elif t is int:
                if not -INT_LIMIT <= v < INT_LIMIT:
                    return _unprocessable(
                        _path((*path, k)), "integer outside the 64-bit range [-2**63, 2**63)"
                    )
            elif t is str:
                if not _is_unicode(v):
                    return _unprocessable(
                        _path((*path, k)), "string is not valid Unicode (an unpaired surrogate)"
                    )
            elif t is list or t is dict:
                stack.append((v, (*path, k), depth + 1))
    return None


def _is_unicode(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _errors(err: ValidationError) -> list[dict[str, Any]]:
    """Pydantic errors as ``{"field", "msg", "type"}``; model-level checks name their field at
    the start of the message (``"support_y: ..."``), which becomes the field here."""
    out = []
    for e in err.errors(include_url=False, include_context=False, include_input=False):
        msg = e["msg"].removeprefix("Value error, ")
        field = _path(e["loc"])
        if field is None and (m := _FIELD_PREFIX.match(msg)):
            field = m.group(1)
        out.append({"field": field, "msg": msg, "type": e["type"]})
    return out


def is_json_content_type(value: str | None) -> bool:
    """``application/json``, optionally with ``charset=utf-8`` (JSON is UTF-8, RFC 8259)."""
    if not value:
        return False
    media, _, params = value.partition(";")
    if media.strip().lower() != "application/json":
        return False
    for param in params.split(";"):
        if not param.strip():
            continue
        name, _, val = param.partition("=")
        if name.strip().lower() != "charset":
            return False
        if val.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return False
    return True


def parse_request(
    predictor: Any, body: bytes, opts: ServeOptions, content_type: str | None = "application/json"
) -> Any:
    """The predictor's validated Request, or the 413/415/422 JSONResponse that explains the
    problem: a body that is not ``application/json`` (415), past ``max_body_bytes`` or
    ``max_items`` (413), not JSON, with a duplicate key, nested deeper than ``MAX_DEPTH``, with a
    number outside float32 (or int64) range or a string with an unpaired surrogate, or that the
    request model refuses (422, naming the field where there is one)."""
    if not is_json_content_type(content_type):
        shown = _key((content_type or "")[:100])
        return JSONResponse(
            {"detail": f"Content-Type must be application/json (charset utf-8), got {shown!r}"},
            status_code=415,
        )
    if len(body) > opts.max_body_bytes:
        return JSONResponse(
            {"detail": f"body of {len(body)} bytes exceeds {opts.max_body_bytes}"},
            status_code=413,
        )
    try:
        decoded = json.loads(body, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as err:
        return _unprocessable(_key(err.key), f"duplicate key {_key(err.key)!r}")
    except RecursionError:
        return _unprocessable(
            _deep_path(body, MAX_DEPTH), f"nested deeper than {MAX_DEPTH} levels of arrays/objects"
        )
    except ValueError as err:
        return _unprocessable(None, f"invalid JSON: {_key(err)}")
    if isinstance(decoded, list | dict):
        if (resp := _check_values(decoded, opts)) is not None:
            return resp
    elif not isinstance(decoded, str) or _is_unicode(decoded):
        pass
    else:
        return _unprocessable(None, "string is not valid Unicode (an unpaired surrogate)")
    try:
        return predictor.Request.model_validate(decoded)
    except ValidationError as err:
        return _unprocessable_errors(err)
    except RecursionError:  # a request model's own recursion, should the depth cap not hold
        return _unprocessable(None, f"nested deeper than {MAX_DEPTH} levels of arrays/objects")


def _unprocessable_errors(err: ValidationError) -> JSONResponse:
    return JSONResponse({"detail": _errors(err)}, status_code=422)


def encode_answer(answer: Any, request_id: str, headers: dict[str, str] | None = None):
    """The predictor's answer as a JSON response, or a clean 500 (with the request id) when it
    cannot be JSON: NaN or inf (from a model, never from the request) or text that is not
    valid Unicode. Never raises."""
    try:
        return JSONResponse(answer.model_dump(mode="json"), headers=headers)
    except ValueError as err:  # includes UnicodeEncodeError
        logger.error("request %s: the answer is not valid JSON: %s", request_id, err)
        return JSONResponse(
            {
                "detail": "internal error: the answer holds NaN, inf or invalid text",
                "request_id": request_id,
            },
            status_code=500,
            headers=headers,
        )


def load_predictor(method: str, checkpoint: str | os.PathLike, opts: ServeOptions) -> Any:
    """Load and verify ``method``'s checkpoint and build its (wrapped) predictor: every failure
    is one line, an ``NshotError`` (a ``CheckpointError`` for a checkpoint that cannot be
    served), the error ``nshot eval`` gives for the same checkpoint."""
    from nshot.errors import NshotError
    from nshot.method import get
    from nshot.serve.conformal import wrap
    from nshot.train.checkpoint import CheckpointError, load_checkpoint

    m = get(method)
    ckpt = load_checkpoint(checkpoint, method=m.name)
    try:
        predictor = m.predictor(ckpt)
    except NshotError:
        raise
    except Exception as err:  # noqa: BLE001 - e.g. weights that do not fit the config
        text = " ".join(str(err).split())
        text = text if len(text) <= 400 else text[:400] + " ..."
        raise CheckpointError(
            f"checkpoint {ckpt.path} cannot be served: {type(err).__name__}: {text}"
        ) from None
    return m, ckpt, wrap(predictor, opts.conformal, opts.alpha, opts.conformal_k)


# Docs and schema are routes of the ingress class below, behind the bearer token when one is
# set; FastAPI's own (unauthenticated) /docs, /redoc and /openapi.json are off.
fastapi_app = FastAPI(title="nshot", docs_url=None, redoc_url=None, openapi_url=None)


# A replica that leaves (Ctrl-C, a scale-down, a redeploy) checks for requests still in flight
# every GRACEFUL_WAIT_LOOP_S and goes once there are none. Serve's default sleeps 2 s before the
# first check, so every idle replica took over 2 s to stop: 3.0 s -> 1.0 s per `serve.delete`
# of an idle app here (README, "Serve under load").
GRACEFUL_WAIT_LOOP_S = 0.2


@serve.deployment(
    ray_actor_options={"num_cpus": 1}, graceful_shutdown_wait_loop_s=GRACEFUL_WAIT_LOOP_S
)
@serve.ingress(fastapi_app)
class MethodServer:
    """Loads ``method``'s checkpoint and serves its predictor.

    A replica whose checkpoint fails to load stays up to say why: ``/healthz`` answers 503
    with the one-line error (never ``ok``), and every other route 503 as well.
    """

    def __init__(self, method: str, checkpoint: str, options: dict[str, Any]) -> None:
        self.opts = ServeOptions(**options)
        self.method_name = method
        self.load_error: str | None = None
        try:
            self.method, self.checkpoint, self.predictor = load_predictor(
                method, checkpoint, self.opts
            )
        except Exception as err:  # noqa: BLE001 - reported by /healthz and every route
            self.load_error = " ".join(str(err).split()) or type(err).__name__
            logger.error("nshot serve %s: the checkpoint failed to load: %s", method, err)
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

    def _refused(self, request: Request) -> JSONResponse | None:
        """401 without the token, 503 when the checkpoint failed to load, else None."""
        if (resp := self._unauthorized(request)) is not None:
            return resp
        if self.load_error is not None:
            return JSONResponse(
                {"detail": f"the checkpoint failed to load: {self.load_error}"}, status_code=503
            )
        return None

    # the defaults; __init__ sets each replica's own options
    @serve.batch(
        max_batch_size=ServeOptions.max_batch_size,
        batch_wait_timeout_s=ServeOptions.batch_wait_timeout_s,
    )
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
        if (resp := self._refused(request)) is not None:
            return resp
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        req = parse_request(
            self.predictor, await request.body(), self.opts, request.headers.get("content-type")
        )
        if isinstance(req, JSONResponse):
            return req
        try:
            if self.opts.allow_fault_injection:
                if request.headers.get("x-nshot-inject-fault"):
                    raise RuntimeError("injected fault (allow_fault_injection)")
                if delay := request.headers.get("x-nshot-inject-delay-ms"):
                    await asyncio.sleep(min(float(delay), 10_000.0) / 1000.0)
            answer = await self.predict_batch(req)
            if isinstance(answer, ValueError):
                msg = _key(answer)
                field = m.group(1) if (m := _FIELD_PREFIX.match(msg)) else None
                return _unprocessable(field, msg)
            if isinstance(answer, Exception):
                raise answer
        except Exception:
            logger.exception("request %s failed", request_id)
            return JSONResponse(
                {"detail": "internal error", "request_id": request_id}, status_code=500
            )
        return encode_answer(answer, request_id, headers={"x-request-id": request_id})

    @fastapi_app.get("/metadata")
    async def metadata(self, request: Request) -> JSONResponse:
        if (resp := self._refused(request)) is not None:
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
    async def healthz(self) -> JSONResponse:
        if self.load_error is not None:
            return JSONResponse(
                {"status": "error", "method": self.method_name, "detail": self.load_error},
                status_code=503,
            )
        return JSONResponse({"status": "ok", "method": self.method.name, "pid": os.getpid()})

    @fastapi_app.get("/openapi.json", include_in_schema=False)
    async def openapi(self, request: Request) -> JSONResponse:
        if (resp := self._unauthorized(request)) is not None:
            return resp
        return JSONResponse(request.app.openapi())

    @fastapi_app.get("/docs", include_in_schema=False)
    async def docs(self, request: Request) -> Any:
        from fastapi.openapi.docs import get_swagger_ui_html

        if (resp := self._unauthorized(request)) is not None:
            return resp
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(openapi_url=f"{root}/openapi.json", title="nshot - docs")

    @fastapi_app.get("/redoc", include_in_schema=False)
    async def redoc(self, request: Request) -> Any:
        from fastapi.openapi.docs import get_redoc_html

        if (resp := self._unauthorized(request)) is not None:
            return resp
        root = request.scope.get("root_path", "").rstrip("/")
        return get_redoc_html(openapi_url=f"{root}/openapi.json", title="nshot - ReDoc")


def build_app(method: str, checkpoint: str | os.PathLike, options: ServeOptions | None = None):
    """The Serve application for one method (bind it with ``serve.run(app, route_prefix=...)``).

    The checkpoint is loaded, verified and its predictor built here, in the caller, before
    anything is deployed: an unknown method, a corrupt, tampered or oversized checkpoint or
    non-finite weights raise the one-line ``NshotError`` that ``nshot eval`` gives.
    """
    opts = options or ServeOptions()
    if opts.token is None:
        opts.token = os.environ.get("NSHOT_SERVE_TOKEN") or None
    _, ckpt, predictor = load_predictor(method, checkpoint, opts)
    del predictor  # the replica builds its own
    return bind_app(method, ckpt.path, opts)


def bind_app(method: str, checkpoint: str | os.PathLike, opts: ServeOptions):
    """:func:`build_app` for a checkpoint that :func:`load_predictor` has verified already (it
    is not loaded again here). Each replica asks Ray for ``opts.replica_cpus`` CPUs (None: 1)
    and ``opts.replica_gpus`` GPUs; a request Ray cannot take is a one-line ``NshotError``."""
    from ray.serve.config import BackpressureConfig

    check_request(opts.replica_cpus, opts.replica_gpus)
    cpus = DEFAULT_CPUS if opts.replica_cpus is None else opts.replica_cpus

    scaling: dict[str, Any] = {"num_replicas": opts.num_replicas}
    if opts.autoscale:
        lo, hi = parse_autoscale(opts.autoscale)
        target = opts.target_ongoing_requests or max(2, opts.max_batch_size)
        scaling = {
            "autoscaling_config": {
                "min_replicas": lo,
                "initial_replicas": lo,
                "max_replicas": hi,
                "target_ongoing_requests": target,
            }
        }
    return MethodServer.options(
        **scaling,
        # At least room for a full batch while the previous one runs. A request that finds the
        # replica full waits in the proxy's router, which polls the replica with an exponential
        # back-off (25 ms doubling to 500 ms per attempt, two routing tasks per replica): with the
        # old limit of max(2 * max_batch_size, 8), i.e. 8 without batching, 32 clients collapsed
        # to 10 requests/s (README, "Serve under load"). Requests now wait inside the replica.
        max_ongoing_requests=max(opts.max_ongoing_requests, 2 * opts.max_batch_size),
        max_queued_requests=opts.max_queued_requests,
        backpressure_config=BackpressureConfig(status_code=503, retry_after_s=opts.retry_after_s),
        ray_actor_options={"num_cpus": cpus, "num_gpus": opts.replica_gpus},
    ).bind(method, str(checkpoint), asdict(opts))


def app_builder(args: dict[str, Any]):
    """Entry point for ``serve run`` config files: ``import_path: nshot.serve.app:app_builder``
    with ``args: {method: tail, checkpoint: PATH, max_batch_size: 16, replica_cpus: 0.5, ...}``
    (any :class:`ServeOptions` field; ``nshot serve --all --write-config`` writes
    ``replica_cpus`` fitted to the machine)."""
    args = dict(args)
    method = args.pop("method")
    checkpoint = args.pop("checkpoint")
    return build_app(method, checkpoint, ServeOptions(**args))
