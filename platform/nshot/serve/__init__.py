"""Ray Serve glue: one application serves any method's checkpoint (see ``nshot.serve.app``)."""

from __future__ import annotations

import os
from typing import Any

from nshot.serve.client import Client, ServeError

__all__ = ["Client", "ServeError", "ServeOptions", "build_app", "start"]


def __getattr__(name: str) -> Any:  # keep `import nshot.serve` light (no Ray Serve import)
    if name in ("ServeOptions", "build_app"):
        from nshot.serve import app

        return getattr(app, name)
    raise AttributeError(name)


def start(
    method: str,
    checkpoint: str | os.PathLike,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    options: Any = None,
    blocking: bool = False,
) -> str:
    """Start Serve's HTTP proxy on ``host:port`` (loopback by default) and deploy ``method`` at
    ``/<method>``; returns the application's base URL.

    The checkpoint is loaded and verified first: a bad one raises its one-line ``NshotError``
    before Ray or Serve is started."""
    from ray import serve

    from nshot.serve.app import build_app
    from nshot.train import ensure_ray

    app = build_app(method, checkpoint, options)
    ensure_ray()
    serve.start(http_options={"host": host, "port": port})
    serve.run(
        app,
        name=method,
        route_prefix=f"/{method}",
        blocking=blocking,
    )
    return f"http://{host}:{port}/{method}"
