"""What the embedded Ray that nshot starts exposes on the network."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys

import pytest

# Runs in a fresh process: an embedded Ray of its own, as `nshot train` starts it, before any
# training (torch's process-group store of a multi-worker run listens on every interface while
# the run lasts; that is torch's, documented in the README, not Ray's).
PROBE = r"""
import json, os
import psutil, ray
from nshot.train import ensure_ray

ensure_ray(num_cpus=1, configure_logging=False)
node = ray._private.worker.global_worker.node
ours = {os.getpid()}
for infos in node.all_processes.values():
    for info in infos:
        try:
            proc = psutil.Process(info.process.pid)
            ours |= {proc.pid, *(c.pid for c in proc.children(recursive=True))}
        except psutil.NoSuchProcess:
            pass
listening = [
    (c.laddr.ip, c.laddr.port, psutil.Process(c.pid).name())
    for c in psutil.net_connections("inet")
    if c.status == psutil.CONN_LISTEN and c.pid in ours
]
print(json.dumps({
    "node_ip": node.node_ip_address,
    "nodes": sorted({n["NodeManagerAddress"] for n in ray.nodes()}),
    "metrics_port": node.metrics_export_port,
    "listening": listening,
}))
ray.shutdown()
"""


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def test_embedded_ray_listens_on_loopback_only(tmp_path):
    """Ray's node address is 127.0.0.1 and no process of the embedded Ray (GCS, raylet,
    dashboard and its agent, metrics exporters, workers) listens on another interface: by
    default Ray binds the host's address, and its metrics exporters 0.0.0.0 without
    authentication."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, env=env,
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["node_ip"] == "127.0.0.1" and got["nodes"] == ["127.0.0.1"]
    if len(got["listening"]) < 3:
        pytest.skip("the sockets of Ray's processes are not visible to this user")
    assert [e for e in got["listening"] if not _loopback(e[0])] == []
    assert got["metrics_port"] in {port for _, port, _ in got["listening"]}
