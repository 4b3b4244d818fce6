"""A small HTTP client for an nshot Serve application."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any


class ServeError(Exception):
    """An HTTP error from the server: ``status`` and the decoded ``detail``."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class Client:
    """``Client("http://127.0.0.1:8000/tail").predict({...})`` -> the decoded response."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("NSHOT_SERVE_TOKEN")
        self.timeout_s = timeout_s

    def _call(self, path: str, payload: Any | None = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(self.url + path, data=data, method="POST" if data else "GET")
        req.add_header("content-type", "application/json")
        if self.token:
            req.add_header("authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:
            body = err.read()
            try:
                detail = json.loads(body).get("detail")
            except ValueError:
                detail = body.decode(errors="replace")
            raise ServeError(err.code, detail) from None

    def predict(self, request: Any) -> dict[str, Any]:
        if hasattr(request, "model_dump"):
            request = request.model_dump(mode="json")
        return self._call("/predict", request)

    def metadata(self) -> dict[str, Any]:
        return self._call("/metadata")

    def healthz(self) -> dict[str, Any]:
        return self._call("/healthz")
