"""Benchmarks: ratios measured in one run, written as JSON a later run can compare against.

``nshot bench train --method tail`` trains the same config with 1 and with 2 Ray Train
workers (one CPU and one torch thread each; the per-worker batch is fixed, so 2 workers
process twice the samples per step) and reports the group's samples/s and their ratio.
``nshot bench serve`` drives the Serve app with and without batching, under each ingress mode and
on 1 and 2 replicas, and a bare FastAPI app, with the predictor's own example request (levels
repeated and interleaved, medians and spread); ``nshot bench serve-sustained`` sends 10,000
requests (5 % malformed) at 64 clients and checks the answers, the status codes and the
replica's memory; ``nshot bench serve-ramp`` ramps the load on an autoscaled app and records
its replicas; ``nshot bench deepspeed`` measures ZeRO's memory per rank.
``nshot bench <method>`` runs the method's own benchmark
(:meth:`~nshot.method.Method.benchmark`, e.g. TAIL's inline against per-query inference), which
writes through :func:`write_result` like the others.
"""

from __future__ import annotations

import json
import os
import platform as _stdlib_platform
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from nshot.method import get


def _environment() -> dict[str, Any]:
    import ray
    import torch

    return {
        "cpu_count": os.cpu_count(),
        "python": _stdlib_platform.python_version(),
        "torch": torch.__version__,
        "ray": ray.__version__,
        "machine": _stdlib_platform.machine(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_result(
    default: str, out: str | os.PathLike | None, data: dict[str, Any], keys: list[str]
) -> dict[str, Any]:
    """Write a benchmark's ``data`` as JSON to ``out`` (else ``default``), with the environment
    and its ratios to the previous file's figures ``keys``, and return it (with
    ``written_to``). A method's :meth:`~nshot.method.Method.benchmark` writes through it too."""
    data.setdefault("environment", _environment())
    path = Path(out or default)
    data["compared_to_previous"] = _compare(path, data, keys)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    data["written_to"] = str(path)
    return data


def _compare(out: Path, data: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """Ratios of this run's figures to the previous run's, when the file already exists."""
    if not out.exists():
        return {}
    try:
        old = json.loads(out.read_text())
    except (OSError, ValueError):
        return {}
    cmp = {}
    for k in keys:
        a, b = data.get(k), old.get(k)
        if isinstance(a, dict) and isinstance(b, dict):  # a ratio with its spread
            a, b = a.get("median_ratio"), b.get("median_ratio")
        if isinstance(a, int | float) and isinstance(b, int | float) and b:
            cmp[k] = {"previous": b, "now": a, "now_over_previous": a / b}
    return cmp


def train(
    method_name: str = "tail",
    *,
    preset: str = "small",
    steps: int = 60,
    out: str | os.PathLike | None = None,
) -> dict[str, Any]:
    from nshot.train import Scaling, ensure_ray, fit

    method = get(method_name)
    cfg = method.config(
        preset,
        steps=steps,
        log_every=max(1, steps // 6),
        checkpoint_every=steps,
        torch_threads=1,
    )
    ensure_ray()
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="nshot-bench-") as storage:
        for workers in (1, 2):
            res = fit(
                method_name,
                cfg,
                scaling=Scaling(workers=workers, cpus_per_worker=1),
                storage=storage,
                name=f"bench-{workers}w",
            )
            sps = res.metrics.get("samples_per_s")
            if sps is None:
                raise RuntimeError(f"{method_name} does not report samples_per_s")
            runs[f"workers_{workers}"] = {"samples_per_s": sps, "wall_s": res.wall_s}
    data: dict[str, Any] = {
        "benchmark": "train",
        "method": method_name,
        "preset": preset,
        "steps": steps,
        "torch_threads_per_worker": 1,
        "cpus_per_worker": 1,
        **runs,
        "samples_per_s_1": runs["workers_1"]["samples_per_s"],
        "samples_per_s_2": runs["workers_2"]["samples_per_s"],
        "ratio_2_over_1": runs["workers_2"]["samples_per_s"] / runs["workers_1"]["samples_per_s"],
        "target_ratio": 1.6,
        "environment": _environment(),
    }
    return write_result(
        f"bench-results/train-{method_name}.json",
        out,
        data,
        ["samples_per_s_1", "samples_per_s_2", "ratio_2_over_1"],
    )


# --------------------------------------------------------------------------- serve

SERVE_LEVELS = (1, 8, 32, 128)


def _poster(url: str, payload: bytes, token: str | None):
    """``(split url, send)`` for the load drivers: ``send(conn)`` POSTs ``payload`` with the
    bearer ``token`` on a keep-alive ``http.client`` connection and returns the status as text,
    or the exception's name for a failed connection (a keep-alive connection the server closed
    is reopened once; a timeout is not retried)."""
    import http.client
    import urllib.parse

    u = urllib.parse.urlsplit(url)
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"

    def send(conn: http.client.HTTPConnection) -> str:
        for attempt in (0, 1):
            try:
                conn.request("POST", u.path, body=payload, headers=headers)
                resp = conn.getresponse()
                resp.read()
                return str(resp.status)
            except (http.client.HTTPException, ConnectionError) as err:
                conn.close()
                if attempt:
                    return type(err).__name__
            except OSError as err:  # a timeout
                conn.close()
                return type(err).__name__
        raise AssertionError("unreachable")  # pragma: no cover

    return u, send


def _load(
    url: str,
    payload: bytes,
    clients: int,
    requests: int,
    token: str | None = None,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """``clients`` closed-loop clients on 127.0.0.1, each with its own keep-alive connection,
    each sending ``ceil(requests / clients)`` POSTs one after the other (after one warm-up
    request that is not timed). Throughput counts 200 answers only; any other status (a 503
    past capacity) or a failed connection is counted in ``statuses``, never retried."""
    import http.client
    import math
    import threading
    from collections import Counter

    import numpy as np

    u, send = _poster(url, payload, token)
    per = max(1, math.ceil(requests / clients))
    lat: list[float] = []
    statuses: Counter[str] = Counter()
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)

    def client() -> None:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout_s)
        send(conn)  # warm-up: the connection is open before the clock starts
        mine, codes = [], []
        start.wait()
        for _ in range(per):
            t = time.perf_counter()
            code = send(conn)
            mine.append(time.perf_counter() - t)
            codes.append(code)
        conn.close()
        with lock:
            lat.extend(x for x, c in zip(mine, codes) if c == "200")
            statuses.update(codes)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    arr = np.asarray(lat) if lat else np.asarray([np.nan])
    return {
        "clients": clients,
        "requests": per * clients,
        "ok": statuses.get("200", 0),
        "statuses": dict(statuses),
        "wall_s": wall,
        "requests_per_s": statuses.get("200", 0) / wall,
        "p50_ms": float(np.percentile(arr, 50) * 1000),
        "p99_ms": float(np.percentile(arr, 99) * 1000),
    }


def _wait_http(url: str, timeout_s: float = 120.0) -> None:
    import urllib.request

    deadline = time.time() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and spread (min, max) of the repeats of one system at one level."""
    import numpy as np

    out: dict[str, Any] = {"repeats": len(runs)}
    for k in ("requests_per_s", "p50_ms", "p99_ms"):
        v = np.asarray([r[k] for r in runs], dtype=float)
        out[k] = float(np.median(v))
        out[f"{k}_min"] = float(np.min(v))
        out[f"{k}_max"] = float(np.max(v))
    out["not_200"] = sum(r["requests"] - r["ok"] for r in runs)
    return out


_MARK = "nshot-bench-serve-server: "


class _ServeServer:
    """One Serve instance in its own process (its own Ray, started after the ingress switches
    are set): ``python -m nshot.bench serve-server``. The apps' base URLs come back on the
    child's first stdout line; closing its stdin shuts Serve and Ray down."""

    def __init__(self, mode: str, checkpoint: str, method: str, apps: dict[str, str], token: str):
        import subprocess
        import sys
        import threading

        self.log = tempfile.NamedTemporaryFile(prefix=f"nshot-bench-{mode}-", suffix=".log")
        env = {
            k: v
            for k, v in os.environ.items()
            if k != "RAY_ADDRESS" and not k.startswith("RAY_SERVE_")
        }
        env["NSHOT_SERVE_TOKEN"] = token
        # name:batch:replicas[:batch_wait_ms]
        spec = ",".join(f"{name}:{how}" for name, how in apps.items())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nshot.bench", "serve-server", mode, method, checkpoint,
             str(_free_port()), spec],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env, text=True,
        )  # fmt: skip
        found: list[str] = []
        ready = threading.Event()

        def drain() -> None:  # read every line (a full pipe would block the child)
            for text in self.proc.stdout:
                if text.startswith(_MARK) and not found:
                    found.append(text[len(_MARK) :])
                    ready.set()
            ready.set()  # the child ended

        threading.Thread(target=drain, daemon=True).start()
        ready.wait(timeout=300)
        if not found:
            why = self.tail()
            self.close()
            raise RuntimeError(f"the {mode} Serve process did not start: {why}")
        reply = json.loads(found[0])
        if "error" in reply:
            self.close()
            raise RuntimeError(reply["error"])
        self.urls: dict[str, str] = reply["urls"]

    def tail(self, n: int = 600) -> str:
        self.log.flush()
        text = Path(self.log.name).read_text(errors="replace")
        return " ".join(text[-n:].split())

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=120)
            except Exception:  # noqa: BLE001 - a hung shutdown is killed
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.log.close()


def _serve_server(mode: str, method_name: str, checkpoint: str, port: str, spec: str) -> None:
    """The child of :class:`_ServeServer`: Serve with ``mode``'s switches set before Ray
    starts, one application per ``name:max_batch_size:replicas[:batch_wait_ms]`` of ``spec``
    at ``/<name>``."""
    import sys

    from nshot.errors import NshotError
    from nshot.serve import ingress
    from nshot.serve.app import ServeOptions, build_app

    token = os.environ.get("NSHOT_SERVE_TOKEN")
    try:
        ingress.prepare(mode, token, port=None)
        from ray import serve

        from nshot.train import ensure_ray

        ensure_ray(log_to_driver=False)
        serve.start(
            http_options={"host": "127.0.0.1", "port": int(port)},
            logging_config={"log_level": "WARNING"},
        )
        urls = {}
        for item in spec.split(","):
            name, batch, replicas, *wait = item.split(":")
            opts = ServeOptions(
                max_batch_size=int(batch),
                token=token,
                num_replicas=int(replicas),
                **({"batch_wait_timeout_s": float(wait[0]) / 1000.0} if wait else {}),
            )
            serve.run(build_app(method_name, checkpoint, opts), name=name, route_prefix=f"/{name}")
            urls[name] = ingress.verify(mode, name, "127.0.0.1", int(port))[0] + "/predict"
    except (NshotError, RuntimeError) as err:
        print(_MARK + json.dumps({"error": f"{type(err).__name__}: {err}"}), flush=True)
        return
    print(_MARK + json.dumps({"urls": urls}), flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    serve.shutdown()
    import ray

    ray.shutdown()


def serve(
    method_name: str = "tail",
    *,
    checkpoint: str | None = None,
    requests: int = 200,
    concurrency: tuple[int, ...] = SERVE_LEVELS,
    repeats: int = 3,
    ingress: tuple[str, ...] = ("proxy", "direct", "throughput", "haproxy"),
    replicas: tuple[int, ...] = (1,),
    batch_wait_ms: tuple[float, ...] = (),
    out: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Serve with batching (``max_batch_size`` 16), without (1), and the same predictor in a bare
    FastAPI app under uvicorn (no Ray, one torch thread like a one-CPU replica).

    One block per ingress mode (:mod:`nshot.serve.ingress`), each its own Serve process and Ray,
    one after the other; the bare app runs throughout and is measured in every block, so each
    mode is compared with the bare app measured alongside it. In a block every level (1, 8, 32
    and 128 clients) runs ``repeats`` times, the systems interleaved (their order rotated each
    repeat); medians and the spread are reported, the JSON keeps every run (with the load
    average when it ended). Every block also carries the unbatched app (in blocks other than
    ``proxy``, only when no further batch wait takes its CPU, below); ``replicas`` above 1 add
    a block ``proxy_x<N>`` (the batched app on N replicas, proxy ingress). A mode
    that cannot run here is a row marked unavailable, with the reason. Without ``checkpoint``
    a ``smoke`` model is trained first (in-process Ray, shut down before the blocks).
    ``batch_wait_ms``: the batched apps wait that long for a batch to fill (default: the
    serving default, ``ServeOptions.batch_wait_timeout_s``); each further value adds an app
    ``serve_batched_w<ms>`` beside it, in place of the unbatched app, in every block but
    ``proxy`` and ``proxy_x<N>`` (a 2-CPU machine holds two one-CPU replicas)."""
    import secrets
    import subprocess
    import sys

    import ray

    from nshot.errors import NshotError
    from nshot.serve import ingress as ing
    from nshot.train import ensure_ray, fit

    if repeats < 1 or requests < 1:
        raise NshotError("--repeats and --requests must be >= 1")
    if any(not (0 <= w <= 1000) for w in batch_wait_ms):
        raise NshotError("--batch-wait-ms: each value must lie in [0, 1000]")
    # each app is "max_batch_size:replicas" with ":batch_wait_ms" when one is given
    wait, *more = [f":{w:g}" for w in batch_wait_ms] or [""]
    extra = {f"serve_batched_w{w.lstrip(':')}": f"16:1{w}" for w in more}
    for mode in ingress:
        if mode not in ing.MODES:
            raise NshotError(f"--ingress {mode}: choose among {', '.join(ing.MODES)}")
    tmp = tempfile.TemporaryDirectory(prefix="nshot-bench-serve-")
    if checkpoint is None:
        started = not ray.is_initialized()
        ensure_ray()
        cfg = get(method_name).config("smoke")
        checkpoint = str(fit(method_name, cfg, storage=tmp.name, name="bench").checkpoint)
        if started:
            ray.shutdown()  # the blocks start their own Ray; an idle one would share the CPUs
    predictor = _bench_predictor(method_name, checkpoint)
    payload, ceiling = _bench_payload(predictor), batch_ceiling(predictor)
    token = secrets.token_urlsafe(16)
    bare_port = _free_port()
    bare = subprocess.Popen(
        [sys.executable, "-m", "nshot.serve.bare", "--method", method_name,
         "--checkpoint", checkpoint, "--port", str(bare_port)],
    )  # fmt: skip
    blocks: dict[str, Any] = {}
    order: list[str] = []
    try:
        _wait_http(f"http://127.0.0.1:{bare_port}/{method_name}/healthz")
        bare_url = f"http://127.0.0.1:{bare_port}/{method_name}/predict"
        plan = [
            (
                m,
                m,
                {"serve_batched": f"16:1{wait}", "serve_unbatched": "1:1"}
                if m == "proxy" or not extra
                else {"serve_batched": f"16:1{wait}", **extra},
            )
            for m in ingress
        ] + [
            (f"proxy_x{n}", "proxy", {"serve_batched": f"16:{n}{wait}"}) for n in replicas if n > 1
        ]
        for block, mode, apps in plan:
            try:
                ing.check(mode, token)
                server = _ServeServer(mode, checkpoint, method_name, apps, token)
            except Exception as err:  # noqa: BLE001 - the row says why; the other blocks run
                blocks[block] = {"available": False, "reason": str(err)}
                print(f"bench serve: {block}: unavailable: {err}", file=sys.stderr)
                continue
            try:
                systems = {**server.urls, "fastapi_bare": bare_url}
                runs: dict[str, dict[str, list]] = {s: {} for s in systems}
                names = list(systems)
                for c in concurrency:
                    n = max(requests, 2 * c)
                    for rep in range(repeats):
                        k = rep % len(names)
                        for s in names[k:] + names[:k]:
                            tok = None if s == "fastapi_bare" else token
                            r = _load(systems[s], payload, c, n, token=tok)
                            r["order"], r["load1"] = len(order), os.getloadavg()[0]
                            order.append(f"{block}/{s}/{c}/{rep}")
                            runs[s].setdefault(f"clients_{c}", []).append(r)
                blocks[block] = {
                    "available": True,
                    "ingress": mode,
                    "apps": apps,
                    "urls": server.urls,
                    "runs": runs,
                    "summary": {
                        s: {lvl: _summary(rs) for lvl, rs in by.items()} for s, by in runs.items()
                    },
                }
            finally:
                server.close()
    finally:
        bare.terminate()
        bare.wait(timeout=30)
        tmp.cleanup()
    data: dict[str, Any] = {
        "benchmark": "serve",
        "method": method_name,
        "requests_per_level": requests,
        "requests_rule": "max(requests, 2 * clients) per run, split evenly over the clients",
        "levels": list(concurrency),
        "repeats": repeats,
        "client": "closed-loop clients, one keep-alive HTTP/1.1 connection each, 127.0.0.1",
        "blocks": blocks,
        "predictor_batch_ceiling": ceiling,
        "run_order": order,
        "environment": _environment(),
    }
    data.update(_serve_ratios(blocks, concurrency))
    keys = [k for k in data if k.startswith("ratio_")]
    return write_result(f"bench-results/serve-{method_name}.json", out, data, keys)


def _serve_ratios(blocks: dict[str, Any], levels: tuple[int, ...]) -> dict[str, Any]:
    """The serving ratios with their targets (``out["targets"]``), each from runs of one block
    (measured interleaved): medians, and the spread of the same ratio over paired repeats
    (repeat i of one system against repeat i of the other)."""
    import numpy as np

    out: dict[str, Any] = {"targets": {}}

    def div(a: float, b: float) -> float:
        return float(a / b) if b else float("nan")  # NaN: nothing answered (see statuses)

    def paired(block, a, b, level, key):
        ra = block["runs"][a][f"clients_{level}"]
        rb = block["runs"][b][f"clients_{level}"]
        med = div(np.median([r[key] for r in ra]), np.median([r[key] for r in rb]))
        each = [div(x[key], y[key]) for x, y in zip(ra, rb)]
        return {"median_ratio": med, "min": float(min(each)), "max": float(max(each))}

    top, one = 32 if 32 in levels else max(levels), min(levels)
    proxy = blocks.get("proxy", {})
    if proxy.get("available"):
        out["ratio_batched_over_unbatched_throughput_32"] = paired(
            proxy, "serve_batched", "serve_unbatched", top, "requests_per_s"
        )
        out["ratio_p50_unbatched_over_bare_1"] = paired(
            proxy, "serve_unbatched", "fastapi_bare", one, "p50_ms"
        )
        for s in ("serve_unbatched", "serve_batched"):
            for lvl in (32, 128):
                if lvl in levels and 8 in levels:
                    runs = proxy["runs"][s]
                    hi = [r["requests_per_s"] for r in runs[f"clients_{lvl}"]]
                    lo = [r["requests_per_s"] for r in runs["clients_8"]]
                    out[f"ratio_{s}_throughput_{lvl}_over_8"] = {
                        "median_ratio": div(np.median(hi), np.median(lo)),
                        "min": div(min(hi), max(lo)),
                        "max": div(max(hi), min(lo)),
                    }
    for mode, block in blocks.items():
        if not block.get("available"):
            continue
        for s in block["runs"]:
            if not s.startswith("serve_batched"):
                continue
            name = s[6:]  # batched, batched_w0, ...
            if s == "serve_batched" and "serve_unbatched" in block["runs"]:
                out[f"ratio_{mode}_batched_over_unbatched_throughput_32"] = paired(
                    block, s, "serve_unbatched", top, "requests_per_s"
                )
            out[f"ratio_{mode}_{name}_over_bare_throughput_32"] = paired(
                block, s, "fastapi_bare", top, "requests_per_s"
            )
            out[f"ratio_{mode}_p50_{name}_over_bare_1"] = paired(
                block, s, "fastapi_bare", one, "p50_ms"
            )
    out["targets"] = {
        "ratio_batched_over_unbatched_throughput_32": ">= 3",
        "ratio_<mode>_batched_over_unbatched_throughput_32": ">= 3",
        "ratio_p50_unbatched_over_bare_1": "<= 1.5",
        "ratio_<mode>_p50_batched_over_bare_1": "<= 1.5",
        "ratio_<mode>_batched_over_bare_throughput_32": ">= 1",
        "ratio_serve_unbatched_throughput_{32,128}_over_8": ">= 0.8",
    }
    for block in blocks:
        if block.startswith("proxy_x") and "ratio_proxy_batched_over_bare_throughput_32" in out:
            key = f"ratio_{block}_batched_over_bare_throughput_32"
            if key in out:  # N replicas over 1, each against the bare app of its own block
                one_r = out["ratio_proxy_batched_over_bare_throughput_32"]["median_ratio"]
                out[f"ratio_{block}_over_1_replica_throughput_32"] = {
                    "median_ratio": out[key]["median_ratio"] / one_r,
                    "min": out[key]["min"] / one_r,
                    "max": out[key]["max"] / one_r,
                }
    loopback = [
        m
        for m in ("proxy", "direct", "throughput")
        if f"ratio_{m}_batched_over_bare_throughput_32" in out
    ]
    if loopback:
        out["fastest_loopback_mode"] = max(
            loopback,
            key=lambda m: out[f"ratio_{m}_batched_over_bare_throughput_32"]["median_ratio"],
        )
    return out


# --------------------------------------------------------------------------- sustained load


def sustained_requests(example: dict[str, Any], n: int = 8) -> list[dict[str, Any]]:
    """Distinct valid requests from a predictor's example request: when it is a few-shot episode
    in nshot's format (``query_x``, see :mod:`nshot.data`), the first 1..n queries, so that two
    answers swapped between requests cannot go unnoticed; otherwise the example alone."""
    q = example.get("query_x")
    if not isinstance(q, list) or len(q) < 2:
        return [example]
    return [{**example, "query_x": q[: 1 + k * (len(q) - 1) // max(n - 1, 1)]} for k in range(n)]


def malformed_bodies(example: dict[str, Any]) -> list[bytes]:
    """Bodies every strict request model refuses with a 422: not JSON, truncated JSON, a JSON
    array, an unknown field, NaN."""
    body = json.dumps(example)
    return [
        b"{not json",
        body[:-1].encode(),
        b"[]",
        json.dumps({**example, "nshot_unknown_field": 1}).encode(),
        json.dumps({**example, "nshot_nan": float("nan")}).encode(),
    ]


def sustained_load(
    url: str,
    token: str | None,
    valid: list[bytes],
    expected: list[Any],
    malformed: list[bytes],
    *,
    requests: int,
    clients: int,
    malformed_every: int = 20,
    rss_pid: int | None = None,
    rss_at: int = 1000,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """``requests`` POSTs to ``url`` from ``clients`` closed-loop keep-alive clients; request
    ``i`` is malformed when ``i % malformed_every == 0`` (5 % at 20), else ``valid[i % n]``,
    whose decoded answer must equal ``expected[i % n]``. Counts statuses, wrong answers and
    malformed bodies not refused with a 422; with ``rss_pid``, the resident memory of that
    process (the replica) once ``rss_at`` requests are answered and at the end."""
    import http.client
    import threading
    import urllib.parse
    from collections import Counter

    u = urllib.parse.urlsplit(url)
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    lock = threading.Lock()
    state = {"next": 0, "done": 0, "wrong": 0, "bad_not_422": 0, "rss_first": None}
    statuses: Counter[str] = Counter()

    def rss() -> int | None:
        if rss_pid is None:
            return None
        import psutil

        return psutil.Process(rss_pid).memory_info().rss

    def client() -> None:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout_s)
        while True:
            with lock:
                i = state["next"]
                state["next"] += 1
            if i >= requests:
                break
            bad = i % malformed_every == 0
            body = malformed[i % len(malformed)] if bad else valid[i % len(valid)]
            for attempt in (0, 1):
                try:
                    conn.request("POST", u.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    status, data = resp.status, resp.read()
                    break
                except (http.client.HTTPException, ConnectionError) as err:
                    conn.close()
                    status, data = type(err).__name__, b""
                    if attempt:
                        break
            wrong = not bad and (status != 200 or json.loads(data) != expected[i % len(expected)])
            with lock:
                statuses[str(status)] += 1
                state["wrong"] += int(wrong)
                state["bad_not_422"] += int(bad and status != 422)
                state["done"] += 1
                first = state["done"] == rss_at
            if first:
                state["rss_first"] = rss()
        conn.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    end = rss()
    first = state["rss_first"]
    return {
        "requests": requests,
        "clients": clients,
        "malformed": sum(1 for i in range(requests) if i % malformed_every == 0),
        "statuses": dict(statuses),
        "server_errors_5xx": sum(v for k, v in statuses.items() if k.startswith("5")),
        "wrong_answers": state["wrong"],
        "malformed_not_422": state["bad_not_422"],
        "wall_s": wall,
        "requests_per_s": requests / wall,
        "rss_after_first_bytes": first,
        "rss_at": rss_at,
        "rss_end_bytes": end,
        "rss_end_over_first": (end / first) if first and end else None,
    }


def sustained(
    method_name: str = "tail",
    *,
    checkpoint: str | None = None,
    requests: int = 10_000,
    clients: int = 64,
    out: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Sustained load: ``requests`` requests (5 % malformed) at ``clients`` concurrent clients
    against the app's default options with a token (batching; proxy ingress, the default of
    :func:`nshot.serve.start`, on this process's Ray): no 5xx, every valid
    answer equal to the in-process answer, every malformed body a 422, and the replica's
    resident memory at the end within 10 % of its value after the first 1,000 requests."""
    import secrets

    from ray import serve as ray_serve

    from nshot.serve import Client, start
    from nshot.serve.app import ServeOptions
    from nshot.train import ensure_ray, fit, load_checkpoint

    tmp = tempfile.TemporaryDirectory(prefix="nshot-bench-sustained-")
    ensure_ray()
    if checkpoint is None:
        cfg = get(method_name).config("smoke")
        checkpoint = str(fit(method_name, cfg, storage=tmp.name, name="bench").checkpoint)
    predictor = get(method_name).predictor(load_checkpoint(checkpoint, method=method_name))
    example = predictor.example_request()
    if example is None:
        raise ValueError(f"{method_name}: its predictor publishes no example_request()")
    reqs = sustained_requests(example)
    expected = [
        predictor(predictor.Request.model_validate(r)).model_dump(mode="json") for r in reqs
    ]
    token = secrets.token_urlsafe(16)
    url = start(method_name, checkpoint, port=_free_port(), options=ServeOptions(token=token))
    try:
        pid = Client(url, token=token).healthz()["pid"]
        res = sustained_load(
            url + "/predict",
            token,
            [json.dumps(r).encode() for r in reqs],
            expected,
            malformed_bodies(example),
            requests=requests,
            clients=clients,
            rss_pid=pid,
            rss_at=min(1000, requests),
        )
    finally:
        ray_serve.shutdown()
        tmp.cleanup()
    ratio = res["rss_end_over_first"]
    data: dict[str, Any] = {
        "benchmark": "serve-sustained",
        "method": method_name,
        **res,
        "distinct_valid_requests": len(reqs),
        "holds": {
            "no_5xx": res["server_errors_5xx"] == 0,
            "valid_answers_equal_in_process": res["wrong_answers"] == 0,
            "malformed_all_422": res["malformed_not_422"] == 0,
            "rss_within_10_percent": ratio is not None and abs(ratio - 1) <= 0.10,
        },
        "load_after": os.getloadavg()[0],
        "environment": _environment(),
    }
    return write_result(
        f"bench-results/serve-sustained-{method_name}.json", out, data, ["rss_end_over_first"]
    )


RAMP_PHASES: tuple[tuple[int, float], ...] = ((1, 20.0), (64, 90.0), (1, 30.0))


def _timed_load(
    url: str, payload: bytes, clients: int, seconds: float, token: str | None, t0: float
) -> list[tuple[float, float, str]]:
    """``clients`` closed-loop clients (each its own keep-alive connection) posting until
    ``seconds`` have passed; every request as ``(end time since t0, latency, status)``."""
    import http.client
    import threading

    u, send = _poster(url, payload, token)
    out: list[tuple[float, float, str]] = []
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def client() -> None:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        mine = []
        while time.perf_counter() < stop_at:
            t = time.perf_counter()
            code = send(conn)
            end = time.perf_counter()
            mine.append((end - t0, end - t, code))
        conn.close()
        with lock:
            out.extend(mine)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def serve_ramp(
    method_name: str = "tail",
    *,
    checkpoint: str | None = None,
    autoscale: str = "1:2",
    phases: tuple[tuple[int, float], ...] = RAMP_PHASES,
    window_s: float = 5.0,
    out: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Serve autoscaling under a load ramp. The app (default options with a
    token, batching, ``--autoscale MIN:MAX``, proxy ingress on this process's Ray) is driven by
    closed-loop clients in ``phases`` of ``(clients, seconds)`` (default 1 client for 20 s, 64
    for 90 s, 1 for 30 s); a sampler records the running replicas every 0.5 s. Reports the
    replica timeline, throughput and p50/p99 per ``window_s`` window and per phase, the seconds
    from the start of the busiest phase to the first added replica, and that phase's
    throughput on the most replicas over its throughput on the fewest (one run: a ratio of
    windows, not of repeats). Serve's autoscaling delays are its defaults (an upscale after 30 s
    above target, a downscale after 600 s below), so the last phase shows how long the added
    replica stays."""
    import secrets
    import threading

    from ray import serve as ray_serve

    from nshot.errors import NshotError
    from nshot.serve import start
    from nshot.serve.app import ServeOptions, parse_autoscale
    from nshot.train import ensure_ray, fit

    try:
        lo, _ = parse_autoscale(autoscale)
    except ValueError as err:
        raise NshotError(f"--{err}") from None
    if not phases or any(c < 1 or sec <= 0 for c, sec in phases):
        raise NshotError("--phases: give CLIENTSxSECONDS pairs with clients >= 1, seconds > 0")
    tmp = tempfile.TemporaryDirectory(prefix="nshot-bench-ramp-")
    ensure_ray()
    if checkpoint is None:
        cfg = get(method_name).config("smoke")
        checkpoint = str(fit(method_name, cfg, storage=tmp.name, name="bench").checkpoint)
    payload = _bench_payload(_bench_predictor(method_name, checkpoint))
    token = secrets.token_urlsafe(16)
    opts = ServeOptions(token=token, autoscale=autoscale)
    url = start(method_name, checkpoint, port=_free_port(), options=opts)
    timeline: list[tuple[float, int]] = []
    done = threading.Event()
    t0 = time.perf_counter()

    def running() -> int:
        app = ray_serve.status().applications.get(method_name)
        if app is None:
            return 0
        return sum(
            n
            for dep in app.deployments.values()
            for state, n in dep.replica_states.items()
            if str(getattr(state, "value", state)) == "RUNNING"
        )

    def sample() -> None:
        while not done.is_set():
            timeline.append((time.perf_counter() - t0, running()))
            done.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    records: list[tuple[float, float, str, int]] = []
    bounds: list[tuple[float, float]] = []
    try:
        sampler.start()
        for i, (clients, seconds) in enumerate(phases):
            start_s = time.perf_counter() - t0
            got = _timed_load(url + "/predict", payload, clients, seconds, token, t0)
            records += [(end, lat, code, i) for end, lat, code in got]
            bounds.append((start_s, time.perf_counter() - t0))
            print(
                f"[nshot bench serve-ramp] phase {i}: {clients} clients for {seconds:.0f} s, "
                f"replicas now {timeline[-1][1] if timeline else '?'}",
                flush=True,
            )
    finally:
        done.set()
        sampler.join(timeout=5)
        ray_serve.shutdown()
        tmp.cleanup()

    summary = ramp_summary(records, timeline, bounds, phases, lo, window_s)
    data: dict[str, Any] = {
        "benchmark": "serve-ramp",
        "method": method_name,
        "autoscale": autoscale,
        "phases": [{"clients": c, "seconds": sec} for c, sec in phases],
        **summary,
        "timeline": [(round(ts, 2), n) for ts, n in timeline],
        "load_after": os.getloadavg()[0],
        "environment": _environment(),
    }
    return write_result(
        f"bench-results/serve-ramp-{method_name}.json",
        out,
        data,
        ["upscale_after_s", "busy_phase_throughput_most_over_fewest_replicas"],
    )


def ramp_summary(
    records: list[tuple[float, float, str, int]],
    timeline: list[tuple[float, int]],
    bounds: list[tuple[float, float]],
    phases: tuple[tuple[int, float], ...],
    lo: int,
    window_s: float = 5.0,
) -> dict[str, Any]:
    """The figures of :func:`serve_ramp` from its raw data: ``records`` ``(end time, latency,
    status, phase)`` per request, ``timeline`` ``(time, running replicas)`` samples, ``bounds``
    ``(start, end)`` per phase (seconds since the start), ``lo`` the minimum replicas. Windows
    of ``window_s`` start at each phase's start; a phase's last window runs to its end (from
    half a window to one and a half long: no slivers whose rate means nothing); a window's
    replicas are those running at its end. A request counts in the window where it
    ended."""
    import numpy as np

    def replicas_at(t: float) -> int:
        before = [n for ts, n in timeline if ts <= t]
        return before[-1] if before else (timeline[0][1] if timeline else 0)

    def stats(rows: list[tuple[float, float, str, int]], span: float) -> dict[str, Any]:
        lat = np.asarray([r[1] for r in rows if r[2] == "200"])
        return {
            "ok": int(lat.size),
            "not_200": sum(1 for r in rows if r[2] != "200"),
            "requests_per_s": float(lat.size / span) if span > 0 else None,
            "p50_ms": float(np.percentile(lat, 50) * 1000) if lat.size else None,
            "p99_ms": float(np.percentile(lat, 99) * 1000) if lat.size else None,
        }

    windows, per_phase = [], []
    for i, ((clients, seconds), (a, b)) in enumerate(zip(phases, bounds, strict=True)):
        mine = [r for r in records if r[3] == i]
        per_phase.append({"clients": clients, "seconds": seconds, "start_s": round(a, 2),
                          "replicas_max": max([n for ts, n in timeline if a <= ts <= b] or
                                              [replicas_at(a)]),
                          **stats(mine, b - a)})  # fmt: skip
        w = a
        while w < b - 1e-9:
            end = b if b - (w + window_s) < window_s / 2 else w + window_s  # no slivers
            rows = [r for r in mine if w <= r[0] < end or (end == b and r[0] >= end)]
            windows.append({"phase": i, "start_s": round(w, 2), "seconds": round(end - w, 2),
                            "clients": clients, "replicas": replicas_at(end),
                            **stats(rows, end - w)})  # fmt: skip
            w = end
    busy = max(range(len(phases)), key=lambda i: phases[i][0])
    a, b = bounds[busy]
    first_up = next((ts for ts, n in timeline if a <= ts <= b and n > lo), None)
    full = [x for x in windows if x["phase"] == busy and x["seconds"] >= window_s - 1e-9]
    most_n = max([x["replicas"] for x in full] or [lo])
    fewest = [x["requests_per_s"] for x in full if x["replicas"] == lo and x["ok"]]
    most = [x["requests_per_s"] for x in full if x["replicas"] == most_n and x["ok"]]
    return {
        "upscale_after_s": None if first_up is None else round(first_up - a, 1),
        "replicas_max": max([n for _, n in timeline] or [0]),
        "replicas_at_end": timeline[-1][1] if timeline else None,
        "busy_phase_replicas_most": most_n,
        "busy_phase_windows_on_most": len(most),
        "busy_phase_throughput_most_over_fewest_replicas": (
            float(np.median(most) / np.median(fewest)) if most and fewest and most_n > lo else None
        ),
        "per_phase": per_phase,
        "windows": windows,
    }


def batch_ceiling(predictor: Any, size: int = 16, repeats: int = 5) -> dict[str, float]:
    """What batching can gain at most for the benchmark's request (the predictor's example
    request), without Serve: ``size`` one-by-one predictor calls against one
    ``predictor.batch`` of ``size`` copies, in this process on one torch thread (as a one-CPU
    replica has); best of ``repeats`` each. Serve's batched-over-unbatched throughput cannot
    exceed ``speedup`` by much: the path around the predictor (HTTP, routing, parsing) is paid
    per request either way."""
    import time

    import torch

    request = predictor.Request(**predictor.example_request())
    requests = [request] * size
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        predictor(request), predictor.batch(requests)  # warm-up
        one = many = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            for r in requests:
                predictor(r)
            one = min(one, time.perf_counter() - t)
            t = time.perf_counter()
            predictor.batch(requests)
            many = min(many, time.perf_counter() - t)
    finally:
        torch.set_num_threads(threads)
    return {
        "batch_size": size,
        "single_ms_per_request": 1000 * one / size,
        "batched_ms_per_request": 1000 * many / size,
        "speedup": one / many,
    }


def _bench_predictor(method_name: str, checkpoint: str) -> Any:
    """The served predictor, built in this process (for its example request and timing)."""
    from nshot.train import load_checkpoint

    predictor = get(method_name).predictor(load_checkpoint(checkpoint, method=method_name))
    if predictor.example_request() is None:
        raise ValueError(f"{method_name}: its predictor publishes no example_request()")
    return predictor


def _bench_payload(predictor: Any) -> bytes:
    """A representative request: the served predictor's own example request."""
    return json.dumps(predictor.example_request()).encode()


# --------------------------------------------------------------------------- a method's own


def methods_with_benchmarks() -> list[str]:
    """The registered methods that implement :meth:`~nshot.method.Method.benchmark`."""
    from nshot.method import Method, available

    return [n for n in available() if type(get(n)).benchmark is not Method.benchmark]


def method(name: str, *, preset: str = "small", out: str | os.PathLike | None = None):
    """``nshot bench <method>``: the method's own benchmark, or a clear error naming the
    benchmarks there are."""
    from nshot.errors import NshotError, UnknownMethodError

    def choices() -> str:
        return ", ".join(
            [
                "train",
                "serve",
                "deepspeed",
                "serve-sustained",
                "serve-ramp",
                *methods_with_benchmarks(),
            ]
        )

    try:
        data = get(name).benchmark(preset=preset, out=None if out is None else str(out))
    except UnknownMethodError:
        raise NshotError(f"unknown benchmark {name!r}: choose one of {choices()}") from None
    if data is None:
        raise NshotError(f"{name} has no benchmark of its own: choose one of {choices()}")
    return data


# --------------------------------------------------------------------------- deepspeed


def _ds_memory_worker(config: dict[str, Any]) -> None:
    """Ray Train worker: build the engine, take two optimizer steps, write this rank's bytes."""
    import torch
    import torch.distributed as dist
    from transformers import LlamaForCausalLM

    from nshot.nn.lm import tiny_llama_config
    from nshot.train.deepspeed import DeepSpeedOptions, build_engine, memory_report

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(config["vocab"], **config["shape"]))
    opts = DeepSpeedOptions(
        zero_stage=config["zero_stage"], micro_batch=1, lr=1e-4, precision=config["precision"]
    )
    engine = build_engine(model, opts)
    x = torch.randint(0, config["vocab"], (1, 32))
    for _ in range(2):
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
    report = memory_report(engine)
    report["n_params"] = float(
        sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
    )
    rank = dist.get_rank()
    Path(config["out"], f"rank{rank}.json").write_text(json.dumps(report))


#: the shape of SmolLM2-135M (30 layers, hidden 576, MLP 1536, 9/3 heads), randomly initialised
SMOLLM2_SHAPE = {
    "layers": 30,
    "hidden": 576,
    "intermediate": 1536,
    "heads": 9,
    "kv_heads": 3,
    "max_positions": 2048,
}


def deepspeed(
    *,
    workers: int = 2,
    shape: str = "smollm2",
    out: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Per-rank parameter + optimizer memory under ZeRO-0 and ZeRO-3 on ``workers`` Ray Train
    CPU workers, for fp32 (the CPU default) and bf16 mixed precision (the GPU default), and the
    ratios ZeRO-3 / ZeRO-0 (target <= 0.6)."""
    import ray.train
    from ray.train.torch import TorchTrainer

    from nshot.train import ensure_ray
    from nshot.train.runner import fit_trainer

    if shape == "smollm2":
        model_shape, vocab = SMOLLM2_SHAPE, 49152
    elif shape == "tiny":
        model_shape = {"layers": 4, "hidden": 128, "intermediate": 512, "heads": 4}
        vocab = 3000
    else:
        raise ValueError(f"unknown model shape {shape!r}: choose smollm2 or tiny")
    ensure_ray()
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="nshot-bench-ds-") as tmp:
        for precision in ("fp32", "bf16"):
            for stage in (0, 3):
                d = Path(tmp, f"{precision}-z{stage}")
                d.mkdir()
                cfg = {
                    "zero_stage": stage,
                    "precision": precision,
                    "vocab": vocab,
                    "shape": model_shape,
                    "out": str(d),
                }
                fit_trainer(
                    TorchTrainer(
                        _ds_memory_worker,
                        train_loop_config=cfg,
                        scaling_config=ray.train.ScalingConfig(
                            num_workers=workers, resources_per_worker={"CPU": 1}
                        ),
                        run_config=ray.train.RunConfig(
                            name=d.name, storage_path=str(Path(tmp, "ray"))
                        ),
                    )
                )
                ranks = [json.loads(Path(d, f"rank{r}.json").read_text()) for r in range(workers)]
                runs[f"{precision}_zero{stage}"] = {
                    "per_rank_total_bytes": [r["total"] for r in ranks],
                    "per_rank": ranks,
                    "max_rank_total_mb": max(r["total"] for r in ranks) / 2**20,
                }
    data: dict[str, Any] = {
        "benchmark": "deepspeed",
        "workers": workers,
        "model_shape": shape,
        "n_params": runs["fp32_zero0"]["per_rank"][0]["n_params"],
        **runs,
        "ratio_zero3_over_zero0_fp32": runs["fp32_zero3"]["max_rank_total_mb"]
        / runs["fp32_zero0"]["max_rank_total_mb"],
        "ratio_zero3_over_zero0_bf16": runs["bf16_zero3"]["max_rank_total_mb"]
        / runs["bf16_zero0"]["max_rank_total_mb"],
        "target_ratio": 0.6,
        "what": "bytes of model parameters resident on a rank + fp32 master copies + Adam "
        "moments, after two optimizer steps (largest rank)",
        "environment": _environment(),
    }
    return write_result(
        f"bench-results/deepspeed-{shape}.json",
        out,
        data,
        ["ratio_zero3_over_zero0_fp32", "ratio_zero3_over_zero0_bf16"],
    )


def _clients(c: int) -> str:
    return "1 client" if c == 1 else f"{c} clients"


#: a table of a page generated from a committed ``nshot bench serve`` JSON: what stands between
#: the marker naming the file (relative to the repository) and the end marker
PAGE_TABLE = re.compile(
    r"(<!-- nshot:bench-table (?P<path>\S+) -->\n)(?P<table>.*?)(<!-- nshot:bench-table:end -->)",
    re.S,
)


def serve_rows(data: dict[str, Any]) -> str:
    """The Markdown table of :func:`serve_table` alone (no ratios or notes)."""
    return "\n".join(ln for ln in serve_table(data).splitlines() if ln.startswith("|")) + "\n"


def update_page(page: str | Path, root: str | Path) -> bool:
    """Regenerate every marked table of ``page`` from the committed JSON it names (relative to
    ``root``, the repository); True when the page changed."""
    page = Path(page)
    text = page.read_text()

    def table(m: re.Match) -> str:
        data = json.loads((Path(root) / m["path"]).read_text())
        return m.group(1) + serve_rows(data) + m.group(4)

    new = PAGE_TABLE.sub(table, text)
    if new != text:
        page.write_text(new)
    return new != text


def serve_table(data: dict[str, Any]) -> str:
    """``nshot bench serve``'s table (requests/s, p50 ms, p99 ms: medians of the repeats, with
    the throughput's min-max) and its ratios against their targets, as Markdown."""
    levels = data["levels"]
    head = "| block | system | " + " | ".join(_clients(c) for c in levels) + " |"
    lines = [head, "|" + "---|" * (len(levels) + 2)]
    for mode, block in data["blocks"].items():
        if not block.get("available"):
            lines.append(f"| {mode} | unavailable: {block['reason']} |" + " |" * len(levels))
            continue
        for system, by in block["summary"].items():
            cells = []
            for c in levels:
                m = by[f"clients_{c}"]
                bad = f", {m['not_200']} not 200" if m["not_200"] else ""
                cells.append(
                    f"{m['requests_per_s']:.0f} ({m['requests_per_s_min']:.0f}-"
                    f"{m['requests_per_s_max']:.0f}) / {m['p50_ms']:.0f} / {m['p99_ms']:.0f}{bad}"
                )
            lines.append(f"| {mode} | {system} | " + " | ".join(cells) + " |")
    lines.append("")
    for k, v in data.items():
        if k.startswith("ratio_"):
            lines.append(
                f"{k}: {v['median_ratio']:.2f} (paired repeats {v['min']:.2f}-{v['max']:.2f})"
            )
    if "fastest_loopback_mode" in data:
        lines.append(f"fastest mode with loopback binding: {data['fastest_loopback_mode']}")
    if c := data.get("predictor_batch_ceiling"):
        lines.append(
            f"the predictor alone, {c['batch_size']} requests one by one over one batch: "
            f"{c['speedup']:.2f}x ({c['single_ms_per_request']:.1f} -> "
            f"{c['batched_ms_per_request']:.1f} ms a request): the most batching can gain here"
        )
    lines.append(f"targets: {json.dumps(data['targets'])}")
    lines.append(f"written to {data.get('written_to', '?')}")
    return "\n".join(lines)


if __name__ == "__main__":  # the Serve process of `nshot bench serve` (see _ServeServer)
    import sys

    if len(sys.argv) == 7 and sys.argv[1] == "serve-server":
        _serve_server(*sys.argv[2:])
    else:
        raise SystemExit("usage: python -m nshot.bench serve-server MODE METHOD CKPT PORT APPS")
