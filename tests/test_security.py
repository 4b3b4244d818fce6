"""What the embedded Ray that nshot starts exposes on the network."""

from __future__ import annotations

import ipaddress

import pytest

pytestmark = pytest.mark.ray


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def test_embedded_ray_listens_on_loopback_only(ray_session):
    """Ray's node address is 127.0.0.1 and no process of the embedded Ray (GCS, raylet,
    dashboard and its agent, metrics exporters, workers) listens on another interface: by
    default Ray binds the host's address, and its metrics exporters 0.0.0.0 without
    authentication."""
    import os

    import psutil
    import ray

    node = ray._private.worker.global_worker.node
    assert node.node_ip_address == "127.0.0.1"
    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
    # this session's processes (GCS, raylet, dashboard, ...) and their children (agents,
    # workers, actors), not whatever else this test run started (a local test cluster)
    ours = {os.getpid()}
    for infos in node.all_processes.values():
        for info in infos:
            try:
                proc = psutil.Process(info.process.pid)
                ours |= {proc.pid, *(c.pid for c in proc.children(recursive=True))}
            except psutil.NoSuchProcess:
                continue
    listening = [
        c
        for c in psutil.net_connections("inet")
        if c.status == psutil.CONN_LISTEN and c.pid in ours
    ]
    if len(listening) < 3:
        pytest.skip("the sockets of Ray's processes are not visible to this user")
    exposed = [(c.laddr.ip, c.laddr.port, psutil.Process(c.pid).name()) for c in listening]
    assert [e for e in exposed if not _loopback(e[0])] == []
    ports = {port for _, port, _ in exposed}
    assert node.metrics_export_port in ports  # the exporter is among what was checked
