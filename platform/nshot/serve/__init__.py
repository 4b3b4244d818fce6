"""Ray Serve glue: one application serves any method's checkpoint (see ``nshot.serve.app``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from nshot.serve.client import Client, ServeError

__all__ = ["Client", "ServeError", "ServeOptions", "build_app", "start", "start_all", "start_urls"]


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
    ingress: str = "proxy",
    drain_s: float | None = None,
    notify: Callable[[str], None] | None = None,
) -> str:
    """Start Serve on ``host:port`` (loopback by default) and deploy ``method`` at
    ``/<method>``; returns the application's base URL.

    ``ingress`` (:mod:`nshot.serve.ingress`): ``proxy`` (Serve's HTTP proxy on ``port``),
    ``direct``/``throughput`` (the replicas' own HTTP servers, the first on ``port``; Serve's
    proxy moves to a free port) or ``haproxy`` (HAProxy on ``port``, needs a token). The mode is
    set before Ray starts; on a Ray that is already running a mode it was not started with is
    refused. ``drain_s``: how long a leaving replica keeps answering under direct ingress
    (:func:`nshot.serve.ingress.prepare`; set before Ray starts).

    The checkpoint is loaded and verified first: a bad one raises its one-line ``NshotError``
    before Ray or Serve is started. Each replica's CPU request is fitted to the cluster
    (:mod:`nshot.serve.resources`; ``notify`` gets the line that says so, default: the
    ``nshot.serve`` logger); an explicit request that cannot fit is refused before deploying."""
    return start_urls(
        method,
        checkpoint,
        host=host,
        port=port,
        options=options,
        blocking=blocking,
        ingress=ingress,
        drain_s=drain_s,
        notify=notify,
    )[0]


def start_urls(
    method: str,
    checkpoint: str | os.PathLike,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    options: Any = None,
    blocking: bool = False,
    ingress: str = "proxy",
    drain_s: float | None = None,
    notify: Callable[[str], None] | None = None,
) -> list[str]:
    """:func:`start`, returning every base URL of the application (one per replica under
    direct ingress), the one on ``port`` first."""
    from ray import serve

    from nshot.serve import ingress as ing
    from nshot.serve import resources
    from nshot.serve.app import bind_app, load_predictor

    opts = _options(options)
    ing.check(ingress, opts.token)
    resources.check_request(opts.replica_cpus, opts.replica_gpus)
    most = resources.replicas_of(opts)
    _, ckpt, predictor = load_predictor(method, checkpoint, opts)
    del predictor  # the replica builds its own
    direct = ingress in ("direct", "throughput")
    pinned = ing.prepare(
        ingress, opts.token, port=port if direct else None, replicas=most, drain_s=drain_s
    )
    opts = resources.fitted(opts, 1, start_ray=True, notify=notify)
    app = bind_app(method, ckpt.path, opts)
    # our own Ray under direct ingress: the first replica takes `port`, Serve's proxy a free one
    # (a running Ray keeps its own replica port range: the proxy stays on `port`)
    proxy_port = ing._free_port() if direct and pinned else port
    logging_config = _logging_config()
    serve.start(http_options={"host": host, "port": proxy_port}, logging_config=logging_config)
    serve.run(
        app,
        name=method,
        route_prefix=f"/{method}",
        blocking=blocking,
        logging_config=logging_config,
    )
    urls = ing.verify(ingress, method, host, proxy_port)
    first = f"http://{host}:{port}/{method}"
    return sorted(urls, key=lambda u: u != first)


def start_all(
    checkpoints: dict[str, str | os.PathLike],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    options: Any = None,
    ingress: str = "proxy",
    drain_s: float | None = None,
    notify: Callable[[str], None] | None = None,
) -> dict[str, str]:
    """Serve several methods under one Serve instance and one port: one application per method
    (``{method: checkpoint}``) at ``/<method>``, each with the same ``options``; returns
    ``{method: base URL}``. For a token or options per application, deploy the config that
    :func:`nshot.serve.runs.serve_config` writes instead.

    Every checkpoint is loaded and verified before Ray starts (the first bad one raises its
    one-line ``NshotError``). ``ingress`` is ``proxy`` or ``haproxy``: under direct ingress each
    replica answers on a port of its own, so the applications could not share one port. Each
    replica's CPU request is fitted so that every application's replicas fit the cluster
    (:mod:`nshot.serve.resources`; ``notify`` gets the line that says so); an explicit request
    that cannot fit is refused before anything is deployed."""
    from ray import serve

    from nshot.errors import NshotError
    from nshot.serve import ingress as ing
    from nshot.serve import resources
    from nshot.serve.app import bind_app, load_predictor

    if ingress not in ("proxy", "haproxy"):
        raise NshotError(
            f"--ingress {ingress}: serving several applications on one port needs the proxy "
            "(--ingress proxy) or HAProxy (--ingress haproxy); under direct ingress each replica "
            "answers on its own port"
        )
    if not checkpoints:
        raise NshotError("nothing to serve: no checkpoint was given")
    opts = _options(options)
    ing.check(ingress, opts.token)
    resources.check_request(opts.replica_cpus, opts.replica_gpus)
    resources.replicas_of(opts)  # a bad --autoscale, before any checkpoint is loaded
    paths = {}
    for method, ckpt in checkpoints.items():
        _, loaded, predictor = load_predictor(method, ckpt, opts)
        del predictor  # each replica builds its own
        paths[method] = loaded.path
    ing.prepare(ingress, opts.token, drain_s=drain_s)
    opts = resources.fitted(opts, len(paths), start_ray=True, notify=notify)
    apps = {method: bind_app(method, path, opts) for method, path in paths.items()}
    logging_config = _logging_config()
    serve.start(http_options={"host": host, "port": port}, logging_config=logging_config)
    urls = {}
    for method, app in apps.items():
        serve.run(app, name=method, route_prefix=f"/{method}", logging_config=logging_config)
        urls[method] = ing.verify(ingress, method, host, port)[0]
    return urls


def _logging_config() -> dict[str, str]:
    """Serve's controller, proxy and replicas log every start-up step and request at INFO: those
    lines go to Ray's session logs, the terminal keeps warnings and errors (``NSHOT_VERBOSE=1``
    shows them all)."""
    verbose = os.environ.get("NSHOT_VERBOSE", "").lower() in ("1", "true", "yes")
    if not verbose:  # this process's own "Started Serve ...", "Application ... is ready" lines
        import logging

        logging.getLogger("ray.serve").setLevel(logging.WARNING)
    return {"log_level": "INFO" if verbose else "WARNING"}


def _options(options: Any) -> Any:
    """``options`` (default :class:`~nshot.serve.app.ServeOptions`), its token from
    ``$NSHOT_SERVE_TOKEN`` when unset (needed before the app is built: the ingress checks it)."""
    from nshot.serve.app import ServeOptions

    opts = options or ServeOptions()
    if opts.token is None:
        opts.token = os.environ.get("NSHOT_SERVE_TOKEN") or None
    return opts
