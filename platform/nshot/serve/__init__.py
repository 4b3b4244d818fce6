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
    # Serve's controller, proxy and replicas log every start-up step and request at INFO: those
    # lines go to Ray's session logs, the terminal keeps warnings and errors (NSHOT_VERBOSE=1
    # shows them all)
    verbose = os.environ.get("NSHOT_VERBOSE", "").lower() in ("1", "true", "yes")
    logging_config = {"log_level": "INFO" if verbose else "WARNING"}
    if not verbose:  # this process's own "Started Serve ...", "Application ... is ready" lines
        import logging

        logging.getLogger("ray.serve").setLevel(logging.WARNING)
    serve.start(http_options={"host": host, "port": port}, logging_config=logging_config)
    serve.run(
        app,
        name=method,
        route_prefix=f"/{method}",
        blocking=blocking,
        logging_config=logging_config,
    )
    return f"http://{host}:{port}/{method}"
