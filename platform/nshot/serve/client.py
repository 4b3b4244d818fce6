"""A small HTTP client for an nshot Serve application."""

from __future__ import annotations

import email.utils
import json
import os
import time
import urllib.error
import urllib.request
from typing import Any


class ServeError(Exception):
    """An HTTP error from the server: ``status`` and the decoded ``detail``."""

    def __init__(self, status: int, detail: Any, retry_after_s: float | None = None) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail
        self.retry_after_s = retry_after_s


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A ``Retry-After`` header (RFC 9110 §10.2.3: delay-seconds or an HTTP-date) in seconds
    from now, or None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class Client:
    """``Client("http://127.0.0.1:8000/tail").predict({...})`` -> the decoded response.

    A 503 or 429 that carries ``Retry-After`` (the server is past capacity: Serve's
    ``max_queued_requests``) is retried after the delay it asks for, at most ``retries`` times,
    waiting at most ``max_wait_s`` each time; any other error, or a 503 without ``Retry-After``
    (e.g. a replica whose checkpoint failed to load), raises :class:`ServeError` at once.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout_s: float = 60.0,
        retries: int = 3,
        max_wait_s: float = 30.0,
    ) -> None:
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("NSHOT_SERVE_TOKEN")
        self.timeout_s = timeout_s
        self.retries = retries
        self.max_wait_s = max_wait_s
        self.attempts = 0  # HTTP requests sent by this client, retries included

    def _once(self, path: str, data: bytes | None) -> Any:
        req = urllib.request.Request(self.url + path, data=data, method="POST" if data else "GET")
        req.add_header("content-type", "application/json")
        if self.token:
            req.add_header("authorization", f"Bearer {self.token}")
        self.attempts += 1
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:
            body = err.read()
            try:
                decoded = json.loads(body)
                detail = decoded.get("detail") if isinstance(decoded, dict) else decoded
            except ValueError:
                detail = body.decode(errors="replace")
            wait = retry_after_seconds(err.headers.get("retry-after")) if err.headers else None
            raise ServeError(err.code, detail, wait) from None

    def _call(self, path: str, payload: Any | None = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        for attempt in range(self.retries + 1):
            try:
                return self._once(path, data)
            except ServeError as err:
                retryable = err.status in (429, 503) and err.retry_after_s is not None
                if not retryable or attempt == self.retries:
                    raise
                time.sleep(min(err.retry_after_s, self.max_wait_s))
        raise AssertionError("unreachable")  # pragma: no cover

    def predict(self, request: Any) -> dict[str, Any]:
        if hasattr(request, "model_dump"):
            request = request.model_dump(mode="json")
        return self._call("/predict", request)

    def metadata(self) -> dict[str, Any]:
        return self._call("/metadata")

    def healthz(self) -> dict[str, Any]:
        return self._call("/healthz")
