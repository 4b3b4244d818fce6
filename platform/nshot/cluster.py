"""A local multi-node Ray cluster on one machine, for development and integration tests.

``start`` launches a Ray head and N worker nodes on 127.0.0.1 as separate ``ray start --block``
processes, each in its own process group (``start_new_session``), each with its own CPU count
and a custom resource naming the node (``node_head``, ``node_w1``, ...) so that placement across
nodes can be asserted. Every port is explicit (GCS, dashboard, Ray Client, and per node the node
manager, object manager, dashboard agent, runtime-env agent, metrics and worker ports), so the
cluster coexists with another Ray on the same machine, and Ray's files go to their own
``--temp-dir`` per node (``<temp-dir>/<node>``: nodes sharing one session directory would each
tail the others' logs and print every line twice). The dashboard and Jobs API bind to 127.0.0.1.

Token authentication stays on: ``start`` writes a fresh random token (``secrets.token_hex(32)``,
what ``ray get-auth-token --generate`` does) to ``<state-dir>/auth_token`` (mode 0600) and starts
every node with ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH`` pointing at it. Every Ray
process inherits that environment (job drivers too), so ``nshot train`` inside a job connects
with the token. Clients pass it the same way (``eval "$(python -m nshot.cluster env)"`` exports
``RAY_ADDRESS``, ``RAY_AUTH_MODE`` and ``RAY_AUTH_TOKEN_PATH`` for ``ray job submit``) or as a
header (``JobSubmissionClient(url, headers=state.auth_headers())``). Note that ``ray start``
resolves ``--node-ip-address=127.0.0.1`` to the machine's own address for Ray's gRPC servers.

``stop`` ends exactly the processes this cluster started: those carrying the cluster's
``NSHOT_LOCAL_CLUSTER`` id in their environment (the ``ray start`` processes get it, and every Ray
process, worker and job driver inherits it) and their descendants -- never ``ray stop``, which
would end every Ray on the machine. The nodes also get ``RAY_ADDRESS`` (the GCS address), so Ray
processes that look a cluster up find this one even with another Ray on the machine. The state file (``<state-dir>/cluster.json``) records PIDs, ports, addresses and the
dashboard URL.

    nshot cluster start --workers 1 --head-cpus 1 --worker-cpus 1   # or python -m nshot.cluster
    nshot cluster status
    eval "$(nshot cluster env)"; ray job submit --working-dir . -- nshot train ...
    nshot cluster stop
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nshot.errors import NshotError

HOST = "127.0.0.1"
STATE_FILE = "cluster.json"
TOKEN_FILE = "auth_token"
MARKER_ENV = "NSHOT_LOCAL_CLUSTER"

# per node i: NODE_PORT_BASE + NODE_PORT_STRIDE * i + offset (worker ports: the rest of the block)
_NODE_PORTS = {
    "node_manager": 0,
    "object_manager": 1,
    "dashboard_agent_listen": 2,
    "dashboard_agent_grpc": 3,
    "runtime_env_agent": 4,
    "metrics_export": 5,
}
_WORKER_PORT_OFFSET = 10


@dataclass
class ClusterOptions:
    workers: int = 1
    head_cpus: int = 1
    worker_cpus: int = 1
    port: int = 6391  # GCS
    dashboard_port: int = 8275
    client_port: int = 10011
    node_port_base: int = 20100  # outside Linux's ephemeral range (32768-60999)
    node_port_stride: int = 100
    object_store_mb: int = 256  # per node
    # default /tmp/nshot-ray-<port>; node <name> uses <temp_dir>/<name> (Unix socket paths
    # under it must stay short: keep this path short)
    temp_dir: str | None = None
    timeout_s: float = 120.0


@dataclass
class NodeRecord:
    name: str
    head: bool
    pid: int
    pgid: int
    num_cpus: int
    resources: dict[str, float]
    ports: dict[str, int]
    log: str


@dataclass
class ClusterState:
    cluster_id: str
    address: str
    dashboard_url: str
    client_address: str
    token_path: str
    temp_dir: str
    state_dir: str
    nodes: list[NodeRecord] = field(default_factory=list)
    started: float = field(default_factory=time.time)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> ClusterState:
        raw = json.loads(text)
        raw["nodes"] = [NodeRecord(**n) for n in raw.get("nodes", [])]
        return cls(**raw)

    def token(self) -> str:
        return Path(self.token_path).read_text().strip()

    def auth_headers(self) -> dict[str, str]:
        """The header Ray's dashboard, Jobs API and State API accept."""
        return {"Authorization": f"Bearer {self.token()}"}

    def client_env(self) -> dict[str, str]:
        """Environment for ``ray job submit``/``ray status`` etc. against this cluster."""
        return {
            "RAY_ADDRESS": self.dashboard_url,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": self.token_path,
        }

    def pids(self) -> list[int]:
        return [n.pid for n in self.nodes]


def default_state_dir() -> Path:
    env = os.environ.get("NSHOT_CLUSTER_DIR")
    if env:
        return Path(env).expanduser()
    from nshot.data import cache_dir

    return cache_dir() / "local-cluster"


def load_state(state_dir: str | os.PathLike | None = None) -> ClusterState | None:
    path = Path(state_dir or default_state_dir()) / STATE_FILE
    if not path.exists():
        return None
    return ClusterState.from_json(path.read_text())


# --------------------------------------------------------------------------- start


def _ray_executable() -> str:
    beside = Path(sys.executable).parent / "ray"
    if beside.exists():
        return str(beside)
    found = shutil.which("ray")
    if not found:
        raise NshotError("the `ray` command is not installed (pip install 'ray[default]')")
    return found


def _port_free(port: int) -> bool:
    for host in ("0.0.0.0", HOST):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # like Ray's servers: connections in TIME_WAIT do not block the port, a listener does
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def _node_ports(opts: ClusterOptions, index: int) -> dict[str, int]:
    base = opts.node_port_base + opts.node_port_stride * index
    ports = {k: base + off for k, off in _NODE_PORTS.items()}
    ports["min_worker"] = base + _WORKER_PORT_OFFSET
    ports["max_worker"] = base + opts.node_port_stride - 1
    return ports


def _node_args(ports: dict[str, int]) -> list[str]:
    return [
        f"--node-manager-port={ports['node_manager']}",
        f"--object-manager-port={ports['object_manager']}",
        f"--dashboard-agent-listen-port={ports['dashboard_agent_listen']}",
        f"--dashboard-agent-grpc-port={ports['dashboard_agent_grpc']}",
        f"--runtime-env-agent-port={ports['runtime_env_agent']}",
        f"--metrics-export-port={ports['metrics_export']}",
        f"--min-worker-port={ports['min_worker']}",
        f"--max-worker-port={ports['max_worker']}",
    ]


def _http_json(url: str, headers: dict[str, str], timeout: float = 5.0) -> Any:
    req = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - loopback URL
        return json.loads(r.read().decode())


def alive_nodes(state: ClusterState) -> list[dict[str, Any]]:
    """The cluster's alive nodes, from the State API over HTTP (with the token)."""
    data = _http_json(
        f"{state.dashboard_url}/api/v0/nodes?limit=1000&detail=1", state.auth_headers()
    )
    rows = data["data"]["result"]["result"]
    return [r for r in rows if r.get("state") == "ALIVE"]


def _log_tail(path: str, n: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as fh:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # own session and process group: stop() kills exactly it
        )


def start(
    opts: ClusterOptions | None = None, state_dir: str | os.PathLike | None = None
) -> ClusterState:
    """Start a head and ``opts.workers`` worker nodes; return once all have joined."""
    opts = opts or ClusterOptions()
    if opts.workers < 0 or opts.head_cpus < 0 or opts.worker_cpus < 1:
        raise NshotError("--workers must be >= 0, --head-cpus >= 0 and --worker-cpus >= 1")
    sdir = Path(state_dir or default_state_dir()).expanduser().resolve()
    sdir.mkdir(parents=True, exist_ok=True)
    old = load_state(sdir)
    if old is not None:
        if any(_is_ours(p, old.cluster_id) for p in old.pids()):
            raise NshotError(
                f"a local cluster is already running from {sdir} (dashboard {old.dashboard_url});"
                " stop it first: python -m nshot.cluster stop"
                + (f" --state-dir {sdir}" if state_dir else "")
            )
        (sdir / STATE_FILE).unlink()

    node_ports = [_node_ports(opts, i) for i in range(opts.workers + 1)]
    wanted = [opts.port, opts.dashboard_port, opts.client_port]
    for p in node_ports:
        wanted += [v for k, v in p.items() if k not in ("min_worker", "max_worker")]
        wanted += [p["min_worker"], p["max_worker"]]
    busy = [p for p in wanted if not _port_free(p)]
    if busy:
        raise NshotError(
            f"ports already in use: {busy}; choose others with --port/--dashboard-port/"
            "--client-port/--node-port-base"
        )

    temp_dir = opts.temp_dir or f"/tmp/nshot-ray-{opts.port}"
    cluster_id = secrets.token_hex(8)
    token_path = sdir / TOKEN_FILE
    token_path.write_text(secrets.token_hex(32))
    token_path.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN"}
    env.update(
        {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token_path),
            MARKER_ENV: cluster_id,
            # Ray processes that look the cluster up (Ray Train's placement-group cleaner queries
            # the State API with address "auto") must find this one, not another Ray here
            "RAY_ADDRESS": f"{HOST}:{opts.port}",
            "RAY_USAGE_STATS_ENABLED": "0",
        }
    )
    # job entrypoints (`nshot ...`) resolve from this Python's environment
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # on SIGTERM (stop) a node drains before it ends its processes; keep that short here
    env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "5")
    state = ClusterState(
        cluster_id=cluster_id,
        address=f"{HOST}:{opts.port}",
        dashboard_url=f"http://{HOST}:{opts.dashboard_port}",
        client_address=f"ray://{HOST}:{opts.client_port}",
        token_path=str(token_path),
        temp_dir=temp_dir,
        state_dir=str(sdir),
    )
    ray = _ray_executable()
    common = [
        f"--node-ip-address={HOST}",
        f"--object-store-memory={opts.object_store_mb * 1024 * 1024}",
        "--disable-usage-stats",
        "--block",
    ]

    def record(name: str, head: bool, proc: subprocess.Popen, cpus: int, res, ports, log):
        state.nodes.append(NodeRecord(name, head, proc.pid, proc.pid, cpus, res, ports, str(log)))
        (sdir / STATE_FILE).write_text(state.to_json())

    try:
        res = {"node_head": 1}
        log = sdir / "head.log"
        log.write_bytes(b"")
        head = _spawn(
            [
                ray,
                "start",
                "--head",
                f"--port={opts.port}",
                f"--ray-client-server-port={opts.client_port}",
                "--include-dashboard=true",
                f"--dashboard-host={HOST}",
                f"--dashboard-port={opts.dashboard_port}",
                f"--num-cpus={opts.head_cpus}",
                "--num-gpus=0",
                f"--resources={json.dumps(res)}",
                *_node_args(node_ports[0]),
                f"--temp-dir={temp_dir}/head",
                *common,
            ],
            env,
            log,
        )
        record("head", True, head, opts.head_cpus, res, node_ports[0], log)
        _wait(lambda: _nodes_up(state, 1), head, log, opts.timeout_s, "the head node")
        for i in range(1, opts.workers + 1):
            name = f"w{i}"
            res = {f"node_{name}": 1}
            log = sdir / f"{name}.log"
            log.write_bytes(b"")
            proc = _spawn(
                [
                    ray,
                    "start",
                    f"--address={state.address}",
                    f"--num-cpus={opts.worker_cpus}",
                    "--num-gpus=0",
                    f"--resources={json.dumps(res)}",
                    *_node_args(node_ports[i]),
                    f"--temp-dir={temp_dir}/{name}",
                    *common,
                ],
                env,
                log,
            )
            record(name, False, proc, opts.worker_cpus, res, node_ports[i], log)
        if opts.workers:
            _wait(
                lambda: _nodes_up(state, opts.workers + 1),
                None,
                sdir / "w1.log",
                opts.timeout_s,
                f"{opts.workers} worker node(s)",
                procs=state.nodes,
            )
    except BaseException:
        stop(sdir)
        raise
    return state


def _nodes_up(state: ClusterState, n: int) -> bool:
    try:
        return len(alive_nodes(state)) >= n
    except (urllib.error.URLError, OSError, KeyError, ValueError):
        return False


def _wait(cond, proc, log, timeout: float, what: str, procs: list[NodeRecord] | None = None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        dead = []
        if proc is not None and proc.poll() is not None:
            dead = [str(log)]
        for n in procs or []:
            if not _alive(n.pid):
                dead.append(n.log)
        if dead:
            raise NshotError(
                f"{what} exited while starting; last lines of {dead[0]}:\n{_log_tail(dead[0])}"
            )
        time.sleep(0.5)
    raise NshotError(f"{what} did not join within {timeout:.0f}s; see {log}:\n{_log_tail(log)}")


# --------------------------------------------------------------------------- stop


def _alive(pid: int) -> bool:
    import psutil

    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _is_ours(pid: int, cluster_id: str) -> bool:
    """A live process that carries this cluster's id (so a reused PID is never taken for it)."""
    import psutil

    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE and p.environ().get(MARKER_ENV) == cluster_id
    except psutil.Error:
        return False


def cluster_processes(state: ClusterState) -> list[int]:
    """Every live process of this cluster: those whose environment carries the cluster's id
    (the ``ray start`` processes were started with it; every Ray process, worker and job driver
    inherits it) and their descendants."""
    import psutil

    me = os.getpid()
    found = {
        p.pid
        for p in psutil.process_iter(["pid"])
        if p.pid != me and _is_ours(p.pid, state.cluster_id)
    }
    for pid in list(found):
        with contextlib.suppress(psutil.Error):
            found.update(c.pid for c in psutil.Process(pid).children(recursive=True))
    found.discard(me)
    return sorted(pid for pid in found if _alive(pid))


def stop(
    state_dir: str | os.PathLike | None = None, timeout_s: float = 30.0, purge: bool = False
) -> list[int]:
    """Stop the cluster recorded in ``state_dir``; return the PIDs that were ended.

    SIGTERM to each node's ``ray start --block`` process (workers first, then the head), which
    drains the node and ends its processes; then SIGTERM, and SIGKILL after 5 s, to whatever of
    the cluster is left (waiting up to ``timeout_s`` per node). ``purge`` also removes Ray's temp
    dir (logs), the nodes' start logs and the token."""
    sdir = Path(state_dir or default_state_dir()).expanduser().resolve()
    state = load_state(sdir)
    if state is None:
        return []
    victims = cluster_processes(state)
    # `ray start --block` handles SIGTERM: it drains its node, then ends the node's processes
    for n in sorted(state.nodes, key=lambda n: n.head):  # workers first, then the head
        if _is_ours(n.pid, state.cluster_id):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(n.pid, signal.SIGTERM)
            _wait_pids_gone([n.pid], timeout_s)
    _wait_gone(state, 5.0)
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
        left = cluster_processes(state)
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        if left:
            _wait_gone(state, wait)
    left = cluster_processes(state)
    if left:
        raise NshotError(f"processes of the local cluster are still running: {left}")
    # reap our own children when start() and stop() run in the same process
    for n in state.nodes:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(n.pid, os.WNOHANG)
    (sdir / STATE_FILE).unlink(missing_ok=True)
    if purge:
        shutil.rmtree(state.temp_dir, ignore_errors=True)
        Path(state.token_path).unlink(missing_ok=True)
        for n in state.nodes:
            if n.log:
                Path(n.log).unlink(missing_ok=True)
    return sorted(set(victims) | set(state.pids()))


def _wait_pids_gone(pids: list[int], timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)


def _wait_gone(state: ClusterState, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and cluster_processes(state):
        time.sleep(0.3)


# --------------------------------------------------------------------------- CLI


def _submit_hint(state: ClusterState) -> str:
    here = Path(state.state_dir)
    sd = "" if here == default_state_dir().resolve() else f" --state-dir {here}"
    return (
        f"Ray dashboard and Jobs API: {state.dashboard_url} (token auth on; token in "
        f"{state.token_path})\n"
        "Submit a job:\n"
        f'  eval "$(python -m nshot.cluster env{sd})"\n'
        "  ray job submit --working-dir . --runtime-env examples/runtime_env.yaml -- \\\n"
        "      nshot train tail --preset small --workers 2\n"
        "or: examples/submit_job.sh\n"
        f"Stop: clusters/local/stop.sh{sd}"
    )


def main(argv: list[str] | None = None, prog: str = "python -m nshot.cluster") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("command", choices=["start", "stop", "status", "env"])
    p.add_argument("--state-dir", default=None, help="default $NSHOT_CLUSTER_DIR or the cache")
    d = ClusterOptions()
    p.add_argument("--workers", type=int, default=d.workers, help="worker nodes besides the head")
    p.add_argument("--head-cpus", type=int, default=d.head_cpus)
    p.add_argument("--worker-cpus", type=int, default=d.worker_cpus)
    p.add_argument("--port", type=int, default=d.port, help="GCS port of the head")
    p.add_argument("--dashboard-port", type=int, default=d.dashboard_port)
    p.add_argument("--client-port", type=int, default=d.client_port)
    p.add_argument("--node-port-base", type=int, default=d.node_port_base)
    p.add_argument("--object-store-mb", type=int, default=d.object_store_mb)
    p.add_argument("--temp-dir", default=None, help="Ray's temp dir (default /tmp/nshot-ray-PORT)")
    p.add_argument("--timeout", type=float, default=d.timeout_s)
    p.add_argument("--purge", action="store_true", help="stop: also delete Ray's logs and token")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        if args.command == "start":
            opts = ClusterOptions(
                workers=args.workers,
                head_cpus=args.head_cpus,
                worker_cpus=args.worker_cpus,
                port=args.port,
                dashboard_port=args.dashboard_port,
                client_port=args.client_port,
                node_port_base=args.node_port_base,
                object_store_mb=args.object_store_mb,
                temp_dir=args.temp_dir,
                timeout_s=args.timeout,
            )
            state = start(opts, args.state_dir)
            if args.json:
                print(state.to_json())
            else:
                nodes = ", ".join(
                    f"{n.name} (pid {n.pid}, {n.num_cpus} CPU, {list(n.resources)[0]})"
                    for n in state.nodes
                )
                print(f"local Ray cluster up at {state.address}: {nodes}")
                print(_submit_hint(state))
            return 0
        state = load_state(args.state_dir)
        if state is None:
            print(f"no local cluster recorded in {args.state_dir or default_state_dir()}")
            return 0 if args.command == "stop" else 1
        if args.command == "stop":
            pids = stop(args.state_dir, purge=args.purge)
            print(f"stopped the local cluster ({len(pids)} processes: {pids})")
        elif args.command == "env":
            for k, v in state.client_env().items():
                print(f"export {k}={v}")
        else:
            procs = cluster_processes(state)
            try:
                nodes = alive_nodes(state)
            except (urllib.error.URLError, OSError) as e:
                nodes = []
                print(f"dashboard not reachable: {e}")
            if args.json:
                print(json.dumps({"state": asdict(state), "alive": nodes, "processes": procs}))
            else:
                print(f"{len(nodes)} alive node(s); {len(procs)} processes; {state.dashboard_url}")
                for n in nodes:
                    print(f"  {n['node_id'][:12]} {n['node_ip']} {n.get('resources_total')}")
        return 0
    except NshotError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
