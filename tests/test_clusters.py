"""clusters/: launcher YAMLs, KubeRay manifests, the storage rule, and a real 2-node local cluster.

The integration test starts its own head + worker node (``nshot.cluster``) on ports of its own,
submits a 2-worker training through the Jobs API over HTTP with the cluster's token, and stops
exactly that cluster. It does not use the session's ``ray_session`` and calls no ``ray.init``.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from nshot.method import NshotError

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = ROOT / "clusters"
LAUNCHER_YAMLS = sorted(CLUSTERS.glob("*.yaml"))
KUBERAY = CLUSTERS / "kuberay"
RAY_MANIFESTS = [KUBERAY / n for n in ("raycluster.yaml", "rayjob.yaml", "rayservice.yaml")]


# --------------------------------------------------------------------------- launcher YAMLs


def _ray_schema() -> dict:
    import ray

    return json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())


def test_launcher_yamls_exist():
    assert {p.name for p in LAUNCHER_YAMLS} >= {"aws.yaml", "gcp.yaml"}


@pytest.mark.parametrize("path", LAUNCHER_YAMLS, ids=lambda p: p.name)
def test_launcher_yaml_validates_against_rays_schema(path):
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    cfg = yaml.safe_load(path.read_text())
    jsonschema.validate(cfg, _ray_schema())  # the file as written
    validate_config(prepare_config(copy.deepcopy(cfg)))  # what `ray up` checks after defaults

    types = cfg["available_node_types"]
    head = types[cfg["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0, "the head is a CPU node"
    gpu_groups = [t for name, t in types.items() if t["resources"].get("GPU", 0) >= 8]
    assert gpu_groups, "a worker group of 8-GPU nodes"
    assert all(t.get("max_workers", 0) >= 1 for t in gpu_groups)
    text = path.read_text()
    assert "pip install" in " ".join(cfg["setup_commands"]) and "nshot" in text
    storage = re.findall(r"NSHOT_STORAGE=(\S+?);", text)
    assert storage and all(s.startswith(("s3://", "gs://")) for s in storage)
    starts = cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"]
    assert all("RAY_AUTH_MODE=token" in c for c in starts if "ray start" in c)
    assert "--dashboard-host=127.0.0.1" in " ".join(cfg["head_start_ray_commands"])
    images = [v for k, v in cfg["docker"].items() if k.endswith("image")]
    assert images and all(_pinned(i) for i in images)


def test_launcher_schema_rejects_a_broken_config():
    """The check above can fail: a misspelled field does not pass the schema."""
    import jsonschema

    cfg = yaml.safe_load((CLUSTERS / "aws.yaml").read_text())
    cfg["available_node_types"]["head"]["min_worker"] = 1  # typo of min_workers
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(cfg, _ray_schema())


# --------------------------------------------------------------------------- KubeRay


def _pinned(image: str) -> bool:
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag != "latest" and re.search(r"\d+\.\d+", tag)


def _cluster_spec(doc: dict) -> dict:
    key = {"RayCluster": None, "RayJob": "rayClusterSpec", "RayService": "rayClusterConfig"}
    return doc["spec"][key[doc["kind"]]] if key[doc["kind"]] else doc["spec"]


def _containers(cspec: dict) -> list[tuple[str, dict]]:
    out = [("head", c) for c in cspec["headGroupSpec"]["template"]["spec"]["containers"]]
    for g in cspec["workerGroupSpecs"]:
        out += [(g["groupName"], c) for c in g["template"]["spec"]["containers"]]
    return out


@pytest.mark.parametrize("path", RAY_MANIFESTS, ids=lambda p: p.name)
def test_kuberay_manifest_has_what_kuberay_requires(path):
    import ray

    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert len(docs) == 1
    doc = docs[0]
    assert doc["apiVersion"] == "ray.io/v1"
    assert doc["kind"] in ("RayCluster", "RayJob", "RayService")
    assert doc["metadata"]["name"]
    cspec = _cluster_spec(doc)
    assert cspec["rayVersion"] == ray.__version__
    assert cspec["authOptions"]["mode"] == "token"
    assert "headGroupSpec" in cspec and cspec["workerGroupSpecs"]
    for group, c in _containers(cspec):
        assert _pinned(c["image"]), f"{group}: image {c['image']} is not pinned to a version"
        assert f"ray{ray.__version__}" in c["image"] or f":{ray.__version__}" in c["image"]
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][kind]), f"{group}: {kind}"
    for g in cspec["workerGroupSpecs"]:
        (c,) = g["template"]["spec"]["containers"]
        gpus = int(c["resources"]["limits"]["nvidia.com/gpu"])
        assert gpus >= 1 and c["resources"]["requests"]["nvidia.com/gpu"] == str(gpus)
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]
    if doc["kind"] == "RayJob":
        assert doc["spec"]["entrypoint"].startswith("nshot train ")
        assert doc["spec"]["shutdownAfterJobFinishes"] is True


def test_rayservice_uses_the_serve_config_format_of_examples():
    from ray.serve.schema import ServeDeploySchema

    doc = yaml.safe_load((KUBERAY / "rayservice.yaml").read_text())
    served = yaml.safe_load(doc["spec"]["serveConfigV2"])
    example = yaml.safe_load((ROOT / "examples" / "serve_config.yaml").read_text())
    ServeDeploySchema.model_validate(served)
    ServeDeploySchema.model_validate(example)
    for app in served["applications"]:
        ref = next(a for a in example["applications"] if a["import_path"] == app["import_path"])
        assert set(app["args"]) == set(ref["args"])
    assert served["http_options"]["host"] == "0.0.0.0"  # the Service reaches the proxy


def test_kuberay_image_is_built_on_the_pinned_ray_image():
    import ray

    dockerfile = (KUBERAY / "Dockerfile").read_text()
    (base,) = re.findall(r"^FROM (\S+)", dockerfile, re.M)
    assert _pinned(base) and base.startswith(f"rayproject/ray:{ray.__version__}-py311")
    pvc = yaml.safe_load((KUBERAY / "storage.yaml").read_text())
    assert pvc["kind"] == "PersistentVolumeClaim" and "ReadWriteMany" in pvc["spec"]["accessModes"]


# --------------------------------------------------------------------------- storage rule


def _node(ip: str, alive: bool = True) -> dict:
    return {"NodeManagerAddress": ip, "Alive": alive}


def test_local_storage_on_several_hosts_is_refused(monkeypatch):
    from nshot.train.runner import check_storage_reachable

    monkeypatch.delenv("NSHOT_STORAGE_SHARED", raising=False)
    two_hosts = [_node("10.0.0.1"), _node("10.0.0.2")]
    with pytest.raises(NshotError, match=r"local path.*2 nodes on 2 hosts.*s3://"):
        check_storage_reachable(Path("/data/runs"), two_hosts)
    with pytest.raises(NshotError):
        check_storage_reachable("file:///data/runs", two_hosts)
    check_storage_reachable("s3://bucket/runs", two_hosts)
    check_storage_reachable("gs://bucket/runs", two_hosts)
    check_storage_reachable(Path("/data/runs"), [_node("10.0.0.1"), _node("10.0.0.1")])  # 1 host
    check_storage_reachable(Path("/data/runs"), [_node("10.0.0.1"), _node("10.0.0.2", False)])
    check_storage_reachable(Path("/data/runs"), [_node("10.0.0.1")])
    monkeypatch.setenv("NSHOT_STORAGE_SHARED", "1")
    check_storage_reachable(Path("/data/runs"), two_hosts)


def test_storage_uris_are_not_turned_into_paths(monkeypatch, tmp_path):
    from nshot.train.runner import default_storage, is_uri, resolve_storage

    assert resolve_storage("s3://bucket/runs/") == "s3://bucket/runs"
    assert resolve_storage("gs://b/x") == "gs://b/x"
    assert resolve_storage(tmp_path / "a" / ".." / "b") == tmp_path / "b"
    assert not is_uri("/a/b:c") and not is_uri("runs") and is_uri("abfs://c@a/x")
    monkeypatch.setenv("NSHOT_STORAGE", "s3://bucket/nshot/")
    assert default_storage() == "s3://bucket/nshot"
    monkeypatch.setenv("NSHOT_STORAGE", str(tmp_path))
    assert default_storage() == tmp_path


def test_run_dir_behind_a_uri(tmp_path):
    """The run-directory operations fit() does on remote storage, through pyarrow (file://)."""
    from nshot.train.runner import _RunDir

    run = _RunDir(f"file://{tmp_path}/store", "r1")
    assert not run.local and run.path == f"file://{tmp_path}/store/r1"
    assert not run.has_files()
    run.write("nshot_run.json", '{"a": 1}')
    assert run.has_files()
    assert json.loads((tmp_path / "store" / "r1" / "nshot_run.json").read_text()) == {"a": 1}
    run.clear()
    assert not run.has_files()


def test_in_process_training_refuses_remote_storage(tmp_path):
    from nshot.method import get
    from nshot.train import Scaling, fit

    with pytest.raises(NshotError, match="--workers 0"):
        fit("tail", get("tail").config("smoke"), scaling=Scaling(workers=0), storage="s3://b/r")


def test_cli_storage_and_its_output_alias():
    from nshot.cli import build_parser

    p = build_parser()
    assert p.parse_args(["train", "tail", "--storage", "s3://b/r"]).storage == "s3://b/r"
    assert p.parse_args(["train", "tail", "--output", "/x"]).storage == "/x"


# --------------------------------------------------------------------------- local cluster


def test_cluster_port_plan_does_not_overlap():
    from nshot.cluster import ClusterOptions, _node_ports

    opts = ClusterOptions(workers=3)
    seen: set[int] = {opts.port, opts.dashboard_port, opts.client_port}
    for i in range(opts.workers + 1):
        p = _node_ports(opts, i)
        block = set(range(p["node_manager"], p["max_worker"] + 1))
        assert not block & seen
        seen |= block


def test_second_start_on_a_running_state_dir_is_refused(tmp_path):
    import subprocess
    import sys

    from nshot import cluster

    env = {**os.environ, cluster.MARKER_ENV: "c0ffee"}
    code = "import time; time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)
    try:
        state = cluster.ClusterState(
            cluster_id="c0ffee",
            address="127.0.0.1:1",
            dashboard_url="http://127.0.0.1:2",
            client_address="ray://127.0.0.1:3",
            token_path=str(tmp_path / "auth_token"),
            temp_dir="/tmp/none",
            state_dir=str(tmp_path),
            nodes=[cluster.NodeRecord("head", True, proc.pid, proc.pid, 1, {}, {}, "")],
        )
        (tmp_path / cluster.STATE_FILE).write_text(state.to_json())
        assert cluster.load_state(tmp_path) == state
        _wait_for(lambda: cluster.cluster_processes(state) == [proc.pid])
        with pytest.raises(NshotError, match="already running"):
            cluster.start(cluster.ClusterOptions(), tmp_path)
        # a process without the cluster's id is never taken for it (a reused PID)
        other = cluster.ClusterState(**{**state.__dict__, "cluster_id": "other"})
        assert cluster.cluster_processes(other) == []
        assert cluster.stop(tmp_path, timeout_s=5) == [proc.pid]
        assert not cluster._alive(proc.pid)  # ended (and reaped by stop())
        assert cluster.load_state(tmp_path) is None
    finally:
        proc.kill()


def _wait_for(cond, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "timed out"
        time.sleep(0.1)


# The integration test's own ports: away from Ray's defaults, the dev cluster's defaults
# (6391/8275/10011/20100+) and the ephemeral range.
IT_PORTS = dict(port=6393, dashboard_port=8277, client_port=10013, node_port_base=20500)


def _state_api_actors(state, class_name: str) -> list[dict]:
    url = (
        f"{state.dashboard_url}/api/v0/actors?limit=1000&detail=1"
        f"&filter_keys=class_name&filter_predicates=%3D&filter_values={class_name}"
    )
    req = urllib.request.Request(url, headers=state.auth_headers())
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["data"]["result"]["result"]


@pytest.mark.own_ray
@pytest.mark.timeout(400)
def test_two_node_cluster_runs_a_job_across_nodes(tmp_path):
    """Head (1 CPU) + worker node (1 CPU) as separate `ray start` processes; a 2-worker smoke
    training submitted through the Jobs API must put one Ray Train worker on each node, succeed,
    and leave its checkpoint in the storage path; stopping leaves no process behind."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    from nshot import cluster
    from nshot.train import find_checkpoints, load_checkpoint

    state_dir = tmp_path / "cluster"
    temp_dir = f"/tmp/nshot-ray-it{IT_PORTS['port']}"
    opts = cluster.ClusterOptions(
        workers=1, head_cpus=1, worker_cpus=1, temp_dir=temp_dir, timeout_s=150, **IT_PORTS
    )
    t0 = time.time()
    state = cluster.start(opts, state_dir)
    started_s = time.time() - t0
    try:
        nodes = cluster.alive_nodes(state)
        assert len(nodes) == 2
        node_by_resource = {
            r: n["node_id"] for n in nodes for r in n["resources_total"] if r.startswith("node_")
        }
        assert set(node_by_resource) == {"node_head", "node_w1"}

        # the token is required: no header, no job
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(f"{state.dashboard_url}/api/jobs/", timeout=10)
        assert denied.value.code in (401, 403)

        client = JobSubmissionClient(state.dashboard_url, headers=state.auth_headers())
        storage = tmp_path / "runs"
        runtime_env = yaml.safe_load((ROOT / "examples" / "runtime_env.yaml").read_text())
        runtime_env["working_dir"] = str(ROOT)
        t_submit = time.time()
        job_id = client.submit_job(
            entrypoint=(
                "nshot train tail --preset smoke --workers 2 --set steps=20 "
                f"--set checkpoint_every=10 --storage {storage} --name two-node"
            ),
            runtime_env=runtime_env,
        )
        status = None
        while time.time() - t_submit < 280:
            status = client.get_job_status(job_id)
            if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
                break
            time.sleep(1)
        job_wall = time.time() - t_submit
        logs = client.get_job_logs(job_id)
        assert status == JobStatus.SUCCEEDED, f"job {job_id} ended {status}:\n{logs[-4000:]}"
        assert "Found multiple active Ray instances" not in logs  # this cluster, not another Ray
        info = client.get_job_info(job_id)
        print(
            f"\n2-node local cluster: start {started_s:.1f}s; job {job_id} submit->SUCCEEDED "
            f"{job_wall:.1f}s (driver {(info.end_time - info.start_time) / 1000:.1f}s)"
        )

        # where the two Ray Train workers ran: the workers' own log lines ...
        found = re.findall(r"rank (\d)/2 on node ([0-9a-f]{56})", logs)
        ranks = dict(found)
        assert set(ranks) == {"0", "1"}, logs[-3000:]
        assert len(found) == 2, "each worker's line once (one log monitor per node's logs)"
        assert len(set(ranks.values())) == 2
        assert set(ranks.values()) == set(node_by_resource.values())
        # ... and Ray's State API, independently of nshot
        actors = _state_api_actors(state, "RayTrainWorker")
        assert {a["node_id"] for a in actors} == set(node_by_resource.values())

        # the checkpoint is in the storage path
        run_dir = storage / "two-node"
        ckpts = find_checkpoints(run_dir)
        assert ckpts, f"no checkpoint under {run_dir}"
        assert load_checkpoint(ckpts[-1], method="tail").step == 20
        assert (run_dir / "nshot_run.json").exists()
    finally:
        recorded = state.pids()
        ended = cluster.stop(state_dir, purge=True)
    assert set(recorded) <= set(ended)
    import psutil

    left = [p for p in ended if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert not left, f"processes left behind: {left}"
    assert cluster.cluster_processes(state) == []
    assert cluster.load_state(state_dir) is None
    assert not Path(temp_dir).exists()
    shutil.rmtree(temp_dir, ignore_errors=True)
